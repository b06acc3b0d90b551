/* The s3 backend: SigV4 against AWS's published examples, and a real
 * round trip against moto_server (a local S3 endpoint) started here. */
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

#include "ports.h"
#include "storage/l2/l2_s3.h"

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


static pid_t start_moto(int port)
{
    char p[16];
    snprintf(p, sizeof p, "%d", port);
    pid_t pid = fork();
    if (pid == 0) {
        freopen("/dev/null", "w", stdout);
        freopen("/dev/null", "w", stderr);
        execlp("moto_server", "moto_server", "-H", "127.0.0.1", "-p", p, (char *)NULL);
        _exit(127);
    }
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d/", port);
    for (int i = 0; i < 300; i++) { /* ready when it answers HTTP */
        CURL *c = curl_easy_init();
        curl_easy_setopt(c, CURLOPT_URL, url);
        curl_easy_setopt(c, CURLOPT_NOBODY, 1L);
        curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, 500L);
        CURLcode rc = curl_easy_perform(c);
        curl_easy_cleanup(c);
        if (rc == CURLE_OK)
            return pid;
        usleep(50000);
    }
    return -1;
}

static lmc_object_key make_key(int i)
{
    lmc_object_key k = {.chunk_hash_len = 32, .kv_rank = lmc_kv_rank_for_worker(1, 0),
                        .model_name = "org/model name", .cache_salt = i % 2 ? "t&1" : ""};
    for (int b = 0; b < 32; b++)
        k.chunk_hash[b] = (uint8_t)(i * 13 + b);
    return k;
}

static void test_round_trip_against_moto(void **state)
{
    (void)state;
    int port = pick_ports(1, false);
    pid_t pid = start_moto(port);
    assert_true(pid > 0);
    char endpoint[64];
    snprintf(endpoint, sizeof endpoint, "http://127.0.0.1:%d", port);
    lmc_l2_s3_options o = {.endpoint = endpoint, .bucket = "lmcache", .access_key = "test",
                           .secret_key = "test", .create_bucket = true, .num_connections = 2};
    char err[128];
    lmc_l2_backend *b = lmc_l2_s3_new(&o, err, sizeof err);
    assert_non_null(b);
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
    kill(pid, SIGTERM);
    waitpid(pid, NULL, 0);
}

int main(void)
{
    curl_global_init(CURL_GLOBAL_DEFAULT);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sigv4_get_object_example),
        cmocka_unit_test(test_sigv4_list_objects_example),
        cmocka_unit_test(test_uri_encoding),
        cmocka_unit_test(test_round_trip_against_moto),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    curl_global_cleanup();
    return rc;
}
