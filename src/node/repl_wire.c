/* repl_wire.c — framing and handshake parsing of the replication stream (see repl_wire.h).
 * Every input here may come from any peer that reaches the data port: each length is checked
 * against what the buffer holds before it is used. */
#include "node/repl_wire.h"

#include <stdio.h>
#include <string.h>

static uint32_t get32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t get64(const uint8_t *p) { return (uint64_t)get32(p) | (uint64_t)get32(p + 4) << 32; }

static void put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static void put64(uint8_t *p, uint64_t v)
{
    put32(p, (uint32_t)v);
    put32(p + 4, (uint32_t)(v >> 32));
}

static bool known_type(uint8_t t)
{
    return repl_type_stream(t) || t == REPL_F_SNAP || t == REPL_F_RESET || t == REPL_F_SNAP_END ||
           t == REPL_F_PROGRESS || t == REPL_F_ACK;
}

long repl_frame_parse(const uint8_t *buf, size_t len, size_t max_payload, struct repl_frame *f,
                      const char **why)
{
    if (len < 1) return 0;
    if (!known_type(buf[0])) {
        *why = "unknown frame type";
        return -1;
    }
    for (size_t i = 1; i < 4 && i < len; i++)
        if (buf[i] != 0) {
            *why = "nonzero reserved byte";
            return -1;
        }
    if (len < 8) return 0;
    uint32_t n = get32(buf + 4);
    if (n > max_payload) {
        *why = "frame longer than the limit";
        return -1;
    }
    if (len < REPL_HDR || len - REPL_HDR < n) return 0;
    f->type = buf[0];
    f->len = n;
    f->offset = get64(buf + 8);
    f->payload = buf + REPL_HDR;
    return (long)(REPL_HDR + n);
}

void repl_frame_header(uint8_t *dst, uint8_t type, uint32_t len, uint64_t offset)
{
    dst[0] = type;
    dst[1] = dst[2] = dst[3] = 0;
    put32(dst + 4, len);
    put64(dst + 8, offset);
}

void repl_progress_encode(uint8_t *dst, uint64_t offset, uint64_t wall_ms)
{
    repl_frame_header(dst, REPL_F_PROGRESS, REPL_WALL_LEN, offset);
    put64(dst + REPL_HDR, wall_ms);
}

int repl_progress_decode(const struct repl_frame *f, uint64_t *wall_ms, const char **why)
{
    if (f->len == 0) return 0;
    if (f->len != REPL_WALL_LEN) {
        *why = "progress frame with a payload of a wrong length";
        return -1;
    }
    *wall_ms = get64(f->payload);
    return 1;
}

int repl_rec_decode(const struct repl_frame *f, struct repl_rec *r, const char **why)
{
    const uint8_t *p = f->payload;
    size_t n = f->len;
    memset(r, 0, sizeof *r);
    switch (f->type) {
    case REPL_F_ITEM:
    case REPL_F_SNAP:
        if (n < REPL_ITEM_FIXED || p[0] == 0 || n - REPL_ITEM_FIXED < p[0]) break;
        r->nkey = p[0];
        r->iflags = p[1];
        r->flags = get32(p + 2);
        r->ttl = get32(p + 6);
        r->cas = get64(p + 10);
        r->key = (const char *)p + REPL_ITEM_FIXED;
        r->value = r->key + r->nkey;
        r->nbytes = (uint32_t)(n - REPL_ITEM_FIXED - r->nkey);
        return 0;
    case REPL_F_DEL:
    case REPL_F_FLUSH_NS:
        if (n < 2 || p[0] == 0 || n != 1u + p[0]) break;
        r->nkey = p[0];
        r->key = (const char *)p + 1;
        return 0;
    case REPL_F_TOUCH:
        if (n < 6 || p[0] == 0 || n != 5u + p[0]) break;
        r->nkey = p[0];
        r->ttl = get32(p + 1);
        r->key = (const char *)p + 5;
        return 0;
    case REPL_F_FLUSH:
        if (n != 4) break;
        r->ttl = get32(p);
        return 0;
    default: break;
    }
    *why = "malformed record";
    return -1;
}

void repl_item_encode(uint8_t *dst, const struct repl_rec *r)
{
    dst[0] = r->nkey;
    dst[1] = r->iflags;
    put32(dst + 2, r->flags);
    put32(dst + 6, r->ttl);
    put64(dst + 10, r->cas);
    memcpy(dst + REPL_ITEM_FIXED, r->key, r->nkey);
}

/* Copy a line into a NUL-terminated buffer for sscanf; -1 when too long or holding a NUL. */
static int line_copy(char *dst, size_t cap, const char *line, size_t len)
{
    if (len >= cap || memchr(line, 0, len)) return -1;
    memcpy(dst, line, len);
    dst[len] = 0;
    return 0;
}

static bool replid_ok(const char *s)
{
    if (strlen(s) != 16) return false;
    for (int i = 0; i < 16; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f'))) return false;
    return true;
}

int repl_hello_parse(const char *line, size_t len, char *primary, size_t primarycap,
                     char replid[17])
{
    char b[REPL_LINE_MAX + 1], addr[301], id[17];
    unsigned ver;
    int used = 0;
    if (line_copy(b, sizeof b, line, len) < 0) return -1;
    if (sscanf(b, "shoal_repl %u %300s %16s%n", &ver, addr, id, &used) != 3 || b[used] != 0 ||
        ver != REPL_PROTO_VERSION || !replid_ok(id) || strlen(addr) >= primarycap ||
        !strchr(addr, ':'))
        return -1;
    strcpy(primary, addr);
    memcpy(replid, id, 17);
    return 0;
}

int repl_have_parse(const char *line, size_t len, char replid[17], uint64_t *applied,
                    bool *refused)
{
    char b[REPL_LINE_MAX + 1], id[17];
    unsigned long long off;
    int used = 0;
    if (line_copy(b, sizeof b, line, len) < 0) return -1;
    *refused = !strncmp(b, "REPL REFUSED", 12);
    if (*refused) return 0;
    if (sscanf(b, "REPL HAVE %16s %llu%n", id, &off, &used) != 2 || b[used] != 0) return -1;
    if (strcmp(id, "-") != 0 && !replid_ok(id)) return -1;
    memcpy(replid, id, strlen(id) + 1);
    *applied = off;
    return 0;
}

int repl_start_parse(const char *line, size_t len, bool *full, uint64_t *offset)
{
    char b[REPL_LINE_MAX + 1], word[16];
    unsigned long long off;
    int used = 0;
    if (line_copy(b, sizeof b, line, len) < 0) return -1;
    if (sscanf(b, "REPL %15s %llu%n", word, &off, &used) != 2 || b[used] != 0) return -1;
    if (!strcmp(word, "FULL")) *full = true;
    else if (!strcmp(word, "CONTINUE")) *full = false;
    else return -1;
    *offset = off;
    return 0;
}
