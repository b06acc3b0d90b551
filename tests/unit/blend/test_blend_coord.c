/* The client of the coordinator's fleet fragment index (docs/cacheblend.md,
 * "Coordinator directory") against the real lmcached-coordinator of this
 * build (LMCACHED_COORDINATOR_BIN, else next to this test): matches of
 * what a cache event stored, an idempotent submit, take, the bound on
 * outstanding requests, any failure an empty answer, the deadline. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <libgen.h>
#include <limits.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "fleet/http_client.h"
#include "modules/blend/blend_coord.h"

static pid_t coord_pid;
static int coord_port;
static char coord_url[64], db_dir[64];

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* A port nothing listens on now (bound and let go). */
static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &len), 0);
    close(fd);
    return ntohs(a.sin_port);
}

static long call(const char *method, const char *path, const char *body, lmc_fleet_reply *r)
{
    char url[128];
    snprintf(url, sizeof url, "%s%s", coord_url, path);
    lmc_fleet_request rq = {.method = method, .url = url, .body = body,
                            .body_len = body ? strlen(body) : 0, .timeout_s = 5};
    return lmc_fleet_http(&rq, r) == 0 ? r->status : 0;
}

static void coordinator_path(char *out, size_t len)
{
    const char *env = getenv("LMCACHED_COORDINATOR_BIN");
    if (env && *env) {
        snprintf(out, len, "%s", env);
        return;
    }
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    assert_true(n > 0);
    self[n] = '\0';
    snprintf(out, len, "%s/lmcached-coordinator", dirname(self));
}

static int start_coordinator(void **state)
{
    (void)state;
    char bin[PATH_MAX + 32], env_port[64], env_db[128];
    coordinator_path(bin, sizeof bin);
    if (access(bin, X_OK) != 0)
        fail_msg("no lmcached-coordinator at %s (set LMCACHED_COORDINATOR_BIN)", bin);
    snprintf(db_dir, sizeof db_dir, "/tmp/blend_coord_XXXXXX");
    assert_non_null(mkdtemp(db_dir));
    coord_port = free_port();
    snprintf(coord_url, sizeof coord_url, "http://127.0.0.1:%d", coord_port);
    snprintf(env_port, sizeof env_port, "LMCACHE_MP_COORDINATOR_PORT=%d", coord_port);
    snprintf(env_db, sizeof env_db, "LMCACHE_MP_COORDINATOR_DB_PATH=%s/c.db", db_dir);
    char *envp[] = {env_port, env_db, "LMCACHE_MP_COORDINATOR_HOST=127.0.0.1",
                    "LMCACHE_MP_COORDINATOR_ENABLE_STARTUP_RESYNC=false",
                    "LMCACHE_MP_COORDINATOR_ENABLE_BLEND_LOOKUP=true",
                    "LMCACHE_MP_COORDINATOR_CHUNK_SIZE=4", NULL};
    coord_pid = fork();
    if (coord_pid == 0) {
        execle(bin, bin, (char *)NULL, envp);
        _exit(127);
    }
    lmc_fleet_reply *r = malloc(sizeof *r);
    for (int i = 0; i < 200 && call("GET", "/healthcheck", NULL, r) != 200; i++)
        sleep_ms(25);
    assert_int_equal(call("GET", "/healthcheck", NULL, r), 200);
    /* Chunk 0xab.. of model m, world size 1, holds 1 2 3 4, stored at 8. */
    const char *events =
        "{\"batches\":[{\"instance_id\":\"a\",\"incarnation\":1,\"seq\":1,\"event_type\":"
        "\"store\",\"tier\":\"l2\",\"backend\":\"fs\",\"shared\":true,\"ts\":1,\"entries\":[{"
        "\"key\":{\"chunk_hash_hex\":\"abab\",\"model_name\":\"m\",\"kv_rank\":16777472,"
        "\"object_group_id\":0,\"cache_salt\":\"\"},\"size_bytes\":1,"
        "\"token_ids\":[1,2,3,4],\"token_offset\":8}]}]}";
    assert_int_equal(call("POST", "/events", events, r), 200);
    free(r);
    return 0;
}

