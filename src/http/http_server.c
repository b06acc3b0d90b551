/* libmicrohttpd glue: the listening socket, request bodies with a size
 * limit, and turning lmc_http_reply into a libmicrohttpd response. */
#include "http/http_server.h"

#include <errno.h>
#include <microhttpd.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "http/http_auth.h"
#include "http/http_body.h"
#include "http/http_internal.h"
#include "http/http_json.h"
#include "obs/json_dump.h"
#include "obs/log.h"

#define DEFAULT_MAX_BODY (1024u * 1024u)
#define DEFAULT_MAX_KV_BODY ((size_t)1 << 30)
/* Two KV uploads of the largest size at once (docs/http.md, "Request
 * bodies"). */
#define DEFAULT_UPLOAD_BUDGET ((size_t)2 << 30)
/* Routes that read no body (GET, HEAD, unknown paths) still get a few
 * bytes: some clients send "{}" with a GET. */
#define NO_BODY_LIMIT 1024u
/* Routes that take a token list (up to 2^20 ids of up to 11 bytes each in
 * JSON) or a key list (10,000 keys): 16 MiB with the default 1 MiB. */
#define BULK_BODY_FACTOR 16u
#define RETRY_AFTER_S "1"
#define DEFAULT_TIMEOUT_S 30u
#define DEFAULT_THREADS 2u
#define MAX_CONNECTIONS 256u
/* Per-connection memory pool: request line, headers, query arguments.
 * libmicrohttpd's default (32 KiB) ran out on a 900-byte URL with a few
 * hundred '&'-separated arguments, and libmicrohttpd then left the client
 * without an answer until the idle timeout (found by fuzzing). */
#define CONNECTION_MEMORY (128u << 10)

#define LOG_LINES_PER_SECOND 10

struct lmc_http_server {
    struct MHD_Daemon *daemon;
    int port;
    size_t max_body;
    size_t max_kv_body;
    size_t max_bulk_body;
    bool reserve_declared;
    char *over_budget_detail;        /* NULL = the frontend's own */
    char *over_whole_budget_detail;  /* NULL = the route's limit */
    lmc_http_site site;
    lmc_http_auth auth;
    lmc_http_stats stats;
    /* libmicrohttpd's messages (mostly about malformed requests) are rate
     * limited so that a flood of garbage cannot flood the log. */
    atomic_llong log_second;
    atomic_int log_lines;
    atomic_int log_suppressed;
};

/* Per-request state, from the first call of the access handler to the
 * completion callback. */
typedef struct {
    lmc_http_body_state body;
    bool replied;  /* a response was queued before the body was read */
} request_state;

/* ---- replies ------------------------------------------------------------ */

static void reply_dump(lmc_http_reply *out, unsigned status, json_t *body, size_t flags)
{
    char *text = body ? lmc_json_dumps(body, flags | JSON_ENCODE_ANY) : NULL;
    json_decref(body);
    if (!text) {
        status = MHD_HTTP_INTERNAL_SERVER_ERROR;
        text = strdup("{\"detail\":\"Internal Server Error\"}");
    }
    lmc_http_reply_text(out, status, "application/json", text);
}

void lmc_http_reply_json(lmc_http_reply *out, unsigned status, json_t *body)
{
    reply_dump(out, status, body, JSON_COMPACT);
}

void lmc_http_reply_pretty_json(lmc_http_reply *out, unsigned status, json_t *body)
{
    reply_dump(out, status, body, JSON_INDENT(2));
}

void lmc_http_reply_text(lmc_http_reply *out, unsigned status, const char *content_type,
                         char *text)
{
    free(out->body);
    out->status = status;
    out->content_type = content_type;
    out->body = text;
    out->len = text ? strlen(text) : 0;
}

const char *lmc_http_query(const lmc_http_request *req, const char *name)
{
    return req->conn ? MHD_lookup_connection_value(req->conn, MHD_GET_ARGUMENT_KIND, name) : NULL;
}

const char *lmc_http_header(const lmc_http_request *req, const char *name)
{
    return req->conn ? MHD_lookup_connection_value(req->conn, MHD_HEADER_KIND, name) : NULL;
}

