/* fuzz_pgoutput.c — libFuzzer target for the replication stream decoder (pgoutput.c) and what
 * the reader does with each decoded message (rows.c).
 *
 * The input is a sequence of messages, each a 2-byte big-endian length then that many bytes,
 * fed as a session would be: frames ('w', 'k') and bare pgoutput messages, with the stream flag
 * following Stream Start/Stop. Any bytes must decode or be refused; a decoded change must map
 * to keys within memcached's rules (no key over 250 bytes, none with a space or control byte);
 * never a crash, an over-read or a leak. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "invalidator/config.h"
#include "invalidator/pgoutput.h"
#include "invalidator/rows.h"
#include "common/template.h"

static const char CONF[] =
    "{\"clusters\": {\"l\": {\"routers\": [\"127.0.0.1:1\"]}}, \"tables\": {\"public.p\": "
    "{\"keys\": [\"c:p:{id}\", \"c:s:{sku}-{id}\"]}, \"a\": {\"keys\": [\"a:{a}\"]}}, "
    "\"invalidation_table\": \"public.inv\"}";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static struct pgo_msg *m;
    static struct inv_config conf;
    if (m == NULL) {
        char err[300];
        m = malloc(sizeof *m);
        if (inv_config_parse(CONF, strlen(CONF), &conf, err, sizeof err) < 0) __builtin_trap();
    }
    struct rows *r = rows_create(&conf, NULL);
    struct keyset ks = {0};
    int in_stream = 0;
    size_t off = 0;
    while (r && size - off >= 2) {
        size_t n = ((size_t)data[off] << 8) | data[off + 1];
        off += 2;
        if (n > size - off) n = size - off;
        const uint8_t *p = data + off;
        off += n;
        struct pgo_frame f;
        if (n && (p[0] == 'w' || p[0] == 'k') && pgo_frame_decode(p, n, &f) == 0) {
            if (f.kind == 'w' && (f.data < p || f.data + f.ndata != p + n)) __builtin_trap();
            continue;
        }
        if (pgo_decode(p, n, in_stream, m) < 0) continue;
        switch (m->kind) {
        case PGO_STREAM_START: in_stream = 1; break;
        case PGO_STREAM_STOP: in_stream = 0; break;
        case PGO_RELATION: rows_relation(r, m); break;
        case PGO_INSERT:
        case PGO_UPDATE:
        case PGO_DELETE:
        case PGO_TRUNCATE: rows_change(r, m, &ks); break;
        default: break;
        }
    }
    for (size_t i = 0; i < ks.n; i++) {
        if (ks.e[i].len > TMPL_KEY_MAX || ks.e[i].off + ks.e[i].len > ks.nbytes) __builtin_trap();
        for (uint32_t j = 0; j < ks.e[i].len; j++)
            if ((unsigned char)ks.bytes[ks.e[i].off + j] <= ' ') __builtin_trap();
    }
    keyset_free(&ks);
    rows_destroy(&r);
    return 0;
}
