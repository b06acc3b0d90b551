/* The resp backend against real redis-server processes started here: one
 * plain, one with a password, and a three-node Redis Cluster; usage
 * accounting (overwrites, deletes, max_capacity_gb, the rebuild at start)
 * of issue 17; the parts of one adapter task in parallel (issue 18). */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <sys/socket.h>
#include <cmocka.h>

#include "gate_backend.h"
#include "ports.h"
#include "storage/l2/adapters/l2_resp.h"
#include "storage/l2/adapters/l2_resp_conn.h"

#define OBJ 70000 /* > the connection buffer: payloads go straight to the caller */


/* Servers still running; a failed assertion leaves its test early, and the
 * teardown stops what it left (a live server would keep ctest's output
 * pipe open until the test's timeout). */
static pid_t running[8];

static void track(pid_t pid, bool add)
{
    for (size_t i = 0; i < sizeof running / sizeof running[0]; i++) {
        if (add ? running[i] == 0 : running[i] == pid) {
            running[i] = add ? pid : 0;
            return;
        }
    }
}

/* The process id of the Redis answering on `port` (INFO's process_id),
 * after AUTH when `password` is set; 0 when none answers. */
static long redis_pid_on(int port, const char *password)
{
    resp_conn c;
    lmc_resp_conn_init(&c);
    if (lmc_resp_conn_open(&c, "127.0.0.1", port, 500) != 0)
        return 0;
    char line[RESP_LINE_MAX], body[8192];
    int64_t len = 0;
    long pid = 0;
    bool ok = true;
    if (password) {
        resp_arg auth[] = {{"AUTH", 4}, {password, strlen(password)}};
        ok = lmc_resp_send_command(&c, auth, 2) == 0 && lmc_resp_read_line(&c, line, sizeof line) == 0;
    }
    resp_arg info[] = {{"INFO", 4}, {"server", 6}};
    if (ok && lmc_resp_send_command(&c, info, 2) == 0 &&
        lmc_resp_read_line(&c, line, sizeof line) == 0 && line[0] == '$' &&
        lmc_resp_parse_int(line, &len) && len > 0 && (size_t)len < sizeof body &&
        lmc_resp_read_bulk_body(&c, body, (size_t)len) == 0) {
        body[len] = '\0';
        const char *at = strstr(body, "\nprocess_id:");
        if (at)
            pid = strtol(at + strlen("\nprocess_id:"), NULL, 10);
    }
    lmc_resp_conn_close(&c);
    return pid;
}

/* Starts redis-server on `port` and waits until it answers as itself: the
 * Redis answering there reports the child's pid.  A redis-server that
 * cannot bind (the port was taken since it was picked) exits, and is
 * reported at once as -1; answering PING alone would have taken whatever
 * else listens on the port (another test's Redis) for this one. */
static pid_t start_redis(int port, const char *extra1, const char *extra2, const char *dir)
{
    char p[16];
    snprintf(p, sizeof p, "%d", port);
    pid_t pid = fork();
    if (pid == 0) {
        if (chdir(dir) != 0)
            _exit(127);
        freopen("/dev/null", "w", stdout);
        execlp("redis-server", "redis-server", "--port", p, "--bind", "127.0.0.1", "--save", "",
               "--appendonly", "no", extra1 ? extra1 : "--loglevel",
               extra1 ? extra2 : "warning", (char *)NULL);
        _exit(127);
    }
    const char *password = extra1 && strcmp(extra1, "--requirepass") == 0 ? extra2 : NULL;
    for (int i = 0; pid > 0 && i < 400; i++) {
        if (waitpid(pid, NULL, WNOHANG) == pid)
            return -1;                          /* exited: it never served */
        if (redis_pid_on(port, password) == (long)pid) {
            track(pid, true);
            return pid;
        }
        usleep(25000);
    }
    if (pid > 0) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
    }
    return -1;
}

/* A Redis on a port picked now; another port when that one was taken
 * between the pick and Redis's bind. */
static pid_t start_redis_fresh(int *port, const char *extra1, const char *extra2)
{
    for (int attempt = 0; attempt < 5; attempt++) {
        *port = pick_ports(1, false);
        pid_t pid = start_redis(*port, extra1, extra2, "/tmp");
        if (pid > 0)
            return pid;
    }
    return -1;
}

