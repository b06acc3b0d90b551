/* POST /l2/events bodies, the older L2 usage stream lmcached posts with
 * --coordinator-l2-event-reporting (docs/coordinator.md, "L2 usage events";
 * docs/fleet.md, "L2 usage stream"), read with the /events pull parser
 * into ungated L2 batches, so that the usage view, the LRU and the
 * database take them through the same path as the cache-event stream. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coordinator/coord_events.h"
#include "core/grow.h"

#define WHY(...) (snprintf(why, whylen, __VA_ARGS__), -1)

/* One event's members as they came. */
typedef struct {
    int type; /* -1 absent, 0 store, 1 lookup, 2 anything else */
    bool has_key, has_bytes, bytes_ok;
    uint64_t bytes;
} event_fields;

static int event_member(coordinator_json_scanner *s, const char *name, coordinator_event_entry *e,
                        event_fields *f, char *why, size_t whylen)
{
    if (strcmp(name, "key") == 0) {
        char kwhy[160];
        f->has_key = true;
        if (coordinator_events_scan_key(s, &e->key, kwhy, sizeof kwhy) != 0)
            return coordinator_json_failed(s) ? -1 : WHY("key: %s", kwhy);
        return 0;
    }
    bool is_type = strcmp(name, "type") == 0, is_bytes = strcmp(name, "bytes") == 0;
    coordinator_json_kind k = coordinator_json_peek(s);
    if (is_type && k == JS_STRING) {
        const char *t = coordinator_json_string(s);
        if (!t)
            return -1;
        f->type = strcmp(t, "store") == 0 ? 0 : strcmp(t, "lookup") == 0 ? 1 : 2;
        return 0;
    }
    if (is_bytes && k == JS_NUMBER) {
        bool is_int;
        int64_t i;
        double d;
        if (!coordinator_json_number(s, &is_int, &i, &d))
            return -1;
        f->has_bytes = true;
        f->bytes_ok = is_int && i >= 0;
        f->bytes = f->bytes_ok ? (uint64_t)i : 0;
        return 0;
    }
    if (is_type)
        f->type = 2;
    if (is_bytes)
        f->has_bytes = true; /* of the wrong type: bytes_ok stays false */
    return coordinator_json_skip(s) ? 0 : -1;
}

/* One event into e; its type (0 store, 1 lookup) or -1 with why. */
static int parse_event(coordinator_json_scanner *s, coordinator_event_entry *e, char *why,
                       size_t whylen)
{
    memset(e, 0, sizeof *e);
    if (coordinator_json_peek(s) != JS_OBJECT)
        return coordinator_json_skip(s), WHY("must be an object");
    coordinator_json_take(s, '{');
    event_fields f = {.type = -1};
    bool first = true;
    for (const char *name; (name = coordinator_json_member(s, &first));)
        if (event_member(s, name, e, &f, why, whylen) != 0)
            return -1;
    if (coordinator_json_failed(s))
        return -1;
    if (f.type < 0 || f.type > 1)
        return WHY("type must be a str: store or lookup");
    if (!f.has_key)
        return WHY("key: must be an EncodedObjectKey object");
    if ((f.has_bytes && !f.bytes_ok) || (f.type == 0 && !f.has_bytes))
        return WHY("bytes must be a non-negative integer (required for store)");
    e->size = f.bytes;
    e->has_size = f.type == 0;
    return f.type;
}

/* The batch the next event of type goes to: the last one when it has the
 * same type, else a new one. */
static coordinator_event_batch *batch_for(coordinator_event_request *r, int type)
{
    coordinator_event_type t = type == 0 ? COORD_EV_STORE : COORD_EV_ACCESS;
    if (r->n && r->batches[r->n - 1].type == t)
        return &r->batches[r->n - 1];
    if (lmc_grow_array(&r->batches, &r->cap, r->n + 1, sizeof *r->batches, 8) != 0)
        return NULL;
    coordinator_event_batch *b = &r->batches[r->n++];
    *b = (coordinator_event_batch){.type = t, .l2 = true, .backend = "", .first = r->pool_n};
    return b;
}

