/* The L1 manager's own state, shared by the files that implement it (all
 * private to src/storage/):
 *   l1_manager.c  the state machine: entries, leases, delete, clear
 *   l1_buffers.c  giving buffers back to the allocator; retired buffers
 *   l1_events.c   listener events, queued under the mutex, delivered after
 *   l1_sampling.c lifecycle sampling (reuse gaps)
 *   l1_books.c    counters, status and the invariant check of the books
 * Every function here runs with m->mutex held unless it says otherwise. */
#ifndef LMC_STORAGE_L1_L1_INTERNAL_H
#define LMC_STORAGE_L1_L1_INTERNAL_H

#include <pthread.h>
#include <sys/types.h>

#include "storage/key_table.h"
#include "storage/l1/l1_manager.h"

/* Sized for millions of small objects (docs/storage.md, "Metadata per
 * object"): the aligned size is derived from raw_size (l1_rec_size), and
 * an entry is the key, one record and a list head, 136 bytes. */
typedef struct l1_record {
    uint64_t offset;
    uint64_t raw_size;       /* object_size the writer asked for (L2 copies exactly it) */
    lmc_l1_copy_id copy;     /* which buffer of the key this is (leases name it) */
    int64_t admitted_ms;     /* resident: when it became readable */
    int64_t touched_ms;      /* resident: last read lock or touch */
    lmc_ttl_lock lock;       /* write lock (staging) or read lock (resident) */
    uint32_t pins;           /* resident: COPY leases not given back */
    bool resident;           /* an entry's record: it holds the resident copy */
    bool is_temporary;
    bool sampled;            /* resident: the lifecycle sampler picked this key */
} l1_record;

/* One writer's staging buffer of a key; a key rarely has more than one. */
typedef struct l1_staging {
    struct l1_staging *next;
    char *tag;               /* owned copy of the writer tag */
    l1_record rec;
} l1_staging;

typedef struct l1_entry {
    lmc_object_key key;
    l1_record object;        /* the resident copy, when object.resident */
    l1_staging *staging;     /* list; NULL when nobody stages the key */
} l1_entry;

/* A buffer that a forced delete or clear unlinked while leases on it were
 * out: a WRITE lease (an engine copying into its slot, an L2 load) or COPY
 * leases (an engine's retrieve, the write-behind).  The key is gone from
 * the cache at once, but the memory stays allocated until those leases go
 * back or their lock lapses, so that a late copy never lands in, or reads
 * from, an object allocated there since.  READ leases (a LOOKUP's) do not
 * hold a buffer back. */
typedef struct l1_retired {
    lmc_object_key key;
    char *tag;               /* the writer's; NULL for COPY leases of a resident copy */
    l1_record rec;           /* COPY: lock.count = leases still out */
} l1_retired;

typedef struct l1_event {
    struct l1_event *next;
    lmc_l1_event_kind kind;
    size_t n;
    lmc_object_key keys[];
} l1_event;

typedef struct l1_listener {
    lmc_l1_listener_fn fn;
    void *user;
} l1_listener;

