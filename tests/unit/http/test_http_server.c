/* The HTTP frontend on a real loopback port with a fake backend; requests
 * are written by hand on raw sockets (so malformed ones can be sent too). */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>
#include <cmocka.h>

#include "http/http_server.h"
#include "obs/metrics.h"

#define MAX_BODY 65536

typedef struct {
    atomic_bool ready;
    atomic_int clears;
    atomic_bool clear_fails;
    lmc_metrics *metrics;
    lmc_http_routes *routes;  /* the frontend's own rows and the owner rows below */
    lmc_http_server *server;
    int port;
} fixture;

/* ---- fake backend ------------------------------------------------------ */

static bool fake_ready(void *user) { return atomic_load(&((fixture *)user)->ready); }

static json_t *fake_status(void *user)
{
    (void)user;
    return json_loads("{\"is_healthy\":true,\"instance_id\":\"i-1\",\"chunk_size\":256,"
                      "\"storage_manager\":{\"l1_manager\":{\"used\":950,\"capacity\":1000,"
                      "\"is_healthy\":true},\"l1_eviction_controller\":"
                      "{\"trigger_watermark\":0.8,\"eviction_policy\":\"LRU\"}}}",
                      0, NULL);
}

static json_t *fake_config(void *user)
{
    (void)user;
    return json_loads("{\"mp_config\":{\"port\":5555},\"http_config\":{\"http_port\":8080}}", 0,
                      NULL);
}

static int fake_clear(void *user, bool force, char *err, size_t errlen)
{
    fixture *f = user;
    assert_true(force);
    atomic_fetch_add(&f->clears, 1);
    if (atomic_load(&f->clear_fails)) {
        snprintf(err, errlen, "storage is busy");
        return -1;
    }
    return 0;
}

static char *fake_metrics(void *user)
{
    return lmc_metrics_render(((fixture *)user)->metrics);
}

/* A row an owner adds: answers its ctx's clear count and its row's arg,
 * and the rest of a prefix path. */
static void owned_route(const lmc_http_request *req, lmc_http_reply *out, void *ctx,
                        const char *arg)
{
    fixture *f = ctx;
    lmc_http_reply_json(out, 200,
                        json_pack("{s:i, s:s, s:s}", "clears", atomic_load(&f->clears), "arg",
                                  arg, "rest", req->path + strlen("/owned/")));
}

static const lmc_http_route owner_rows[] = {
    {"GET", "/owned/", true, LMC_HTTP_OPEN, LMC_HTTP_BODY_NONE, LMC_HTTP_READY_DETAIL,
     owned_route, "mine"},
};

static int setup(void **state)
{
    fixture *f = calloc(1, sizeof *f);
    atomic_store(&f->ready, true);
    f->metrics = lmc_metrics_new();
    lmc_metrics_add_process_collector(f->metrics);
    f->routes = lmc_http_routes_new();
    if (!f->routes || lmc_http_routes_add_site(f->routes) != 0 ||
        lmc_http_routes_add(f->routes, owner_rows, 1, f) != 0)
        return -1;
    lmc_http_routes_seal(f->routes);
    lmc_http_backend b = {.user = f, .ready = fake_ready, .status = fake_status,
                          .config = fake_config, .clear = fake_clear, .metrics = fake_metrics};
    lmc_http_options o = {.host = "127.0.0.1", .port = 0, .version = "0.1.0",
                          .commit = "abc123", .max_body_bytes = MAX_BODY, .timeout_s = 2};
    char err[256];
    if (lmc_http_server_start(&o, &b, f->routes, &f->server, err, sizeof err) != 0) {
        fprintf(stderr, "start: %s\n", err);
        return -1;
    }
    f->port = lmc_http_server_port(f->server);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fixture *f = *state;
    lmc_http_server_stop(f->server);
    lmc_http_routes_free(f->routes);
    lmc_metrics_free(f->metrics);
    free(f);
    return 0;
}

/* ---- raw client ------------------------------------------------------- */

