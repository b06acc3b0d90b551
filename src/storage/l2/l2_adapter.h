/* L2 adapters (docs/l2.md, "Adapter interface").
 *
 * Two layers:
 *  - a *backend* (lmc_l2_backend) does the actual work synchronously and
 *    must be thread-safe: mock (memory), fs (one file per object) and
 *    fault_inject (wraps another backend);
 *  - the *adapter* (lmc_l2_adapter) is what the controllers use: it runs
 *    backend calls on its own worker threads and reports completion through
 *    three eventfds (store, lookup, load) plus "pop completed" / "query
 *    once" calls, like upstream's native-connector bridge.
 *
 * A task's keys may run on several workers at once (the backend's
 * split_ops): a prompt's chunks are stored and loaded in parallel, and the
 * task completes when its last part does (docs/l2.md, "Adapter interface").
 *
 * Buffers are L1 arena ranges: the caller passes arena offsets and sizes;
 * the adapter adds the arena base it was created with.  A buffer must stay
 * valid (read-locked for stores, write-reserved for loads) until its task
 * completed or the adapter was closed.
 *
 * Dependency direction: src/storage/l2 (lmc_storage_l2) uses lmc_storage;
 * lmc_storage knows L2 only through lmc_storage_tier_ops (storage_manager.h). */
#ifndef LMC_STORAGE_L2_ADAPTER_H
#define LMC_STORAGE_L2_ADAPTER_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "storage/object_key.h"
#include "storage/storage_manager.h"
#include "storage/storage_metrics.h"

typedef struct lmc_l2_usage {
    uint64_t used_bytes;
    uint64_t capacity_bytes;   /* 0 = unknown / unlimited */
    uint64_t num_keys;
} lmc_l2_usage;

/* ---- backend (synchronous, thread-safe) ------------------------------- */
typedef struct lmc_l2_backend lmc_l2_backend;

/* One batch of recovered keys: keys written together, the first written
 * first.  Batches come oldest first. */
typedef void (*lmc_l2_recovered_fn)(void *user, const lmc_object_key *keys,
                                    const uint64_t *sizes, size_t n);

typedef struct lmc_l2_backend_ops {
    /* Stores every key (an existing key is skipped and counts as stored).
     * Returns the bytes written, or -1 when any key failed. */
    int64_t (*store)(lmc_l2_backend *b, const lmc_object_key *keys, uint8_t *const *bufs,
                     const uint64_t *sizes, size_t n);
    /* found[i] = 1 when keys[i] is present (and, when sizes != NULL, has
     * that size); found keys are locked against deletion until unlock(). */
    void (*lookup_and_lock)(lmc_l2_backend *b, const lmc_object_key *keys,
                            const uint64_t *sizes, size_t n, uint8_t *found);
    /* Reads exactly sizes[i] bytes into bufs[i]; ok[i] = 1 on success. */
    void (*load)(lmc_l2_backend *b, const lmc_object_key *keys, uint8_t *const *bufs,
                 const uint64_t *sizes, size_t n, uint8_t *ok);
    void (*unlock)(lmc_l2_backend *b, const lmc_object_key *keys, size_t n);
    /* Deletes unlocked keys; returns how many were deleted. */
    size_t (*remove)(lmc_l2_backend *b, const lmc_object_key *keys, size_t n);
    void (*usage)(lmc_l2_backend *b, lmc_l2_usage *u);
    /* Appends {key: EncodedObjectKey, size_bytes, name} of every key of
     * `model` (NULL: all) to `entries`. */
    void (*list)(lmc_l2_backend *b, const char *model, json_t *entries);
    /* New reference: backend-specific status fields. */
    json_t *(*status)(lmc_l2_backend *b);
    void (*destroy)(lmc_l2_backend *b);
    /* Optional (NULL: nothing local to recover).  Hands the keys found at
     * start-up, which this process did not store, to `fn` in the order an
     * LRU should evict them; see lmc_l2_recovered_fn. */
    void (*for_each_recovered)(lmc_l2_backend *b, lmc_l2_recovered_fn fn, void *user);
    /* Optional (NULL: nothing to reach, always healthy).  Asks the backend
     * itself whether it can serve now (docs/l2.md, "Health"): 0, or -1
     * with one line in why.  Blocking (a connect, a request): called only
     * by the health monitor's thread and at start, never on a request. */
    int (*probe)(lmc_l2_backend *b, char *why, size_t cap);
} lmc_l2_backend_ops;

/* Bits of lmc_l2_backend.split_ops: the ops whose calls on parts of a
 * task do what one call on the whole task does (no batch-wide semantics),
 * so the adapter spreads one task's keys over its workers (issue 18). */
#define LMC_L2_SPLIT_STORE 1u
#define LMC_L2_SPLIT_LOOKUP 2u
#define LMC_L2_SPLIT_LOAD 4u
/* The backend is an lmc_l2_batch_backend: its stores are split through
 * its store_batch ops.  A backend that wraps another must not copy this
 * bit unless it is one too. */
#define LMC_L2_SPLIT_STORE_BATCH 8u

