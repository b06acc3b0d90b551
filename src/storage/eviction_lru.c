/* LRU: a doubly linked list from oldest (head, evicted first) to newest
 * (tail) plus a hash index for O(1) lookup.
 *
 * A batch of added keys is linked in reverse chunk order, so the batch's
 * LAST chunk ends up oldest and is evicted first: the leading chunks of a
 * prefix, which every later request reuses, survive longest.  Touching
 * moves keys to the newest end (in the same reverse order).
 *
 * The policy tracks every object of the L1, so its per-key cost counts as
 * much as the L1 entry's (docs/storage.md, "Metadata per object").  A node
 * is therefore 48 bytes, not a malloc'd full key plus pointers:
 *   - nodes live in fixed-size slabs and name each other by 32-bit index
 *     (no malloc header per key, half-size links); a forgotten node goes on
 *     a free list and the next new key takes it, so the slabs stay as large
 *     as the most keys ever tracked at once, as freed malloc chunks would;
 *   - everything of a key but its chunk hash (model, salt, rank, group,
 *     hash length) is shared by the many chunks of a prompt, so it is kept
 *     once per distinct combination (a "scope", reference counted) and a
 *     node holds its index.  A scope keeps the exact pointers of the keys
 *     that created it, so a victim comes out as the key that went in, and
 *     holds one reference on its interned names while it lives;
 *   - the index is chained through the nodes (one 32-bit head per bucket).
 * Lookups compare whole keys with lmc_object_key_equal, as any key table
 * does, so keys match exactly as they did with one. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "obs/log.h"
#include "core/grow.h"
#include "storage/eviction_policy.h"

#define NIL UINT32_MAX
#define SLAB_SHIFT 10
#define SLAB_NODES (1u << SLAB_SHIFT)
#define MIN_BUCKETS 1024u
#define MIN_SCOPE_SLOTS 16u

typedef struct lru_node {
    uint8_t chunk_hash[LMC_CHUNK_HASH_MAX];
    uint32_t scope;          /* NIL: the node is free */
    uint32_t older, newer;   /* NIL at the ends */
    uint32_t chain;          /* next node in the same bucket (free: on the free list) */
} lru_node;

_Static_assert(sizeof(lru_node) == 48, "an LRU node is 48 bytes (docs/storage.md)");

/* Everything of a key except its chunk hash bytes. */
typedef struct lru_scope {
    const char *model_name;
    const char *cache_salt;
    uint32_t kv_rank;
    uint32_t object_group_id;
    uint32_t refs;           /* nodes naming it; 0: on the free list */
    uint32_t next_free;
    uint8_t chunk_hash_len;
    uint8_t interned;        /* the keys' names hold references (object_key.h) */
} lru_scope;

typedef struct lru_policy {
    lmc_eviction_policy base;
    pthread_mutex_t mutex;       /* guards everything below */
    /* Node i is slabs[i >> SLAB_SHIFT][i % SLAB_NODES]; [0, used) were
     * handed out, count of them are tracked, the rest are free. */
    lru_node **slabs;
    size_t num_slabs, cap_slabs;
    uint32_t used, count;
    uint32_t free_node;          /* head of the free list or NIL */
    uint32_t oldest, newest;
    uint32_t *buckets;           /* first node of each chain; power of two */
    size_t num_buckets;
    /* Scopes by index, and an open-addressing map from a scope's exact
     * fields (pointer identity) to its index. */
    lru_scope *scopes;
    uint32_t num_scopes, cap_scopes;   /* slots used so far, allocated */
    uint32_t free_scope;               /* head of the free list or NIL */
    uint32_t live_scopes;
    uint32_t *scope_slots;             /* scope index or NIL; power of two */
    size_t num_scope_slots;
    uint32_t last_scope;               /* the scope the previous add used */
} lru_policy;

static lru_policy *as_lru(lmc_eviction_policy *p)
{
    return (lru_policy *)p;
}

static lru_node *node_at(const lru_policy *lru, uint32_t i)
{
    return &lru->slabs[i >> SLAB_SHIFT][i & (SLAB_NODES - 1)];
}