typedef struct {
    int status;
    char *head; /* status line + headers */
    char *body;
} response;

static int connect_to(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    struct timeval tv = {.tv_sec = 10};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    return fd;
}

static void send_all(int fd, const char *data, size_t len)
{
    while (len > 0) {
        ssize_t n = send(fd, data, len, MSG_NOSIGNAL);
        if (n <= 0)
            return; /* the server may close early (413); the reply is still read */
        data += n;
        len -= (size_t)n;
    }
}

static response read_response(int fd)
{
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    for (ssize_t n; (n = recv(fd, buf + len, cap - len - 1, 0)) > 0;) {
        len += (size_t)n;
        if (cap - len < 4096)
            buf = realloc(buf, cap *= 2);
    }
    buf[len] = '\0';
    close(fd);
    response r = {0};
    char *sep = strstr(buf, "\r\n\r\n");
    if (sep) {
        *sep = '\0';
        r.body = strdup(sep + 4);
    }
    r.head = buf;
    sscanf(buf, "HTTP/1.%*d %d", &r.status);
    return r;
}

static response raw(int port, const char *request, size_t len)
{
    int fd = connect_to(port);
    send_all(fd, request, len);
    return read_response(fd);
}

static response http(fixture *f, const char *method, const char *path, const char *extra,
                     const char *body)
{
    char req[8192];
    size_t blen = body ? strlen(body) : 0;
    int n = snprintf(req, sizeof req,
                     "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n%s"
                     "Content-Length: %zu\r\n\r\n%s",
                     method, path, extra ? extra : "", blen, body ? body : "");
    return raw(f->port, req, (size_t)n);
}

static void free_response(response *r)
{
    free(r->head);
    free(r->body);
}

static json_t *body_json(const response *r)
{
    json_t *j = json_loads(r->body ? r->body : "", JSON_DECODE_ANY, NULL);
    if (!j)
        fail_msg("not JSON: %s", r->body ? r->body : "(none)");
    return j;
}

/* Checks status and that the body equals `expected` (JSON text). */
static void expect(fixture *f, const char *method, const char *path, const char *body,
                   int status, const char *expected)
{
    response r = http(f, method, path, NULL, body);
    if (r.status != status)
        fail_msg("%s %s: status %d, want %d; body %s", method, path, r.status, status, r.body);
    if (expected) {
        json_t *got = body_json(&r), *want = json_loads(expected, JSON_DECODE_ANY, NULL);
        assert_non_null(want);
        if (!json_equal(got, want))
            fail_msg("%s %s: body %s, want %s", method, path, r.body, expected);
        json_decref(got);
        json_decref(want);
    }
    free_response(&r);
}

/* ---- tests ------------------------------------------------------------ */

static void test_root_and_health(void **state)
{
    fixture *f = *state;
    expect(f, "GET", "/", NULL, 200, "{\"status\":\"ok\",\"service\":\"LMCache HTTP API\"}");
    expect(f, "GET", "/healthcheck", NULL, 200, "{\"status\":\"healthy\"}");
    expect(f, "GET", "/api/healthcheck", NULL, 200, "{\"status\":\"healthy\"}");
    response r = http(f, "GET", "/", "Accept: text/html,*/*\r\n", NULL);
    assert_int_equal(r.status, 200);
    assert_non_null(strstr(r.head, "text/html"));
    assert_non_null(strstr(r.body, "href=\"/dashboard\""));
    free_response(&r);
    r = http(f, "GET", "/dashboard", NULL, NULL);
    assert_int_equal(r.status, 200);
    assert_non_null(strstr(r.body, "/api/status"));
    free_response(&r);
    r = http(f, "HEAD", "/healthcheck", NULL, NULL);
    assert_int_equal(r.status, 200);
    assert_string_equal(r.body, "");
    free_response(&r);
}

