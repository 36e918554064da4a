/* client_lget.c — shoal-router's answer to a get/gets/gat/gats line over --line-max: routed in
 * parts as it arrives (protocol/longget.h), so that the router holds at most a part of it,
 * while the line may be as long as a client likes (memcached has no limit for the get family).
 *
 * Each part (the complete keys buffered, at most LGET_PART_MAX bytes of them) becomes a get
 * request of its own, routed as any (split per node, merged in key order), and queued in the
 * client's FIFO like any other request, so replies keep their order. Parts go one at a time:
 * the next is routed once the last has left the FIFO, and the client's input is paused
 * meanwhile, so a long get makes the router hold one part's keys and reply at most. Every reply of the line's
 * parts is marked (rq->lget_part) and passes client_lget_filter on its way out: a part's END is
 * taken off, and the END (or ERROR) that ends the line is a local reply queued when the
 * newline arrives. A part answered with an error (a node's timeout, a bad key, a namespace
 * limit) ends the reply: the error stands in for END and what the later parts answer is
 * dropped, so the client reads one well-formed reply. */
#include <stdio.h>
#include <string.h>

#include "router/client.h"
#include "router/route.h"
#include "router/worker.h"

/* Most key bytes a part carries: a part becomes one request line to each node it touches. */
#define LGET_PART_MAX 8192

/* Answer an error line (without \r\n) in place of the rest of the long get. One local reply,
 * so that the filter sees the whole line. */
static void lget_error(struct client *c, const char *err)
{
    char line[128];
    int n = snprintf(line, sizeof line, "%s\r\n", err);
    c->w->m.protocol_errors++;
    client_local(c, line, (size_t)n < sizeof line ? (size_t)n : sizeof line - 1);
}

bool client_lget_begin(struct client *c, const char *start, size_t avail)
{
    const char *err = NULL;
    size_t n = lget_start(&c->lget, start, avail, &err);
    if (n == 0) return false;
    c->w->m.long_gets++;
    c->lget_failed = false;
    buf_consume(&c->rbuf, n);
    if (err) lget_error(c, err);
    return true;
}

/* Route the keys [keys, end) (valid, at least one) as a get of the long get's verb. */
static void lget_route(struct client *c, const char *keys, const char *end)
{
    static const char *const verbs[] = {[CMD_GET] = "get", [CMD_GETS] = "gets",
                                        [CMD_GAT] = "gat", [CMD_GATS] = "gats"};
    struct buf *b = &c->lline;
    b->off = b->len = 0;
    int rc = buf_append_str(b, verbs[c->lget.cmd]);
    if (rc == 0 && (c->lget.cmd == CMD_GAT || c->lget.cmd == CMD_GATS))
        rc = buf_printf(b, " %lld", (long long)c->lget.exptime);
    if (rc == 0) rc = buf_append(b, " ", 1);
    if (rc == 0) rc = buf_append(b, keys, (size_t)(end - keys));
    if (rc < 0) {
        client_oom(c);
        return;
    }
    struct proto_req req;
    const char *err = NULL;
    enum proto_status st = proto_parse(buf_start(b), buf_used(b), c->w->r->cfg.item_max, &req,
                                       &err);
    if (st != PROTO_OK) {
        lget_error(c, err);
        return;
    }
    route_get(c, &req, buf_start(b), buf_used(b));
}

bool client_lget_step(struct client *c)
{
    size_t max = c->w->r->cfg.line_max - 48; /* room for the verb, an exptime and \r\n */
    if (max > LGET_PART_MAX) max = LGET_PART_MAX;
    if (c->lget_failed) c->lget.skip = true; /* a part failed: the rest would be dropped */
    if (!c->lget.skip && c->tail && c->tail->lget_part) {
        /* One part at a time: its reply is the most the line makes the router hold. Input
         * stops meanwhile; the part's reply leaving the FIFO brings us back. */
        c->paused = true;
        return false;
    }
    const char *p = buf_start(&c->rbuf), *keys, *end, *err;
    size_t used;
    enum lget_step step = lget_next(&c->lget, p, buf_used(&c->rbuf), max, &keys, &end, &used,
                                    &err);
    if (step == LGET_WAIT) return false;
    if (step == LGET_BAD) {
        lget_error(c, err);
        return true; /* the rest of the line is dropped from now on */
    }
    const char *k = keys;
    while (k < end && *k == ' ') k++;
    if (k < end) lget_route(c, keys, end);
    buf_consume(&c->rbuf, used);
    if (step == LGET_LAST) {
        const char *r = lget_end_reply(&c->lget);
        struct rreq *rq = rreq_create(c, RQ_LOCAL, CMD_NONE);
        if (rq == NULL || (r && buf_append_str(&rq->reply, r) < 0)) {
            if (rq) rreq_destroy(rq);
            c->w->m.out_of_memory++;
            c->closing = true; /* the reply could not be ended */
        } else {
            if (r && r[0] == 'E' && r[1] == 'R') c->w->m.protocol_errors++;
            c->w->m.cmd_local++;
            rq->done = true;
            rq->lget_last = true;
            client_enqueue(c, rq);
        }
        c->lget = (struct lget){0};
        buf_release(&c->lline);
    }
    return true;
}

void client_lget_filter(struct client *c, struct rreq *rq)
{
    struct buf *b = &rq->reply;
    size_t n = buf_used(b);
    const char *p = buf_start(b);
    if (rq->lget_last) {
        if (c->lget_failed) b->off = b->len = 0; /* an error stood in for the END */
        c->lget_failed = false;
        return;
    }
    if (c->lget_failed) {
        b->off = b->len = 0;
        return;
    }
    /* a part's reply: VALUE blocks then END, or one error line */
    bool ok = n == 0 || (n >= 5 && memcmp(p + n - 5, "END\r\n", 5) == 0 &&
                         (n == 5 || (n > 6 && memcmp(p, "VALUE ", 6) == 0)));
    if (ok && n) b->len -= 5;
    else if (!ok) c->lget_failed = true;
}
