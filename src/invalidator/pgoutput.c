/* pgoutput.c — decoder for the replication protocol frames and pgoutput's messages (see
 * pgoutput.h; formats from PostgreSQL's "Logical Replication Message Formats" and "Streaming
 * Replication Protocol" chapters). Every read is bounds-checked through one cursor. */
#include "invalidator/pgoutput.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

struct cur {
    const uint8_t *p;
    size_t n, off;
    int bad;
};

static int need(struct cur *c, size_t k)
{
    if (c->bad || c->n - c->off < k) {
        c->bad = 1;
        return 0;
    }
    return 1;
}

static uint8_t rd8(struct cur *c)
{
    if (!need(c, 1)) return 0;
    return c->p[c->off++];
}

static uint16_t rd16(struct cur *c)
{
    if (!need(c, 2)) return 0;
    uint16_t v = (uint16_t)((c->p[c->off] << 8) | c->p[c->off + 1]);
    c->off += 2;
    return v;
}

static uint32_t rd32(struct cur *c)
{
    if (!need(c, 4)) return 0;
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) v = (v << 8) | c->p[c->off + i];
    c->off += 4;
    return v;
}

static uint64_t rd64(struct cur *c)
{
    if (!need(c, 8)) return 0;
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v = (v << 8) | c->p[c->off + i];
    c->off += 8;
    return v;
}

/* A NUL-terminated string inside the message. */
static const char *rdstr(struct cur *c)
{
    if (c->bad) return "";
    const uint8_t *z = memchr(c->p + c->off, 0, c->n - c->off);
    if (z == NULL) {
        c->bad = 1;
        return "";
    }
    const char *s = (const char *)c->p + c->off;
    c->off = (size_t)(z - c->p) + 1;
    return s;
}

static const void *rdbytes(struct cur *c, size_t k)
{
    if (!need(c, k)) return NULL;
    const void *s = c->p + c->off;
    c->off += k;
    return s;
}

int pgo_frame_decode(const uint8_t *p, size_t n, struct pgo_frame *f)
{
    struct cur c = {p, n, 0, 0};
    memset(f, 0, sizeof *f);
    f->kind = (char)rd8(&c);
    if (f->kind == 'w') {
        f->wal_start = rd64(&c);
        f->wal_end = rd64(&c);
        f->send_time = (int64_t)rd64(&c);
        if (c.bad) return -1;
        f->data = p + c.off;
        f->ndata = n - c.off;
        return 0;
    }
    if (f->kind == 'k') {
        f->wal_end = rd64(&c);
        f->send_time = (int64_t)rd64(&c);
        f->reply_requested = rd8(&c);
        return c.bad ? -1 : 0;
    }
    return -1;
}

static void wr64(uint8_t *o, uint64_t v)
{
    for (int i = 7; i >= 0; i--) {
        o[i] = (uint8_t)v;
        v >>= 8;
    }
}

size_t pgo_status_update(uint8_t out[34], uint64_t written, uint64_t flushed, uint64_t applied,
                         int64_t now_pg_us, int reply)
{
    out[0] = 'r';
    wr64(out + 1, written);
    wr64(out + 9, flushed);
    wr64(out + 17, applied);
    wr64(out + 25, (uint64_t)now_pg_us);
    out[33] = reply ? 1 : 0;
    return 34;
}

static void rdtuple(struct cur *c, struct pgo_tuple *t)
{
    t->ncols = rd16(c);
    if (t->ncols > PGO_MAX_COLS) {
        c->bad = 1;
        return;
    }
    for (uint16_t i = 0; i < t->ncols && !c->bad; i++) {
        struct pgo_value *v = &t->vals[i];
        v->kind = (char)rd8(c);
        v->data = NULL;
        v->len = 0;
        switch (v->kind) {
        case 'n':
        case 'u':
            break;
        case 't':
        case 'b':
            v->len = rd32(c);
            v->data = rdbytes(c, v->len);
            break;
        default:
            c->bad = 1;
        }
    }
}

