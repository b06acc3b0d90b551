/* L1 manager (docs/storage.md, "L1 manager"): the resident-object table,
 * the per-writer staging reservations and the allocator of one L1 arena.
 * Private to src/storage/: everything else reaches L1 through the storage
 * manager (storage_manager.h), whose leases this manager keeps the books of.
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
#ifndef LMC_STORAGE_L1_L1_MANAGER_H
#define LMC_STORAGE_L1_L1_MANAGER_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "storage/l1/l1_alloc.h"
#include "storage/lease.h"
#include "storage/object_key.h"
#include "storage/ttl_lock.h"

#define LMC_L1_MAX_READERS 128   /* read leases clamp their shares to [1, 128] */
#define LMC_L1_MAX_LISTENERS 8

typedef enum lmc_l1_event_kind {
    LMC_L1_EVENT_WRITE_RESERVED,        /* lease_write (incl. takeovers) */
    LMC_L1_EVENT_WRITE_FINISHED,        /* publish, no readers: newly admitted, non-temporary */
    LMC_L1_EVENT_WRITE_FINISHED_READ_RESERVED, /* publish with readers */
    LMC_L1_EVENT_READ_RESERVED,         /* lease_read, lease_copy taking a share */
    LMC_L1_EVENT_READ_FINISHED,         /* give_back of a READ or COPY lease */
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
    bool check_books;            /* check_books after every mutating call, abort()
                                  * when they do not balance (tests, debug builds) */
} lmc_l1_manager_options;

/* Debug builds (and so the sanitizer builds) check the books after every
 * mutating call unless told otherwise; release builds only on request. */
#ifdef LMC_CHECK_BOOKS_DEFAULT
#define LMC_L1_CHECK_BOOKS_DEFAULT true
#else
#define LMC_L1_CHECK_BOOKS_DEFAULT false
#endif

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
    uint64_t events_lost;        /* listener events a give-back could not allocate */
    uint64_t invariant_violations;
    uint64_t books_checks;       /* checks of the books run so far (status, debug) */
    lmc_lease_counts leases;
} lmc_l1_stats;

lmc_l1_manager *lmc_l1_manager_new(const lmc_l1_manager_options *opts);
/* Frees every object.  No other thread may use the manager any more. */
void lmc_l1_manager_free(lmc_l1_manager *m);

/* Listener registration is cheap and thread-safe; removal must not race
 * with a dispatch to that listener (remove before freeing its user data,
 * while no calls are in flight).  add: 0, or -1 when the table is full. */
int lmc_l1_manager_add_listener(lmc_l1_manager *m, lmc_l1_listener_fn fn, void *user);
void lmc_l1_manager_remove_listener(lmc_l1_manager *m, lmc_l1_listener_fn fn, void *user);

/* All batched calls: results[i] is the outcome for keys[i] and leases[i]
 * the lease granted for it (NONE when not SUCCESS).  The call itself
 * returns 0, or -1 for invalid arguments or when bookkeeping memory could
 * not be allocated (then nothing changed and no lease was granted).
 * docs/storage.md, "Leases", has the rules every holder follows. */

/* WRITE leases: a staging buffer of `object_size` raw bytes per key for
 * writer `tag`.  Resident keys and keys the same tag stages with a live
 * write lock get NOT_WRITABLE; keys whose buffer of the same tag a forced
 * delete or clear retired while it was written get WRONG_STATE until that
 * write is given back or expires; an expired reservation of the same tag
 * is taken over (its old lease becomes stale); all other keys come from one
 * batched allocation: OUT_OF_MEMORY for all of them if it does not fit.
 * is_temporary may be NULL (all false). */
int lmc_l1_manager_lease_write(lmc_l1_manager *m, const lmc_object_key *keys,
                               const bool *is_temporary, size_t n, uint64_t object_size,
                               const char *tag, lmc_lease *leases, lmc_l1_result *results);
/* Makes the WRITE leases' buffers the resident copies (a key already
 * resident keeps its copy; the staged one is freed).  readers == 0: the
 * leases become RETURNED; readers > 0 (clamped to 128): each becomes a
 * READ lease of `readers` shares on the resident copy, atomically.
 * NOT_EXIST for a lease that is not a live WRITE lease (given back, retired
 * by a forced clear: that write is void and publishes nothing); WRONG_STATE
 * when its write lock expired (left for reclamation). */
int lmc_l1_manager_publish_writes(lmc_l1_manager *m, const lmc_object_key *keys,
                                  lmc_lease *leases, size_t n, uint32_t readers,
                                  lmc_l1_result *results);
