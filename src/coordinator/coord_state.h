/* The coordinator's state (docs/coordinator.md): names, per-key facts,
 * per-salt usage and LRU, quotas, pins, event cursors.  Everything here is
 * plain data guarded by the owner's one mutex (coordinator_state.mu); nothing in
 * this header takes a lock itself. */
#ifndef LMC_COORDINATOR_COORD_STATE_H
#define LMC_COORDINATOR_COORD_STATE_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define COORD_NONE UINT32_MAX
#define COORD_HASH_MAX 32
#define COORD_MODEL_MAX 256     /* bytes (docs/coordinator.md, "Bounds") */
#define COORD_SALT_MAX 128
#define COORD_INSTANCE_ID_MAX 256
#define COORD_BACKEND_MAX 64
#define COORD_MAX_NAMES 65536   /* distinct models, salts, backends each */
#define COORD_MAX_CURSORS 4096  /* instances the event gate remembers */
#define COORD_MAX_CAPACITIES 16 /* capacity declarations kept per instance */

/* ---- names: strings <-> small ids ---------------------------------------- */
typedef struct {
    char **strs;
    uint32_t n, cap;
    uint32_t *index; /* open addressing: id + 1, 0 = empty */
    uint32_t mask;
    uint32_t max;
} coordinator_names;

/* Names lookups resolved lately: a batch names the same model and a few
 * salts over and over.  Direct-mapped on the length and the outer bytes;
 * names are never removed, so an id once cached stays right. */
#define COORD_NAME_MEMO_WAYS 8
typedef struct {
    uint32_t id[COORD_NAME_MEMO_WAYS];
    uint32_t len1[COORD_NAME_MEMO_WAYS]; /* the name's length + 1; 0 = empty */
} coordinator_name_memo;

void coordinator_names_init(coordinator_names *t, uint32_t max);
void coordinator_names_free(coordinator_names *t);
/* The id of s, adding it; COORD_NONE when full or out of memory. */
uint32_t coordinator_names_intern(coordinator_names *t, const char *s);
/* The id of s, or COORD_NONE. */
uint32_t coordinator_names_find(const coordinator_names *t, const char *s);
const char *coordinator_names_str(const coordinator_names *t, uint32_t id);
/* coordinator_names_find / _intern through the memo; s has len bytes (and its
 * NUL). */
uint32_t coordinator_names_lookup(coordinator_names *t, coordinator_name_memo *m, const char *s, size_t len,
                            bool intern);

/* ---- keys and their facts ------------------------------------------------- */
typedef struct {
    uint8_t hash[COORD_HASH_MAX];
    uint32_t kv_rank, group;
    uint32_t model, salt; /* name ids */
    uint8_t hash_len;
} coordinator_key;

typedef struct {
    uint32_t instance; /* cursor id */
    uint32_t backend;  /* name id */
    uint64_t size;
} coordinator_l1_place;

enum { COORD_IN_L2 = 1, COORD_L2_SHARED = 2 };

/* One key the coordinator knows of: placed in L2, in some instance's L1,
 * or pinned.  Kept compact (docs/coordinator.md, "Memory"). */
typedef struct {
    uint8_t hash[COORD_HASH_MAX];
    uint32_t kv_rank, group, model, salt;
    uint64_t l2_size;
    uint64_t touch;          /* last store/access order, for the LRU */
    coordinator_l1_place *l1;      /* n_l1 placements, NULL when none */
    uint32_t lru_prev, lru_next; /* within the salt's L2 LRU; free-list link */
    uint32_t pins;
    uint32_t num_tokens;
    uint16_t l2_backend;
    uint16_t n_l1;
    uint8_t hash_len;
    uint8_t flags;
} coordinator_entry;

typedef struct {
    coordinator_entry *e;
    uint32_t n_slots, cap, n_live;
    uint32_t free_head;
    uint64_t *index; /* hash << 32 | entry + 1, 0 = empty; linear probing */
    uint32_t mask;
    uint64_t seed;   /* of the table hash, drawn at start */
    uint32_t max_live; /* new keys past this many are refused; 0 = no bound */
    uint64_t refused;  /* new keys refused for max_live */
} coordinator_keys;

/* Per salt: usage by tier and the L2 LRU (head = least recent). */
typedef struct {
    uint64_t l2_bytes, l1_bytes;
    uint64_t l2_count, l1_count;
    uint32_t lru_head, lru_tail;
    bool has_quota;
    double quota_gb;
} coordinator_salt;

typedef struct {
    uint32_t tier_l2 : 1, shared : 1;
    uint32_t backend;
    uint64_t capacity_bytes, revision;
} coordinator_capacity;

/* The event gate's memory of one instance's stream. */
typedef struct {
    bool used;
    int64_t incarnation, last_seq;
    bool gap;
    uint32_t n_caps;
    coordinator_capacity caps[COORD_MAX_CAPACITIES];
} coordinator_cursor;

typedef struct {
    uint64_t applied, duplicates, stale, gaps, fenced;
    uint64_t entries_applied;
    uint64_t l2_usage_posts, l2_usage_events; /* POST /l2/events, applied */
} coordinator_ingest_counters;