static void test_not_ready(void **state)
{
    fixture *f = *state;
    atomic_store(&f->ready, false);
    expect(f, "GET", "/healthcheck", NULL, 503,
           "{\"status\":\"unhealthy\",\"reason\":\"engine not initialized\"}");
    expect(f, "GET", "/status", NULL, 503, "{\"error\":\"engine not initialized\"}");
    expect(f, "GET", "/status/memory-pressure", NULL, 503,
           "{\"detail\":\"server not initialized\"}");
    expect(f, "GET", "/config", NULL, 503, "{\"error\":\"configs not initialized\"}");
    expect(f, "POST", "/cache/clear", NULL, 503, "{\"detail\":\"server not initialized\"}");
    expect(f, "GET", "/", NULL, 200, NULL);
    expect(f, "GET", "/version", NULL, 200, NULL);
    assert_int_equal(atomic_load(&f->clears), 0);
    atomic_store(&f->ready, true);
}

static void test_status_and_pressure(void **state)
{
    fixture *f = *state;
    json_t *want = fake_status(NULL);
    /* The frontend adds its own view (docs/http.md, "Authentication"). */
    json_object_set_new(want, "http_auth",
                        json_pack("{s:b, s:b, s:i}", "enabled", 0, "exposed", 0, "rejected", 0));
    json_object_set_new(want, "http_uploads",
                        json_pack("{s:I, s:i, s:i, s:i}", "budget_bytes", (json_int_t)2 << 30,
                                  "buffered_bytes", 0, "refused_too_large", 0,
                                  "refused_over_budget", 0));
    char *want_text = json_dumps(want, 0);
    expect(f, "GET", "/status", NULL, 200, want_text);
    expect(f, "GET", "/api/status", NULL, 200, want_text);
    free(want_text);
    json_decref(want);
    response r = http(f, "GET", "/status/memory-pressure", NULL, NULL);
    assert_int_equal(r.status, 200);
    json_t *snap = body_json(&r);
    assert_string_equal(json_string_value(json_object_get(snap, "overall_level")), "high");
    assert_string_equal(json_string_value(json_object_get(snap, "instance_id")), "i-1");
    assert_true(json_is_true(json_object_get(snap, "complete")));
    assert_true(json_integer_value(json_object_get(snap, "timestamp_ms")) > 1500000000000);
    json_decref(snap);
    free_response(&r);
}

static void test_version_config(void **state)
{
    fixture *f = *state;
    expect(f, "GET", "/version", NULL, 200, "\"0.1.0-abc123\"");
    expect(f, "GET", "/lmc_version", NULL, 200, "\"0.1.0\"");
    expect(f, "GET", "/commit_id", NULL, 200, "\"abc123\"");
    const char *view = "{\"mp\":{\"port\":5555},\"http\":{\"http_port\":8080}}";
    expect(f, "GET", "/config", NULL, 200, view);
    expect(f, "GET", "/conf", NULL, 200, view);
    response r = http(f, "GET", "/config", NULL, NULL);
    assert_non_null(strstr(r.body, "{\n  \"mp\": {\n    \"port\": 5555\n  }"));
    free_response(&r);
    expect(f, "GET", "/config/adapters", NULL, 200, "{\"adapters\":[]}");
}

static void test_cache_clear(void **state)
{
    fixture *f = *state;
    const char *ok = "{\"status\":\"ok\",\"cleared\":{\"tier\":\"l1\"}}";
    expect(f, "POST", "/cache/clear", NULL, 200, ok);
    expect(f, "POST", "/cache/clear", "{\"tier\":\"l1\",\"force\":false}", 200, ok);
    expect(f, "POST", "/clear-cache", NULL, 200, "{\"status\":\"ok\"}");
    assert_int_equal(atomic_load(&f->clears), 3);
    expect(f, "POST", "/cache/clear", "{\"tier\":\"all\"}", 400,
           "{\"detail\":\"tier 'all' not supported; only 'l1'\"}");
    expect(f, "POST", "/cache/clear", "{not json", 422, NULL);
    expect(f, "POST", "/cache/clear", "\"l1\"", 422, NULL);
    expect(f, "POST", "/cache/clear", "{\"force\":1}", 422, NULL);
    assert_int_equal(atomic_load(&f->clears), 3);
    atomic_store(&f->clear_fails, true);
    expect(f, "POST", "/cache/clear", NULL, 500, "{\"detail\":\"storage is busy\"}");
    expect(f, "POST", "/clear-cache", NULL, 500, "{\"error\":\"storage is busy\"}");
    atomic_store(&f->clear_fails, false);
}

