/* fuzz_statslist.c — libFuzzer target for the router's merge of node stat lists
 * (src/router/statslist.c), which reads whatever a node sends after the reply framing let it
 * through.
 *
 * The first byte picks the kind of list; the rest, cut at NUL bytes, is up to four nodes'
 * lists. Invariants: the merge writes only whole "STAT "/"PREFIX " lines ending in \r\n, and
 * the written merge read back as one node's list writes out the same bytes (a merge of one
 * list is that list, normalised once). */
#include <stdlib.h>
#include <string.h>

#include "common/buf.h"
#include "router/statslist.h"

static void check_lines(const struct buf *b, uint8_t merge)
{
    if (buf_used(b) == 0) return;
    const char *p = buf_start(b), *end = p + buf_used(b);
    const char *head = merge == STATSMERGE_PREFIX ? "PREFIX " : "STAT ";
    size_t nh = strlen(head);
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        if (nl == NULL || nl == p || nl[-1] != '\r') abort();
        if ((size_t)(nl - p) < nh || memcmp(p, head, nh)) abort();
        p = nl + 1;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *in, size_t size)
{
    if (size < 1) return 0;
    uint8_t merge = in[0] % (STATSMERGE_SETTINGS + 1);
    if (merge == STATSMERGE_FIRST) return 0; /* never merged: the first answer is passed on */
    const char *p = (const char *)in + 1, *end = (const char *)in + size;
    struct statslist l = {.merge = merge};
    for (int node = 0; node < 4 && p <= end; node++) {
        const char *cut = memchr(p, '\0', (size_t)(end - p));
        const char *e = cut ? cut : end;
        if (statslist_add(&l, p, (size_t)(e - p)) < 0) abort();
        if (node == 0 && e > p) (void)statslist_get(&l, p, (size_t)(e - p) > 300 ? 300 : (size_t)(e - p));
        if (cut == NULL) break;
        p = cut + 1;
    }
    struct buf w1, w2;
    buf_init(&w1);
    buf_init(&w2);
    statslist_write(&w1, &l);
    if (buf_used(&w1) && w1.data == NULL) abort();
    check_lines(&w1, merge);
    struct statslist again = {.merge = merge};
    if (buf_used(&w1) && statslist_add(&again, buf_start(&w1), buf_used(&w1)) < 0) abort();
    statslist_write(&w2, &again);
    if (buf_used(&w1) != buf_used(&w2) ||
        (buf_used(&w1) && memcmp(buf_start(&w1), buf_start(&w2), buf_used(&w1))))
        abort();
    statslist_free(&l);
    statslist_free(&again);
    buf_release(&w1);
    buf_release(&w2);
    return 0;
}