struct lmc_l2_backend {
    const lmc_l2_backend_ops *ops;
    const char *type;
    unsigned split_ops;      /* LMC_L2_SPLIT_* (0: every task runs as one call) */
};

/* A store batch whose capacity check covers the whole batch (resp, s3),
 * split into parts (issue 18; docs/l2.md, "Parts").  begin checks and
 * reserves the whole batch before any part runs: NULL when refused
 * (nothing is written, the task fails).  part writes keys[0..n), which are
 * keys [from, from + n) of the batch (bytes written, or -1).  end gives
 * back what no part used (a task dropped at close), frees the batch, and
 * is true when every key was written. */
typedef struct lmc_l2_store_batch_ops {
    void *(*begin)(lmc_l2_backend *b, const lmc_object_key *keys, const uint64_t *sizes,
                   size_t n);
    int64_t (*part)(lmc_l2_backend *b, void *batch, size_t from, const lmc_object_key *keys,
                    uint8_t *const *bufs, const uint64_t *sizes, size_t n);
    bool (*end)(lmc_l2_backend *b, void *batch);
} lmc_l2_store_batch_ops;

/* A backend with LMC_L2_SPLIT_STORE_BATCH starts with one of these. */
typedef struct lmc_l2_batch_backend {
    lmc_l2_backend base;     /* first */
    const lmc_l2_store_batch_ops *store_batch;
} lmc_l2_batch_backend;

/* Builds a backend from one --l2-adapter JSON object (validated strictly
 * with lmc_config_l2_adapter_check first).  *num_workers gets the configured
 * worker count.  NULL with a one-line reason in err. */
lmc_l2_backend *lmc_l2_backend_from_json(const json_t *o, size_t *num_workers, char *err,
                                         size_t errlen);

/* Concrete backends (also used directly by tests). */
lmc_l2_backend *lmc_l2_mock_new(uint64_t capacity_bytes);
typedef struct lmc_l2_fs_options {
    const char *base_path;          /* required */
    const char *relative_tmp_dir;   /* NULL or "": "<name>.tmp" beside the file */
    uint64_t capacity_bytes;        /* 0: unlimited */
    uint64_t read_ahead_size;       /* 0: off */
    bool use_odirect;
    bool recover_on_start;
    bool verify_checksum;           /* write and check BLAKE3 checksums (docs/l2.md, "fs") */
    size_t hash_threads;            /* threads hashing beside the I/O; 0: 4 */
    /* NULL: "user.lmcache.b3".  Tests name a namespace the kernel refuses
     * (EOPNOTSUPP), as a filesystem without user xattrs does. */
    const char *checksum_xattr;
} lmc_l2_fs_options;
lmc_l2_backend *lmc_l2_fs_new(const lmc_l2_fs_options *o, char *err, size_t errlen);
typedef struct lmc_l2_fault_options {
    double fail_rate;     /* fraction of calls that fail */
    double delay_rate;    /* fraction of calls delayed by delay_ms */
    uint32_t delay_ms;
    uint64_t seed;
} lmc_l2_fault_options;
/* A peer lmcached's L1, read-only (docs/p2p.md, "Requesting side"). */
typedef struct lmc_l2_p2p_options {
    const char *peer_mq_server_url;               /* "tcp://ip:port": ops 29-31 */
    const char *peer_transfer_channel_server_url; /* "host:port": the channel */
    double lookup_timeout_s, load_timeout_s;      /* > 0 */
    bool ucx;                                     /* the peer serves the ucx engine, else tcp */
    const char *auth_token;                       /* the channel's token, NULL: none (copied) */
} lmc_l2_p2p_options;
lmc_l2_backend *lmc_l2_p2p_new(const lmc_l2_p2p_options *o, char *err, size_t errlen);
/* One peer reader's books (its /status entry, docs/p2p.md). */
typedef struct lmc_l2_p2p_stats {
    uint64_t lookups, lookup_failures, lookup_timeouts, bad_answers, lookups_skipped, hits;
    uint64_t loads, loaded_bytes, load_failures, unlocks;
} lmc_l2_p2p_stats;
void lmc_l2_p2p_stats_get(lmc_l2_backend *b, lmc_l2_p2p_stats *out);
/* The discovered peers as one "p2p" backend (l2_p2p_peers.c): set adds or
 * replaces peer `id` (0, or -1 with err), drop removes it. */
lmc_l2_backend *lmc_l2_p2p_peers_new(double lookup_timeout_s, double load_timeout_s, bool ucx,
                                     const char *auth_token);
int lmc_l2_p2p_peers_set(lmc_l2_backend *b, const char *id, const char *mq_url,
                         const char *chan_url, char *err, size_t errlen);
void lmc_l2_p2p_peers_drop(lmc_l2_backend *b, const char *id);
/* Lookups asking the peers now. */
size_t lmc_l2_p2p_peers_active_lookups(lmc_l2_backend *b);
/* Each live peer's books, summed over the readers it had (moves); at most
 * cap, in no particular order; returns how many were written. */
