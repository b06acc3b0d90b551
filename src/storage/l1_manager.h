/* L1 manager (storage.md §3.3, Design B): the resident-object table, the
 * per-writer staging reservations and the allocator of one L1 arena.
 *
 *   resident: key -> {offset, size, read lock, is_temporary}
 *   staging:  key -> (writer tag -> {offset, size, write lock, is_temporary})
 *
 * Objects are described by arena-relative (offset, size); the manager never
 * touches arena bytes, so it works for any arena (DRAM, SHM, later others).
 *
 * Locking: one mutex guards both tables, the allocator and the counters.
 * Every batched call runs atomically under it and reports per-key results.
 * Listener callbacks are NEVER called with that mutex held: each call queues
 * its events under the mutex and delivers them after unlocking, in the order
 * the calls took the mutex (a dispatch lock taken with trylock serializes
 * delivery; a thread that finds it busy leaves its events to the thread
 * that holds it).  A listener may therefore call back into the manager; the
 * events of such nested calls are delivered after the listener returns.
 *
 * Keys are stored by value; their model_name/cache_salt pointers must stay
 * valid while the key is stored (use interned strings). */
#ifndef LMC_STORAGE_L1_MANAGER_H
#define LMC_STORAGE_L1_MANAGER_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "storage/l1_alloc.h"
#include "storage/object_key.h"
#include "storage/ttl_lock.h"

typedef enum lmc_l1_result {
    LMC_L1_SUCCESS = 0,
    LMC_L1_KEY_NOT_EXIST,
    LMC_L1_KEY_NOT_READABLE,
    LMC_L1_KEY_NOT_WRITABLE,
    LMC_L1_KEY_IN_WRONG_STATE,
    LMC_L1_KEY_IS_LOCKED,
    LMC_L1_OUT_OF_MEMORY,
} lmc_l1_result;

/* Each copy of a key that becomes resident gets an id, unique over the
 * manager's life, so that a copy stored after a forced clear is told apart
 * from the one before it even at the same offset.  0 is no copy. */
typedef uint64_t lmc_l1_copy_id;

const char *lmc_l1_result_name(lmc_l1_result r);

#define LMC_L1_MAX_READERS 128   /* reserve_read clamps n to [1, 128] */
#define LMC_L1_MAX_LISTENERS 8

typedef enum lmc_l1_event_kind {
    LMC_L1_EVENT_WRITE_RESERVED,        /* reserve_write (incl. takeovers) */
    LMC_L1_EVENT_WRITE_FINISHED,        /* finish_write: newly admitted, non-temporary */
    LMC_L1_EVENT_WRITE_FINISHED_READ_RESERVED, /* finish_write_and_reserve_read */
    LMC_L1_EVENT_READ_RESERVED,         /* reserve_read / reserve_read_prefix */
    LMC_L1_EVENT_READ_FINISHED,         /* finish_read */
    LMC_L1_EVENT_DELETED,   /* resident copy freed, or last staging buffer freed */
    LMC_L1_EVENT_ACCESSED,              /* touch */
} lmc_l1_event_kind;

const char *lmc_l1_event_kind_name(lmc_l1_event_kind kind);

/* Called without any manager lock held; `keys` is valid during the call. */
typedef void (*lmc_l1_listener_fn)(void *user, lmc_l1_event_kind kind,
                                   const lmc_object_key *keys, size_t n);

typedef enum lmc_l1_evictability {
    LMC_L1_EVICTABLE,       /* resident and unlocked, or only expired staging */
    LMC_L1_NOT_EVICTABLE,   /* read-locked, or a live staging reservation */
    LMC_L1_GONE,            /* not in L1 at all (a policy may drop it) */
} lmc_l1_evictability;

typedef struct lmc_l1_manager_options {
    uint64_t configured_bytes;   /* full arena size (rounded down to align) */
    uint64_t committed_bytes;    /* initial allocator heap (lazy: < configured) */
    uint64_t align_bytes;        /* power of two */
    int64_t write_ttl_ms;
    int64_t read_ttl_ms;
    lmc_clock_ms_fn clock;       /* NULL: lmc_monotonic_ms */
    void *clock_user;
    const char *backend;         /* capacity_bytes_by_backend key; NULL: "dram" */
} lmc_l1_manager_options;

typedef struct lmc_l1_manager lmc_l1_manager;

typedef struct lmc_l1_stats {
    size_t num_objects;          /* resident */
    size_t num_staging;          /* staging reservations (incl. expired) */
    size_t num_locked;           /* resident objects with a live read lock */
    size_t num_temporary;        /* resident temporary objects */
    uint64_t object_bytes;
    uint64_t staging_bytes;
    size_t num_retired;          /* buffers a forced delete/clear left to their holders */
    uint64_t retired_bytes;
    uint64_t used_bytes;         /* committed - free */
    uint64_t committed_bytes;
    uint64_t configured_bytes;
} lmc_l1_stats;

