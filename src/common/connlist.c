/* connlist.c — memcached's `stats conns` over connections owned by many threads (connlist.h). */
#include "common/connlist.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

void connlist_init(struct connlist *l)
{
    pthread_mutex_init(&l->lock, NULL);
    l->head = NULL;
}

/* `addr` as memcached's conn_to_str writes a TCP address. */
static void connlist_addr_str(const struct sockaddr_storage *ss, char *out, size_t n)
{
    char host[INET6_ADDRSTRLEN] = "";
    if (ss->ss_family == AF_INET) {
        const struct sockaddr_in *a = (const struct sockaddr_in *)ss;
        inet_ntop(AF_INET, &a->sin_addr, host, sizeof host);
        snprintf(out, n, "tcp:%s:%u", host, (unsigned)ntohs(a->sin_port));
    } else if (ss->ss_family == AF_INET6) {
        const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)ss;
        inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof host);
        snprintf(out, n, "tcp6:[%s]:%u", host, (unsigned)ntohs(a->sin6_port));
    } else {
        snprintf(out, n, "unknown");
    }
}

void connlist_add(struct connlist *l, struct connlist_ent *e, int fd, uint32_t now)
{
    struct sockaddr_storage ss;
    socklen_t len = sizeof ss;
    memset(&ss, 0, sizeof ss);
    if (getpeername(fd, (struct sockaddr *)&ss, &len) < 0) ss.ss_family = AF_UNSPEC;
    connlist_addr_str(&ss, e->addr, sizeof e->addr);
    e->fd = fd;
    e->last_cmd = now;
    e->state = CONNLIST_READ;
    pthread_mutex_lock(&l->lock);
    e->prev = NULL;
    e->next = l->head;
    if (l->head) l->head->prev = e;
    l->head = e;
    pthread_mutex_unlock(&l->lock);
}

void connlist_remove(struct connlist *l, struct connlist_ent *e)
{
    pthread_mutex_lock(&l->lock);
    if (e->prev) e->prev->next = e->next;
    else if (l->head == e) l->head = e->next;
    if (e->next) e->next->prev = e->prev;
    e->next = e->prev = NULL;
    pthread_mutex_unlock(&l->lock);
}

struct connlist_row {
    int fd;
    uint8_t state;
    uint32_t secs;
    const char *addr;
};

static int row_cmp(const void *a, const void *b)
{
    const struct connlist_row *x = a, *y = b;
    return (x->fd > y->fd) - (x->fd < y->fd);
}

static const char *const state_names[] = {
    [CONNLIST_READ] = "conn_read",       [CONNLIST_PARSE] = "conn_parse_cmd",
    [CONNLIST_NREAD] = "conn_nread",     [CONNLIST_SWALLOW] = "conn_swallow",
    [CONNLIST_WRITE] = "conn_mwrite",    [CONNLIST_CLOSING] = "conn_closing",
    [CONNLIST_IO_QUEUE] = "conn_io_queue",
};

int connlist_write(struct connlist *l, struct buf *b, int listen_fd, uint32_t listen_secs,
                   const struct connlist_ent *self, uint32_t now)
{
    char laddr[80] = "unknown";
    struct sockaddr_storage ss;
    socklen_t len = sizeof ss;
    memset(&ss, 0, sizeof ss);
    if (getsockname(listen_fd, (struct sockaddr *)&ss, &len) == 0)
        connlist_addr_str(&ss, laddr, sizeof laddr);
    int rc = 0;
    pthread_mutex_lock(&l->lock);
    size_t n = 0;
    for (const struct connlist_ent *e = l->head; e; e = e->next) n++;
    struct connlist_row *rows = calloc(n + 1, sizeof *rows);
    if (rows == NULL) {
        pthread_mutex_unlock(&l->lock);
        return -1;
    }
    rows[0] = (struct connlist_row){.fd = listen_fd, .secs = listen_secs};
    size_t k = 1;
    for (const struct connlist_ent *e = l->head; e; e = e->next, k++) {
        uint32_t last = __atomic_load_n(&e->last_cmd, __ATOMIC_RELAXED);
        uint8_t st = __atomic_load_n(&e->state, __ATOMIC_RELAXED);
        rows[k] = (struct connlist_row){.fd = e->fd, .addr = e->addr,
                                        .state = e == self ? CONNLIST_PARSE : st,
                                        .secs = now > last ? now - last : 0};
    }
    qsort(rows, k, sizeof *rows, row_cmp);
    for (size_t i = 0; i < k && rc == 0; i++) {
        const struct connlist_row *r = &rows[i];
        if (r->addr == NULL) /* the listener */
            rc = buf_printf(b, "STAT %d:addr %s\r\nSTAT %d:state conn_listening\r\n"
                               "STAT %d:secs_since_last_cmd %u\r\n",
                            r->fd, laddr, r->fd, r->fd, r->secs);
        else
            rc = buf_printf(b, "STAT %d:addr %s\r\nSTAT %d:listen_addr %s\r\n"
                               "STAT %d:state %s\r\nSTAT %d:secs_since_last_cmd %u\r\n",
                            r->fd, r->addr, r->fd, laddr, r->fd,
                            r->state < sizeof state_names / sizeof state_names[0]
                                ? state_names[r->state] : "conn_read",
                            r->fd, r->secs);
    }
    pthread_mutex_unlock(&l->lock);
    free(rows);
    return rc < 0 ? -1 : 0;
}
