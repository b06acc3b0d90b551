#include "kv/kv_plan.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/checked.h"
#include "core/errbuf.h"

int lmc_kv_layout_parse(const char *s, size_t len, bool *hnd, char *err, size_t errlen)
{
    static const char *const nhd[] = {"NHD", "LBNHC"}, *const hnd_names[] = {"HND", "LBHNC"};
    for (int i = 0; i < 2; i++) {
        if (len == strlen(nhd[i]) && memcmp(s, nhd[i], len) == 0)
            return *hnd = false, 0;
        if (len == strlen(hnd_names[i]) && memcmp(s, hnd_names[i], len) == 0)
            return *hnd = true, 0;
    }
    static const char *const later[] = {"LHBNC", "BLHNC", "BLNHC", "BHLNC"};
    for (int i = 0; i < 4; i++)
        if (len == strlen(later[i]) && memcmp(s, later[i], len) == 0)
            return lmc_err(err, errlen, "kv_layout %s is not supported yet", later[i]);
    return lmc_err(err, errlen, "kv_layout '%.*s' is not a layout (NHD, HND, LBNHC, LBHNC)",
                   (int)(len > 32 ? 32 : len), s);
}

/* Tensors of one kernel group must agree in all of this. */
static bool same_kind(const lmc_shared_tensor *a, const lmc_shared_tensor *b)
{
    return a->ndim == b->ndim && a->itemsize == b->itemsize && a->wrapper == b->wrapper &&
           strcmp(a->dtype, b->dtype) == 0 &&
           memcmp(a->shape, b->shape, a->ndim * sizeof a->shape[0]) == 0 &&
           memcmp(a->stride, b->stride, a->ndim * sizeof a->stride[0]) == 0;
}

/* Layers grouped before geometry: registered indices plus their info. */
typedef struct {
    uint32_t *layers;
    uint32_t n;
    const lmc_engine_group_info *info;   /* NULL without infos */
} draft;

/* SGLang's unified layout: every tensor its own block view, grouped by
 * EngineGroupInfo like vLLM's per-layer lists (docs/protocol.md). */
static bool unified(const lmc_kv_plan_options *o)
{
    return o->engine == LMC_ENGINE_SGLANG && o->hints.kv_list_layout == LMC_KV_LIST_UNIFIED;
}

static int detect(const lmc_shared_tensor *tensors, const draft *d,
                  const lmc_kv_plan_options *o, lmc_kv_geometry *g, char *err, size_t errlen)
{
    lmc_shared_tensor *subset = malloc(d->n * sizeof *subset);
    if (!subset)
        return -2;
    for (uint32_t i = 0; i < d->n; i++)
        subset[i] = tensors[d->layers[i]];
    bool recurrent = d->info && d->info->recurrent_state;
    int rc = unified(o) ? lmc_kv_detect_unified(subset, d->n, recurrent, g, err, errlen)
             : o->engine == LMC_ENGINE_SGLANG
                 ? lmc_kv_detect_sglang(subset, d->n, &o->hints, g, err, errlen)
             : o->engine == LMC_ENGINE_TRTLLM
                 ? lmc_kv_detect_trtllm(subset, d->n, &o->hints, g, err, errlen)
                 : lmc_kv_detect_vllm(subset, d->n, o->hnd || o->force_hnd, false, g, err,
                                      errlen);
    free(subset);
    return rc;
}

uint32_t lmc_kv_blocks_for_tokens(const lmc_kv_kernel_group *g, uint64_t tokens)
{
    return (uint32_t)(tokens * g->geo.bs / g->tokens_per_block / g->geo.bs);
}

uint32_t lmc_kv_skip_blocks(const lmc_kv_kernel_group *g, uint64_t skip_tokens)
{
    uint32_t skip = lmc_kv_blocks_for_tokens(g, skip_tokens);
    uint32_t dropped = g->blocks_per_chunk - g->keep_blocks;  /* before the window */
    return skip > dropped ? skip - dropped : 0;
}