static void test_errors(void **state)
{
    fixture *f = *state;
    expect(f, "GET", "/nope", NULL, 404, "{\"detail\":\"Not Found\"}");
    expect(f, "POST", "/run_script", "x", 404, "{\"detail\":\"Not Found\"}");
    expect(f, "GET", "/status/", NULL, 404, NULL);
    response r = http(f, "GET", "/cache/clear", NULL, NULL);
    assert_int_equal(r.status, 405);
    assert_non_null(strstr(r.head, "Allow: POST"));
    free_response(&r);
    expect(f, "DELETE", "/status", NULL, 405, "{\"detail\":\"Method Not Allowed\"}");
    /* Feature rows exist only where their owner added them. */
    expect(f, "GET", "/cache/objects", NULL, 404, "{\"detail\":\"Not Found\"}");
    expect(f, "PUT", "/api/quota/_default", "{\"limit_gb\":1}", 404, NULL);
    expect(f, "POST", "/coordinator/command", "{\"type\":\"x\"}", 200, "{\"status\":\"ok\"}");
    expect(f, "POST", "/coordinator/command", "nope", 400, "{\"error\":\"invalid JSON body\"}");
    expect(f, "POST", "/coordinator/command", "[]", 400,
           "{\"error\":\"body must be an object\"}");
    /* Percent-decoded paths and queries that are not UTF-8 never reach a
     * route (which would put them into JSON). */
    const char *not_utf8 = "{\"detail\":\"the request path and query must be UTF-8 "
                           "(after percent-decoding)\"}";
    expect(f, "GET", "/quota/%80", NULL, 400, not_utf8);
    expect(f, "GET", "/cache/objects?tier=%FFl2", NULL, 400, not_utf8);
    expect(f, "GET", "/cache/objects?%C0%AF=1", NULL, 400, not_utf8);
    expect(f, "GET", "/healthcheck?x=%C3%A9", NULL, 200, NULL);   /* é is fine */
}

/* An owner's row runs its handler with the owner's ctx and the row's arg;
 * a prefix row needs a non-empty rest. */
static void test_owner_rows(void **state)
{
    fixture *f = *state;
    int clears = atomic_load(&f->clears);
    char want[128];
    snprintf(want, sizeof want, "{\"clears\":%d,\"arg\":\"mine\",\"rest\":\"abc\"}", clears);
    expect(f, "GET", "/owned/abc", NULL, 200, want);
    expect(f, "GET", "/owned/", NULL, 404, NULL);
    response r = http(f, "POST", "/owned/abc", NULL, "{}");
    assert_int_equal(r.status, 405);
    assert_non_null(strstr(r.head, "Allow: GET"));
    free_response(&r);
}

static response http_on(int port, const char *method, const char *path, const char *extra,
                        const char *body);

/* Until the table is sealed, a path no row serves may belong to an owner
 * still to come: 503 as its rows would answer, not 404. */