/* READ leases of `readers` (clamped to [1,128]) shares on resident keys
 * (staging-only keys are NOT_EXIST).  prefix: stop at the first key that is
 * not resident; keys after it are untouched.  want (NULL: any size): an
 * object of another size is WRONG_SIZE, a miss.  Returns how many were
 * granted. */
size_t lmc_l1_manager_lease_read(lmc_l1_manager *m, const lmc_object_key *keys, size_t n,
                                 uint32_t readers, bool prefix, const lmc_object_sizes *want,
                                 lmc_lease *leases, lmc_l1_result *results);
/* COPY leases on resident keys (see lmc_copy_share for the share each
 * carries): NOT_READABLE when CARRIES_SHARE finds no live read lock,
 * NOT_EXIST when not resident, WRONG_SIZE when want (NULL: any size)
 * expects another size.  all_or_none: unless every key can be copied, none
 * is (the results still say which failed).  Returns how many were
 * granted. */
size_t lmc_l1_manager_lease_copy(lmc_l1_manager *m, const lmc_object_key *keys, size_t n,
                                 lmc_copy_share share, bool all_or_none,
                                 const lmc_object_sizes *want, lmc_lease *leases,
                                 lmc_l1_result *results);
/* Gives any leases back: WRITE unpublished (the buffer is freed), READ and
 * COPY (the copy unpinned, its shares released on that copy only).  Marks
 * each RETURNED.  Never fails; what it found is counted (lmc_lease_counts). */
void lmc_l1_manager_give_back(lmc_l1_manager *m, const lmc_object_key *keys, lmc_lease *leases,
                              size_t n);
void lmc_l1_manager_lease_counts(lmc_l1_manager *m, lmc_lease_counts *out);

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
/* Non-force delete() of only those keys whose resident object is not of
 * `object_size` (> 0) bytes and has no reservation; the others are
 * NOT_EXIST and untouched. */
int lmc_l1_manager_delete_other_size(lmc_l1_manager *m, const lmc_object_key *keys, size_t n,
                                     uint64_t object_size, lmc_l1_result *results);

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
/* sizes[i]: the raw size of keys[i]'s resident copy, 0 when not resident.
 * Read-only; no event. */
void lmc_l1_manager_resident_sizes(lmc_l1_manager *m, const lmc_object_key *keys, size_t n,
                                   uint64_t *sizes);
lmc_l1_evictability lmc_l1_manager_is_evictable(lmc_l1_manager *m, const lmc_object_key *key);

/* Commits `bytes` more of the configured arena to the allocator (lazy
 * growth), never beyond the configured size.  Returns the committed size. */
uint64_t lmc_l1_manager_grow(lmc_l1_manager *m, uint64_t bytes);
/* A pre-fault (docs/storage.md, "Pre-fault") will commit up to `target`
 * bytes without delay: usage counts them as capacity already, so that no
 * eviction runs for room that is on its way, and writes that find no room
 * wait for them (lmc_l1_manager_wait_growth).  0 when it is over. */
void lmc_l1_manager_set_commit_target(lmc_l1_manager *m, uint64_t target);
/* Waits up to timeout_ms while the committed size is still `seen` and a
 * pre-fault is to commit more; true when it grew beyond `seen`. */
bool lmc_l1_manager_wait_growth(lmc_l1_manager *m, uint64_t seen, int64_t timeout_ms);
/* used = committed - free; total = committed so far, or the pre-fault's
 * target while one runs. */
void lmc_l1_manager_usage(lmc_l1_manager *m, uint64_t *used, uint64_t *total);
void lmc_l1_manager_stats(lmc_l1_manager *m, lmc_l1_stats *out);
/* The books (docs/storage.md, "Invariants"): the allocator's own check;
 * bytes and counts by state (resident, staging, retired) against a walk of
 * every object and against the allocator; read locks and pins of every
 * copy against what the leases granted and returned.  true when they
 * balance; otherwise the first rule broken is logged with its object and
 * counted (lmc_l1_manager_invariant_violations). */
bool lmc_l1_manager_check_books(lmc_l1_manager *m);
/* Broken rules found so far, by check_books or by the cheap checks every
 * release build makes on its data path (a COPY lease coming back to a copy
 * with no pins, a buffer the allocator does not know). */
uint64_t lmc_l1_manager_invariant_violations(lmc_l1_manager *m);
/* New reference (caller owns), or NULL on allocation failure. */
json_t *lmc_l1_manager_report_status(lmc_l1_manager *m);
uint64_t lmc_l1_manager_aligned_size(const lmc_l1_manager *m, uint64_t raw);

#endif
