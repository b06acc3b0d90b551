/* The storage contract (docs/storage.md, "StorageManager facade"; upstream's
 * Design B core with one DRAM L1): lifecycle, leases, delete/clear/touch,
 * the listeners of its state changes, usage and status.
 *
 * Owns the L1 arena (SHM or private memory), the L1 manager, the L1
 * eviction controller and, with lazy growth, a background grower.  Offsets
 * are arena-relative (engine slot offsets), data lives at
 * lmc_storage_manager_l1_arena(sm)->base + offset.
 *
 * Thread-safety: every function may be called from any thread once
 * create() returned, except close().  Listener callbacks run on the thread
 * whose call produced the event (or on the thread delivering queued events,
 * see l1_manager.h), never with an L1 lock held, so they may call back into
 * the storage manager.  They should still be quick and must not block.
 *
 * What is not the contract lives beside it: the options from a parsed
 * configuration (storage_config.h), the event bus and the L2 placement
 * relays (storage_events.h), the L2 tier's hook (storage_tier.h, for
 * src/storage/l2 only; callers reach L2 through storage/l2/l2_service.h)
 * and the hooks of the tests (storage_manager_testing.h). */
#ifndef LMC_STORAGE_STORAGE_MANAGER_H
#define LMC_STORAGE_STORAGE_MANAGER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "storage/l1/l1_arena.h"
#include "storage/lease.h"
#include "storage/object_key.h"
#include "storage/ttl_lock.h"

/* jansson's object type, declared here so that the contract does not pull
 * in the JSON library for one return value (C17 allows the same typedef
 * twice). */
typedef struct json_t json_t;

#define LMC_STORAGE_DEFAULT_WRITER_TAG "storage_manager"
/* The L2 prefetch's writer tag; its allocation failures count as
 * during="l2_prefetch", every other tag's as "l1_store". */
#define LMC_STORAGE_L2_PREFETCH_TAG "l2_prefetch"

typedef struct lmc_storage_options {
    uint64_t l1_size_bytes;          /* required, > 0 */
    bool l1_use_lazy;
    uint64_t l1_init_bytes;          /* lazy: committed at start (rounded up to 64 MiB) */
    uint64_t l1_align_bytes;         /* power of two */
    bool l1_use_hugepages;
    int64_t l1_shm_reserve_bytes;    /* /dev/shm left free; < 0: automatic */
    bool shm_auto;                   /* true: "lmcache_l1_pool_<pid>" */
    char shm_name[LMC_L1_SHM_NAME_MAX + 1]; /* when !shm_auto; "" = private memory */
    int l1_write_ttl_seconds;
    int l1_read_ttl_seconds;
    char eviction_policy[32];        /* "LRU" or "noop" */
    double eviction_trigger_watermark;
    double eviction_ratio;
    uint32_t eviction_period_ms;     /* 1000; 0 = no thread (tests: run_once) */
    uint64_t lazy_grow_step_bytes;   /* bytes committed per grower step (1 GiB) */
    uint32_t lazy_grow_interval_ms;  /* pause between grower steps (0) */
    lmc_clock_ms_fn clock;           /* NULL: CLOCK_MONOTONIC */
    void *clock_user;
    bool check_books;                /* the L1 books after every mutating call
                                      * (docs/storage.md, "Invariants") */
} lmc_storage_options;

/* Defaults of the flags (docs/configuration.md, "Storage Manager (L1)"),
 * with l1_size_bytes = 0.  From a parsed configuration: storage_config.h. */
void lmc_storage_options_defaults(lmc_storage_options *o);

typedef struct lmc_storage_manager lmc_storage_manager;

/* ---- lifecycle --------------------------------------------------------- */
/* NULL on failure with a one-line reason in `err`. */
lmc_storage_manager *lmc_storage_manager_create(const lmc_storage_options *o, char *err,
                                                size_t errlen);
/* Closes an attached L2 tier, stops the eviction and grower threads, frees
 * every object, unmaps the arena and unlinks its SHM segment.  NULL is a
 * no-op. */
void lmc_storage_manager_close(lmc_storage_manager *sm);

/* ---- listeners (L2 write-behind, fleet reporter) -----------------------
 * Part of the contract: what "written", "deleted" and "accessed" mean is
 * defined by the leases and the maintenance calls below.
 * written:  keys newly admitted by a publish without readers (not
 *           temporary; an L2 prefetch's publish with readers is not "written")
 * deleted:  keys whose resident copy (or last staging buffer) was freed:
 *           delete, clear, eviction, last read of a temporary object
 * accessed: keys passed to touch()
 * Any callback may be NULL.  Register before concurrent use. */
typedef struct lmc_storage_listener {
    void (*on_written)(void *user, const lmc_object_key *keys, size_t n);
    void (*on_deleted)(void *user, const lmc_object_key *keys, size_t n);
    void (*on_accessed)(void *user, const lmc_object_key *keys, size_t n);
    void *user;
} lmc_storage_listener;

#define LMC_STORAGE_MAX_LISTENERS 8
/* 0, or -1 when LMC_STORAGE_MAX_LISTENERS are registered already. */
int lmc_storage_manager_add_listener(lmc_storage_manager *sm, const lmc_storage_listener *l);

/* Removes a listener registered with exactly these callbacks and user.  Must
 * not race with an event being delivered to it (remove while no calls that
 * produce events are in flight, e.g. at shutdown). */
void lmc_storage_manager_remove_listener(lmc_storage_manager *sm, const lmc_storage_listener *l);

/* ---- leases (docs/storage.md, "Leases") --------------------------------
 * The only way to hold L1 bytes.  Each call fills leases[i] and results[i]
 * for keys[i] (results may be NULL); leases of keys that did not succeed
 * are NONE.  Whatever was granted goes back, once, through
 * lmc_storage_manager_give_back(), which also publishes nothing a WRITE
 * lease staged.  Every call returns 0 (or a count), or -1 for invalid
 * arguments or when bookkeeping memory ran out: then nothing was granted. */

