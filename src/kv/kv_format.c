#include "kv/kv_format.h"

#include <stdio.h>
#include <string.h>

#include "core/checked.h"
#include "core/errbuf.h"

const char *lmc_kv_format_name(lmc_kv_format f)
{
    static const char *const names[] = {
        "NB_NL_TWO_BS_NH_HS", "NL_X_TWO_NB_BS_NH_HS", "NL_X_TWO_NB_NH_BS_HS",
        "NL_X_NB_TWO_BS_NH_HS", "NL_X_NB_TWO_NH_BS_HS", "NL_X_NB_BS_HS",
        "NL_X_NB_BS_NH_TWO_HS", "NL_X_NB_NH_BS_TWO_HS", "NB_NL_TWO_NH_BS_HS",
        "TWO_X_NL_X_NB_BS_NH_HS", "NL_X_NB_BS_NH_HS",
    };
    return (unsigned)f < sizeof names / sizeof names[0] ? names[f] : "unknown";
}

/* Shapes arrive in physical (stride-descending) order; the tensor must be
 * dense, except that dims 1.. of an MLA cache may sit in wider rows.  A
 * shape whose element count does not fit in 64 bits is not dense. */
static bool dense(const lmc_shared_tensor *t, bool padded_dim0)
{
    uint64_t want = 1;
    for (uint32_t d = t->ndim; d-- > 0;) {
        if (t->stride[d] < 0 || t->shape[d] < 0)
            return false;
        uint64_t stride = (uint64_t)t->stride[d];
        if ((d == 0 && padded_dim0) ? stride < want : stride != want)
            return false;
        if (!lmc_mul_u64(want, (uint64_t)t->shape[d], &want))
            return false;
    }
    return true;
}

bool lmc_kv_span_bytes(const lmc_kv_geometry *g, uint64_t *out)
{
    uint64_t row, block, elems;
    if (!lmc_mul_u64(g->nh, g->hs, &row) || !lmc_mul_u64(row, g->bs, &block) || g->nb == 0)
        return false;
    if (g->format == LMC_KV_NL_X_NB_BS_HS) {   /* rows may be padded: (nb-1) strides + a block */
        if (g->block_stride < block ||
            !lmc_muladd_u64(g->nb - 1, g->block_stride, block, &elems))
            return false;
    } else {
        uint64_t planes[] = {lmc_kv_format_kv_lists(g->format) ? 1 : g->kv_size,
                             lmc_kv_format_cross_layer(g->format) ? g->nl : 1, g->nb, block};
        if (!lmc_product_u64(planes, 4, &elems))
            return false;
    }
    return lmc_mul_u64(elems, g->element_size, out) && *out <= INT64_MAX;
}

/* The geometry's last byte must be addressable: what the detectors return
 * always has a span. */
static int spanned(const lmc_kv_geometry *g, char *err, size_t errlen)
{
    uint64_t span;
    if (!lmc_kv_span_bytes(g, &span))
        return lmc_err(err, errlen, "a %s tensor of %llu blocks x %u slots x %u heads x %u "
                                    "elements of %u bytes is too large to address",
                       lmc_kv_format_name(g->format), (unsigned long long)g->nb, g->bs, g->nh,
                       g->hs, g->element_size);
    return 0;
}

static bool same_tensor_kind(const lmc_shared_tensor *a, const lmc_shared_tensor *b)
{
    return a->ndim == b->ndim && a->itemsize == b->itemsize && a->wrapper == b->wrapper &&
           strcmp(a->dtype, b->dtype) == 0 &&
           memcmp(a->shape, b->shape, a->ndim * sizeof a->shape[0]) == 0 &&
           memcmp(a->stride, b->stride, a->ndim * sizeof a->stride[0]) == 0;
}

static bool fits_u32(int64_t v)
{
    return v > 0 && v <= UINT32_MAX;
}

static lmc_kv_geometry geometry(lmc_kv_format f, uint32_t kv_size, size_t nl, int64_t nb,
                                int64_t bs, int64_t nh, int64_t hs)
{
    return (lmc_kv_geometry){.format = f, .kv_size = kv_size, .nl = (uint32_t)nl,
                             .nb = (uint64_t)nb, .bs = (uint32_t)bs, .nh = (uint32_t)nh,
                             .hs = (uint32_t)hs};
}