static void stop_redis(pid_t pid)
{
    track(pid, false);
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
}

static int stop_leftovers(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof running / sizeof running[0]; i++) {
        if (running[i])
            stop_redis(running[i]);
    }
    return 0;
}

static lmc_object_key make_key(int i, const char *model)
{
    lmc_object_key k = {.chunk_hash_len = 32, .kv_rank = lmc_kv_rank_for_worker(2, (uint32_t)i % 2),
                        .model_name = model, .cache_salt = i % 3 ? "" : "tenant"};
    for (int b = 0; b < 32; b++)
        k.chunk_hash[b] = (uint8_t)(i * 31 + b);
    return k;
}

static void fill(uint8_t *buf, int i)
{
    for (size_t b = 0; b < OBJ; b++)
        buf[b] = (uint8_t)(b * 7 + (size_t)i);
}

static lmc_l2_backend *connect_backend(int port, const char *password)
{
    lmc_l2_resp_options o = {.host = "127.0.0.1", .port = port, .password = password,
                             .num_connections = 2, .timeout_ms = 1000};
    char err[128];
    lmc_l2_backend *b = lmc_l2_resp_new(&o, err, sizeof err);
    assert_non_null(b);
    return b;
}

/* Stores keys [0, n), checks lookups and byte-exact loads. */
static void round_trip(lmc_l2_backend *b, int n)
{
    uint8_t *buf = malloc(OBJ), *out = malloc(OBJ);
    for (int i = 0; i < n; i++) {
        lmc_object_key k = make_key(i, "org/model");
        uint64_t size = OBJ;
        fill(buf, i);
        assert_int_equal(b->ops->store(b, &k, &buf, &size, 1), OBJ);
    }
    for (int i = 0; i < n; i++) {
        lmc_object_key k = make_key(i, "org/model");
        uint64_t size = OBJ, wrong = OBJ - 1;
        uint8_t found, ok;
        b->ops->lookup_and_lock(b, &k, &size, 1, &found);
        assert_int_equal(found, 1);
        b->ops->lookup_and_lock(b, &k, &wrong, 1, &found);
        assert_int_equal(found, 0);                        /* size must match */
        memset(out, 0, OBJ);
        b->ops->load(b, &k, &out, &size, 1, &ok);
        assert_int_equal(ok, 1);
        fill(buf, i);
        assert_memory_equal(out, buf, OBJ);
        b->ops->load(b, &k, &out, &wrong, 1, &ok);         /* drained, refused */
        assert_int_equal(ok, 0);
    }
    free(buf);
    free(out);
}

static void test_key_slot(void **state)
{
    (void)state;
    assert_int_equal(lmc_resp_key_slot("123456789", 9), 0x31C3 % 16384); /* CRC16 check value */
    assert_int_equal(lmc_resp_key_slot("{user1000}.following", 20),
                     lmc_resp_key_slot("{user1000}.followers", 20));
    assert_int_equal(lmc_resp_key_slot("a{}b", 4), lmc_resp_key_slot("a{}b", 4));
}

/* start_redis's own promise (issue 29): a redis-server that cannot bind,
 * because another Redis holds its port, is reported as failed as soon as
 * it exits, and never taken for the Redis that answers there. */
static void test_a_taken_port_is_not_taken_for_a_ready_redis(void **state)
{
    (void)state;
    int port;
    pid_t other = start_redis_fresh(&port, NULL, NULL);
    assert_true(other > 0);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    assert_int_equal(start_redis(port, NULL, NULL, "/tmp"), -1);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    assert_true(t1.tv_sec - t0.tv_sec < 5);            /* at its exit, not a deadline */
    assert_int_equal(redis_pid_on(port, NULL), other);  /* the other one is untouched */
    stop_redis(other);
}