/* WRITE leases: one staging buffer of `object_size` raw bytes per key for
 * `writer_tag` (NULL: "storage_manager"); leases[i] names where to write.
 * NOT_WRITABLE: resident already, or this writer stages it already;
 * WRONG_STATE: a forced clear retired this writer's buffer of the key while
 * it was written, until that lease goes back or lapses; OUT_OF_MEMORY: the
 * batch did not fit (every key that needed a buffer gets it). */
int lmc_storage_manager_lease_write(lmc_storage_manager *sm, const lmc_object_key *keys,
                                    size_t n, uint64_t object_size, bool is_temporary,
                                    const char *writer_tag, lmc_lease *leases,
                                    lmc_l1_result *results);
/* Publishes WRITE leases: readers == 0 returns them; readers > 0 turns each
 * into a READ lease of that many shares on the resident copy, atomically
 * (an L2 prefetch's loaded chunks are never evictable in between).  A key
 * whose write a forced clear voided meanwhile is NOT_EXIST: not stored. */
int lmc_storage_manager_publish_writes(lmc_storage_manager *sm, const lmc_object_key *keys,
                                       lmc_lease *leases, size_t n, uint32_t readers,
                                       lmc_l1_result *results);
/* READ leases of `readers` (clamped to [1,128]) shares each.  prefix: the
 * leading run of resident keys (a lookup; keys from the first miss on are
 * untouched and counted as misses); otherwise every key on its own.  want:
 * the sizes the reader's layout expects (NULL: any); an object of another
 * size is a miss (WRONG_SIZE, counted).  Returns how many were granted. */
size_t lmc_storage_manager_lease_read(lmc_storage_manager *sm, const lmc_object_key *keys,
                                      size_t n, uint32_t readers, bool prefix,
                                      const lmc_object_sizes *want, lmc_lease *leases,
                                      lmc_l1_result *results);
/* COPY leases: leases[i] names the range to copy out of; a forced delete
 * or clear keeps that buffer for the copy until the lease goes back (or its
 * lock lapses).  all_or_none: unless every key can be copied none is.
 * want: as for READ; every reader that copies at its layout's size passes
 * it.  Returns how many were granted. */
size_t lmc_storage_manager_lease_copy(lmc_storage_manager *sm, const lmc_object_key *keys,
                                      size_t n, lmc_copy_share share, bool all_or_none,
                                      const lmc_object_sizes *want,
                                      lmc_lease *leases, lmc_l1_result *results);
/* Deletes (non-force) the resident objects of keys[0..n) that are not of
 * `object_size` bytes, as a writer of that size does before its WRITE
 * leases: a model redeployed with another shape replaces the objects of
 * its earlier layout instead of being locked out of those keys until they
 * are evicted (docs/storage.md, "Objects of another size").  Returns how
 * many were deleted. */
size_t lmc_storage_manager_delete_other_size(lmc_storage_manager *sm, const lmc_object_key *keys,
                                             size_t n, uint64_t object_size);
/* Gives back every held lease of leases[0..n) and marks it RETURNED (others
 * are skipped; a second give-back is counted, harmless). */
void lmc_storage_manager_give_back(lmc_storage_manager *sm, const lmc_object_key *keys,
                                   lmc_lease *leases, size_t n);
void lmc_storage_manager_lease_counts(lmc_storage_manager *sm, lmc_lease_counts *out);

/* ---- maintenance ------------------------------------------------------- */
/* Idempotent: missing keys are neither deleted nor skipped.  0 or -1. */
int lmc_storage_manager_delete(lmc_storage_manager *sm, const lmc_object_key *keys, size_t n,
                               bool force, size_t *deleted, size_t *skipped_locked);
/* Returns the number of keys dropped, or -1 on allocation failure. */
long lmc_storage_manager_clear(lmc_storage_manager *sm, bool force);
void lmc_storage_manager_touch(lmc_storage_manager *sm, const lmc_object_key *keys, size_t n);

/* ---- usage / status ---------------------------------------------------- */
/* used = committed - free, total = committed so far (lazy: grows). */
void lmc_storage_manager_usage(lmc_storage_manager *sm, uint64_t *used, uint64_t *total);
/* New reference: {is_healthy, l1_manager{...}, l1_managers{"_default":...},
 * l1_eviction_controller{...}, l1_eviction_controllers{...}, num_l2_adapters,
 * l2_adapters[], l1_usage[used,total], l1_capacity_bytes_by_backend{...},
 * l1_arena{...}}.  NULL on allocation failure. */
json_t *lmc_storage_manager_report_status(lmc_storage_manager *sm);
/* Whether /dev/shm backs less than the configured L1 (docs/storage.md, "A
 * small /dev/shm"); then `why` gets the reason. */
bool lmc_storage_manager_l1_short(lmc_storage_manager *sm, char *why, size_t cap);
/* The pre-fault after start (docs/storage.md, "Pre-fault"): bytes
 * committed and faulted in so far; true while it runs. */
bool lmc_storage_manager_prefault_progress(lmc_storage_manager *sm, uint64_t *populated);
/* {base, size, shm_name} of the L1 arena (engine SHM pool, pinning, P2P). */
const lmc_l1_arena_desc *lmc_storage_manager_l1_arena(const lmc_storage_manager *sm);
/* One synchronous eviction cycle; returns the number of keys evicted.  A
 * writer whose batch did not fit runs one before it tries again (and the
 * tests run it instead of the eviction thread). */
size_t lmc_storage_manager_run_eviction_once(lmc_storage_manager *sm);

#endif