typedef struct lmc_l2_p2p_peer_stats {
    char id[256];
    lmc_l2_p2p_stats st;
} lmc_l2_p2p_peer_stats;
size_t lmc_l2_p2p_peers_stats(lmc_l2_backend *b, lmc_l2_p2p_peer_stats *out, size_t cap);
/* Takes ownership of `inner`. */
lmc_l2_backend *lmc_l2_fault_new(lmc_l2_backend *inner, const lmc_l2_fault_options *o);

/* ---- adapter (asynchronous) ------------------------------------------- */
typedef enum { LMC_L2_OP_STORE, LMC_L2_OP_LOOKUP, LMC_L2_OP_LOAD, LMC_L2_NUM_OPS } lmc_l2_op;

typedef struct lmc_l2_adapter lmc_l2_adapter;

/* Takes ownership of `be`; `arena_base` is where arena offsets start.
 * NULL on failure (be is destroyed then). */
lmc_l2_adapter *lmc_l2_adapter_new(lmc_l2_backend *be, uint8_t *arena_base, size_t num_workers);
/* Joins the workers (a running call finishes, queued tasks are dropped),
 * closes the eventfds, destroys the backend.  NULL is a no-op. */
void lmc_l2_adapter_close(lmc_l2_adapter *a);

const char *lmc_l2_adapter_type(const lmc_l2_adapter *a);
/* Readable (counter > 0) when a task of that kind completed.  The reader
 * drains it with lmc_l2_drain_fd() and then pops/queries. */
int lmc_l2_adapter_event_fd(const lmc_l2_adapter *a, lmc_l2_op op);
void lmc_l2_drain_fd(int fd);

/* All submit calls copy their arguments and return a task id (> 0), or 0
 * when out of memory or closed. */
uint64_t lmc_l2_adapter_submit_store(lmc_l2_adapter *a, const lmc_object_key *keys,
                                     const uint64_t *offsets, const uint64_t *sizes, size_t n);
/* One completed store: true with *id and *result (bytes >= 0, or -1). */
bool lmc_l2_adapter_pop_completed_store(lmc_l2_adapter *a, uint64_t *id, int64_t *result);
/* sizes may be NULL (no size check). */
uint64_t lmc_l2_adapter_submit_lookup_and_lock(lmc_l2_adapter *a, const lmc_object_key *keys,
                                               const uint64_t *sizes, size_t n);
/* True exactly once, when task `id` finished: found[0..n) filled. */
bool lmc_l2_adapter_query_lookup(lmc_l2_adapter *a, uint64_t id, uint8_t *found);
uint64_t lmc_l2_adapter_submit_load(lmc_l2_adapter *a, const lmc_object_key *keys,
                                    const uint64_t *offsets, const uint64_t *sizes, size_t n);
bool lmc_l2_adapter_query_load(lmc_l2_adapter *a, uint64_t id, uint8_t *ok);
/* Synchronous and cheap (a refcount), so fire-and-forget is trivially met. */
void lmc_l2_adapter_unlock(lmc_l2_adapter *a, const lmc_object_key *keys, size_t n);
size_t lmc_l2_adapter_delete(lmc_l2_adapter *a, const lmc_object_key *keys, size_t n);
void lmc_l2_adapter_usage(lmc_l2_adapter *a, lmc_l2_usage *u);
/* {entries: [{key, size_bytes}], next_page_token: str|null}, sorted by the
 * canonical key string; `cursor` is the token of the previous page. */
json_t *lmc_l2_adapter_list_keys(lmc_l2_adapter *a, const char *model, size_t page_size,
                                 const char *cursor);
/* {type_name, is_healthy, counters, usage, backend fields}.  New reference.
 * is_healthy is true here: the L2 service replaces it with its probes'
 * verdict (l2_health.h). */
json_t *lmc_l2_adapter_status(lmc_l2_adapter *a);
/* The backend's probe (lmc_l2_backend_ops.probe): 0 when healthy or it
 * has none, or -1 with one line in why. */
int lmc_l2_adapter_probe(lmc_l2_adapter *a, char *why, size_t cap);
/* The figures of lmc_l2_adapter_status the metrics export (typed). */
void lmc_l2_adapter_counts(lmc_l2_adapter *a, lmc_storage_l2_counts *out);

/* Observer of what the adapter's tasks did, for the L2 eviction tracker.
 * Called on adapter worker threads (stored, loaded) or the deleting
 * thread, with no adapter lock held.  Set before the first task. */
typedef struct lmc_l2_observer {
    void *user;
    void (*on_stored)(void *user, const lmc_object_key *keys, const uint64_t *sizes, size_t n);
    void (*on_loaded)(void *user, const lmc_object_key *keys, const uint8_t *ok, size_t n);
    void (*on_deleted)(void *user, const lmc_object_key *keys, size_t n);
} lmc_l2_observer;
void lmc_l2_adapter_set_observer(lmc_l2_adapter *a, const lmc_l2_observer *obs);
/* A second observer with the same contract, for the placement reports of
 * the L2 service (storage_manager.h, "L2 placements"). */
void lmc_l2_adapter_set_reporter(lmc_l2_adapter *a, const lmc_l2_observer *obs);

/* The adapter's backend (tests, status). */
lmc_l2_backend *lmc_l2_adapter_backend(lmc_l2_adapter *a);

#endif
