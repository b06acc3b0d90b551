/* RPC core: real ROUTER server in a thread, real DEALER sockets. */
#include <pthread.h>
#include <semaphore.h>
#include <setjmp.h>
#include <stdatomic.h>
#include <time.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <zmq.h>
#include <cmocka.h>

#include "rpc/client.h"
#include "rpc/rpc.h"
#include "rpc/wire.h"

/* Where the current test's server listens.  A fixed port collided when two
 * runs of this test overlapped (ctest -j over two build trees, two
 * checkouts): the second could not bind, or its clients reached the first
 * run's server.  server_new() takes a port the kernel picks instead. */
static char g_url[64];

/* A port no socket is bound to now (the kernel's pick for port 0). */
static int free_port(void)
{
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    int port = -1;
    if (s >= 0 && bind(s, (struct sockaddr *)&a, sizeof a) == 0 &&
        getsockname(s, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    if (s >= 0)
        close(s);
    return port;
}

/* lmc_rpc_server_new on a free port, with g_url naming it.  The port is only
 * known to have been free a moment ago, so one that another process bound
 * in between is replaced by a fresh pick; once our bind succeeded, no other
 * server can be listening there. */
static int server_new(lmc_rpc_options *o, lmc_rpc_server **out)
{
    char err[256] = "no free port";
    for (int attempt = 0; attempt < 20; attempt++) {
        int port = free_port();
        if (port <= 0)
            continue;
        snprintf(g_url, sizeof g_url, "tcp://127.0.0.1:%d", port);
        o->bind_url = g_url;
        if (lmc_rpc_server_new(o, out, err, sizeof err) == 0)
            return 0;
    }
    fprintf(stderr, "%s\n", err);
    return -1;
}

typedef struct {
    lmc_rpc_server *server;
    pthread_t thread;
    pthread_mutex_t lock;
    int order[2][64];   /* per client: sequence numbers in execution order */
    int n_order[2];
    sem_t reply_seen;         /* posted by the test once a reply arrived */
    _Atomic int then_state;   /* 0 not run, 1 released by the test, 2 timed out, 3 ran */
} fixture;

static void *serve(void *arg)
{
    fixture *f = arg;
    lmc_rpc_server_run(f->server, -1, 2000);
    return NULL;
}

static lmc_handler_result h_noop(void *ctx, lmc_rpc_call *call)
{
    (void)ctx;
    lmc_mp_pack_cstr(lmc_rpc_call_reply(call), "OK");
    return LMC_HANDLER_REPLY;
}

static lmc_handler_result h_void(void *ctx, lmc_rpc_call *call)
{
    (void)ctx;
    (void)call;
    return LMC_HANDLER_VOID;
}

/* Echoes the sum of its int args; wrong types fail. */
static lmc_handler_result h_sum(void *ctx, lmc_rpc_call *call)
{
    (void)ctx;
    int64_t total = 0;
    for (size_t i = 0; i < lmc_rpc_call_nargs(call); i++) {
        const msgpack_object *o = lmc_rpc_call_arg(call, i);
        int64_t v;
        if (!o || !lmc_mp_get_int(o, &v))
            return lmc_rpc_call_fail(call, "TypeError", "arg %zu is not an int", i);
        total += v;
    }
    msgpack_pack_int64(lmc_rpc_call_reply(call), total);
    return LMC_HANDLER_REPLY;
}

/* args: client index, sequence number.  Sleeps a little so that a pool that
 * reordered work would show it. */
static lmc_handler_result h_ordered(void *ctx, lmc_rpc_call *call)
{
    fixture *f = ctx;
    int64_t client, seq;
    size_t clients = sizeof f->order / sizeof f->order[0];
    size_t per = sizeof f->order[0] / sizeof f->order[0][0];
    /* The garbage test's random requests can land here too. */
    if (!lmc_mp_get_int(lmc_rpc_call_arg(call, 0), &client) ||
        !lmc_mp_get_int(lmc_rpc_call_arg(call, 1), &seq) || client < 0 ||
        (uint64_t)client >= clients || seq < 0 || (size_t)f->n_order[client] >= per)
        return lmc_rpc_call_fail(call, "ValueError", "not a test request");
    usleep((useconds_t)((seq * 7919) % 500));
    pthread_mutex_lock(&f->lock);
    f->order[client][f->n_order[client]++] = (int)seq;
    pthread_mutex_unlock(&f->lock);
    msgpack_pack_int64(lmc_rpc_call_reply(call), seq);
    return LMC_HANDLER_REPLY;
}

static void *complete_later(void *arg)
{
    lmc_rpc_call *call = arg;
    usleep(20000);
    msgpack_pack_int(lmc_rpc_call_reply(call), 42);
    lmc_rpc_call_complete(call, LMC_HANDLER_REPLY);
    return NULL;
}

static lmc_handler_result h_deferred(void *ctx, lmc_rpc_call *call)
{
    (void)ctx;
    pthread_t t;
    pthread_create(&t, NULL, complete_later, call);
    pthread_detach(t);
    return LMC_HANDLER_DEFERRED;
}

/* Replies whether it ran on a pool worker (threads named lmc-cpu-N and
 * lmc-gpu-N) rather than on the socket thread. */
static lmc_handler_result h_where(void *ctx, lmc_rpc_call *call)
{
    (void)ctx;
    char name[16] = "";
    pthread_getname_np(pthread_self(), name, sizeof name);
    bool pooled = strncmp(name, "lmc-cpu", 7) == 0 || strncmp(name, "lmc-gpu", 7) == 0;
    pooled ? msgpack_pack_true(lmc_rpc_call_reply(call))
           : msgpack_pack_false(lmc_rpc_call_reply(call));
    return LMC_HANDLER_REPLY;
}

/* inline_ok of COMMIT_STORE: a first argument below 10 is "small". */
static bool small_arg(void *ctx, lmc_rpc_call *call)
{
    (void)ctx;
    int64_t v;
    const msgpack_object *o = lmc_rpc_call_arg(call, 0);
    return o && lmc_mp_get_int(o, &v) && v < 10;
}

/* Keeps a NORMAL worker busy for 300 ms. */
static lmc_handler_result h_busy(void *ctx, lmc_rpc_call *call)
{
    (void)ctx;
    (void)call;
    usleep(300000);
    return LMC_HANDLER_VOID;
}

/* Continuation of h_then_socket: waits (up to 10 s) for the test to say
 * it has the reply already. */
static void wait_for_reply_seen(void *arg)
{
    fixture *f = arg;
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 10;
    atomic_store(&f->then_state, sem_timedwait(&f->reply_seen, &until) == 0 ? 1 : 2);
}

static void mark_then_ran(void *arg)
{
    atomic_store(&((fixture *)arg)->then_state, 3);
}

static lmc_handler_result h_then_socket(void *ctx, lmc_rpc_call *call)
{
    lmc_rpc_call_then(call, wait_for_reply_seen, ctx);
    msgpack_pack_int(lmc_rpc_call_reply(call), 7);
    return LMC_HANDLER_REPLY;
}

static lmc_handler_result h_then_pooled(void *ctx, lmc_rpc_call *call)
{
    lmc_rpc_call_then(call, mark_then_ran, ctx);
    return LMC_HANDLER_VOID;
}

static lmc_handler_result h_then_state(void *ctx, lmc_rpc_call *call)
{
    msgpack_pack_int(lmc_rpc_call_reply(call), atomic_load(&((fixture *)ctx)->then_state));
    return LMC_HANDLER_REPLY;
}

/* A streaming reply: three partial documents (the ints 1, 2, 3), then the
 * final one, 99.  On the socket thread (SYNC) streaming is refused: the
 * reply is send_partial's result. */
static lmc_handler_result h_stream(void *ctx, lmc_rpc_call *call)
{
    (void)ctx;
    int rc = 0;
    for (uint8_t i = 1; i <= 3 && rc == 0; i++)
        rc = lmc_rpc_call_send_partial(call, &i, 1);    /* a positive fixint */
    msgpack_pack_int64(lmc_rpc_call_reply(call), rc == 0 ? 99 : rc);
    return LMC_HANDLER_REPLY;
}

static int start(void **state, bool error_frames)
{
    fixture *f = calloc(1, sizeof *f);
    pthread_mutex_init(&f->lock, NULL);
    sem_init(&f->reply_seen, 0, 0);
    lmc_rpc_options o = {NULL, 3, 4, error_frames, 0};
    if (server_new(&o, &f->server) != 0)
        return -1;
    lmc_rpc_handler_spec specs[] = {
        {LMC_OP_NOOP, NULL, LMC_POOL_SYNC, h_noop, false, NULL, NULL, false},
        {LMC_OP_CLEAR, NULL, LMC_POOL_NORMAL, h_void, false, NULL, NULL, false},
        {LMC_OP_GET_CHUNK_SIZE, NULL, LMC_POOL_NORMAL, h_sum, false, NULL, NULL, false},
        {LMC_OP_PREPARE_STORE, NULL, LMC_POOL_AFFINITY, h_ordered, true, NULL, NULL, false},
        {LMC_OP_PING, NULL, LMC_POOL_NORMAL, h_where, true, NULL, NULL, false},
        {LMC_OP_PREPARE_RETRIEVE, NULL, LMC_POOL_AFFINITY, h_where, true, NULL, NULL, false},
        {LMC_OP_COMMIT_RETRIEVE, NULL, LMC_POOL_NORMAL, h_where, false, NULL, NULL, false},
        {LMC_OP_COMMIT_STORE, NULL, LMC_POOL_AFFINITY, h_where, false, small_arg, NULL, false},
        {LMC_OP_END_SESSION, NULL, LMC_POOL_NORMAL, h_busy, false, NULL, NULL, false},
        {LMC_OP_QUERY_PREFETCH_LOOKUP_HITS, NULL, LMC_POOL_SYNC, h_then_socket, false, NULL, NULL, false},
        {LMC_OP_FREE_LOOKUP_LOCKS, NULL, LMC_POOL_NORMAL, h_then_pooled, false, NULL, NULL, false},
        {LMC_OP_GET_EXPERIMENTAL, NULL, LMC_POOL_SYNC, h_then_state, false, NULL, NULL, false},
        {LMC_OP_WAIT_PREFETCH_STATUS, NULL, LMC_POOL_NORMAL, h_deferred, false, NULL, NULL, false},
        {0, "store_with_chunk_events", LMC_POOL_SYNC, h_noop, false, NULL, NULL, false},
        {0, "stream", LMC_POOL_AFFINITY, h_stream, false, NULL, NULL, false},
        {0, "stream_sync", LMC_POOL_SYNC, h_stream, false, NULL, NULL, false},
    };
    for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++)
        assert_int_equal(lmc_rpc_server_register(f->server, &specs[i], f), 0);
    assert_int_equal(lmc_rpc_server_register(f->server, &specs[0], f), -1); /* twice */
    pthread_create(&f->thread, NULL, serve, f);
    *state = f;
    return 0;
}

static int setup(void **state) { return start(state, false); }
static int setup_error_frames(void **state) { return start(state, true); }

static int teardown(void **state)
{
    fixture *f = *state;
    lmc_rpc_server_stop(f->server);
    pthread_join(f->thread, NULL);
    lmc_rpc_server_free(f->server);
    pthread_mutex_destroy(&f->lock);
    sem_destroy(&f->reply_seen);
    free(f);
    return 0;
}

/* ---- raw DEALER helpers ------------------------------------------------- */

static void *dealer(void *zctx)
{
    void *s = zmq_socket(zctx, ZMQ_DEALER);
    int linger = 0;
    zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof linger);
    assert_int_equal(zmq_connect(s, g_url), 0);
    return s;
}