static void test_unsealed_table(void **state)
{
    fixture *f = *state;
    lmc_http_routes *t = lmc_http_routes_new();
    assert_non_null(t);
    assert_int_equal(lmc_http_routes_add_site(t), 0);
    lmc_http_backend b = {.user = f, .ready = fake_ready, .status = fake_status};
    lmc_http_options o = {.host = "127.0.0.1", .timeout_s = 2};
    lmc_http_server *s = NULL;
    char err[256];
    assert_int_equal(lmc_http_server_start(&o, &b, t, &s, err, sizeof err), 0);
    int port = lmc_http_server_port(s);
    response r = http_on(port, "GET", "/owned/abc", NULL, NULL);
    assert_int_equal(r.status, 503);
    assert_string_equal(r.body, "{\"detail\":\"server not initialized\"}");
    free_response(&r);
    assert_int_equal(lmc_http_routes_add(t, owner_rows, 1, f), 0);
    r = http_on(port, "GET", "/owned/abc", NULL, NULL);
    assert_int_equal(r.status, 200);
    free_response(&r);
    lmc_http_routes_seal(t);
    r = http_on(port, "GET", "/nope", NULL, NULL);
    assert_int_equal(r.status, 404);
    free_response(&r);
    lmc_http_server_stop(s);
    lmc_http_routes_free(t);
}

static void test_threads_and_metrics(void **state)
{
    fixture *f = *state;
    response r = http(f, "GET", "/threads", NULL, NULL);
    assert_int_equal(r.status, 200);
    json_t *list = body_json(&r);
    assert_true(json_array_size(list) >= 2); /* this thread + the server's */
    json_decref(list);
    free_response(&r);
    expect(f, "GET", "/threads?thread_id=abc", NULL, 422, NULL);
    r = http(f, "GET", "/threads?name=zz-none", NULL, NULL);
    list = body_json(&r);
    assert_string_equal(json_string_value(json_object_get(json_array_get(list, 0), "name")),
                        "MainThread");
    json_decref(list);
    free_response(&r);
    r = http(f, "GET", "/metrics", NULL, NULL);
    assert_int_equal(r.status, 200);
    assert_non_null(strstr(r.head, "text/plain; version=0.0.4"));
    assert_non_null(strstr(r.body, "# TYPE process_open_fds gauge\nprocess_open_fds "));
    free_response(&r);
}

static void test_body_limits(void **state)
{
    fixture *f = *state;
    /* Declared too large: answered from the headers, the body never sent. */
    char req[512];
    int n = snprintf(req, sizeof req,
                     "POST /cache/clear HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n",
                     MAX_BODY + 1);
    response r = raw(f->port, req, (size_t)n);
    assert_int_equal(r.status, 413);
    free_response(&r);
    /* Chunked, growing past the limit. */
    size_t chunk = 16384, total = 0;
    char *big = malloc(MAX_BODY * 2 + 4096);
    size_t len = (size_t)sprintf(big, "POST /cache/clear HTTP/1.1\r\nHost: x\r\n"
                                      "Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n");
    while (total <= MAX_BODY) {
        len += (size_t)sprintf(big + len, "%zx\r\n", chunk);
        memset(big + len, ' ', chunk);
        len += chunk;
        len += (size_t)sprintf(big + len, "\r\n");
        total += chunk;
    }
    len += (size_t)sprintf(big + len, "0\r\n\r\n");
    r = raw(f->port, big, len);
    free(big);
    assert_int_equal(r.status, 413);
    free_response(&r);
    assert_int_equal(atomic_load(&f->clears), 0);
}

/* Allow goes with a 405 only, not with the answer of a route whose path
 * another method's route shares. */
static void test_allow_only_on_405(void **state)
{
    fixture *f = *state;
    response r = http(f, "PATCH", "/config/policies", NULL, "{}");
    assert_int_equal(r.status, 501);
    assert_null(strstr(r.head, "Allow:"));
    free_response(&r);
    r = http(f, "PUT", "/config/policies", NULL, NULL);
    assert_int_equal(r.status, 405);
    assert_non_null(strstr(r.head, "Allow: GET, PATCH"));
    free_response(&r);
}

/* A second server on the same fake backend, with a token and a small
 * upload budget. */
static lmc_http_server *start_guarded(fixture *f, const char *token, size_t budget)
{
    lmc_http_backend b = {.user = f, .ready = fake_ready, .status = fake_status,
                          .config = fake_config, .clear = fake_clear, .metrics = fake_metrics};
    lmc_http_options o = {.host = "127.0.0.1", .max_body_bytes = MAX_BODY, .timeout_s = 2,
                          .auth_token = token, .max_buffered_bytes = budget};
    lmc_http_server *s = NULL;
    char err[256];
    assert_int_equal(lmc_http_server_start(&o, &b, f->routes, &s, err, sizeof err), 0);
    return s;
}

