/* The s3 backend: SigV4 against AWS's published examples, and real round
 * trips and usage accounting (issue 17) against a local S3 endpoint
 * started here: moto_server as `make deps-test` installs it
 * (build-tools/venv/), behind a proxy that verifies SigV4 signatures
 * (tests/s3server/sigv4_proxy.py).  Without it, these tests fail under
 * CI=true and are skipped elsewhere.  Issue 18: the
 * parts of one adapter task run in parallel. */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <sys/socket.h>
#include <time.h>
#include <cmocka.h>
#include <curl/curl.h>

#include "gate_backend.h"
#include "ports.h"
#include "storage/l2/adapters/l2_s3.h"

#define AK "AKIAIOSFODNN7EXAMPLE"
#define SK "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
#define EMPTY_SHA "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"

/* AWS SigV4 documentation, "GET Object" example. */
static void test_sigv4_get_object_example(void **state)
{
    (void)state;
    lmc_s3_header h[] = {{"host", "examplebucket.s3.amazonaws.com"},
                         {"range", "bytes=0-9"},
                         {"x-amz-content-sha256", EMPTY_SHA},
                         {"x-amz-date", "20130524T000000Z"}};
    char auth[512];
    assert_int_equal(lmc_s3_authorization("GET", "/test.txt", "", h, 4, EMPTY_SHA, AK, SK,
                                          "us-east-1", "20130524T000000Z", auth, sizeof auth),
                     0);
    assert_string_equal(auth,
                        "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/"
                        "aws4_request, SignedHeaders=host;range;x-amz-content-sha256;x-amz-date, "
                        "Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41");
}

/* AWS SigV4 documentation, "GET Bucket (List Objects)" example. */
static void test_sigv4_list_objects_example(void **state)
{
    (void)state;
    lmc_s3_header h[] = {{"host", "examplebucket.s3.amazonaws.com"},
                         {"x-amz-content-sha256", EMPTY_SHA},
                         {"x-amz-date", "20130524T000000Z"}};
    char auth[512];
    assert_int_equal(lmc_s3_authorization("GET", "/", "max-keys=2&prefix=J", h, 3, EMPTY_SHA, AK,
                                          SK, "us-east-1", "20130524T000000Z", auth, sizeof auth),
                     0);
    assert_non_null(strstr(auth, "Signature=34b48302e7b5fa45bde8084f4b7868a86f0a534bc59db6670ed5711ef69dc6f7"));
}

static void test_uri_encoding(void **state)
{
    (void)state;
    char out[128];
    assert_int_equal(lmc_s3_uri_encode("org/m@0000ab@0@ff", 17, true, out, sizeof out), 23);
    assert_string_equal(out, "org/m%400000ab%400%40ff");
    lmc_s3_uri_encode("a b/ü~", strlen("a b/ü~"), false, out, sizeof out);
    assert_string_equal(out, "a%20b%2F%C3%BC~");
    assert_int_equal(lmc_s3_uri_encode("abcdef", 6, true, out, 4), -1);
}


typedef struct {
    pid_t pid, proxy;
    char endpoint[64];             /* the SigV4-checking proxy's */
    const char *access, *secret;   /* credentials the server accepts */
} s3_server;

/* A file of this checkout (tests/s3server/README.md): the repository root
 * is what this file's path has before tests/unit/. */
static bool repo_file(const char *rel, char *out, size_t cap)
{
    const char *at = strstr(__FILE__, "tests/unit/storage_l2/");
    if (!at)
        return false;
    snprintf(out, cap, "%.*s%s", (int)(at - __FILE__), __FILE__, rel);
    return access(out, R_OK) == 0;
}

/* moto_server as `make deps-test` installs it (build-tools/venv/), or
 * what LMC_MOTO_SERVER names. */
static bool moto_server_path(char *out, size_t cap)
{
    const char *env = getenv("LMC_MOTO_SERVER");
    if (env && *env) {
        snprintf(out, cap, "%s", env);
        return access(out, X_OK) == 0;
    }
    return repo_file("build-tools/venv/bin/moto_server", out, cap) && access(out, X_OK) == 0;
}

static bool wait_http(int port, pid_t pid)
{
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d/", port);
    for (int i = 0; i < 300; i++) { /* ready when it answers HTTP */
        if (waitpid(pid, NULL, WNOHANG) == pid)
            return false;
        CURL *c = curl_easy_init();
        curl_easy_setopt(c, CURLOPT_URL, url);
        curl_easy_setopt(c, CURLOPT_NOBODY, 1L);
        curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, 500L);
        CURLcode rc = curl_easy_perform(c);
        curl_easy_cleanup(c);
        if (rc == CURLE_OK)
            return true;
        usleep(50000);
    }
    return false;
}

