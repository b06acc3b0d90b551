/* Name tables, the key table and the per-salt / per-instance records
 * (coord_state.h). */
#include "coordinator/coord_state.h"

#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "core/fnv.h"

static uint64_t mix64(uint64_t h)
{
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdULL;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ULL;
    h ^= h >> 33;
    return h;
}

static uint64_t str_hash(const char *s)
{
    return mix64(lmc_fnv1a64_str(LMC_FNV1A64_SHORT_BASIS, s));
}

/* ---- names ---------------------------------------------------------------- */

void coordinator_names_init(coordinator_names *t, uint32_t max)
{
    memset(t, 0, sizeof *t);
    t->max = max;
}

void coordinator_names_free(coordinator_names *t)
{
    for (uint32_t i = 0; i < t->n; i++)
        free(t->strs[i]);
    free(t->strs);
    free(t->index);
    memset(t, 0, sizeof *t);
}

uint32_t coordinator_names_find(const coordinator_names *t, const char *s)
{
    if (!t->index)
        return COORD_NONE;
    for (uint32_t i = (uint32_t)str_hash(s) & t->mask;; i = (i + 1) & t->mask) {
        uint32_t v = t->index[i];
        if (!v)
            return COORD_NONE;
        if (strcmp(t->strs[v - 1], s) == 0)
            return v - 1;
    }
}

static void names_place(coordinator_names *t, uint32_t id)
{
    uint32_t i = (uint32_t)str_hash(t->strs[id]) & t->mask;
    while (t->index[i])
        i = (i + 1) & t->mask;
    t->index[i] = id + 1;
}

static bool names_grow(coordinator_names *t)
{
    if (t->n + 1 <= t->cap && (t->n + 1) * 2 <= t->mask + 1)
        return true;
    uint32_t cap = t->cap ? t->cap * 2 : 16;
    char **strs = realloc(t->strs, cap * sizeof *strs);
    if (!strs)
        return false;
    t->strs = strs;
    t->cap = cap;
    uint32_t slots = cap * 2;
    uint32_t *index = calloc(slots, sizeof *index);
    if (!index)
        return false;
    free(t->index);
    t->index = index;
    t->mask = slots - 1;
    for (uint32_t id = 0; id < t->n; id++)
        names_place(t, id);
    return true;
}

uint32_t coordinator_names_intern(coordinator_names *t, const char *s)
{
    uint32_t id = coordinator_names_find(t, s);
    if (id != COORD_NONE)
        return id;
    if (t->n >= t->max || !names_grow(t))
        return COORD_NONE;
    char *copy = strdup(s);
    if (!copy)
        return COORD_NONE;
    t->strs[t->n] = copy;
    names_place(t, t->n);
    return t->n++;
}

static unsigned memo_way(const char *s, size_t len)
{
    unsigned outer = len ? (uint8_t)s[0] + 3u * (uint8_t)s[len - 1] : 0;
    return (unsigned)(len * 7 + outer) % COORD_NAME_MEMO_WAYS;
}

uint32_t coordinator_names_lookup(coordinator_names *t, coordinator_name_memo *m, const char *s, size_t len,
                            bool intern)
{
    unsigned w = memo_way(s, len);
    if (m->len1[w] == len + 1 && memcmp(t->strs[m->id[w]], s, len) == 0)
        return m->id[w];
    uint32_t id = intern ? coordinator_names_intern(t, s) : coordinator_names_find(t, s);
    if (id != COORD_NONE && len < UINT32_MAX) {
        m->id[w] = id;
        m->len1[w] = (uint32_t)len + 1;
    }
    return id;
}

const char *coordinator_names_str(const coordinator_names *t, uint32_t id)
{
    return id < t->n ? t->strs[id] : "";
}

/* ---- keys ----------------------------------------------------------------- */

/* Every byte of the hash counts, under a per-process seed: keys come from
 * the network, and a table that hashed a prefix only could be driven into
 * one long probe chain by keys that share it. */
static uint64_t key_hash(uint64_t seed, const uint8_t *hash, uint8_t len, uint32_t rank,
                         uint32_t group, uint32_t model, uint32_t salt)
{
    uint64_t h = seed ^ len;
    for (uint8_t i = 0; i < len; i += 8) {
        uint64_t w = 0;
        memcpy(&w, hash + i, len - i < 8 ? (size_t)(len - i) : 8);
        h = mix64(h ^ w) + 0x9e3779b97f4a7c15ULL;
    }
    h ^= ((uint64_t)rank << 32 | group) * 0x9e3779b97f4a7c15ULL;
    h ^= ((uint64_t)model << 32 | salt) * 0xbf58476d1ce4e5b9ULL;
    return mix64(h);
}