static response http_on(int port, const char *method, const char *path, const char *extra,
                        const char *body)
{
    fixture tmp = {.port = port};
    return http(&tmp, method, path, extra, body);
}

static json_t *status_member(int port, const char *name)
{
    response r = http_on(port, "GET", "/status", NULL, NULL);
    assert_int_equal(r.status, 200);
    json_t *all = body_json(&r);
    json_t *m = json_incref(json_object_get(all, name));
    json_decref(all);
    free_response(&r);
    assert_non_null(m);
    return m;
}

static void test_bearer_token(void **state)
{
    fixture *f = *state;
    lmc_http_server *s = start_guarded(f, "tok-123", 0);
    int port = lmc_http_server_port(s);
    int clears = atomic_load(&f->clears);
    static const char *const wrong[] = {NULL, "Authorization: Bearer tok-12\r\n",
                                        "Authorization: Basic tok-123\r\n"};
    for (size_t i = 0; i < sizeof wrong / sizeof wrong[0]; i++) {
        response r = http_on(port, "POST", "/cache/clear", wrong[i], NULL);
        assert_int_equal(r.status, 401);
        assert_non_null(strstr(r.head, "WWW-Authenticate: Bearer"));
        assert_non_null(strstr(r.body, "\"detail\""));
        free_response(&r);
    }
    /* The token is checked before the body's size: a stranger learns no limit. */
    char req[256];
    int n = snprintf(req, sizeof req, "POST /cache/clear HTTP/1.1\r\nHost: x\r\n"
                                      "Content-Length: %d\r\n\r\n", MAX_BODY * 4);
    response r = raw(port, req, (size_t)n);
    assert_int_equal(r.status, 401);
    free_response(&r);
    assert_int_equal(atomic_load(&f->clears), clears);
    r = http_on(port, "POST", "/cache/clear", "Authorization: Bearer tok-123\r\n", NULL);
    assert_int_equal(r.status, 200);
    free_response(&r);
    assert_int_equal(atomic_load(&f->clears), clears + 1);
    r = http_on(port, "GET", "/config", NULL, NULL);
    assert_int_equal(r.status, 401);
    free_response(&r);
    r = http_on(port, "GET", "/healthcheck", NULL, NULL);
    assert_int_equal(r.status, 200);
    free_response(&r);
    json_t *auth = status_member(port, "http_auth");
    assert_true(json_is_true(json_object_get(auth, "enabled")));
    assert_int_equal(json_integer_value(json_object_get(auth, "rejected")), 5);
    json_decref(auth);
    lmc_http_server_stop(s);
}

/* GET routes read no body: a large one is refused from the headers. */
static void test_get_body_refused_early(void **state)
{
    fixture *f = *state;
    char req[256];
    int n = snprintf(req, sizeof req,
                     "GET /healthcheck HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n",
                     MAX_BODY);
    response r = raw(f->port, req, (size_t)n);
    assert_int_equal(r.status, 413);
    free_response(&r);
    expect(f, "GET", "/config/policies", "{}", 501, NULL); /* a few bytes still pass */
}

static size_t buffered(int port)
{
    json_t *up = status_member(port, "http_uploads");
    size_t n = (size_t)json_integer_value(json_object_get(up, "buffered_bytes"));
    json_decref(up);
    return n;
}

static void wait_buffered(int port, size_t want)
{
    for (int i = 0; i < 500 && buffered(port) != want; i++)
        usleep(10000);
    assert_int_equal(buffered(port), want);
}

/* One upload holds most of the budget: the next is answered 503 from its
 * headers; once the first connection is gone its bytes are free again. */