static void test_single_node_round_trip_and_restart(void **state)
{
    (void)state;
    int port;
    pid_t pid = start_redis_fresh(&port, NULL, NULL);
    assert_true(pid > 0);
    lmc_l2_backend *b = connect_backend(port, "");
    round_trip(b, 12);
    lmc_object_key miss = make_key(999, "org/model");
    uint64_t size = OBJ;
    uint8_t found = 1, ok = 1;
    b->ops->lookup_and_lock(b, &miss, &size, 1, &found);
    assert_int_equal(found, 0);
    uint8_t *buf = malloc(OBJ);
    b->ops->load(b, &miss, &buf, &size, 1, &ok);
    assert_int_equal(ok, 0);
    /* list by model, with the upstream key form */
    json_t *entries = json_array();
    b->ops->list(b, "org/model", entries);
    assert_int_equal(json_array_size(entries), 12);
    json_decref(entries);
    entries = json_array();
    b->ops->list(b, "other", entries);
    assert_int_equal(json_array_size(entries), 0);
    json_decref(entries);
    lmc_object_key k0 = make_key(0, "org/model");
    assert_int_equal(b->ops->remove(b, &k0, 1), 1);
    b->ops->lookup_and_lock(b, &k0, &size, 1, &found);
    assert_int_equal(found, 0);
    /* Redis goes away: operations fail within the timeout, nothing hangs. */
    stop_redis(pid);
    time_t t0 = time(NULL);
    lmc_object_key k1 = make_key(1, "org/model");
    b->ops->load(b, &k1, &buf, &size, 1, &ok);
    assert_int_equal(ok, 0);
    assert_int_equal(b->ops->store(b, &k1, &buf, &size, 1), -1);
    assert_true(time(NULL) - t0 < 10);
    /* ...and comes back: the backend reconnects by itself. */
    pid = start_redis(port, NULL, NULL, "/tmp");
    assert_true(pid > 0);
    round_trip(b, 3);
    json_t *st = b->ops->status(b);
    assert_true(json_integer_value(json_object_get(st, "io_errors")) > 0);
    json_decref(st);
    b->ops->destroy(b);
    free(buf);
    stop_redis(pid);
}

/* Runs one command on a fresh connection; the first reply line in `line`. */
static void redis_command(int port, const resp_arg *args, size_t n, char *line, size_t cap)
{
    resp_conn c;
    lmc_resp_conn_init(&c);
    assert_int_equal(lmc_resp_conn_open(&c, "127.0.0.1", port, 1000), 0);
    assert_int_equal(lmc_resp_send_command(&c, args, n), 0);
    assert_int_equal(lmc_resp_read_line(&c, line, cap), 0);
    lmc_resp_conn_close(&c);
}

static lmc_l2_usage usage_of(lmc_l2_backend *b)
{
    lmc_l2_usage u = {0};
    b->ops->usage(b, &u);
    return u;
}

/* make_key() repeats after 256 keys; these stay distinct up to 65536. */
static lmc_object_key unique_key(int i, const char *model)
{
    lmc_object_key k = make_key(i, model);
    k.chunk_hash[0] = (uint8_t)i;
    k.chunk_hash[1] = (uint8_t)(i >> 8);
    return k;
}

static lmc_l2_backend *backend_with_capacity(int port, uint64_t capacity)
{
    lmc_l2_resp_options o = {.host = "127.0.0.1", .port = port, .num_connections = 2,
                             .timeout_ms = 1000, .capacity_bytes = capacity};
    char err[128];
    lmc_l2_backend *b = lmc_l2_resp_new(&o, err, sizeof err);
    assert_non_null(b);
    return b;
}

/* Usage follows what Redis holds: an overwrite replaces a key's size, a
 * delete subtracts it once, a delete of an absent key changes nothing. */
