/* The reporter thread (docs/fleet.md, "Cache-event stream" and "L2 usage
 * stream"): every flush interval it posts what the listeners buffered.
 * The listeners run on the threads whose calls produced the facts (request
 * threads for L1, adapter workers for L2): they only copy keys into the
 * bounded buffers. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fleet/fleet_internal.h"
#include "obs/log.h"
#include "storage/object_key_json.h"

/* ---- sources ------------------------------------------------------------ */

static void l1_written(void *user, const lmc_object_key *keys, size_t n)
{
    lmc_fleet *c = user;
    lmc_fleet_event_batcher_add(c->events, LMC_CEV_STORE, LMC_CEV_L1, c->l1_backend, false, keys, NULL,
                        LMC_CEV_SIZE_UNKNOWN, n);
}

static void l1_deleted(void *user, const lmc_object_key *keys, size_t n)
{
    lmc_fleet *c = user;
    lmc_fleet_event_batcher_add(c->events, LMC_CEV_DELETE, LMC_CEV_L1, c->l1_backend, false, keys, NULL,
                        0, n);
}

static void l1_accessed(void *user, const lmc_object_key *keys, size_t n)
{
    lmc_fleet *c = user;
    lmc_fleet_event_batcher_add(c->events, LMC_CEV_ACCESS, LMC_CEV_L1, "", false, keys, NULL, 0, n);
}

static void l2_usage_add(lmc_fleet *c, bool is_store, const lmc_object_key *keys,
                         const uint64_t *sizes, size_t n)
{
    pthread_mutex_lock(&c->l2_mu);
    for (size_t i = 0; i < n; i++) {
        if (c->l2_n == COORD_L2_USAGE_MAX) {
            c->l2_events_dropped += n - i;
            break;
        }
        l2_usage_event *e = &c->l2_buf[c->l2_n];
        if (!lmc_fleet_event_key_keep(&keys[i], &e->key, &e->names)) {   /* kept past the call */
            c->l2_events_dropped++;
            continue;
        }
        e->bytes = is_store && sizes ? sizes[i] : 0;
        e->is_store = is_store;
        c->l2_n++;
    }
    pthread_mutex_unlock(&c->l2_mu);
}

static void l2_placement(void *user, lmc_placement_kind kind, const char *backend, bool shared,
                         const lmc_object_key *keys, const uint64_t *sizes, size_t n)
{
    lmc_fleet *c = user;
    static const lmc_fleet_event_type types[] = {
        [LMC_PLACEMENT_STORED] = LMC_CEV_STORE,
        [LMC_PLACEMENT_DELETED] = LMC_CEV_DELETE,
        [LMC_PLACEMENT_ACCESSED] = LMC_CEV_ACCESS,
    };
    if (c->events)
        lmc_fleet_event_batcher_add(c->events, types[kind], LMC_CEV_L2, backend, shared, keys,
                            kind == LMC_PLACEMENT_STORED ? sizes : NULL, 0, n);
    if (c->l2_usage_on && kind != LMC_PLACEMENT_DELETED)   /* the older stream ignores deletes */
        l2_usage_add(c, kind == LMC_PLACEMENT_STORED, keys, sizes, n);
}

int lmc_fleet_attach_sources(lmc_fleet *c)
{
    if (!c->sm)
        return 0;
    if (c->events) {
        c->l1_listener = (lmc_storage_listener){.on_written = l1_written,
                                                .on_deleted = l1_deleted,
                                                .on_accessed = l1_accessed, .user = c};
        if (lmc_storage_manager_add_listener(c->sm, &c->l1_listener) != 0)
            return -1;
        c->l1_listening = true;
    }
    if (c->events || c->l2_usage_on) {
        c->sink = (lmc_l2_placement_sink){.fn = l2_placement, .user = c};
        if (lmc_storage_manager_add_l2_placement_sink(c->sm, &c->sink) != 0)
            return -1;
        c->sink_set = true;
    }
    return 0;
}

void lmc_fleet_detach_sources(lmc_fleet *c)
{
    if (c->sink_set)
        lmc_storage_manager_remove_l2_placement_sink(c->sm, &c->sink);
    if (c->l1_listening)
        lmc_storage_manager_remove_listener(c->sm, &c->l1_listener);
    c->sink_set = c->l1_listening = false;
}

