/* Bounded socket I/O for the transfer channel (p2p_io.h): a peer that dies
 * or stalls costs the caller its timeout, never a hang (docs/p2p.md). */
#include "p2p/p2p_io.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

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