static void send_frames(void *s, const char *const *frames, const size_t *lens, size_t n)
{
    for (size_t i = 0; i < n; i++)
        zmq_send(s, frames[i], lens[i], i + 1 < n ? ZMQ_SNDMORE : 0);
}

/* Receives one reply into bufs; returns the frame count, 0 on timeout. */
static size_t recv_frames(void *s, char bufs[][256], size_t *lens, int timeout_ms)
{
    zmq_pollitem_t it = {.socket = s, .events = ZMQ_POLLIN};
    if (zmq_poll(&it, 1, timeout_ms) <= 0)
        return 0;
    size_t n = 0;
    int more = 1;
    while (more && n < 8) {
        int r = zmq_recv(s, bufs[n], 256, 0);
        lens[n++] = (size_t)r;
        size_t sz = sizeof more;
        zmq_getsockopt(s, ZMQ_RCVMORE, &more, &sz);
    }
    return n;
}

static void test_sync_reply_bytes_and_verbatim_echo(void **state)
{
    (void)state;
    void *z = zmq_ctx_new(), *s = dealer(z);
    /* uid 5 in a non-minimal uint16 form: must come back byte for byte. */
    const char *fr[] = {"\xcd\x00\x05", "\x18"};
    size_t ln[] = {3, 1};
    send_frames(s, fr, ln, 2);
    char b[8][256];
    size_t l[8];
    assert_int_equal(recv_frames(s, b, l, 2000), 3);
    assert_int_equal(l[0], 3);
    assert_memory_equal(b[0], "\xcd\x00\x05", 3);
    assert_int_equal(l[1], 1);
    assert_memory_equal(b[1], "\x18", 1);
    assert_int_equal(l[2], 3);
    assert_memory_equal(b[2], "\xa2OK", 3);
    zmq_close(s);
    zmq_ctx_term(z);
}

