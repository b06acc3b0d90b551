/* The ucx engine of the transfer channel between two processes (docs/p2p.md,
 * "Transfer channel", "ucx"), over UCX's tcp and its shared-memory
 * transports in turn (UCX_TLS): byte-exact reads, ranges outside the
 * arena failing alone, and a server that dies costing no more than the
 * read's timeout. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>

#include "p2p/p2p_ucx.h"
#include "p2p_test_util.h"

static uint8_t *g_arena;

/* In the child: the ucx server over the arena (arg: its token or NULL),
 * its bootstrap port. */
static int start_ucx(void *arg)
{
    lmc_p2p_chan_server_opts o = {.listen_url = "127.0.0.1:0", .arena = g_arena,
                                  .arena_size = ARENA_SIZE, .auth_token = arg};
    char err[256];
    lmc_p2p_ucx_server *s = lmc_p2p_ucx_server_start(&o, err, sizeof err);
    if (!s)
        fprintf(stderr, "%s\n", err);
    return s ? lmc_p2p_ucx_server_port(s) : -1;
}

static void reads_over(const char *tls)
{
    setenv("UCX_TLS", tls, 1);
    int port;
    pid_t pid = spawn_port_child(start_ucx, NULL, &port);
    assert_true(pid > 0 && port > 0);
    char url[64], err[256];
    snprintf(url, sizeof url, "127.0.0.1:%d", port);
    lmc_p2p_chan_client_opts co = {.url = url};
    lmc_p2p_ucx_client *c = lmc_p2p_ucx_client_open(&co, err, sizeof err);
    assert_non_null(c);
    enum { N = 40 };
    lmc_p2p_chan_item it[N];
    bool ok[N];
    uint64_t seed = 11;
    for (int i = 0; i < N; i++) {
        seed = mix64(seed);
        uint64_t len = 1 + seed % (2u << 20);
        it[i] = (lmc_p2p_chan_item){mix64(seed) % (ARENA_SIZE - len + 1), len, malloc(len)};
    }
    it[N - 1].len = 1;
    it[N - 1].remote_off = ARENA_SIZE - 1;
    assert_int_equal(lmc_p2p_ucx_client_read(c, it, N, 20000, ok), N);
    for (int i = 0; i < N; i++)
        assert_memory_equal(it[i].dst, g_arena + it[i].remote_off, it[i].len);
    /* Outside the arena: those fail, the rest arrive. */
    lmc_p2p_chan_item keep[2] = {it[0], it[1]};
    it[0].remote_off = ARENA_SIZE - 10;
    it[0].len = 11;
    it[1].remote_off = UINT64_MAX - 4;
    it[1].len = 16;
    assert_int_equal(lmc_p2p_ucx_client_read(c, it, N, 20000, ok), N - 2);
    assert_false(ok[0] || ok[1]);
    it[0] = keep[0];
    it[1] = keep[1];
    /* The server gone: reads fail, and within their timeout. */
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    double t0 = now_s();
    size_t got = lmc_p2p_ucx_client_read(c, it, N, 3000, ok);
    size_t got2 = lmc_p2p_ucx_client_read(c, it, N, 3000, ok);
    double took = now_s() - t0;
    /* A one-sided read may still find the dead peer's memory (shared
     * memory outlives the process until unmapped), never wrong bytes. */
    for (int i = 0; i < N; i++)
        if (ok[i])
            assert_memory_equal(it[i].dst, g_arena + it[i].remote_off, it[i].len);
    assert_int_equal(got2, 0);
    (void)got;
    assert_true(took < 3.0 + 3.0 + 1.0);   /* each read within its timeout and the 0.2 s close */
    for (int i = 0; i < N; i++)
        free(it[i].dst);
    lmc_p2p_ucx_client_close(c);
}

/* With a token the bootstrap (and so the remote key) goes only to a client
 * that proves it (docs/p2p.md, "Trust model"). */
static void a_token_guards_the_bootstrap(void **state)
{
    (void)state;
    setenv("UCX_TLS", "tcp", 1);
    static char token[] = "fleet-secret";
    int port;
    pid_t pid = spawn_port_child(start_ucx, token, &port);
    assert_true(pid > 0 && port > 0);
    char url[64], err[256];
    snprintf(url, sizeof url, "127.0.0.1:%d", port);
    const char *tokens[] = {NULL, "wrong", "fleet-secret"};
    uint8_t buf[4096];
    for (size_t t = 0; t < 3; t++) {
        lmc_p2p_chan_client_opts co = {.url = url, .auth_token = tokens[t]};
        lmc_p2p_ucx_client *c = lmc_p2p_ucx_client_open(&co, err, sizeof err);
        assert_non_null(c);
        lmc_p2p_chan_item it = {777, sizeof buf, buf};
        bool ok = false;
        double t0 = now_s();
        assert_int_equal(lmc_p2p_ucx_client_read(c, &it, 1, 5000, &ok), t == 2);
        /* Without a token the server waits for a hello that never comes:
         * the client's read ends at its own deadline. */
        assert_true(now_s() - t0 < 5.5);
        if (t == 2)
            assert_memory_equal(buf, g_arena + 777, sizeof buf);
        lmc_p2p_ucx_client_close(c);
    }
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
}

static void over_ucx_tcp(void **state)
{
    (void)state;
    reads_over("tcp");
}

static void over_ucx_shm(void **state)
{
    (void)state;
    reads_over("shm,self");
}

int main(void)
{
#ifdef __SANITIZE_THREAD__
    /* UCX patches libc's madvise to watch memory events, and TSan's runtime
     * crashes in the patched one at every thread start; the engine, which
     * registers its arena once, works without (docs/p2p.md, "UCX
     * environment").  Set before any thread or UCX exists. */
    setenv("UCX_MEM_MMAP_HOOK_MODE", "none", 1);
#endif
    g_arena = make_arena();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(over_ucx_tcp),
        cmocka_unit_test(a_token_guards_the_bootstrap),
        cmocka_unit_test(over_ucx_shm),
    };
    int r = cmocka_run_group_tests(tests, NULL, NULL);
    free(g_arena);
    return r;
}