/* One compartment per L1 backend and per L2 adapter (0 = unlimited). */
void lmc_fleet_declare_capacity(lmc_fleet *c)
{
    if (!c->events || !c->sm)
        return;
    json_t *st = lmc_storage_manager_report_status(c->sm);
    const json_t *by = json_object_get(st, "l1_capacity_bytes_by_backend");
    const json_t *l2 = json_object_get(st, "l2_adapters");
    size_t n = json_object_size(by) + json_array_size(l2), k = 0;
    lmc_fleet_event_compartment *parts = calloc(n ? n : 1, sizeof *parts);
    const char *name;
    json_t *v;
    json_object_foreach((json_t *)by, name, v) {
        if (!parts)
            break;
        parts[k] = (lmc_fleet_event_compartment){.tier = LMC_CEV_L1,
                                         .capacity_bytes = (uint64_t)json_integer_value(v)};
        snprintf(parts[k++].backend, LMC_CEV_BACKEND_MAX, "%s", name);
    }
    size_t i;
    json_array_foreach(l2, i, v) {
        if (!parts)
            break;
        const char *type = json_string_value(json_object_get(v, "type_name"));
        parts[k] = (lmc_fleet_event_compartment){
            .tier = LMC_CEV_L2, .shared = json_is_true(json_object_get(v, "shared")),
            .capacity_bytes = (uint64_t)json_integer_value(json_object_get(v, "capacity_bytes"))};
        snprintf(parts[k++].backend, LMC_CEV_BACKEND_MAX, "%s", type ? type : "");
    }
    if (!parts || lmc_fleet_event_batcher_declare(c->events, parts, k) != 0)
        LMC_WARN("coordinator: out of memory for the capacity declaration");
    free(parts);
    json_decref(st);
}

/* ---- posting ------------------------------------------------------------ */

static void resolve_l1_sizes(void *user, const lmc_object_key *keys, size_t n, uint64_t *sizes)
{
    lmc_fleet *c = user;
    lmc_storage_manager_resident_sizes(c->sm, keys, n, sizes);
}

/* Sends body; the HTTP status (0: no answer, or out of memory).  A
 * failure is logged, rate-limited, with what becomes of the post (`fate`). */
static long post_json(lmc_fleet *c, const char *path, json_t *body, warn_limiter *w,
                      const char *fate)
{
    char url[COORD_URL_MAX + 32], why[COORD_ERROR_MAX];
    snprintf(url, sizeof url, "%s%s", c->url, path);
    char *text = json_dumps(body, JSON_COMPACT);
    lmc_fleet_reply *reply = malloc(sizeof *reply);
    lmc_fleet_request rq = {.method = "POST", .url = url, .body = text,
                            .body_len = text ? strlen(text) : 0, .auth_token = c->auth_token,
                            .timeout_s = COORD_EVENTS_TIMEOUT_S};
    long status = text && reply && lmc_fleet_http(&rq, reply) == 0 ? reply->status : 0;
    if (status < 200 || status >= 300) {
        char what[64];
        snprintf(what, sizeof what, "POST %s", path);
        if (reply && text)
            lmc_fleet_describe_failure(what, reply, why, sizeof why);
        else
            snprintf(why, sizeof why, "%s: out of memory", what);
        if (lmc_fleet_warn_due(w))
            LMC_WARN("coordinator %s: %s; %s (%llu failed post(s) in a row)", c->shown_url, why,
                     fate, (unsigned long long)w->streak);
    } else if (lmc_fleet_warn_reset(w) > 0) {
        LMC_INFO("coordinator %s: %s accepted again", c->shown_url, path);
    }
    free(text);
    free(reply);
    return status;
}

/* A 4xx will be answered to the same body again (malformed, too large, a
 * wrong token): dropping it lets the stream go on.  No answer, a 5xx (the
 * coordinator's 503 "not saved"), 408 and 429 may pass: sent again. */
static lmc_fleet_event_outcome outcome_of(long status)
{
    if (status >= 200 && status < 300)
        return LMC_CEV_DELIVERED;
    if (status >= 400 && status < 500 && status != 408 && status != 429)
        return LMC_CEV_REFUSED;
    return LMC_CEV_RETRY;
}

/* Entries the last take could not encode, logged once a minute at most. */
static void warn_unencodable(lmc_fleet *c, uint64_t before)
{
    uint64_t now = lmc_fleet_event_batcher_stats(c->events).entries_unencodable;
    if (now == before)
        return;
    if (lmc_fleet_warn_due(&c->unencodable_warn))
        LMC_WARN("coordinator %s: %llu cache event(s) could not be encoded as JSON (a model "
                 "name or cache salt that is not UTF-8?) and were dropped; the other events "
                 "are sent (%llu so far)", c->shown_url, (unsigned long long)(now - before),
                 (unsigned long long)now);
}

/* One post, settled; true when it was a held post that went through, so
 * that what queued meanwhile can follow at once. */