static pid_t spawn(const char *const *argv)
{
    pid_t pid = fork();
    if (pid == 0) {
        freopen("/dev/null", "w", stdout);
        freopen("/dev/null", "w", stderr);
        execvp(argv[0], (char *const *)argv);
        _exit(127);
    }
    return pid;
}

/* tests/s3server/sigv4_proxy.py in front of the server on `upstream`:
 * moto_server does not verify SigV4 signatures. */
static void start_proxy(s3_server *s, int upstream)
{
    char proxy[1024], port[16], up[16];
    int p = pick_ports(1, false);
    snprintf(port, sizeof port, "%d", p);
    snprintf(up, sizeof up, "%d", upstream);
    snprintf(s->endpoint, sizeof s->endpoint, "http://127.0.0.1:%d", p);
    assert_true(repo_file("tests/s3server/sigv4_proxy.py", proxy, sizeof proxy));
    const char *argv[] = {"python3", proxy, port, up, s->access, s->secret, NULL};
    s->proxy = spawn(argv);
    assert_true(s->proxy > 0 && wait_http(p, s->proxy));
}

/* Starts moto_server (S3 in memory; it takes any credentials, the proxy
 * holds lmcached to these) behind the proxy; false when it is not
 * installed. */
static bool start_s3(s3_server *s)
{
    char moto[1024], port[16];
    int p = pick_ports(1, false);
    snprintf(port, sizeof port, "%d", p);
    if (!moto_server_path(moto, sizeof moto))
        return false;
    const char *argv[] = {moto, "-H", "127.0.0.1", "-p", port, NULL};
    s->access = "lmc-test-key";
    s->secret = "lmc-test-secret";
    s->pid = spawn(argv);
    assert_true(s->pid > 0 && wait_http(p, s->pid));
    start_proxy(s, p);
    return true;
}

/* Setup and teardown of the tests that use a server: the teardown also
 * runs after a failed assertion, so no server outlives its test (a live
 * one would keep ctest's output pipe open until the timeout). */
static int server_setup(void **state)
{
    *state = calloc(1, sizeof(s3_server));
    return *state ? 0 : -1;
}

static int server_teardown(void **state)
{
    s3_server *s = *state;
    pid_t pids[2] = {s->proxy, s->pid};
    for (int i = 0; i < 2; i++) {
        if (pids[i] > 0) {
            kill(pids[i], SIGTERM);
            waitpid(pids[i], NULL, 0);
        }
    }
    free(s);
    return 0;
}

/* Starts a server or leaves the test: failed under CI=true, skipped else. */
#define NEED_S3(s)                                                                          \
    do {                                                                                    \
        if (!start_s3(s)) {                                                                 \
            const char *ci = getenv("CI");                                                  \
            if (ci && strcmp(ci, "true") == 0)                                              \
                fail_msg("no S3 server: run `make deps-test` (installs moto_server)");      \
            skip();                                                                         \
        }                                                                                   \
    } while (0)

static lmc_l2_backend *connect_s3(const s3_server *s, uint64_t capacity)
{
    lmc_l2_s3_options o = {.endpoint = s->endpoint, .bucket = "lmcache", .access_key = s->access,
                           .secret_key = s->secret, .create_bucket = true,
                           .num_connections = 2, .capacity_bytes = capacity};
    char err[128];
    lmc_l2_backend *b = lmc_l2_s3_new(&o, err, sizeof err);
    assert_non_null(b);
    return b;
}

static lmc_l2_usage usage_of(lmc_l2_backend *b)
{
    lmc_l2_usage u = {0};
    b->ops->usage(b, &u);
    return u;
}

static lmc_object_key make_key(int i)
{
    lmc_object_key k = {.chunk_hash_len = 32, .kv_rank = lmc_kv_rank_for_worker(1, 0),
                        .model_name = "org/model name", .cache_salt = i % 2 ? "t&1" : ""};
    for (int b = 0; b < 32; b++)
        k.chunk_hash[b] = (uint8_t)(i * 13 + b);
    return k;
}

