/* Span recorder (spans.h). */
#include "obs/spans.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "core/fnv.h"
#include "core/mix.h"
#include "obs/event_pairs.h"
#include "obs/events.h"
#include "obs/json_dump.h"

struct lmc_span_recorder {
    pthread_mutex_t lock;
    json_t *pending;         /* array of span objects */
    size_t max_pending;
    uint64_t dropped;
    uint64_t rng, trace_salt;
    lmc_event_pairs pairs;   /* drain thread only */
};

lmc_span_recorder *lmc_span_recorder_new(size_t max_pending)
{
    lmc_span_recorder *r = calloc(1, sizeof *r);
    if (!r || !(r->pending = json_array())) {
        free(r);
        return NULL;
    }
    uint64_t seed[2] = {0, 0};
    if (getrandom(seed, sizeof seed, 0) != (ssize_t)sizeof seed) {
        seed[0] = (uint64_t)time(NULL) ^ (uint64_t)(uintptr_t)r;
        seed[1] = lmc_core_mix64(seed[0]);
    }
    r->rng = seed[0] | 1;
    r->trace_salt = seed[1];
    r->max_pending = max_pending;
    pthread_mutex_init(&r->lock, NULL);
    return r;
}

/* Span name for an event type, and whether it opens a span. */
static const char *span_name(const char *type, bool *start)
{
    static const struct {
        const char *start, *end, *name;
    } kinds[] = {
        {LMC_EVENT_LOOKUP_START, LMC_EVENT_LOOKUP_END, "mp.lookup_prefetch"},
        {LMC_EVENT_STORE_START, LMC_EVENT_STORE_END, "mp.store"},
        {LMC_EVENT_RETRIEVE_START, LMC_EVENT_RETRIEVE_END, "mp.retrieve"},
    };
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
        if (strcmp(type, kinds[i].start) == 0 || strcmp(type, kinds[i].end) == 0) {
            *start = strcmp(type, kinds[i].start) == 0;
            return kinds[i].name;
        }
    }
    return NULL;
}

static json_t *str_attr(const char *key, const char *value)
{
    return json_pack("{s:s, s:{s:s}}", "key", key, "value", "stringValue", value);
}

static json_t *attributes(const lmc_event *ev, bool unpaired)
{
    json_t *attrs = json_array();
    const char *key;
    json_t *v;
    json_array_append_new(attrs, str_attr("session_id", ev->session_id));
    if (unpaired)
        json_array_append_new(attrs, str_attr("lmc.unpaired", "true"));
    json_object_foreach(ev->metadata, key, v) {
        char *text = json_is_string(v) ? NULL : lmc_json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
        json_array_append_new(attrs, str_attr(key, text ? text : json_string_value(v)));
        free(text);
    }
    return attrs;
}

static void hex64(char *out, uint64_t v)
{
    snprintf(out, 17, "%016llx", (unsigned long long)v);
}

static void unix_nanos(char *out, size_t len, double t)
{
    snprintf(out, len, "%llu", (unsigned long long)(t * 1e9));
}

static json_t *make_span(lmc_span_recorder *r, const char *name, const lmc_event *ev,
                         double start, bool unpaired)
{
    uint64_t h = lmc_fnv1a64_str(LMC_FNV1A64_OFFSET_BASIS ^ r->trace_salt, ev->session_id);
    char trace[33], span[17], t0[32], t1[32];
    hex64(trace, lmc_core_mix64(h));
    hex64(trace + 16, lmc_core_mix64(h ^ r->trace_salt));
    r->rng = lmc_core_mix64(r->rng + 0x9e3779b97f4a7c15ULL);
    hex64(span, r->rng ? r->rng : 1);
    unix_nanos(t0, sizeof t0, start);
    unix_nanos(t1, sizeof t1, ev->timestamp);
    return json_pack("{s:s, s:s, s:s, s:i, s:s, s:s, s:o, s:{}}", "traceId", trace, "spanId",
                     span, "name", name, "kind", 1, "startTimeUnixNano", t0, "endTimeUnixNano",
                     t1, "attributes", attributes(ev, unpaired), "status");
}

void lmc_span_recorder_record(lmc_span_recorder *r, const lmc_event *ev)
{
    bool is_start;
    const char *name = span_name(ev->type, &is_start);
    if (!name)
        return;
    char key[LMC_EVENT_PAIRS_KEY];
    lmc_event_pairs_key(key, name, ev->session_id, "");
    if (is_start) {
        lmc_event_pairs_put(&r->pairs, key, ev->timestamp);
        return;
    }
    double start;
    bool paired = lmc_event_pairs_take(&r->pairs, key, &start);
    pthread_mutex_lock(&r->lock);
    json_t *span = NULL;
    if (json_array_size(r->pending) < r->max_pending)
        span = make_span(r, name, ev, paired ? start : ev->timestamp, !paired);
    if (span)
        json_array_append_new(r->pending, span);
    else
        r->dropped++;
    pthread_mutex_unlock(&r->lock);
}

static void on_event(const lmc_event *ev, void *user)
{
    lmc_span_recorder_record(user, ev);
}

int lmc_span_recorder_attach(lmc_span_recorder *r, lmc_event_bus *bus)
{
    static const char *const types[] = {
        LMC_EVENT_LOOKUP_START, LMC_EVENT_LOOKUP_END,   LMC_EVENT_STORE_START,
        LMC_EVENT_STORE_END,    LMC_EVENT_RETRIEVE_START, LMC_EVENT_RETRIEVE_END,
    };
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        if (lmc_event_bus_subscribe(bus, types[i], on_event, r) != 0)
            return -1;
    }
    return 0;
}

json_t *lmc_span_recorder_take(lmc_span_recorder *r)
{
    json_t *fresh = json_array();
    if (!fresh)
        return NULL;
    pthread_mutex_lock(&r->lock);
    json_t *out = r->pending;
    r->pending = fresh;
    pthread_mutex_unlock(&r->lock);
    return out;
}

uint64_t lmc_span_recorder_dropped(lmc_span_recorder *r)
{
    pthread_mutex_lock(&r->lock);
    uint64_t d = r->dropped;
    pthread_mutex_unlock(&r->lock);
    return d;
}

void lmc_span_recorder_free(lmc_span_recorder *r)
{
    if (!r)
        return;
    json_decref(r->pending);
    pthread_mutex_destroy(&r->lock);
    free(r);
}