/* The format of one layer's tensor (or the cross-layer one). */
static int classify(const lmc_shared_tensor *t, size_t n, bool hnd, lmc_kv_geometry *g,
                    char *err, size_t errlen)
{
    const int64_t *s = t->shape;
    if (n == 1 && t->ndim == 6 && s[2] == 2) {          /* [NB, NL, 2, BS, NH, HS] */
        *g = geometry(LMC_KV_NB_NL_TWO_BS_NH_HS, 2, (size_t)s[1], s[0], s[3], s[4], s[5]);
    } else if (t->ndim == 5 && s[0] == 2) {              /* FlashAttention */
        *g = hnd ? geometry(LMC_KV_NL_X_TWO_NB_NH_BS_HS, 2, n, s[1], s[3], s[2], s[4])
                 : geometry(LMC_KV_NL_X_TWO_NB_BS_NH_HS, 2, n, s[1], s[2], s[3], s[4]);
    } else if (t->ndim == 5 && s[1] == 2) {              /* FlashInfer */
        /* One head makes both layouts the same bytes; vLLM's view is then
         * token-first, so it reads as NHD. */
        bool h = hnd && !(s[3] == 1 && s[2] != 1);
        *g = h ? geometry(LMC_KV_NL_X_NB_TWO_NH_BS_HS, 2, n, s[0], s[3], s[2], s[4])
               : geometry(LMC_KV_NL_X_NB_TWO_BS_NH_HS, 2, n, s[0], s[2], s[3], s[4]);
    } else if (t->ndim == 3) {                           /* MLA [NB, BS, HS] */
        *g = geometry(LMC_KV_NL_X_NB_BS_HS, 1, n, s[0], s[1], 1, s[2]);
    } else if (t->ndim == 4 && s[3] % 2 == 0) {          /* fused K/V [NB, A, B, 2*HS] */
        *g = hnd ? geometry(LMC_KV_NL_X_NB_NH_BS_TWO_HS, 1, n, s[0], s[2], s[1], s[3])
                 : geometry(LMC_KV_NL_X_NB_BS_NH_TWO_HS, 1, n, s[0], s[1], s[2], s[3]);
    } else {
        return lmc_err(err, errlen, "no vLLM KV format has a %u-dimensional tensor of this shape",
                       t->ndim);
    }
    return 0;
}

int lmc_kv_detect_vllm(const lmc_shared_tensor *tensors, size_t n, bool hnd, bool cpu_server,
                       lmc_kv_geometry *out, char *err, size_t errlen)
{
    if (n == 0 || n > UINT32_MAX)
        return lmc_err(err, errlen, "no tensors registered");
    const lmc_shared_tensor *t = &tensors[0];
    for (size_t i = 1; i < n; i++)
        if (!same_tensor_kind(t, &tensors[i]))
            return lmc_err(err, errlen, "layer %zu differs from layer 0 in shape, stride, dtype "
                                        "or wrapper (engine groups are not supported yet)", i);
    for (uint32_t d = 0; d < t->ndim; d++)
        if (!fits_u32(t->shape[d]))
            return lmc_err(err, errlen, "shape[%u] = %lld is out of range", d,
                           (long long)t->shape[d]);
    if (classify(t, n, hnd || cpu_server, out, err, errlen) != 0)
        return -1;
    bool mla = out->format == LMC_KV_NL_X_NB_BS_HS;
    if (!dense(t, mla))
        return lmc_err(err, errlen, "%s tensors must be dense in their physical order%s",
                       lmc_kv_format_name(out->format), mla ? " (rows may be padded)" : "");
    out->element_size = t->itemsize;
    out->block_stride = mla ? (uint64_t)t->stride[0] : (uint64_t)out->bs * out->nh * out->hs;
    if ((uint64_t)out->hs * out->element_size % 2)
        return lmc_err(err, errlen, "a head of %u x %u bytes is not an even number of bytes",
                       out->hs, out->element_size);
    return spanned(out, err, errlen);
}

/* Shared tail of the SGLang and TRT-LLM detectors: every tensor alike,
 * dense, dimensions in range, heads of an even byte count. */
static int finish(const lmc_shared_tensor *t, size_t n, lmc_kv_geometry *g, bool padded_dim0,
                  char *err, size_t errlen)
{
    for (size_t i = 1; i < n; i++)
        if (!same_tensor_kind(&t[0], &t[i]))
            return lmc_err(err, errlen, "tensor %zu differs from tensor 0 in shape, stride, dtype "
                                        "or wrapper", i);
    for (uint32_t d = 0; d < t->ndim; d++)
        if (!fits_u32(t->shape[d]))
            return lmc_err(err, errlen, "shape[%u] = %lld is out of range", d,
                           (long long)t->shape[d]);
    if (!dense(t, padded_dim0))
        return lmc_err(err, errlen, "%s tensors must be dense", lmc_kv_format_name(g->format));
    g->element_size = t->itemsize;
    if (g->block_stride == 0)
        g->block_stride = (uint64_t)g->bs * g->nh * g->hs;   /* < 2^64: dense() counted it */
    if ((uint64_t)g->hs * g->element_size % 2)
        return lmc_err(err, errlen, "a head of %u x %u bytes is not an even number of bytes",
                       g->hs, g->element_size);
    return spanned(g, err, errlen);
}