struct lmc_l1_manager {
    pthread_mutex_t mutex;           /* guards everything below */
    lmc_l1_alloc *alloc;
    lmc_key_table entries;
    uint64_t configured_bytes;
    /* Bytes a pre-fault in progress will have committed (docs/storage.md,
     * "Pre-fault"): usage counts them as capacity and writes wait for them
     * (`grown` is signalled at each step).  0: no pre-fault. */
    uint64_t commit_target;
    pthread_cond_t grown;
    int64_t write_ttl_ms;
    int64_t read_ttl_ms;
    lmc_clock_ms_fn clock;
    void *clock_user;
    char backend[32];
    bool check_books;                /* after every mutating call (debug) */
    size_t num_objects, num_staging, num_temporary;
    uint64_t total_pins;             /* COPY leases out on resident copies */
    uint64_t object_bytes, staging_bytes;
    lmc_l1_copy_id last_copy;        /* buffer ids count up from 1 */
    lmc_lease_counts leases;
    uint64_t violations;             /* broken invariants seen */
    uint64_t books_checks;           /* passes of lmc_l1_books_balance, cheap or full */
    bool violation_logged;
    l1_retired *retired;             /* see l1_retired; usually empty */
    size_t num_retired, cap_retired;
    uint64_t retired_bytes;
    int64_t retired_due_ms;          /* no retired lock expires before this */
    l1_listener listeners[LMC_L1_MAX_LISTENERS];
    size_t num_listeners;
    l1_event *queue_head, *queue_tail;
    /* Events that could not be allocated: delivered, without keys, as a
     * "lost" count (l1_events.c) rather than silently dropped. */
    uint64_t events_lost;
    /* Bulk operations (delete, clear) collect freed ranges here and return
     * them with one lmc_l1_alloc_release_batch() at the end. */
    bool deferring_frees;
    lmc_l1_range *deferred;
    size_t num_deferred, cap_deferred;
    pthread_mutex_t dispatch_mutex;  /* held while delivering events */
    /* Lifecycle sampling (lmc_l1_manager_set_sampler): gaps between touches
     * of sampled objects wait here until the next take_reuse_gaps. */
    lmc_l1_sampler_fn sampler;
    void *sampler_user;
    double reuse_gaps_s[LMC_L1_REUSE_GAPS_MAX];
    size_t num_reuse_gaps;
};

static inline int64_t l1_now(const lmc_l1_manager *m)
{
    return m->clock(m->clock_user);
}

/* The aligned length of a record's buffer. */
static inline uint64_t l1_rec_size(const lmc_l1_manager *m, const l1_record *r)
{
    return lmc_l1_alloc_aligned_size(m->alloc, r->raw_size);
}

/* l1_events.c.  event_begin returns NULL when nobody listens or memory ran
 * out (then event_add counts the keys as lost); event_commit queues. */
l1_event *lmc_l1_event_begin(lmc_l1_manager *m, lmc_l1_event_kind kind, size_t capacity);
void lmc_l1_event_add(lmc_l1_manager *m, l1_event *ev, const lmc_object_key *key);
void lmc_l1_event_commit(lmc_l1_manager *m, l1_event *ev);
/* Ends a mutating call: checks the books when asked to, unlocks, then
 * delivers the queued events with no lock held. */
void lmc_l1_unlock_and_dispatch(lmc_l1_manager *m);

/* l1_buffers.c */
void lmc_l1_free_buffer(lmc_l1_manager *m, const l1_record *rec);
void lmc_l1_begin_deferred_frees(lmc_l1_manager *m, size_t expected);
void lmc_l1_end_deferred_frees(lmc_l1_manager *m);
/* Room for `more` retired buffers; 0, or -1 (nothing changed). */
int lmc_l1_reserve_retired(lmc_l1_manager *m, size_t more);
/* Retires `rec`; takes over `tag` (a writer's, or NULL for COPY leases). */
void lmc_l1_retire(lmc_l1_manager *m, const lmc_object_key *key, char *tag, const l1_record *rec);
/* Frees retired buffer i; its leases still out lapse. */
void lmc_l1_free_retired(lmc_l1_manager *m, size_t i, uint32_t lapsed);
ssize_t lmc_l1_find_retired_write(const lmc_l1_manager *m, const lmc_object_key *key,
                              const char *tag);
/* The retired buffer of `key` with id `copy`; writes: tag != NULL. */
ssize_t lmc_l1_find_retired(const lmc_l1_manager *m, const lmc_object_key *key,
                        lmc_l1_copy_id copy, bool write);
void lmc_l1_sweep_retired(lmc_l1_manager *m, int64_t now);

/* l1_sampling.c */
void lmc_l1_note_touch(lmc_l1_manager *m, l1_entry *e, int64_t now);

/* l1_books.c: a broken invariant, logged the first time, always counted.
 * lmc_l1_books_balance(m, full): the O(1) rules (counters, ledger, allocator),
 * and with `full` also a walk of every object against them. */
void lmc_l1_violation(lmc_l1_manager *m, const lmc_object_key *key, const char *what);
bool lmc_l1_books_balance(lmc_l1_manager *m, bool full);

#endif