static bool entry_is(const coordinator_entry *e, const coordinator_key *k)
{
    return e->hash_len == k->hash_len && e->kv_rank == k->kv_rank && e->group == k->group &&
           e->model == k->model && e->salt == k->salt && memcmp(e->hash, k->hash, k->hash_len) == 0;
}

void coordinator_entry_key(const coordinator_entry *e, coordinator_key *out)
{
    memset(out, 0, sizeof *out);
    memcpy(out->hash, e->hash, e->hash_len);
    out->hash_len = e->hash_len;
    out->kv_rank = e->kv_rank;
    out->group = e->group;
    out->model = e->model;
    out->salt = e->salt;
}

/* An index slot holds the key's 32-bit table hash above its entry + 1, so
 * that probing compares entries only on a hash match and growing never
 * reads an entry.  0 = empty. */
static uint32_t hash_of(const coordinator_keys *t, const coordinator_key *k)
{
    return (uint32_t)key_hash(t->seed, k->hash, k->hash_len, k->kv_rank, k->group, k->model,
                              k->salt);
}

static uint64_t slot_value(uint32_t h, uint32_t idx)
{
    return (uint64_t)h << 32 | (idx + 1u);
}

static uint32_t slot_entry(uint64_t v)
{
    return (uint32_t)v - 1u;
}

static uint32_t slot_home(const coordinator_keys *t, uint64_t v)
{
    return (uint32_t)(v >> 32) & t->mask;
}

/* The slot of key k, with its entry in *idx; or the empty slot where it
 * would go (*idx COORD_NONE).  The index must exist. */
static uint32_t probe(const coordinator_keys *t, const coordinator_key *k, uint32_t h, uint32_t *idx)
{
    uint32_t i = h & t->mask;
    for (; t->index[i]; i = (i + 1) & t->mask) {
        uint64_t v = t->index[i];
        if ((uint32_t)(v >> 32) == h && entry_is(&t->e[slot_entry(v)], k)) {
            *idx = slot_entry(v);
            return i;
        }
    }
    *idx = COORD_NONE;
    return i;
}

uint32_t coordinator_keys_hash(const coordinator_keys *t, const coordinator_key *k)
{
    return hash_of(t, k);
}

uint32_t coordinator_keys_find_hashed(const coordinator_keys *t, const coordinator_key *k, uint32_t h)
{
    uint32_t idx = COORD_NONE;
    if (t->index)
        probe(t, k, h, &idx);
    return idx;
}

uint32_t coordinator_keys_find(const coordinator_keys *t, const coordinator_key *k)
{
    return coordinator_keys_find_hashed(t, k, hash_of(t, k));
}

void coordinator_keys_prefetch_slot(const coordinator_keys *t, uint32_t h)
{
    if (t->index)
        __builtin_prefetch(&t->index[h & t->mask]);
}

void coordinator_keys_prefetch_entry(const coordinator_keys *t, uint32_t h)
{
    if (!t->index)
        return;
    uint64_t v = t->index[h & t->mask];
    if (v && (uint32_t)(v >> 32) == h)
        __builtin_prefetch(&t->e[slot_entry(v)]);
}

/* Entries grow by half. */
static bool keys_grow_entries(coordinator_keys *t)
{
    if (t->free_head != COORD_NONE || t->n_slots < t->cap)
        return true;
    uint32_t cap = t->cap ? t->cap + t->cap / 2 : 1024;
    coordinator_entry *e = realloc(t->e, (size_t)cap * sizeof *e);
    if (!e)
        return false;
    t->e = e;
    t->cap = cap;
    return true;
}

/* The index stays at most half full; it doubles from the hashes it holds. */
static bool keys_grow_index(coordinator_keys *t)
{
    if (t->index && (uint64_t)(t->n_live + 1) * 2 <= (uint64_t)t->mask + 1)
        return true;
    uint32_t slots = t->index ? (t->mask + 1) * 2 : 2048;
    uint64_t *index = calloc(slots, sizeof *index);
    if (!index)
        return false;
    uint32_t old_slots = t->index ? t->mask + 1 : 0;
    uint64_t *old = t->index;
    t->index = index;
    t->mask = slots - 1;
    for (uint32_t i = 0; i < old_slots; i++) {
        if (!old[i])
            continue;
        uint32_t j = slot_home(t, old[i]);
        while (t->index[j])
            j = (j + 1) & t->mask;
        t->index[j] = old[i];
    }
    free(old);
    return true;
}

uint32_t coordinator_keys_get(coordinator_keys *t, const coordinator_key *k)
{
    return coordinator_keys_get_hashed(t, k, hash_of(t, k));
}

