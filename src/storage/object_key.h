/* ObjectKey: the identity of one stored chunk object (docs/hashing.md,
 * "4. Object keys").
 *
 *   (chunk_hash, model_name, kv_rank, object_group_id, cache_salt)
 *
 * Keys are small fixed-size values so they can live inside hash tables.
 * The two strings point at interned strings (see lmc_key_interner).  A key
 * built from an interner (`interned` set) counts as one reference on each of
 * its strings wherever it is kept: a copy that outlives the key it was
 * copied from takes its own with lmc_keys_hold() and gives it back with
 * lmc_keys_drop(); a copy that lives no longer than its source borrows. */
#ifndef LMC_STORAGE_OBJECT_KEY_H
#define LMC_STORAGE_OBJECT_KEY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define LMC_CHUNK_HASH_MAX 32
#define LMC_MODEL_NAME_MAX 256   /* bytes (docs/protocol.md, "Keys") */
#define LMC_MODEL_NAME_MAX_TEXT "256"
#define LMC_CACHE_SALT_MAX 128   /* bytes */
#define LMC_CACHE_SALT_MAX_TEXT "128"

typedef struct lmc_object_key {
    uint8_t chunk_hash[LMC_CHUNK_HASH_MAX];
    uint8_t chunk_hash_len;       /* 32 for blake3/sha256_cbor */
    uint8_t interned;             /* strings from an interner: references count */
    uint32_t kv_rank;             /* packed, see lmc_kv_rank_pack() */
    uint32_t object_group_id;
    const char *model_name;       /* interned, never NULL */
    const char *cache_salt;       /* interned, "" when absent, never NULL */
} lmc_object_key;

/* (world_size<<24) | (global_rank<<16) | (local_world_size<<8) | local_rank */
static inline uint32_t lmc_kv_rank_pack(uint32_t world_size, uint32_t global_rank,
                                        uint32_t local_world_size, uint32_t local_rank)
{
    return ((world_size & 0xffu) << 24) | ((global_rank & 0xffu) << 16) |
           ((local_world_size & 0xffu) << 8) | (local_rank & 0xffu);
}

/* What the server uses for worker `rank` of `world_size`. */
static inline uint32_t lmc_kv_rank_for_worker(uint32_t world_size, uint32_t rank)
{
    return lmc_kv_rank_pack(world_size, rank, world_size, rank);
}

static inline bool lmc_object_key_equal(const lmc_object_key *a, const lmc_object_key *b)
{
    return a->chunk_hash_len == b->chunk_hash_len && a->kv_rank == b->kv_rank &&
           a->object_group_id == b->object_group_id &&
           memcmp(a->chunk_hash, b->chunk_hash, a->chunk_hash_len) == 0 &&
           (a->model_name == b->model_name || strcmp(a->model_name, b->model_name) == 0) &&
           (a->cache_salt == b->cache_salt || strcmp(a->cache_salt, b->cache_salt) == 0);
}

/* Table hash.  The chunk hash is already uniformly random, so its first 8
 * bytes mixed with rank and group spread keys well; keys that differ only in
 * model or salt merely share a bucket. */
static inline uint64_t lmc_object_key_hash(const lmc_object_key *k)
{
    uint64_t h = 0;
    memcpy(&h, k->chunk_hash, k->chunk_hash_len < 8 ? k->chunk_hash_len : 8);
    h ^= ((uint64_t)k->kv_rank << 32) ^ k->object_group_id;
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdULL;
    h ^= h >> 33;
    return h;
}

/* ---- Interning (thread-safe) -------------------------------------------
 * Model names and cache salts come from clients, so what the server keeps
 * of them is bounded (docs/storage.md, "Interned strings"): names are at
 * most LMC_MODEL_NAME_MAX / LMC_CACHE_SALT_MAX bytes, paths that only ask
 * about a name use lmc_intern_find(), which never inserts, and a bounded
 * interner holds at most its maximum count: when full it evicts the
 * strings no key references any more, and refuses a new string only when
 * every string it holds is in use.  References: lmc_intern() and
 * lmc_intern_find() return a string with one reference for the caller
 * (give it back with lmc_intern_release(), or hand it to a key with
 * lmc_object_key_set_strings()); every key kept anywhere holds one
 * reference per string.  An interner without a bound never evicts, so its
 * users may ignore references. */
typedef struct lmc_key_interner lmc_key_interner;

/* An interner without a bound on its count (what it holds is bounded by
 * its owner, e.g. the objects an L2 adapter stores). */