/* Block and window arithmetic of one group, checked as upstream checks it. */
static int shape_group(lmc_kv_kernel_group *g, uint32_t cs, bool full_sw_kv, char *err,
                       size_t errlen)
{
    uint32_t bs = g->geo.bs;
    int64_t tpb = g->tokens_per_block;
    if (tpb <= 0)
        tpb = bs;
    if (tpb % bs != 0 || tpb > cs || cs % tpb != 0)
        return lmc_err(err, errlen, "kernel group of layer %u: tokens_per_block %lld must be a "
                                    "multiple of the block's %u slots and divide the chunk size "
                                    "%u", g->tensors[0], (long long)tpb, bs, cs);
    g->tokens_per_block = (uint32_t)tpb;
    g->blocks_per_chunk = cs / (uint32_t)tpb;
    int64_t sw = g->sw_size_tokens;
    uint64_t window = cs;
    if (sw > 0 && sw < cs && !full_sw_kv) {
        if (sw % tpb != 0)
            return lmc_err(err, errlen, "kernel group of layer %u: a sliding window of %lld "
                                        "tokens must be a multiple of tokens_per_block %lld",
                           g->tensors[0], (long long)sw, (long long)tpb);
        window = (uint64_t)sw;
    }
    g->keep_blocks = lmc_kv_blocks_for_tokens(g, window);
    g->slots = g->keep_blocks * bs;   /* <= the chunk size: tpb >= bs, window <= cs */
    uint64_t entry[] = {g->geo.kv_size, g->geo.nl, g->slots, g->geo.nh, g->geo.hs,
                        g->geo.element_size};
    if (!lmc_product_u64(entry, 6, &g->entry_bytes) || g->entry_bytes > INT64_MAX ||
        !lmc_kv_span_bytes(&g->geo, &g->span_bytes))
        return lmc_err(err, errlen, "kernel group of layer %u: a chunk of it is too large to "
                                    "address", g->tensors[0]);
    return 0;
}

static int make_group(const lmc_shared_tensor *tensors, const draft *d,
                      const lmc_kv_plan_options *o, lmc_kv_kernel_group *g, char *err,
                      size_t errlen)
{
    int rc = detect(tensors, d, o, &g->geo, err, errlen);
    if (rc != 0)
        return rc;
    g->n_tensors = lmc_kv_format_cross_layer(g->geo.format) ? 1 : d->n;
    g->tensors = malloc(g->n_tensors * sizeof *g->tensors);
    if (!g->tensors)
        return -2;
    memcpy(g->tensors, d->layers, g->n_tensors * sizeof *g->tensors);
    const lmc_engine_group_info *i = d->info;
    g->engine_group_id = i ? i->engine_group_id : 0;
    if (i && i->tokens_per_block > UINT32_MAX)
        return lmc_err(err, errlen, "tokens_per_block %lld is out of range",
                       (long long)i->tokens_per_block);
    /* The client expands engine block b into physical ids b*p .. b*p+p-1
     * (docs/protocol.md, "Engine groups"); p must split the engine block's
     * tokens evenly, and a group that reports none has nothing to split.
     * Below 1 is 1 here (unset); the wire decoder refuses it when sent. */
    int64_t p = i ? i->physical_per_engine : 1;
    if (p > 1 && (i->tokens_per_block == 0 || i->tokens_per_block % p != 0))
        return lmc_err(err, errlen, "physical_blocks_per_engine_block %lld must be 1, or divide "
                                    "a tokens_per_block above 0 (got %lld)", (long long)p,
                       (long long)i->tokens_per_block);
    g->physical_per_engine = i && i->physical_per_engine > 1 ? (uint32_t)i->physical_per_engine
                                                               : 1;
    g->tokens_per_block = i && i->tokens_per_block > 0
                              ? (uint32_t)(i->tokens_per_block / g->physical_per_engine)
                              : 0;
    g->sw_size_tokens = i && i->sw_size_tokens > 0 ? i->sw_size_tokens : -1;
    g->has_null_block = i ? i->has_null_block : true;
    g->null_block_id = i ? i->null_block_id : 0;
    g->recurrent_state = i && i->recurrent_state;
    /* A state snapshot has no window: only the last chunk's is restored. */
    if (g->recurrent_state && g->sw_size_tokens > 0)
        return lmc_err(err, errlen, "kernel group of layer %u: recurrent_state and "
                                    "sw_size_tokens %lld exclude each other (state has no "
                                    "sliding window; send -1)", g->tensors[0],
                       (long long)g->sw_size_tokens);
    return shape_group(g, o->chunk_size, o->full_sw_kv, err, errlen);
}

