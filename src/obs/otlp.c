/* OTLP/HTTP JSON exporter (otlp.h). */
#include "obs/otlp.h"

#include <curl/curl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/periodic.h"
#include "obs/json_dump.h"
#include "obs/log.h"

struct lmc_otlp {
    char *metrics_url, *traces_url, *instance_id, *version;
    double interval_s;
    long timeout_ms;
    lmc_metrics *metrics;
    lmc_span_recorder *spans;
    lmc_metric *exports;      /* lmcache_mp_otlp_exports_total{signal,result} */
    uint64_t start_ns;
    lmc_core_periodic *thread;
};

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

/* ---- request bodies ---------------------------------------------------- */

void lmc_otlp_metric_name(const char *family, const char *type, char *buf, size_t len)
{
    size_t n = strlen(family);
    if (strcmp(type, "counter") == 0 && n > 6 && strcmp(family + n - 6, "_total") == 0)
        n -= 6;
    if (strncmp(family, "lmcache_mp_", 11) == 0 && n > 11)
        snprintf(buf, len, "lmcache_mp.%.*s", (int)(n - 11), family + 11);
    else
        snprintf(buf, len, "%.*s", (int)n, family);
}

static json_t *resource(const char *instance_id)
{
    return json_pack("{s:[{s:s, s:{s:s}}, {s:s, s:{s:s}}]}", "attributes", "key",
                     "service.name", "value", "stringValue", "lmcached", "key",
                     "service.instance.id", "value", "stringValue", instance_id);
}

static json_t *label_attrs(const json_t *labels)
{
    json_t *attrs = json_array();
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)labels, k, v)
        json_array_append_new(attrs, json_pack("{s:s, s:{s:s}}", "key", k, "value",
                                               "stringValue", json_string_value(v)));
    return attrs;
}

static json_t *u64_str(uint64_t v)
{
    char buf[24];
    snprintf(buf, sizeof buf, "%llu", (unsigned long long)v);
    return json_string(buf);
}

static json_t *data_point(const json_t *s, bool histogram, uint64_t t0, uint64_t t1)
{
    json_t *p = json_pack("{s:o, s:o, s:o}", "attributes",
                          label_attrs(json_object_get(s, "labels")), "startTimeUnixNano",
                          u64_str(t0), "timeUnixNano", u64_str(t1));
    if (!histogram) {
        json_object_set_new(p, "asDouble", json_real(json_number_value(json_object_get(s, "value"))));
        return p;
    }
    json_t *counts = json_array();
    size_t i;
    json_t *b;
    json_array_foreach(json_object_get(s, "buckets"), i, b)
        json_array_append_new(counts, u64_str((uint64_t)json_integer_value(b)));
    json_object_set_new(p, "count",
                        u64_str((uint64_t)json_integer_value(json_object_get(s, "count"))));
    json_object_set_new(p, "sum", json_real(json_number_value(json_object_get(s, "sum"))));
    json_object_set_new(p, "bucketCounts", counts);
    return p;
}

static json_t *metric_json(const json_t *fam, uint64_t t0, uint64_t t1)
{
    const char *type = json_string_value(json_object_get(fam, "type"));
    const char *family = json_string_value(json_object_get(fam, "name"));
    if (!type || !family)
        return NULL;
    bool hist = strcmp(type, "histogram") == 0, counter = strcmp(type, "counter") == 0;
    json_t *points = json_array();
    size_t i;
    json_t *s;
    json_array_foreach(json_object_get(fam, "series"), i, s)
        json_array_append_new(points, data_point(s, hist, t0, t1));
    json_t *data = json_pack("{s:o}", "dataPoints", points);
    if (hist) {
        json_object_set_new(data, "aggregationTemporality", json_integer(2));
        for (size_t k = 0; k < json_array_size(points); k++)
            json_object_set(json_array_get(points, k), "explicitBounds",
                            json_object_get(fam, "bounds"));
    } else if (counter) {
        json_object_set_new(data, "aggregationTemporality", json_integer(2)); /* cumulative */
        json_object_set_new(data, "isMonotonic", json_true());
    }
    char name[256];
    lmc_otlp_metric_name(family, type, name, sizeof name);
    return json_pack("{s:s, s:s, s:o}", "name", name, "description",
                     json_string_value(json_object_get(fam, "help")),
                     hist ? "histogram" : counter ? "sum" : "gauge", data);
}

json_t *lmc_otlp_metrics_body(const json_t *snapshot, const char *instance_id,
                              const char *version, uint64_t start_ns, uint64_t t_ns)
{
    json_t *metrics = json_array();
    size_t i;
    json_t *fam;
    json_array_foreach(snapshot, i, fam) {
        json_t *m = metric_json(fam, start_ns, t_ns);
        if (m)
            json_array_append_new(metrics, m);
    }
    return json_pack("{s:[{s:o, s:[{s:{s:s, s:s}, s:o}]}]}", "resourceMetrics", "resource",
                     resource(instance_id), "scopeMetrics", "scope", "name", "lmcached",
                     "version", version, "metrics", metrics);
}