static void test_void_reply_has_no_response_frame(void **state)
{
    (void)state;
    void *z = zmq_ctx_new(), *s = dealer(z);
    const char *fr[] = {"\x07", "\x14"};
    size_t ln[] = {1, 1};
    send_frames(s, fr, ln, 2);
    char b[8][256];
    size_t l[8];
    assert_int_equal(recv_frames(s, b, l, 2000), 2);
    assert_memory_equal(b[0], "\x07", 1);
    assert_memory_equal(b[1], "\x14", 1);
    zmq_close(s);
    zmq_ctx_term(z);
}

static void test_string_op_names(void **state)
{
    (void)state;
    void *z = zmq_ctx_new(), *s = dealer(z);
    const char *fr[] = {"\x01", "\xa4noop"};
    size_t ln[] = {1, 5};
    send_frames(s, fr, ln, 2);
    char b[8][256];
    size_t l[8];
    assert_int_equal(recv_frames(s, b, l, 2000), 3);
    assert_memory_equal(b[1], "\xa4noop", 5);
    assert_memory_equal(b[2], "\xa2OK", 3);
    const char *fr2[] = {"\x02", "\xb7store_with_chunk_events"};
    size_t ln2[] = {1, 24};
    send_frames(s, fr2, ln2, 2);
    assert_int_equal(recv_frames(s, b, l, 2000), 3);
    assert_memory_equal(b[2], "\xa2OK", 3);
    zmq_close(s);
    zmq_ctx_term(z);
}

