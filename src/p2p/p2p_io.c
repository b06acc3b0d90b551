/* Bounded socket I/O for the transfer channel (p2p_io.h): a peer that dies
 * or stalls costs the caller its timeout, never a hang (docs/p2p.md). */
#include "p2p/p2p_io.h"

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

int64_t lmc_p2p_io_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* How long the next poll may wait: the nearer of the deadline and the
 * stall bound; 0 when the deadline has passed. */
static int wait_ms(int64_t deadline, int stall_ms)
{
    int w = stall_ms;
    if (deadline >= 0) {
        int64_t left = deadline - lmc_p2p_io_now_ms();
        if (left <= 0)
            return 0;
        if (w < 0 || left < w)
            w = left > 1000000000 ? 1000000000 : (int)left;
    }
    return w;
}

int lmc_p2p_io_full(int fd, void *buf, size_t len, bool sending, int stop_fd, int64_t deadline,
                    int stall_ms)
{
    char *p = buf;
    while (len > 0) {
        ssize_t r = sending ? send(fd, p, len, MSG_NOSIGNAL | MSG_DONTWAIT)
                            : recv(fd, p, len, MSG_DONTWAIT);
        if (r > 0) {
            p += r;
            len -= (size_t)r;
            /* The deadline holds while bytes flow too. */
            if (len > 0 && deadline >= 0 && lmc_p2p_io_now_ms() > deadline)
                return -1;
            continue;
        }
        if (r == 0 && !sending)
            return -1;   /* the peer closed */
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK)
            return -1;
        int w = wait_ms(deadline, stall_ms);
        if (w == 0)
            return -1;
        struct pollfd pf[2] = {{.fd = fd, .events = sending ? POLLOUT : POLLIN},
                               {.fd = stop_fd, .events = POLLIN}};
        int pr = poll(pf, stop_fd >= 0 ? 2 : 1, w);
        if (pr < 0 && errno == EINTR)
            continue;
        if (pr <= 0 || (stop_fd >= 0 && pf[1].revents))
            return -1;   /* stalled past the bound, or told to stop */
    }
    return 0;
}

/* A non-blocking connect to the first address that answers by the deadline. */
int lmc_p2p_io_dial(const char *host, const char *port, int64_t deadline)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res;
    if (getaddrinfo(host, port, &hints, &res) != 0)
        return -1;
    int fd = -1;
    for (struct addrinfo *a = res; a && fd < 0; a = a->ai_next) {
        fd = socket(a->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (fd < 0)
            continue;
        int r = connect(fd, a->ai_addr, a->ai_addrlen);
        if (r < 0 && errno == EINPROGRESS) {
            int64_t left = deadline - lmc_p2p_io_now_ms();
            struct pollfd pf = {.fd = fd, .events = POLLOUT};
            int e = 0;
            socklen_t el = sizeof e;
            r = left > 0 && poll(&pf, 1, (int)(left > 1 << 30 ? 1 << 30 : left)) == 1 &&
                        getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &el) == 0 && e == 0
                    ? 0
                    : -1;
        }
        if (r < 0) {
            close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(res);
    if (fd >= 0) {
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    }
    return fd;
}

int lmc_p2p_io_listen(const char *url, int *port_out, char *err, size_t errlen)
{
    char host[256], port[8];
    if (!lmc_p2p_io_split_url(url, host, sizeof host, port, sizeof port)) {
        snprintf(err, errlen, "p2p channel: listen URL '%s' is not host:port", url ? url : "");
        return -1;
    }
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE}, *res;
    int gr = getaddrinfo(host[0] ? host : NULL, port, &hints, &res);
    if (gr != 0) {
        snprintf(err, errlen, "p2p channel: listen URL '%s': %s", url, gai_strerror(gr));
        return -1;
    }
    int fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0), one = 1;
    if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) ||
        bind(fd, res->ai_addr, res->ai_addrlen) || listen(fd, 64)) {
        snprintf(err, errlen, "p2p channel: cannot listen on '%s': %s", url, strerror(errno));
        if (fd >= 0)
            close(fd);
        freeaddrinfo(res);
        return -1;
    }
    freeaddrinfo(res);
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    getsockname(fd, (struct sockaddr *)&ss, &sl);
    *port_out = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                               : ((struct sockaddr_in *)&ss)->sin_port);
    return fd;
}

bool lmc_p2p_io_split_url(const char *url, char *host, size_t hostlen, char *port, size_t portlen)
{
    if (!url)
        return false;
    if (strncmp(url, "tcp://", 6) == 0)
        url += 6;
    const char *colon = strrchr(url, ':');
    if (!colon || colon == url || colon[1] == '\0')
        return false;
    const char *h = url;
    size_t hl = (size_t)(colon - url);
    if (h[0] == '[') {
        if (hl < 3 || h[hl - 1] != ']')
            return false;
        h++;
        hl -= 2;
    }
    char *end;
    errno = 0;
    unsigned long pn = strtoul(colon + 1, &end, 10);
    if (*end != '\0' || errno || pn > 65535 || colon[1] < '0' || colon[1] > '9')
        return false;
    if (hl + 1 > hostlen || (size_t)snprintf(port, portlen, "%lu", pn) >= portlen)
        return false;
    memcpy(host, h, hl);
    host[hl] = '\0';
    return true;
}