static void test_usage_follows_overwrites_and_deletes(void **state)
{
    (void)state;
    int port;
    pid_t pid = start_redis_fresh(&port, NULL, NULL);
    assert_true(pid > 0);
    lmc_l2_backend *b = connect_backend(port, "");
    uint8_t *buf = calloc(1, OBJ);
    lmc_object_key k0 = make_key(0, "org/model"), k1 = make_key(1, "org/model");
    uint64_t size = OBJ, half = OBJ / 2;
    assert_int_equal(b->ops->store(b, &k0, &buf, &size, 1), OBJ);
    assert_int_equal(usage_of(b).used_bytes, OBJ);
    assert_int_equal(usage_of(b).num_keys, 1);
    assert_int_equal(b->ops->store(b, &k0, &buf, &size, 1), OBJ);   /* same bytes again */
    assert_int_equal(usage_of(b).used_bytes, OBJ);
    assert_int_equal(b->ops->store(b, &k0, &buf, &half, 1), OBJ / 2); /* a smaller value */
    assert_int_equal(usage_of(b).used_bytes, OBJ / 2);
    assert_int_equal(b->ops->store(b, &k1, &buf, &size, 1), OBJ);
    assert_int_equal(usage_of(b).used_bytes, OBJ / 2 + OBJ);
    assert_int_equal(usage_of(b).num_keys, 2);
    assert_int_equal(b->ops->remove(b, &k0, 1), 1);
    assert_int_equal(usage_of(b).used_bytes, OBJ);
    b->ops->remove(b, &k0, 1);                                       /* already gone */
    lmc_object_key never = make_key(77, "org/model");
    b->ops->remove(b, &never, 1);
    assert_int_equal(usage_of(b).used_bytes, OBJ);
    assert_int_equal(usage_of(b).num_keys, 1);
    assert_int_equal(b->ops->remove(b, &k1, 1), 1);
    assert_int_equal(usage_of(b).used_bytes, 0);
    assert_int_equal(usage_of(b).num_keys, 0);
    b->ops->destroy(b);
    free(buf);
    stop_redis(pid);
}

/* max_capacity_gb: a store that does not fit fails and writes nothing; an
 * overwrite that does not grow the store still succeeds when full. */
static void test_capacity_is_enforced(void **state)
{
    (void)state;
    int port;
    pid_t pid = start_redis_fresh(&port, NULL, NULL);
    assert_true(pid > 0);
    lmc_l2_backend *b = backend_with_capacity(port, 3 * OBJ);
    uint8_t *buf = calloc(1, OBJ);
    uint64_t size = OBJ;
    for (int i = 0; i < 3; i++) {
        lmc_object_key k = make_key(i, "org/model");
        assert_int_equal(b->ops->store(b, &k, &buf, &size, 1), OBJ);
    }
    lmc_object_key k3 = make_key(3, "org/model"), k0 = make_key(0, "org/model");
    assert_int_equal(b->ops->store(b, &k3, &buf, &size, 1), -1);
    uint8_t found = 1;
    b->ops->lookup_and_lock(b, &k3, &size, 1, &found);
    assert_int_equal(found, 0);                                      /* nothing written */
    assert_int_equal(b->ops->store(b, &k0, &buf, &size, 1), OBJ);   /* overwrite fits */
    assert_int_equal(usage_of(b).used_bytes, 3 * OBJ);
    assert_int_equal(usage_of(b).capacity_bytes, 3 * OBJ);
    assert_int_equal(b->ops->remove(b, &k0, 1), 1);
    assert_int_equal(b->ops->store(b, &k3, &buf, &size, 1), OBJ);
    b->ops->destroy(b);
    free(buf);
    stop_redis(pid);
}

/* A new backend over a Redis that already holds objects counts them (and
 * only them: a foreign key is not an object). */
static void test_usage_rebuilt_at_start(void **state)
{
    (void)state;
    int port;
    pid_t pid = start_redis_fresh(&port, NULL, NULL);
    assert_true(pid > 0);
    lmc_l2_backend *b = connect_backend(port, "");
    uint8_t *buf = calloc(1, OBJ);
    enum { N = 2500 }; /* more than one SCAN page */
    for (int i = 0; i < N; i++) {
        lmc_object_key k = unique_key(i, i % 2 ? "org/model" : "other");
        uint64_t size = 100 + (uint64_t)i % 7;
        assert_int_equal(b->ops->store(b, &k, &buf, &size, 1), (int64_t)size);
    }
    b->ops->destroy(b);
    char line[64];
    resp_arg set[3] = {{"SET", 3}, {"foreign", 7}, {"0123456789", 10}};
    redis_command(port, set, 3, line, sizeof line);
    assert_string_equal(line, "+OK");
    uint64_t want = 0;
    for (int i = 0; i < N; i++)
        want += 100 + (uint64_t)i % 7;
    b = backend_with_capacity(port, 1ull << 30);
    assert_int_equal(usage_of(b).used_bytes, want);
    assert_int_equal(usage_of(b).num_keys, N);
    lmc_object_key k0 = unique_key(0, "other");                      /* 100 bytes */
    uint64_t size = OBJ;
    assert_int_equal(b->ops->store(b, &k0, &buf, &size, 1), OBJ);   /* known: replaced */
    assert_int_equal(usage_of(b).used_bytes, want - 100 + OBJ);
    assert_int_equal(b->ops->remove(b, &k0, 1), 1);
    assert_int_equal(usage_of(b).used_bytes, want - 100);
    b->ops->destroy(b);
    free(buf);
    stop_redis(pid);
}