static void test_streaming_replies_arrive_in_order(void **state)
{
    (void)state;
    void *z = zmq_ctx_new(), *s = dealer(z);
    const char *fr[] = {"\x09", "\xa6stream"};
    size_t ln[] = {1, 7};
    char b[8][256];
    size_t l[8];
    for (int round = 0; round < 3; round++) {
        send_frames(s, fr, ln, 2);
        static const char bodies[] = {1, 2, 3, 99};
        for (int i = 0; i < 4; i++) {
            assert_int_equal(recv_frames(s, b, l, 2000), 3);
            assert_memory_equal(b[0], "\x09", 1);             /* uid and op echoed */
            assert_memory_equal(b[1], "\xa6stream", 7);
            assert_int_equal(l[2], 1);
            assert_int_equal(b[2][0], bodies[i]);
        }
    }
    const char *fs[] = {"\x0a", "\xabstream_sync"};
    size_t ls[] = {1, 12};
    send_frames(s, fs, ls, 2);
    assert_int_equal(recv_frames(s, b, l, 2000), 3);
    assert_int_equal(l[2], 1);
    assert_int_equal((uint8_t)b[2][0], 0xff);                  /* -1: nothing streamed */
    assert_int_equal(recv_frames(s, b, l, 100), 0);
    assert_true(lmc_rpc_server_stats(((fixture *)*state)->server).partials >= 9);
    zmq_close(s);
    zmq_ctx_term(z);
}

static void test_garbage_is_dropped_and_server_keeps_serving(void **state)
{
    (void)state;
    void *z = zmq_ctx_new(), *s = dealer(z);
    char b[8][256];
    size_t l[8];
    const char *cases[][3] = {
        {"\x01", NULL, NULL},                  /* too short */
        {"\x01", "\x63", NULL},                /* unknown int op 99 */
        {"\x01", "\xa3zzz", NULL},             /* unknown str op */
        {"\x01", "\xc1", NULL},                /* never-used byte */
        {"\x01", "\x92\x01", NULL},            /* truncated array */
        {"\x01", "\x15", "\xa1x"},             /* wrong arg type */
        {"\x01", "\x15", "\xdd\xff\xff\xff\xff"}, /* absurd array length */
    };
    size_t lens[][3] = {{1}, {1, 1}, {1, 4}, {1, 1}, {1, 2}, {1, 1, 2}, {1, 1, 5}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        size_t n = cases[c][1] ? (cases[c][2] ? 3 : 2) : 1;
        send_frames(s, cases[c], lens[c], n);
    }
    for (int i = 0; i < 2000; i++) {
        char junk[32];
        for (size_t k = 0; k < sizeof junk; k++)
            junk[k] = (char)(rand() & 0xff);
        const char *fr[] = {junk, junk + 1, junk + 9};
        size_t ln[] = {(size_t)(rand() % 4), (size_t)(rand() % 8), (size_t)(rand() % 23)};
        send_frames(s, fr, ln, (size_t)(1 + rand() % 3));
    }
    /* Nothing answered, and a valid request still is. */
    const char *ok[] = {"\x09", "\x18"};
    size_t okl[] = {1, 1};
    send_frames(s, ok, okl, 2);
    size_t n;
    do {
        n = recv_frames(s, b, l, 5000);
    } while (n && !(l[0] == 1 && b[0][0] == 0x09));
    assert_int_equal(n, 3);
    assert_memory_equal(b[2], "\xa2OK", 3);
    zmq_close(s);
    zmq_ctx_term(z);
}

/* Three int frames whose sum h_sum answers: 42. */
static void pack_sum_args(msgpack_sbuffer args[3])
{
    int64_t vals[] = {40, -5, 7};
    for (int i = 0; i < 3; i++) {
        msgpack_packer pk;
        msgpack_sbuffer_init(&args[i]);
        msgpack_packer_init(&pk, &args[i], msgpack_sbuffer_write);
        msgpack_pack_int64(&pk, vals[i]);
    }
}

static void test_client_call_and_args(void **state)
{
    (void)state;
    lmc_client *c = lmc_client_connect(g_url);
    msgpack_sbuffer args[3];
    pack_sum_args(args);
    lmc_client_reply r;
    assert_int_equal(lmc_client_call(c, LMC_OP_GET_CHUNK_SIZE, args, 3, 2000, &r), LMC_CLIENT_OK);
    assert_true(r.has_response);
    assert_int_equal(r.len, 1);
    assert_int_equal(r.data[0], 42);
    lmc_client_reply_free(&r);
    /* Deferred completion from another thread. */
    assert_int_equal(lmc_client_call(c, LMC_OP_WAIT_PREFETCH_STATUS, NULL, 0, 2000, &r),
                     LMC_CLIENT_OK);
    assert_int_equal(r.data[0], 42);
    lmc_client_reply_free(&r);
    /* A handler failure is silent by default: the client times out. */
    msgpack_sbuffer_destroy(&args[0]);
    msgpack_sbuffer_init(&args[0]);
    msgpack_sbuffer_write(&args[0], "\xa1x", 2);
    assert_int_equal(lmc_client_call(c, LMC_OP_GET_CHUNK_SIZE, args, 1, 300, &r),
                     LMC_CLIENT_TIMEOUT);
    for (int i = 0; i < 3; i++)
        msgpack_sbuffer_destroy(&args[i]);
    lmc_client_close(c);
}

