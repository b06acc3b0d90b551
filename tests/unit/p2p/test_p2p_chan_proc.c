/* The tcp transfer channel between two processes (docs/p2p.md, "Transfer
 * channel"): a server in a forked child, byte-exact reads from the parent,
 * and a peer that dies or stalls in the middle of a reply, which must cost
 * the reader no more than its timeout. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <pthread.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <cmocka.h>

#include "p2p/p2p_chan.h"
#include "p2p/p2p_wire.h"
#include "p2p_test_util.h"

static uint8_t *g_arena;

/* In the child: the tcp server over the arena, its port. */
static int start_tcp(void *arg)
{
    (void)arg;
    lmc_p2p_chan_server_opts o = {.listen_url = "127.0.0.1:0", .arena = g_arena,
                                  .arena_size = ARENA_SIZE};
    char err[256];
    lmc_p2p_chan_server *s = lmc_p2p_chan_server_start(&o, err, sizeof err);
    return s ? lmc_p2p_chan_server_port(s) : -1;
}

static pid_t spawn_server(int *port)
{
    pid_t pid = spawn_port_child(start_tcp, NULL, port);
    assert_true(pid > 0 && *port > 0);
    return pid;
}

static void reap(pid_t pid)
{
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
}

static lmc_p2p_chan_client *client_for(int port)
{
    char url[64], err[128];
    snprintf(url, sizeof url, "127.0.0.1:%d", port);
    lmc_p2p_chan_client_opts co = {.url = url, .connect_timeout_ms = 1000};
    return lmc_p2p_chan_client_open(&co, err, sizeof err);
}

static void reads_across_processes_are_byte_exact(void **state)
{
    (void)state;
    int port;
    pid_t pid = spawn_server(&port);
    lmc_p2p_chan_client *c = client_for(port);
    enum { N = 48 };
    lmc_p2p_chan_item it[N];
    bool ok[N];
    uint64_t seed = 7;
    for (int i = 0; i < N; i++) {
        seed = mix64(seed);
        uint64_t len = 1 + seed % (2u << 20);
        it[i] = (lmc_p2p_chan_item){mix64(seed) % (ARENA_SIZE - len + 1), len, malloc(len)};
    }
    assert_int_equal(lmc_p2p_chan_client_read(c, it, N, 10000, ok), N);
    for (int i = 0; i < N; i++)
        assert_memory_equal(it[i].dst, g_arena + it[i].remote_off, it[i].len);
    /* A read that runs out of time mid-reply leaves nothing behind for the
     * next one on the same client. */
    lmc_p2p_chan_item big = {0, ARENA_SIZE, malloc(ARENA_SIZE)};
    bool big_ok;
    assert_int_equal(lmc_p2p_chan_client_read(c, &big, 1, 1, &big_ok), 0);
    free(big.dst);
    assert_int_equal(lmc_p2p_chan_client_read(c, it, 4, 10000, ok), 4);
    for (int i = 0; i < 4; i++)
        assert_memory_equal(it[i].dst, g_arena + it[i].remote_off, it[i].len);
    /* The server gone: a read fails, promptly, and so does the reconnect. */
    reap(pid);
    double t0 = now_s();
    assert_int_equal(lmc_p2p_chan_client_read(c, it, N, 10000, ok), 0);
    assert_int_equal(lmc_p2p_chan_client_read(c, it, N, 10000, ok), 0);
    assert_true(now_s() - t0 < 2.0);
    for (int i = 0; i < N; i++)
        free(it[i].dst);
    lmc_p2p_chan_client_close(c);
}

/* A child that accepts one reader, answers its two-item request with both
 * served, sends the first item and half the second, then hangs. */
static pid_t spawn_half_server(int *port)
{
    int lfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t al = sizeof a;
    assert_int_equal(bind(lfd, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(listen(lfd, 1), 0);
    getsockname(lfd, (struct sockaddr *)&a, &al);
    *port = ntohs(a.sin_port);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        int fd = accept(lfd, NULL, NULL);
        uint8_t buf[64];
        if (recv(fd, buf, 8, MSG_WAITALL) != 8 || send(fd, LMC_P2P_MAGIC, 8, 0) != 8 ||
            recv(fd, buf, 12 + 32, MSG_WAITALL) != 44)
            _exit(1);
        uint8_t hdr[17];
        lmc_p2p_wire_put_resp_header(hdr, 0, 2);
        hdr[16] = 0x3;
        if (send(fd, hdr, sizeof hdr, 0) != sizeof hdr ||
            send(fd, g_arena, 4096 + 2048, 0) != 4096 + 2048)
            _exit(1);
        for (;;)
            pause();
    }
    close(lfd);
    return pid;
}

static void *kill_later(void *arg)
{
    sleep_ms(300);
    kill(*(pid_t *)arg, SIGKILL);
    return NULL;
}

/* Reads two 4 KiB items from the half server with `timeout_ms`, killing it
 * 300 ms in when `kill_it`; the first item must arrive, the second fail.
 * Returns how long the read took. */
static double half_read(int timeout_ms, bool kill_it)
{
    int port;
    pid_t pid = spawn_half_server(&port);
    lmc_p2p_chan_client *c = client_for(port);
    uint8_t *a = malloc(4096), *b = malloc(4096);
    lmc_p2p_chan_item it[2] = {{0, 4096, a}, {4096, 4096, b}};
    bool ok[2];
    pthread_t th;
    if (kill_it)
        pthread_create(&th, NULL, kill_later, &pid);
    double t0 = now_s();
    assert_int_equal(lmc_p2p_chan_client_read(c, it, 2, timeout_ms, ok), 1);
    double took = now_s() - t0;
    if (kill_it)
        pthread_join(th, NULL);
    reap(pid);
    assert_true(ok[0] && !ok[1]);
    assert_memory_equal(a, g_arena, 4096);
    free(a);
    free(b);
    lmc_p2p_chan_client_close(c);
    return took;
}

static void server_killed_mid_reply(void **state)
{
    (void)state;
    assert_true(half_read(20000, true) < 5.0);   /* the death is seen, not waited out */
}

static void server_stalled_mid_reply(void **state)
{
    (void)state;
    double took = half_read(500, false);
    assert_true(took >= 0.45 && took < 2.0);
}

int main(void)
{
    g_arena = make_arena();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(reads_across_processes_are_byte_exact),
        cmocka_unit_test(server_killed_mid_reply),
        cmocka_unit_test(server_stalled_mid_reply),
    };
    int r = cmocka_run_group_tests(tests, NULL, NULL);
    free(g_arena);
    return r;
}