static int stop_coordinator(void **state)
{
    (void)state;
    kill(coord_pid, SIGTERM);
    int status;
    waitpid(coord_pid, &status, 0);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", db_dir);
    return system(cmd) == 0 ? 0 : -1;
}

static lmc_blend_coord *client(const char *url, double timeout_s, size_t max_outstanding)
{
    lmc_blend_coord_opts o = {.url = url, .timeout_s = timeout_s, .concurrency = 2,
                              .max_outstanding = max_outstanding};
    char err[200];
    lmc_blend_coord *c = lmc_blend_coord_new(&o, err, sizeof err);
    if (!c)
        fail_msg("%s", err);
    return c;
}

/* Polls until DONE (at most 5 s); the matches. */
static lmc_blend_coord_match *wait_done(lmc_blend_coord *c, const char *rid, size_t *n)
{
    lmc_blend_coord_match *m = NULL;
    for (int i = 0; i < 500; i++) {
        lmc_blend_coord_state st = lmc_blend_coord_poll(c, rid, &m, n);
        if (st == LMC_BLEND_COORD_DONE)
            return m;
        assert_int_equal(st, LMC_BLEND_COORD_PENDING);
        sleep_ms(10);
    }
    fail_msg("%s: not done within 5 s", rid);
    return NULL;
}

static const uint64_t QUERY[] = {9, 9, 1, 2, 3, 4, 9};

static void test_matches_of_a_stored_chunk(void **state)
{
    (void)state;
    lmc_blend_coord *c = client(coord_url, 5.0, 8);
    assert_int_equal(lmc_blend_coord_submit(c, "r1", QUERY, 7, "m", 1, NULL), 0);
    size_t n;
    lmc_blend_coord_match *m = wait_done(c, "r1", &n);
    assert_int_equal(n, 1);
    assert_int_equal(m[0].hash_len, 2);
    assert_int_equal(m[0].hash[0], 0xab);
    assert_int_equal(m[0].old_st, 8);
    assert_int_equal(m[0].cur_st, 2);
    free(m);
    /* Idempotent per id: the same id with other tokens is the first request. */
    assert_int_equal(lmc_blend_coord_submit(c, "r1", QUERY, 2, "m", 1, NULL), 0);
    m = wait_done(c, "r1", &n);
    assert_int_equal(n, 1);
    free(m);
    /* Another namespace finds nothing; take forgets. */
    assert_int_equal(lmc_blend_coord_submit(c, "r2", QUERY, 7, "m", 2, NULL), 0);
    m = wait_done(c, "r2", &n);
    assert_int_equal(n, 0);
    assert_null(m);
    lmc_blend_coord_take(c, "r1");
    assert_int_equal(lmc_blend_coord_poll(c, "r1", &m, &n), LMC_BLEND_COORD_UNKNOWN);
    lmc_blend_coord_free(c);
}

/* At most max_outstanding requests are known; take makes room. */
static void test_outstanding_bound(void **state)
{
    (void)state;
    lmc_blend_coord *c = client(coord_url, 5.0, 1);
    assert_int_equal(lmc_blend_coord_submit(c, "a", QUERY, 7, "m", 1, ""), 0);
    assert_int_equal(lmc_blend_coord_submit(c, "b", QUERY, 7, "m", 1, ""), -1);
    lmc_blend_coord_take(c, "a");
    assert_int_equal(lmc_blend_coord_submit(c, "b", QUERY, 7, "m", 1, ""), 0);
    lmc_blend_coord_free(c); /* with "b" maybe in flight */
}

/* No coordinator there, a token past 32 bits, an error status: each an
 * empty answer, never an error to the caller. */