static void test_round_trip(void **state)
{
    s3_server *srv = *state;
    NEED_S3(srv);
    lmc_l2_backend *b = connect_s3(srv, 0);
    enum { N = 6, SIZE = 300000 };
    uint8_t *buf = malloc(SIZE), *out = malloc(SIZE);
    for (int i = 0; i < N; i++) {
        lmc_object_key k = make_key(i);
        uint64_t size = SIZE;
        for (size_t j = 0; j < SIZE; j++)
            buf[j] = (uint8_t)(j * 3 + (size_t)i);
        assert_int_equal(b->ops->store(b, &k, &buf, &size, 1), SIZE);
    }
    for (int i = 0; i < N; i++) {
        lmc_object_key k = make_key(i);
        uint64_t size = SIZE, small = SIZE - 1;
        uint8_t found, ok;
        b->ops->lookup_and_lock(b, &k, &size, 1, &found);
        assert_int_equal(found, 1);
        b->ops->lookup_and_lock(b, &k, &small, 1, &found);
        assert_int_equal(found, 0);
        b->ops->load(b, &k, &out, &size, 1, &ok);
        assert_int_equal(ok, 1);
        for (size_t j = 0; j < SIZE; j++)
            buf[j] = (uint8_t)(j * 3 + (size_t)i);
        assert_memory_equal(out, buf, SIZE);
        b->ops->load(b, &k, &out, &small, 1, &ok);      /* larger than expected */
        assert_int_equal(ok, 0);
    }
    json_t *entries = json_array();
    b->ops->list(b, "org/model name", entries);
    assert_int_equal(json_array_size(entries), N);
    json_decref(entries);
    lmc_object_key k0 = make_key(0);
    assert_int_equal(b->ops->remove(b, &k0, 1), 1);
    uint64_t size = SIZE;
    uint8_t found = 1;
    b->ops->lookup_and_lock(b, &k0, &size, 1, &found);
    assert_int_equal(found, 0);
    b->ops->destroy(b);
    free(buf);
    free(out);
}

/* The endpoint verifies signatures: a wrong secret fails every request. */
static void test_wrong_secret_is_refused(void **state)
{
    s3_server *srv = *state;
    NEED_S3(srv);
    lmc_l2_backend *good = connect_s3(srv, 0);
    lmc_l2_s3_options o = {.endpoint = srv->endpoint, .bucket = "lmcache",
                           .access_key = srv->access, .secret_key = "not-the-secret",
                           .num_connections = 1};
    char err[128];
    lmc_l2_backend *bad = lmc_l2_s3_new(&o, err, sizeof err);
    assert_non_null(bad);
    uint8_t buf[16] = {0}, *p = buf;
    uint64_t size = sizeof buf;
    lmc_object_key k = make_key(0);
    assert_int_equal(bad->ops->store(bad, &k, &p, &size, 1), -1);
    assert_int_equal(good->ops->store(good, &k, &p, &size, 1), (int64_t)size);
    uint8_t found = 1;
    bad->ops->lookup_and_lock(bad, &k, &size, 1, &found);
    assert_int_equal(found, 0);
    good->ops->lookup_and_lock(good, &k, &size, 1, &found);
    assert_int_equal(found, 1);
    bad->ops->destroy(bad);
    good->ops->destroy(good);
}

static lmc_object_key unique_key(int i)
{
    lmc_object_key k = make_key(i);
    k.chunk_hash[0] = (uint8_t)i;
    k.chunk_hash[1] = (uint8_t)(i >> 8);
    return k;
}

/* Usage follows what the bucket holds: an overwrite replaces a key's size,
 * a delete subtracts it once. */
static void test_usage_follows_overwrites_and_deletes(void **state)
{
    s3_server *srv = *state;
    NEED_S3(srv);
    lmc_l2_backend *b = connect_s3(srv, 0);
    enum { SIZE = 5000 };
    uint8_t *buf = calloc(1, SIZE);
    lmc_object_key k0 = make_key(0), k1 = make_key(1), never = make_key(9);
    uint64_t size = SIZE, half = SIZE / 2;
    assert_int_equal(b->ops->store(b, &k0, &buf, &size, 1), SIZE);
    assert_int_equal(b->ops->store(b, &k0, &buf, &size, 1), SIZE);
    assert_int_equal(usage_of(b).used_bytes, SIZE);
    assert_int_equal(usage_of(b).num_keys, 1);
    assert_int_equal(b->ops->store(b, &k0, &buf, &half, 1), SIZE / 2);
    assert_int_equal(b->ops->store(b, &k1, &buf, &size, 1), SIZE);
    assert_int_equal(usage_of(b).used_bytes, SIZE / 2 + SIZE);
    assert_int_equal(b->ops->remove(b, &k0, 1), 1);
    b->ops->remove(b, &k0, 1);
    b->ops->remove(b, &never, 1);
    assert_int_equal(usage_of(b).used_bytes, SIZE);
    assert_int_equal(usage_of(b).num_keys, 1);
    b->ops->destroy(b);
    free(buf);
}

