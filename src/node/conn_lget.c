/* conn_lget.c — shoal-node's answer to a get/gets/gat/gats line over line_max: part by part as
 * it arrives (protocol/longget.h), so that memory stays bounded by line_max and out_max while
 * the line may be as long as a client likes (memcached has no limit for the get family). Each
 * part's values go out at once; END only when the newline arrives. A part stops early while
 * the output is over out_max/4, and resumes where it stopped once the output has drained (the
 * connection stops reading meanwhile, as for any request). */
#include <stdint.h>

#include "node/cmd.h"
#include "node/conn.h"

/* Answer an error line (without \r\n) in place of the rest of the long get. */
static void lget_error(struct conn *c, const char *err)
{
    c->w->m.protocol_errors++;
    conn_reply_str(c, err);
    conn_reply(c, "\r\n", 2);
}

bool conn_lget_begin(struct conn *c, const char *start, size_t avail)
{
    const char *err = NULL;
    size_t n = lget_start(&c->lget, start, avail, &err);
    if (n == 0) return false;
    c->w->m.long_gets++;
    buf_consume(&c->rbuf, n);
    c->state = CONN_LGET;
    if (err) lget_error(c, err);
    return true;
}

bool conn_lget_step(struct conn *c)
{
    const char *p = buf_start(&c->rbuf), *keys, *end, *err;
    size_t used;
    enum lget_step step = lget_next(&c->lget, p, buf_used(&c->rbuf), SIZE_MAX, &keys, &end,
                                    &used, &err);
    if (step == LGET_WAIT) return false;
    if (step == LGET_BAD) {
        lget_error(c, err);
        return true; /* the rest of the line is dropped from now on */
    }
    if (keys < end) {
        const char *stop = cmd_get_part(c, c->lget.cmd, c->lget.exptime, keys, end);
        if (stop == NULL) { /* answered SERVER_ERROR: drop the rest of the line */
            c->lget.skip = true;
            return true;
        }
        if (stop < end) { /* output over out_max/4: the rest of the part when it drains */
            buf_consume(&c->rbuf, (size_t)(stop - p));
            return true;
        }
    }
    buf_consume(&c->rbuf, used);
    if (step == LGET_LAST) {
        const char *r = lget_end_reply(&c->lget);
        if (r && r[0] == 'E' && r[1] == 'R') c->w->m.protocol_errors++;
        if (r) conn_reply_str(c, r);
        c->lget = (struct lget){0};
        c->state = CONN_LINE;
    }
    return true;
}
