/* StorageManager facade (docs/storage.md, "StorageManager facade"; upstream's
 * Design B core with one DRAM L1).
 *
 * Owns the L1 arena (SHM or private memory), the L1 manager, the L1
 * eviction controller and, with lazy growth, a background grower.  RPC
 * modules use only this header; offsets are arena-relative (engine slot
 * offsets), data lives at lmc_storage_manager_l1_arena(sm)->base + offset.
 *
 * Thread-safety: every function may be called from any thread once
 * create() returned, except close().  Listener callbacks run on the thread
 * whose call produced the event (or on the thread delivering queued events,
 * see l1_manager.h), never with an L1 lock held, so they may call back into
 * the storage manager.  They should still be quick and must not block.
 *
 * L2: the storage manager does not know adapters.  An L2 tier (src/storage/l2,
 * library lmc_storage_l2, which depends on this one and not the other way
 * round) attaches itself through lmc_storage_tier_ops; the write-behind
 * subscribes as a listener.  Multiple L1s and P2P serving would plug in
 * behind these same calls. */
#ifndef LMC_STORAGE_STORAGE_MANAGER_H
#define LMC_STORAGE_STORAGE_MANAGER_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "config/config.h"
#include "obs/event_bus.h"
#include "storage/l1/l1_arena.h"
#include "storage/lease.h"
#include "storage/object_key.h"
#include "storage/quota.h"

struct lmc_metrics;
struct lmc_l1_stats;
#include "storage/ttl_lock.h"

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
 * with l1_size_bytes = 0. */
void lmc_storage_options_defaults(lmc_storage_options *o);
/* From the storage group and mp.shm_name of `cfg` (legacy flags or the
 * first --l1-manager DRAM entry).  0, or -1 with a reason in `err`. */
int lmc_storage_options_from_config(const lmc_config *cfg, lmc_storage_options *o, char *err,
                                    size_t errlen);

typedef struct lmc_storage_manager lmc_storage_manager;

/* NULL on failure with a one-line reason in `err`. */
lmc_storage_manager *lmc_storage_manager_create(const lmc_config *cfg, char *err, size_t errlen);
lmc_storage_manager *lmc_storage_manager_create_with_options(const lmc_storage_options *o,
                                                             char *err, size_t errlen);
/* Stops the eviction and grower threads, frees every object, unmaps the
 * arena and unlinks its SHM segment.  NULL is a no-op. */
void lmc_storage_manager_close(lmc_storage_manager *sm);

/* ---- listeners (L2 write-behind, event bus) ----------------------------
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

/* ---- L2 placements (the coordinator's cache-event stream, docs/fleet.md)
 * What each L2 adapter stored (with sizes), deleted (sizes NULL) and loaded
 * back into L1 (an access; sizes NULL), named by the adapter's type and its
 * "shared" flag.  Reported on adapter worker threads or the deleting
 * thread, never with a lock held; the sink must be quick and must not
 * block.  Without a sink a report costs one atomic load. */
typedef enum lmc_placement_kind {
    LMC_PLACEMENT_STORED,
    LMC_PLACEMENT_DELETED,
    LMC_PLACEMENT_ACCESSED,
} lmc_placement_kind;
typedef struct lmc_l2_placement_sink {
    void (*fn)(void *user, lmc_placement_kind kind, const char *backend, bool shared,
               const lmc_object_key *keys, const uint64_t *sizes, size_t n);
    void *user;
} lmc_l2_placement_sink;
/* `sink` (NULL: none) must outlive the storage manager's L2 threads, or be
 * unset before it goes away. */
void lmc_storage_manager_set_l2_placement_sink(lmc_storage_manager *sm,
                                               const lmc_l2_placement_sink *sink);
void lmc_storage_manager_report_l2_placement(lmc_storage_manager *sm, lmc_placement_kind kind,
                                             const char *backend, bool shared,
                                             const lmc_object_key *keys, const uint64_t *sizes,
                                             size_t n);
/* sizes[i]: raw bytes of keys[i]'s resident L1 copy, 0 when not resident
 * (takes the L1 lock once; for reporters, off the request path). */
