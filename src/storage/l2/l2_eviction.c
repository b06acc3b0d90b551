/* L2 eviction (docs/l2.md, "L2 eviction and quotas"): one thread for every
 * adapter whose JSON has
 * an "eviction" object.  Each tracked adapter gets an observer that keeps
 * the keys this server stored there (with sizes) in LRU order:
 *
 *   LRU          when the adapter's usage reaches watermark x capacity
 *                (max_capacity_gb > 0), delete ratio x tracked keys,
 *                least recently stored or loaded first;
 *   IsolatedLRU  one LRU per cache_salt; a salt at or above watermark x its
 *                quota loses ratio of its keys, a salt without a quota
 *                (limit 0) loses all of them: quotas are an allowlist;
 *   noop         tracked, never evicted.
 *
 * Keys a backend recovered at start-up (fs files an earlier process left)
 * are tracked from the start, as the least recently used; other objects
 * stored before this process started (Redis, S3) are not (docs/l2.md).
 *
 * Locks: `mu` guards a target's table and totals; the LRU policies have
 * their own locks; nothing is held while the adapter deletes. */
#include "storage/l2/l2_eviction.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/grow.h"
#include "core/periodic.h"
#include "obs/events.h"
#include "obs/log.h"
#include "storage/eviction_policy.h"
#include "storage/key_table.h"
#include "storage/l2/l2_internal.h"

typedef struct {
    lmc_object_key key;
    uint64_t size;
} tracked;

typedef struct {
    const char *salt;              /* interned */
    lmc_eviction_policy *lru;
    uint64_t bytes;
    size_t keys;
} salt_group;

typedef struct {
    lmc_l2_adapter *ad;
    size_t index;
    char policy[16];               /* LRU, IsolatedLRU or noop */
    double watermark, ratio;
    pthread_mutex_t mu;
    lmc_key_table table;
    lmc_eviction_policy *lru;      /* LRU / noop */
    salt_group *groups;            /* IsolatedLRU */
    size_t n_groups, cap_groups;
    uint64_t bytes;                /* under mu */
    size_t recovered;              /* keys tracked from the backend's recovery */
    lmc_key_interner *interner;    /* the eviction's: recovered keys' strings */
    _Atomic uint64_t cycles, triggered, evicted; /* eviction thread writes, status reads */
    lmc_storage_manager *events;   /* L2_EVICTED goes here; may be NULL */
} target;

struct lmc_l2_eviction {
    target *t;
    size_t n;
    lmc_key_interner *interner;
    lmc_quotas *quotas;
    unsigned period_ms;
    lmc_core_periodic *thread; /* NULL when stopped, or with no target */
};

/* ---- tracking ------------------------------------------------------------- */

static salt_group *group_of(target *t, const char *salt)
{
    for (size_t i = 0; i < t->n_groups; i++) {
        if (t->groups[i].salt == salt || strcmp(t->groups[i].salt, salt) == 0)
            return &t->groups[i];
    }
    if (lmc_grow_array(&t->groups, &t->cap_groups, t->n_groups + 1, sizeof *t->groups, 8) != 0)
        return NULL;
    lmc_eviction_policy *lru = lmc_eviction_policy_lru_new();
    if (!lru)
        return NULL;
    t->groups[t->n_groups] = (salt_group){.salt = salt, .lru = lru};
    return &t->groups[t->n_groups++];
}

static lmc_eviction_policy *policy_for(target *t, const lmc_object_key *k, salt_group **g)
{
    *g = NULL;
    if (strcmp(t->policy, "IsolatedLRU") != 0)
        return t->lru;
    *g = group_of(t, k->cache_salt);
    return *g ? (*g)->lru : NULL;
}

/* Tracks a stored batch; the policy sees each run of same-policy keys as
 * one batch, so a prefix's last chunk becomes the first victim. */