/* Pipelined: three requests in flight, every reply collected by uid. */
static void test_client_pipelined_send_receive(void **state)
{
    (void)state;
    lmc_client *c = lmc_client_connect(g_url);
    msgpack_sbuffer args[3];
    pack_sum_args(args);
    uint64_t sent[3];
    for (int i = 0; i < 3; i++) {
        sent[i] = lmc_client_send(c, LMC_OP_GET_CHUNK_SIZE, args, 3);
        assert_true(sent[i] != 0);
        assert_true(i == 0 || sent[i] != sent[i - 1]);
    }
    bool seen[3] = {false, false, false};
    for (int i = 0; i < 3; i++) {
        lmc_client_reply r;
        uint64_t uid = 0;
        assert_int_equal(lmc_client_receive(c, 2000, &uid, &r), LMC_CLIENT_OK);
        assert_true(r.has_response && r.len == 1 && r.data[0] == 42);
        int k = uid == sent[0] ? 0 : uid == sent[1] ? 1 : uid == sent[2] ? 2 : -1;
        assert_true(k >= 0 && !seen[k]);
        seen[k] = true;
        lmc_client_reply_free(&r);
    }
    lmc_client_reply r;
    uint64_t uid;
    assert_int_equal(lmc_client_receive(c, 100, &uid, &r), LMC_CLIENT_TIMEOUT); /* no extra */
    for (int i = 0; i < 3; i++)
        msgpack_sbuffer_destroy(&args[i]);
    lmc_client_close(c);
}

static void test_error_frames_when_enabled(void **state)
{
    (void)state;
    void *z = zmq_ctx_new(), *s = dealer(z);
    const char *fr[] = {"\x03", "\x63"};
    size_t ln[] = {1, 1};
    send_frames(s, fr, ln, 2);
    char b[8][256];
    size_t l[8];
    assert_int_equal(recv_frames(s, b, l, 2000), 4);
    assert_memory_equal(b[0], "\x03", 1);
    assert_memory_equal(b[1], "\x63", 1);
    assert_int_equal(l[2], 20);
    assert_memory_equal(b[2], "LMCACHE_RPC_ERROR_V1", 20);
    msgpack_unpacked up;
    msgpack_unpacked_init(&up);
    size_t off = 0;
    assert_int_equal(msgpack_unpack_next(&up, b[3], l[3], &off), MSGPACK_UNPACK_SUCCESS);
    assert_true(lmc_mp_str_eq(lmc_mp_map_get(&up.data, "error_type"), "ValueError"));
    const msgpack_object *msg = lmc_mp_map_get(&up.data, "message");
    assert_non_null(msg);
    assert_non_null(memmem(msg->via.str.ptr, msg->via.str.size, "99", 2));
    msgpack_unpacked_destroy(&up);
    zmq_close(s);
    zmq_ctx_term(z);
}

/* Two clients pipeline 40 affinity requests each: every client's requests
 * execute in the order sent, although handlers sleep for varying times. */
static void test_affinity_fifo_per_client(void **state)
{
    fixture *f = *state;
    void *z = zmq_ctx_new(), *s[2] = {dealer(z), dealer(z)};
    for (int seq = 0; seq < 40; seq++) {
        for (int c = 0; c < 2; c++) {
            char uid = (char)seq, a0 = (char)c, a1 = (char)seq;
            const char *fr[] = {&uid, "\x10", &a0, &a1};
            size_t ln[] = {1, 1, 1, 1};
            send_frames(s[c], fr, ln, 4);
        }
    }
    char b[8][256];
    size_t l[8];
    for (int c = 0; c < 2; c++) {
        for (int i = 0; i < 40; i++)
            assert_int_equal(recv_frames(s[c], b, l, 5000), 3);
    }
    pthread_mutex_lock(&f->lock);
    for (int c = 0; c < 2; c++) {
        assert_int_equal(f->n_order[c], 40);
        for (int i = 0; i < 40; i++)
            assert_int_equal(f->order[c][i], i);
    }
    pthread_mutex_unlock(&f->lock);
    zmq_close(s[0]);
    zmq_close(s[1]);
    zmq_ctx_term(z);
}

/* Replies true when the op ran on a pool worker. */
static bool ran_pooled(lmc_client *c, int op, const msgpack_sbuffer *args, size_t nargs)
{
    lmc_client_reply r;
    assert_int_equal(lmc_client_call(c, op, args, nargs, 5000, &r), LMC_CLIENT_OK);
    assert_true(r.has_response && r.len == 1 && (r.data[0] == 0xc2 || r.data[0] == 0xc3));
    bool pooled = r.data[0] == 0xc3;
    lmc_client_reply_free(&r);
    return pooled;
}