/* max_capacity_gb: a store that does not fit fails and writes nothing. */
static void test_capacity_is_enforced(void **state)
{
    s3_server *srv = *state;
    NEED_S3(srv);
    enum { SIZE = 5000 };
    lmc_l2_backend *b = connect_s3(srv, 2 * SIZE);
    uint8_t *buf = calloc(1, SIZE);
    lmc_object_key k[3] = {make_key(0), make_key(1), make_key(2)};
    uint64_t sizes[3] = {SIZE, SIZE, SIZE};
    assert_int_equal(b->ops->store(b, k, &buf, sizes, 1), SIZE);
    uint8_t *bufs[2] = {buf, buf};
    assert_int_equal(b->ops->store(b, &k[1], bufs, sizes, 2), -1);  /* 3 objects: too many */
    uint8_t found[2] = {1, 1};
    b->ops->lookup_and_lock(b, &k[1], sizes, 2, found);
    assert_true(found[0] == 0 && found[1] == 0);
    assert_int_equal(b->ops->store(b, &k[1], &buf, sizes, 1), SIZE);
    assert_int_equal(b->ops->store(b, &k[0], &buf, sizes, 1), SIZE); /* overwrite fits */
    assert_int_equal(usage_of(b).used_bytes, 2 * SIZE);
    b->ops->destroy(b);
    free(buf);
}

/* A new backend over a bucket that already holds objects counts them,
 * across ListObjectsV2 pages (1000 objects each). */
static void test_usage_rebuilt_at_start(void **state)
{
    s3_server *srv = *state;
    NEED_S3(srv);
    lmc_l2_backend *b = connect_s3(srv, 0);
    enum { N = 1100 };
    uint8_t buf[64] = {0}, *p = buf;
    uint64_t want = 0;
    for (int i = 0; i < N; i++) {
        lmc_object_key k = unique_key(i);
        uint64_t size = 10 + (uint64_t)i % 50;
        assert_int_equal(b->ops->store(b, &k, &p, &size, 1), (int64_t)size);
        want += size;
    }
    b->ops->destroy(b);
    b = connect_s3(srv, 1ull << 30);
    assert_int_equal(usage_of(b).used_bytes, want);
    assert_int_equal(usage_of(b).num_keys, N);
    lmc_object_key k0 = unique_key(0);                                /* 10 bytes */
    assert_int_equal(b->ops->remove(b, &k0, 1), 1);
    assert_int_equal(usage_of(b).used_bytes, want - 10);
    b->ops->destroy(b);
}

/* ---- issue 18: the parts of one adapter task ------------------------------ */

#define BIG (1u << 20)  /* the adapter's parts are at most 1 MiB: one key a part */
#define PARTS 4

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

static lmc_l2_backend *parts_backend(const s3_server *s, uint64_t capacity)
{
    lmc_l2_s3_options o = {.endpoint = s->endpoint, .bucket = "lmcache", .access_key = s->access,
                           .secret_key = s->secret, .create_bucket = true,
                           .num_connections = PARTS, .capacity_bytes = capacity};
    char err[128];
    lmc_l2_backend *b = lmc_l2_s3_new(&o, err, sizeof err);
    assert_non_null(b);
    return b;
}

static int64_t adapter_store(lmc_l2_adapter *a, arena_fx *f, const lmc_object_key *keys,
                             size_t from, size_t n)
{
    uint64_t id = lmc_l2_adapter_submit_store(a, keys, f->src + from, f->sizes, n), got;
    int64_t r;
    assert_true(id > 0);
    for (int i = 0; i < 10000; i++) {
        if (lmc_l2_adapter_pop_completed_store(a, &got, &r)) {
            assert_int_equal(got, id);
            return r;
        }
        usleep(2000);
    }
    fail_msg("store task did not complete");
    return -1;
}

static json_int_t max_parts(lmc_l2_adapter *a)
{
    json_t *st = lmc_l2_adapter_status(a);
    json_int_t v = json_integer_value(json_object_get(st, "max_parts_in_flight"));
    json_decref(st);
    return v;
}

