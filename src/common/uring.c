/* uring.c — a minimal io_uring ring over the raw system calls (see uring.h). */
#include "common/uring.h"

#include <errno.h>
#include <linux/io_uring.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

static int uring_setup(unsigned entries, struct io_uring_params *p)
{
    return (int)syscall(__NR_io_uring_setup, entries, p);
}

static int uring_enter(int fd, unsigned submit, unsigned wait, unsigned flags)
{
    return (int)syscall(__NR_io_uring_enter, fd, submit, wait, flags, NULL, 0);
}

int uring_init(struct uring *r, unsigned entries)
{
    memset(r, 0, sizeof *r);
    r->fd = -1;
    struct io_uring_params p;
    /* no interrupt of the owner to run completion work (it waits for it anyway); older kernels
     * without the flag get a plain ring. Not SINGLE_ISSUER: the ring is set up by another
     * thread than the one that uses it. */
    const unsigned tries[] = {IORING_SETUP_COOP_TASKRUN, 0};
    for (size_t i = 0; i < sizeof tries / sizeof tries[0] && r->fd < 0; i++) {
        memset(&p, 0, sizeof p);
        p.flags = tries[i];
        r->fd = uring_setup(entries, &p);
        if (r->fd < 0 && errno != EINVAL) return -1;
    }
    if (r->fd < 0) return -1;
    r->entries = p.sq_entries;
    r->sq_map_len = p.sq_off.array + p.sq_entries * sizeof(unsigned);
    r->cq_map_len = p.cq_off.cqes + p.cq_entries * sizeof(struct io_uring_cqe);
    if (p.features & IORING_FEAT_SINGLE_MMAP) {
        if (r->cq_map_len > r->sq_map_len) r->sq_map_len = r->cq_map_len;
        r->cq_map_len = r->sq_map_len;
    }
    r->sq_map = mmap(NULL, r->sq_map_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, r->fd,
                     IORING_OFF_SQ_RING);
    if (r->sq_map == MAP_FAILED) goto fail;
    if (p.features & IORING_FEAT_SINGLE_MMAP) {
        r->cq_map = r->sq_map;
    } else {
        r->cq_map = mmap(NULL, r->cq_map_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE,
                         r->fd, IORING_OFF_CQ_RING);
        if (r->cq_map == MAP_FAILED) goto fail;
    }
    r->sqes_len = p.sq_entries * sizeof(struct io_uring_sqe);
    r->sqes = mmap(NULL, r->sqes_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, r->fd,
                   IORING_OFF_SQES);
    if (r->sqes == MAP_FAILED) goto fail;
    char *sq = r->sq_map, *cq = r->cq_map;
    r->sq_head = (unsigned *)(sq + p.sq_off.head);
    r->sq_tail = (unsigned *)(sq + p.sq_off.tail);
    r->sq_mask = (unsigned *)(sq + p.sq_off.ring_mask);
    r->sq_array = (unsigned *)(sq + p.sq_off.array);
    r->cq_head = (unsigned *)(cq + p.cq_off.head);
    r->cq_tail = (unsigned *)(cq + p.cq_off.tail);
    r->cq_mask = (unsigned *)(cq + p.cq_off.ring_mask);
    r->cqes = (struct io_uring_cqe *)(cq + p.cq_off.cqes);
    /* slot i of the ring always names sqe i */
    for (unsigned i = 0; i < p.sq_entries; i++) r->sq_array[i] = i;
    r->sq_local_tail = *r->sq_tail;
    return 0;
fail: {
    int e = errno;
    uring_free(r);
    errno = e;
    return -1;
}
}

void uring_free(struct uring *r)
{
    if (r->sqes && r->sqes != MAP_FAILED) munmap(r->sqes, r->sqes_len);
    if (r->cq_map && r->cq_map != MAP_FAILED && r->cq_map != r->sq_map)
        munmap(r->cq_map, r->cq_map_len);
    if (r->sq_map && r->sq_map != MAP_FAILED) munmap(r->sq_map, r->sq_map_len);
    if (r->fd >= 0) close(r->fd);
    memset(r, 0, sizeof *r);
    r->fd = -1;
}

static struct io_uring_sqe *uring_sqe(struct uring *r)
{
    if (r->queued + r->ready >= r->entries) return NULL;
    struct io_uring_sqe *sqe = &r->sqes[r->sq_local_tail & *r->sq_mask];
    r->sq_local_tail++;
    r->queued++;
    memset(sqe, 0, sizeof *sqe);
    return sqe;
}

int uring_recv(struct uring *r, int fd, void *buf, size_t len, void *user)
{
    struct io_uring_sqe *sqe = uring_sqe(r);
    if (sqe == NULL) return -1;
    sqe->opcode = IORING_OP_RECV;
    sqe->fd = fd;
    sqe->addr = (uint64_t)(uintptr_t)buf;
    sqe->len = len > 0x7fffffffu ? 0x7fffffffu : (unsigned)len;
    sqe->msg_flags = MSG_DONTWAIT; /* complete now with -EAGAIN rather than wait for data */
    sqe->user_data = (uint64_t)(uintptr_t)user;
    return 0;
}

int uring_send(struct uring *r, int fd, const void *buf, size_t len, void *user)
{
    struct io_uring_sqe *sqe = uring_sqe(r);
    if (sqe == NULL) return -1;
    sqe->opcode = IORING_OP_SEND;
    sqe->fd = fd;
    sqe->addr = (uint64_t)(uintptr_t)buf;
    sqe->len = len > 0x7fffffffu ? 0x7fffffffu : (unsigned)len;
    sqe->msg_flags = MSG_NOSIGNAL | MSG_DONTWAIT;
    sqe->user_data = (uint64_t)(uintptr_t)user;
    return 0;
}

int uring_run(struct uring *r)
{
    unsigned want = r->ready + r->queued;
    __atomic_store_n(r->sq_tail, r->sq_local_tail, __ATOMIC_RELEASE);
    for (;;) {
        unsigned unsubmitted = r->sq_local_tail - __atomic_load_n(r->sq_head, __ATOMIC_ACQUIRE);
        unsigned done = __atomic_load_n(r->cq_tail, __ATOMIC_ACQUIRE) - *r->cq_head;
        if (unsubmitted == 0 && done >= want) break;
        if (uring_enter(r->fd, unsubmitted, want, IORING_ENTER_GETEVENTS) < 0 && errno != EINTR &&
            errno != EAGAIN && errno != EBUSY)
            return -1;
    }
    r->queued = 0;
    r->ready = want;
    return (int)want;
}

int uring_next(struct uring *r, void **user, int *res)
{
    unsigned head = *r->cq_head;
    if (head == __atomic_load_n(r->cq_tail, __ATOMIC_ACQUIRE)) return -1;
    struct io_uring_cqe *cqe = &r->cqes[head & *r->cq_mask];
    *user = (void *)(uintptr_t)cqe->user_data;
    *res = cqe->res;
    __atomic_store_n(r->cq_head, head + 1, __ATOMIC_RELEASE);
    if (r->ready) r->ready--;
    return 0;
}