/* Without infos: every layer, split by tensor kind, in order of first layer. */
static int drafts_by_kind(const lmc_shared_tensor *t, size_t n, draft *d, uint32_t *n_d,
                          uint32_t *pool, char *err, size_t errlen)
{
    uint32_t used = 0;
    *n_d = 0;
    for (uint32_t first = 0; first < n; first++) {
        bool seen = false;
        for (uint32_t k = 0; k < *n_d && !seen; k++)
            seen = same_kind(&t[d[k].layers[0]], &t[first]);
        if (seen)
            continue;
        if (*n_d == LMC_KV_MAX_KERNEL_GROUPS)
            return lmc_err(err, errlen, "more than %d kinds of KV tensor",
                           LMC_KV_MAX_KERNEL_GROUPS);
        draft *g = &d[(*n_d)++];
        *g = (draft){.layers = pool + used};
        for (uint32_t i = first; i < n; i++)
            if (same_kind(&t[first], &t[i]))
                g->layers[g->n++] = i;
        used += g->n;
    }
    return 0;
}

/* With infos: one kernel group per info, which must list layers of one
 * kind, ascending by first layer (both sides build groups this way). */
static int drafts_by_info(const lmc_shared_tensor *t, size_t n, const lmc_kv_plan_options *o,
                          draft *d, uint32_t *n_d, char *err, size_t errlen)
{
    if (o->n_infos > LMC_KV_MAX_KERNEL_GROUPS)
        return lmc_err(err, errlen, "more than %d engine group infos", LMC_KV_MAX_KERNEL_GROUPS);
    bool *listed = calloc(n, 1);
    if (!listed)
        return -2;
    int rc = 0;
    for (size_t k = 0; k < o->n_infos && rc == 0; k++) {
        const lmc_engine_group_info *i = &o->infos[k];
        d[k] = (draft){.layers = (uint32_t *)i->layers, .n = i->n_layers, .info = i};
        if (i->n_layers == 0)
            rc = lmc_err(err, errlen, "engine group info %zu lists no layers", k);
        for (uint32_t j = 0; j < i->n_layers && rc == 0; j++) {
            uint32_t l = i->layers[j];
            if (l >= n || listed[l] || (j && l <= i->layers[j - 1]))
                rc = lmc_err(err, errlen, "engine group info %zu: layer index %u is out of range, "
                                          "repeated or out of order", k, l);
            else if (!same_kind(&t[i->layers[0]], &t[l]))
                rc = lmc_err(err, errlen, "engine group info %zu: layer %u's tensor differs from "
                                          "layer %u's, so they cannot share a kernel group",
                             k, l, i->layers[0]);
            else
                listed[l] = true;
        }
        if (rc == 0 && k && i->layers[0] < o->infos[k - 1].layers[0])
            rc = lmc_err(err, errlen, "engine group infos must be in the order of their first "
                                      "layer (info %zu starts before info %zu)", k, k - 1);
    }
    free(listed);
    *n_d = (uint32_t)o->n_infos;
    return rc;
}

#define RECURRENT_BUCKET (-2)   /* -1 is full attention, > 0 a window in chunks */

/* Buckets kernel groups into object groups and lays their entries out. */
static int object_groups(lmc_kv_plan *p, const lmc_kv_plan_options *o, char *err, size_t errlen)
{
    int64_t bucket_of[LMC_KV_MAX_KERNEL_GROUPS];
    p->n_og = 0;
    for (uint32_t k = 0; k < p->n_kg; k++) {
        const lmc_kv_kernel_group *g = &p->kg[k];
        int64_t sw = g->sw_size_tokens;
        /* sw comes from the wire: a ceiling that cannot overflow. */
        bucket_of[k] = !o->separate_object_groups || sw <= 0
                           ? -1
                           : sw / o->chunk_size + (sw % o->chunk_size != 0);
        /* State is checkpointed at some chunks only (the others send null
         * blocks), so it cannot share objects with attention, which every
         * chunk has; its window is one chunk, the last (docs/protocol.md). */
        if (g->recurrent_state && !o->separate_object_groups)
            return lmc_err(err, errlen, "kernel group of layer %u has recurrent_state, which "
                                        "needs --separate-object-groups", g->tensors[0]);
        if (g->recurrent_state)
            bucket_of[k] = RECURRENT_BUCKET;
        uint32_t og = 0;
        while (og < p->n_og && bucket_of[p->og[og].members[0]] != bucket_of[k])
            og++;
        if (og == p->n_og) {
            if (p->n_og == LMC_KV_MAX_OBJECT_GROUPS)
                return lmc_err(err, errlen, "more than %d object groups",
                               LMC_KV_MAX_OBJECT_GROUPS);
            int64_t w = bucket_of[k] == RECURRENT_BUCKET ? 1 : bucket_of[k];
            p->og[p->n_og++] = (lmc_kv_object_group){
                .chunks_in_sw = (int32_t)(w > INT32_MAX ? INT32_MAX : w)};
        }
        lmc_kv_object_group *dst = &p->og[og];
        p->kg[k].object_group = og;
        p->kg[k].entry_offset = dst->object_size;
        if (!lmc_add_u64(dst->object_size, p->kg[k].entry_bytes, &dst->object_size) ||
            dst->object_size > INT64_MAX)
            return lmc_err(err, errlen, "object group %u is too large to address", og);
        dst->members[dst->n_members++] = k;
    }
    return 0;
}