lmc_l1_manager *lmc_l1_manager_new(const lmc_l1_manager_options *opts);
/* Frees every object.  No other thread may use the manager any more. */
void lmc_l1_manager_free(lmc_l1_manager *m);

/* Listener registration is cheap and thread-safe; removal must not race
 * with a dispatch to that listener (remove before freeing its user data,
 * while no calls are in flight).  add: 0, or -1 when the table is full. */
int lmc_l1_manager_add_listener(lmc_l1_manager *m, lmc_l1_listener_fn fn, void *user);
void lmc_l1_manager_remove_listener(lmc_l1_manager *m, lmc_l1_listener_fn fn, void *user);

/* All batched calls: results[i] is the outcome for keys[i].  The call
 * itself returns 0, or -1 for invalid arguments or when bookkeeping memory
 * could not be allocated (then nothing changed). */

/* Reserve staging buffers of `object_size` raw bytes for writer `tag`.
 * Resident keys and keys the same tag stages with a live write lock get
 * NOT_WRITABLE; keys whose buffer of the same tag a forced delete or clear
 * retired while it was written get WRONG_STATE until that write finishes
 * (it publishes nothing) or expires; an expired reservation of the same
 * tag is taken over; all other keys come from one batched allocation:
 * OUT_OF_MEMORY for all of them if it does not fit.  is_temporary may be
 * NULL (all false).  offsets[i] is set for SUCCESS keys. */
int lmc_l1_manager_reserve_write(lmc_l1_manager *m, const lmc_object_key *keys,
                                 const bool *is_temporary, size_t n, uint64_t object_size,
                                 const char *tag, uint64_t *offsets, lmc_l1_result *results);
/* Admit the tag's live staging buffers: NOT_EXIST without one, WRONG_STATE
 * if its write lock expired (left for reclamation).  If the key became
 * resident meanwhile the staged copy is freed and the result is SUCCESS. */
int lmc_l1_manager_finish_write(lmc_l1_manager *m, const lmc_object_key *keys, size_t n,
                                const char *tag, lmc_l1_result *results);
/* finish_write plus `readers` read locks on the resident copy, atomically.
 * copies (may be NULL) receives the id of each copy locked (SUCCESS keys). */
int lmc_l1_manager_finish_write_and_reserve_read(lmc_l1_manager *m, const lmc_object_key *keys,
                                                 size_t n, uint32_t readers, const char *tag,
                                                 lmc_l1_result *results, lmc_l1_copy_id *copies);
/* Drop the tag's live staging buffers (a failed load). */
int lmc_l1_manager_finish_write_and_delete(lmc_l1_manager *m, const lmc_object_key *keys,
                                           size_t n, const char *tag, lmc_l1_result *results);

/* `readers` (clamped to [1,128]) read locks on resident keys; staging-only
 * keys are NOT_EXIST. */
int lmc_l1_manager_reserve_read(lmc_l1_manager *m, const lmc_object_key *keys, size_t n,
                                uint32_t readers, lmc_l1_result *results);
/* reserve_read on keys[0..) up to the first key that is not resident;
 * returns how many were locked.  Keys after the first miss are untouched.
 * copies (may be NULL) receives the id of each copy locked, for
 * finish_read_copies. */
size_t lmc_l1_manager_reserve_read_prefix(lmc_l1_manager *m, const lmc_object_key *keys,
                                          size_t n, uint32_t readers, lmc_l1_copy_id *copies);
/* Location of resident keys that hold a live read lock (NOT_READABLE when
 * resident but unlocked, NOT_EXIST otherwise).  Takes no TTL lock; the
 * caller's read lock keeps the range valid until its finish_read.  Each
 * range handed out also pins the buffer: a forced delete or clear keeps it
 * allocated until lmc_l1_manager_unpin (or the lock's expiry). */
int lmc_l1_manager_unsafe_read(lmc_l1_manager *m, const lmc_object_key *keys, size_t n,
                               lmc_l1_range *ranges, lmc_l1_result *results);
/* The copy out of ranges[i], which unsafe_read returned for keys[i], is
 * done (once per SUCCESS of unsafe_read; ranges it did not hand out are
 * ignored).  The range names the buffer: after a forced clear and a new
 * store of the same key, the old copy and the new one are told apart. */
void lmc_l1_manager_unpin(lmc_l1_manager *m, const lmc_object_key *keys,
                          const lmc_l1_range *ranges, size_t n);
/* A reader that read every key is done: unpins ranges[i] and gives back one
 * read share of keys[i], on the copy at ranges[i] only (a newer copy of the
 * key, stored after a forced clear, keeps its shares). */
void lmc_l1_manager_end_read(lmc_l1_manager *m, const lmc_object_key *keys,
                             const lmc_l1_range *ranges, size_t n);