static enum MHD_Result queue_reply(struct MHD_Connection *conn, lmc_http_reply *r)
{
    struct MHD_Response *resp =
        MHD_create_response_from_buffer(r->len, r->body ? r->body : (void *)"",
                                        r->body ? MHD_RESPMEM_MUST_FREE : MHD_RESPMEM_PERSISTENT);
    if (!resp) {
        free(r->body);
        return MHD_NO;
    }
    r->body = NULL; /* the response owns it now */
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, r->content_type);
    if (r->allow[0])
        MHD_add_response_header(resp, MHD_HTTP_HEADER_ALLOW, r->allow);
    for (int i = 0; i < r->n_extra; i++)
        MHD_add_response_header(resp, r->extra_names[i], r->extra_values[i]);
    enum MHD_Result rc = MHD_queue_response(conn, r->status, resp);
    MHD_destroy_response(resp);
    return rc;
}

static enum MHD_Result queue_error(struct MHD_Connection *conn, unsigned status, json_t *body,
                                   const char *header, const char *value)
{
    lmc_http_reply r = {0};
    lmc_http_reply_json(&r, status, body);
    if (header) {
        r.extra_names[0] = header;
        snprintf(r.extra_values[0], sizeof r.extra_values[0], "%s", value);
        r.n_extra = 1;
    }
    return queue_reply(conn, &r);
}

/* 413 (over the route's limit, which the budget caps) or 503 (over the
 * upload budget), worded as the owner asked (lmc_http_options). */
static enum MHD_Result queue_refusal(const lmc_http_server *s, struct MHD_Connection *conn,
                                     unsigned status, size_t limit)
{
    if (status == MHD_HTTP_CONTENT_TOO_LARGE)
        return queue_error(conn, status,
                           limit == s->stats.upload_budget && s->over_whole_budget_detail
                               ? lmc_http_detail("%s", s->over_whole_budget_detail)
                               : lmc_http_detail("request body exceeds %zu bytes", limit),
                           NULL, NULL);
    return queue_error(conn, MHD_HTTP_SERVICE_UNAVAILABLE,
                       s->over_budget_detail
                           ? lmc_http_detail("%s", s->over_budget_detail)
                           : lmc_http_detail("the server holds too many request bodies "
                                             "(--http-max-buffered-mb); retry later"),
                       MHD_HTTP_HEADER_RETRY_AFTER, RETRY_AFTER_S);
}

static enum MHD_Result queue_unauthorized(struct MHD_Connection *conn)
{
    return queue_error(conn, MHD_HTTP_UNAUTHORIZED,
                       lmc_http_detail("missing or wrong bearer token "
                                       "(Authorization: Bearer <token>)"),
                       MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer realm=\"lmcached\"");
}

/* ---- request bodies ------------------------------------------------------ */

/* The declared Content-Length; false when there is none (chunked).  A
 * value that does not parse or overflows reads as SIZE_MAX. */
static bool declared_length(struct MHD_Connection *conn, size_t *out)
{
    const char *cl =
        MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
    if (!cl)
        return false;
    errno = 0;
    char *end;
    unsigned long long n = strtoull(cl, &end, 10);
    *out = errno == ERANGE || end == cl || n > SIZE_MAX ? SIZE_MAX : (size_t)n;
    return true;
}

static size_t body_limit(const lmc_http_server *s, lmc_http_body kind)
{
    size_t limit = kind == LMC_HTTP_BODY_KV     ? s->max_kv_body
                   : kind == LMC_HTTP_BODY_BULK ? s->max_bulk_body
                   : kind == LMC_HTTP_BODY_JSON ? s->max_body
                   : NO_BODY_LIMIT < s->max_body ? NO_BODY_LIMIT : s->max_body;
    return limit < s->stats.upload_budget ? limit : s->stats.upload_budget;
}

/* ---- libmicrohttpd callbacks ------------------------------------------- */

static enum MHD_Result refuse_early(lmc_http_server *s, struct MHD_Connection *conn,
                                    request_state *rs, unsigned status)
{
    rs->replied = true;
    atomic_fetch_add(status == MHD_HTTP_CONTENT_TOO_LARGE ? &s->stats.refused_too_large
                                                          : &s->stats.refused_over_budget, 1);
    return queue_refusal(s, conn, status, rs->body.limit);
}

/* Headers are in, no body byte has been read: refuse what can be refused
 * now, the token first so that a stranger learns nothing of the limits. */
