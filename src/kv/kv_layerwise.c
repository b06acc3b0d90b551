#include "kv/kv_layerwise.h"

#include <stdbool.h>
#include <stdlib.h>

uint32_t lmc_kv_layer_index(const lmc_kv_kernel_group *g, uint32_t l)
{
    /* A cross-layer tensor is one registration holding every layer: the
     * engine still counts its layers 0..nl-1.  Separate K and V lists keep
     * the K tensor's index for the layer. */
    return lmc_kv_format_cross_layer(g->geo.format) ? l : g->tensors[l];
}

uint32_t lmc_kv_plan_layers(const lmc_kv_plan *p)
{
    uint32_t n = 0;
    for (uint32_t g = 0; g < p->n_kg; g++)
        n += p->kg[g].geo.nl;
    return n;
}

uint32_t lmc_kv_layer_pool_size(const lmc_kv_plan *p)
{
    uint32_t n = 0;
    for (uint32_t g = 0; g < p->n_kg; g++)
        for (uint32_t l = 0; l < p->kg[g].geo.nl; l++)
            if (lmc_kv_layer_index(&p->kg[g], l) + 1 > n)
                n = lmc_kv_layer_index(&p->kg[g], l) + 1;
    return n;
}

static int by_index(const void *a, const void *b)
{
    const lmc_kv_layer_ref *x = a, *y = b;
    return x->index < y->index ? -1 : x->index > y->index ? 1 : (x->kg > y->kg) - (x->kg < y->kg);
}

int lmc_kv_layer_batches_build(const lmc_kv_plan *p, uint32_t og, uint32_t batch,
                               lmc_kv_layer_batches *out)
{
    *out = (lmc_kv_layer_batches){0};
    const lmc_kv_object_group *o = &p->og[og];
    size_t n = 0;
    for (uint32_t k = 0; k < o->n_members; k++)
        n += p->kg[o->members[k]].geo.nl;
    if (batch == 0)
        batch = 1;
    out->refs = malloc((n ? n : 1) * sizeof *out->refs);
    out->starts = malloc((n / batch + 2) * sizeof *out->starts);
    if (!out->refs || !out->starts) {
        lmc_kv_layer_batches_free(out);
        return -1;
    }
    for (uint32_t k = 0; k < o->n_members; k++) {
        const lmc_kv_kernel_group *g = &p->kg[o->members[k]];
        for (uint32_t l = 0; l < g->geo.nl; l++)
            out->refs[out->n_refs++] =
                (lmc_kv_layer_ref){.kg = o->members[k], .layer = l,
                                   .index = lmc_kv_layer_index(g, l)};
    }
    qsort(out->refs, out->n_refs, sizeof *out->refs, by_index);
    for (size_t at = 0; at < out->n_refs; at += batch)
        out->starts[out->n_batches++] = at;
    out->starts[out->n_batches] = out->n_refs;
    return 0;
}

void lmc_kv_layer_batches_free(lmc_kv_layer_batches *b)
{
    free(b->refs);
    free(b->starts);
    *b = (lmc_kv_layer_batches){0};
}

static uint8_t *put_i32(uint8_t *o, int32_t v)
{
    uint32_t u = (uint32_t)v;
    for (int i = 0; i < 4; i++)
        *o++ = (uint8_t)(u >> (8 * i));
    return o;
}

size_t lmc_kv_layerwise_frame(const lmc_kv_layer_ref *refs, size_t n, uint8_t *out)
{
    bool consecutive = true;
    for (size_t i = 1; i < n && consecutive; i++)
        consecutive = refs[i].index == refs[0].index + i;
    int32_t first = n ? (int32_t)refs[0].index : 0;
    uint8_t *o = put_i32(out, consecutive ? first : -1);
    o = put_i32(o, (int32_t)n);
    o = put_i32(o, first);
    for (size_t i = 0; !consecutive && i < n; i++)
        o = put_i32(o, (int32_t)refs[i].index);
    return (size_t)(o - out);
}