static int events(coordinator_json_scanner *s, coordinator_event_request *r, char *why,
                  size_t whylen)
{
    if (coordinator_json_peek(s) != JS_ARRAY)
        return coordinator_json_skip(s), WHY("events must be a list");
    coordinator_json_take(s, '[');
    r->n = r->pool_n = 0; /* a repeated "events" replaces the earlier one */
    bool first = true;
    while (coordinator_json_element(s, &first)) {
        if (r->pool_n >= COORD_MAX_L2_USAGE_EVENTS)
            return WHY("more than %d events in one request", COORD_MAX_L2_USAGE_EVENTS);
        if (lmc_grow_array(&r->pool, &r->pool_cap, r->pool_n + 1, sizeof *r->pool, 1024) != 0)
            return r->out_of_memory = true, WHY("out of memory");
        char ewhy[240] = "";
        int type = parse_event(s, &r->pool[r->pool_n], ewhy, sizeof ewhy);
        if (type < 0)
            return coordinator_json_failed(s) ? -1 : WHY("events[%zu]: %s", r->pool_n, ewhy);
        coordinator_event_batch *b = batch_for(r, type);
        if (!b)
            return r->out_of_memory = true, WHY("out of memory");
        r->pool_n++;
        b->n++;
    }
    return coordinator_json_failed(s) ? -1 : 0;
}

/* The envelope's members but events, as they came. */
typedef struct {
    const char *id;
    size_t id_len;
    bool has_id, has_seq, seq_ok, has_events, tier_ok;
    int64_t seq;
} envelope;

static int envelope_member(coordinator_json_scanner *s, const char *name, envelope *v)
{
    coordinator_json_kind k = coordinator_json_peek(s);
    bool is_id = strcmp(name, "instance_id") == 0, is_tier = strcmp(name, "tier") == 0;
    if ((is_id || is_tier) && k == JS_STRING) {
        const char *str = coordinator_json_string(s);
        if (!str)
            return -1;
        if (is_tier)
            v->tier_ok = strcmp(str, "l2") == 0;
        else
            v->id = str, v->id_len = s->str_len, v->has_id = true;
        return 0;
    }
    if (strcmp(name, "seq") == 0 && k == JS_NUMBER) {
        bool is_int;
        double d;
        if (!coordinator_json_number(s, &is_int, &v->seq, &d))
            return -1;
        v->has_seq = true;
        v->seq_ok = is_int && v->seq >= 0;
        return 0;
    }
    v->has_id |= is_id; /* of the wrong type: id stays NULL */
    v->has_seq |= strcmp(name, "seq") == 0;
    if (is_tier)
        v->tier_ok = false;
    return coordinator_json_skip(s) ? 0 : -1;
}

static int check_envelope(const envelope *v, char *why, size_t whylen)
{
    if (!v->id || !v->id_len || v->id_len > COORD_INSTANCE_ID_MAX)
        return WHY("instance_id must be a non-empty str of at most %d bytes",
                   COORD_INSTANCE_ID_MAX);
    if (!v->has_seq || !v->seq_ok)
        return WHY("seq must be an integer >= 0");
    if (!v->tier_ok)
        return WHY("tier must be \"l2\" (the only tier of the L2 usage stream)");
    if (!v->has_events)
        return WHY("events is required (a list)");
    return 0;
}

static int parse_body(coordinator_json_scanner *s, coordinator_event_request *r, char *why,
                      size_t whylen)
{
    static const char SHAPE[] = "body must be {\"instance_id\", \"seq\", \"events\": [...], "
                                "\"tier\": \"l2\"}";
    coordinator_json_kind k = coordinator_json_peek(s);
    if (k != JS_OBJECT) {
        if (k == JS_BAD || !coordinator_json_skip(s) || !coordinator_json_at_end(s))
            return -1;
        return WHY("%s", SHAPE);
    }
    coordinator_json_take(s, '{');
    envelope v = {.tier_ok = true}; /* tier may be left out: l2 */
    bool first = true;
    for (const char *name; (name = coordinator_json_member(s, &first));) {
        bool is_events = strcmp(name, "events") == 0;
        v.has_events |= is_events;
        if (is_events ? events(s, r, why, whylen) != 0 : envelope_member(s, name, &v) != 0)
            return -1;
    }
    if (coordinator_json_failed(s))
        return -1;
    if (!coordinator_json_at_end(s))
        return WHY("malformed JSON: data after the document");
    if (check_envelope(&v, why, whylen) != 0)
        return -1;
    for (size_t i = 0; i < r->n; i++) {
        r->batches[i].instance_id = v.id;
        r->batches[i].seq = v.seq;
    }
    return 0;
}

int coordinator_l2_usage_parse_in_place(char *text, size_t len, coordinator_event_request *out,
                                        char *why, size_t whylen)
{
    return coordinator_events_read(text, len, parse_body, true, out, why, whylen);
}