static enum MHD_Result first_call(lmc_http_server *s, struct MHD_Connection *conn,
                                  const char *url, const char *method, void **con_cls)
{
    request_state *rs = calloc(1, sizeof *rs);
    if (!rs)
        return MHD_NO;
    *con_cls = rs;
    lmc_http_policy policy = lmc_http_route_policy(&s->site, method, url);
    if (policy.access == LMC_HTTP_TOKEN &&
        !lmc_http_auth_ok(&s->auth, MHD_lookup_connection_value(conn, MHD_HEADER_KIND,
                                                                MHD_HTTP_HEADER_AUTHORIZATION))) {
        rs->replied = true;
        atomic_fetch_add(&s->stats.auth_rejected, 1);
        return queue_unauthorized(conn);
    }
    rs->body.limit = body_limit(s, policy.body);
    size_t declared;
    if (!declared_length(conn, &declared))
        return MHD_YES;
    if (declared > rs->body.limit)
        return refuse_early(s, conn, rs, MHD_HTTP_CONTENT_TOO_LARGE);
    if (s->reserve_declared ? !lmc_http_budget_reserve(&s->stats, declared)
                            : declared > lmc_http_budget_free(&s->stats))
        return refuse_early(s, conn, rs, MHD_HTTP_SERVICE_UNAVAILABLE);
    if (s->reserve_declared)
        rs->body.held = declared;
    rs->body.expected = declared;
    return MHD_YES;
}

static bool utf8(const char *s)
{
    return !s || lmc_http_utf8_prefix(s, strlen(s)) == strlen(s);
}

static enum MHD_Result check_argument(void *cls, enum MHD_ValueKind kind, const char *key,
                                      const char *value)
{
    (void)kind;
    bool *ok = cls;
    *ok = utf8(key) && utf8(value);
    return *ok ? MHD_YES : MHD_NO;
}

/* The path and the query arguments arrive percent-decoded, so they can hold
 * any bytes; the routes put them into JSON (salts, request ids, error
 * messages), which must be UTF-8.  Anything else is answered 400 here. */
static bool request_text_ok(struct MHD_Connection *conn, const char *url)
{
    bool ok = true;
    if (!utf8(url))
        return false;
    MHD_get_connection_values(conn, MHD_GET_ARGUMENT_KIND, check_argument, &ok);
    return ok;
}

/* The whole body is in: run the route, then free the body before the
 * answer goes out so that its budget serves the next upload. */
static enum MHD_Result answer(lmc_http_server *s, struct MHD_Connection *conn,
                              request_state *rs, const char *url, const char *method)
{
    rs->replied = true;
    if (rs->body.refusal)
        return queue_refusal(s, conn, rs->body.refusal, rs->body.limit);
    lmc_http_request req = {
        .site = &s->site, .method = method, .path = url,
        .body = rs->body.len ? rs->body.body : NULL, .body_len = rs->body.len, .conn = conn,
    };
    lmc_http_reply reply = {.status = MHD_HTTP_INTERNAL_SERVER_ERROR};
    if (request_text_ok(conn, url))
        lmc_http_dispatch(&req, &reply);
    else
        lmc_http_reply_json(&reply, MHD_HTTP_BAD_REQUEST,
                            lmc_http_detail("the request path and query must be UTF-8 "
                                            "(after percent-decoding)"));
    lmc_http_body_release(&rs->body, &s->stats);
    if (reply.status >= 400 && reply.status < 500)
        atomic_fetch_add(&s->stats.answered_4xx, 1);
    if (!reply.content_type)
        reply.content_type = "application/json";
    return queue_reply(conn, &reply);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version,
                                  const char *upload_data, size_t *upload_data_size,
                                  void **con_cls)
{
    (void)version;
    lmc_http_server *s = cls;
    request_state *rs = *con_cls;
    if (!rs)
        return first_call(s, conn, url, method, con_cls);
    if (*upload_data_size) {
        size_t n = *upload_data_size;
        *upload_data_size = 0;
        if (rs->replied) /* answered from the headers: drain a little, then hang up */
            return (rs->body.discarded += n) <= LMC_HTTP_DRAIN_LIMIT ? MHD_YES : MHD_NO;
        return lmc_http_body_take(&rs->body, &s->stats, upload_data, n) ? MHD_YES : MHD_NO;
    }
    if (rs->replied)
        return MHD_YES;
    return answer(s, conn, rs, url, method);
}

/* Runs for every request that reached the access handler, answered or
 * not (client gone, timeout, shutdown): the body's budget comes back. */
static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    (void)conn;
    (void)toe;
    lmc_http_server *s = cls;
    request_state *rs = *con_cls;
    if (rs) {
        lmc_http_body_release(&rs->body, &s->stats);
        free(rs);
        *con_cls = NULL;
    }
}

static bool log_allowed(lmc_http_server *s)
{
    long long now = (long long)time(NULL);
    long long prev = atomic_exchange(&s->log_second, now);
    if (prev != now) {
        atomic_store(&s->log_lines, 0);
        int dropped = atomic_exchange(&s->log_suppressed, 0);
        if (dropped > 0)
            LMC_WARN("http: %d messages suppressed", dropped);
    }
    if (atomic_fetch_add(&s->log_lines, 1) < LOG_LINES_PER_SECOND)
        return true;
    atomic_fetch_add(&s->log_suppressed, 1);
    return false;
}

