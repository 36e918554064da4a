/* auth.h — bearer tokens on the admin ports (--auth-file) and the token a process sends when it
 * calls another's admin port (--token-file, SHOAL_TOKEN).
 *
 * The auth file is JSON: {"tokens": [{"token": "...", "role": "admin"},
 * {"token": "...", "team": "shop", "name": "shop-ci"}]}. Each entry is either admin (may change
 * everything) or bound to one team (may change only what the daemon says is that team's:
 * shoal-control's namespaces of that team). "name" is optional and is what logs show; a token is
 * never logged. The whole file is checked at start: a bad entry stops the process with a message
 * naming it. Tokens are compared in constant time (for a given stored token's length). */
#ifndef SHOAL_COMMON_AUTH_H
#define SHOAL_COMMON_AUTH_H

#include <stddef.h>

#define AUTH_TOKEN_MIN 16  /* shortest token accepted in an auth file */
#define AUTH_TOKEN_MAX 256
#define AUTH_TEAM_MAX 64

struct auth;

/* Who a request's token says the caller is. `team` is "" for an admin token. */
struct auth_caller {
    int admin;
    char team[AUTH_TEAM_MAX + 1];
    char name[AUTH_TEAM_MAX + 1]; /* the entry's "name", or "tokens[i]" */
};

enum auth_result {
    AUTH_OK,       /* *who is filled */
    AUTH_MISSING,  /* no Authorization header */
    AUTH_SCHEME,   /* an Authorization header that is not "Bearer <token>" */
    AUTH_INVALID,  /* a bearer token that is not in the file */
};

/* Read and check `path`. NULL with a message in err (naming the file and the entry) when it
 * cannot be read or any entry is wrong. */
struct auth *auth_load(const char *path, char *err, size_t errlen);
void auth_destroy(struct auth **a);
size_t auth_count(const struct auth *a);

/* Judge an Authorization header's value (NULL: none was sent). */
enum auth_result auth_check(const struct auth *a, const char *header, struct auth_caller *who);

/* The header line a client process sends: "Authorization: Bearer <token>", with the token read
 * from `token_file` (its first line) when given, else from the SHOAL_TOKEN environment
 * variable. Returns 0 with *line NULL when neither is set, 0 with *line malloc'd, or -1 with a
 * message in err (unreadable file, a token with characters a header cannot carry). */
int auth_client_header(const char *token_file, char **line, char *err, size_t errlen);

/* Fill `out` with a new random token: 43 URL-safe characters (256 bits from getrandom).
 * 0, or -1 when no randomness could be had. `out` must hold 44 bytes. */
int auth_new_token(char out[44]);

#endif
