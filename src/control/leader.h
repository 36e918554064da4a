/* leader.h — with --etcd, which of several shoal-control processes is the leader, and how the
 * others keep their copy of the state current.
 *
 * One thread per process ("ha") ticks every --etcd-poll-ms:
 *   - Election: a process that sees no leader key (<prefix>leader) campaigns: it takes a lease
 *     of --etcd-lease-ttl seconds and, in one txn, creates the leader key with that lease if
 *     the key is still absent. The winner loads the stored state (which holds every
 *     acknowledged change: a leader acknowledges only after etcd stored it), installs it, and
 *     from then on guards each of its writes with its leader key's create_revision
 *     (state_etcd_guard). It renews the lease every third of its TTL; when renewal fails for
 *     the whole TTL, etcd says the lease expired, the leader key is gone or another's, or a
 *     write's guard failed, it steps down. A leader that dies stops renewing: etcd drops its
 *     key when the lease runs out, and a follower wins the next campaign within a tick.
 *   - Sync: every process compares the state key's mod_revision with what it last read or
 *     wrote; when it changed (a follower, after the leader's write), the state is read, checked
 *     and installed if its version is newer, and long polls waiting for it are answered. The
 *     version a process serves therefore never goes back.
 * On SIGTERM a leader resigns (revokes its lease), so another takes over at once. */
#ifndef SHOAL_CONTROL_LEADER_H
#define SHOAL_CONTROL_LEADER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct control;
struct ha;

/* Uses c->cfg's --etcd options and c->store (an etcd store). NULL with a message. */
struct ha *ha_create(struct control *c, char *err, size_t errlen);
/* Start campaigning and syncing; `self_url` is what followers forward writes to. */
int ha_start(struct ha *h, const char *self_url, char *err, size_t errlen);
/* Stop the thread; a leader resigns first. */
void ha_destroy(struct ha **h);

/* This process is the leader now (its writes may still be refused by the guard). */
bool ha_is_leader(struct ha *h);
/* The leader's URL into url, waiting up to wait_ms for one to be elected: 0 with url filled,
 * 1 when this process is the leader (url: its own), -1 when none was known in time (or
 * shutting down). */
int ha_leader(struct ha *h, char *url, size_t n, unsigned wait_ms);
/* Check etcd now and wait up to wait_ms until this process serves version v or newer (a
 * follower that forwarded a change, so its answer is followed by reads that show it). */
void ha_await_version(struct ha *h, uint64_t v, unsigned wait_ms);

#endif
