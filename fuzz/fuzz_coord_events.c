/* Fuzz target: the coordinator's POST /events reader
 * (src/coordinator/coord_events_scan.c) and the JSON pull parser under it
 * (coord_json_scan.c) on arbitrary bytes, with the gate and the key table
 * behind them (coord_events.c, coord_state.c).  Besides "no crash, no
 * sanitizer report":
 *   - the pull parser takes exactly what jansson takes, but for nesting
 *     deeper than its 64 levels (and never a NUL byte, which jansson takes
 *     after a number);
 *   - the reader answers every body with a request or a reason, the same
 *     twice, and an accepted request keeps every invariant the apply path
 *     relies on (docs/coordinator.md, "Cache events");
 *   - applied to a fresh state, every batch is counted once (applied,
 *     duplicate or stale), the usage books add up, and applying it again
 *     admits nothing.
 * The same bytes go to the POST /l2/events reader (coord_l2_usage.c, the
 * older L2 usage stream): a request or a reason, the same twice; an
 * accepted one is ungated L2 store/access batches of valid keys, each
 * store with its size, covering the pool in order; applied twice, every
 * batch is applied both times and the second changes neither the key
 * count nor the bytes (a store replaces, a lookup touches). */
#include "check.h"
#include <jansson.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "coordinator/coord_events.h"
#include "coordinator/coord_json_scan.h"
#include "storage/object_key.h"

/* The deepest nesting of brackets outside strings (valid JSON only). */
static int nesting(const uint8_t *p, size_t n)
{
    int depth = 0, deepest = 0;
    bool in_string = false;
    for (size_t i = 0; i < n; i++) {
        if (in_string) {
            if (p[i] == '\\')
                i++;
            else if (p[i] == '"')
                in_string = false;
        } else if (p[i] == '"') {
            in_string = true;
        } else if (p[i] == '[' || p[i] == '{') {
            deepest = ++depth > deepest ? depth : deepest;
        } else if (p[i] == ']' || p[i] == '}') {
            depth--;
        }
    }
    return deepest;
}

static void scanner_agrees_with_jansson(const uint8_t *data, size_t len)
{
    char *text = malloc(len ? len : 1); /* exactly len bytes: a read past them is a finding */
    if (!text)
        return;
    memcpy(text, data, len);
    coordinator_json_scanner s;
    coordinator_json_init(&s, text, len);
    bool skipped = coordinator_json_skip(&s);
    CHECK(skipped || coordinator_json_failed(&s));
    bool taken = skipped && coordinator_json_at_end(&s);
    if (memchr(data, '\0', len)) {
        /* A NUL byte is valid nowhere in JSON.  jansson 2.14 takes one
         * right after a number ("[1\0]"), so it is no oracle here. */
        CHECK(!taken);
        free(text);
        return;
    }
    json_error_t jerr;
    json_t *v = json_loadb((const char *)data, len, JSON_DECODE_ANY, &jerr);
    if (taken)
        CHECK(v != NULL);
    else if (v)
        CHECK(nesting(data, len) > 64);
    json_decref(v);
    free(text);
}

static void check_key(const coordinator_wire_key *k)
{
    CHECK(k->hash_len >= 1 && k->hash_len <= COORD_HASH_MAX);
    CHECK(k->model && strlen(k->model) == k->model_len);
    CHECK(lmc_model_name_valid(k->model, k->model_len));
    CHECK(k->salt && strlen(k->salt) == k->salt_len);
    CHECK(lmc_cache_salt_valid(k->salt, k->salt_len));
}

static void check_request(const coordinator_event_request *r)
{
    CHECK(r->n <= COORD_MAX_BATCHES && r->pool_n <= COORD_MAX_ENTRIES);
    for (size_t i = 0; i < r->n; i++) {
        const coordinator_event_batch *b = &r->batches[i];
        size_t id_len = strlen(b->instance_id);
        CHECK(id_len >= 1 && id_len <= COORD_INSTANCE_ID_MAX);
        CHECK(b->incarnation >= 0 && b->seq >= 1);
        CHECK(b->type <= COORD_EV_CONFIG);
        CHECK(b->backend && strlen(b->backend) <= COORD_BACKEND_MAX);
        CHECK(b->type == COORD_EV_ACCESS || b->backend[0] != '\0');
        CHECK(b->type != COORD_EV_CONFIG || b->n == 0);
        CHECK(b->first + b->n <= r->pool_n);
        CHECK(r->pool ? b->entries == r->pool + b->first : !b->entries && !b->n);
        for (size_t j = 0; j < b->n; j++) {
            check_key(&b->entries[j].key);
            CHECK(b->type != COORD_EV_STORE || b->entries[j].has_size);
            CHECK(b->entries[j].num_tokens <= COORD_MAX_TOKENS_PER_ENTRY);
        }
    }
}

