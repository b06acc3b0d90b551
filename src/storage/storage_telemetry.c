/* Storage telemetry: see storage_telemetry.h.  The evict-reuse table
 * remembers sampled keys evicted from L1 until they are written again
 * (that gap is the l1_chunk_evict_reuse_gap metric) or EVICT_REUSE_CAP_MS
 * passes (then the gap is reported as the cap, as upstream does). */
#include "storage/storage_telemetry.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "core/hex.h"
#include "obs/events.h"
#include "storage/key_table.h"

#define EVICT_REUSE_CAP_MS 300000
#define EVICT_REUSE_MAX_KEYS 65536   /* beyond: new evictions are not tracked */

typedef struct evicted_key {
    lmc_object_key key;
    int64_t evicted_ms;
} evicted_key;

struct lmc_storage_telemetry {
    lmc_l1_manager *l1;
    lmc_clock_ms_fn clock;
    void *clock_user;
    _Atomic(lmc_event_bus *) bus;
    _Atomic double sample_rate;
    pthread_mutex_t mutex;           /* guards evicted and pending_gaps */
    lmc_key_table evicted;
    json_t *pending_gaps;            /* evict -> rewrite gaps not yet published */
};

lmc_storage_telemetry *lmc_storage_telemetry_new(lmc_l1_manager *l1, lmc_clock_ms_fn clock,
                                                 void *clock_user)
{
    lmc_storage_telemetry *t = calloc(1, sizeof *t);
    if (!t)
        return NULL;
    t->l1 = l1;
    t->clock = clock ? clock : lmc_monotonic_ms;
    t->clock_user = clock_user;
    if (lmc_key_table_init(&t->evicted, offsetof(evicted_key, key), 64) != 0) {
        free(t);
        return NULL;
    }
    pthread_mutex_init(&t->mutex, NULL);
    return t;
}

/* A remembered key holds its names (docs/storage.md, "Interned strings"). */
static void forget_eviction(evicted_key *e)
{
    if (!e)
        return;
    lmc_keys_drop(&e->key, 1);
    free(e);
}

void lmc_storage_telemetry_free(lmc_storage_telemetry *t)
{
    if (!t)
        return;
    for (size_t i = 0; i < t->evicted.capacity; i++)
        forget_eviction(lmc_key_table_slot_item(&t->evicted, i));
    lmc_key_table_destroy(&t->evicted);
    json_decref(t->pending_gaps);
    pthread_mutex_destroy(&t->mutex);
    free(t);
}

void lmc_storage_telemetry_attach(lmc_storage_telemetry *t, lmc_event_bus *bus,
                                  double sample_rate)
{
    atomic_store(&t->sample_rate, sample_rate);
    atomic_store(&t->bus, bus);
}

bool lmc_storage_telemetry_enabled(const lmc_storage_telemetry *t)
{
    return t && atomic_load(&t->bus) != NULL;
}

void lmc_storage_telemetry_publish(lmc_storage_telemetry *t, const char *type,
                                   json_t *metadata)
{
    lmc_event_bus *bus = t ? atomic_load(&t->bus) : NULL;
    if (bus)
        lmc_event_bus_publish(bus, type, "", metadata);
    else
        json_decref(metadata);
}

/* ---- sampling and lifecycle ------------------------------------------- */

bool lmc_storage_telemetry_sample(const lmc_object_key *key, void *user)
{
    lmc_storage_telemetry *t = user;
    if (!atomic_load(&t->bus))
        return false;
    char hex[2 * LMC_CHUNK_HASH_MAX + 1];
    lmc_hex_encode(key->chunk_hash, key->chunk_hash_len, hex);
    return lmc_obs_sampled(hex, atomic_load(&t->sample_rate));
}

static void remember_eviction(lmc_storage_telemetry *t, const lmc_object_key *key, int64_t now)
{
    evicted_key *e = lmc_key_table_find(&t->evicted, key);
    if (e) {
        e->evicted_ms = now;
        return;
    }
    if (t->evicted.count >= EVICT_REUSE_MAX_KEYS || !(e = malloc(sizeof *e)))
        return;
    *e = (evicted_key){*key, now};
    if (lmc_key_table_insert(&t->evicted, e) != 0)
        free(e);
    else
        lmc_keys_hold(&e->key, 1);
}

