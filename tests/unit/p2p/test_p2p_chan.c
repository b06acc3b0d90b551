/* The tcp transfer channel, server and client in one process (docs/p2p.md,
 * "Transfer channel"): byte-exact reads, per-item refusals, bounds, and
 * peers that send garbage or stall. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <pthread.h>
#include <sys/socket.h>
#include <unistd.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <cmocka.h>

#include "p2p/p2p_chan.h"
#include "p2p/p2p_wire.h"
#include "p2p_test_util.h"

static uint8_t *g_arena;

typedef struct {
    lmc_p2p_chan_server *srv;
    char url[64];
} fixture;

static bool deny_first_mib(void *user, const uint8_t *holder, size_t holder_len, uint64_t off,
                           uint64_t len)
{
    (void)len, (void)holder, (void)holder_len;
    *(int *)user += 1;
    return off >= (1u << 20);
}

static int start(fixture *f, lmc_p2p_may_read_fn may, void *user, unsigned max_conns)
{
    lmc_p2p_chan_server_opts o = {.listen_url = "127.0.0.1:0", .arena = g_arena,
                                  .arena_size = ARENA_SIZE, .may_read = may,
                                  .may_read_user = user, .max_conns = max_conns,
                                  .io_timeout_ms = 2000};
    char err[256];
    f->srv = lmc_p2p_chan_server_start(&o, err, sizeof err);
    if (!f->srv)
        return -1;
    snprintf(f->url, sizeof f->url, "127.0.0.1:%d", lmc_p2p_chan_server_port(f->srv));
    return 0;
}

static lmc_p2p_chan_client *connect_to(const char *url)
{
    char err[256];
    lmc_p2p_chan_client_opts co = {.url = url};
    return lmc_p2p_chan_client_open(&co, err, sizeof err);
}

/* With a token (docs/p2p.md, "Trust model"): a client that proves it reads;
 * one without it, with another token, or speaking upstream's plain
 * handshake reads nothing, and each such connection is counted. */
static void a_token_is_required_when_set(void **state)
{
    (void)state;
    lmc_p2p_chan_server_opts o = {.listen_url = "127.0.0.1:0", .arena = g_arena,
                                  .arena_size = ARENA_SIZE, .io_timeout_ms = 2000,
                                  .auth_token = "fleet-secret"};
    char err[256], url[64];
    lmc_p2p_chan_server *srv = lmc_p2p_chan_server_start(&o, err, sizeof err);
    assert_non_null(srv);
    snprintf(url, sizeof url, "127.0.0.1:%d", lmc_p2p_chan_server_port(srv));
    const char *tokens[] = {"fleet-secret", NULL, "", "fleet-secreT"};
    uint8_t buf[4096];
    for (size_t t = 0; t < sizeof tokens / sizeof *tokens; t++) {
        lmc_p2p_chan_client_opts co = {.url = url, .auth_token = tokens[t]};
        lmc_p2p_chan_client *c = lmc_p2p_chan_client_open(&co, err, sizeof err);
        assert_non_null(c);
        lmc_p2p_chan_item it = {12345, sizeof buf, buf};
        bool ok = false;
        size_t got = lmc_p2p_chan_client_read(c, &it, 1, 3000, &ok);
        assert_int_equal(got, t == 0);
        if (t == 0)
            assert_memory_equal(buf, g_arena + 12345, sizeof buf);
        lmc_p2p_chan_client_close(c);
    }
    lmc_p2p_chan_server_stats st;
    for (int i = 0; i < 200; i++) {   /* the server's threads count after the client gave up */
        lmc_p2p_chan_server_stats_get(srv, &st);
        if (st.auth_failures == 3)
            break;
        sleep_ms(10);
    }
    assert_int_equal(st.auth_failures, 3);
    assert_int_equal(st.items_served, 1);
    lmc_p2p_chan_server_stop(srv);
}

/* The holder a client names in the token handshake reaches the lease
 * check: a client reads only under the name it proved. */
static bool only_peer_x(void *user, const uint8_t *holder, size_t holder_len, uint64_t off,
                        uint64_t len)
{
    (void)user, (void)off, (void)len;
    assert_non_null(holder);   /* with a token, even an empty name is passed */
    return holder_len == 6 && memcmp(holder, "peer-x", 6) == 0;
}

