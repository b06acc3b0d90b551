/* The pieces behind the HTTP frontend's access and upload bounds
 * (docs/http.md, "Authentication" and "Request bodies"): the bearer-token
 * check, the route policies, and request bodies under a limit and a
 * shared budget. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "http/http_auth.h"
#include "http/http_body.h"
#include "http/http_internal.h"

/* ---- bearer token -------------------------------------------------------- */

static void test_auth_disabled(void **state)
{
    (void)state;
    lmc_http_auth a;
    assert_int_equal(lmc_http_auth_init(&a, NULL), 0);
    assert_false(a.enabled);
    assert_true(lmc_http_auth_ok(&a, NULL));
    assert_true(lmc_http_auth_ok(&a, "Bearer anything"));
    lmc_http_auth_free(&a);
    assert_int_equal(lmc_http_auth_init(&a, ""), 0);
    assert_false(a.enabled);
    lmc_http_auth_free(&a);
}

static void test_auth_token(void **state)
{
    (void)state;
    lmc_http_auth a;
    assert_int_equal(lmc_http_auth_init(&a, "s3cr3t-T0ken"), 0);
    assert_true(a.enabled);
    static const char *const good[] = {"Bearer s3cr3t-T0ken", "bearer s3cr3t-T0ken",
                                       "BEARER \t s3cr3t-T0ken  ", " Bearer s3cr3t-T0ken"};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++)
        if (!lmc_http_auth_ok(&a, good[i]))
            fail_msg("refused: %s", good[i]);
    static const char *const bad[] = {
        "", "Bearer", "Bearer ", "Bearers3cr3t-T0ken", "Basic s3cr3t-T0ken", "s3cr3t-T0ken",
        "Bearer s3cr3t-T0ke", "Bearer s3cr3t-T0kenX", "Bearer S3CR3T-T0KEN",
        "Bearer s3cr3t-T0ken extra", "Bearer \x01s3cr3t-T0ken"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        if (lmc_http_auth_ok(&a, bad[i]))
            fail_msg("accepted: %s", bad[i]);
    assert_false(lmc_http_auth_ok(&a, NULL));
    lmc_http_auth_free(&a);
    assert_false(a.enabled);
}

/* ---- route policies ------------------------------------------------------ */

static void never_run(const lmc_http_request *req, lmc_http_reply *out, void *ctx,
                      const char *arg)
{
    (void)req, (void)out, (void)ctx, (void)arg;
    fail_msg("a policy lookup ran a handler");
}

/* Rows as owners add them (the server's /api/kv and quota rows). */
static const lmc_http_route owner_rows[] = {
    {"POST", "/api/kv/store", false, LMC_HTTP_TOKEN, LMC_HTTP_BODY_KV, LMC_HTTP_READY_DETAIL,
     never_run, NULL},
    {"PUT", "/quota/", true, LMC_HTTP_TOKEN, LMC_HTTP_BODY_JSON, LMC_HTTP_READY_DETAIL,
     never_run, NULL},
    {"DELETE", "/quota/", true, LMC_HTTP_TOKEN, LMC_HTTP_BODY_NONE, LMC_HTTP_READY_DETAIL,
     never_run, NULL},
};

static void test_route_policy(void **state)
{
    (void)state;
    lmc_http_routes *t = lmc_http_routes_new();
    assert_non_null(t);
    assert_int_equal(lmc_http_routes_add_site(t), 0);
    assert_int_equal(lmc_http_routes_add(t, owner_rows, 3, NULL), 0);
    lmc_http_site site = {.routes = t};
    static const struct {
        const char *method, *path;
        lmc_http_access access;
        lmc_http_body body;
    } cases[] = {
        {"GET", "/healthcheck", LMC_HTTP_OPEN, LMC_HTTP_BODY_NONE},
        {"HEAD", "/metrics", LMC_HTTP_OPEN, LMC_HTTP_BODY_NONE},
        {"GET", "/status", LMC_HTTP_OPEN, LMC_HTTP_BODY_NONE},
        {"GET", "/config", LMC_HTTP_TOKEN, LMC_HTTP_BODY_NONE},
        {"POST", "/cache/clear", LMC_HTTP_TOKEN, LMC_HTTP_BODY_JSON},
        {"POST", "/api/kv/store", LMC_HTTP_TOKEN, LMC_HTTP_BODY_KV},
        /* The KV limit goes with the method too, not the path alone. */
        {"GET", "/api/kv/store", LMC_HTTP_OPEN, LMC_HTTP_BODY_NONE},
        {"PUT", "/quota/a", LMC_HTTP_TOKEN, LMC_HTTP_BODY_JSON},
        {"DELETE", "/quota/a", LMC_HTTP_TOKEN, LMC_HTTP_BODY_NONE},
        {"PUT", "/quota/", LMC_HTTP_OPEN, LMC_HTTP_BODY_NONE}, /* no salt: 404 */
        {"POST", "/run_script", LMC_HTTP_OPEN, LMC_HTTP_BODY_NONE},
        {"GET", "/reconfigure/l1", LMC_HTTP_TOKEN, LMC_HTTP_BODY_NONE},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        lmc_http_policy p = lmc_http_route_policy(&site, cases[i].method, cases[i].path);
        if (p.access != cases[i].access || p.body != cases[i].body)
            fail_msg("%s %s: access %d body %d", cases[i].method, cases[i].path, p.access,
                     p.body);
    }
    site.metrics_only = true;
    lmc_http_policy p = lmc_http_route_policy(&site, "POST", "/cache/clear");
    assert_int_equal(p.access, LMC_HTTP_OPEN);
    assert_int_equal(p.body, LMC_HTTP_BODY_NONE);
    lmc_http_routes_free(t);
}

