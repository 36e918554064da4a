/* fuzz_reply.c — libFuzzer target for what the router parses of node replies: the framing that
 * matches replies to requests (reply_length) and the meta-reply readers and writers of warm-up
 * (metareply.h), and the count of values a request line may be answered with.
 *
 * The input is a stream of replies as a node would send them. Any bytes must frame into whole
 * replies inside the input, or ask for more, or be refused; never a crash or an over-read.
 * Framing must not depend on how the bytes arrive: a prefix asks for more (or is refused), and
 * resuming from it finds the same end. Every framed reply is then read as a warm lookup's
 * answer and, when it is a hit, answered as a client's mg would be, and checked against a
 * request of every kind the router forwards or composes (reply_fits): a reply that fits ends
 * in \r\n, no prefix of it fits, and the router's form of the check (reply_fits_want) agrees.
 * Read as a request line, the input must give a reply_want that agrees with proto_parse. Read
 * as a list reply (stats, dumps), it must frame line by line the same however it arrives. */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/buf.h"
#include "protocol/protocol.h"
#include "router/metareply.h"
#include "router/replyframe.h"

#define FUZZ_MAX_VALUE 4096
#define FUZZ_MAX_REPLY (reply_max_bytes(4, FUZZ_MAX_VALUE))

static void check_reply(const char *r, size_t n)
{
    static const char mg[] = "mg key s v t c f k O99 T30";
    struct proto_req req;
    const char *err = NULL;
    struct buf out;
    buf_init(&out);
    if (mreply_drop_flag(&out, r, n, 'c') == 0 && buf_used(&out) > n) __builtin_trap();
    buf_release(&out);
    struct mreply_item it;
    if (!mreply_hit(r, n, &it)) return;
    if (it.data < r || it.data + it.vlen + 2 > r + n) __builtin_trap();
    if (proto_parse(mg, sizeof mg - 1, 1 << 20, &req, &err) != PROTO_OK) __builtin_trap();
    buf_init(&out);
    (void)mreply_compose_mg(&out, &req, &it, 30);
    buf_release(&out);
}

/* One request of each kind the router sends a node: clients' commands and its own (probe,
 * warm lookup and fill, repair, flush). Keys a and b, so that replies can name them. */
static const char *const fit_requests[] = {
    "get a b a\r\n", "gets a\r\n", "gat 10 b a\r\n", "gats 0 a\r\n",
    "set a 0 0 1\r\nx\r\n", "cas a 0 0 1 5\r\nx\r\n", "delete a\r\n", "incr a 1\r\n",
    "decr a 1\r\n", "touch a 5\r\n", "version\r\n", "flush_all\r\n", "stats\r\n",
    "mg a s v t c f k O99 T30\r\n", "mg a v f t c k\r\n", "mg YQ== b k\r\n",
    "ms a 1 F0 T60 ME E7\r\nx\r\n", "ms a 1 k O1\r\nx\r\n", "md a\r\n", "md YQ== b\r\n",
    "ma a v O3\r\n", "mn\r\n", "me a\r\n", "bogus\r\n", "stats items\r\n",
    "stats cachedump 1 10\r\n", "stats detail dump\r\n", "stats detail on\r\n",
    "lru_crawler metadump all\r\n",
};

/* Requests answered with a list of lines (stats, dumps), which the router takes a line at a
 * time. */
static const char *const list_requests[] = {
    "stats\r\n", "stats slabs\r\n", "stats cachedump 1 10\r\n", "stats detail dump\r\n",
    "lru_crawler metadump hash\r\n",
};

/* The input read as a list reply to each list request, line by line as the router reads it
 * (reply_list_line): every line is whole, inside the input and within REPLY_LINE_MAX, any part
 * of it asks for more, and where the walk ends the reply, the check of the whole reply
 * (reply_fits) agrees. */
static void check_lists(const char *p, size_t n)
{
    for (size_t i = 0; i < sizeof list_requests / sizeof *list_requests; i++) {
        const char *q = list_requests[i];
        struct reply_want w;
        reply_want_of(&w, q, strlen(q));
        if (w.list == RLIST_NONE) __builtin_trap();
        size_t pos = 0;
        for (bool first = true;; first = false) {
            size_t ll = 0;
            enum reply_lline k = reply_list_line(&w, p + pos, n - pos, first, &ll);
            if (k == RLL_MORE || k == RLL_BAD) break;
            if (ll == 0 || ll > n - pos || ll > REPLY_LINE_MAX || p[pos + ll - 1] != '\n')
                __builtin_trap();
            size_t cut = (size_t)(p[pos] & 0x7f) % ll, ll2;
            if (reply_list_line(&w, p + pos, cut, first, &ll2) != RLL_MORE) __builtin_trap();
            pos += ll;
            if (k == RLL_ITEM) continue;
            if (!reply_fits(q, strlen(q), p, pos) || !reply_fits_want(&w, q, p, pos))
                __builtin_trap();
            break;
        }
    }
}