static void the_named_holder_reaches_the_lease_check(void **state)
{
    (void)state;
    lmc_p2p_chan_server_opts o = {.listen_url = "127.0.0.1:0", .arena = g_arena,
                                  .arena_size = ARENA_SIZE, .io_timeout_ms = 2000,
                                  .auth_token = "fleet-secret", .may_read = only_peer_x};
    char err[256], url[64];
    lmc_p2p_chan_server *srv = lmc_p2p_chan_server_start(&o, err, sizeof err);
    assert_non_null(srv);
    snprintf(url, sizeof url, "127.0.0.1:%d", lmc_p2p_chan_server_port(srv));
    const char *names[] = {"peer-x", "peer-y", ""};
    uint8_t buf[512];
    for (size_t t = 0; t < 3; t++) {
        lmc_p2p_chan_client_opts co = {.url = url, .auth_token = "fleet-secret",
                                       .holder = (const uint8_t *)names[t],
                                       .holder_len = strlen(names[t])};
        lmc_p2p_chan_client *c = lmc_p2p_chan_client_open(&co, err, sizeof err);
        assert_non_null(c);
        lmc_p2p_chan_item it = {4096, sizeof buf, buf};
        bool ok = false;
        assert_int_equal(lmc_p2p_chan_client_read(c, &it, 1, 3000, &ok), t == 0);
        lmc_p2p_chan_client_close(c);
    }
    lmc_p2p_chan_server_stats st;
    lmc_p2p_chan_server_stats_get(srv, &st);
    assert_int_equal(st.auth_failures, 0);
    assert_int_equal(st.items_refused, 2);
    lmc_p2p_chan_server_stop(srv);
}

static void random_ranges_are_byte_exact(void **state)
{
    (void)state;
    fixture f;
    assert_int_equal(start(&f, NULL, NULL, 4), 0);
    lmc_p2p_chan_client *c = connect_to(f.url);
    assert_non_null(c);
    enum { N = 64 };
    lmc_p2p_chan_item it[N];
    bool ok[N];
    uint64_t seed = 42;
    for (int round = 0; round < 4; round++) {
        for (int i = 0; i < N; i++) {
            seed = mix64(seed);
            uint64_t len = 1 + seed % (1u << 20);
            it[i] = (lmc_p2p_chan_item){.remote_off = mix64(seed) % (ARENA_SIZE - len + 1),
                                        .len = len, .dst = malloc(len)};
        }
        if (round == 0)   /* the arena's last byte and its first */
            it[0] = (lmc_p2p_chan_item){ARENA_SIZE - 1, 1, it[0].dst};
        assert_int_equal(lmc_p2p_chan_client_read(c, it, N, 5000, ok), N);
        for (int i = 0; i < N; i++) {
            assert_true(ok[i]);
            assert_memory_equal(it[i].dst, g_arena + it[i].remote_off, it[i].len);
            free(it[i].dst);
        }
    }
    lmc_p2p_chan_server_stats st;
    lmc_p2p_chan_server_stats_get(f.srv, &st);
    assert_int_equal(st.items_served, 4 * N);
    assert_int_equal(st.conns_accepted, 1);
    lmc_p2p_chan_client_close(c);
    lmc_p2p_chan_server_stop(f.srv);
}

static void refused_ranges_fail_alone(void **state)
{
    (void)state;
    fixture f;
    int asked = 0;
    assert_int_equal(start(&f, deny_first_mib, &asked, 4), 0);
    lmc_p2p_chan_client *c = connect_to(f.url);
    uint8_t b[8][4096];
    lmc_p2p_chan_item it[8] = {
        {2u << 20, 4096, b[0]},                       /* fine */
        {ARENA_SIZE - 100, 4096, b[1]},               /* runs past the end */
        {ARENA_SIZE, 1, b[2]},                        /* starts at the end */
        {4096, 4096, b[3]},                           /* the lease says no */
        {UINT64_MAX - 10, 4096, b[4]},                /* offset too big for the wire */
        {(uint64_t)INT64_MAX - 100, 4096, b[5]},      /* off+len past i64 */
        {0, 0, b[6]},                                 /* empty */
        {3u << 20, 4096, b[7]},                       /* fine */
    };
    bool ok[8];
    assert_int_equal(lmc_p2p_chan_client_read(c, it, 8, 5000, ok), 2);
    bool want[8] = {true, false, false, false, false, false, false, true};
    for (int i = 0; i < 8; i++)
        assert_int_equal(ok[i], want[i]);
    assert_memory_equal(b[0], g_arena + (2u << 20), 4096);
    assert_memory_equal(b[7], g_arena + (3u << 20), 4096);
    assert_int_equal(asked, 3);   /* only in-arena ranges reach the lease check */
    lmc_p2p_chan_server_stats st;
    lmc_p2p_chan_server_stats_get(f.srv, &st);
    assert_int_equal(st.items_refused, 4);   /* the two local refusals never left */
    /* The connection survives refusals. */
    assert_int_equal(lmc_p2p_chan_client_read(c, it, 1, 5000, ok), 1);
    lmc_p2p_chan_client_close(c);
    lmc_p2p_chan_server_stop(f.srv);
}