/* A quick handler runs on the socket thread only while its queue is idle
 * and its payload small; otherwise, and for ops not marked quick, the pool
 * runs it as before. */
static void test_quick_handlers_run_inline_only_when_idle(void **state)
{
    fixture *f = *state;
    lmc_client *c = lmc_client_connect(g_url);
    uint64_t inlined = lmc_rpc_server_stats(f->server).inlined;
    assert_false(ran_pooled(c, LMC_OP_PING, NULL, 0));              /* NORMAL, idle */
    assert_false(ran_pooled(c, LMC_OP_PREPARE_RETRIEVE, NULL, 0));  /* AFFINITY, idle */
    assert_true(ran_pooled(c, LMC_OP_COMMIT_RETRIEVE, NULL, 0));    /* not quick */
    assert_int_equal(lmc_rpc_server_stats(f->server).inlined, inlined + 2);
    /* Not quick, but the module judges this call small: inline. */
    msgpack_sbuffer arg;
    msgpack_packer apk;
    for (int v = 3; v <= 30; v += 27) {
        msgpack_sbuffer_init(&arg);
        msgpack_packer_init(&apk, &arg, msgpack_sbuffer_write);
        msgpack_pack_int(&apk, v);
        assert_int_equal(ran_pooled(c, LMC_OP_COMMIT_STORE, &arg, 1), v > 10);
        msgpack_sbuffer_destroy(&arg);
    }
    inlined++;

    msgpack_sbuffer big;       /* a payload over LMC_RPC_INLINE_MAX_BYTES */
    msgpack_packer pk;
    msgpack_sbuffer_init(&big);
    msgpack_packer_init(&pk, &big, msgpack_sbuffer_write);
    size_t n = LMC_RPC_INLINE_MAX_BYTES + 1;
    char *zeros = calloc(1, n);
    msgpack_pack_bin(&pk, n);
    msgpack_pack_bin_body(&pk, zeros, n);
    assert_true(ran_pooled(c, LMC_OP_PING, &big, 1));
    free(zeros);
    msgpack_sbuffer_destroy(&big);

    /* A busy NORMAL queue: PING waits its turn in the pool. */
    uint64_t busy = lmc_client_send(c, LMC_OP_END_SESSION, NULL, 0);
    assert_true(busy != 0);
    usleep(50000); /* the busy task is running */
    uint64_t ping = lmc_client_send(c, LMC_OP_PING, NULL, 0);
    for (int i = 0; i < 2; i++) {
        lmc_client_reply r;
        uint64_t uid;
        assert_int_equal(lmc_client_receive(c, 5000, &uid, &r), LMC_CLIENT_OK);
        assert_true(uid == busy || uid == ping);
        if (uid == ping)
            assert_true(r.len == 1 && r.data[0] == 0xc3); /* pooled */
        lmc_client_reply_free(&r);
    }
    assert_int_equal(lmc_rpc_server_stats(f->server).inlined, inlined + 2);
    lmc_client_close(c);
}

static int64_t call_int(lmc_client *c, int op)
{
    lmc_client_reply r;
    assert_int_equal(lmc_client_call(c, op, NULL, 0, 20000, &r), LMC_CLIENT_OK);
    assert_true(r.has_response && r.len == 1);
    int64_t v = r.data[0];
    lmc_client_reply_free(&r);
    return v;
}

/* lmc_rpc_call_then: on the socket thread the reply leaves before the
 * continuation, which still finishes before the next request is read; on
 * a pool thread it runs before the reply. */
static void test_then_runs_after_the_reply_on_the_socket_thread(void **state)
{
    fixture *f = *state;
    lmc_client *c = lmc_client_connect(g_url);
    assert_int_equal(call_int(c, LMC_OP_QUERY_PREFETCH_LOOKUP_HITS), 7);
    assert_int_equal(atomic_load(&f->then_state), 0); /* still waiting for us */
    sem_post(&f->reply_seen);
    assert_int_equal(call_int(c, LMC_OP_GET_EXPERIMENTAL), 1); /* released, not timed out */

    lmc_client_reply r;
    assert_int_equal(lmc_client_call(c, LMC_OP_FREE_LOOKUP_LOCKS, NULL, 0, 5000, &r),
                     LMC_CLIENT_OK);
    lmc_client_reply_free(&r);
    assert_int_equal(atomic_load(&f->then_state), 3);
    lmc_client_close(c);
}

