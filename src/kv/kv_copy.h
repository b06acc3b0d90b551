/* The CPU copy of the server-driven path (docs/protocol.md, "Server-driven
 * copies"): one chunk of one kernel group, between the engine's paged
 * tensors and that group's entry of an L1 chunk object.  The addresses come
 * from kv_format.h's offset functions, the very formulas a CUDA kernel
 * uses; runs are as long as the format allows (a whole block for the
 * token-major formats, one head's row for HND). */
#ifndef LMC_KV_KV_COPY_H
#define LMC_KV_KV_COPY_H

#include <stdint.h>

#include "kv/bulk_copy.h"
#include "kv/kv_plan.h"

typedef struct lmc_kv_chunk_copy {
    const lmc_kv_kernel_group *g;
    uint8_t *const *bases;     /* g->n_tensors tensors' element 0 */
    const int64_t *blocks;     /* the g->keep_blocks block ids this chunk stores,
                                * each already checked < g->geo.nb */
    uint8_t *entry;            /* g->entry_bytes of the object */
    uint32_t skip_blocks;      /* leading blocks left untouched */
    lmc_copy_method method;
} lmc_kv_chunk_copy;

/* Paged blocks -> object entry (STORE). */
void lmc_kv_gather_chunk(const lmc_kv_chunk_copy *c);
/* Object entry -> paged blocks (RETRIEVE). */
void lmc_kv_scatter_chunk(const lmc_kv_chunk_copy *c);
/* Layers [from, to) of it only (a layerwise RETRIEVE's batch). */
void lmc_kv_scatter_layers(const lmc_kv_chunk_copy *c, uint32_t from, uint32_t to);

#endif
