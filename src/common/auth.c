/* auth.c — the auth file's token table and the bearer check (see auth.h). */
#include "common/auth.h"

#include <ctype.h>
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>
#include <sys/stat.h>

#include "common/log.h"

struct auth_entry {
    char *token;
    size_t len;
    struct auth_caller who;
};

struct auth {
    struct auth_entry *v;
    size_t n;
};

/* A token may hold the characters RFC 6750's b64token allows, so it travels in a header as
 * it is written in the file. */
static int token_char_ok(unsigned char c)
{
    return isalnum(c) || strchr("-._~+/=", c) != NULL;
}

static int name_ok(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > AUTH_TEAM_MAX) return 0;
    for (; *s; s++)
        if (!isalnum((unsigned char)*s) && !strchr("_-.", *s)) return 0;
    return 1;
}

void auth_destroy(struct auth **ap)
{
    struct auth *a = *ap;
    if (a == NULL) return;
    for (size_t i = 0; i < a->n; i++) {
        if (a->v[i].token) memset(a->v[i].token, 0, a->v[i].len);
        free(a->v[i].token);
    }
    free(a->v);
    free(a);
    *ap = NULL;
}

size_t auth_count(const struct auth *a) { return a ? a->n : 0; }

/* Check entry `i` and fill `e`. 0, or -1 with err naming the entry. */
static int entry_load(json_t *t, size_t i, struct auth_entry *e, const char *path, char *err,
                      size_t errlen)
{
#define BAD(...)                                                                                 \
    do {                                                                                         \
        int k_ = snprintf(err, errlen, "auth file %s: tokens[%zu]: ", path, i);                  \
        if (k_ >= 0 && (size_t)k_ < errlen) snprintf(err + k_, errlen - (size_t)k_, __VA_ARGS__); \
        return -1;                                                                               \
    } while (0)
    if (!json_is_object(t)) BAD("each entry must be an object like {\"token\": \"...\", \"role\": \"admin\"}");
    const char *k;
    json_t *v;
    json_object_foreach(t, k, v)
        if (strcmp(k, "token") && strcmp(k, "role") && strcmp(k, "team") && strcmp(k, "name"))
            BAD("unknown field '%.40s'; an entry has token, role or team, and an optional name", k);
    const char *name = json_string_value(json_object_get(t, "name"));
    if (json_object_get(t, "name") && (name == NULL || !name_ok(name)))
        BAD("name must be 1 to %d letters, digits, '_', '-' or '.'", AUTH_TEAM_MAX);
    if (name) snprintf(e->who.name, sizeof e->who.name, "%s", name);
    else snprintf(e->who.name, sizeof e->who.name, "tokens[%zu]", i);
    const char *tok = json_string_value(json_object_get(t, "token"));
    if (tok == NULL) BAD("token is required (a string)");
    size_t len = strlen(tok);
    if (len < AUTH_TOKEN_MIN || len > AUTH_TOKEN_MAX)
        BAD("token must be %d to %d characters long (it has %zu); make one with e.g. "
            "`head -c 32 /dev/urandom | base64`", AUTH_TOKEN_MIN, AUTH_TOKEN_MAX, len);
    for (size_t j = 0; j < len; j++)
        if (!token_char_ok((unsigned char)tok[j]))
            BAD("token may hold only letters, digits and - . _ ~ + / = (character %zu is not one)",
                j + 1);
    const char *role = json_string_value(json_object_get(t, "role"));
    const char *team = json_string_value(json_object_get(t, "team"));
    if (json_object_get(t, "role") && (role == NULL || strcmp(role, "admin")))
        BAD("role must be \"admin\" (for a team's token give \"team\" instead)");
    if (json_object_get(t, "team") && (team == NULL || !name_ok(team)))
        BAD("team must be 1 to %d letters, digits, '_', '-' or '.'", AUTH_TEAM_MAX);
    if (!role == !team)
        BAD("give exactly one of \"role\": \"admin\" or \"team\": \"<team>\"");
    e->who.admin = role != NULL;
    snprintf(e->who.team, sizeof e->who.team, "%s", team ? team : "");
    if ((e->token = strdup(tok)) == NULL) BAD("out of memory");
    e->len = len;
    return 0;
#undef BAD
}

