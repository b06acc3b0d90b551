/* The layer batches of a layerwise RETRIEVE (docs/protocol.md,
 * "RETRIEVE_LAYERWISE"): the layers of one object group in registration
 * order, cut into batches of --layerwise-batch layers, and the payload of
 * the streamed reply that says a batch has landed.
 *
 * Pure arithmetic over a plan, unit-tested without shared memory. */
#ifndef LMC_KV_KV_LAYERWISE_H
#define LMC_KV_KV_LAYERWISE_H

#include <stddef.h>
#include <stdint.h>

#include "kv/kv_plan.h"

/* One layer: its kernel group, its place in that group, and its index in
 * the registered tensor list (what the engine counts layers by). */
typedef struct lmc_kv_layer_ref {
    uint32_t kg;
    uint32_t layer;
    uint32_t index;
} lmc_kv_layer_ref;

typedef struct lmc_kv_layer_batches {
    lmc_kv_layer_ref *refs;       /* owned, n_refs, ascending index */
    size_t n_refs;
    size_t *starts;               /* owned, n_batches + 1: batch b is
                                   * refs[starts[b], starts[b+1]) */
    size_t n_batches;
} lmc_kv_layer_batches;

/* The registered-list index of layer `l` of kernel group g. */
uint32_t lmc_kv_layer_index(const lmc_kv_kernel_group *g, uint32_t l);
/* Every layer of the plan. */
uint32_t lmc_kv_plan_layers(const lmc_kv_plan *p);
/* The event pool a layerwise RETRIEVE indexes: the highest layer index
 * plus one (registered layers no group copies keep their index). */
uint32_t lmc_kv_layer_pool_size(const lmc_kv_plan *p);
/* The batches of object group og, `batch` (>= 1) layers each, the last
 * maybe fewer.  0, or -1 out of memory. */
int lmc_kv_layer_batches_build(const lmc_kv_plan *p, uint32_t og, uint32_t batch,
                               lmc_kv_layer_batches *out);
void lmc_kv_layer_batches_free(lmc_kv_layer_batches *b);

/* Bytes of the payload of one batch's frame, for n layers. */
#define LMC_KV_LAYERWISE_FRAME_MAX(n) (12u + 4u * (size_t)(n))
/* The payload of the frame that says refs[0..n) have landed: little-endian
 * int32s (first, count, pool index) when their indices are consecutive,
 * else (-1, count, pool index) followed by the count indices.  The pool
 * index is the first layer's.  Returns the bytes written to `out`
 * (LMC_KV_LAYERWISE_FRAME_MAX(n) of room). */
size_t lmc_kv_layerwise_frame(const lmc_kv_layer_ref *refs, size_t n, uint8_t *out);

#endif