uint32_t coordinator_keys_get_hashed(coordinator_keys *t, const coordinator_key *k, uint32_t h)
{
    if (!keys_grow_index(t) || !keys_grow_entries(t))
        return coordinator_keys_find_hashed(t, k, h);
    uint32_t idx;
    uint32_t slot = probe(t, k, h, &idx);
    if (idx != COORD_NONE)
        return idx;
    if (t->max_live && t->n_live >= t->max_live) {
        t->refused++;
        return COORD_NONE;
    }
    if (t->free_head != COORD_NONE) {
        idx = t->free_head;
        t->free_head = t->e[idx].lru_next;
    } else {
        idx = t->n_slots++;
    }
    coordinator_entry *e = &t->e[idx];
    memset(e, 0, sizeof *e);
    memcpy(e->hash, k->hash, k->hash_len);
    e->hash_len = k->hash_len;
    e->kv_rank = k->kv_rank;
    e->group = k->group;
    e->model = k->model;
    e->salt = k->salt;
    e->lru_prev = e->lru_next = COORD_NONE;
    t->index[slot] = slot_value(h, idx);
    t->n_live++;
    return idx;
}

/* Backward-shift deletion keeps every probe chain unbroken. */
static void index_remove(coordinator_keys *t, uint32_t slot)
{
    uint32_t hole = slot;
    for (uint32_t i = (slot + 1) & t->mask; t->index[i]; i = (i + 1) & t->mask) {
        uint32_t home = slot_home(t, t->index[i]);
        bool movable = hole <= i ? (home <= hole || home > i) : (home <= hole && home > i);
        if (movable) {
            t->index[hole] = t->index[i];
            hole = i;
        }
    }
    t->index[hole] = 0;
}

void coordinator_keys_release(coordinator_keys *t, uint32_t idx)
{
    coordinator_entry *e = &t->e[idx];
    if ((e->flags & COORD_IN_L2) || e->n_l1 || e->pins)
        return;
    coordinator_key k;
    coordinator_entry_key(e, &k);
    uint32_t found = COORD_NONE, slot = t->index ? probe(t, &k, hash_of(t, &k), &found) : 0;
    if (found == idx)
        index_remove(t, slot);
    free(e->l1);
    memset(e, 0, sizeof *e); /* hash_len 0 marks a free entry */
    e->lru_next = t->free_head;
    t->free_head = idx;
    t->n_live--;
}

size_t coordinator_keys_memory(const coordinator_keys *t)
{
    return (size_t)t->cap * sizeof *t->e + (t->index ? (size_t)(t->mask + 1) * sizeof *t->index : 0);
}

/* ---- per-salt and per-instance records ------------------------------------ */

static bool grow_array(void **arr, uint32_t *cap, uint32_t need, size_t elem)
{
    if (need < *cap)
        return true;
    uint32_t n = *cap ? *cap : 16;
    while (n <= need)
        n *= 2;
    char *grown = realloc(*arr, (size_t)n * elem);
    if (!grown)
        return false;
    memset(grown + (size_t)*cap * elem, 0, (size_t)(n - *cap) * elem);
    *arr = grown;
    *cap = n;
    return true;
}

coordinator_salt *coordinator_salt_at(coordinator_state *s, uint32_t salt)
{
    uint32_t old = s->salt_cap;
    if (!grow_array((void **)&s->salt, &s->salt_cap, salt, sizeof *s->salt))
        return NULL;
    for (uint32_t i = old; i < s->salt_cap; i++)
        s->salt[i].lru_head = s->salt[i].lru_tail = COORD_NONE;
    return &s->salt[salt];
}

coordinator_cursor *coordinator_cursor_at(coordinator_state *s, uint32_t inst)
{
    if (!grow_array((void **)&s->cursor, &s->cursor_cap, inst, sizeof *s->cursor))
        return NULL;
    return &s->cursor[inst];
}

int coordinator_state_init(coordinator_state *s)
{
    memset(s, 0, sizeof *s);
    coordinator_names_init(&s->models, COORD_MAX_NAMES);
    coordinator_names_init(&s->salts, COORD_MAX_NAMES);
    coordinator_names_init(&s->backends, COORD_MAX_NAMES);
    coordinator_names_init(&s->instances, COORD_MAX_CURSORS);
    s->keys.free_head = COORD_NONE;
    if (getrandom(&s->keys.seed, sizeof s->keys.seed, 0) != (ssize_t)sizeof s->keys.seed)
        s->keys.seed = (uint64_t)(uintptr_t)s ^ 0x5bd1e995u;
    /* backend id 0 is "" so that an entry's zero value names no backend */
    return coordinator_names_intern(&s->backends, "") == 0 ? 0 : -1;
}

void coordinator_state_free(coordinator_state *s)
{
    for (uint32_t i = 0; i < s->keys.n_slots; i++)
        free(s->keys.e[i].l1);
    free(s->keys.e);
    free(s->keys.index);
    free(s->salt);
    free(s->cursor);
    coordinator_names_free(&s->models);
    coordinator_names_free(&s->salts);
    coordinator_names_free(&s->backends);
    coordinator_names_free(&s->instances);
    memset(s, 0, sizeof *s);
}
