/* POST /events bodies, read straight from the text (coord_json_scan.h)
 * and checked field by field (docs/coordinator.md, "Cache events"): the
 * ingest path builds no JSON tree. */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coordinator/coord_events.h"
#include "core/grow.h"
#include "coordinator/coord_json_scan.h"
#include "storage/object_key.h"

typedef struct {
    bool present; /* false in a zeroed scalar: a member that never came */
    coordinator_json_kind kind;
    const char *str;
    size_t len; /* of str */
    bool is_int;
    int64_t i;
    double d;
} scalar;

/* The next value; objects and arrays are skipped (kind tells). */
static bool value(coordinator_json_scanner *s, scalar *v)
{
    memset(v, 0, sizeof *v);
    v->present = true;
    v->kind = coordinator_json_peek(s);
    switch (v->kind) {
    case JS_STRING: return (v->str = coordinator_json_string(s)) != NULL && (v->len = s->str_len, true);
    case JS_NUMBER: return coordinator_json_number(s, &v->is_int, &v->i, &v->d);
    default: return coordinator_json_skip(s);
    }
}

/* A string member that came, with its text: JS_STRING alone is not enough,
 * since a zeroed scalar has that kind too and no text. */
static bool is_str(const scalar *v)
{
    return v->present && v->kind == JS_STRING && v->str;
}

static bool int_in(const scalar *v, int64_t lo, int64_t hi)
{
    return v->present && v->kind == JS_NUMBER && v->is_int && v->i >= lo && v->i <= hi;
}

#define WHY(...) (snprintf(why, whylen, __VA_ARGS__), -1)

/* Member names are compared by length first, then bytes: a name holding
 * an escaped NUL can never match. */
#define NAME_IS(lit) (len == sizeof lit - 1 && memcmp(name, lit, sizeof lit - 1) == 0)

/* Lower-case hex digits to their value; 16 for anything else. */
static const uint8_t NIBBLE[256] = {
#define X16 16, 16, 16, 16, 16, 16, 16, 16, 16, 16, 16, 16, 16, 16, 16, 16
    X16, X16, X16,
    0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 16, 16, 16, 16, 16, 16,            /* 0x30 */
    X16,                                                            /* 0x40 */
    X16,                                                            /* 0x50 */
    16, 10, 11, 12, 13, 14, 15, 16, 16, 16, 16, 16, 16, 16, 16, 16, /* 0x60 */
    X16, X16, X16, X16, X16, X16, X16, X16, X16,         /* 0x70-0xff */
#undef X16
};

static int hash_field(const scalar *v, coordinator_wire_key *k, char *why, size_t whylen)
{
    size_t hl = v->kind == JS_STRING ? v->len : 0;
    if (!hl || hl % 2 || hl > 2 * COORD_HASH_MAX)
        return WHY("chunk_hash_hex must be lower-case hex of 1..32 bytes");
    const uint8_t *h = (const uint8_t *)v->str;
    unsigned bad = 0; /* one test after the loop instead of one per digit */
    for (size_t i = 0; i < hl / 2; i++) {
        unsigned hi = NIBBLE[h[2 * i]], lo = NIBBLE[h[2 * i + 1]];
        bad |= hi | lo;
        k->hash[i] = (uint8_t)(hi << 4 | lo);
    }
    if (bad & 16)
        return WHY("chunk_hash_hex must be lower-case hex");
    k->hash_len = (uint8_t)(hl / 2);
    return 0;
}

static int key_field(coordinator_json_scanner *s, const char *name, size_t len, coordinator_wire_key *k,
                     bool *rank_seen, char *why, size_t whylen)
{
    scalar v;
    if (!value(s, &v))
        return -1;
    if (NAME_IS("chunk_hash_hex"))
        return hash_field(&v, k, why, whylen);
    if (NAME_IS("model_name")) {
        k->model = v.kind == JS_STRING ? v.str : NULL;
        k->model_len = (uint16_t)(v.len > UINT16_MAX ? UINT16_MAX : v.len);
        return 0;
    }
    if (NAME_IS("cache_salt")) {
        k->salt = v.kind == JS_STRING ? v.str : NULL;
        k->salt_len = (uint16_t)(v.len > UINT16_MAX ? UINT16_MAX : v.len);
        return 0;
    }
    bool rank = NAME_IS("kv_rank");
    if (rank || NAME_IS("object_group_id")) {
        if (!int_in(&v, 0, UINT32_MAX))
            return WHY("kv_rank and object_group_id must be u32 integers");
        *(rank ? &k->kv_rank : &k->group) = (uint32_t)v.i;
        *rank_seen |= rank;
    }
    return 0;
}