struct auth *auth_load(const char *path, char *err, size_t errlen)
{
    json_error_t je;
    json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
    if (root == NULL) {
        if (je.line < 1) snprintf(err, errlen, "cannot read auth file %s: %s", path, je.text);
        else
            snprintf(err, errlen, "auth file %s is not valid JSON: %s (line %d column %d)", path,
                     je.text, je.line, je.column);
        return NULL;
    }
    struct auth *a = calloc(1, sizeof *a);
    json_t *list = json_object_get(root, "tokens");
    if (a == NULL) {
        snprintf(err, errlen, "out of memory");
        goto fail;
    }
    if (!json_is_object(root) || json_object_size(root) != 1 || !json_is_array(list)) {
        snprintf(err, errlen, "auth file %s must be {\"tokens\": [{\"token\": \"...\", \"role\": "
                 "\"admin\"}, {\"token\": \"...\", \"team\": \"<team>\"}]}", path);
        goto fail;
    }
    if (json_array_size(list) == 0) {
        snprintf(err, errlen, "auth file %s has no tokens: every change would be refused; add "
                 "one with \"role\": \"admin\"", path);
        goto fail;
    }
    if ((a->v = calloc(json_array_size(list), sizeof *a->v)) == NULL) {
        snprintf(err, errlen, "out of memory");
        goto fail;
    }
    size_t i;
    json_t *t;
    json_array_foreach(list, i, t) {
        if (entry_load(t, i, &a->v[i], path, err, errlen) < 0) goto fail;
        a->n = i + 1;
        for (size_t j = 0; j < i; j++)
            if (a->v[j].len == a->v[i].len && !memcmp(a->v[j].token, a->v[i].token, a->v[i].len)) {
                snprintf(err, errlen, "auth file %s: tokens[%zu]: the same token as tokens[%zu]; "
                         "each token must be different", path, i, j);
                goto fail;
            }
    }
    json_decref(root);
    struct stat st;
    if (stat(path, &st) == 0 && (st.st_mode & 077))
        log_warn("auth file %s can be read by other users (mode %03o); chmod 600 it", path,
                 (unsigned)(st.st_mode & 0777));
    return a;
fail:
    json_decref(root);
    auth_destroy(&a);
    return NULL;
}

/* Equal in time that depends only on the stored token's length, not on where they differ. */
static int ct_equal(const char *given, size_t glen, const char *stored, size_t slen)
{
    unsigned char d = (unsigned char)(glen != slen);
    for (size_t i = 0; i < slen; i++)
        d |= (unsigned char)(stored[i] ^ (i < glen ? given[i] : 0));
    return d == 0;
}

enum auth_result auth_check(const struct auth *a, const char *header, struct auth_caller *who)
{
    if (header == NULL) return AUTH_MISSING;
    while (*header == ' ' || *header == '\t') header++;
    if (strncasecmp(header, "Bearer", 6) || (header[6] != ' ' && header[6] != '\t'))
        return *header ? AUTH_SCHEME : AUTH_MISSING;
    const char *tok = header + 6;
    while (*tok == ' ' || *tok == '\t') tok++;
    size_t len = strlen(tok);
    while (len && (tok[len - 1] == ' ' || tok[len - 1] == '\t')) len--;
    if (len == 0) return AUTH_SCHEME;
    const struct auth_entry *hit = NULL;
    for (size_t i = 0; i < a->n; i++) /* every entry, so the time says nothing of which */
        if (ct_equal(tok, len, a->v[i].token, a->v[i].len)) hit = &a->v[i];
    if (hit == NULL) return AUTH_INVALID;
    *who = hit->who;
    return AUTH_OK;
}

int auth_client_header(const char *token_file, char **line, char *err, size_t errlen)
{
    *line = NULL;
    char buf[AUTH_TOKEN_MAX + 2] = "";
    const char *from = "SHOAL_TOKEN";
    if (token_file && *token_file) {
        FILE *f = fopen(token_file, "r");
        if (f == NULL) {
            snprintf(err, errlen, "cannot read token file %s: %s", token_file, strerror(errno));
            return -1;
        }
        if (fgets(buf, sizeof buf, f) == NULL) buf[0] = 0;
        fclose(f);
        from = token_file;
    } else {
        const char *env = getenv("SHOAL_TOKEN");
        if (env == NULL || *env == 0) return 0;
        snprintf(buf, sizeof buf, "%s", env);
    }
    size_t n = strlen(buf);
    while (n && isspace((unsigned char)buf[n - 1])) buf[--n] = 0;
    if (n == 0 || n > AUTH_TOKEN_MAX) {
        snprintf(err, errlen, "%s holds no token (or one over %d characters)", from,
                 AUTH_TOKEN_MAX);
        return -1;
    }
    for (size_t i = 0; i < n; i++)
        if (!token_char_ok((unsigned char)buf[i])) {
            snprintf(err, errlen, "the token in %s has a character a token cannot hold "
                     "(letters, digits and - . _ ~ + / = only)", from);
            return -1;
        }
    if (asprintf(line, "Authorization: Bearer %s", buf) < 0) {
        *line = NULL;
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    memset(buf, 0, sizeof buf);
    return 0;
}

int auth_new_token(char out[44])
{
    static const char abc[] =
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    unsigned char r[43];
    size_t got = 0;
    while (got < sizeof r) {
        ssize_t k = getrandom(r + got, sizeof r - got, 0);
        if (k < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        got += (size_t)k;
    }
    for (size_t i = 0; i < sizeof r; i++) out[i] = abc[r[i] & 63];
    out[43] = 0;
    memset(r, 0, sizeof r);
    return 0;
}
