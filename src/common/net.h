/* net.h — sockets: listening, non-blocking set-up, address parsing. */
#ifndef SHOAL_COMMON_NET_H
#define SHOAL_COMMON_NET_H

#include <stddef.h>

/* Open a non-blocking TCP listener on host:port (host NULL or "" = all addresses; IPv4 or
 * IPv6 literal or name). Returns the fd, or -1 with a message in err naming the address and,
 * for EADDRINUSE, the fix. */
int net_listen(const char *host, unsigned port, int backlog, char *err, size_t errlen);
int net_set_nonblock(int fd);
/* Port a listening socket is bound to (useful with port 0). */
unsigned net_local_port(int fd);

#endif