static void node_key(const lru_policy *lru, const lru_node *node, lmc_object_key *out)
{
    const lru_scope *s = &lru->scopes[node->scope];
    memcpy(out->chunk_hash, node->chunk_hash, sizeof(out->chunk_hash));
    out->chunk_hash_len = s->chunk_hash_len;
    out->kv_rank = s->kv_rank;
    out->object_group_id = s->object_group_id;
    out->model_name = s->model_name;
    out->cache_salt = s->cache_salt;
    out->interned = s->interned;
}

/* ---- scopes --------------------------------------------------------------- */

static bool scope_is(const lru_scope *s, const lmc_object_key *key)
{
    return s->model_name == key->model_name && s->cache_salt == key->cache_salt &&
           s->kv_rank == key->kv_rank && s->object_group_id == key->object_group_id &&
           s->chunk_hash_len == key->chunk_hash_len;
}

static size_t scope_home(const lru_policy *lru, const char *model, const char *salt,
                         uint32_t kv_rank, uint32_t group, uint8_t len)
{
    uint64_t h = (uint64_t)(uintptr_t)model * 0x9e3779b97f4a7c15ULL;
    h ^= (uint64_t)(uintptr_t)salt * 0xc2b2ae3d27d4eb4fULL;
    h ^= ((uint64_t)kv_rank << 32 | group) * 0x165667b19e3779f9ULL;
    h ^= len;
    h ^= h >> 29;
    h *= 0xbf58476d1ce4e5b9ULL;
    h ^= h >> 32;
    return (size_t)h & (lru->num_scope_slots - 1);
}

static size_t scope_home_of(const lru_policy *lru, const lru_scope *s)
{
    return scope_home(lru, s->model_name, s->cache_salt, s->kv_rank, s->object_group_id,
                      s->chunk_hash_len);
}

/* The map slot holding the scope of `key`'s exact fields, or the empty slot
 * where it would go. */
static size_t scope_slot(const lru_policy *lru, const lmc_object_key *key)
{
    size_t mask = lru->num_scope_slots - 1;
    size_t i = scope_home(lru, key->model_name, key->cache_salt, key->kv_rank,
                          key->object_group_id, key->chunk_hash_len);
    for (;; i = (i + 1) & mask) {
        uint32_t id = lru->scope_slots[i];
        if (id == NIL || scope_is(&lru->scopes[id], key))
            return i;
    }
}

static int grow_scope_map(lru_policy *lru)
{
    size_t cap = lru->num_scope_slots * 2;
    uint32_t *slots = malloc(cap * sizeof(*slots));
    if (!slots)
        return -1;
    memset(slots, 0xff, cap * sizeof(*slots));   /* all NIL */
    uint32_t *old = lru->scope_slots;
    size_t old_cap = lru->num_scope_slots;
    lru->scope_slots = slots;
    lru->num_scope_slots = cap;
    for (size_t i = 0; i < old_cap; i++) {
        if (old[i] == NIL)
            continue;
        size_t j = scope_home_of(lru, &lru->scopes[old[i]]);
        while (slots[j] != NIL)
            j = (j + 1) & (cap - 1);
        slots[j] = old[i];
    }
    free(old);
    return 0;
}

/* A new scope for `key`, its map slot and index; NIL when memory ran out. */
static uint32_t add_scope(lru_policy *lru, const lmc_object_key *key)
{
    if ((size_t)(lru->live_scopes + 1) * 2 > lru->num_scope_slots && grow_scope_map(lru) != 0)
        return NIL;
    uint32_t id = lru->free_scope;
    if (id != NIL) {
        lru->free_scope = lru->scopes[id].next_free;
    } else {
        if (lru->num_scopes == NIL)
            return NIL;
        if (lru->num_scopes == lru->cap_scopes) {
            uint32_t cap = lru->cap_scopes ? lru->cap_scopes * 2 : 16;
            if (cap < lru->cap_scopes)
                cap = NIL;
            lru_scope *grown = realloc(lru->scopes, (size_t)cap * sizeof(*grown));
            if (!grown)
                return NIL;
            lru->scopes = grown;
            lru->cap_scopes = cap;
        }
        id = lru->num_scopes++;
    }
    lru->scopes[id] = (lru_scope){
        .model_name = key->model_name,
        .cache_salt = key->cache_salt,
        .kv_rank = key->kv_rank,
        .object_group_id = key->object_group_id,
        .refs = 0,
        .next_free = NIL,
        .chunk_hash_len = key->chunk_hash_len,
        .interned = key->interned,
    };
    lmc_keys_hold(key, 1); /* the scope outlives the event that made it */
    lru->scope_slots[scope_slot(lru, key)] = id;
    lru->live_scopes++;
    return id;
}