static void test_validate(void **state)
{
    (void)state;
    struct { const char *b; size_t n; bool ok; } v[] = {
        {"\x00", 1, true}, {"\xc0", 1, true}, {"\xc1", 1, false}, {"", 0, false},
        {"\x92\x01\x02", 3, true}, {"\x92\x01", 2, false}, {"\x01\x02", 2, false},
        {"\x81\xa1k\x90", 4, true}, {"\x81\xa1k", 3, false}, {"\xcd\x01", 2, false},
        {"\xc4\x03" "ab", 4, false}, {"\xc4\x02" "ab", 4, true}, {"\xdd\x7f\xff\xff\xff", 5, false},
        {"\xd4\x01\x02", 3, true}, {"\xc7\x01\x01\x02", 4, true}, {"\xcb\x00", 2, false},
    };
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++)
        assert_int_equal(lmc_mp_validate((const uint8_t *)v[i].b, v[i].n, 8), v[i].ok);
    uint8_t deep[40];
    memset(deep, 0x91, sizeof deep);
    deep[39] = 0x00;
    assert_false(lmc_mp_validate(deep, sizeof deep, 32));
    assert_true(lmc_mp_validate(deep + 20, 20, 32));
}


/* ---- overload (issue 17) ------------------------------------------------ */

typedef struct {
    lmc_rpc_server *server;
    pthread_t thread;
    sem_t entered, gate;   /* the gated handler started; may finish */
} busy_fixture;

static void *serve_busy(void *arg)
{
    lmc_rpc_server_run(((busy_fixture *)arg)->server, -1, 2000);
    return NULL;
}

static lmc_handler_result h_gated(void *ctx, lmc_rpc_call *call)
{
    (void)call;
    busy_fixture *f = ctx;
    sem_post(&f->entered);
    sem_wait(&f->gate);
    return LMC_HANDLER_VOID;
}

static lmc_handler_result busy_false(void *ctx, lmc_rpc_call *call)
{
    (void)ctx;
    msgpack_pack_false(lmc_rpc_call_reply(call));
    return LMC_HANDLER_REPLY;
}

/* One CPU worker, one request allowed to wait: with the worker held, the
 * second request waits, the third gets its op's failure reply at once, a
 * request of an op without one an error frame, and the server goes on. */
static void test_full_queue_is_answered_at_once(void **state)
{
    (void)state;
    busy_fixture f;
    sem_init(&f.entered, 0, 0);
    sem_init(&f.gate, 0, 0);
    lmc_rpc_options o = {NULL, 1, 1, true, 1};
    assert_int_equal(server_new(&o, &f.server), 0);
    lmc_rpc_handler_spec specs[] = {
        {LMC_OP_NOOP, NULL, LMC_POOL_SYNC, h_noop, false, NULL, NULL, false},
        {LMC_OP_COMMIT_STORE, NULL, LMC_POOL_NORMAL, h_gated, false, NULL, busy_false, false},
        {LMC_OP_CLEAR, NULL, LMC_POOL_NORMAL, h_void, false, NULL, NULL, false},
    };
    for (size_t i = 0; i < 3; i++)
        assert_int_equal(lmc_rpc_server_register(f.server, &specs[i], &f), 0);
    pthread_create(&f.thread, NULL, serve_busy, &f);
    void *z = zmq_ctx_new(), *s = dealer(z);
    const char *fr[] = {"\x00", "\x11"};
    size_t ln[] = {1, 1};
    send_frames(s, fr, ln, 2);            /* uid 0 runs and holds the worker */
    sem_wait(&f.entered);
    fr[0] = "\x01";
    send_frames(s, fr, ln, 2);            /* uid 1 waits in the queue */
    fr[0] = "\x02";
    send_frames(s, fr, ln, 2);            /* uid 2: full */
    const char *clear[] = {"\x03", "\x14"};
    send_frames(s, clear, ln, 2);         /* uid 3: full, no failure reply */
    char b[8][256];
    size_t l[8];
    assert_int_equal(recv_frames(s, b, l, 5000), 3);
    assert_memory_equal(b[0], "\x02", 1);
    assert_memory_equal(b[2], "\xc2", 1);
    assert_int_equal(recv_frames(s, b, l, 5000), 4);
    assert_memory_equal(b[0], "\x03", 1);
    assert_memory_equal(b[2], "LMCACHE_RPC_ERROR_V1", 20);
    msgpack_unpacked up;
    msgpack_unpacked_init(&up);
    size_t off = 0;
    assert_int_equal(msgpack_unpack_next(&up, b[3], l[3], &off), MSGPACK_UNPACK_SUCCESS);
    assert_true(lmc_mp_str_eq(lmc_mp_map_get(&up.data, "error_type"), "ServerBusyError"));
    msgpack_unpacked_destroy(&up);
    const char *noop[] = {"\x04", "\x18"};
    send_frames(s, noop, ln, 2);          /* the socket thread is not held up */
    assert_int_equal(recv_frames(s, b, l, 5000), 3);
    assert_memory_equal(b[0], "\x04", 1);
    lmc_rpc_stats st = lmc_rpc_server_stats(f.server);
    assert_int_equal(st.overloaded, 2);
    sem_post(&f.gate);
    sem_post(&f.gate);
    for (int i = 0; i < 2; i++) {          /* uids 0 and 1 finish: void replies */
        assert_int_equal(recv_frames(s, b, l, 5000), 2);
        assert_int_equal(b[0][0], i);
    }
    uint64_t replied, failed;
    assert_true(lmc_rpc_server_op_counts(f.server, LMC_OP_COMMIT_STORE, &replied, &failed));
    assert_int_equal(replied, 2);
    assert_int_equal(failed, 1);
    zmq_close(s);
    zmq_ctx_term(z);
    lmc_rpc_server_stop(f.server);
    pthread_join(f.thread, NULL);
    lmc_rpc_server_free(f.server);
    sem_destroy(&f.entered);
    sem_destroy(&f.gate);
}

