/* What a remote L2 store (resp, s3) holds, as the backend knows it: the size
 * of every object, for usage and max_capacity_gb (docs/l2.md, "Usage and
 * capacity of resp and s3"), and the objects found at start-up for the L2
 * eviction.
 *
 * Neither Redis nor S3 tells a writer whether a SET/PUT replaced an object
 * or how big a deleted one was, so the backend keeps one entry per object:
 * a 64-bit id of the canonical key string and the size, 16 bytes a slot in
 * an open-addressing table at most 3/4 full.  Two keys with the same id
 * (odds about n^2 / 2^65 for n objects) would count as one object.
 * Thread-safe: one mutex, held for table operations only. */
#ifndef LMC_STORAGE_L2_SIZE_INDEX_H
#define LMC_STORAGE_L2_SIZE_INDEX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "storage/l2/l2_adapter.h"

typedef struct lmc_l2_size_index lmc_l2_size_index;

/* capacity_bytes 0: unlimited.  NULL when out of memory. */
lmc_l2_size_index *lmc_l2_size_index_new(uint64_t capacity_bytes);
void lmc_l2_size_index_free(lmc_l2_size_index *ix);

/* The id of an object's name (never 0). */
uint64_t lmc_l2_key_id(const char *name, size_t len);

/* The reservation of one store batch whose parts are written apart
 * (docs/l2.md, "Parts"): the growth of the whole batch is checked and
 * reserved at once, each part then settles its own objects, and whatever
 * no part settled is released at the end, so a refused batch writes
 * nothing and usage stays exact whichever parts fail. */
typedef struct lmc_l2_reservation lmc_l2_reservation;
/* NULL, with nothing reserved, when the batch passes the capacity or
 * memory ran out.  ids and sizes are copied. */
lmc_l2_reservation *lmc_l2_size_index_reserve_batch(lmc_l2_size_index *ix, const uint64_t *ids,
                                                    const uint64_t *sizes, size_t n);
/* The same, from the objects' keys (their names' ids): *refused says the
 * capacity refused it (false: out of memory, or a key without a name). */
lmc_l2_reservation *lmc_l2_size_index_reserve_keys(lmc_l2_size_index *ix,
                                                   const lmc_object_key *keys,
                                                   const uint64_t *sizes, size_t n,
                                                   bool *refused);
/* Bytes of the whole batch. */
uint64_t lmc_l2_reservation_bytes(const lmc_l2_reservation *r);
/* Objects [from, from + n) of the batch were tried: written[i] says which
 * of them are in the store now.  Releases their share of the reservation;
 * ok says whether the whole part succeeded (for release's answer). */
void lmc_l2_size_index_settle(lmc_l2_size_index *ix, lmc_l2_reservation *r, size_t from,
                              size_t n, const uint8_t *written, bool ok);
/* Releases what no part settled and frees r.  True when every object was
 * settled by a part that succeeded. */
bool lmc_l2_size_index_release(lmc_l2_size_index *ix, lmc_l2_reservation *r);

/* An object seen in the store (the listing at start-up).  0, or -1 when
 * out of memory. */
int lmc_l2_size_index_put(lmc_l2_size_index *ix, uint64_t id, uint64_t size);
/* The object is no longer in the store; true when it was indexed. */
bool lmc_l2_size_index_forget(lmc_l2_size_index *ix, uint64_t id);
/* used_bytes, num_keys and capacity_bytes. */
void lmc_l2_size_index_usage(lmc_l2_size_index *ix, lmc_l2_usage *u);

/* ---- objects found at start-up, for the L2 eviction ---------------------- */

typedef struct {
    lmc_object_key key;      /* strings interned by the backend */
    uint64_t size;
    int64_t batch, order;    /* equal batch = one stored batch; sorted by both */
} lmc_l2_found;

typedef struct {
    lmc_l2_found *v;
    size_t n, cap;
} lmc_l2_found_list;

/* 0, or -1 when out of memory. */
int lmc_l2_found_add(lmc_l2_found_list *l, const lmc_object_key *k, uint64_t size,
                     int64_t batch, int64_t order);
/* Sorts by (batch, order), hands each batch to fn oldest first (see
 * lmc_l2_recovered_fn), then empties the list. */
void lmc_l2_found_hand_over(lmc_l2_found_list *l, lmc_l2_recovered_fn fn, void *user);
void lmc_l2_found_clear(lmc_l2_found_list *l);

#endif
