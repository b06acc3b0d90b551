/* The P2P transfer channel against a plain TCP copy of the same bytes
 * (docs/p2p.md, "Transfer channel"; BENCHMARKS.md, "P2P transfer channel").
 *
 *   p2p_chan_bench [--chunks N] [--rounds R] [--ucx-tcp-tls T] [--ucx-shm-tls S]
 *   (defaults 256, 10, "tcp", "shm,self": the UCX_TLS of the two ucx runs)
 *
 * A child process serves an arena of N chunks of 2 MiB over the tcp channel
 * on loopback; the parent reads all N chunks, one request of N items, into
 * its own buffer.  The baseline, in the same run: another child sends the
 * same N x 2 MiB over a plain TCP socket (send of each chunk, no framing),
 * and the parent recv()s them into the same buffer.  Every round runs both,
 * which goes first alternating; the first round of each (a new connection,
 * its buffers growing) is printed apart from the median of the rest.  Every channel round's
 * bytes are checked against the arena.  The machine's memcpy of the same
 * bytes is printed beside them.  Then the ucx engine, the same reads from a
 * child serving with UCX_TLS=tcp (beside the plain socket's median) and
 * with UCX_TLS=shm,self (beside memcpy's), each in rounds of its own after
 * the others.  GiB/s are 2^30 bytes per second. */
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <arpa/inet.h>
#include <time.h>
#include <unistd.h>

#include "p2p/p2p_chan.h"
#include "p2p/p2p_ucx.h"

#define CHUNK ((size_t)2 << 20)
#define MAX_ROUNDS 64

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

typedef struct {
    const uint8_t *arena;
    size_t size;
} served;

/* A child that runs start(arg), a server whose port it returns (-1:
 * failed), sends the port back and waits to be killed. */
static pid_t child_server(int (*start)(const served *), const served *arg, int *port)
{
    int p[2];
    if (pipe(p))
        exit(1);
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        int pt = start(arg);
        if (write(p[1], &pt, sizeof pt) != sizeof pt)
            _exit(1);
        for (;;)
            pause();
    }
    close(p[1]);
    if (read(p[0], port, sizeof *port) != sizeof *port || *port <= 0)
        exit(1);
    close(p[0]);
    return pid;
}

static int start_tcp(const served *a)
{
    lmc_p2p_chan_server_opts o = {.listen_url = "127.0.0.1:0", .arena = a->arena,
                                  .arena_size = a->size};
    char err[256];
    lmc_p2p_chan_server *s = lmc_p2p_chan_server_start(&o, err, sizeof err);
    if (!s)
        fprintf(stderr, "%s\n", err);
    return s ? lmc_p2p_chan_server_port(s) : -1;
}

static int start_ucx(const served *a)
{
    lmc_p2p_chan_server_opts o = {.listen_url = "127.0.0.1:0", .arena = a->arena,
                                  .arena_size = a->size};
    char err[256];
    lmc_p2p_ucx_server *s = lmc_p2p_ucx_server_start(&o, err, sizeof err);
    if (!s)
        fprintf(stderr, "%s\n", err);
    return s ? lmc_p2p_ucx_server_port(s) : -1;
}

/* The baseline's sender: for every byte it reads, sends the whole arena,
 * chunk by chunk. */
static pid_t child_plain_sender(const uint8_t *arena, size_t size, int *port)
{
    int lfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t al = sizeof a;
    if (bind(lfd, (struct sockaddr *)&a, sizeof a) || listen(lfd, 1) ||
        getsockname(lfd, (struct sockaddr *)&a, &al))
        exit(1);
    *port = ntohs(a.sin_port);
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        int fd = accept(lfd, NULL, NULL), one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        char b;
        while (recv(fd, &b, 1, 0) == 1)
            for (size_t off = 0; off < size; off += CHUNK)
                for (size_t done = 0; done < CHUNK;) {
                    ssize_t r = send(fd, arena + off + done, CHUNK - done, MSG_NOSIGNAL);
                    if (r <= 0)
                        _exit(0);
                    done += (size_t)r;
                }
        _exit(0);
    }
    close(lfd);
    return pid;
}

static int plain_connect(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&a, sizeof a))
        exit(1);
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return fd;
}

static double plain_round(int fd, uint8_t *dst, size_t size)
{
    double t0 = now_s();
    if (send(fd, "x", 1, 0) != 1)
        exit(1);
    for (size_t done = 0; done < size;) {
        ssize_t r = recv(fd, dst + done, size - done, 0);
        if (r <= 0)
            exit(1);
        done += (size_t)r;
    }
    return now_s() - t0;
}

static double channel_round(lmc_p2p_chan_client *c, lmc_p2p_chan_item *it, size_t n, bool *ok,
                            const uint8_t *arena, uint8_t *dst)
{
    memset(dst, 0, n * CHUNK);
    double t0 = now_s();
    size_t got = lmc_p2p_chan_client_read(c, it, n, 60000, ok);
    double t = now_s() - t0;
    if (got != n || memcmp(dst, arena, n * CHUNK) != 0) {
        fprintf(stderr, "p2p_chan_bench: %zu of %zu chunks read, or bytes differ\n", got, n);
        exit(1);
    }
    return t;
}

/* The ucx engine: a child serving the arena with UCX_TLS=tls, the parent
 * reading it all `rounds` times; the round times in t[]. */