static void test_auth(void **state)
{
    (void)state;
    int port;
    pid_t pid = start_redis_fresh(&port, "--requirepass", "s3cret");
    assert_true(pid > 0);
    lmc_l2_backend *good = connect_backend(port, "s3cret");
    round_trip(good, 2);
    good->ops->destroy(good);
    lmc_l2_backend *bad = connect_backend(port, "wrong");
    lmc_object_key k = make_key(0, "org/model");
    uint64_t size = OBJ;
    uint8_t found = 1;
    bad->ops->lookup_and_lock(bad, &k, &size, 1, &found);
    assert_int_equal(found, 0);
    bad->ops->destroy(bad);
    stop_redis(pid);
}

/* docs/l2.md, "Health": the probe says why in the words an operator
 * searches for. */
static void test_probe_reasons(void **state)
{
    (void)state;
    char why[512];
    int port;
    pid_t pid = start_redis_fresh(&port, "--requirepass", "s3cret");
    assert_true(pid > 0);
    lmc_l2_backend *good = connect_backend(port, "s3cret");
    assert_int_equal(good->ops->probe(good, why, sizeof why), 0);
    lmc_l2_backend *wrong = connect_backend(port, "wrong");
    assert_int_equal(wrong->ops->probe(wrong, why, sizeof why), -1);
    assert_non_null(strstr(why, "AUTH refused: -WRONGPASS"));
    lmc_l2_backend *none = connect_backend(port, "");
    assert_int_equal(none->ops->probe(none, why, sizeof why), -1);
    assert_non_null(strstr(why, "PING answered -NOAUTH"));
    stop_redis(pid);
    char want[64];
    snprintf(want, sizeof want, "127.0.0.1:%d: connect: Connection refused", port);
    assert_int_equal(good->ops->probe(good, why, sizeof why), -1);
    assert_string_equal(why, want);
    good->ops->destroy(good);
    wrong->ops->destroy(wrong);
    none->ops->destroy(none);
}

static void test_cluster_routing(void **state)
{
    (void)state;
    char dir[] = "/tmp/lmc-redis-cluster-XXXXXX";
    assert_non_null(mkdtemp(dir));
    pid_t pids[3];
    int port = -1;
    /* Three nodes on ports picked now; all three on fresh ports when one of
     * them was taken between the pick and its node's bind (each attempt in
     * fresh directories: a node keeps its cluster state in its own). */
    for (int attempt = 0; attempt < 5 && port < 0; attempt++) {
        port = pick_ports(3, true);
        for (int i = 0; i < 3 && port > 0; i++) {
            char sub[600];
            snprintf(sub, sizeof sub, "%s/a%d-n%d", dir, attempt, i);
            assert_int_equal(mkdir(sub, 0700), 0);
            pids[i] = start_redis(port + i, "--cluster-enabled", "yes", sub);
            if (pids[i] <= 0) {
                while (i-- > 0)
                    stop_redis(pids[i]);
                port = -1;
            }
        }
    }
    assert_true(port > 0);
    char cmd[512];
    int n = snprintf(cmd, sizeof cmd, "redis-cli --cluster create");
    for (int i = 0; i < 3; i++)
        n += snprintf(cmd + n, sizeof cmd - (size_t)n, " 127.0.0.1:%d", port + i);
    snprintf(cmd + n, sizeof cmd - (size_t)n, " --cluster-replicas 0 --cluster-yes >/dev/null 2>&1");
    /* Seeded with one node before the cluster has slots: the layout can only
     * be learned from MOVED replies. */
    lmc_l2_backend *b = connect_backend(port, "");
    assert_int_equal(system(cmd), 0);
    /* Wait until every node agrees the cluster is up. */
    char check[128];
    snprintf(check, sizeof check,
             "redis-cli -p %d cluster info | grep -q 'cluster_state:ok'", port + 2);
    for (int i = 0; i < 100 && system(check) != 0; i++)
        usleep(100000);
    round_trip(b, 40);
    json_t *st = b->ops->status(b);
    assert_true(json_integer_value(json_object_get(st, "cluster_redirects")) > 0);
    assert_int_equal(json_array_size(json_object_get(st, "nodes")), 3);
    json_decref(st);
    json_t *entries = json_array();
    b->ops->list(b, "org/model", entries);
    assert_int_equal(json_array_size(entries), 40);  /* every node was scanned */
    json_decref(entries);
    assert_int_equal(usage_of(b).used_bytes, 40 * OBJ);
    b->ops->destroy(b);
    /* A fresh start learns the layout (CLUSTER NODES) and counts every node. */
    b = connect_backend(port + 1, "");
    assert_int_equal(usage_of(b).used_bytes, 40 * OBJ);
    assert_int_equal(usage_of(b).num_keys, 40);
    round_trip(b, 40);                                /* overwrites: nothing added */
    assert_int_equal(usage_of(b).used_bytes, 40 * OBJ);
    st = b->ops->status(b);
    assert_int_equal(json_integer_value(json_object_get(st, "cluster_redirects")), 0);
    assert_int_equal(json_array_size(json_object_get(st, "nodes")), 3);
    json_decref(st);
    b->ops->destroy(b);
    for (int i = 0; i < 3; i++)
        stop_redis(pids[i]);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
}