int coordinator_events_scan_key(coordinator_json_scanner *s, coordinator_wire_key *k, char *why,
                                size_t whylen)
{
    memset(k, 0, sizeof *k);
    k->salt = "";
    if (coordinator_json_peek(s) != JS_OBJECT)
        return coordinator_json_skip(s), WHY("must be an EncodedObjectKey object");
    coordinator_json_take(s, '{');
    bool first = true, rank = false;
    k->model = NULL;
    for (const char *name; (name = coordinator_json_member(s, &first));)
        if (key_field(s, name, s->str_len, k, &rank, why, whylen) != 0)
            return -1;
    if (coordinator_json_failed(s))
        return -1;
    if (!k->hash_len)
        return WHY("chunk_hash_hex must be lower-case hex of 1..32 bytes");
    if (!k->model || !lmc_model_name_valid(k->model, k->model_len))
        return WHY("model_name must be a str of 1..%d bytes without '@'", COORD_MODEL_MAX);
    if (!k->salt || !lmc_cache_salt_valid(k->salt, k->salt_len))
        return WHY("cache_salt must be a str of at most %d bytes without '@', '/' or '\\'",
                   COORD_SALT_MAX);
    if (!rank)
        return WHY("kv_rank and object_group_id must be u32 integers");
    return 0;
}

/* The ids are kept in the request's token pool (entry->tokens_at): the
 * fleet fragment index reads a store's content from them
 * (docs/coordinator.md, "Blend lookup"). */
static int token_ids(coordinator_json_scanner *s, coordinator_event_request *r,
                     coordinator_event_entry *e, char *why, size_t whylen)
{
    if (coordinator_json_peek(s) != JS_ARRAY)
        return coordinator_json_skip(s), WHY("token_ids must be a list of at most %d ints",
                               COORD_MAX_TOKENS_PER_ENTRY);
    coordinator_json_take(s, '[');
    bool first = true;
    size_t n = 0;
    e->tokens_at = r->tokens_n;
    while (coordinator_json_element(s, &first)) {
        scalar v;
        if (!value(s, &v))
            return -1;
        if (!int_in(&v, 0, UINT32_MAX))
            return WHY("token_ids[%zu] must be an int in 0..2^32-1", n);
        if (++n > COORD_MAX_TOKENS_PER_ENTRY)
            return WHY("token_ids must be a list of at most %d ints", COORD_MAX_TOKENS_PER_ENTRY);
        if (lmc_grow_array(&r->tokens, &r->tokens_cap, r->tokens_n + 1, sizeof *r->tokens,
                           4096) != 0)
            return r->out_of_memory = true, WHY("out of memory");
        r->tokens[r->tokens_n++] = (uint32_t)v.i;
    }
    e->num_tokens = (uint32_t)n;
    return coordinator_json_failed(s) ? -1 : 0;
}

static int entry_field(coordinator_json_scanner *s, const char *name, size_t len,
                       coordinator_event_request *r, coordinator_event_entry *e, char *why,
                       size_t whylen)
{
    char kwhy[160];
    if (NAME_IS("key")) {
        if (coordinator_events_scan_key(s, &e->key, kwhy, sizeof kwhy) != 0)
            return coordinator_json_failed(s) ? -1 : WHY("key: %s", kwhy);
        return 0;
    }
    if (NAME_IS("token_ids"))
        return token_ids(s, r, e, why, whylen);
    scalar v;
    if (!value(s, &v))
        return -1;
    if (NAME_IS("size_bytes")) {
        if (!int_in(&v, 0, INT64_MAX))
            return WHY("size_bytes must be a non-negative integer");
        e->size = (uint64_t)v.i;
        e->has_size = true;
    } else if (NAME_IS("token_offset")) {
        if (!int_in(&v, -1, INT64_MAX))
            return WHY("token_offset must be an int >= -1");
        e->token_offset = v.i;
    }
    return 0;
}