void lmc_storage_telemetry_on_evicted(void *user, const lmc_object_key *keys,
                                      const lmc_l1_object_age *ages, size_t n)
{
    lmc_storage_telemetry *t = user;
    if (!lmc_storage_telemetry_enabled(t))
        return;
    json_t *list = json_array();
    int64_t now = t->clock(t->clock_user);
    char hex[2 * LMC_CHUNK_HASH_MAX + 1];
    pthread_mutex_lock(&t->mutex);
    for (size_t i = 0; i < n; i++) {
        if (!ages[i].sampled)
            continue;
        lmc_hex_encode(keys[i].chunk_hash, keys[i].chunk_hash_len, hex);
        json_array_append_new(list, json_pack("{s:s, s:f, s:f}", "hash", hex, "lifetime_s",
                                              ages[i].lifetime_s, "idle_s", ages[i].idle_s));
        remember_eviction(t, &keys[i], now);
    }
    pthread_mutex_unlock(&t->mutex);
    if (json_array_size(list) == 0) {
        json_decref(list);
        return;
    }
    lmc_storage_telemetry_publish(t, LMC_EVENT_L1_KEYS_EVICTED, json_pack("{s:o}", "keys", list));
}

/* Under t->mutex. */
static void add_gap(lmc_storage_telemetry *t, double seconds)
{
    if (!t->pending_gaps)
        t->pending_gaps = json_array();
    json_array_append_new(t->pending_gaps, json_real(seconds));
}

/* Written keys that were evicted before: the eviction -> rewrite gap. */
static void note_rewrites(lmc_storage_telemetry *t, const lmc_object_key *keys, size_t n)
{
    pthread_mutex_lock(&t->mutex);
    if (t->evicted.count > 0) {
        int64_t now = t->clock(t->clock_user);
        for (size_t i = 0; i < n; i++) {
            evicted_key *e = lmc_key_table_remove(&t->evicted, &keys[i]);
            if (!e)
                continue;
            int64_t gap = now - e->evicted_ms;
            add_gap(t, (double)(gap < EVICT_REUSE_CAP_MS ? gap : EVICT_REUSE_CAP_MS) / 1000.0);
            forget_eviction(e);
        }
    }
    pthread_mutex_unlock(&t->mutex);
}

/* Under t->mutex: keys evicted longer ago than the cap count as the cap. */
static void expire_evictions(lmc_storage_telemetry *t, int64_t now)
{
    if (t->evicted.count == 0)
        return;
    size_t n = 0;
    evicted_key **old = malloc(t->evicted.count * sizeof *old);
    for (size_t i = 0; old && i < t->evicted.capacity; i++) {
        evicted_key *e = lmc_key_table_slot_item(&t->evicted, i);
        if (e && now - e->evicted_ms >= EVICT_REUSE_CAP_MS)
            old[n++] = e;
    }
    for (size_t i = 0; i < n; i++) {
        lmc_key_table_remove(&t->evicted, &old[i]->key);
        add_gap(t, EVICT_REUSE_CAP_MS / 1000.0);
        forget_eviction(old[i]);
    }
    free(old);
}

static json_t *take_reuse_gaps(lmc_storage_telemetry *t)
{
    double gaps[256];
    json_t *out = json_array();
    size_t got;
    do {
        got = lmc_l1_manager_take_reuse_gaps(t->l1, gaps, sizeof gaps / sizeof gaps[0]);
        for (size_t i = 0; i < got; i++)
            json_array_append_new(out, json_real(gaps[i]));
    } while (got == sizeof gaps / sizeof gaps[0]);
    return out;
}

void lmc_storage_telemetry_on_cycle(void *user, double usage_ratio, bool triggered)
{
    lmc_storage_telemetry *t = user;
    (void)triggered;
    if (!lmc_storage_telemetry_enabled(t))
        return;
    lmc_storage_telemetry_publish(t, LMC_EVENT_L1_USAGE,
                                  json_pack("{s:f}", "usage_ratio", usage_ratio));
    json_t *reuse = take_reuse_gaps(t);
    pthread_mutex_lock(&t->mutex);
    expire_evictions(t, t->clock(t->clock_user));
    json_t *evict_reuse = t->pending_gaps ? t->pending_gaps : json_array();
    t->pending_gaps = NULL;
    pthread_mutex_unlock(&t->mutex);
    if (json_array_size(reuse) == 0 && json_array_size(evict_reuse) == 0) {
        json_decref(reuse);
        json_decref(evict_reuse);
        return;
    }
    lmc_storage_telemetry_publish(t, LMC_EVENT_L1_REUSE_GAPS,
                                  json_pack("{s:o, s:o}", "reuse_gaps_s", reuse,
                                            "evict_reuse_gaps_s", evict_reuse));
}