/* ---- issue 18: the parts of one adapter task ------------------------------ */

#define BIG (1u << 20)  /* the adapter's parts are at most 1 MiB: one key a part */
#define PARTS 4

/* An arena of 2 * PARTS * 2 slots of BIG bytes: sources first, then loads. */
typedef struct {
    uint8_t *arena;
    uint64_t src[2 * PARTS], dst[2 * PARTS], sizes[2 * PARTS];
} arena_fx;

static arena_fx *arena_new(void)
{
    arena_fx *f = calloc(1, sizeof *f);
    f->arena = malloc(4u * PARTS * BIG);
    assert_non_null(f->arena);
    for (size_t i = 0; i < 2 * PARTS; i++) {
        f->src[i] = i * BIG;
        f->dst[i] = (2 * PARTS + i) * BIG;
        f->sizes[i] = BIG;
        for (size_t b = 0; b < BIG; b += 4096)
            f->arena[f->src[i] + b] = (uint8_t)(i * 17 + b / 4096);
    }
    return f;
}

static void arena_free(arena_fx *f)
{
    free(f->arena);
    free(f);
}

static lmc_l2_backend *parts_backend(int port, const char *user, const char *pass,
                                     uint64_t capacity)
{
    lmc_l2_resp_options o = {.host = "127.0.0.1", .port = port, .username = user,
                             .password = pass, .num_connections = PARTS, .timeout_ms = 2000,
                             .capacity_bytes = capacity};
    char err[128];
    lmc_l2_backend *b = lmc_l2_resp_new(&o, err, sizeof err);
    assert_non_null(b);
    return b;
}

static int64_t adapter_store(lmc_l2_adapter *a, arena_fx *f, const lmc_object_key *keys,
                             size_t from, size_t n)
{
    uint64_t id = lmc_l2_adapter_submit_store(a, keys, f->src + from, f->sizes, n), got;
    int64_t r;
    assert_true(id > 0);
    for (int i = 0; i < 3000; i++) {
        if (lmc_l2_adapter_pop_completed_store(a, &got, &r)) {
            assert_int_equal(got, id);
            return r;
        }
        usleep(2000);
    }
    fail_msg("store task did not complete");
    return -1;
}

static void adapter_load(lmc_l2_adapter *a, arena_fx *f, const lmc_object_key *keys, size_t n,
                         uint8_t *ok)
{
    uint64_t id = lmc_l2_adapter_submit_load(a, keys, f->dst, f->sizes, n);
    assert_true(id > 0);
    for (int i = 0; i < 3000; i++) {
        if (lmc_l2_adapter_query_load(a, id, ok))
            return;
        usleep(2000);
    }
    fail_msg("load task did not complete");
}

static json_int_t max_parts(lmc_l2_adapter *a)
{
    json_t *st = lmc_l2_adapter_status(a);
    json_int_t v = json_integer_value(json_object_get(st, "max_parts_in_flight"));
    json_decref(st);
    return v;
}