int lmc_kv_detect_sglang(const lmc_shared_tensor *t, size_t n, const lmc_kv_hints *h,
                         lmc_kv_geometry *out, char *err, size_t errlen)
{
    if (n == 0 || n > UINT32_MAX)
        return lmc_err(err, errlen, "no tensors registered");
    if (h->kv_list_layout == LMC_KV_LIST_UNIFIED)
        return lmc_kv_detect_unified(t, n, false, out, err, errlen);
    const int64_t *s = t->shape;
    int64_t tpb = h->tokens_per_block;
    if (t->ndim != 3)
        return lmc_err(err, errlen, "SGLang tensors are [pages, heads, head size]; got %u "
                                    "dimensions", t->ndim);
    if (tpb <= 0)
        return lmc_err(err, errlen, "SGLang registrations need the tokens_per_block hint");
    if (s[0] <= 0 || s[0] % tpb)
        return lmc_err(err, errlen, "SGLang page buffer of %lld slots is not a whole number of "
                                    "%lld-token blocks", (long long)s[0], (long long)tpb);
    bool kv_lists = h->kv_list_layout == LMC_KV_LIST_K_V ||
                    (h->kv_list_layout == LMC_KV_LIST_NONE && s[1] > 1);
    if (kv_lists) {
        if (n % 2)
            return lmc_err(err, errlen, "SGLang K/V lists need as many V tensors as K tensors");
        *out = geometry(LMC_KV_TWO_X_NL_X_NB_BS_NH_HS, 2, n / 2, s[0] / tpb, tpb, s[1], s[2]);
    } else if (s[1] == 1) {   /* MLA: latent + rope, one "head" */
        *out = geometry(LMC_KV_NL_X_NB_BS_HS, 1, n, s[0] / tpb, tpb, 1, s[2]);
    } else {
        return lmc_err(err, errlen, "SGLang tensors with %lld heads need kv_list_layout \"k_v\"",
                       (long long)s[1]);
    }
    return finish(t, n, out, false, err, errlen);
}

int lmc_kv_detect_unified(const lmc_shared_tensor *t, size_t n, bool recurrent,
                          lmc_kv_geometry *out, char *err, size_t errlen)
{
    if (n == 0 || n > UINT32_MAX)
        return lmc_err(err, errlen, "no tensors registered");
    const int64_t *s = t->shape;
    if (recurrent && (t->ndim != 4 || s[1] != 1 || s[2] != 1))
        return lmc_err(err, errlen, "a recurrent_state group's tensors must be opaque state "
                                    "views [blocks, 1, 1, elements]; got %u dimensions%s",
                       t->ndim, t->ndim == 4 ? " with slots or heads above 1" : "");
    if (t->ndim == 4)          /* attention, or opaque state: one slot, one "head" */
        *out = geometry(LMC_KV_NL_X_NB_BS_NH_HS, 1, n, s[0], s[1], s[2], s[3]);
    else if (t->ndim == 3)     /* MLA: latent + rope per slot */
        *out = geometry(LMC_KV_NL_X_NB_BS_HS, 1, n, s[0], s[1], 1, s[2]);
    else
        return lmc_err(err, errlen, "kv_list_layout \"unified\" tensors are [blocks, slots, "
                                    "heads, head size], [blocks, slots, head size] or "
                                    "[blocks, 1, 1, elements]; got %u dimensions", t->ndim);
    return finish(t, n, out, false, err, errlen);
}

int lmc_kv_detect_trtllm(const lmc_shared_tensor *t, size_t n, const lmc_kv_hints *h,
                         lmc_kv_geometry *out, char *err, size_t errlen)
{
    if (n != 1)
        return lmc_err(err, errlen, "TRT-LLM registers one KV pool tensor, not %zu", n);
    const int64_t *s = t->shape;
    if (t->ndim == 4) {
        if (h->num_kv_heads <= 0 || h->tokens_per_block <= 0 || h->head_dim <= 0)
            return lmc_err(err, errlen, "a 4-dimensional TRT-LLM pool needs the num_kv_heads, "
                                        "tokens_per_block and head_dim hints");
        uint64_t hinted[] = {(uint64_t)h->num_kv_heads, (uint64_t)h->tokens_per_block,
                             (uint64_t)h->head_dim}, row;
        if (h->num_kv_heads > UINT32_MAX || h->tokens_per_block > UINT32_MAX ||
            h->head_dim > UINT32_MAX || !lmc_product_u64(hinted, 3, &row) ||
            row != (uint64_t)s[3])
            return lmc_err(err, errlen, "TRT-LLM pool rows of %lld elements are not num_kv_heads "
                                        "x tokens_per_block x head_dim (%lld x %lld x %lld)",
                           (long long)s[3], (long long)h->num_kv_heads,
                           (long long)h->tokens_per_block, (long long)h->head_dim);
        *out = geometry(LMC_KV_NB_NL_TWO_NH_BS_HS, 2, (size_t)s[1], s[0], h->tokens_per_block,
                        h->num_kv_heads, h->head_dim);
    } else if (t->ndim == 6) {
        *out = geometry(LMC_KV_NB_NL_TWO_NH_BS_HS, 2, (size_t)s[1], s[0], s[4], s[3], s[5]);
    } else {
        return lmc_err(err, errlen, "a TRT-LLM pool is [blocks, layers, 2, heads x tokens x head "
                                    "size]; got %u dimensions", t->ndim);
    }
    if (s[2] != 2)
        return lmc_err(err, errlen, "a TRT-LLM pool's third dimension must be 2 (K, V)");
    return finish(t, n, out, false, err, errlen);
}
