/* libmicrohttpd glue of the coordinator (docs/coordinator.md, "HTTP"):
 * bodies up to 16 MiB, checked from Content-Length and while streaming,
 * and all bodies held at once within MAX_BUFFERED_MB; the bearer token;
 * replies. */
#include <errno.h>
#include <microhttpd.h>
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coordinator/coord_internal.h"
#include "obs/log.h"

#define MAX_CONNECTIONS 512u
#define CONNECTION_MEMORY (128u << 10)
#define THREADS 2u

typedef struct {
    char *body;
    size_t len, cap;
    size_t limit;
    size_t reserved;  /* bytes of co->buffered this request holds (its cap) */
    unsigned refusal; /* 413 or 503 once the body was refused; the rest is drained */
    char why[200];    /* the refusal's detail */
    bool replied;
} request_state;

/* Routes that carry key or token lists get 16 MiB, the others 1 MiB
 * (docs/coordinator.md, "Bounds"). */
static enum MHD_Result queue_detail(struct MHD_Connection *conn, unsigned status,
                                    const char *msg);

static size_t body_limit(const char *url)
{
    static const char *const bulk[] = {"/events", "/directory/lookup", "/cache/pins",
                                       "/cache/prefetches"};
    for (size_t i = 0; i < sizeof bulk / sizeof *bulk; i++)
        if (strcmp(url, bulk[i]) == 0)
            return COORD_MAX_BODY;
    return COORD_MAX_SMALL_BODY;
}

/* ---- the budget of buffered bodies (docs/coordinator.md, "Bounds") ------------ */

/* n more bytes of the budget for rs: all connections together hold at
 * most co->buffer_budget.  0, or the refusal with rs->why set: 413 when
 * this body alone would not fit, 503 when the others hold the room now. */
static unsigned reserve(lmc_coord *co, request_state *rs, size_t n)
{
    size_t held = atomic_load(&co->buffered);
    do {
        if (n > co->buffer_budget - held) {
            bool alone = rs->reserved + n > co->buffer_budget;
            snprintf(rs->why, sizeof rs->why, alone
                     ? "request body exceeds the %zu bytes all request bodies may hold at once "
                       "(LMCACHE_MP_COORDINATOR_MAX_BUFFERED_MB)"
                     : "the request bodies being received fill the %zu bytes they may hold at "
                       "once (LMCACHE_MP_COORDINATOR_MAX_BUFFERED_MB); send it again later",
                     co->buffer_budget);
            return alone ? 413 : 503;
        }
    } while (!atomic_compare_exchange_weak(&co->buffered, &held, held + n));
    rs->reserved += n;
    return 0;
}

static void free_body(lmc_coord *co, request_state *rs)
{
    free(rs->body);
    rs->body = NULL;
    rs->cap = 0;
    atomic_fetch_sub(&co->buffered, rs->reserved);
    rs->reserved = 0;
}

static void count_refusal(lmc_coord *co, unsigned status)
{
    atomic_fetch_add(status == 503 ? &co->ctr.bodies_over_budget : &co->ctr.bodies_too_large, 1);
}

/* Refuses the body with status (why set): what came is freed, the rest
 * drained (libmicrohttpd answers only once the body is in); counted. */
static void refuse_body(lmc_coord *co, request_state *rs, unsigned status, size_t received)
{
    free_body(co, rs);
    rs->len = received;
    rs->refusal = status;
    count_refusal(co, status);
}

static void set_too_large(request_state *rs)
{
    snprintf(rs->why, sizeof rs->why, "request body exceeds %zu bytes", rs->limit);
}

const char *coordinator_query(const coordinator_request *rq, const char *name)
{
    return rq->conn ? MHD_lookup_connection_value(rq->conn, MHD_GET_ARGUMENT_KIND, name) : NULL;
}

void coordinator_reply_json(coordinator_reply *out, unsigned status, json_t *body)
{
    json_decref(out->json);
    out->status = body ? status : 500;
    out->json = body;
}

void coordinator_reply_detail(coordinator_reply *out, unsigned status, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    coordinator_reply_json(out, status, json_pack("{s:s}", "detail", msg));
}

json_t *coordinator_body_object(const coordinator_request *rq, coordinator_reply *out)
{
    json_error_t e;
    json_t *b = rq->body ? json_loadb(rq->body, rq->body_len, 0, &e) : NULL;
    if (json_is_object(b))
        return b;
    json_decref(b);
    if (!rq->body)
        coordinator_reply_detail(out, 422, "a JSON object body is required");
    else if (!b)
        coordinator_reply_detail(out, 422, "malformed JSON: %s (line %d, column %d)", e.text, e.line,
                           e.column);
    else
        coordinator_reply_detail(out, 422, "the body must be a JSON object");
    return NULL;
}