static void ucx_rounds(const char *tls, const uint8_t *arena, size_t size, lmc_p2p_chan_item *it,
                       size_t n, bool *ok, uint8_t *dst, int rounds, double *t)
{
    setenv("UCX_TLS", tls, 1);
    int port;
    pid_t pid = child_server(start_ucx, &(served){arena, size}, &port);
    char url[64], err[256];
    snprintf(url, sizeof url, "127.0.0.1:%d", port);
    lmc_p2p_chan_client_opts co = {.url = url, .max_request_bytes = size};
    lmc_p2p_ucx_client *c = lmc_p2p_ucx_client_open(&co, err, sizeof err);
    if (!c) {
        fprintf(stderr, "%s\n", err);
        exit(1);
    }
    for (int r = 0; r < rounds; r++) {
        memset(dst, 0, size);
        double t0 = now_s();
        size_t got = lmc_p2p_ucx_client_read(c, it, n, 60000, ok);
        t[r] = now_s() - t0;
        if (got != n || memcmp(dst, arena, size) != 0) {
            fprintf(stderr, "p2p_chan_bench: ucx (%s): %zu of %zu chunks, or bytes differ\n", tls,
                    got, n);
            exit(1);
        }
    }
    lmc_p2p_ucx_client_close(c);
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
}

static double memcpy_round(uint8_t *dst, const uint8_t *src, size_t size)
{
    double t0 = now_s();
    memcpy(dst, src, size);
    __asm__ volatile("" ::"r"(dst) : "memory");
    return now_s() - t0;
}

int main(int argc, char **argv)
{
    size_t n = 256;
    int rounds = 10;
    const char *tcp_tls = "tcp", *shm_tls = "shm,self";
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--chunks"))
            n = strtoul(argv[i + 1], NULL, 10);
        else if (!strcmp(argv[i], "--rounds"))
            rounds = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--ucx-tcp-tls"))
            tcp_tls = argv[i + 1];
        else if (!strcmp(argv[i], "--ucx-shm-tls"))
            shm_tls = argv[i + 1];
    }
    if (n < 1 || n > 4096 || rounds < 2 || rounds > MAX_ROUNDS) {
        fprintf(stderr, "usage: p2p_chan_bench [--chunks 1..4096] [--rounds 2..%d]"
                " [--ucx-tcp-tls UCX_TLS] [--ucx-shm-tls UCX_TLS]\n", MAX_ROUNDS);
        return 2;
    }
    size_t size = n * CHUNK;
    uint8_t *arena = malloc(size), *dst = malloc(size);
    if (!arena || !dst)
        return 1;
    for (size_t i = 0; i < size; i++)
        arena[i] = (uint8_t)(i * 2654435761u >> 13);
    memset(dst, 1, size);
    int cport, pport;
    pid_t cpid = child_server(start_tcp, &(served){arena, size}, &cport);
    pid_t ppid = child_plain_sender(arena, size, &pport);
    char url[64], err[256];
    snprintf(url, sizeof url, "127.0.0.1:%d", cport);
    lmc_p2p_chan_client_opts co = {.url = url, .max_request_bytes = size};
    lmc_p2p_chan_client *c = lmc_p2p_chan_client_open(&co, err, sizeof err);
    lmc_p2p_chan_item *it = calloc(n, sizeof *it);
    bool *ok = calloc(n, sizeof *ok);
    if (!c || !it || !ok)
        return 1;
    for (size_t i = 0; i < n; i++)
        it[i] = (lmc_p2p_chan_item){i * CHUNK, CHUNK, dst + i * CHUNK};
    int pfd = plain_connect(pport);
    double tc[MAX_ROUNDS], tp[MAX_ROUNDS], tm[MAX_ROUNDS];
    for (int r = 0; r < rounds; r++) {   /* which goes first alternates */
        if (r % 2 == 0)
            tp[r] = plain_round(pfd, dst, size);
        tc[r] = channel_round(c, it, n, ok, arena, dst);
        if (r % 2 == 1)
            tp[r] = plain_round(pfd, dst, size);
        tm[r] = memcpy_round(dst, arena, size);
    }
    double gib = (double)size / (1 << 30);
    double fc = tc[0], fp = tp[0];
    double mc = median(tc + 1, rounds - 1), mp = median(tp + 1, rounds - 1);
    double mm = median(tm, rounds);
    printf("p2p_chan_bench: %zu chunks of 2 MiB (%.2f GiB) per round, %d rounds, loopback\n", n,
           gib, rounds);
    printf("  first round:  tcp channel %6.2f GiB/s   plain TCP %6.2f GiB/s   ratio %.2f\n",
           gib / fc, gib / fp, fp / fc);
    printf("  steady state: tcp channel %6.2f GiB/s   plain TCP %6.2f GiB/s   ratio %.2f"
           " (median of %d)\n", gib / mc, gib / mp, mp / mc, rounds - 1);
    printf("  memcpy of the same bytes: %6.2f GiB/s (median of %d)\n", gib / mm, rounds);
    double tu[MAX_ROUNDS];
    ucx_rounds(tcp_tls, arena, size, it, n, ok, dst, rounds, tu);
    double fu = tu[0], mu = median(tu + 1, rounds - 1);
    printf("  ucx over tcp: first %6.2f GiB/s, steady %6.2f GiB/s, ratio to plain TCP's"
           " steady state %.2f\n", gib / fu, gib / mu, mp / mu);
    ucx_rounds(shm_tls, arena, size, it, n, ok, dst, rounds, tu);
    fu = tu[0];
    mu = median(tu + 1, rounds - 1);
    printf("  ucx over shm: first %6.2f GiB/s, steady %6.2f GiB/s, ratio to memcpy %.2f\n",
           gib / fu, gib / mu, mm / mu);
    lmc_p2p_chan_client_close(c);
    close(pfd);
    kill(cpid, SIGKILL);
    kill(ppid, SIGKILL);
    waitpid(cpid, NULL, 0);
    waitpid(ppid, NULL, 0);
    free(it);
    free(ok);
    free(arena);
    free(dst);
    return 0;
}