static int parse_entry(coordinator_json_scanner *s, coordinator_event_request *r,
                       coordinator_event_entry *e, char *why, size_t whylen)
{
    memset(e, 0, sizeof *e);
    e->token_offset = -1;
    if (coordinator_json_peek(s) != JS_OBJECT)
        return coordinator_json_skip(s), WHY("must be an object");
    coordinator_json_take(s, '{');
    bool first = true, has_key = false;
    for (const char *name; (name = coordinator_json_member(s, &first));) {
        size_t len = s->str_len;
        has_key |= NAME_IS("key");
        if (entry_field(s, name, len, r, e, why, whylen) != 0)
            return -1;
    }
    if (coordinator_json_failed(s))
        return -1;
    return has_key ? 0 : WHY("key: must be an EncodedObjectKey object");
}

/* ---- batches ------------------------------------------------------------------- */

static coordinator_event_entry *pool_slot(coordinator_event_request *r)
{
    if (lmc_grow_array(&r->pool, &r->pool_cap, r->pool_n + 1, sizeof *r->pool, 1024) != 0)
        return NULL;
    return &r->pool[r->pool_n++];
}

static int entries(coordinator_json_scanner *s, coordinator_event_request *r, coordinator_event_batch *b, char *why,
                   size_t whylen)
{
    if (coordinator_json_peek(s) != JS_ARRAY)
        return coordinator_json_skip(s), WHY("entries must be a list");
    coordinator_json_take(s, '[');
    b->first = r->pool_n; /* a repeated "entries" replaces the earlier one */
    b->n = 0;
    bool first = true;
    while (coordinator_json_element(s, &first)) {
        if (r->pool_n >= COORD_MAX_ENTRIES)
            return WHY("more than %d entries in one request", COORD_MAX_ENTRIES);
        coordinator_event_entry *e = pool_slot(r);
        char ewhy[240] = "";
        if (!e)
            return r->out_of_memory = true, WHY("out of memory");
        if (parse_entry(s, r, e, ewhy, sizeof ewhy) != 0)
            return coordinator_json_failed(s) ? -1 : WHY("entries[%zu]: %s", b->n, ewhy);
        b->n++;
    }
    return coordinator_json_failed(s) ? -1 : 0;
}

/* Every member of a batch but its entries, as it came (present false when
 * it did not). */
typedef struct {
    scalar id, inc, seq, type, tier, backend, shared, ts, cap, rev;
    bool has_entries;
} batch_fields;

static int batch_field(coordinator_json_scanner *s, const char *name, coordinator_event_request *r,
                       coordinator_event_batch *b, batch_fields *f, char *why, size_t whylen)
{
    size_t len = s->str_len;
    if (NAME_IS("entries")) {
        f->has_entries = true;
        return entries(s, r, b, why, whylen);
    }
    static const struct {
        const char *name;
        size_t offset;
    } members[] = {
        {"instance_id", offsetof(batch_fields, id)},  {"incarnation", offsetof(batch_fields, inc)},
        {"seq", offsetof(batch_fields, seq)},          {"event_type", offsetof(batch_fields, type)},
        {"tier", offsetof(batch_fields, tier)},        {"backend", offsetof(batch_fields, backend)},
        {"shared", offsetof(batch_fields, shared)},    {"ts", offsetof(batch_fields, ts)},
        {"capacity_bytes", offsetof(batch_fields, cap)},
        {"capacity_revision", offsetof(batch_fields, rev)},
    };
    scalar v;
    if (!value(s, &v))
        return -1;
    for (size_t i = 0; i < sizeof members / sizeof *members; i++)
        if (strcmp(name, members[i].name) == 0)
            *(scalar *)((char *)f + members[i].offset) = v;
    return 0; /* other members are ignored */
}

static int event_type(const scalar *v, coordinator_event_type *out)
{
    static const char *const names[] = {"store", "delete", "access", "config"};
    for (int i = 0; is_str(v) && i < 4; i++)
        if (strcmp(v->str, names[i]) == 0)
            return *out = (coordinator_event_type)i, 0;
    return -1;
}

/* The members every batch must have, each checked for presence and type
 * before anything reads it; the reason names the member. */