void lmc_storage_manager_resident_sizes(lmc_storage_manager *sm, const lmc_object_key *keys,
                                        size_t n, uint64_t *sizes);

/* ---- events (metrics) --------------------------------------------------
 * Attaches the event bus the storage manager and its L2 tier publish on
 * (obs/events.h: L1_*, SM_*, L2_*); `sample_rate` is --metrics-sample-rate
 * for the L1 lifecycle histograms.  Call once, before concurrent use;
 * without it nothing is published.  The bus must outlive the manager's
 * threads (close the storage manager first). */
void lmc_storage_manager_set_event_bus(lmc_storage_manager *sm, lmc_event_bus *bus,
                                       double sample_rate);
bool lmc_storage_manager_events_enabled(const lmc_storage_manager *sm);
/* Publishes (steals `metadata`); a no-op without a bus.  For the modules
 * and the L2 tier, whose events belong to the storage's metrics. */
void lmc_storage_manager_publish(lmc_storage_manager *sm, const char *type, json_t *metadata);
/* L1_READ_FAILURE: n keys a caller expected to read (after a lookup, or
 * for the L2 write-behind) were not readable.  `key` names the model. */
void lmc_storage_manager_report_read_failure(lmc_storage_manager *sm, const char *during,
                                             const char *reason, const lmc_object_key *key,
                                             size_t n);
/* {cache_salt: number of keys} (new reference; NULL on allocation failure). */
json_t *lmc_storage_keys_by_salt(const lmc_object_key *keys, size_t n);

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

/* ---- L2 tier (docs/l2.md) ----------------------------------------------
 * A prefetch request: keys[0..n) are the L1 misses after the caller's L1
 * hit run, in units of keys_per_unit keys (a chunk = groups x ranks); only
 * whole units count.  The tier looks the keys up in its adapters, loads
 * the leading run of available units into fresh L1 objects of object_size
 * bytes and read-locks each `readers` times.  Callbacks run on the tier's
 * thread, never inside prefetch(), with no storage lock held:
 *   on_lookup_done(user, units): the lookup phase is over (may be NULL);
 *   on_done(user, units): exactly once; keys[0..units*keys_per_unit) are
 *   then resident and read-locked (`readers` shares) for the caller. */
typedef struct lmc_storage_l2_request {
    const lmc_object_key *keys;   /* copied by prefetch() */
    lmc_lease *leases;            /* before on_done, the READ leases (`readers`
                                   * shares) of keys [0..units*keys_per_unit) for
                                   * the caller to give back; must live until
                                   * on_done (required when readers > 0) */
    size_t n;
    uint32_t keys_per_unit;
    uint64_t object_size;
    const uint64_t *unit_sizes;   /* NULL: every key object_size bytes; else key i
                                   * unit_sizes[i % keys_per_unit] (object groups
                                   * of different sizes; copied by prefetch()) */
    uint32_t readers;
    bool retain;                  /* keep loaded objects resident whatever
                                   * --l2-prefetch-policy says (warm prefetch) */
    void (*on_lookup_done)(void *user, size_t units);
    void (*on_done)(void *user, size_t units);
    void *user;
} lmc_storage_l2_request;

/* One L2 adapter's figures for the metrics (docs/metrics.md, the
 * lmcache_mp_l2_* families). */
typedef struct {
    const char *type_name;      /* static for the tier's lifetime */
    uint64_t stores_completed;  /* ok + failed */
    uint64_t loads;
    uint64_t used_bytes, capacity_bytes;
} lmc_storage_l2_counts;