static void test_failures_answer_empty(void **state)
{
    (void)state;
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d", free_port());
    lmc_blend_coord *c = client(url, 2.0, 8);
    size_t n;
    assert_int_equal(lmc_blend_coord_submit(c, "x", QUERY, 7, "m", 1, ""), 0);
    assert_null(wait_done(c, "x", &n));
    assert_int_equal(n, 0);
    lmc_blend_coord_free(c);
    c = client(coord_url, 2.0, 8);
    const uint64_t big[4] = {1, 2, 3, (uint64_t)1 << 32};
    assert_int_equal(lmc_blend_coord_submit(c, "big", big, 4, "m", 1, ""), 0);
    assert_null(wait_done(c, "big", &n));
    assert_int_equal(lmc_blend_coord_submit(c, "400", QUERY, 7, "m", 0, ""), 0); /* world size 0 */
    assert_null(wait_done(c, "400", &n));
    assert_int_equal(n, 0);
    lmc_blend_coord_free(c);
}

/* A coordinator that accepts the connection and never answers: PENDING
 * until the deadline, then DONE with nothing. */
static void test_deadline(void **state)
{
    (void)state;
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(listen(fd, 8), 0);
    assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &len), 0);
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d", ntohs(a.sin_port));
    lmc_blend_coord *c = client(url, 0.3, 8);
    assert_int_equal(lmc_blend_coord_submit(c, "slow", QUERY, 7, "m", 1, ""), 0);
    lmc_blend_coord_match *m;
    size_t n;
    sleep_ms(100);
    assert_int_equal(lmc_blend_coord_poll(c, "slow", &m, &n), LMC_BLEND_COORD_PENDING);
    sleep_ms(300);
    assert_int_equal(lmc_blend_coord_poll(c, "slow", &m, &n), LMC_BLEND_COORD_DONE);
    assert_int_equal(n, 0);
    lmc_blend_coord_free(c);
    close(fd);
}

static void test_env_and_options(void **state)
{
    (void)state;
    double t;
    unsigned k;
    char err[200];
    unsetenv("LMCACHE_COORDINATOR_BLEND_TIMEOUT");
    unsetenv("LMCACHE_COORDINATOR_BLEND_MATCH_CONCURRENCY");
    assert_int_equal(lmc_blend_coord_env(&t, &k, err, sizeof err), 0);
    assert_true(t == 1.0 && k == 8);
    setenv("LMCACHE_COORDINATOR_BLEND_TIMEOUT", "0.25", 1);
    setenv("LMCACHE_COORDINATOR_BLEND_MATCH_CONCURRENCY", "3", 1);
    assert_int_equal(lmc_blend_coord_env(&t, &k, err, sizeof err), 0);
    assert_true(t == 0.25 && k == 3);
    setenv("LMCACHE_COORDINATOR_BLEND_TIMEOUT", "-1", 1);
    assert_int_equal(lmc_blend_coord_env(&t, &k, err, sizeof err), -1);
    assert_non_null(strstr(err, "LMCACHE_COORDINATOR_BLEND_TIMEOUT"));
    setenv("LMCACHE_COORDINATOR_BLEND_TIMEOUT", "1", 1);
    setenv("LMCACHE_COORDINATOR_BLEND_MATCH_CONCURRENCY", "0", 1);
    assert_int_equal(lmc_blend_coord_env(&t, &k, err, sizeof err), -1);
    assert_non_null(strstr(err, "LMCACHE_COORDINATOR_BLEND_MATCH_CONCURRENCY"));
    unsetenv("LMCACHE_COORDINATOR_BLEND_TIMEOUT");
    unsetenv("LMCACHE_COORDINATOR_BLEND_MATCH_CONCURRENCY");
    lmc_blend_coord_opts o = {.url = "", .timeout_s = 1, .concurrency = 1, .max_outstanding = 1};
    assert_null(lmc_blend_coord_new(&o, err, sizeof err));
    o.url = "http://x", o.concurrency = 65;
    assert_null(lmc_blend_coord_new(&o, err, sizeof err));
    assert_non_null(strstr(err, "CONCURRENCY"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matches_of_a_stored_chunk),
        cmocka_unit_test(test_outstanding_bound),
        cmocka_unit_test(test_failures_answer_empty),
        cmocka_unit_test(test_deadline),
        cmocka_unit_test(test_env_and_options),
    };
    return cmocka_run_group_tests(tests, start_coordinator, stop_coordinator);
}
