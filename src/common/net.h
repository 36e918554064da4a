/* net.h — sockets: listening, non-blocking set-up, address parsing. */
#ifndef SHOAL_COMMON_NET_H
#define SHOAL_COMMON_NET_H

#include <stddef.h>

/* Open a non-blocking TCP listener on host:port (host NULL or "" = all addresses; IPv4 or
 * IPv6 literal or name). Returns the fd, or -1 with a message in err naming the address and,
 * for EADDRINUSE, the fix. */
int net_listen(const char *host, unsigned port, int backlog, char *err, size_t errlen);
int net_set_nonblock(int fd);
/* Accept one connection from listener `lfd` (non-blocking, close-on-exec); -1 with errno as
 * accept4 sets it. When the process is out of descriptors (EMFILE, ENFILE) the connection at
 * the head of the queue is accepted on a descriptor kept in reserve, sent `busy` and closed,
 * and -1 is returned with errno EMFILE: the client is told at once instead of waiting in the
 * queue for as long as descriptors stay short, and a level-triggered poll on the listener
 * does not spin on the same error. -1 with EAGAIN when no client could be told (the queue is
 * empty, or the reserve is gone until a descriptor frees). Thread-safe: while descriptors are
 * short every call takes one lock, so no other accept takes the reserve's number. */
int net_accept(int lfd, const char *busy, size_t busylen);
/* Raise the soft limit on open descriptors towards `want` (at most the hard limit). Returns
 * the soft limit in force afterwards. Also sets up net_accept's reserve descriptor. */
unsigned long long net_raise_nofile(unsigned long long want);
/* Port a listening socket is bound to (useful with port 0). */
unsigned net_local_port(int fd);

#endif