typedef struct lmc_storage_tier_ops {
    /* 0: accepted (on_done will be called); -1: refused (no call). */
    int (*prefetch)(void *impl, const lmc_storage_l2_request *req);
    /* Finishes every pending prefetch with on_done(0) and refuses new ones;
     * after it no callback runs (owners of callback state call it first). */
    void (*stop_prefetch)(void *impl);
    /* New reference: an object whose fields are merged into the status. */
    json_t *(*report_status)(void *impl);
    /* Fills out[0..min(n, max)) with the adapters' figures, in priority
     * order; returns n, the number of adapters. */
    size_t (*adapter_counts)(void *impl, lmc_storage_l2_counts *out, size_t max);
    /* New reference: {cache_salt: bytes} over the tier's adapters. */
    json_t *(*usage_by_salt)(void *impl);
    /* Index of the adapter whose type name is `type` (case-insensitive; NULL
     * = the primary, 0), or -1 when none matches. */
    int (*find_adapter)(void *impl, const char *type);
    /* One page {"adapter", "shared", "entries", "next_page_token"}.  New
     * reference; NULL when the adapter cannot list. */
    json_t *(*list_objects)(void *impl, int adapter, const char *model, size_t page_size,
                            const char *page_token);
    /* Deletes keys from one adapter (absent or locked keys are skipped);
     * returns how many were removed. */
    size_t (*delete_objects)(void *impl, int adapter, const lmc_object_key *keys, size_t n);
    /* Stops the tier's threads and frees it; runs while L1 is still alive. */
    void (*close)(void *impl);
} lmc_storage_tier_ops;

/* The per-salt L2 quota registry (owned by the storage manager). */
lmc_quotas *lmc_storage_manager_quotas(lmc_storage_manager *sm);
/* Bytes per cache_salt held in L2 ({salt: bytes}, summed over the adapters
 * that track salts, i.e. those with an "eviction" config).  New reference;
 * an empty object without an L2 tier. */
json_t *lmc_storage_manager_l2_usage_by_salt(lmc_storage_manager *sm);

/* L2 object listing and deletion (HTTP /cache/objects).  Without an L2
 * tier find returns -1 and the others do nothing. */
int lmc_storage_manager_l2_find_adapter(lmc_storage_manager *sm, const char *type);
json_t *lmc_storage_manager_l2_list(lmc_storage_manager *sm, int adapter, const char *model,
                                   size_t page_size, const char *page_token);
size_t lmc_storage_manager_l2_delete(lmc_storage_manager *sm, int adapter,
                                     const lmc_object_key *keys, size_t n);

/* The storage manager owns `impl` from here on (close() closes it first).
 * Call once, before concurrent use. */
void lmc_storage_manager_attach_l2(lmc_storage_manager *sm, const lmc_storage_tier_ops *ops,
                                   void *impl);
bool lmc_storage_manager_has_l2(const lmc_storage_manager *sm);
/* -1 without an L2 tier or when refused: the caller has no L2 hits then. */
int lmc_storage_manager_prefetch_l2(lmc_storage_manager *sm, const lmc_storage_l2_request *req);
void lmc_storage_manager_stop_l2_prefetch(lmc_storage_manager *sm);

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
/* The storage's metric families (docs/metrics.md: lmcache_mp_l1_*,
 * lmcache_mp_l1_eviction_* and lmcache_mp_l2_*) and a collector that reads
 * the L1, eviction and L2 counters at scrape time.  The collector runs
 * until the registry is freed: scrapes must end before the manager is
 * freed.  0 or -1 (storage_metrics.c). */
int lmc_storage_manager_register_metrics(lmc_storage_manager *sm, struct lmc_metrics *r);
/* The typed figures the collector reads. */
void lmc_storage_manager_l1_stats(lmc_storage_manager *sm, struct lmc_l1_stats *out);
void lmc_storage_manager_eviction_counts(lmc_storage_manager *sm, uint64_t *cycles,
                                         uint64_t *triggered_cycles, uint64_t *evicted_keys);
/* Fills out[0..min(n, max)); returns n (0 without an L2 tier). */
size_t lmc_storage_manager_l2_counts(lmc_storage_manager *sm, lmc_storage_l2_counts *out,
                                     size_t max);
/* {base, size, shm_name} of the L1 arena (engine SHM pool, pinning, P2P). */
const lmc_l1_arena_desc *lmc_storage_manager_l1_arena(const lmc_storage_manager *sm);
/* One synchronous eviction cycle; returns the number of keys evicted. */
size_t lmc_storage_manager_run_eviction_once(lmc_storage_manager *sm);
/* The L1 books (lmc_l1_manager_check_books): true when they balance. */
bool lmc_storage_manager_check_books(lmc_storage_manager *sm);
uint64_t lmc_storage_manager_invariant_violations(lmc_storage_manager *sm);

#endif