static void on_mhd_log(void *cls, const char *fmt, va_list ap)
{
    if (!log_allowed(cls))
        return;
    char line[512];
    vsnprintf(line, sizeof line, fmt, ap);
    line[strcspn(line, "\n")] = '\0';
    LMC_WARN("http: %s", line);
}

/* ---- start / stop ---------------------------------------------------- */

static int bind_listener(const char *host, const char *setting, int port, int *family,
                         char *err, size_t errlen)
{
    char service[16];
    snprintf(service, sizeof service, "%d", port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE};
    struct addrinfo *res = NULL;
    int gai = getaddrinfo(host, service, &hints, &res);
    if (gai != 0) {
        snprintf(err, errlen, "%s %s: %s", setting, host, gai_strerror(gai));
        return -1;
    }
    int fd = -1, last_errno = 0;
    for (struct addrinfo *ai = res; ai && fd < 0; ai = ai->ai_next) {
        fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
        int one = 1;
        if (fd >= 0 && (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
                        bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(fd, 128) != 0)) {
            last_errno = errno;
            close(fd);
            fd = -1;
        }
        if (fd >= 0)
            *family = ai->ai_family;
    }
    freeaddrinfo(res);
    if (fd < 0)
        snprintf(err, errlen, "cannot listen on http://%s:%d: %s", host, port,
                 strerror(last_errno ? last_errno : EADDRNOTAVAIL));
    return fd;
}

/* The bound port (-1 on failure) and whether the address is loopback
 * only (127.0.0.0/8, ::1, or ::ffff:127.x.y.z). */
static int bound_port(int fd, bool *loopback)
{
    struct sockaddr_storage ss;
    socklen_t len = sizeof ss;
    *loopback = false;
    if (getsockname(fd, (struct sockaddr *)&ss, &len) != 0)
        return -1;
    if (ss.ss_family == AF_INET6) {
        const struct in6_addr *a = &((struct sockaddr_in6 *)&ss)->sin6_addr;
        *loopback = IN6_IS_ADDR_LOOPBACK(a) || (IN6_IS_ADDR_V4MAPPED(a) && a->s6_addr[12] == 127);
        return ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
    }
    const struct sockaddr_in *in = (struct sockaddr_in *)&ss;
    *loopback = (ntohl(in->sin_addr.s_addr) >> 24) == 127;
    return ntohs(in->sin_port);
}

static char *dup_or_na(const char *s)
{
    return strdup(s && *s ? s : "NA");
}

/* *out = a copy of text, or NULL for NULL; false out of memory. */
static bool copy_text(char **out, const char *text)
{
    *out = text ? strdup(text) : NULL;
    return !text || *out;
}

static void free_server(lmc_http_server *s)
{
    lmc_http_auth_free(&s->auth);
    free(s->over_budget_detail);
    free(s->over_whole_budget_detail);
    free(s->site.version);
    free(s->site.commit);
    free(s);
}

static struct MHD_Daemon *start_daemon(lmc_http_server *s, const lmc_http_options *o, int fd,
                                       int family)
{
    /* MHD_USE_ITC: without it, stopping wakes the workers through the
     * listen socket, and a worker at its share of the connection limit
     * has taken that socket out of its poll set: it would sleep until its
     * idle connections time out (30 s) before the server could exit. */
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG | MHD_USE_AUTO |
                     MHD_USE_ITC;
    if (family == AF_INET6)
        flags |= MHD_USE_IPv6;
    return MHD_start_daemon(
        flags, 0, NULL, NULL, on_request, s, MHD_OPTION_EXTERNAL_LOGGER, on_mhd_log, s,
        MHD_OPTION_LISTEN_SOCKET, (MHD_socket)fd,
        MHD_OPTION_THREAD_POOL_SIZE, (unsigned)(o->threads ? o->threads : DEFAULT_THREADS),
        MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)(o->timeout_s ? o->timeout_s : DEFAULT_TIMEOUT_S),
        MHD_OPTION_CONNECTION_LIMIT, o->max_connections ? o->max_connections : MAX_CONNECTIONS,
        MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)CONNECTION_MEMORY,
        MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
        MHD_OPTION_END);
}