static void client_request_bounds(void **state)
{
    (void)state;
    fixture f;
    assert_int_equal(start(&f, NULL, NULL, 4), 0);
    lmc_p2p_chan_client_opts co = {.url = f.url, .max_items = 2, .max_request_bytes = 10000};
    char err[128];
    lmc_p2p_chan_client *c = lmc_p2p_chan_client_open(&co, err, sizeof err);
    uint8_t b[4][8192];
    lmc_p2p_chan_item it[4] = {{0, 4096, b[0]}, {0, 8192, b[1]}, {0, 4096, b[2]}, {0, 16, b[3]}};
    bool ok[4];
    /* 4096 + 4096 fit 10000 bytes; the 8192 does not; the 16 is a third item. */
    assert_int_equal(lmc_p2p_chan_client_read(c, it, 4, 5000, ok), 2);
    assert_true(ok[0] && !ok[1] && ok[2] && !ok[3]);
    lmc_p2p_chan_client_close(c);
    lmc_p2p_chan_server_stop(f.srv);
}

static int raw_connect(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    struct timeval tv = {.tv_sec = 5};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    return fd;
}

/* Sends bytes and the end of its stream, then expects the server to close the connection having sent
 * at most `reply_max` bytes. */
static void expect_closed(int port, const void *bytes, size_t len, size_t reply_max)
{
    int fd = raw_connect(port);
    assert_int_equal(send(fd, bytes, len, MSG_NOSIGNAL), (ssize_t)len);
    shutdown(fd, SHUT_WR);
    uint8_t buf[256];
    size_t total = 0;
    ssize_t r;
    while ((r = recv(fd, buf, sizeof buf, 0)) > 0)
        total += (size_t)r;
    assert_int_equal(r, 0);   /* closed, not timed out */
    assert_true(total <= reply_max);
    close(fd);
}

/* Ranges only a hand-made request can carry: i64-negative offsets and
 * lengths whose end wraps 2^64.  Refused per item; the good one arrives. */
static void wrapping_ranges_on_the_wire_are_refused(void **state)
{
    (void)state;
    fixture f;
    assert_int_equal(start(&f, NULL, NULL, 4), 0);
    int fd = raw_connect(lmc_p2p_chan_server_port(f.srv));
    uint8_t msg[8 + 12 + 4 * 16];
    memcpy(msg, LMC_P2P_MAGIC, 8);
    lmc_p2p_wire_put_req_header(msg + 8, 5, 4);
    lmc_p2p_wire_put_req_item(msg + 20, UINT64_MAX - 10, 4096);
    lmc_p2p_wire_put_req_item(msg + 36, 16, UINT64_MAX - 8);
    lmc_p2p_wire_put_req_item(msg + 52, 1u << 20, (uint64_t)INT64_MAX);
    lmc_p2p_wire_put_req_item(msg + 68, 32, 16);
    assert_int_equal(send(fd, msg, sizeof msg, MSG_NOSIGNAL), (ssize_t)sizeof msg);
    uint8_t want[8 + 16 + 1 + 16], got[sizeof want + 1];
    memcpy(want, LMC_P2P_MAGIC, 8);
    lmc_p2p_wire_put_resp_header(want + 8, 5, 4);
    want[24] = 0x8;
    memcpy(want + 25, g_arena + 32, 16);
    assert_int_equal(recv(fd, got, sizeof want, MSG_WAITALL), (ssize_t)sizeof want);
    assert_memory_equal(got, want, sizeof want);
    shutdown(fd, SHUT_WR);
    assert_int_equal(recv(fd, got, 1, 0), 0);   /* nothing more, then the end */
    close(fd);
    lmc_p2p_chan_server_stop(f.srv);
}

