/* Leases (docs/storage.md, "Leases"): the one shape in which any holder
 * (a LOOKUP, an engine's transfer, the HTTP kv routes, the warm prefetch,
 * the L2 write-behind and prefetch, and holders still to come) holds the
 * right to write or read bytes of the L1 arena.
 *
 * A lease is a plain value that names exactly what it holds: which buffer
 * (a copy id, unique over the server's life, so that a copy stored after a
 * forced clear is never mistaken for the one before it, even at the same
 * offset), where its bytes are, what kind of right it is and until when the
 * lock behind it lasts.  The storage manager hands leases out and takes
 * them back through one function, lmc_storage_manager_give_back(), which marks the
 * lease RETURNED: giving a lease back twice, after a forced clear, after its
 * lock expired or after a reaper gave it back for a dead holder is harmless
 * and counted (status "leases"; docs/metrics.md). */
#ifndef LMC_STORAGE_LEASE_H
#define LMC_STORAGE_LEASE_H

#include <stdbool.h>
#include <stdint.h>

typedef enum lmc_l1_result {
    LMC_L1_SUCCESS = 0,
    LMC_L1_KEY_NOT_EXIST,
    LMC_L1_KEY_NOT_READABLE,
    LMC_L1_KEY_NOT_WRITABLE,
    LMC_L1_KEY_IN_WRONG_STATE,
    LMC_L1_KEY_IS_LOCKED,
    LMC_L1_OUT_OF_MEMORY,
    LMC_L1_KEY_WRONG_SIZE,   /* resident, but not of the size its reader's layout expects */
} lmc_l1_result;

const char *lmc_l1_result_name(lmc_l1_result r);

/* Names one buffer of one key over the server's life; 0 names none. */
typedef uint64_t lmc_l1_copy_id;

typedef enum lmc_lease_kind {
    LMC_LEASE_NONE = 0,   /* holds nothing: never granted (a failed key) */
    LMC_LEASE_WRITE,      /* a staging buffer: its writer fills it, then publishes it
                           * (lmc_storage_manager_publish_writes) or gives it back unpublished */
    LMC_LEASE_READ,       /* `shares` read shares on a resident copy: it stays resident
                           * and unevictable, but its bytes may not be copied under it */
    LMC_LEASE_COPY,       /* a copy in flight out of [offset, offset+size): the buffer
                           * stays allocated even if a forced clear unlinks the key,
                           * plus `shares` read shares that go back with it */
    LMC_LEASE_RETURNED,   /* given back; giving it back again is a counted no-op */
} lmc_lease_kind;

typedef struct lmc_lease {
    lmc_l1_copy_id copy;      /* the buffer: staging (WRITE) or resident copy */
    uint64_t offset;          /* arena offset of its bytes */
    uint64_t size;            /* aligned length of the buffer */
    uint64_t object_size;     /* bytes its writer stored (what L2 copies) */
    int64_t expiry_ms;        /* monotonic ms when the lock behind it lapsed or will */
    uint32_t shares;          /* READ, COPY: read shares it gives back */
    uint8_t kind;             /* lmc_lease_kind */
    uint8_t retrieve;         /* COPY carrying a LOOKUP's share: a RETRIEVE's read, traced
                               * as read_prefetched_results (docs/trace.md) */
} lmc_lease;

const char *lmc_lease_kind_name(lmc_lease_kind kind);

static inline bool lmc_lease_held(const lmc_lease *l)
{
    return l->kind == LMC_LEASE_WRITE || l->kind == LMC_LEASE_READ ||
           l->kind == LMC_LEASE_COPY;
}

/* How a COPY lease comes by the read share it gives back. */
typedef enum lmc_copy_share {
    LMC_COPY_TAKES_SHARE,   /* takes a new share: copying needs no earlier lock (the
                             * L2 write-behind, an HTTP retrieve) */
    LMC_COPY_CARRIES_SHARE, /* the key must hold a live read lock already, and the
                             * lease carries one of its shares (an engine's retrieve
                             * after the LOOKUP that took one share per reader) */
} lmc_copy_share;

/* The lease ledger, by kind (index lmc_lease_kind: [WRITE], [READ],
 * [COPY]).  For WRITE and COPY leases granted - returned - lapsed is what
 * is outstanding, and the L1 books check it against the buffers themselves
 * (docs/storage.md, "Invariants"). */
typedef struct lmc_lease_counts {
    uint64_t granted[4];
    uint64_t returned[4];         /* given back while its buffer was still there */
    uint64_t lapsed[4];           /* settled by the manager: the lock lapsed and the
                                   * buffer went (reclaimed, taken over, swept) */
    uint64_t returned_twice;      /* given back when already RETURNED */
    uint64_t returned_stale;      /* its buffer was gone (forced clear or delete,
                                   * lapsed, taken over): nothing to do */
    uint64_t returned_expired;    /* found, but its lock had lapsed */
    uint64_t size_mismatches;     /* READ or COPY refused: the object is not of the
                                   * size the reader expects (a miss, never a copy) */
} lmc_lease_counts;

/* The size a reader's layout expects each key's object to have
 * (docs/storage.md, "Objects of another size"): key i's is
 * sizes[(i / stride) % count], which fits keys laid out chunk -> object
 * group -> rank (stride = ranks, count = object groups), or one size for
 * all (count = stride = 1).  A reader that copies bytes at its layout's
 * size must pass one: an object of another size is then refused, never
 * read past its end. */
typedef struct lmc_object_sizes {
    const uint64_t *sizes;
    uint32_t count, stride;
} lmc_object_sizes;

static inline uint64_t lmc_object_size_of(const lmc_object_sizes *w, size_t i)
{
    return w->sizes[(i / w->stride) % w->count];
}

#endif