/* Stores keys[first..first+n) (overwrites, so usage does not move) until
 * two parts of one task were seen in flight at once, at most five times:
 * whether the workers overlap in one round depends on how a loaded
 * machine schedules them, but an adapter that runs the parts one by one
 * never shows two and still fails the caller's check. */
static void store_until_parts_overlap(lmc_l2_adapter *a, arena_fx *f,
                                      const lmc_object_key *keys, size_t first, size_t n)
{
    for (int round = 0; round < 5 && (round == 0 || max_parts(a) < 2); round++)
        assert_int_equal(adapter_store(a, f, keys, first, n), (int64_t)n * (int64_t)BIG);
}

/* STRLEN of one key on a fresh connection of the default user. */
static int64_t redis_strlen(int port, const lmc_object_key *k)
{
    char key[1024], line[64];
    int kl = lmc_object_key_to_string(k, key, sizeof key);
    resp_arg args[2] = {{"STRLEN", 6}, {key, (size_t)kl}};
    redis_command(port, args, 2, line, sizeof line);
    int64_t v = -1;
    assert_true(line[0] == ':' && lmc_resp_parse_int(line, &v));
    return v;
}

/* One task's keys run on every worker at once: the stores overlap, and the
 * loads of a prompt meet at a gate that opens only when PARTS of them are
 * inside.  A chunk deleted from the middle is a miss; the ones after it
 * still load (the prefetch keeps the leading run, test_l2_controllers). */
static void test_parts_of_one_task_run_in_parallel(void **state)
{
    (void)state;
    int port;
    pid_t pid = start_redis_fresh(&port, NULL, NULL);
    assert_true(pid > 0);
    arena_fx *f = arena_new();
    lmc_object_key keys[2 * PARTS];
    for (int i = 0; i < 2 * PARTS; i++)
        keys[i] = make_key(i, "org/model");
    lmc_l2_adapter *a = lmc_l2_adapter_new(parts_backend(port, "", "", 0), f->arena, PARTS);
    store_until_parts_overlap(a, f, keys, 0, 2 * PARTS);
    assert_true(max_parts(a) >= 2);
    lmc_l2_adapter_close(a);
    char line[64];
    char key1[1024];
    int kl = lmc_object_key_to_string(&keys[1], key1, sizeof key1);
    resp_arg del[2] = {{"DEL", 3}, {key1, (size_t)kl}};
    redis_command(port, del, 2, line, sizeof line);
    assert_string_equal(line, ":1");
    gate *g;
    a = lmc_l2_adapter_new(gate_new(parts_backend(port, "", "", 0), PARTS, -1, &g), f->arena,
                           PARTS);
    uint8_t ok[PARTS];
    adapter_load(a, f, keys, PARTS, ok);
    assert_memory_equal(ok, ((uint8_t[]){1, 0, 1, 1}), PARTS);
    for (size_t i = 0; i < PARTS; i++) {
        if (i != 1)
            assert_memory_equal(f->arena + f->dst[i], f->arena + f->src[i], BIG);
    }
    assert_int_equal(gate_max_inside(g), PARTS);
    assert_int_equal(max_parts(a), PARTS);
    lmc_l2_adapter_close(a);
    arena_free(f);
    stop_redis(pid);
}

/* The capacity check covers the whole batch even when its parts run on
 * several workers: a batch that does not fit writes nothing at all. */
static void test_split_store_over_capacity_writes_nothing(void **state)
{
    (void)state;
    int port;
    pid_t pid = start_redis_fresh(&port, NULL, NULL);
    assert_true(pid > 0);
    arena_fx *f = arena_new();
    lmc_object_key keys[PARTS + 1];
    for (int i = 0; i <= PARTS; i++)
        keys[i] = make_key(i, "org/model");
    lmc_l2_adapter *a = lmc_l2_adapter_new(parts_backend(port, "", "", (PARTS - 1) * BIG),
                                           f->arena, PARTS);
    assert_int_equal(adapter_store(a, f, keys, 0, PARTS), -1);
    char line[64];
    resp_arg dbsize = {"DBSIZE", 6};
    redis_command(port, &dbsize, 1, line, sizeof line);
    assert_string_equal(line, ":0");
    lmc_l2_usage u;
    lmc_l2_adapter_usage(a, &u);
    assert_int_equal(u.used_bytes, 0);
    store_until_parts_overlap(a, f, keys, 0, PARTS - 1);
    assert_true(max_parts(a) >= 2);
    assert_int_equal(adapter_store(a, f, keys + PARTS, PARTS, 1), -1);
    redis_command(port, &dbsize, 1, line, sizeof line);
    assert_int_equal(atoi(line + 1), PARTS - 1);
    lmc_l2_adapter_close(a);
    arena_free(f);
    stop_redis(pid);
}