static void server_drops_garbage_and_keeps_serving(void **state)
{
    (void)state;
    fixture f;
    assert_int_equal(start(&f, NULL, NULL, 4), 0);
    int port = lmc_p2p_chan_server_port(f.srv);
    expect_closed(port, "LMTCP002", 8, 0);                /* wrong magic */
    expect_closed(port, "LMT", 3, 0);                     /* short handshake, then EOF */
    uint8_t msg[8 + 12 + 16];
    memcpy(msg, LMC_P2P_MAGIC, 8);
    lmc_p2p_wire_put_req_header(msg + 8, 7, 70000);       /* over max_items */
    expect_closed(port, msg, 20, 8);
    lmc_p2p_wire_put_req_header(msg + 8, 7, 1);
    msg[8] = 9;                                           /* unknown message type */
    expect_closed(port, msg, 20, 8);
    lmc_p2p_wire_put_req_header(msg + 8, 7, 2);           /* two items promised, one sent */
    lmc_p2p_wire_put_req_item(msg + 20, 0, 16);
    expect_closed(port, msg, sizeof msg, 8);
    lmc_p2p_chan_server_stats st;
    lmc_p2p_chan_server_stats_get(f.srv, &st);
    assert_int_equal(st.protocol_errors, 5);
    assert_int_equal(st.bytes_served, 0);
    /* A well-behaved peer is still served. */
    lmc_p2p_chan_client *c = connect_to(f.url);
    uint8_t b[64];
    lmc_p2p_chan_item it = {100, 64, b};
    bool ok;
    assert_int_equal(lmc_p2p_chan_client_read(c, &it, 1, 5000, &ok), 1);
    assert_memory_equal(b, g_arena + 100, 64);
    lmc_p2p_chan_client_close(c);
    lmc_p2p_chan_server_stop(f.srv);
}

static void connections_over_the_bound_are_refused(void **state)
{
    (void)state;
    fixture f;
    assert_int_equal(start(&f, NULL, NULL, 1), 0);
    lmc_p2p_chan_client *a = connect_to(f.url), *b = connect_to(f.url);
    uint8_t buf[16];
    lmc_p2p_chan_item it = {0, 16, buf};
    bool ok;
    assert_int_equal(lmc_p2p_chan_client_read(a, &it, 1, 2000, &ok), 1);
    double t0 = now_s();
    assert_int_equal(lmc_p2p_chan_client_read(b, &it, 1, 2000, &ok), 0);
    assert_true(now_s() - t0 < 1.5);   /* closed at once, not left to time out */
    lmc_p2p_chan_client_close(a);
    sleep_ms(100);
    assert_int_equal(lmc_p2p_chan_client_read(b, &it, 1, 2000, &ok), 1);   /* reconnects */
    lmc_p2p_chan_server_stats st;
    lmc_p2p_chan_server_stats_get(f.srv, &st);
    assert_int_equal(st.conns_rejected, 1);
    lmc_p2p_chan_client_close(b);
    lmc_p2p_chan_server_stop(f.srv);
}

static void stop_with_idle_connections_is_prompt(void **state)
{
    (void)state;
    fixture f;
    assert_int_equal(start(&f, NULL, NULL, 4), 0);
    lmc_p2p_chan_client *c = connect_to(f.url);
    uint8_t buf[16];
    lmc_p2p_chan_item it = {0, 16, buf};
    bool ok;
    assert_int_equal(lmc_p2p_chan_client_read(c, &it, 1, 2000, &ok), 1);
    double t0 = now_s();
    lmc_p2p_chan_server_stop(f.srv);
    assert_true(now_s() - t0 < 1.0);
    assert_int_equal(lmc_p2p_chan_client_read(c, &it, 1, 2000, &ok), 0);
    lmc_p2p_chan_client_close(c);
}

static void bad_urls_are_refused(void **state)
{
    (void)state;
    char err[128];
    const char *bad[] = {"", "host", "host:", ":80", "h:99999", "h:8x", "[::1", "[]:1"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        lmc_p2p_chan_client_opts co = {.url = bad[i]};
        assert_null(lmc_p2p_chan_client_open(&co, err, sizeof err));
        assert_non_null(strstr(err, "not host:port"));
    }
    lmc_p2p_chan_server_opts so = {.listen_url = "127.0.0.1", .arena = g_arena, .arena_size = 1};
    assert_null(lmc_p2p_chan_server_start(&so, err, sizeof err));
    assert_non_null(strstr(err, "'127.0.0.1'"));
}

/* A scripted peer on the other end of a socketpair: echoes `hello` to the
 * handshake, drains a request of `n` items, sends `reply`, closes. */