static int check_required(coordinator_event_batch *b, const batch_fields *f, char *why, size_t whylen)
{
    if (!f->id.present)
        return WHY("instance_id is required");
    if (!is_str(&f->id) || !f->id.len || f->id.len > COORD_INSTANCE_ID_MAX)
        return WHY("instance_id must be a non-empty str of at most %d bytes",
                   COORD_INSTANCE_ID_MAX);
    if (!f->inc.present)
        return WHY("incarnation is required");
    if (!int_in(&f->inc, 0, INT64_MAX))
        return WHY("incarnation must be a non-negative integer");
    if (!f->seq.present)
        return WHY("seq is required");
    if (!int_in(&f->seq, 1, INT64_MAX))
        return WHY("seq must be an integer >= 1");
    if (!f->type.present)
        return WHY("event_type is required (store, delete, access or config)");
    if (event_type(&f->type, &b->type) != 0)
        return WHY("event_type must be a str: store, delete, access or config");
    if (!f->tier.present)
        return WHY("tier is required (l1 or l2)");
    if (!is_str(&f->tier) || (strcmp(f->tier.str, "l1") && strcmp(f->tier.str, "l2")))
        return WHY("tier must be a str: l1 or l2");
    if (!f->has_entries)
        return WHY("entries is required (a list; [] for config)");
    return 0;
}

/* The rest of the invariants, once the required members are known good. */
static int check_optional(coordinator_event_request *r, coordinator_event_batch *b, const batch_fields *f,
                          char *why, size_t whylen)
{
    bool needs_backend = b->type != COORD_EV_ACCESS;
    if (needs_backend && (!is_str(&f->backend) || !f->backend.len))
        return WHY("backend is required for %s batches (a non-empty str of at most %d bytes; "
                   "only access batches may omit it)", f->type.str, COORD_BACKEND_MAX);
    if (f->backend.present && (!is_str(&f->backend) || f->backend.len > COORD_BACKEND_MAX))
        return WHY("backend must be a str of at most %d bytes", COORD_BACKEND_MAX);
    if (f->shared.present && f->shared.kind != JS_TRUE && f->shared.kind != JS_FALSE)
        return WHY("shared must be a bool");
    if (f->ts.present && (f->ts.kind != JS_NUMBER || !isfinite(f->ts.d) || f->ts.d < 0))
        return WHY("ts must be a finite number >= 0");
    if ((f->cap.present && !int_in(&f->cap, 0, INT64_MAX)) ||
        (f->rev.present && !int_in(&f->rev, 0, INT64_MAX)))
        return WHY("capacity_bytes and capacity_revision must be non-negative integers");
    if (b->type == COORD_EV_CONFIG && b->n)
        return WHY("a config batch has no entries");
    for (size_t i = 0; b->type == COORD_EV_STORE && i < b->n; i++)
        if (!r->pool[b->first + i].has_size)
            return WHY("entries[%zu]: size_bytes must be a non-negative integer (required for "
                       "store)", i);
    return 0;
}

/* The invariants, once every member of the batch is known. */
static int check_batch(coordinator_event_request *r, coordinator_event_batch *b, const batch_fields *f,
                       char *why, size_t whylen)
{
    if (check_required(b, f, why, whylen) != 0 || check_optional(r, b, f, why, whylen) != 0)
        return -1;
    b->instance_id = f->id.str;
    b->incarnation = f->inc.i;
    b->seq = f->seq.i;
    b->l2 = strcmp(f->tier.str, "l2") == 0;
    b->backend = f->backend.present ? f->backend.str : "";
    b->shared = f->shared.kind == JS_TRUE;
    b->capacity_bytes = f->cap.present ? (uint64_t)f->cap.i : 0;
    b->capacity_revision = f->rev.present ? (uint64_t)f->rev.i : 0;
    return 0;
}

static int parse_batch(coordinator_json_scanner *s, coordinator_event_request *r, coordinator_event_batch *b, char *why,
                       size_t whylen)
{
    memset(b, 0, sizeof *b);
    if (coordinator_json_peek(s) != JS_OBJECT)
        return coordinator_json_skip(s), WHY("must be a CacheEventBatch object");
    coordinator_json_take(s, '{');
    batch_fields f = {0};
    bool first = true;
    for (const char *name; (name = coordinator_json_member(s, &first));)
        if (batch_field(s, name, r, b, &f, why, whylen) != 0)
            return -1;
    return coordinator_json_failed(s) ? -1 : check_batch(r, b, &f, why, whylen);
}