static enum MHD_Result queue(struct MHD_Connection *conn, coordinator_reply *r)
{
    char *text = r->text;
    const char *type = r->content_type ? r->content_type : "application/json";
    if (!text && r->json)
        text = json_dumps(r->json, JSON_COMPACT);
    json_decref(r->json);
    r->json = NULL;
    r->text = NULL;
    struct MHD_Response *resp = MHD_create_response_from_buffer(
        text ? strlen(text) : 0, text ? text : (void *)"",
        text ? MHD_RESPMEM_MUST_FREE : MHD_RESPMEM_PERSISTENT);
    if (!resp) {
        free(text);
        return MHD_NO;
    }
    if (text)
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    enum MHD_Result rc = MHD_queue_response(conn, r->status, resp);
    MHD_destroy_response(resp);
    return rc;
}

static enum MHD_Result queue_detail(struct MHD_Connection *conn, unsigned status, const char *msg)
{
    coordinator_reply r = {0};
    coordinator_reply_detail(&r, status, "%s", msg);
    return queue(conn, &r);
}

/* A declared Content-Length over the route's limit or the budget: the
 * refusal's status (why set) before any byte is read.  A length within
 * them is reserved and sizes the buffer once. */
static unsigned check_declared(lmc_coord *co, struct MHD_Connection *conn, request_state *rs)
{
    const char *cl =
        MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
    if (!cl)
        return 0;
    errno = 0;
    char *end;
    unsigned long long n = strtoull(cl, &end, 10);
    if (errno == ERANGE || end == cl || n > rs->limit)
        return set_too_large(rs), 413;
    if (!n)
        return 0;
    unsigned refusal = reserve(co, rs, n + 1);
    if (refusal)
        return refusal;
    if ((rs->body = malloc(n + 1)))
        rs->cap = n + 1;
    else
        free_body(co, rs); /* grown as it comes instead */
    return 0;
}

static enum MHD_Result first_call(lmc_coord *co, struct MHD_Connection *conn, const char *url,
                                  const char *method, void **con_cls)
{
    request_state *rs = calloc(1, sizeof *rs);
    if (!rs)
        return MHD_NO;
    *con_cls = rs;
    if (coordinator_route_guarded(method, url) &&
        !lmc_http_auth_ok(&co->auth, MHD_lookup_connection_value(conn, MHD_HEADER_KIND,
                                                                 MHD_HTTP_HEADER_AUTHORIZATION))) {
        rs->replied = true;
        atomic_fetch_add(&co->ctr.auth_rejected, 1);
        return queue_detail(conn, 401, "missing or wrong bearer token (Authorization: Bearer "
                                       "<token>)");
    }
    rs->limit = body_limit(url);
    unsigned refusal = check_declared(co, conn, rs);
    if (refusal) {
        rs->replied = true;
        count_refusal(co, refusal);
        return queue_detail(conn, refusal, rs->why);
    }
    return MHD_YES;
}

/* A chunked body past the limit or the budget is freed at once and the
 * rest read and dropped (libmicrohttpd answers only once the body is in),
 * up to the limit again; past that the connection is closed. */
static bool take(lmc_coord *co, request_state *rs, const char *data, size_t n)
{
    if (rs->refusal || rs->replied) {
        rs->len += n;
        return rs->len <= rs->limit;
    }
    if (n > rs->limit - rs->len) {
        set_too_large(rs);
        refuse_body(co, rs, 413, n);
        return true;
    }
    if (rs->len + n + 1 > rs->cap) {
        size_t cap = rs->cap ? rs->cap : 16384;
        while (cap < rs->len + n + 1)
            cap *= 2;
        unsigned refusal = reserve(co, rs, cap - rs->cap);
        if (refusal) {
            refuse_body(co, rs, refusal, n);
            return true;
        }
        char *grown = realloc(rs->body, cap);
        if (!grown)
            return false; /* the connection closes; on_completed gives the budget back */
        rs->body = grown;
        rs->cap = cap;
    }
    memcpy(rs->body + rs->len, data, n);
    rs->len += n;
    rs->body[rs->len] = '\0';
    return true;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version,
                                  const char *upload_data, size_t *upload_data_size,
                                  void **con_cls)
{
    (void)version;
    lmc_coord *co = cls;
    request_state *rs = *con_cls;
    if (!rs)
        return first_call(co, conn, url, method, con_cls);
    if (*upload_data_size) {
        size_t n = *upload_data_size;
        *upload_data_size = 0;
        return take(co, rs, upload_data, n) ? MHD_YES : MHD_NO;
    }
    if (rs->replied)
        return MHD_YES;
    rs->replied = true;
    if (rs->refusal)
        return queue_detail(conn, rs->refusal, rs->why);
    coordinator_request rq = {.method = method, .path = url, .body = rs->len ? rs->body : NULL,
                        .body_len = rs->len, .conn = conn};
    coordinator_reply reply = {.status = 500};
    coordinator_dispatch(co, &rq, &reply);
    if (reply.status >= 400 && reply.status < 500)
        atomic_fetch_add(&co->ctr.requests_rejected, 1);
    free_body(co, rs);
    return queue(conn, &reply);
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    (void)conn;
    (void)toe;
    request_state *rs = *con_cls;
    if (rs) {
        free_body(cls, rs);
        free(rs);
        *con_cls = NULL;
    }
}