int pgo_decode(const uint8_t *p, size_t n, int in_stream, struct pgo_msg *m)
{
    struct cur c = {p, n, 0, 0};
    m->kind = (char)rd8(&c);
    m->xid = m->subxid = 0;
    m->old_kind = 0;
    m->old.ncols = m->new.ncols = 0;
    m->nspname = m->relname = "";
    switch (m->kind) {
    case PGO_BEGIN:
        m->lsn = rd64(&c);
        m->ts = (int64_t)rd64(&c);
        m->xid = rd32(&c);
        break;
    case PGO_COMMIT:
        m->flags = rd8(&c);
        m->lsn = rd64(&c);
        m->end_lsn = rd64(&c);
        m->ts = (int64_t)rd64(&c);
        break;
    case PGO_ORIGIN:
        m->lsn = rd64(&c);
        m->nspname = rdstr(&c);
        break;
    case PGO_MESSAGE:
        if (in_stream) m->xid = rd32(&c);
        m->flags = rd8(&c);
        m->lsn = rd64(&c);
        m->nspname = rdstr(&c);
        m->ncontent = rd32(&c);
        m->content = rdbytes(&c, m->ncontent);
        break;
    case PGO_RELATION:
        if (in_stream) m->xid = rd32(&c);
        m->relid = rd32(&c);
        m->nspname = rdstr(&c);
        m->relname = rdstr(&c);
        m->replident = (char)rd8(&c);
        m->ncols = rd16(&c);
        if (m->ncols > PGO_MAX_COLS) return -1;
        for (uint16_t i = 0; i < m->ncols && !c.bad; i++) {
            m->cols[i].flags = rd8(&c);
            m->cols[i].name = rdstr(&c);
            m->cols[i].type_oid = rd32(&c);
            m->cols[i].typmod = (int32_t)rd32(&c);
        }
        break;
    case PGO_TYPE:
        if (in_stream) m->xid = rd32(&c);
        m->relid = rd32(&c); /* the type's oid */
        m->nspname = rdstr(&c);
        m->relname = rdstr(&c);
        break;
    case PGO_INSERT:
        if (in_stream) m->xid = rd32(&c);
        m->relid = rd32(&c);
        if (rd8(&c) != 'N') return -1;
        rdtuple(&c, &m->new);
        break;
    case PGO_UPDATE: {
        if (in_stream) m->xid = rd32(&c);
        m->relid = rd32(&c);
        uint8_t k = rd8(&c);
        if (k == 'K' || k == 'O') {
            m->old_kind = (char)k;
            rdtuple(&c, &m->old);
            k = rd8(&c);
        }
        if (k != 'N') return -1;
        rdtuple(&c, &m->new);
        break;
    }
    case PGO_DELETE: {
        if (in_stream) m->xid = rd32(&c);
        m->relid = rd32(&c);
        uint8_t k = rd8(&c);
        if (k != 'K' && k != 'O') return -1;
        m->old_kind = (char)k;
        rdtuple(&c, &m->old);
        break;
    }
    case PGO_TRUNCATE:
        if (in_stream) m->xid = rd32(&c);
        m->nrels = rd32(&c);
        m->flags = rd8(&c);
        if (c.bad || m->nrels > (n - c.off) / 4) return -1;
        m->relids = rdbytes(&c, (size_t)m->nrels * 4);
        break;
    case PGO_STREAM_START:
        m->xid = rd32(&c);
        m->flags = rd8(&c);
        break;
    case PGO_STREAM_STOP:
        break;
    case PGO_STREAM_COMMIT:
        m->xid = rd32(&c);
        m->flags = rd8(&c);
        m->lsn = rd64(&c);
        m->end_lsn = rd64(&c);
        m->ts = (int64_t)rd64(&c);
        break;
    case PGO_STREAM_ABORT:
        m->xid = rd32(&c);
        m->subxid = rd32(&c);
        /* protocol 4 adds the abort's LSN and time; version 2 ends here */
        break;
    default:
        return -1;
    }
    if (c.bad) return -1;
    return 0;
}

uint32_t pgo_truncate_relid(const struct pgo_msg *m, uint32_t i)
{
    const uint8_t *q = m->relids + (size_t)i * 4;
    return ((uint32_t)q[0] << 24) | ((uint32_t)q[1] << 16) | ((uint32_t)q[2] << 8) | q[3];
}

void pgo_lsn_format(uint64_t lsn, char *out, size_t cap)
{
    snprintf(out, cap, "%" PRIX32 "/%" PRIX32, (uint32_t)(lsn >> 32), (uint32_t)lsn);
}

int pgo_lsn_parse(const char *s, uint64_t *lsn)
{
    unsigned hi, lo;
    int end = 0;
    if (sscanf(s, "%X/%X%n", &hi, &lo, &end) != 2 || s[end] != 0) return -1;
    *lsn = ((uint64_t)hi << 32) | lo;
    return 0;
}
