/* The resp backend against real redis-server processes started here: one
 * plain, one with a password, and a three-node Redis Cluster. */
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

#include "ports.h"
#include "storage/l2/l2_resp.h"
#include "storage/l2/l2_resp_conn.h"

#define OBJ 70000 /* > the connection buffer: payloads go straight to the caller */


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
    /* Ready when it answers PING. */
    for (int i = 0; i < 200; i++) {
        resp_conn c;
        resp_conn_init(&c);
        if (resp_conn_open(&c, "127.0.0.1", port, 500) == 0) {
            resp_arg ping = {"PING", 4};
            char line[64];
            int ok = resp_send_command(&c, &ping, 1) == 0 &&
                     resp_read_line(&c, line, sizeof line) == 0;
            resp_conn_close(&c);
            if (ok)
                return pid;
        }
        usleep(25000);
    }
    return -1;
}

static void stop_redis(pid_t pid)
{
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
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

static void test_single_node_round_trip_and_restart(void **state)
{
    (void)state;
    int port = pick_ports(1, false);
    pid_t pid = start_redis(port, NULL, NULL, "/tmp");
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

static void test_auth(void **state)
{
    (void)state;
    int port = pick_ports(1, false);
    pid_t pid = start_redis(port, "--requirepass", "s3cret", "/tmp");
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

static void test_cluster_routing(void **state)
{
    (void)state;
    int port = pick_ports(3, true);
    char dir[] = "/tmp/lmc-redis-cluster-XXXXXX";
    assert_non_null(mkdtemp(dir));
    pid_t pids[3];
    char cmd[512];
    int n = snprintf(cmd, sizeof cmd, "redis-cli --cluster create");
    for (int i = 0; i < 3; i++) {
        char sub[600], conf[64];
        snprintf(sub, sizeof sub, "%s/n%d", dir, i);
        snprintf(conf, sizeof conf, "--cluster-config-file nodes-%d.conf", i);
        assert_int_equal(mkdir(sub, 0700), 0);
        pids[i] = start_redis(port + i, "--cluster-enabled", "yes", sub);
        assert_true(pids[i] > 0);
        n += snprintf(cmd + n, sizeof cmd - (size_t)n, " 127.0.0.1:%d", port + i);
    }
    snprintf(cmd + n, sizeof cmd - (size_t)n, " --cluster-replicas 0 --cluster-yes >/dev/null 2>&1");
    assert_int_equal(system(cmd), 0);
    /* Wait until every node agrees the cluster is up. */
    char check[128];
    snprintf(check, sizeof check,
             "redis-cli -p %d cluster info | grep -q 'cluster_state:ok'", port + 2);
    for (int i = 0; i < 100 && system(check) != 0; i++)
        usleep(100000);
    lmc_l2_backend *b = connect_backend(port, ""); /* seeded with one node only */
    round_trip(b, 40);
    json_t *st = b->ops->status(b);
    assert_true(json_integer_value(json_object_get(st, "cluster_redirects")) > 0);
    assert_int_equal(json_array_size(json_object_get(st, "nodes")), 3);
    json_decref(st);
    json_t *entries = json_array();
    b->ops->list(b, "org/model", entries);
    assert_int_equal(json_array_size(entries), 40);  /* every node was scanned */
    json_decref(entries);
    b->ops->destroy(b);
    for (int i = 0; i < 3; i++)
        stop_redis(pids[i]);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
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
        cmocka_unit_test(test_single_node_round_trip_and_restart),
        cmocka_unit_test(test_auth),
        cmocka_unit_test(test_cluster_routing),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