/* The scope with exactly `key`'s fields, made if needed, with one more
 * reference; NIL when memory ran out. */
static uint32_t acquire_scope(lru_policy *lru, const lmc_object_key *key)
{
    uint32_t id = lru->last_scope;
    if (id == NIL || lru->scopes[id].refs == 0 || !scope_is(&lru->scopes[id], key)) {
        id = lru->scope_slots[scope_slot(lru, key)];
        if (id == NIL && (id = add_scope(lru, key)) == NIL)
            return NIL;
        lru->last_scope = id;
    }
    lru->scopes[id].refs++;
    return id;
}

/* Drops a reference; the last one frees the scope (backward-shift deletion
 * from the map, as in key_table.c). */
static void release_scope(lru_policy *lru, uint32_t id)
{
    lru_scope *s = &lru->scopes[id];
    if (--s->refs > 0)
        return;
    size_t mask = lru->num_scope_slots - 1;
    size_t hole = scope_home_of(lru, s);
    while (lru->scope_slots[hole] != id)
        hole = (hole + 1) & mask;
    for (size_t j = (hole + 1) & mask; lru->scope_slots[j] != NIL; j = (j + 1) & mask) {
        size_t home = scope_home_of(lru, &lru->scopes[lru->scope_slots[j]]);
        if (((j - home) & mask) >= ((j - hole) & mask)) {
            lru->scope_slots[hole] = lru->scope_slots[j];
            hole = j;
        }
    }
    lru->scope_slots[hole] = NIL;
    lmc_object_key names = {.model_name = s->model_name, .cache_salt = s->cache_salt,
                            .interned = s->interned};
    lmc_keys_drop(&names, 1);
    s->next_free = lru->free_scope;
    lru->free_scope = id;
    lru->live_scopes--;
}

/* ---- index ---------------------------------------------------------------- */

static uint32_t *bucket_of(const lru_policy *lru, const lmc_object_key *key)
{
    return &lru->buckets[lmc_object_key_hash(key) & (lru->num_buckets - 1)];
}

/* The link (bucket head or a node's chain) that points at the node of
 * `key`, or at NIL when the key is not tracked. */
static uint32_t *find(const lru_policy *lru, const lmc_object_key *key)
{
    lmc_object_key k;
    /* Bucket mates almost always differ in their first hash bytes; a node
     * whose first 8 differ cannot be equal once the key has 8 or more. */
    bool quick = key->chunk_hash_len >= 8;
    uint32_t *link = bucket_of(lru, key);
    for (; *link != NIL; link = &node_at(lru, *link)->chain) {
        const lru_node *node = node_at(lru, *link);
        if (quick && memcmp(node->chunk_hash, key->chunk_hash, 8) != 0)
            continue;
        node_key(lru, node, &k);
        if (lmc_object_key_equal(&k, key))
            break;
    }
    return link;
}

/* The link that points at tracked node i. */
static uint32_t *link_to(const lru_policy *lru, uint32_t i)
{
    lmc_object_key k;
    node_key(lru, node_at(lru, i), &k);
    uint32_t *link = bucket_of(lru, &k);
    while (*link != i)
        link = &node_at(lru, *link)->chain;
    return link;
}

static int grow_buckets(lru_policy *lru)
{
    size_t cap = lru->num_buckets * 2;
    uint32_t *buckets = malloc(cap * sizeof(*buckets));
    if (!buckets)
        return -1;
    memset(buckets, 0xff, cap * sizeof(*buckets));   /* all NIL */
    free(lru->buckets);
    lru->buckets = buckets;
    lru->num_buckets = cap;
    lmc_object_key k;
    for (uint32_t i = 0; i < lru->used; i++) {
        lru_node *node = node_at(lru, i);
        if (node->scope == NIL)
            continue;
        node_key(lru, node, &k);
        uint32_t *head = bucket_of(lru, &k);
        node->chain = *head;
        *head = i;
    }
    return 0;
}

/* ---- list ----------------------------------------------------------------- */