static void on_stored(void *user, const lmc_object_key *keys, const uint64_t *sizes, size_t n)
{
    target *t = user;
    lmc_object_key *fresh = malloc((n ? n : 1) * sizeof *fresh);
    size_t m = 0;
    lmc_eviction_policy *run_policy = NULL;
    pthread_mutex_lock(&t->mu);
    for (size_t i = 0; fresh && i < n; i++) {
        tracked *e = lmc_key_table_find(&t->table, &keys[i]);
        salt_group *g;
        lmc_eviction_policy *p = policy_for(t, &keys[i], &g);
        if (e || !p || !(e = malloc(sizeof *e)))
            continue;
        *e = (tracked){keys[i], sizes[i]};
        if (lmc_key_table_insert(&t->table, e) != 0) {
            free(e);
            continue;
        }
        t->bytes += e->size;
        if (g) {
            g->bytes += e->size;
            g->keys++;
        }
        if (p != run_policy && m) { /* flush the previous run */
            run_policy->ops->on_keys_added(run_policy, fresh, m);
            m = 0;
        }
        run_policy = p;
        fresh[m++] = keys[i];
    }
    if (m)
        run_policy->ops->on_keys_added(run_policy, fresh, m);
    pthread_mutex_unlock(&t->mu);
    free(fresh);
}

static void on_loaded(void *user, const lmc_object_key *keys, const uint8_t *ok, size_t n)
{
    target *t = user;
    for (size_t i = 0; i < n; i++) {
        salt_group *g;
        pthread_mutex_lock(&t->mu);
        lmc_eviction_policy *p = ok[i] ? policy_for(t, &keys[i], &g) : NULL;
        pthread_mutex_unlock(&t->mu);
        if (p)
            p->ops->on_keys_accessed(p, &keys[i], 1);
    }
}

static void on_deleted(void *user, const lmc_object_key *keys, size_t n)
{
    target *t = user;
    for (size_t i = 0; i < n; i++) {
        pthread_mutex_lock(&t->mu);
        tracked *e = lmc_key_table_remove(&t->table, &keys[i]);
        salt_group *g;
        lmc_eviction_policy *p = e ? policy_for(t, &keys[i], &g) : NULL;
        if (e) {
            t->bytes -= e->size;
            if (g) {
                g->bytes -= e->size;
                g->keys--;
            }
        }
        pthread_mutex_unlock(&t->mu);
        if (p)
            p->ops->on_keys_removed(p, &keys[i], 1);
        free(e);
    }
}

/* ---- eviction cycles -------------------------------------------------------- */

static lmc_l1_evictability always(void *user, const lmc_object_key *key)
{
    (void)user, (void)key;
    return LMC_L1_EVICTABLE;
}

/* Deletes victims one by one: a key the backend keeps (locked by a running
 * prefetch) stays tracked and is tried again next cycle. */
static size_t delete_victims(target *t, lmc_object_key *v, size_t n)
{
    size_t done = 0;
    for (size_t i = 0; i < n; i++) {
        if (lmc_l2_adapter_delete(t->ad, &v[i], 1))
            v[done++] = v[i];   /* compact the deleted ones for the event */
    }
    t->evicted += done;
    if (t->events)
        lmc_l2_publish_by_salt(t->events, LMC_EVENT_L2_EVICTED, v, done);
    return done;
}

static size_t evict_from(target *t, lmc_eviction_policy *p, size_t want)
{
    if (want == 0)
        return 0;
    lmc_object_key *v = malloc(want * sizeof *v);
    size_t got = v ? p->ops->select_victims(p, want, always, NULL, v) : 0;
    size_t done = delete_victims(t, v, got);
    free(v);
    return done;
}

static size_t share(double ratio, size_t tracked_keys)
{
    size_t n = (size_t)ceil(ratio * (double)tracked_keys);
    return n ? n : 1;
}

static void cycle_aggregate(target *t)
{
    lmc_l2_usage u;
    lmc_l2_adapter_usage(t->ad, &u);
    pthread_mutex_lock(&t->mu);
    uint64_t used = u.used_bytes > t->bytes ? u.used_bytes : t->bytes;
    size_t tracked_keys = t->table.count;
    pthread_mutex_unlock(&t->mu);
    if (strcmp(t->policy, "LRU") != 0 || u.capacity_bytes == 0 || tracked_keys == 0 ||
        (double)used < t->watermark * (double)u.capacity_bytes)
        return;
    t->triggered++;
    evict_from(t, t->lru, share(t->ratio, tracked_keys));
}

