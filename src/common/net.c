/* net.c — socket helpers (see net.h). */
#include "common/net.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

/* A descriptor held only to be given up for one accept when the process has none left. */
static int net_reserve = -1;
static pthread_mutex_t net_reserve_lock = PTHREAD_MUTEX_INITIALIZER;
/* Set while accepts meet EMFILE: they then all go through net_reserve_lock. */
static int net_out_of_fds;

int net_set_nonblock(int fd)
{
    int fl = fcntl(fd, F_GETFL, 0);
    return fl < 0 ? -1 : fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

int net_listen(const char *host, unsigned port, int backlog, char *err, size_t errlen)
{
    struct addrinfo hints = {0}, *res = NULL;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    char portstr[16];
    snprintf(portstr, sizeof portstr, "%u", port);
    int rc = getaddrinfo(host && *host ? host : NULL, portstr, &hints, &res);
    if (rc != 0) {
        snprintf(err, errlen, "cannot resolve listen address '%s': %s; use an IP address with -l",
                 host ? host : "", gai_strerror(rc));
        return -1;
    }
    int fd = -1, last_errno = 0;
    /* Prefer IPv6 wildcard (dual stack) when no host is given, else the first that binds. */
    for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
        fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0) {
            last_errno = errno;
            continue;
        }
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && listen(fd, backlog) == 0) break;
        last_errno = errno;
        close(fd);
        fd = -1;
    }
    freeaddrinfo(res);
    if (fd < 0) {
        if (last_errno == EADDRINUSE)
            snprintf(err, errlen,
                     "cannot listen on %s:%u: address already in use; stop the other process or "
                     "choose another port with -p",
                     host && *host ? host : "*", port);
        else
            snprintf(err, errlen, "cannot listen on %s:%u: %s", host && *host ? host : "*", port,
                     strerror(last_errno));
    }
    return fd;
}

unsigned long long net_raise_nofile(unsigned long long want)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < want) {
        rlim_t cur = rl.rlim_cur;
        rl.rlim_cur = rl.rlim_max == RLIM_INFINITY || rl.rlim_max > want ? want : rl.rlim_max;
        if (setrlimit(RLIMIT_NOFILE, &rl) < 0) rl.rlim_cur = cur;
    }
    pthread_mutex_lock(&net_reserve_lock);
    if (net_reserve < 0) net_reserve = open("/dev/null", O_RDONLY | O_CLOEXEC);
    pthread_mutex_unlock(&net_reserve_lock);
    return getrlimit(RLIMIT_NOFILE, &rl) == 0 ? (unsigned long long)rl.rlim_cur : 0;
}

int net_accept(int lfd, const char *busy, size_t busylen)
{
    /* Out of descriptors, every accept takes the lock: one that ran beside the refusal below
     * could take the number the reserve just gave up, and the reserve would be lost for good
     * (clients then left in the queue, neither served nor refused). */
    if (!__atomic_load_n(&net_out_of_fds, __ATOMIC_RELAXED)) {
        int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd >= 0 || (errno != EMFILE && errno != ENFILE)) return fd;
    }
    pthread_mutex_lock(&net_reserve_lock);
    __atomic_store_n(&net_out_of_fds, 1, __ATOMIC_RELAXED);
    int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd >= 0 || (errno != EMFILE && errno != ENFILE)) {
        /* a descriptor came free: accepts go their own way again once the reserve is back */
        int e = errno;
        if (net_reserve < 0) net_reserve = open("/dev/null", O_RDONLY | O_CLOEXEC);
        if (net_reserve >= 0) __atomic_store_n(&net_out_of_fds, 0, __ATOMIC_RELAXED);
        pthread_mutex_unlock(&net_reserve_lock);
        errno = e;
        return fd;
    }
    if (net_reserve < 0) net_reserve = open("/dev/null", O_RDONLY | O_CLOEXEC);
    bool refused = false;
    if (net_reserve >= 0) {
        close(net_reserve);
        fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd >= 0) {
            ssize_t wr = send(fd, busy, busylen, MSG_NOSIGNAL | MSG_DONTWAIT);
            (void)wr;
            close(fd);
            refused = true;
        }
        net_reserve = open("/dev/null", O_RDONLY | O_CLOEXEC);
    }
    pthread_mutex_unlock(&net_reserve_lock);
    /* EMFILE: one client was told and closed; EAGAIN: none could be (the queue is empty, or
     * no descriptor at all is left): try again on the next wake-up */
    errno = refused ? EMFILE : EAGAIN;
    return -1;
}

unsigned net_local_port(int fd)
{
    struct sockaddr_storage ss;
    socklen_t len = sizeof ss;
    if (getsockname(fd, (struct sockaddr *)&ss, &len) < 0) return 0;
    if (ss.ss_family == AF_INET) return ntohs(((struct sockaddr_in *)&ss)->sin_port);
    if (ss.ss_family == AF_INET6) return ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
    return 0;
}