typedef struct {
    coordinator_names models, salts, backends, instances;
    coordinator_name_memo model_memo, salt_memo;
    coordinator_keys keys;
    coordinator_salt *salt;       /* indexed by salt id, salts.cap entries */
    uint32_t salt_cap;
    coordinator_cursor *cursor;   /* indexed by instance name id */
    uint32_t cursor_cap;
    uint64_t clock;         /* last touch order handed out */
    bool has_default_quota;
    double default_quota_gb;
    coordinator_ingest_counters ingest;
    uint64_t l2_entries;    /* keys in L2 */
    uint64_t l2_bytes, l1_entries, l1_bytes;
} coordinator_state;

int coordinator_state_init(coordinator_state *s);
void coordinator_state_free(coordinator_state *s);

/* Key table. */
uint32_t coordinator_keys_find(const coordinator_keys *k, const coordinator_key *key);
/* The entry of key, created empty when new; COORD_NONE on out of memory
 * or when the key is new and max_live keys are held (counted in refused:
 * the key directory's bound, docs/coordinator.md "Key directory"). */
uint32_t coordinator_keys_get(coordinator_keys *k, const coordinator_key *key);
/* The same with the key's table hash (coordinator_keys_hash) known: a batch
 * hashes its keys ahead and prefetches their slots, so that the cache
 * misses of many keys overlap instead of coming one after the other. */
uint32_t coordinator_keys_hash(const coordinator_keys *k, const coordinator_key *key);
uint32_t coordinator_keys_find_hashed(const coordinator_keys *k, const coordinator_key *key, uint32_t h);
uint32_t coordinator_keys_get_hashed(coordinator_keys *k, const coordinator_key *key, uint32_t h);
/* Prefetch hints: the index slot where hash h starts probing; the entry
 * that slot names when its hash is h (the slot read, so prefetch it
 * first). */
void coordinator_keys_prefetch_slot(const coordinator_keys *k, uint32_t h);
void coordinator_keys_prefetch_entry(const coordinator_keys *k, uint32_t h);
/* Drops the entry if nothing refers to it any more (not in L2, no L1
 * placement, no pin). */
void coordinator_keys_release(coordinator_keys *k, uint32_t idx);
void coordinator_entry_key(const coordinator_entry *e, coordinator_key *out);
size_t coordinator_keys_memory(const coordinator_keys *k);

/* Salt records (grown on demand); NULL on out of memory. */
coordinator_salt *coordinator_salt_at(coordinator_state *s, uint32_t salt);
/* Cursor records; NULL on out of memory. */
coordinator_cursor *coordinator_cursor_at(coordinator_state *s, uint32_t inst);

/* ---- usage and the L2 LRU (coord_usage.c) --------------------------------- */
/* A store into L2: counted once however often it is stored (the size
 * replaced), and made most recent. */
int coordinator_usage_l2_store(coordinator_state *s, uint32_t idx, uint64_t size, uint32_t backend,
                         bool shared);
/* An access: most recent, when it is in L2. */
void coordinator_usage_l2_touch(coordinator_state *s, uint32_t idx);
/* A delete from L2: usage subtracted, out of the LRU.  May free idx. */
void coordinator_usage_l2_delete(coordinator_state *s, uint32_t idx);
/* Puts a key at the least-recent end (resync backfill, database load). */
int coordinator_usage_l2_insert_at(coordinator_state *s, uint32_t idx, uint64_t size, uint32_t backend,
                             uint64_t touch);
/* The same at the most recent end whatever the touch (a log replay, which
 * meets keys in no particular order); coordinator_usage_l2_sort then orders
 * every salt's LRU by touch once, instead of a walk per key.  0, or -1 out
 * of memory (the lists are then as they were). */
int coordinator_usage_l2_append(coordinator_state *s, uint32_t idx, uint64_t size, uint32_t backend,
                          uint64_t touch);
int coordinator_usage_l2_sort(coordinator_state *s);
int coordinator_usage_l1_store(coordinator_state *s, uint32_t idx, uint32_t inst, uint32_t backend,
                         uint64_t size);
/* May free idx. */
void coordinator_usage_l1_delete(coordinator_state *s, uint32_t idx, uint32_t inst);
/* Voids every L1 placement of inst (fencing); the number voided. */
size_t coordinator_usage_l1_void(coordinator_state *s, uint32_t inst);

/* ---- quotas (coord_quota.c) ----------------------------------------------- */
#define COORD_GB 1073741824.0
/* The limit eviction applies to a salt: its quota, else the default;
 * false when the salt is exempt. */
bool coordinator_quota_limit(const coordinator_state *s, uint32_t salt, double *limit_bytes);
/* Whether the salt's L2 usage reached watermark x limit. */
bool coordinator_quota_over(const coordinator_state *s, uint32_t salt, double watermark);

/* ---- eviction choice (coord_evict.c) -------------------------------------- */
/* Up to max entry indices of salt's least-recent L2 keys, pinned ones
 * excluded: ceil(ratio x count), or all when the limit is 0.  Returns the
 * number written. */
size_t coordinator_evict_choose(const coordinator_state *s, uint32_t salt, double ratio, uint32_t *out,
                          size_t max);

#endif