void lmc_storage_telemetry_on_l1_event(lmc_storage_telemetry *t, lmc_l1_event_kind kind,
                                       const lmc_object_key *keys, size_t n)
{
    if (!lmc_storage_telemetry_enabled(t))
        return;
    const char *type = NULL;
    switch (kind) {
    case LMC_L1_EVENT_WRITE_FINISHED:
    case LMC_L1_EVENT_WRITE_FINISHED_READ_RESERVED:
        type = LMC_EVENT_L1_WRITE;
        note_rewrites(t, keys, n);
        break;
    case LMC_L1_EVENT_READ_FINISHED:
        type = LMC_EVENT_L1_READ;
        break;
    default:
        return;
    }
    lmc_storage_telemetry_publish(t, type, json_pack("{s:I}", "num_keys", (json_int_t)n));
}

/* ---- storage-manager outcomes ------------------------------------------ */

static void add_outcomes(json_t *by_salt, const char *salt, json_int_t ok, json_int_t failed)
{
    json_t *counts = json_object_get(by_salt, salt);
    if (!counts) {
        json_object_set_new(by_salt, salt,
                            json_pack("{s:I, s:I}", "ok", (json_int_t)0, "failed", (json_int_t)0));
        counts = json_object_get(by_salt, salt);
    }
    json_t *o = json_object_get(counts, "ok"), *f = json_object_get(counts, "failed");
    json_integer_set(o, json_integer_value(o) + ok);
    json_integer_set(f, json_integer_value(f) + failed);
}

/* {salt: {"ok": a, "failed": b}} over keys, ok[i] saying which is which.
 * Counted per run of equal (interned) salts: a request has one. */
static json_t *outcomes_by_salt(const lmc_object_key *keys, size_t n, const bool *ok)
{
    json_t *by_salt = json_object();
    json_int_t run_ok = 0, run_failed = 0;
    for (size_t i = 0; i < n && by_salt; i++) {
        ok[i] ? run_ok++ : run_failed++;
        if (i + 1 < n && keys[i + 1].cache_salt == keys[i].cache_salt)
            continue;
        add_outcomes(by_salt, keys[i].cache_salt, run_ok, run_failed);
        run_ok = run_failed = 0;
    }
    return by_salt;
}

void lmc_storage_telemetry_write_outcome(lmc_storage_telemetry *t, const lmc_object_key *keys,
                                         size_t n, const lmc_l1_result *results,
                                         const char *during)
{
    if (!lmc_storage_telemetry_enabled(t) || n == 0)
        return;
    bool *ok = malloc(n * sizeof *ok);
    if (!ok)
        return;
    size_t oom = 0, first_oom = 0;
    for (size_t i = 0; i < n; i++) {
        ok[i] = results[i] == LMC_L1_SUCCESS;
        if (results[i] == LMC_L1_OUT_OF_MEMORY && oom++ == 0)
            first_oom = i;
    }
    lmc_storage_telemetry_publish(t, LMC_EVENT_SM_WRITE,
                                  json_pack("{s:o}", "by_salt", outcomes_by_salt(keys, n, ok)));
    free(ok);
    if (oom > 0)
        lmc_storage_telemetry_publish(
            t, LMC_EVENT_L1_ALLOCATION_FAILURE,
            json_pack("{s:s, s:s, s:I}", "during", during, "model_name",
                      keys[first_oom].model_name, "num_keys", (json_int_t)oom));
}

void lmc_storage_telemetry_read_outcome(lmc_storage_telemetry *t, const lmc_object_key *keys,
                                        size_t n, size_t hits)
{
    if (!lmc_storage_telemetry_enabled(t) || n == 0)
        return;
    bool *ok = malloc(n * sizeof *ok);
    if (!ok)
        return;
    for (size_t i = 0; i < n; i++)
        ok[i] = i < hits;
    lmc_storage_telemetry_publish(t, LMC_EVENT_SM_READ,
                                  json_pack("{s:o}", "by_salt", outcomes_by_salt(keys, n, ok)));
    free(ok);
}
