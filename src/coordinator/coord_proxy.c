/* Cache-control proxies (docs/coordinator.md, "Cache control"): a
 * prefetch submitted to, or polled from, one named server. */
#include <curl/curl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coordinator/coord_internal.h"

/* The member's address; false (404 in out) when it is not registered. */
static bool address_of(lmc_coord *co, const char *id, char *ip, size_t iplen, int *port,
                       lmc_http_reply *out)
{
    pthread_mutex_lock(&co->mu);
    coordinator_member *m = coordinator_member_find(co, id);
    if (m) {
        snprintf(ip, iplen, "%s", m->ip);
        *port = m->http_port;
    }
    pthread_mutex_unlock(&co->mu);
    if (!m)
        coordinator_reply_detail(out, 404, "unknown instance %.256s", id);
    return m != NULL;
}

/* The reason a server gave in its error body ({"detail": str} or
 * {"error": str}), or "". */
static const char *reason_of(const json_t *body)
{
    const char *why = json_string_value(json_object_get(body, "detail"));
    if (!why)
        why = json_string_value(json_object_get(body, "error"));
    return why ? why : "";
}

/* The server's answer: 2xx and 4xx relayed, JSON; 5xx, a failed call or
 * a non-JSON body are 502, with the server's own reason when it gave one
 * (the operator's next step is in it: docs/coordinator.md). */
static json_t *relay(long status, char *reply, const char *err, lmc_http_reply *out)
{
    json_t *body = reply ? json_loads(reply, JSON_DECODE_ANY, NULL) : NULL;
    free(reply);
    if (!status || status >= 500 || !body) {
        const char *why = reason_of(body);
        if (status && !body)
            coordinator_reply_detail(out, 502, "the server answered %ld without a JSON body",
                                     status);
        else if (status)
            coordinator_reply_detail(out, 502, "the server answered %ld%s%.300s", status,
                                     *why ? ": " : "", why);
        else
            coordinator_reply_detail(out, 502, "the server could not be reached: %s", err);
        json_decref(body);
        return NULL;
    }
    return body;
}

void coordinator_ep_prefetch(const lmc_http_request *rq, lmc_http_reply *out, void *ctx,
                             const char *arg)
{
    lmc_coord *co = ctx;
    (void)arg;
    json_t *b = coordinator_body_object(rq, out);
    if (!b)
        return;
    coordinator_token_query q;
    char why[200], ip[256], err[256] = "", *reply = NULL, *text = NULL;
    int port;
    const char *id = json_string_value(json_object_get(b, "instance_id"));
    if (!id || !*id) {
        coordinator_reply_detail(out, 422, "instance_id must be a non-empty str");
        goto done;
    }
    if (coordinator_token_query_parse(b, &q, why, sizeof why) != 0) {
        coordinator_reply_detail(out, 422, "%s", why);
        goto done;
    }
    coordinator_token_query_free(&q);
    if (!address_of(co, id, ip, sizeof ip, &port, out))
        goto done;
    json_t *fwd = json_deep_copy(b);
    json_object_del(fwd, "instance_id");
    text = fwd ? json_dumps(fwd, JSON_COMPACT) : NULL;
    json_decref(fwd);
    if (!text) {
        coordinator_reply_detail(out, 500, "out of memory");
        goto done;
    }
    long st = coordinator_call(co, "POST", ip, port, "/cache/prefetches", text, &reply, err, sizeof err);
    json_t *body = relay(st, reply, err, out);
    if (body && json_is_object(body) && st < 300)
        json_object_set_new(body, "instance_id", json_string(id));
    if (body)
        lmc_http_reply_json(out, (unsigned)st, body);
done:
    free(text);
    json_decref(b);
}

/* GET /cache/prefetches/{instance_id}/{request_id}; arg: the prefix. */
void coordinator_ep_prefetch_status(const lmc_http_request *rq, lmc_http_reply *out, void *ctx,
                                    const char *arg)
{
    lmc_coord *co = ctx;
    const char *rest = rq->path + strlen(arg);
    const char *slash = strchr(rest, '/');
    char id[COORD_INSTANCE_ID_MAX + 1], ip[256], err[256] = "", *reply = NULL, path[512];
    if (!slash || !slash[1] || (size_t)(slash - rest) > COORD_INSTANCE_ID_MAX ||
        strlen(slash + 1) > 256)
        return coordinator_reply_detail(out, 404, "expected /cache/prefetches/{instance_id}/"
                                            "{request_id}");
    memcpy(id, rest, (size_t)(slash - rest));
    id[slash - rest] = '\0';
    int port;
    if (!address_of(co, id, ip, sizeof ip, &port, out))
        return;
    char *esc = curl_easy_escape(NULL, slash + 1, 0);
    if (!esc)
        return coordinator_reply_detail(out, 500, "out of memory");
    snprintf(path, sizeof path, "/cache/prefetches/%s", esc);
    curl_free(esc);
    long st = coordinator_call(co, "GET", ip, port, path, NULL, &reply, err, sizeof err);
    json_t *body = relay(st, reply, err, out);
    if (body)
        lmc_http_reply_json(out, (unsigned)st, body);
}
