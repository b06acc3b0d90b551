#include "kv/kv_copy.h"

#include <stdbool.h>

/* Formats whose block keeps its slots (and heads) in one contiguous run,
 * laid out as the object's rows are: one copy per block. */
static bool token_major(lmc_kv_format f)
{
    switch (f) {
    case LMC_KV_NB_NL_TWO_BS_NH_HS:
    case LMC_KV_NL_X_TWO_NB_BS_NH_HS:
    case LMC_KV_NL_X_NB_TWO_BS_NH_HS:
    case LMC_KV_NL_X_NB_BS_HS:
    case LMC_KV_NL_X_NB_BS_NH_TWO_HS:
    case LMC_KV_NL_X_NB_BS_NH_HS:
    case LMC_KV_TWO_X_NL_X_NB_BS_NH_HS:
        return true;
    default:
        return false;
    }
}

/* The tensor holding (kv, layer): the one cross-layer tensor, the layer's
 * own, or its K or V tensor when those are separate lists. */
static uint8_t *tensor_of(const lmc_kv_chunk_copy *c, uint32_t kv, uint32_t layer)
{
    lmc_kv_format f = c->g->geo.format;
    if (lmc_kv_format_cross_layer(f))
        return c->bases[0];
    return c->bases[lmc_kv_format_kv_lists(f) ? kv * c->g->geo.nl + layer : layer];
}

/* The start of block j of (kv, l) in the engine's tensor. */
static uint8_t *paged_block(const lmc_kv_chunk_copy *c, uint32_t kv, uint32_t l, uint32_t j)
{
    const lmc_kv_geometry *g = &c->g->geo;
    uint32_t layer = lmc_kv_format_cross_layer(g->format) ? l : 0;
    return tensor_of(c, kv, l) +
           lmc_kv_paged_offset(g, kv, layer, (uint64_t)c->blocks[j], 0, 0, 0) * g->element_size;
}

/* Where the gather reads after the blocks of (kv, l) before block j: block
 * j, else the first block of the next (kv, l); NULL at the chunk's end. */
static const uint8_t *next_source(const lmc_kv_chunk_copy *c, uint32_t kv, uint32_t l,
                                  uint32_t j)
{
    const lmc_kv_geometry *g = &c->g->geo;
    if (j < c->g->keep_blocks)
        return paged_block(c, kv, l, j);
    if (c->skip_blocks >= c->g->keep_blocks)
        return NULL;
    if (++l == g->nl) {
        l = 0;
        if (++kv == g->kv_size)
            return NULL;
    }
    return paged_block(c, kv, l, c->skip_blocks);
}

/* Token-major blocks j.. of (kv, l), as one run while the engine's next
 * block starts where this one ends (vLLM hands a fresh request consecutive
 * blocks, and the object's slots are consecutive anyway).  Returns the
 * number of blocks copied. */
static uint32_t copy_run(const lmc_kv_chunk_copy *c, uint32_t kv, uint32_t l, uint32_t j,
                         bool gather)
{
    const lmc_kv_geometry *g = &c->g->geo;
    uint64_t es = g->element_size, block = (uint64_t)g->bs * g->nh * g->hs;
    uint32_t layer = lmc_kv_format_cross_layer(g->format) ? l : 0;
    uint64_t first = lmc_kv_paged_offset(g, kv, layer, (uint64_t)c->blocks[j], 0, 0, 0);
    uint32_t n = 1;
    while (j + n < c->g->keep_blocks &&
           lmc_kv_paged_offset(g, kv, layer, (uint64_t)c->blocks[j + n], 0, 0, 0) ==
               first + n * block)
        n++;
    uint8_t *p = tensor_of(c, kv, l) + first * es;
    uint8_t *o = c->entry + lmc_kv_object_offset(g, c->g->slots, kv, l, j * g->bs, 0, 0) * es;
    size_t bytes = (size_t)(n * block * es);
    if (gather)   /* the next run is at least a block long */
        lmc_bulk_copy_ahead(c->method, o, p, bytes, next_source(c, kv, l, j + n),
                            (size_t)(block * es));
    else
        lmc_bulk_copy(c->method, p, o, bytes);
    return n;
}

/* HND block j of (kv, l): the block is [nh][bs][hs], the object's rows
 * [bs][nh][hs].  Both directions read their source in order and write
 * rows by stride; a gather prefetches the next block while it moves this
 * one (bulk_copy.h). */
static void copy_transposed(const lmc_kv_chunk_copy *c, uint32_t kv, uint32_t l, uint32_t j,
                            bool gather)
{
    const lmc_kv_geometry *g = &c->g->geo;
    uint64_t es = g->element_size;
    uint8_t *p = paged_block(c, kv, l, j);
    uint8_t *o = c->entry + lmc_kv_object_offset(g, c->g->slots, kv, l, j * g->bs, 0, 0) * es;
    size_t row = (size_t)g->hs * es;
    if (gather)
        lmc_bulk_copy_transpose(c->method, o, p, row, g->nh, g->bs, true,
                                next_source(c, kv, l, j + 1));
    else
        lmc_bulk_copy_transpose(c->method, p, o, row, g->bs, g->nh, true, NULL);
}

static void copy_chunk(const lmc_kv_chunk_copy *c, bool gather, uint32_t from, uint32_t to)
{
    const lmc_kv_geometry *g = &c->g->geo;
    bool runs = token_major(g->format);
    for (uint32_t kv = 0; kv < g->kv_size; kv++)
        for (uint32_t l = from; l < to; l++)
            for (uint32_t j = c->skip_blocks; j < c->g->keep_blocks;)
                if (runs)
                    j += copy_run(c, kv, l, j, gather);
                else
                    copy_transposed(c, kv, l, j++, gather);
    lmc_bulk_copy_fence(c->method);
}

void lmc_kv_gather_chunk(const lmc_kv_chunk_copy *c)
{
    copy_chunk(c, true, 0, c->g->geo.nl);
}

void lmc_kv_scatter_chunk(const lmc_kv_chunk_copy *c)
{
    copy_chunk(c, false, 0, c->g->geo.nl);
}

void lmc_kv_scatter_layers(const lmc_kv_chunk_copy *c, uint32_t from, uint32_t to)
{
    copy_chunk(c, false, from, to < c->g->geo.nl ? to : c->g->geo.nl);
}