static void cycle_isolated(target *t, lmc_quotas *q)
{
    pthread_mutex_lock(&t->mu);
    size_t n = t->n_groups;
    salt_group *snap = malloc((n ? n : 1) * sizeof *snap);
    if (snap)
        memcpy(snap, t->groups, n * sizeof *snap);
    pthread_mutex_unlock(&t->mu);
    for (size_t i = 0; snap && i < n; i++) {
        if (snap[i].bytes == 0)
            continue;
        uint64_t limit = lmc_quotas_get_limit(q, snap[i].salt);
        if (limit && (double)snap[i].bytes < t->watermark * (double)limit)
            continue;
        t->triggered++;
        /* No quota = not allowed: everything goes (allowlist semantics). */
        evict_from(t, snap[i].lru, limit ? share(t->ratio, snap[i].keys) : snap[i].keys);
    }
    free(snap);
}

void lmc_l2_eviction_run_once(lmc_l2_eviction *e)
{
    for (size_t i = 0; i < e->n; i++) {
        target *t = &e->t[i];
        t->cycles++;
        if (strcmp(t->policy, "IsolatedLRU") == 0)
            cycle_isolated(t, e->quotas);
        else
            cycle_aggregate(t);
    }
}

static void run_cycle(void *e)
{
    lmc_l2_eviction_run_once(e);
}

/* ---- lifetime ------------------------------------------------------------------ */

/* A batch of keys the backend found at start-up, tracked as if stored now,
 * before anything this process stores: they are evicted first.  Their
 * strings are re-interned, as the tracker may outlive the backend. */
static void track_recovered(void *user, const lmc_object_key *keys, const uint64_t *sizes,
                            size_t n)
{
    target *t = user;
    lmc_object_key *own = malloc((n ? n : 1) * sizeof *own);
    uint64_t *own_sizes = malloc((n ? n : 1) * sizeof *own_sizes);
    size_t m = 0;
    for (size_t i = 0; own && own_sizes && i < n; i++) {
        own[m] = keys[i];
        own[m].model_name = lmc_intern(t->interner, keys[i].model_name,
                                       strlen(keys[i].model_name));
        own[m].cache_salt = lmc_intern(t->interner, keys[i].cache_salt,
                                       strlen(keys[i].cache_salt));
        own[m].interned = 0; /* the eviction's own names: they count nothing */
        own_sizes[m] = sizes[i];
        m += own[m].model_name && own[m].cache_salt;
    }
    pthread_mutex_lock(&t->mu);
    size_t before = t->table.count;
    pthread_mutex_unlock(&t->mu);
    on_stored(t, own, own_sizes, m);
    pthread_mutex_lock(&t->mu);
    t->recovered += t->table.count - before;
    pthread_mutex_unlock(&t->mu);
    free(own);
    free(own_sizes);
}

static int init_target(target *t, lmc_l2_adapter *ad, size_t index, const json_t *ev)
{
    const char *policy = json_string_value(json_object_get(ev, "eviction_policy"));
    json_t *wm = json_object_get(ev, "trigger_watermark"), *r = json_object_get(ev, "eviction_ratio");
    snprintf(t->policy, sizeof t->policy, "%s", policy ? policy : "LRU");
    t->ad = ad;
    t->index = index;
    t->watermark = wm ? json_number_value(wm) : 0.8;
    t->ratio = r ? json_number_value(r) : 0.2;
    pthread_mutex_init(&t->mu, NULL);
    if (lmc_key_table_init(&t->table, offsetof(tracked, key), 1024) != 0)
        return -1;
    t->lru = strcmp(t->policy, "noop") == 0 ? lmc_eviction_policy_noop_new()
                                            : lmc_eviction_policy_lru_new();
    if (!t->lru)
        return -1;
    lmc_l2_observer obs = {t, on_stored, on_loaded, on_deleted};
    lmc_l2_adapter_set_observer(ad, &obs);
    lmc_l2_backend *be = lmc_l2_adapter_backend(ad);
    if (be->ops->for_each_recovered)
        be->ops->for_each_recovered(be, track_recovered, t);
    return 0;
}