/* One task's keys run on every worker at once: the PUTs overlap, and the
 * GETs of a prompt meet at a gate that opens only when PARTS of them are
 * inside.  An object deleted from the middle is a miss; the ones after it
 * still load (the prefetch keeps the leading run, test_l2_controllers). */
static void test_parts_of_one_task_run_in_parallel(void **state)
{
    s3_server *srv = *state;
    NEED_S3(srv);
    arena_fx *f = arena_new();
    lmc_object_key keys[2 * PARTS];
    for (int i = 0; i < 2 * PARTS; i++)
        keys[i] = unique_key(i);
    lmc_l2_adapter *a = lmc_l2_adapter_new(parts_backend(srv, 0), f->arena, PARTS);
    assert_int_equal(adapter_store(a, f, keys, 0, 2 * PARTS), 2 * PARTS * (int64_t)BIG);
    assert_true(max_parts(a) >= 2);
    assert_int_equal(lmc_l2_adapter_delete(a, &keys[1], 1), 1);
    lmc_l2_adapter_close(a);
    gate *g;
    a = lmc_l2_adapter_new(gate_new(parts_backend(srv, 0), PARTS, -1, &g), f->arena, PARTS);
    uint64_t id = lmc_l2_adapter_submit_load(a, keys, f->dst, f->sizes, PARTS);
    uint8_t ok[PARTS];
    for (int i = 0; i < 10000 && !lmc_l2_adapter_query_load(a, id, ok); i++)
        usleep(2000);
    assert_memory_equal(ok, ((uint8_t[]){1, 0, 1, 1}), PARTS);
    for (size_t i = 0; i < PARTS; i++) {
        if (i != 1)
            assert_memory_equal(f->arena + f->dst[i], f->arena + f->src[i], BIG);
    }
    assert_int_equal(gate_max_inside(g), PARTS);
    lmc_l2_adapter_close(a);
    arena_free(f);
}

/* The capacity check covers the whole batch even when its parts run on
 * several workers: a batch that does not fit writes nothing at all. */
static void test_split_store_over_capacity_writes_nothing(void **state)
{
    s3_server *srv = *state;
    NEED_S3(srv);
    arena_fx *f = arena_new();
    lmc_object_key keys[PARTS];
    for (int i = 0; i < PARTS; i++)
        keys[i] = unique_key(i);
    lmc_l2_adapter *a = lmc_l2_adapter_new(parts_backend(srv, (PARTS - 1) * BIG), f->arena,
                                           PARTS);
    assert_int_equal(adapter_store(a, f, keys, 0, PARTS), -1);
    json_t *entries = json_array();
    lmc_l2_backend *be = lmc_l2_adapter_backend(a);
    be->ops->list(be, NULL, entries);
    assert_int_equal(json_array_size(entries), 0);
    json_decref(entries);
    assert_int_equal(adapter_store(a, f, keys, 0, PARTS - 1), (PARTS - 1) * (int64_t)BIG);
    assert_true(max_parts(a) >= 2);
    lmc_l2_usage u;
    lmc_l2_adapter_usage(a, &u);
    assert_int_equal(u.used_bytes, (PARTS - 1) * (uint64_t)BIG);
    lmc_l2_adapter_close(a);
    arena_free(f);
}

int main(void)
{
    curl_global_init(CURL_GLOBAL_DEFAULT);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sigv4_get_object_example),
        cmocka_unit_test(test_sigv4_list_objects_example),
        cmocka_unit_test(test_uri_encoding),
        cmocka_unit_test_setup_teardown(test_round_trip, server_setup, server_teardown),
        cmocka_unit_test_setup_teardown(test_wrong_secret_is_refused, server_setup, server_teardown),
        cmocka_unit_test_setup_teardown(test_usage_follows_overwrites_and_deletes, server_setup, server_teardown),
        cmocka_unit_test_setup_teardown(test_capacity_is_enforced, server_setup, server_teardown),
        cmocka_unit_test_setup_teardown(test_usage_rebuilt_at_start, server_setup, server_teardown),
        cmocka_unit_test_setup_teardown(test_parts_of_one_task_run_in_parallel, server_setup,
                                        server_teardown),
        cmocka_unit_test_setup_teardown(test_split_store_over_capacity_writes_nothing,
                                        server_setup, server_teardown),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    curl_global_cleanup();
    return rc;
}