/* A "*" row serves every method, after the rows of its path before it
 * (the coordinator's CacheBlend rows: GET open, the rest guarded). */
static void test_route_any_method(void **state)
{
    (void)state;
    static const lmc_http_route rows[] = {
        {"GET", "/blend/", true, LMC_HTTP_OPEN, LMC_HTTP_BODY_JSON, LMC_HTTP_READY_ANY,
         never_run, NULL},
        {"*", "/blend/", true, LMC_HTTP_TOKEN, LMC_HTTP_BODY_JSON, LMC_HTTP_READY_ANY,
         never_run, NULL},
    };
    lmc_http_routes *t = lmc_http_routes_new();
    assert_non_null(t);
    assert_int_equal(lmc_http_routes_add(t, rows, 2, NULL), 0);
    lmc_http_site site = {.routes = t};
    assert_int_equal(lmc_http_route_policy(&site, "HEAD", "/blend/x").access, LMC_HTTP_OPEN);
    assert_int_equal(lmc_http_route_policy(&site, "POST", "/blend/x").access, LMC_HTTP_TOKEN);
    assert_int_equal(lmc_http_route_policy(&site, "OPTIONS", "/blend/x").access,
                     LMC_HTTP_TOKEN);
    assert_int_equal(lmc_http_route_policy(&site, "POST", "/blend/").access, LMC_HTTP_OPEN);
    lmc_http_routes_free(t);
}

/* ---- bodies and the budget -------------------------------------------- */

static void test_body_within_limits(void **state)
{
    (void)state;
    lmc_http_stats st = {.upload_budget = 100};
    lmc_http_body_state b = {.limit = 50};
    assert_true(lmc_http_body_take(&b, &st, "0123456789", 10));
    assert_true(lmc_http_body_take(&b, &st, "abcdefghij", 10));
    assert_int_equal(b.refusal, 0);
    assert_string_equal(b.body, "0123456789abcdefghij");
    assert_int_equal(atomic_load(&st.upload_held), 20);
    lmc_http_body_release(&b, &st);
    assert_null(b.body);
    assert_int_equal(atomic_load(&st.upload_held), 0);
}

static void test_body_over_limit(void **state)
{
    (void)state;
    lmc_http_stats st = {.upload_budget = 100};
    lmc_http_body_state b = {.limit = 15};
    assert_true(lmc_http_body_take(&b, &st, "0123456789", 10));
    assert_true(lmc_http_body_take(&b, &st, "0123456789", 10));
    assert_int_equal(b.refusal, 413);
    assert_null(b.body);
    assert_int_equal(atomic_load(&st.upload_held), 0); /* released at once */
    assert_int_equal(atomic_load(&st.refused_too_large), 1);
    lmc_http_body_release(&b, &st);
}

static void test_body_over_budget(void **state)
{
    (void)state;
    lmc_http_stats st = {.upload_budget = 25};
    lmc_http_body_state a = {.limit = 50}, b = {.limit = 50};
    char chunk[20] = {0};
    assert_true(lmc_http_body_take(&a, &st, chunk, sizeof chunk));
    assert_true(lmc_http_body_take(&b, &st, chunk, sizeof chunk));
    assert_int_equal(a.refusal, 0);
    assert_int_equal(b.refusal, 503);
    assert_int_equal(atomic_load(&st.upload_held), 20);
    assert_int_equal(lmc_http_budget_free(&st), 5);
    assert_int_equal(atomic_load(&st.refused_over_budget), 1);
    lmc_http_body_release(&a, &st);
    lmc_http_body_release(&b, &st);
    assert_int_equal(atomic_load(&st.upload_held), 0);
}