/* One part of a split store fails (Redis refuses the key to this user):
 * the other parts write theirs, usage counts exactly what Redis holds, and
 * the room reserved for the failed key is free again. */
static void test_split_store_with_a_failing_part_keeps_usage_exact(void **state)
{
    (void)state;
    int port;
    pid_t pid = start_redis_fresh(&port, NULL, NULL);
    assert_true(pid > 0);
    char line[128];
    resp_arg acl[7] = {{"ACL", 3}, {"SETUSER", 7}, {"lmc", 3}, {"on", 2}, {">pw", 3},
                       {"~org/model@*", 12}, {"+@all", 5}};
    redis_command(port, acl, 7, line, sizeof line);
    assert_string_equal(line, "+OK");
    arena_fx *f = arena_new();
    lmc_object_key keys[2 * PARTS];
    for (int i = 0; i < 2 * PARTS; i++)
        keys[i] = make_key(i, i == 2 ? "other/model" : "org/model");
    lmc_l2_adapter *a = lmc_l2_adapter_new(parts_backend(port, "lmc", "pw", 2 * (PARTS - 1) * BIG),
                                           f->arena, PARTS);
    assert_int_equal(adapter_store(a, f, keys, 0, PARTS), -1);
    uint64_t held = 0;
    for (int i = 0; i < PARTS; i++)
        held += (uint64_t)redis_strlen(port, &keys[i]);
    lmc_l2_usage u;
    lmc_l2_adapter_usage(a, &u);
    assert_int_equal(u.used_bytes, held);
    assert_int_equal(held, (PARTS - 1) * (uint64_t)BIG);  /* every other part wrote */
    assert_int_equal(u.num_keys, PARTS - 1);
    /* Exactly PARTS - 1 objects of room are left: none stayed reserved. */
    assert_int_equal(adapter_store(a, f, keys + PARTS, PARTS, PARTS - 1),
                     (PARTS - 1) * (int64_t)BIG);
    assert_int_equal(adapter_store(a, f, keys + 2 * PARTS - 1, 2 * PARTS - 1, 1), -1);
    lmc_l2_adapter_usage(a, &u);
    assert_int_equal(u.used_bytes, 2 * (PARTS - 1) * (uint64_t)BIG);
    lmc_l2_adapter_close(a);
    arena_free(f);
    stop_redis(pid);
}

int main(void)
{
    if (system("command -v redis-server >/dev/null && command -v redis-cli >/dev/null") != 0) {
        fprintf(stderr, "redis-server/redis-cli missing: apt-get install redis-server\n");
        return 1;
    }
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_key_slot),
        cmocka_unit_test_teardown(test_a_taken_port_is_not_taken_for_a_ready_redis,
                                  stop_leftovers),
        cmocka_unit_test_teardown(test_single_node_round_trip_and_restart, stop_leftovers),
        cmocka_unit_test_teardown(test_usage_follows_overwrites_and_deletes, stop_leftovers),
        cmocka_unit_test_teardown(test_capacity_is_enforced, stop_leftovers),
        cmocka_unit_test_teardown(test_usage_rebuilt_at_start, stop_leftovers),
        cmocka_unit_test_teardown(test_auth, stop_leftovers),
        cmocka_unit_test_teardown(test_probe_reasons, stop_leftovers),
        cmocka_unit_test_teardown(test_cluster_routing, stop_leftovers),
        cmocka_unit_test_teardown(test_parts_of_one_task_run_in_parallel, stop_leftovers),
        cmocka_unit_test_teardown(test_split_store_over_capacity_writes_nothing, stop_leftovers),
        cmocka_unit_test_teardown(test_split_store_with_a_failing_part_keeps_usage_exact,
                                  stop_leftovers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
