#include "storage/l2/adapters/l2_resp_conn.h"

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "core/grow.h"

#define MAX_IOV 64

void lmc_resp_conn_init(resp_conn *c)
{
    c->fd = -1;
    c->pos = c->len = 0;
}

static void set_timeouts(int fd, int timeout_ms)
{
    struct timeval tv = {.tv_sec = timeout_ms / 1000, .tv_usec = (timeout_ms % 1000) * 1000};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

int lmc_resp_conn_open_why(resp_conn *c, const char *host, int port, int timeout_ms, char *why,
                           size_t cap)
{
    char service[16];
    snprintf(service, sizeof service, "%d", port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res, *ai;
    int gai = getaddrinfo(host, service, &hints, &res);
    if (gai != 0) {
        if (why)
            snprintf(why, cap, "%s:%d: %s", host, port, gai_strerror(gai));
        return -1;
    }
    int fd = -1, last = 0;
    for (ai = res; ai && fd < 0; ai = ai->ai_next) {
        fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
        if (fd < 0) {
            last = errno;
            continue;
        }
        set_timeouts(fd, timeout_ms); /* SO_SNDTIMEO also bounds connect() */
        if (connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
            last = errno == EINPROGRESS || errno == EAGAIN ? ETIMEDOUT : errno;
            close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(res);
    if (fd < 0) {
        if (why)
            snprintf(why, cap, "%s:%d: connect: %s", host, port, strerror(last));
        return -1;
    }
    c->fd = fd;
    c->pos = c->len = 0;
    return 0;
}

int lmc_resp_conn_open(resp_conn *c, const char *host, int port, int timeout_ms)
{
    return lmc_resp_conn_open_why(c, host, port, timeout_ms, NULL, 0);
}

void lmc_resp_conn_close(resp_conn *c)
{
    if (c->fd >= 0)
        close(c->fd);
    lmc_resp_conn_init(c);
}

static int fail(resp_conn *c)
{
    lmc_resp_conn_close(c);
    return -1;
}

/* writev until everything is sent, advancing over partial writes. */
static int send_all(resp_conn *c, struct iovec *iov, int n)
{
    while (n > 0) {
        ssize_t w = writev(c->fd, iov, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return fail(c);
        size_t left = (size_t)w;
        while (n > 0 && left >= iov->iov_len) {
            left -= iov->iov_len;
            iov++;
            n--;
        }
        if (n > 0) {
            iov->iov_base = (char *)iov->iov_base + left;
            iov->iov_len -= left;
        }
    }
    return 0;
}

int lmc_resp_send_command(resp_conn *c, const resp_arg *args, size_t n)
{
    if (c->fd < 0 || n == 0 || n > MAX_IOV / 3)
        return -1;
    /* Per argument: "$<len>\r\n" (scratch), the bytes themselves, "\r\n". */
    char scratch[MAX_IOV / 3 + 1][24];
    struct iovec iov[MAX_IOV + 1];
    int k = 0;
    int hl = snprintf(scratch[0], sizeof scratch[0], "*%zu\r\n", n);
    iov[k++] = (struct iovec){scratch[0], (size_t)hl};
    for (size_t i = 0; i < n; i++) {
        int l = snprintf(scratch[i + 1], sizeof scratch[i + 1], "$%zu\r\n", args[i].len);
        iov[k++] = (struct iovec){scratch[i + 1], (size_t)l};
        if (args[i].len)
            iov[k++] = (struct iovec){(void *)args[i].data, args[i].len};
        iov[k++] = (struct iovec){(void *)"\r\n", 2};
    }
    return send_all(c, iov, k);
}

static int append(char **out, size_t *len, size_t *cap, const void *data, size_t n)
{
    if (lmc_grow_array(out, cap, *len + n, 1, 4096) != 0)
        return -1;
    memcpy(*out + *len, data, n);
    *len += n;
    return 0;
}

int lmc_resp_append_command(char **out, size_t *len, size_t *cap, const resp_arg *args, size_t n)
{
    char head[24];
    int hl = snprintf(head, sizeof head, "*%zu\r\n", n);
    if (append(out, len, cap, head, (size_t)hl) != 0)
        return -1;
    for (size_t i = 0; i < n; i++) {
        hl = snprintf(head, sizeof head, "$%zu\r\n", args[i].len);
        if (append(out, len, cap, head, (size_t)hl) != 0 ||
            append(out, len, cap, args[i].data, args[i].len) != 0 ||
            append(out, len, cap, "\r\n", 2) != 0)
            return -1;
    }
    return 0;
}

int lmc_resp_send_raw(resp_conn *c, const void *data, size_t len)
{
    if (c->fd < 0)
        return -1;
    struct iovec iov = {(void *)data, len};
    return send_all(c, &iov, 1);
}

static int fill(resp_conn *c)
{
    if (c->pos == c->len)
        c->pos = c->len = 0;
    for (;;) {
        ssize_t r = recv(c->fd, c->buf + c->len, sizeof c->buf - c->len, 0);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return fail(c); /* closed, error or timeout */
        c->len += (size_t)r;
        return 0;
    }
}

int lmc_resp_read_line(resp_conn *c, char *line, size_t cap)
{
    size_t n = 0;
    for (;;) {
        if (c->fd < 0)
            return -1;
        while (c->pos < c->len) {
            char ch = c->buf[c->pos++];
            if (ch == '\n' && n > 0 && line[n - 1] == '\r') {
                line[n - 1] = '\0';
                return 0;
            }
            if (n + 1 >= cap)
                return fail(c); /* no reply of ours has such a line */
            line[n++] = ch;
        }
        if (fill(c) != 0)
            return -1;
    }
}

int lmc_resp_read_exact(resp_conn *c, void *dst, size_t n)
{
    char *out = dst;
    size_t buffered = c->len - c->pos;
    size_t take = buffered < n ? buffered : n;
    if (out && take)
        memcpy(out, c->buf + c->pos, take);
    c->pos += take;
    n -= take;
    if (out)
        out += take;
    while (n > 0) {
        if (c->fd < 0)
            return -1;
        if (!out) { /* discarding: go through the buffer */
            if (fill(c) != 0)
                return -1;
            size_t t = c->len - c->pos < n ? c->len - c->pos : n;
            c->pos += t;
            n -= t;
            continue;
        }
        ssize_t r = recv(c->fd, out, n, MSG_WAITALL); /* straight into the L1 buffer */
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return fail(c);
        out += r;
        n -= (size_t)r;
    }
    return 0;
}

int lmc_resp_read_bulk_body(resp_conn *c, void *dst, size_t len)
{
    char crlf[2];
    if (lmc_resp_read_exact(c, dst, len) != 0 || lmc_resp_read_exact(c, crlf, 2) != 0)
        return -1;
    return crlf[0] == '\r' && crlf[1] == '\n' ? 0 : fail(c);
}

bool lmc_resp_parse_int(const char *line, int64_t *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(line + 1, &end, 10);
    if (errno || end == line + 1 || *end)
        return false;
    *out = v;
    return true;
}