static int batches(coordinator_json_scanner *s, coordinator_event_request *r, char *why, size_t whylen)
{
    if (coordinator_json_peek(s) != JS_ARRAY)
        return coordinator_json_skip(s), WHY("body must be {\"batches\": [CacheEventBatch]}");
    coordinator_json_take(s, '[');
    r->n = 0; /* a repeated "batches" replaces the earlier one */
    bool first = true;
    while (coordinator_json_element(s, &first)) {
        if (r->n == COORD_MAX_BATCHES)
            return WHY("more than %d batches in one request", COORD_MAX_BATCHES);
        if (lmc_grow_array(&r->batches, &r->cap, r->n + 1, sizeof *r->batches, 8) != 0)
            return r->out_of_memory = true, WHY("out of memory");
        char bwhy[320] = "";
        if (parse_batch(s, r, &r->batches[r->n], bwhy, sizeof bwhy) != 0)
            return coordinator_json_failed(s) ? -1 : WHY("batches[%zu]: %s", r->n, bwhy);
        r->n++;
    }
    return coordinator_json_failed(s) ? -1 : 0;
}

static int parse_body(coordinator_json_scanner *s, coordinator_event_request *r, char *why, size_t whylen)
{
    coordinator_json_kind k = coordinator_json_peek(s);
    if (k != JS_OBJECT) {
        if (k == JS_BAD || !coordinator_json_skip(s) || !coordinator_json_at_end(s))
            return -1;
        return WHY("body must be {\"batches\": [CacheEventBatch]}");
    }
    coordinator_json_take(s, '{');
    bool first = true, seen = false;
    for (const char *name; (name = coordinator_json_member(s, &first));) {
        bool is_batches = !strcmp(name, "batches");
        seen |= is_batches;
        if (is_batches ? batches(s, r, why, whylen) != 0 : !coordinator_json_skip(s))
            return -1;
    }
    if (coordinator_json_failed(s))
        return -1;
    if (!coordinator_json_at_end(s))
        return WHY("malformed JSON: data after the document");
    return seen ? 0 : WHY("body must be {\"batches\": [CacheEventBatch]}");
}

int coordinator_events_read(char *text, size_t len, coordinator_body_reader read, bool ungated,
                            coordinator_event_request *out, char *why, size_t whylen)
{
    memset(out, 0, sizeof *out);
    out->ungated = ungated;
    coordinator_json_scanner s;
    coordinator_json_init(&s, text, len);
    why[0] = '\0';
    if (read(&s, out, why, whylen) != 0) {
        bool out_of_memory = out->out_of_memory;
        if (out_of_memory)
            snprintf(why, whylen, "out of memory");
        else if (coordinator_json_failed(&s))
            snprintf(why, whylen, "%s", s.err);
        else if (!why[0])
            snprintf(why, whylen, "malformed JSON");
        coordinator_events_request_free(out);
        return out_of_memory ? -2 : -1;
    }
    for (size_t i = 0; i < out->n; i++) /* no pool without an entry: NULL + 0 is undefined */
        out->batches[i].entries = out->pool ? out->pool + out->batches[i].first : NULL;
    return 0;
}

int coordinator_events_parse_in_place(char *text, size_t len, coordinator_event_request *out, char *why,
                                size_t whylen)
{
    return coordinator_events_read(text, len, parse_body, false, out, why, whylen);
}

int coordinator_events_parse(const char *text, size_t len, coordinator_event_request *out, char *why,
                       size_t whylen)
{
    char *copy = malloc(len + 1);
    if (!copy) {
        memset(out, 0, sizeof *out);
        return snprintf(why, whylen, "out of memory"), -2;
    }
    if (len)
        memcpy(copy, text, len);
    copy[len] = '\0';
    int rc = coordinator_events_parse_in_place(copy, len, out, why, whylen);
    if (rc != 0) {
        free(copy);
        return rc;
    }
    out->arena = copy;
    return 0;
}

void coordinator_events_request_free(coordinator_event_request *r)
{
    free(r->batches);
    free(r->pool);
    free(r->tokens);
    free(r->arena);
    memset(r, 0, sizeof *r);
}
