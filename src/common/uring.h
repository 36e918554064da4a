/* uring.h — a small io_uring ring (over liburing) for batching the socket reads and sends of
 * many connections into one system call.
 *
 * Contract: one thread owns a ring. The owner queues requests with uring_recv/uring_send (each
 * carries a caller pointer returned with its completion), submits them all and waits for all
 * their completions with uring_run, then takes the completions with uring_next. The ring never
 * holds more than `entries` requests: callers queue at most that many between two uring_run
 * calls (uring_recv/uring_send return -1 when full). Requests are flagged MSG_DONTWAIT, so on
 * a socket with nothing to read or no room to write they complete at once with -EAGAIN and
 * never wait in the kernel: uring_run only waits for work that is already finished. */
#ifndef SHOAL_COMMON_URING_H
#define SHOAL_COMMON_URING_H

#include <liburing.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct uring {
    struct io_uring ring;
    bool live;
    unsigned entries;
    unsigned queued; /* requests queued since the last uring_run */
    unsigned ready;  /* completions waiting to be taken with uring_next */
};

/* Set up a ring for up to `entries` requests at once. 0, or -1 with errno set (ENOSYS, EPERM
 * where io_uring is disabled: the caller then uses plain system calls). */
int uring_init(struct uring *r, unsigned entries);
void uring_free(struct uring *r);
/* For a worker that batches its sockets' I/O: set up a ring for `entries` requests at once.
 * Returns true when it can be used; otherwise the ring is freed and, when `warn` (say, for the
 * first worker only), one warning says why and that `fallback` happens instead. */
bool uring_init_batch(struct uring *r, unsigned entries, bool warn, const char *fallback);
/* Queue a recv of up to `len` bytes into `buf` from socket `fd`. 0, or -1 when the ring is full. */
int uring_recv(struct uring *r, int fd, void *buf, size_t len, void *user);
/* Queue a send of `len` bytes (MSG_NOSIGNAL). 0, or -1 when the ring is full. */
int uring_send(struct uring *r, int fd, const void *buf, size_t len, void *user);
/* Submit everything queued and wait until all of it has completed: one system call when all
 * goes well. Returns the number of completions to take, or -1 with errno on a ring failure. */
int uring_run(struct uring *r);
/* Take the next completion: its caller pointer in *user, its result (bytes, or -errno) in *res.
 * Returns 0, or -1 when none is left. */
int uring_next(struct uring *r, void **user, int *res);

#endif