/* The per-salt books add up to the totals. */
static void check_usage(const coordinator_state *s)
{
    uint64_t l2_count = 0, l2_bytes = 0, l1_count = 0;
    for (uint32_t i = 0; i < s->salt_cap; i++) {
        l2_count += s->salt[i].l2_count;
        l2_bytes += s->salt[i].l2_bytes;
        l1_count += s->salt[i].l1_count;
    }
    CHECK(l2_count == s->l2_entries && l2_bytes == s->l2_bytes && l1_count == s->l1_entries);
    CHECK(s->keys.n_live >= s->l2_entries);
}

static void apply_twice(coordinator_event_request *r)
{
    coordinator_state s;
    if (coordinator_state_init(&s) != 0)
        return;
    coordinator_ingest_result res;
    char why[512] = "";
    if (coordinator_events_apply(&s, NULL, r, &res, why, sizeof why) == 0) {
        CHECK(res.applied + res.duplicates + res.stale == r->n);
        check_usage(&s);
        /* Every cursor is now at or past every batch of the request. */
        CHECK(coordinator_events_apply(&s, NULL, r, &res, why, sizeof why) == 0);
        CHECK(res.applied == 0 && res.duplicates + res.stale == r->n);
        check_usage(&s);
    } else {
        CHECK(why[0] != '\0');
    }
    coordinator_state_free(&s);
}

static void check_l2_usage(const coordinator_event_request *r)
{
    CHECK(r->ungated && r->pool_n <= COORD_MAX_L2_USAGE_EVENTS);
    size_t next = 0;
    for (size_t i = 0; i < r->n; i++) {
        const coordinator_event_batch *b = &r->batches[i];
        CHECK(b->l2 && (b->type == COORD_EV_STORE || b->type == COORD_EV_ACCESS));
        CHECK(b->n >= 1 && b->first == next && b->entries == r->pool + b->first);
        CHECK(i == 0 || r->batches[i - 1].type != b->type); /* runs are merged */
        size_t id_len = strlen(b->instance_id);
        CHECK(id_len >= 1 && id_len <= COORD_INSTANCE_ID_MAX && b->seq >= 0);
        for (size_t j = 0; j < b->n; j++) {
            check_key(&b->entries[j].key);
            CHECK(b->entries[j].has_size == (b->type == COORD_EV_STORE));
        }
        next += b->n;
    }
    CHECK(next == r->pool_n);
}

static void l2_usage(const uint8_t *data, size_t len)
{
    char *t1 = malloc(len + 1), *t2 = malloc(len + 1);
    if (!t1 || !t2)
        goto out;
    memcpy(t1, data, len);
    memcpy(t2, data, len);
    coordinator_event_request r1, r2;
    char why1[512] = "", why2[512] = "";
    int a = coordinator_l2_usage_parse_in_place(t1, len, &r1, why1, sizeof why1);
    int b = coordinator_l2_usage_parse_in_place(t2, len, &r2, why2, sizeof why2);
    CHECK(a == b && strcmp(why1, why2) == 0);
    CHECK(a == 0 || (a == -1 && why1[0] != '\0'));
    if (a != 0)
        goto out;
    CHECK(r1.n == r2.n && r1.pool_n == r2.pool_n);
    check_l2_usage(&r1);
    coordinator_state s;
    if (coordinator_state_init(&s) == 0) {
        coordinator_ingest_result res;
        char why[512] = "";
        if (coordinator_events_apply(&s, NULL, &r1, &res, why, sizeof why) == 0) {
            CHECK(res.applied == r1.n && s.ingest.l2_usage_events == r1.pool_n);
            check_usage(&s);
            uint64_t keys = s.l2_entries, bytes = s.l2_bytes;
            CHECK(coordinator_events_apply(&s, NULL, &r1, &res, why, sizeof why) == 0);
            CHECK(res.applied == r1.n && s.l2_entries == keys && s.l2_bytes == bytes);
            CHECK(s.ingest.applied == 0); /* the gated counters are not touched */
        } else {
            CHECK(why[0] != '\0');
        }
        coordinator_state_free(&s);
    }
    coordinator_events_request_free(&r1);
    coordinator_events_request_free(&r2);
out:
    free(t1);
    free(t2);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t len)
{
    l2_usage(data, len);
    scanner_agrees_with_jansson(data, len);
    coordinator_event_request r1, r2;
    char why1[512] = "", why2[512] = "";
    int a = coordinator_events_parse((const char *)data, len, &r1, why1, sizeof why1);
    int b = coordinator_events_parse((const char *)data, len, &r2, why2, sizeof why2);
    CHECK(a == b && strcmp(why1, why2) == 0);
    CHECK(a == 0 || (a == -1 && why1[0] != '\0'));
    if (a == 0) {
        CHECK(r1.n == r2.n && r1.pool_n == r2.pool_n);
        check_request(&r1);
        apply_twice(&r1);
        coordinator_events_request_free(&r1);
        coordinator_events_request_free(&r2);
    }
    return 0;
}
