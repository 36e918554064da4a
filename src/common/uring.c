/* uring.c — the io_uring ring of uring.h, over liburing. */
#include "common/uring.h"

#include <errno.h>
#include <string.h>
#include <sys/socket.h>

#include "common/log.h"

int uring_init(struct uring *r, unsigned entries)
{
    memset(r, 0, sizeof *r);
    /* No interrupt of the owner to run completion work (it waits for it anyway); older kernels
     * without the flag get a plain ring. Not SINGLE_ISSUER: the ring is set up by another
     * thread than the one that uses it. */
    const unsigned tries[] = {IORING_SETUP_COOP_TASKRUN, 0};
    int rc = -EINVAL;
    struct io_uring_params p;
    for (size_t i = 0; i < sizeof tries / sizeof tries[0] && rc == -EINVAL; i++) {
        memset(&p, 0, sizeof p);
        p.flags = tries[i];
        rc = io_uring_queue_init_params(entries, &r->ring, &p);
    }
    if (rc < 0) {
        errno = -rc;
        return -1;
    }
    r->live = true;
    r->entries = p.sq_entries;
    return 0;
}

bool uring_init_batch(struct uring *r, unsigned entries, bool warn, const char *fallback)
{
    if (uring_init(r, entries) == 0 && r->entries >= entries) return true;
    if (warn)
        log_warn("io_uring unavailable (%s): %s", !r->live ? strerror(errno) : "ring too small",
                 fallback);
    uring_free(r);
    return false;
}

void uring_free(struct uring *r)
{
    if (r->live) io_uring_queue_exit(&r->ring);
    memset(r, 0, sizeof *r);
}

/* A fresh submission entry, or NULL when the caller already has `entries` requests out. */
static struct io_uring_sqe *uring_sqe(struct uring *r)
{
    if (r->queued + r->ready >= r->entries) return NULL;
    struct io_uring_sqe *sqe = io_uring_get_sqe(&r->ring);
    if (sqe) r->queued++;
    return sqe;
}

int uring_recv(struct uring *r, int fd, void *buf, size_t len, void *user)
{
    struct io_uring_sqe *sqe = uring_sqe(r);
    if (sqe == NULL) return -1;
    /* MSG_DONTWAIT: complete now with -EAGAIN rather than wait for data */
    io_uring_prep_recv(sqe, fd, buf, len > 0x7fffffffu ? 0x7fffffffu : len, MSG_DONTWAIT);
    io_uring_sqe_set_data(sqe, user);
    return 0;
}

int uring_send(struct uring *r, int fd, const void *buf, size_t len, void *user)
{
    struct io_uring_sqe *sqe = uring_sqe(r);
    if (sqe == NULL) return -1;
    io_uring_prep_send(sqe, fd, buf, len > 0x7fffffffu ? 0x7fffffffu : len,
                       MSG_NOSIGNAL | MSG_DONTWAIT);
    io_uring_sqe_set_data(sqe, user);
    return 0;
}

int uring_run(struct uring *r)
{
    unsigned want = r->ready + r->queued;
    for (;;) {
        int rc = io_uring_submit_and_wait(&r->ring, want);
        if (rc < 0 && rc != -EINTR && rc != -EAGAIN && rc != -EBUSY) {
            errno = -rc;
            return -1;
        }
        if (io_uring_sq_ready(&r->ring) == 0 && io_uring_cq_ready(&r->ring) >= want) break;
    }
    r->queued = 0;
    r->ready = want;
    return (int)want;
}

int uring_next(struct uring *r, void **user, int *res)
{
    struct io_uring_cqe *cqe;
    if (io_uring_peek_cqe(&r->ring, &cqe) != 0) return -1;
    *user = io_uring_cqe_get_data(cqe);
    *res = cqe->res;
    io_uring_cqe_seen(&r->ring, cqe);
    if (r->ready) r->ready--;
    return 0;
}
