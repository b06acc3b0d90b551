#include "modules/kv_copy.h"

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

/* One block j of the chunk, for one (kv, layer): either direction. */
static void copy_block(const lmc_kv_chunk_copy *c, uint32_t kv, uint32_t l, uint32_t j,
                       bool gather)
{
    const lmc_kv_geometry *g = &c->g->geo;
    uint64_t es = g->element_size, b = (uint64_t)c->blocks[j];
    uint32_t layer = lmc_kv_format_cross_layer(g->format) ? l : 0;
    uint8_t *paged = tensor_of(c, kv, l);
    uint32_t s0 = j * g->bs;
    if (token_major(g->format)) {
        uint8_t *p = paged + lmc_kv_paged_offset(g, kv, layer, b, 0, 0, 0) * es;
        uint8_t *o = c->entry + lmc_kv_object_offset(g, c->g->slots, kv, l, s0, 0, 0) * es;
        size_t n = (size_t)g->bs * g->nh * g->hs * es;
        gather ? lmc_bulk_copy(c->method, o, p, n) : lmc_bulk_copy(c->method, p, o, n);
        return;
    }
    /* HND: the block is [nh][bs][hs], the object's rows [bs][nh][hs]. */
    uint8_t *p = paged + lmc_kv_paged_offset(g, kv, layer, b, 0, 0, 0) * es;
    uint8_t *o = c->entry + lmc_kv_object_offset(g, c->g->slots, kv, l, s0, 0, 0) * es;
    size_t row = (size_t)g->hs * es;
    if (gather)
        lmc_bulk_copy_transpose(c->method, o, p, row, g->nh, g->bs, false);
    else
        lmc_bulk_copy_transpose(c->method, p, o, row, g->bs, g->nh, true);
}

static void copy_chunk(const lmc_kv_chunk_copy *c, bool gather)
{
    const lmc_kv_geometry *g = &c->g->geo;
    for (uint32_t kv = 0; kv < g->kv_size; kv++)
        for (uint32_t l = 0; l < g->nl; l++)
            for (uint32_t j = c->skip_blocks; j < c->g->keep_blocks; j++)
                copy_block(c, kv, l, j, gather);
    lmc_bulk_copy_fence(c->method);
}

void lmc_kv_gather_chunk(const lmc_kv_chunk_copy *c)
{
    copy_chunk(c, true);
}

void lmc_kv_scatter_chunk(const lmc_kv_chunk_copy *c)
{
    copy_chunk(c, false);
}

uint64_t lmc_kv_tensor_span(const lmc_kv_kernel_group *kg)
{
    const lmc_kv_geometry *g = &kg->geo;
    bool cross = lmc_kv_format_cross_layer(g->format);
    uint32_t layer = cross ? g->nl - 1 : 0;
    uint32_t kv = lmc_kv_format_kv_lists(g->format) ? 0 : g->kv_size - 1;
    uint64_t last = lmc_kv_paged_offset(g, kv, layer, g->nb - 1, g->bs - 1, g->nh - 1,
                                        g->hs - 1);
    /* Every format's last element is the one at the highest indices. */
    return (last + 1) * g->element_size;
}