static void unlink_node(lru_policy *lru, uint32_t i)
{
    lru_node *node = node_at(lru, i);
    if (node->older != NIL)
        node_at(lru, node->older)->newer = node->newer;
    else
        lru->oldest = node->newer;
    if (node->newer != NIL)
        node_at(lru, node->newer)->older = node->older;
    else
        lru->newest = node->older;
    node->older = node->newer = NIL;
}

static void append_newest(lru_policy *lru, uint32_t i)
{
    lru_node *node = node_at(lru, i);
    node->older = lru->newest;
    node->newer = NIL;
    if (lru->newest != NIL)
        node_at(lru, lru->newest)->newer = i;
    else
        lru->oldest = i;
    lru->newest = i;
}

/* ---- nodes ---------------------------------------------------------------- */

/* A node off the free list or past the last one handed out (the slabs
 * grown if needed), linked nowhere; NIL when memory ran out. */
static uint32_t new_node(lru_policy *lru)
{
    uint32_t i = lru->free_node;
    if (i != NIL) {
        lru->free_node = node_at(lru, i)->chain;
        lru->count++;
        return i;
    }
    if (lru->used == NIL)
        return NIL;
    size_t slab = lru->used >> SLAB_SHIFT;
    if (slab == lru->num_slabs) {
        if (lmc_grow_array(&lru->slabs, &lru->cap_slabs, lru->num_slabs + 1, sizeof *lru->slabs,
                           16) != 0)
            return NIL;
        lru_node *fresh = malloc(SLAB_NODES * sizeof(*fresh));
        if (!fresh)
            return NIL;
        lru->slabs[lru->num_slabs++] = fresh;
    }
    lru->count++;
    return lru->used++;
}

/* Forgets the node that *link points at. */
static void forget(lru_policy *lru, uint32_t *link)
{
    uint32_t i = *link;
    lru_node *node = node_at(lru, i);
    unlink_node(lru, i);
    *link = node->chain;
    release_scope(lru, node->scope);
    node->scope = NIL;
    node->chain = lru->free_node;
    lru->free_node = i;
    lru->count--;
}

/* Moves a tracked key to the newest end; adds it if `create`. */
static void refresh(lru_policy *lru, const lmc_object_key *key, bool create)
{
    uint32_t i = *find(lru, key);
    if (i != NIL) {
        unlink_node(lru, i);
        append_newest(lru, i);
        return;
    }
    if (!create)
        return;
    if ((size_t)lru->count + 1 > lru->num_buckets && grow_buckets(lru) != 0)
        goto no_memory;
    uint32_t scope = acquire_scope(lru, key);
    if (scope == NIL)
        goto no_memory;
    i = new_node(lru);
    if (i == NIL) {
        release_scope(lru, scope);
        goto no_memory;
    }
    lru_node *node = node_at(lru, i);
    memcpy(node->chunk_hash, key->chunk_hash, sizeof(node->chunk_hash));
    node->scope = scope;
    uint32_t *head = bucket_of(lru, key);
    node->chain = *head;
    *head = i;
    append_newest(lru, i);
    return;
no_memory:
    LMC_WARN("LRU: out of memory, key not tracked");
}

/* A batch's keys land in random buckets and nodes of a large table, one
 * cache miss after another.  Loading the bucket of the key AHEAD places on,
 * and the first node of the one half as far, while the current key is
 * worked on overlaps those misses.  A prefetch changes no state, so a stale
 * one (the buckets grew meanwhile) only wastes a load. */
#define AHEAD 8

static void prefetch_ahead(const lru_policy *lru, const lmc_object_key *far,
                           const lmc_object_key *near)
{
    if (far)
        __builtin_prefetch(bucket_of(lru, far));
    if (near) {
        uint32_t head = *bucket_of(lru, near);
        if (head != NIL)
            __builtin_prefetch(node_at(lru, head));
    }
}

static void refresh_batch(lmc_eviction_policy *p, const lmc_object_key *keys, size_t n,
                          bool create)
{
    lru_policy *lru = as_lru(p);
    pthread_mutex_lock(&lru->mutex);
    for (size_t i = n; i-- > 0;) {
        prefetch_ahead(lru, i >= AHEAD ? &keys[i - AHEAD] : NULL,
                       i >= AHEAD / 2 ? &keys[i - AHEAD / 2] : NULL);
        refresh(lru, &keys[i], create);
    }
    pthread_mutex_unlock(&lru->mutex);
}