/* Ops that give back what others hold queue past the bound, up to twice
 * it, so an overload does not keep locks and pins held until they lapse. */
static void test_releasing_ops_get_headroom(void **state)
{
    (void)state;
    busy_fixture f;
    sem_init(&f.entered, 0, 0);
    sem_init(&f.gate, 0, 0);
    lmc_rpc_options o = {NULL, 1, 1, true, 1};
    assert_int_equal(server_new(&o, &f.server), 0);
    lmc_rpc_handler_spec specs[] = {
        {LMC_OP_COMMIT_STORE, NULL, LMC_POOL_NORMAL, h_gated, false, NULL, busy_false, false},
        {LMC_OP_FREE_LOOKUP_LOCKS, NULL, LMC_POOL_NORMAL, h_void, false, NULL, NULL,
         .releases = true},
    };
    for (size_t i = 0; i < 2; i++)
        assert_int_equal(lmc_rpc_server_register(f.server, &specs[i], &f), 0);
    pthread_create(&f.thread, NULL, serve_busy, &f);
    void *z = zmq_ctx_new(), *s = dealer(z);
    const char *fr[] = {"\x00", "\x11"};
    size_t ln[] = {1, 1};
    send_frames(s, fr, ln, 2);            /* uid 0 runs and holds the worker */
    sem_wait(&f.entered);
    fr[0] = "\x01";
    send_frames(s, fr, ln, 2);            /* uid 1 fills the queue (bound 1) */
    const char *rel[] = {"\x02", "\x0c"};
    send_frames(s, rel, ln, 2);           /* uid 2 releases: queued past the bound */
    rel[0] = "\x03";
    send_frames(s, rel, ln, 2);           /* uid 3: twice the bound is full too */
    char b[8][256];
    size_t l[8];
    assert_int_equal(recv_frames(s, b, l, 5000), 4);
    assert_memory_equal(b[0], "\x03", 1);
    assert_memory_equal(b[2], "LMCACHE_RPC_ERROR_V1", 20);
    sem_post(&f.gate);
    sem_post(&f.gate);
    for (int i = 0; i < 3; i++) {          /* uids 0, 1 and 2 run, in order */
        assert_int_equal(recv_frames(s, b, l, 5000), 2);
        assert_int_equal(b[0][0], i);
    }
    assert_int_equal(lmc_rpc_server_stats(f.server).overloaded, 1);
    zmq_close(s);
    zmq_ctx_term(z);
    lmc_rpc_server_stop(f.server);
    pthread_join(f.thread, NULL);
    lmc_rpc_server_free(f.server);
    sem_destroy(&f.entered);
    sem_destroy(&f.gate);
}

static void test_op_table(void **state)
{
    (void)state;
    assert_string_equal(lmc_op_name(24), "noop");
    assert_string_equal(lmc_op_name(14), "register_kv_cache_engine_driven_context");
    assert_int_equal(lmc_op_id_from_name("lookup", 6), 8);
    assert_int_equal(lmc_op_id_from_name("get_experimental", 16), 32);
    assert_int_equal(lmc_op_id_from_name("nope", 4), 0);
    assert_null(lmc_op_name(0));
    assert_null(lmc_op_name(35));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_validate),
        cmocka_unit_test(test_op_table),
        cmocka_unit_test_setup_teardown(test_sync_reply_bytes_and_verbatim_echo, setup, teardown),
        cmocka_unit_test_setup_teardown(test_void_reply_has_no_response_frame, setup, teardown),
        cmocka_unit_test_setup_teardown(test_string_op_names, setup, teardown),
        cmocka_unit_test_setup_teardown(test_streaming_replies_arrive_in_order, setup, teardown),
        cmocka_unit_test_setup_teardown(test_garbage_is_dropped_and_server_keeps_serving, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_client_call_and_args, setup, teardown),
        cmocka_unit_test_setup_teardown(test_client_pipelined_send_receive, setup, teardown),
        cmocka_unit_test_setup_teardown(test_affinity_fifo_per_client, setup, teardown),
        cmocka_unit_test_setup_teardown(test_quick_handlers_run_inline_only_when_idle, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_then_runs_after_the_reply_on_the_socket_thread,
                                        setup, teardown),
        cmocka_unit_test(test_full_queue_is_answered_at_once),
        cmocka_unit_test(test_releasing_ops_get_headroom),
        cmocka_unit_test_setup_teardown(test_error_frames_when_enabled, setup_error_frames,
                                        teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