lmc_l2_eviction *lmc_l2_eviction_new(lmc_l2_adapter *const *adapters,
                                     const json_t *const *eviction_configs, size_t n,
                                     lmc_quotas *quotas, lmc_storage_manager *events,
                                     unsigned period_ms)
{
    lmc_l2_eviction *e = calloc(1, sizeof *e);
    if (!e)
        return NULL;
    e->quotas = quotas;
    e->period_ms = period_ms ? period_ms : 1000;
    e->t = calloc(n ? n : 1, sizeof *e->t);
    e->interner = lmc_key_interner_new();
    if (!e->t || !e->interner)
        goto fail;
    for (size_t i = 0; i < n; i++) {
        if (!eviction_configs[i])
            continue;
        e->t[e->n].events = events;
        e->t[e->n].interner = e->interner;
        if (init_target(&e->t[e->n++], adapters[i], i, eviction_configs[i]) != 0)
            goto fail;
    }
    if (e->n && !(e->thread = lmc_core_periodic_start(NULL, e->period_ms, run_cycle, e)))
        goto fail;
    return e;
fail:
    lmc_l2_eviction_free(e);
    return NULL;
}

void lmc_l2_eviction_stop(lmc_l2_eviction *e)
{
    if (!e)
        return;
    lmc_core_periodic_stop(e->thread);
    e->thread = NULL;
}

void lmc_l2_eviction_free(lmc_l2_eviction *e)
{
    if (!e)
        return;
    lmc_l2_eviction_stop(e);
    for (size_t i = 0; e->t && i < e->n; i++) {
        target *t = &e->t[i];
        for (size_t s = 0; s < t->table.capacity; s++)
            free(lmc_key_table_slot_item(&t->table, s));
        lmc_key_table_destroy(&t->table);
        if (t->lru)
            lmc_eviction_policy_free(t->lru);
        for (size_t g = 0; g < t->n_groups; g++)
            lmc_eviction_policy_free(t->groups[g].lru);
        free(t->groups);
        pthread_mutex_destroy(&t->mu);
    }
    free(e->t);
    if (e->interner)
        lmc_key_interner_free(e->interner);
    free(e);
}

json_t *lmc_l2_eviction_status(lmc_l2_eviction *e)
{
    json_t *list = json_array();
    for (size_t i = 0; e && i < e->n; i++) {
        target *t = &e->t[i];
        json_t *salts = json_object();
        pthread_mutex_lock(&t->mu);
        for (size_t g = 0; g < t->n_groups; g++)
            json_object_set_new(salts, t->groups[g].salt,
                                json_pack("{s:I, s:I}", "bytes", (json_int_t)t->groups[g].bytes,
                                          "keys", (json_int_t)t->groups[g].keys));
        json_array_append_new(
            list, json_pack("{s:I, s:s, s:f, s:f, s:I, s:I, s:I, s:I, s:I, s:I, s:o}",
                            "adapter_index", (json_int_t)t->index, "eviction_policy", t->policy,
                            "trigger_watermark", t->watermark, "eviction_ratio", t->ratio,
                            "tracked_keys", (json_int_t)t->table.count, "tracked_bytes",
                            (json_int_t)t->bytes, "recovered_keys", (json_int_t)t->recovered,
                            "cycles", (json_int_t)t->cycles,
                            "triggered", (json_int_t)t->triggered, "evicted_keys",
                            (json_int_t)t->evicted, "salts", salts));
        pthread_mutex_unlock(&t->mu);
    }
    return json_pack("{s:b, s:o}", "is_healthy", 1, "adapters", list);
}

bool lmc_l2_eviction_enforces_quotas(const lmc_l2_eviction *e)
{
    for (size_t i = 0; e && i < e->n; i++)
        if (strcmp(e->t[i].policy, "IsolatedLRU") == 0)
            return true;
    return false;
}

json_t *lmc_l2_eviction_usage_by_salt(lmc_l2_eviction *e)
{
    json_t *out = json_object();
    for (size_t i = 0; e && i < e->n; i++) {
        target *t = &e->t[i];
        pthread_mutex_lock(&t->mu);
        for (size_t g = 0; g < t->n_groups; g++) {
            json_int_t before = json_integer_value(json_object_get(out, t->groups[g].salt));
            json_object_set_new(out, t->groups[g].salt,
                                json_integer(before + (json_int_t)t->groups[g].bytes));
        }
        pthread_mutex_unlock(&t->mu);
    }
    return out;
}