static void test_upload_budget(void **state)
{
    fixture *f = *state;
    lmc_http_server *s = start_guarded(f, NULL, 4096);
    int port = lmc_http_server_port(s);
    int clears = atomic_load(&f->clears);
    int held = connect_to(port);
    char part[4096];
    int n = snprintf(part, sizeof part, "POST /cache/clear HTTP/1.1\r\nHost: x\r\n"
                                        "Content-Length: 3000\r\n\r\n");
    memset(part + n, ' ', 2500);
    send_all(held, part, (size_t)n + 2500);
    wait_buffered(port, 2500);
    char body[2001];
    memset(body, ' ', 2000);
    body[2000] = '\0';
    response r = http_on(port, "POST", "/cache/clear", NULL, body); /* 2000 > 4096 - 2500 */
    assert_int_equal(r.status, 503);
    assert_non_null(strstr(r.head, "Retry-After: 1"));
    free_response(&r);
    close(held); /* aborted mid-body: the completion callback frees its bytes */
    wait_buffered(port, 0);
    json_t *up = status_member(port, "http_uploads");
    assert_int_equal(json_integer_value(json_object_get(up, "refused_over_budget")), 1);
    json_decref(up);
    /* Over the budget itself: 413, it could never fit. */
    n = snprintf(part, sizeof part, "POST /cache/clear HTTP/1.1\r\nHost: x\r\n"
                                    "Content-Length: 4097\r\n\r\n");
    r = raw(port, part, (size_t)n);
    assert_int_equal(r.status, 413);
    free_response(&r);
    lmc_http_server_stop(s);
    assert_int_equal(atomic_load(&f->clears), clears);
}

static void test_garbage_keeps_serving(void **state)
{
    fixture *f = *state;
    static const char *const junk[] = {
        "GARBAGE\r\n\r\n",
        "GET / HTTP/9.9\r\n\r\n",
        "GET /status HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n",
        "POST /cache/clear HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999999999999\r\n\r\n",
        "\x01\x02\x03\xff\xfe\r\n\r\n",
        "GET /%00%ff HTTP/1.1\r\nHost: x\r\n\r\n",
    };
    for (size_t i = 0; i < sizeof junk / sizeof junk[0]; i++) {
        response r = raw(f->port, junk[i], strlen(junk[i]));
        free_response(&r);
    }
    /* Half a request, then hang up. */
    int fd = connect_to(f->port);
    send_all(fd, "POST /cache/clear HTTP/1.1\r\nContent-Length: 100\r\n\r\n{", 53);
    close(fd);
    expect(f, "GET", "/healthcheck", NULL, 200, "{\"status\":\"healthy\"}");
    assert_int_equal(atomic_load(&f->clears), 0);
}

static void test_bind_errors(void **state)
{
    fixture *f = *state;
    lmc_http_backend b = {0};
    lmc_http_options o = {.host = "127.0.0.1", .port = f->port};
    lmc_http_server *s = NULL;
    char err[256] = "";
    assert_int_equal(lmc_http_server_start(&o, &b, f->routes, &s, err, sizeof err), -1);
    assert_non_null(strstr(err, "cannot listen"));
    o.host = "no-such-host.invalid";
    o.port = 0;
    assert_int_equal(lmc_http_server_start(&o, &b, f->routes, &s, err, sizeof err), -1);
    assert_non_null(strstr(err, "--http-host"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_root_and_health),
        cmocka_unit_test(test_not_ready),
        cmocka_unit_test(test_status_and_pressure),
        cmocka_unit_test(test_version_config),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_owner_rows),
        cmocka_unit_test(test_unsealed_table),
        cmocka_unit_test(test_threads_and_metrics),
        cmocka_unit_test(test_body_limits),
        cmocka_unit_test(test_garbage_keeps_serving),
        cmocka_unit_test(test_cache_clear),
        cmocka_unit_test(test_bind_errors),
        cmocka_unit_test(test_allow_only_on_405),
        cmocka_unit_test(test_bearer_token),
        cmocka_unit_test(test_get_body_refused_early),
        cmocka_unit_test(test_upload_budget),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