static bool post_events_once(lmc_fleet *c)
{
    lmc_fleet_event_take taken;
    uint64_t unencodable = lmc_fleet_event_batcher_stats(c->events).entries_unencodable;
    json_t *body = lmc_fleet_event_batcher_take(c->events, lmc_fleet_wall_now(), resolve_l1_sizes, c, &taken);
    warn_unencodable(c, unencodable);
    if (!body)
        return false;
    if (c->tap.fn && !taken.retried) {   /* each batch once, as first built */
        size_t i;
        json_t *batch;
        json_array_foreach(json_object_get(body, "batches"), i, batch)
            c->tap.fn(c->tap.user, LMC_FLEET_TAP_BATCH, batch);
    }
    lmc_fleet_event_outcome outcome =
        !c->posting ? LMC_CEV_DELIVERED
                    : outcome_of(post_json(c, "/events", body, &c->event_warn,
                                           "the post is kept and sent again at the next flush "
                                           "(or dropped if refused)"));
    lmc_fleet_event_batcher_settle(c->events, &taken, outcome);
    json_decref(body);
    return outcome == LMC_CEV_DELIVERED && taken.retried;
}

static void flush_events(lmc_fleet *c)
{
    if (post_events_once(c))
        post_events_once(c);
}

static json_t *l2_usage_body(lmc_fleet *c, const l2_usage_event *ev, size_t n, uint64_t seq)
{
    json_t *list = json_array();
    for (size_t i = 0; list && i < n; i++) {
        json_t *e = json_pack("{s:s, s:o, s:I}", "type", ev[i].is_store ? "store" : "lookup",
                              "key", lmc_object_key_json(&ev[i].key), "bytes",
                              (json_int_t)ev[i].bytes);
        if (!e || json_array_append_new(list, e) != 0) {
            json_decref(list);
            return NULL;
        }
    }
    return list ? json_pack("{s:s, s:I, s:o, s:s}", "instance_id", c->configured_id, "seq",
                            (json_int_t)seq, "events", list, "tier", "l2")
                : NULL;
}

static void flush_l2_usage(lmc_fleet *c)
{
    pthread_mutex_lock(&c->l2_mu);
    size_t n = c->l2_n;
    l2_usage_event *ev = n ? malloc(n * sizeof *ev) : NULL;
    if (ev)
        memcpy(ev, c->l2_buf, n * sizeof *ev);   /* the references move along */
    else
        fleet_drop_l2_events(c->l2_buf, n), c->l2_events_dropped += n;
    c->l2_n = 0;
    uint64_t seq = ev ? ++c->l2_seq : 0;
    pthread_mutex_unlock(&c->l2_mu);
    if (!ev)
        return;
    json_t *body = l2_usage_body(c, ev, n, seq);
    long status = body ? post_json(c, "/l2/events", body, &c->l2_warn,
                                   "those events are dropped") : 0;
    bool ok = status >= 200 && status < 300;
    pthread_mutex_lock(&c->l2_mu);
    if (ok) {
        c->l2_batches_sent++;
    } else {
        c->l2_batches_dropped++;
        c->l2_events_dropped += n;
    }
    pthread_mutex_unlock(&c->l2_mu);
    json_decref(body);
    fleet_drop_l2_events(ev, n);
    free(ev);
}

void *lmc_fleet_reporter_main(void *arg)
{
    lmc_fleet *c = arg;
    double now = lmc_fleet_mono_now();
    double next_events = now, next_l2 = now + c->l2_interval;
    for (;;) {
        now = lmc_fleet_mono_now();
        if (c->events && now >= next_events) {
            flush_events(c);
            next_events = now + c->event_interval;
        }
        if (c->l2_usage_on && now >= next_l2) {
            flush_l2_usage(c);
            next_l2 = now + c->l2_interval;
        }
        double wait = 3600;
        if (c->events)
            wait = next_events - lmc_fleet_mono_now();
        if (c->l2_usage_on && next_l2 - lmc_fleet_mono_now() < wait)
            wait = next_l2 - lmc_fleet_mono_now();
        if (!lmc_fleet_sleep(c, wait > 0 ? wait : 0))
            break;
    }
    /* The final flush at shutdown, bounded by the post timeout. */
    if (c->events)
        flush_events(c);
    if (c->l2_usage_on)
        flush_l2_usage(c);
    return NULL;
}

void lmc_fleet_set_token_source(lmc_fleet *c, lmc_fleet_event_tokens_fn fn, void *user,
                                size_t chunk_size)
{
    if (c && c->events)
        lmc_fleet_event_batcher_set_tokens(c->events, fn, user, chunk_size);
}