/* The unaligned object size the writer reserved, per resident key (0 when
 * not resident).  Ranges carry the aligned size; L2 copies exactly this. */
void lmc_l1_manager_object_sizes(lmc_l1_manager *m, const lmc_object_key *keys, size_t n,
                                 uint64_t *sizes);
/* Releases `readers` read locks (at least 1): NOT_EXIST if not resident,
 * WRONG_STATE if not read-locked.  A temporary object is freed when its
 * count reaches 0.  With `ranges` (from unsafe_read), only the copy at
 * ranges[i] gives its shares back: a newer copy of the key, stored after a
 * forced clear, is NOT_EXIST to this call.  results may be NULL. */
int lmc_l1_manager_finish_read(lmc_l1_manager *m, const lmc_object_key *keys,
                               const lmc_l1_range *ranges, size_t n, uint32_t readers,
                               lmc_l1_result *results);
/* finish_read on the copy copies[i] of keys[i] only (ids from
 * reserve_read_prefix or finish_write_and_reserve_read; 0 = no copy: NOT_EXIST, nothing
 * released; copies NULL: as finish_read without ranges).  Read locks that
 * outlive every range (a LOOKUP's) go back this way: a forced clear frees
 * the old copy, and a new copy of the key may then sit at the same offset,
 * so only the id tells them apart. */
int lmc_l1_manager_finish_read_copies(lmc_l1_manager *m, const lmc_object_key *keys,
                                      const lmc_l1_copy_id *copies, size_t n, uint32_t readers,
                                      lmc_l1_result *results);
/* Reclaims expired staging first; then IS_LOCKED if live staging remains or
 * the resident copy is read-locked (unless force), else frees everything of
 * the key: SUCCESS, or NOT_EXIST if there was nothing.  force also drops
 * live staging (unsafe; admin only). */
int lmc_l1_manager_delete(lmc_l1_manager *m, const lmc_object_key *keys, size_t n, bool force,
                          lmc_l1_result *results);
/* Non-force: drops every unlocked resident object and every expired staging
 * buffer; force: drops everything.  Returns the number of keys reported as
 * deleted, or -1 if bookkeeping memory ran out (nothing changed). */
long lmc_l1_manager_clear(lmc_l1_manager *m, bool force);
/* delete() that also reports, per key it freed a resident copy of, how old
 * the object was: admission -> now, last read lock or touch -> now, and
 * whether the sampler picked it (ages may be NULL).  The L1 eviction
 * controller uses it for the lifecycle metrics. */
typedef struct lmc_l1_object_age {
    bool sampled;
    double lifetime_s;
    double idle_s;
} lmc_l1_object_age;
int lmc_l1_manager_delete_aged(lmc_l1_manager *m, const lmc_object_key *keys, size_t n,
                               bool force, lmc_l1_object_age *ages, lmc_l1_result *results);

/* Lifecycle sampling: `fn` decides once per object, when it becomes
 * resident, whether its lifecycle is observed (called with the manager's
 * mutex held: it must be quick and must not call back).  Every read lock
 * or touch of a sampled object records the gap since its previous one;
 * take_reuse_gaps moves up to `cap` recorded gaps (seconds) out.  At most
 * LMC_L1_REUSE_GAPS_MAX wait; later ones are dropped until taken. */
#define LMC_L1_REUSE_GAPS_MAX 4096
typedef bool (*lmc_l1_sampler_fn)(const lmc_object_key *key, void *user);
void lmc_l1_manager_set_sampler(lmc_l1_manager *m, lmc_l1_sampler_fn fn, void *user);
size_t lmc_l1_manager_take_reuse_gaps(lmc_l1_manager *m, double *gaps_s, size_t cap);

/* Reports an access to listeners (LRU touch) and refreshes the objects'
 * last-touch time. */
void lmc_l1_manager_touch(lmc_l1_manager *m, const lmc_object_key *keys, size_t n);
lmc_l1_evictability lmc_l1_manager_is_evictable(lmc_l1_manager *m, const lmc_object_key *key);

/* Commits `bytes` more of the configured arena to the allocator (lazy
 * growth), never beyond the configured size.  Returns the committed size. */
uint64_t lmc_l1_manager_grow(lmc_l1_manager *m, uint64_t bytes);
/* used = committed - free; total = committed so far. */
void lmc_l1_manager_usage(lmc_l1_manager *m, uint64_t *used, uint64_t *total);
void lmc_l1_manager_stats(lmc_l1_manager *m, lmc_l1_stats *out);
/* Allocator memcheck plus object + staging bytes == allocated bytes. */
bool lmc_l1_manager_memcheck(lmc_l1_manager *m);
/* New reference (caller owns), or NULL on allocation failure. */
json_t *lmc_l1_manager_report_status(lmc_l1_manager *m);
uint64_t lmc_l1_manager_aligned_size(const lmc_l1_manager *m, uint64_t raw);

#endif