/* Does the request line q parse (as every line the router sends does)? */
static bool parses(const char *q, size_t n, struct proto_req *req)
{
    const char *err, *nl = memchr(q, '\n', n);
    return proto_parse(q, nl ? (size_t)(nl - q) : n, SIZE_MAX, req, &err) == PROTO_OK;
}

static void check_fits(const char *r, size_t n)
{
    struct proto_req req;
    for (size_t i = 0; i < sizeof fit_requests / sizeof *fit_requests; i++) {
        const char *q = fit_requests[i];
        bool fits = reply_fits(q, strlen(q), r, n);
        struct reply_want w;
        reply_want_of(&w, q, strlen(q));
        /* the router's check, on what it keeps of a line it sent, is the same */
        if (parses(q, strlen(q), &req) && reply_fits_want(&w, q, r, n) != fits) __builtin_trap();
        if (!fits) continue;
        if (n < 2 || r[n - 2] != '\r' || r[n - 1] != '\n') __builtin_trap();
        if (reply_fits(q, strlen(q), r, n - 1)) __builtin_trap();
    }
}

/* Read as a request line, the input gives a want that agrees with the parser wherever the
 * parser accepts the line: the same command, keys, key, opaque and k and b flags. */
static void check_want(const char *q, size_t n)
{
    struct proto_req req;
    struct reply_want w;
    reply_want_of(&w, q, n);
    if (w.slots == 0) __builtin_trap();
    if (!parses(q, n, &req)) return;
    if (w.cmd != req.cmd) __builtin_trap();
    const char *k = q + w.key;
    size_t nk = w.key_end - w.key;
    switch (req.cmd) {
    case CMD_GET: case CMD_GETS: case CMD_GAT: case CMD_GATS: {
        if (k != req.keys || q + w.key_end != req.keys_end) __builtin_trap();
        const char *kp = req.keys, *key;
        uint8_t nkey;
        uint32_t keys = 0;
        while (proto_next_key(&kp, req.keys_end, &key, &nkey)) keys++;
        if (w.slots != (keys ? keys : 1)) __builtin_trap();
        break;
    }
    case CMD_MG: case CMD_MS: case CMD_MD: case CMD_MA: {
        char dec[PROTO_KEY_MAX + 1];
        int ndec = w.base64 ? proto_base64_decode(k, nk, dec, PROTO_KEY_MAX) : (int)nk;
        if (!w.base64) memcpy(dec, k, nk);
        if (w.base64 != req.meta.base64 || ndec != req.nkey || memcmp(dec, req.key, req.nkey) ||
            w.echo_key != proto_meta_has(&req.meta, 'k') ||
            w.has_opaque != proto_meta_has(&req.meta, 'O') ||
            (w.has_opaque && (w.nopaque != req.meta.nopaque ||
                              memcmp(q + w.opaque, req.meta.opaque, w.nopaque))))
            __builtin_trap();
        break;
    }
    default:
        if (w.slots != 1) __builtin_trap();
        break;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *p = (const char *)data;
    size_t pos = 0;
    if (size && reply_value_slots(p, size) == 0) __builtin_trap();
    check_want(p, size);
    check_lists(p, size);
    while (pos < size) {
        size_t scan = 0;
        long len = reply_length(p + pos, size - pos, FUZZ_MAX_VALUE, FUZZ_MAX_REPLY, &scan);
        if (len <= 0) break;
        if ((size_t)len > size - pos || p[pos + (size_t)len - 1] != '\n') __builtin_trap();
        /* the same end when the reply arrives in two parts, split anywhere */
        size_t cut = (size_t)(p[pos] & 0x7f) % (size_t)len;
        size_t scan2 = 0;
        long part = reply_length(p + pos, cut, FUZZ_MAX_VALUE, FUZZ_MAX_REPLY, &scan2);
        if (part > 0) __builtin_trap();
        if (part == 0 && reply_length(p + pos, size - pos, FUZZ_MAX_VALUE, FUZZ_MAX_REPLY, &scan2) != len)
            __builtin_trap();
        check_reply(p + pos, (size_t)len);
        check_fits(p + pos, (size_t)len);
        pos += (size_t)len;
    }
    return 0;
}