/* Everything but the socket; -1 with err set on failure. */
static int configure(lmc_http_server *s, const lmc_http_options *opts,
                     const lmc_http_backend *backend, const lmc_http_routes *routes, char *err,
                     size_t errlen)
{
    s->site.backend = *backend;
    s->site.routes = routes;
    s->site.version = dup_or_na(opts->version);
    s->site.commit = dup_or_na(opts->commit);
    s->site.metrics_only = opts->metrics_only;
    s->site.stats = &s->stats;
    s->max_body = opts->max_body_bytes ? opts->max_body_bytes : DEFAULT_MAX_BODY;
    s->max_kv_body = opts->max_kv_body_bytes ? opts->max_kv_body_bytes : DEFAULT_MAX_KV_BODY;
    s->max_bulk_body =
        opts->max_bulk_body_bytes ? opts->max_bulk_body_bytes : s->max_body * BULK_BODY_FACTOR;
    s->reserve_declared = opts->reserve_declared;
    s->stats.upload_budget =
        opts->max_buffered_bytes ? opts->max_buffered_bytes : DEFAULT_UPLOAD_BUDGET;
    bool texts_ok = copy_text(&s->over_budget_detail, opts->over_budget_detail) &&
                    copy_text(&s->over_whole_budget_detail, opts->over_whole_budget_detail);
    if (!s->site.version || !s->site.commit || !texts_ok) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    if (lmc_http_auth_init(&s->auth, opts->auth_token) != 0) {
        snprintf(err, errlen, "--http-auth-token: SHA-256 is not available from OpenSSL");
        return -1;
    }
    s->site.auth_enabled = s->auth.enabled;
    return 0;
}

/* Says where the frontend listens, and warns when anyone who can reach
 * the port may clear the cache or read KV data (docs/http.md,
 * "Authentication"). */
static void announce(const lmc_http_server *s, const char *host)
{
    LMC_INFO("HTTP frontend listening on http://%s:%d (%s)", host, s->port,
             s->site.metrics_only  ? "metrics only"
             : s->site.auth_enabled ? "bearer token required on admin and KV routes"
                                    : "no authentication");
    if (!s->site.metrics_only && !s->site.auth_enabled && s->site.exposed)
        LMC_WARN("HTTP frontend on %s:%d is reachable from other hosts and has no "
                 "--http-auth-token: anyone who can connect can clear the cache and read or "
                 "write KV data (docs/http.md, \"Authentication\")", host, s->port);
}

int lmc_http_server_start(const lmc_http_options *opts, const lmc_http_backend *backend,
                          const lmc_http_routes *routes, lmc_http_server **out, char *err,
                          size_t errlen)
{
    lmc_http_server *s = calloc(1, sizeof *s);
    if (!s || !opts || !backend || !routes || opts->port < 0 || opts->port > 65535) {
        snprintf(err, errlen, s ? "invalid HTTP options" : "out of memory");
        free(s);
        return -1;
    }
    int family = AF_INET;
    const char *host = opts->host && *opts->host ? opts->host : "0.0.0.0";
    const char *setting = opts->host_setting ? opts->host_setting : "--http-host";
    int fd = configure(s, opts, backend, routes, err, errlen) == 0
                 ? bind_listener(host, setting, opts->port, &family, err, errlen)
                 : -1;
    if (fd < 0) {
        free_server(s);
        return -1;
    }
    bool loopback;
    s->port = bound_port(fd, &loopback);
    s->site.exposed = !loopback;
    s->daemon = start_daemon(s, opts, fd, family);
    if (!s->daemon) {
        snprintf(err, errlen, "cannot start the HTTP server on %s:%d", host, s->port);
        close(fd);
        free_server(s);
        return -1;
    }
    if (!opts->owner_announces)
        announce(s, host);
    *out = s;
    return 0;
}

int lmc_http_server_port(const lmc_http_server *s)
{
    return s ? s->port : -1;
}

bool lmc_http_server_exposed(const lmc_http_server *s)
{
    return s && s->site.exposed;
}

void lmc_http_server_figures(const lmc_http_server *s, lmc_http_figures *out)
{
    const lmc_http_stats *st = &s->stats;
    *out = (lmc_http_figures){
        .answered_4xx = atomic_load(&st->answered_4xx),
        .auth_rejected = atomic_load(&st->auth_rejected),
        .refused_too_large = atomic_load(&st->refused_too_large),
        .refused_over_budget = atomic_load(&st->refused_over_budget),
        .buffered_bytes = atomic_load(&st->upload_held),
    };
}

void lmc_http_server_stop(lmc_http_server *s)
{
    if (!s)
        return;
    MHD_stop_daemon(s->daemon); /* joins the threads, closes the socket */
    free_server(s);
}
