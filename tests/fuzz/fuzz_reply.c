/* fuzz_reply.c — libFuzzer target for what the router parses of node replies: the framing that
 * matches replies to requests (reply_length) and the meta-reply readers and writers of warm-up
 * (metareply.h), and the count of values a request line may be answered with.
 *
 * The input is a stream of replies as a node would send them. Any bytes must frame into whole
 * replies inside the input, or ask for more, or be refused; never a crash or an over-read.
 * Framing must not depend on how the bytes arrive: a prefix asks for more (or is refused), and
 * resuming from it finds the same end. Every framed reply is then read as a warm lookup's
 * answer and, when it is a hit, answered as a client's mg would be. */
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

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *p = (const char *)data;
    size_t pos = 0;
    if (size && reply_value_slots(p, size) == 0) __builtin_trap();
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
        pos += (size_t)len;
    }
    return 0;
}