static int by_first_layer(const void *a, const void *b)
{
    const draft *x = a, *y = b;
    return (x->layers[0] > y->layers[0]) - (x->layers[0] < y->layers[0]);
}

int lmc_kv_plan_build(const lmc_shared_tensor *t, size_t n, const lmc_kv_plan_options *o,
                      lmc_kv_plan *out, char *err, size_t errlen)
{
    *out = (lmc_kv_plan){0};
    if (n == 0 || n > LMC_KV_MAX_LAYERS)
        return lmc_err(err, errlen, "%zu tensors registered (1..%d)", n, LMC_KV_MAX_LAYERS);
    draft d[LMC_KV_MAX_KERNEL_GROUPS];
    uint32_t n_d = 0, *pool = malloc(n * sizeof *pool);
    if (!pool)
        return -2;
    /* A cross-layer tensor is every layer at once, and SGLang's K/V or
     * MLA lists and TRT-LLM's pool are one structure: their one info (if
     * any) describes them, whatever layer indices it lists.  SGLang's
     * unified views are per layer, as vLLM's. */
    bool per_layer = o->engine == LMC_ENGINE_VLLM || unified(o);
    bool whole = (n == 1 && t[0].ndim == 6) || !per_layer;
    if (whole && o->n_infos > 1) {
        free(pool);
        return lmc_err(err, errlen, "this registration takes at most one engine group info");
    }
    int rc = 0;
    if (!per_layer) {
        for (uint32_t i = 0; i < n; i++)
            pool[i] = i;
        d[0] = (draft){.layers = pool, .n = (uint32_t)n};
        n_d = 1;
    } else {
        rc = o->n_infos && !whole ? drafts_by_info(t, n, o, d, &n_d, err, errlen)
                                  : drafts_by_kind(t, n, d, &n_d, pool, err, errlen);
    }
    if (rc == 0 && whole && o->n_infos)
        d[0].info = &o->infos[0];
    if (rc == 0) {
        qsort(d, n_d, sizeof d[0], by_first_layer);
        out->kg = calloc(n_d, sizeof *out->kg);
        rc = out->kg ? 0 : -2;
    }
    for (uint32_t k = 0; k < n_d && rc == 0; k++) {
        rc = make_group(t, &d[k], o, &out->kg[k], err, errlen);
        out->n_kg = k + 1;
    }
    free(pool);
    if (rc == 0 && lmc_kv_format_cross_layer(out->kg[0].geo.format) && n_d > 1)
        rc = lmc_err(err, errlen, "a cross-layer tensor cannot share a registration");
    if (rc == 0)
        rc = object_groups(out, o, err, errlen);
    if (rc != 0) {
        lmc_kv_plan_free(out);
        return rc;
    }
    snprintf(out->dtype, sizeof out->dtype, "%s", t[out->kg[0].tensors[0]].dtype);
    out->element_size = out->kg[0].geo.element_size;
    return 0;
}

void lmc_kv_plan_free(lmc_kv_plan *p)
{
    for (uint32_t k = 0; k < p->n_kg; k++)
        free(p->kg[k].tensors);
    free(p->kg);
    *p = (lmc_kv_plan){0};
}