lmc_key_interner *lmc_key_interner_new(void);
/* One that holds at most `max_strings` (0: no bound), evicting unreferenced
 * strings to make room. */
lmc_key_interner *lmc_key_interner_new_bounded(size_t max_strings);
void lmc_key_interner_free(lmc_key_interner *in);
/* A copy of `s` (length `len`, need not be NUL-terminated) with one
 * reference for the caller, stable while referenced (and, in an interner
 * without a bound, until the interner is freed).  NULL on allocation
 * failure or when a bounded interner is full of strings in use and `s` is
 * new. */
const char *lmc_intern(lmc_key_interner *in, const char *s, size_t len);
/* The interned copy of `s` with one reference for the caller, or NULL when
 * it is not interned (so no key built through this interner names it).
 * Never inserts. */
const char *lmc_intern_find(lmc_key_interner *in, const char *s, size_t len);
/* Gives back one reference that lmc_intern*() returned.  NULL is ignored. */
void lmc_intern_release(const char *s);
/* Sets both strings of `k` and marks it interned; the key takes over one
 * reference on each (what lmc_intern*() returned, or lmc_keys_hold()). */
void lmc_object_key_set_strings(lmc_object_key *k, const char *model, const char *salt);
/* One reference more / less on each string of every interned key of
 * keys[0..n); keys without `interned` are skipped. */
void lmc_keys_hold(const lmc_object_key *keys, size_t n);
void lmc_keys_drop(const lmc_object_key *keys, size_t n);
/* Strings held, new strings refused because every held one was in use,
 * and unreferenced strings evicted to make room. */
size_t lmc_key_interner_count(lmc_key_interner *in);
uint64_t lmc_key_interner_refused(lmc_key_interner *in);
uint64_t lmc_key_interner_evicted(lmc_key_interner *in);
/* True when a bounded interner holds its maximum (a new string may be
 * refused: what tells that refusal from a lack of memory). */
bool lmc_key_interner_full(lmc_key_interner *in);

/* ---- Validation --------------------------------------------------------- */
/* Model names: 1..LMC_MODEL_NAME_MAX bytes of valid UTF-8, no '@' (or NUL):
 * a name that is not UTF-8 would fail every JSON it is written into (the
 * coordinator's events of every tenant, issue 29), so it never gets in. */
bool lmc_model_name_valid(const char *s, size_t len);
#define LMC_MODEL_NAME_RULE                                                               \
    "model_name must be a non-empty str of at most " LMC_MODEL_NAME_MAX_TEXT " bytes of " \
    "valid UTF-8 without '@'"
/* Salts: at most LMC_CACHE_SALT_MAX bytes of valid UTF-8, none of '@' '/'
 * '\\' NUL. "" is valid. */
bool lmc_cache_salt_valid(const char *s, size_t len);
#define LMC_CACHE_SALT_RULE                                                              \
    "cache_salt must be a str of at most " LMC_CACHE_SALT_MAX_TEXT " bytes of valid UTF-8 " \
    "without '@/\\'"

/* ---- Text forms (docs/hashing.md, "4. Object keys") -------------------- */
/* Canonical string key:
 *   <model>@<kv_rank %08x>@<group %x>@<hash hex>[@<salt>]
 * Filesystem name:
 *   <model, "/"→"-SEP-">@0x<kv_rank %08x>@<group %x>@<hash hex>[@<salt>].data
 * Both return the number of characters written (excluding NUL), or -1 if
 * `cap` is too small. */
int lmc_object_key_to_string(const lmc_object_key *k, char *out, size_t cap);
int lmc_object_key_to_filename(const lmc_object_key *k, char *out, size_t cap);

/* A buffer of this many bytes is always large enough for either form. */
size_t lmc_object_key_text_cap(const lmc_object_key *k);

/* Parse the forms above back into a key whose strings are interned in `in`.
 * Return 0 on success, -1 for anything that is not exactly such a form.
 * Only what the printers produce is accepted, so that every accepted text
 * prints back identically: lowercase hex only, kv_rank exactly 8 digits
 * (filenames: "0x" + 8), object_group_id 1..8 digits without leading zeros,
 * a non-empty hash of even length up to 64 digits, 4 fields, or 5 with a
 * non-empty valid salt, and for filenames the ".data" suffix and no '/'.
 * The filename form maps every "-SEP-" back to '/', so a model name that
 * itself contains "-SEP-" does not survive key -> filename -> key. */
int lmc_object_key_parse_string(lmc_key_interner *in, const char *s, lmc_object_key *out);
int lmc_object_key_parse_filename(lmc_key_interner *in, const char *name, lmc_object_key *out);

#endif