typedef struct {
    int fd;
    const char *hello;
    uint32_t n;
    const uint8_t *reply;
    size_t reply_len;
} script;

static void *fake_peer(void *arg)
{
    script *s = arg;
    uint8_t buf[4096];
    size_t want = 8;
    if (recv(s->fd, buf, want, MSG_WAITALL) == (ssize_t)want &&
        send(s->fd, s->hello, 8, MSG_NOSIGNAL) == 8) {
        want = LMC_P2P_REQ_HDR + s->n * LMC_P2P_REQ_ITEM;
        if (recv(s->fd, buf, want, MSG_WAITALL) == (ssize_t)want)
            send(s->fd, s->reply, s->reply_len, MSG_NOSIGNAL);
    }
    close(s->fd);
    return NULL;
}

/* Two items of 64 bytes from a peer that answers with `reply`; the ok mask
 * comes back in *ok.  Returns the count read. */
static size_t read_from_script(const char *hello, const uint8_t *reply, size_t reply_len,
                               bool ok[2], uint8_t dst[2][64])
{
    int sv[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    script s = {sv[1], hello, 2, reply, reply_len};
    pthread_t th;
    pthread_create(&th, NULL, fake_peer, &s);
    lmc_p2p_chan_client_opts co = {0};
    lmc_p2p_chan_client *c = lmc_p2p_chan_client_from_fd(sv[0], &co);
    lmc_p2p_chan_item it[2] = {{0, 64, dst[0]}, {64, 64, dst[1]}};
    size_t got = lmc_p2p_chan_client_read(c, it, 2, 2000, ok);
    pthread_join(th, NULL);
    lmc_p2p_chan_client_close(c);
    return got;
}

static void garbage_replies_fail_items(void **state)
{
    (void)state;
    uint8_t good[16 + 1 + 128];
    lmc_p2p_wire_put_resp_header(good, 0, 2);
    good[16] = 0x3;
    memset(good + 17, 0xab, 128);
    uint8_t dst[2][64];
    bool ok[2];
    /* The script itself is right: both items arrive. */
    assert_int_equal(read_from_script(LMC_P2P_MAGIC, good, sizeof good, ok, dst), 2);
    assert_true(ok[0] && ok[1] && dst[1][63] == 0xab);

    assert_int_equal(read_from_script("LMTCP999", good, sizeof good, ok, dst), 0);
    uint8_t bad[sizeof good];
    uint8_t *fields[] = {bad, bad + 4, bad + 8, bad + 12};   /* type, id, n, mask length */
    for (size_t f = 0; f < 4; f++) {
        memcpy(bad, good, sizeof bad);
        fields[f][0] ^= 0x40;
        assert_int_equal(read_from_script(LMC_P2P_MAGIC, bad, sizeof bad, ok, dst), 0);
        assert_false(ok[0] || ok[1]);
    }
    /* Every short form: whatever came whole counts, the rest fails, nothing
     * is written past a destination (ASan builds check that). */
    for (size_t cut = 0; cut < sizeof good; cut += 7) {
        size_t got = read_from_script(LMC_P2P_MAGIC, good, cut, ok, dst);
        assert_int_equal(got, (cut >= 17 + 64) + (cut >= 17 + 128));
        assert_int_equal(ok[0], cut >= 17 + 64);
    }
    /* Only the second item served: its bytes are the first to follow. */
    good[16] = 0x2;
    memset(dst, 0, sizeof dst);
    assert_int_equal(read_from_script(LMC_P2P_MAGIC, good, 17 + 64, ok, dst), 1);
    assert_true(!ok[0] && ok[1] && dst[1][0] == 0xab && dst[0][0] == 0);
}

int main(void)
{
    g_arena = make_arena();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(random_ranges_are_byte_exact),
        cmocka_unit_test(a_token_is_required_when_set),
        cmocka_unit_test(the_named_holder_reaches_the_lease_check),
        cmocka_unit_test(refused_ranges_fail_alone),
        cmocka_unit_test(client_request_bounds),
        cmocka_unit_test(wrapping_ranges_on_the_wire_are_refused),
        cmocka_unit_test(server_drops_garbage_and_keeps_serving),
        cmocka_unit_test(connections_over_the_bound_are_refused),
        cmocka_unit_test(stop_with_idle_connections_is_prompt),
        cmocka_unit_test(bad_urls_are_refused),
        cmocka_unit_test(garbage_replies_fail_items),
    };
    int r = cmocka_run_group_tests(tests, NULL, NULL);
    free(g_arena);
    return r;
}