json_t *lmc_otlp_traces_body(json_t *spans, const char *instance_id, const char *version)
{
    return json_pack("{s:[{s:o, s:[{s:{s:s, s:s}, s:o}]}]}", "resourceSpans", "resource",
                     resource(instance_id), "scopeSpans", "scope", "name", "lmcached",
                     "version", version, "spans", spans);
}

/* ---- sending ----------------------------------------------------------- */

static size_t discard(char *p, size_t size, size_t n, void *user)
{
    (void)p;
    (void)user;
    return size * n;
}

/* POSTs `body` (stolen); true on a 2xx answer. */
static bool post_json(lmc_otlp *x, const char *url, json_t *body)
{
    char *text = body ? lmc_json_dumps(body, JSON_COMPACT) : NULL;
    json_decref(body);
    CURL *c = text ? curl_easy_init() : NULL;
    if (!c) {
        free(text);
        return false;
    }
    struct curl_slist *hdr = curl_slist_append(NULL, "Content-Type: application/json");
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, hdr);
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, text);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, x->timeout_ms);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, discard);
    CURLcode rc = curl_easy_perform(c);
    long status = 0;
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
    if (rc != CURLE_OK || status < 200 || status >= 300)
        LMC_DEBUG("OTLP POST %s failed: %s (HTTP %ld)", url, curl_easy_strerror(rc), status);
    curl_slist_free_all(hdr);
    curl_easy_cleanup(c);
    free(text);
    return rc == CURLE_OK && status >= 200 && status < 300;
}

static void count_export(lmc_otlp *x, const char *signal, bool ok)
{
    const char *values[] = {signal, ok ? "success" : "failure"};
    lmc_metric_add(x->exports, values, 1);
}

static void export_once(lmc_otlp *x)
{
    if (x->metrics) {
        json_t *snap = lmc_metrics_snapshot(x->metrics);
        json_t *body = lmc_otlp_metrics_body(snap, x->instance_id, x->version, x->start_ns,
                                             now_ns());
        json_decref(snap);
        count_export(x, "metrics", post_json(x, x->metrics_url, body));
    }
    if (x->spans) {
        json_t *spans = lmc_span_recorder_take(x->spans);
        if (json_array_size(spans) == 0) {
            json_decref(spans);
            return;
        }
        json_t *body = lmc_otlp_traces_body(spans, x->instance_id, x->version);
        count_export(x, "traces", post_json(x, x->traces_url, body));
    }
}

static void export_periodically(void *x)
{
    export_once(x);
}

/* ---- lifecycle --------------------------------------------------------- */

static char *join_url(const char *endpoint, const char *path)
{
    size_t n = strlen(endpoint);
    while (n && endpoint[n - 1] == '/')
        n--;
    char *url = malloc(n + strlen(path) + 1);
    if (url)
        sprintf(url, "%.*s%s", (int)n, endpoint, path);
    return url;
}

static void free_exporter(lmc_otlp *x)
{
    free(x->metrics_url);
    free(x->traces_url);
    free(x->instance_id);
    free(x->version);
    free(x);
}

static bool init_exporter(lmc_otlp *x, const lmc_otlp_options *o)
{
    static const char *const labels[] = {"signal", "result", NULL};
    x->metrics_url = join_url(o->endpoint, "/v1/metrics");
    x->traces_url = join_url(o->endpoint, "/v1/traces");
    x->instance_id = strdup(o->instance_id ? o->instance_id : "");
    x->version = strdup(o->version ? o->version : "");
    x->interval_s = o->interval_s;
    x->timeout_ms = (long)((o->timeout_s > 0 ? o->timeout_s : 5.0) * 1000);
    x->metrics = o->metrics;
    x->spans = o->spans;
    x->start_ns = now_ns();
    if (o->metrics)
        x->exports = lmc_metrics_counter(o->metrics, "lmcache_mp_otlp_exports_total",
                                         "OTLP export requests, by signal and result", labels);
    return x->metrics_url && x->traces_url && x->instance_id && x->version &&
           (!o->metrics || x->exports);
}

lmc_otlp *lmc_otlp_start(const lmc_otlp_options *o, char *err, size_t errlen)
{
    if (!o->endpoint || !*o->endpoint || !(o->interval_s > 0)) {
        snprintf(err, errlen, "OTLP: an endpoint and an interval > 0 are required");
        return NULL;
    }
    lmc_otlp *x = calloc(1, sizeof *x);
    if (!x || !init_exporter(x, o)) {
        if (x)
            free_exporter(x);
        snprintf(err, errlen, "OTLP: out of memory");
        return NULL;
    }
    curl_global_init(CURL_GLOBAL_DEFAULT);
    /* To the millisecond, the unit OTEL_METRIC_EXPORT_INTERVAL is given in. */
    int64_t period_ms = (int64_t)(x->interval_s * 1000 + 0.5);
    x->thread = lmc_core_periodic_start("lmc-otlp", period_ms, export_periodically, x);
    if (!x->thread) {
        free_exporter(x);
        curl_global_cleanup();
        snprintf(err, errlen, "OTLP: cannot start the export thread");
        return NULL;
    }
    return x;
}

void lmc_otlp_stop(lmc_otlp *x)
{
    if (!x)
        return;
    lmc_core_periodic_stop(x->thread);
    export_once(x); /* what the last period gathered */
    free_exporter(x);
    curl_global_cleanup();
}