static void on_mhd_log(void *cls, const char *fmt, va_list ap)
{
    (void)cls;
    char line[512];
    vsnprintf(line, sizeof line, fmt, ap);
    line[strcspn(line, "\n")] = '\0';
    LMC_DEBUG("coordinator http: %s", line);
}

static int resolve(const char *host, int port, struct sockaddr_storage *out, char *err,
                   size_t errlen)
{
    char service[16];
    snprintf(service, sizeof service, "%d", port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE};
    struct addrinfo *res = NULL;
    int gai = getaddrinfo(host, service, &hints, &res);
    if (gai != 0)
        return snprintf(err, errlen, "LMCACHE_MP_COORDINATOR_HOST %s: %s", host,
                        gai_strerror(gai)), -1;
    memset(out, 0, sizeof *out);
    memcpy(out, res->ai_addr, res->ai_addrlen);
    freeaddrinfo(res);
    return 0;
}

/* 127.0.0.0/8, ::1 and ::ffff:127.0.0.0/104: only this machine can call. */
static bool is_loopback(const struct sockaddr_storage *ss)
{
    if (ss->ss_family == AF_INET) {
        const struct sockaddr_in *in = (const struct sockaddr_in *)ss;
        return (ntohl(in->sin_addr.s_addr) >> 24) == 127;
    }
    if (ss->ss_family != AF_INET6)
        return false;
    const struct in6_addr *a = &((const struct sockaddr_in6 *)ss)->sin6_addr;
    return IN6_IS_ADDR_LOOPBACK(a) || (IN6_IS_ADDR_V4MAPPED(a) && a->s6_addr[12] == 127);
}

/* Every write route is open without a token: said once, at start, where
 * others can reach the port (docs/coordinator.md, "Authentication"). */
static void warn_if_open(const lmc_coord *co, const struct sockaddr_storage *ss)
{
    if (co->cfg.auth_token[0] || is_loopback(ss))
        return;
    LMC_WARN("coordinator: listening on %s, not a loopback address, without "
             "LMCACHE_MP_COORDINATOR_AUTH_TOKEN: anyone who can reach port %d can register and "
             "remove servers, post cache events that rewrite the key directory and L2 usage, "
             "set quotas that make the coordinator delete L2 objects through the servers, pin "
             "keys, and have it send prefetch requests to the servers. Set "
             "LMCACHE_MP_COORDINATOR_AUTH_TOKEN (docs/coordinator.md, \"Authentication\")",
             co->cfg.host, co->port);
}

int coordinator_http_start(lmc_coord *co, char *err, size_t errlen)
{
    unsigned timeout = (unsigned)(co->cfg.timeout_keep_alive_s + 0.999);
    co->buffer_budget = (size_t)co->cfg.max_buffered_mb << 20;
    struct sockaddr_storage ss;
    if (resolve(co->cfg.host, co->cfg.port, &ss, err, errlen) != 0)
        return -1;
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG | MHD_USE_AUTO |
                     MHD_USE_ITC | (ss.ss_family == AF_INET6 ? MHD_USE_IPv6 : 0);
    co->mhd = MHD_start_daemon(
        flags, (uint16_t)co->cfg.port, NULL, NULL, on_request, co, MHD_OPTION_EXTERNAL_LOGGER,
        on_mhd_log, co, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&ss,
        MHD_OPTION_THREAD_POOL_SIZE, THREADS, MHD_OPTION_CONNECTION_TIMEOUT,
        timeout ? timeout : 1u, MHD_OPTION_CONNECTION_LIMIT, MAX_CONNECTIONS,
        MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)CONNECTION_MEMORY,
        MHD_OPTION_NOTIFY_COMPLETED, on_completed, co, MHD_OPTION_END);
    if (!co->mhd)
        return snprintf(err, errlen, "cannot listen on http://%s:%d (address in use or not "
                                     "local)", co->cfg.host, co->cfg.port), -1;
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(co->mhd, MHD_DAEMON_INFO_BIND_PORT);
    co->port = info ? info->port : co->cfg.port;
    warn_if_open(co, &ss);
    return 0;
}

void coordinator_http_stop(lmc_coord *co)
{
    if (co->mhd)
        MHD_stop_daemon(co->mhd);
    co->mhd = NULL;
}