static void lru_added(lmc_eviction_policy *p, const lmc_object_key *keys, size_t n)
{
    refresh_batch(p, keys, n, true);
}

static void lru_accessed(lmc_eviction_policy *p, const lmc_object_key *keys, size_t n)
{
    refresh_batch(p, keys, n, false);
}

static void lru_removed(lmc_eviction_policy *p, const lmc_object_key *keys, size_t n)
{
    lru_policy *lru = as_lru(p);
    pthread_mutex_lock(&lru->mutex);
    for (size_t i = 0; i < n; i++) {
        prefetch_ahead(lru, i + AHEAD < n ? &keys[i + AHEAD] : NULL,
                       i + AHEAD / 2 < n ? &keys[i + AHEAD / 2] : NULL);
        uint32_t *link = find(lru, &keys[i]);
        if (*link != NIL)
            forget(lru, link);
    }
    pthread_mutex_unlock(&lru->mutex);
}

static size_t lru_select(lmc_eviction_policy *p, size_t max, lmc_evictable_fn evictable,
                         void *user, lmc_object_key *out)
{
    lru_policy *lru = as_lru(p);
    size_t found = 0;
    lmc_object_key key;
    pthread_mutex_lock(&lru->mutex);
    for (uint32_t i = lru->oldest, next; i != NIL && found < max; i = next) {
        next = node_at(lru, i)->newer;
        node_key(lru, node_at(lru, i), &key);
        lmc_l1_evictability verdict = evictable(user, &key);
        if (verdict == LMC_L1_EVICTABLE) {
            out[found] = key;
            lmc_keys_hold(&out[found++], 1); /* its node may go before the caller is done */
        } else if (verdict == LMC_L1_GONE) {
            forget(lru, link_to(lru, i));
        }
    }
    pthread_mutex_unlock(&lru->mutex);
    return found;
}

static size_t lru_tracked(lmc_eviction_policy *p)
{
    lru_policy *lru = as_lru(p);
    pthread_mutex_lock(&lru->mutex);
    size_t n = lru->count;
    pthread_mutex_unlock(&lru->mutex);
    return n;
}

static void lru_destroy(lmc_eviction_policy *p)
{
    lru_policy *lru = as_lru(p);
    for (uint32_t i = 0; i < lru->num_scopes; i++) {
        const lru_scope *sc = &lru->scopes[i];
        lmc_object_key names = {.model_name = sc->model_name, .cache_salt = sc->cache_salt,
                                .interned = sc->interned};
        if (sc->refs > 0)
            lmc_keys_drop(&names, 1);
    }
    for (size_t i = 0; i < lru->num_slabs; i++)
        free(lru->slabs[i]);
    free(lru->slabs);
    free(lru->buckets);
    free(lru->scopes);
    free(lru->scope_slots);
    pthread_mutex_destroy(&lru->mutex);
    free(lru);
}

static const lmc_eviction_policy_ops lru_ops = {
    .name = "LRU",
    .on_keys_added = lru_added,
    .on_keys_accessed = lru_accessed,
    .on_keys_removed = lru_removed,
    .select_victims = lru_select,
    .num_tracked = lru_tracked,
    .destroy = lru_destroy,
};

lmc_eviction_policy *lmc_eviction_policy_lru_new(void)
{
    lru_policy *lru = calloc(1, sizeof(*lru));
    if (!lru)
        return NULL;
    lru->buckets = malloc(MIN_BUCKETS * sizeof(*lru->buckets));
    lru->scope_slots = malloc(MIN_SCOPE_SLOTS * sizeof(*lru->scope_slots));
    if (!lru->buckets || !lru->scope_slots) {
        free(lru->buckets);
        free(lru->scope_slots);
        free(lru);
        return NULL;
    }
    memset(lru->buckets, 0xff, MIN_BUCKETS * sizeof(*lru->buckets));
    memset(lru->scope_slots, 0xff, MIN_SCOPE_SLOTS * sizeof(*lru->scope_slots));
    lru->num_buckets = MIN_BUCKETS;
    lru->num_scope_slots = MIN_SCOPE_SLOTS;
    lru->oldest = lru->newest = NIL;
    lru->free_node = NIL;
    lru->free_scope = lru->last_scope = NIL;
    pthread_mutex_init(&lru->mutex, NULL);
    lru->base.ops = &lru_ops;
    return &lru->base;
}