/* After a refusal the rest is discarded, and past the drain limit the
 * connection is to be dropped. */
static void test_body_drain_bound(void **state)
{
    (void)state;
    lmc_http_stats st = {.upload_budget = 1 << 30};
    lmc_http_body_state b = {.limit = 10};
    static char chunk[64 << 10];
    size_t sent = 0;
    bool keep = true;
    while (keep && sent < 4 * LMC_HTTP_DRAIN_LIMIT) {
        keep = lmc_http_body_take(&b, &st, chunk, sizeof chunk);
        sent += sizeof chunk;
    }
    assert_false(keep);
    assert_true(sent > LMC_HTTP_DRAIN_LIMIT && sent <= LMC_HTTP_DRAIN_LIMIT + 2 * sizeof chunk);
    assert_int_equal(b.refusal, 413);
    assert_int_equal(atomic_load(&st.upload_held), 0);
}

/* A declared length is allocated once, to the byte. */
static void test_body_declared_length(void **state)
{
    (void)state;
    lmc_http_stats st = {.upload_budget = 1 << 20};
    lmc_http_body_state b = {.limit = 1 << 20, .expected = 100000};
    static char chunk[1000];
    for (int i = 0; i < 100; i++)
        assert_true(lmc_http_body_take(&b, &st, chunk, sizeof chunk));
    assert_int_equal(b.cap, 100001);
    lmc_http_body_release(&b, &st);
}

/* A declared length reserved at the headers (reserve_declared) is not
 * reserved again as it arrives, and all of it comes back at the end. */
static void test_body_reserved_ahead(void **state)
{
    (void)state;
    lmc_http_stats st = {.upload_budget = 100};
    assert_true(lmc_http_budget_reserve(&st, 60));
    lmc_http_body_state b = {.limit = 100, .expected = 60, .held = 60};
    char chunk[30] = {0};
    assert_true(lmc_http_body_take(&b, &st, chunk, sizeof chunk));
    assert_true(lmc_http_body_take(&b, &st, chunk, sizeof chunk));
    assert_int_equal(b.refusal, 0);
    assert_int_equal(atomic_load(&st.upload_held), 60);
    assert_true(lmc_http_body_take(&b, &st, chunk, 10)); /* past the declared length */
    assert_int_equal(atomic_load(&st.upload_held), 70);
    lmc_http_body_release(&b, &st);
    assert_int_equal(atomic_load(&st.upload_held), 0);
}

typedef struct {
    lmc_http_stats *st;
    int granted;
} reserver;

static void *reserve_loop(void *arg)
{
    reserver *r = arg;
    for (int i = 0; i < 100000; i++)
        if (lmc_http_budget_reserve(r->st, 7))
            r->granted++;
    return NULL;
}

/* Concurrent reservations never overshoot the budget. */
static void test_budget_concurrent(void **state)
{
    (void)state;
    lmc_http_stats st = {.upload_budget = 7 * 1000 + 3};
    reserver r[4] = {{&st, 0}, {&st, 0}, {&st, 0}, {&st, 0}};
    pthread_t t[4];
    for (int i = 0; i < 4; i++)
        assert_int_equal(pthread_create(&t[i], NULL, reserve_loop, &r[i]), 0);
    for (int i = 0; i < 4; i++)
        pthread_join(t[i], NULL);
    assert_int_equal(r[0].granted + r[1].granted + r[2].granted + r[3].granted, 1000);
    assert_int_equal(atomic_load(&st.upload_held), 7000);
    assert_false(lmc_http_budget_reserve(&st, 4));
    assert_true(lmc_http_budget_reserve(&st, 3));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_auth_disabled),
        cmocka_unit_test(test_auth_token),
        cmocka_unit_test(test_route_policy),
        cmocka_unit_test(test_route_any_method),
        cmocka_unit_test(test_body_within_limits),
        cmocka_unit_test(test_body_over_limit),
        cmocka_unit_test(test_body_over_budget),
        cmocka_unit_test(test_body_drain_bound),
        cmocka_unit_test(test_body_declared_length),
        cmocka_unit_test(test_body_reserved_ahead),
        cmocka_unit_test(test_budget_concurrent),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
