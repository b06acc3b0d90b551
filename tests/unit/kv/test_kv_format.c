/* vLLM KV format detection and the paged / chunk-object offsets the
 * server-driven copies use (docs/protocol.md, "Server-driven KV formats"):
 * every offset is checked against the tensor's own strides, walked the
 * way its shape names the dimensions, so the formula and the layout are
 * tested independently of each other. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "kv/kv_format.h"

enum { NB = 5, BS = 4, NH = 3, HS = 8, NL = 2 };

static lmc_shared_tensor dense_tensor(const int64_t *shape, uint32_t ndim, int64_t row_pad)
{
    lmc_shared_tensor t = {.wrapper = LMC_WRAPPER_CPU_SHM, .itemsize = 2, .ndim = ndim};
    strcpy(t.dtype, "float16");
    uint64_t acc = 1;   /* unsigned: the overflow tests wrap it on purpose */
    for (uint32_t d = ndim; d-- > 0;) {
        t.shape[d] = shape[d];
        t.stride[d] = (int64_t)acc;
        acc *= (uint64_t)shape[d];
        if (d == 1 && row_pad)
            acc += row_pad;   /* dim 0 steps over padded rows */
    }
    return t;
}

/* Index of each dimension of a tensor of `format` for one element. */
typedef struct {
    lmc_kv_format format;
    int64_t shape[6];
    uint32_t ndim;
    bool hnd;
    int engine;              /* 0 vLLM, 1 SGLang (tokens_per_block BS), 2 TRT-LLM,
                              * 3 SGLang unified */
} case_t;

static void indices(lmc_kv_format f, uint32_t kv, uint32_t l, uint32_t b, uint32_t s, uint32_t h,
                    uint32_t e, int64_t *idx)
{
    switch (f) {
    case LMC_KV_NB_NL_TWO_BS_NH_HS: memcpy(idx, (int64_t[]){b, l, kv, s, h, e}, 48); break;
    case LMC_KV_NL_X_TWO_NB_BS_NH_HS: memcpy(idx, (int64_t[]){kv, b, s, h, e}, 40); break;
    case LMC_KV_NL_X_TWO_NB_NH_BS_HS: memcpy(idx, (int64_t[]){kv, b, h, s, e}, 40); break;
    case LMC_KV_NL_X_NB_TWO_BS_NH_HS: memcpy(idx, (int64_t[]){b, kv, s, h, e}, 40); break;
    case LMC_KV_NL_X_NB_TWO_NH_BS_HS: memcpy(idx, (int64_t[]){b, kv, h, s, e}, 40); break;
    case LMC_KV_NL_X_NB_BS_HS: memcpy(idx, (int64_t[]){b, s, e}, 24); break;
    case LMC_KV_NL_X_NB_BS_NH_TWO_HS: memcpy(idx, (int64_t[]){b, s, h, e}, 32); break;
    case LMC_KV_NL_X_NB_NH_BS_TWO_HS: memcpy(idx, (int64_t[]){b, h, s, e}, 32); break;
    case LMC_KV_NB_NL_TWO_NH_BS_HS: memcpy(idx, (int64_t[]){b, l, kv, h, s, e}, 48); break;
    /* registered [NB*BS, NH, HS]: the page index folds block and slot */
    case LMC_KV_TWO_X_NL_X_NB_BS_NH_HS: memcpy(idx, (int64_t[]){b * BS + s, h, e}, 24); break;
    case LMC_KV_NL_X_NB_BS_NH_HS: memcpy(idx, (int64_t[]){b, s, h, e}, 32); break;
    }
}

static void check_case(const case_t *c, int64_t row_pad)
{
    lmc_shared_tensor layers[2 * NL];
    size_t n = lmc_kv_format_cross_layer(c->format) ? 1
               : lmc_kv_format_kv_lists(c->format) ? 2 * NL
                                                   : NL;
    for (size_t i = 0; i < n; i++)
        layers[i] = dense_tensor(c->shape, c->ndim, row_pad);
    lmc_kv_geometry g;
    char err[256] = "";
    lmc_kv_hints hints = {.tokens_per_block = BS, .num_kv_heads = NH, .head_dim = HS,
                          .kv_list_layout = LMC_KV_LIST_K_V};
    lmc_kv_hints unified = {.kv_list_layout = LMC_KV_LIST_UNIFIED};
    int rc = c->engine == 3   ? lmc_kv_detect_sglang(layers, n, &unified, &g, err, sizeof err)
             : c->engine == 1 ? lmc_kv_detect_sglang(layers, n, &hints, &g, err, sizeof err)
             : c->engine == 2 ? lmc_kv_detect_trtllm(layers, n, &hints, &g, err, sizeof err)
                              : lmc_kv_detect_vllm(layers, n, c->hnd, false, &g, err, sizeof err);
    if (rc != 0)
        fail_msg("%s: %s", lmc_kv_format_name(c->format), err);
    assert_string_equal(lmc_kv_format_name(g.format), lmc_kv_format_name(c->format));
    /* The span is one past the element at the highest indices. */
    uint64_t span;
    assert_true(lmc_kv_span_bytes(&g, &span));
    uint32_t last_kv = lmc_kv_format_kv_lists(g.format) ? 0 : g.kv_size - 1;
    assert_int_equal(span, (lmc_kv_paged_offset(&g, last_kv, NL - 1, NB - 1, BS - 1, g.nh - 1,
                                                g.hs - 1) + 1) * g.element_size);
    assert_int_equal(g.nl, NL);
    assert_int_equal(g.nb, NB);
    assert_int_equal(g.bs, BS);
    uint32_t heads = g.nh, kvs = g.kv_size;
    for (uint32_t kv = 0; kv < kvs; kv++)
        for (uint32_t l = 0; l < NL; l++)
            for (uint32_t b = 0; b < NB; b++)
                for (uint32_t s = 0; s < BS; s++)
                    for (uint32_t h = 0; h < heads; h++)
                        for (uint32_t e = 0; e < g.hs; e++) {
                            int64_t idx[6], want = 0;
                            indices(g.format, kv, l, b, s, h, e, idx);
                            if (c->engine == 2 && c->ndim == 4)   /* [NB, NL, 2, NH*BS*HS] */
                                idx[3] = ((int64_t)h * BS + s) * HS + e;
                            for (uint32_t d = 0; d < c->ndim; d++)
                                want += idx[d] * layers[0].stride[d];
                            assert_int_equal(lmc_kv_paged_offset(&g, kv, l, b, s, h, e), want);
                        }
}

static void test_formats_and_offsets(void **state)
{
    (void)state;
    const case_t cases[] = {
        {LMC_KV_NL_X_TWO_NB_BS_NH_HS, {2, NB, BS, NH, HS}, 5, false, 0},
        {LMC_KV_NL_X_TWO_NB_NH_BS_HS, {2, NB, NH, BS, HS}, 5, true, 0},
        {LMC_KV_NL_X_NB_TWO_BS_NH_HS, {NB, 2, BS, NH, HS}, 5, false, 0},
        {LMC_KV_NL_X_NB_TWO_NH_BS_HS, {NB, 2, NH, BS, HS}, 5, true, 0},
        {LMC_KV_NL_X_NB_BS_HS, {NB, BS, HS}, 3, true, 0},
        {LMC_KV_NL_X_NB_BS_NH_TWO_HS, {NB, BS, NH, 2 * HS}, 4, false, 0},
        {LMC_KV_NL_X_NB_NH_BS_TWO_HS, {NB, NH, BS, 2 * HS}, 4, true, 0},
        {LMC_KV_NB_NL_TWO_BS_NH_HS, {NB, NL, 2, BS, NH, HS}, 6, false, 0},
        {LMC_KV_TWO_X_NL_X_NB_BS_NH_HS, {NB * BS, NH, HS}, 3, false, 1},
        {LMC_KV_NB_NL_TWO_NH_BS_HS, {NB, NL, 2, NH, BS, HS}, 6, true, 2},
        {LMC_KV_NB_NL_TWO_NH_BS_HS, {NB, NL, 2, NH * BS * HS}, 4, true, 2},
        {LMC_KV_NL_X_NB_BS_NH_HS, {NB, BS, NH, HS}, 4, false, 3},
        {LMC_KV_NL_X_NB_BS_HS, {NB, BS, HS}, 3, false, 3},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        check_case(&cases[i], 0);
    check_case(&cases[4], 24);   /* MLA rows in a wider pool: dim-0 padding */
}

static void test_detection_rules(void **state)
{
    (void)state;
    lmc_kv_geometry g;
    char err[256] = "";
    /* A CPU server reads vLLM's tensors as HND whatever the hint says. */
    lmc_shared_tensor t = dense_tensor((int64_t[]){2, NB, NH, BS, HS}, 5, 0);
    assert_int_equal(lmc_kv_detect_vllm(&t, 1, false, true, &g, err, sizeof err), 0);
    assert_int_equal(g.format, LMC_KV_NL_X_TWO_NB_NH_BS_HS);
    assert_int_equal(g.nh, NH);
    /* FlashInfer with one head: NHD even under an HND hint. */
    t = dense_tensor((int64_t[]){NB, 2, BS, 1, HS}, 5, 0);
    assert_int_equal(lmc_kv_detect_vllm(&t, 1, true, false, &g, err, sizeof err), 0);
    assert_int_equal(g.format, LMC_KV_NL_X_NB_TWO_BS_NH_HS);
    assert_int_equal(g.nh, 1);
    assert_int_equal(g.bs, BS);
    /* A rank-5 tensor starting with 2 is FlashAttention, even if dim 1 is 2. */
    t = dense_tensor((int64_t[]){2, 2, BS, NH, HS}, 5, 0);
    assert_int_equal(lmc_kv_detect_vllm(&t, 1, false, false, &g, err, sizeof err), 0);
    assert_int_equal(g.format, LMC_KV_NL_X_TWO_NB_BS_NH_HS);
    /* Refusals. */
    t = dense_tensor((int64_t[]){NB, BS, NH, 7}, 4, 0);
    assert_int_equal(lmc_kv_detect_vllm(&t, 1, false, false, &g, err, sizeof err), -1);
    assert_non_null(strstr(err, "no vLLM KV format"));
    t = dense_tensor((int64_t[]){2, NB, BS, NH, HS}, 5, 16);   /* padding outside MLA */
    assert_int_equal(lmc_kv_detect_vllm(&t, 1, false, false, &g, err, sizeof err), -1);
    assert_non_null(strstr(err, "must be dense"));
    lmc_shared_tensor two[2] = {dense_tensor((int64_t[]){2, NB, BS, NH, HS}, 5, 0),
                                dense_tensor((int64_t[]){2, NB, BS, NH, 2 * HS}, 5, 0)};
    assert_int_equal(lmc_kv_detect_vllm(two, 2, false, false, &g, err, sizeof err), -1);
    assert_non_null(strstr(err, "layer 1 differs"));
    t = dense_tensor((int64_t[]){NB, BS, 3}, 3, 0);
    t.itemsize = 1;
    assert_int_equal(lmc_kv_detect_vllm(&t, 1, false, false, &g, err, sizeof err), -1);
    assert_non_null(strstr(err, "even number of bytes"));
}

static void expect_refused(int rc, const char *err, const char *reason)
{
    if (rc != -1 || !strstr(err, reason))
        fail_msg("rc %d, err '%s'; wanted -1 and '%s'", rc, err, reason);
}

/* Sizes a client claims that do not fit 64 bits are refused, never
 * wrapped into a size the segment check would then pass (issue 29). */
static void test_sizes_that_overflow_are_refused(void **state)
{
    (void)state;
    lmc_kv_geometry g;
    char err[256] = "";
    /* TRT-LLM: hints whose product wraps to the row length. */
    lmc_shared_tensor t = dense_tensor((int64_t[]){2, 1, 2, 291840}, 4, 0);
    lmc_kv_hints h = {.tokens_per_block = 256, .num_kv_heads = 1711252907,
                      .head_dim = 2147512668};
    expect_refused(lmc_kv_detect_trtllm(&t, 1, &h, &g, err, sizeof err), err,
                   "are not num_kv_heads x tokens_per_block x head_dim");
    /* vLLM: dimensions whose product wraps, with the strides a client
     * would send to make the wrapped product look dense. */
    const int64_t big = 2147483648;   /* 2^31 */
    t = dense_tensor((int64_t[]){2, 4, 4, big, big}, 5, 0);
    t.stride[2] = 0, t.stride[1] = 0, t.stride[0] = 0;   /* 4 * 2^62 wraps to 0 */
    expect_refused(lmc_kv_detect_vllm(&t, 1, false, false, &g, err, sizeof err), err,
                   "must be dense");
    /* Dense in 64 bits, but too large to address in bytes. */
    t = dense_tensor((int64_t[]){2, 2, 1, big, big / 2}, 5, 0);   /* 2^63 elements */
    expect_refused(lmc_kv_detect_vllm(&t, 1, false, false, &g, err, sizeof err), err,
                   "too large to address");
    /* A negative stride is never dense. */
    t = dense_tensor((int64_t[]){2, NB, BS, NH, HS}, 5, 0);
    t.stride[4] = -1;
    expect_refused(lmc_kv_detect_vllm(&t, 1, false, false, &g, err, sizeof err), err,
                   "must be dense");
}

static void test_sglang_and_trtllm_refusals(void **state)
{
    (void)state;
    lmc_kv_geometry g;
    char err[256] = "";
    lmc_kv_hints kv = {.tokens_per_block = BS, .kv_list_layout = LMC_KV_LIST_K_V};
    lmc_shared_tensor two[2] = {dense_tensor((int64_t[]){NB * BS, NH, HS}, 3, 0),
                                dense_tensor((int64_t[]){NB * BS, NH, HS}, 3, 0)};
    lmc_shared_tensor t = dense_tensor((int64_t[]){NB, BS, NH, HS}, 4, 0);
    expect_refused(lmc_kv_detect_sglang(&t, 1, &kv, &g, err, sizeof err), err,
                   "SGLang tensors are [pages, heads, head size]; got 4 dimensions");
    lmc_kv_hints none = {.kv_list_layout = LMC_KV_LIST_K_V};
    expect_refused(lmc_kv_detect_sglang(two, 2, &none, &g, err, sizeof err), err,
                   "need the tokens_per_block hint");
    lmc_kv_hints odd = {.tokens_per_block = 3, .kv_list_layout = LMC_KV_LIST_K_V};
    expect_refused(lmc_kv_detect_sglang(two, 2, &odd, &g, err, sizeof err), err,
                   "page buffer of 20 slots is not a whole number of 3-token blocks");
    expect_refused(lmc_kv_detect_sglang(two, 1, &kv, &g, err, sizeof err), err,
                   "need as many V tensors as K tensors");
    lmc_kv_hints unset = {.tokens_per_block = BS};
    assert_int_equal(lmc_kv_detect_sglang(two, 2, &unset, &g, err, sizeof err), 0);  /* NH>1 */
    lmc_kv_hints mla_list = {.tokens_per_block = BS, .kv_list_layout = LMC_KV_LIST_NONE};
    lmc_shared_tensor heads = dense_tensor((int64_t[]){NB * BS, 1, HS}, 3, 0);
    assert_int_equal(lmc_kv_detect_sglang(&heads, 1, &mla_list, &g, err, sizeof err), 0);
    assert_int_equal(g.format, LMC_KV_NL_X_NB_BS_HS);

    lmc_kv_hints trt = {.tokens_per_block = BS, .num_kv_heads = NH, .head_dim = HS};
    lmc_shared_tensor pool = dense_tensor((int64_t[]){NB, NL, 2, NH * BS * HS}, 4, 0);
    lmc_shared_tensor pools[2] = {pool, pool};
    expect_refused(lmc_kv_detect_trtllm(pools, 2, &trt, &g, err, sizeof err), err,
                   "registers one KV pool tensor, not 2");
    lmc_kv_hints no_heads = {.tokens_per_block = BS, .head_dim = HS};
    expect_refused(lmc_kv_detect_trtllm(&pool, 1, &no_heads, &g, err, sizeof err), err,
                   "needs the num_kv_heads, tokens_per_block and head_dim hints");
    lmc_kv_hints wrong = {.tokens_per_block = BS, .num_kv_heads = NH + 1, .head_dim = HS};
    expect_refused(lmc_kv_detect_trtllm(&pool, 1, &wrong, &g, err, sizeof err), err,
                   "pool rows of 96 elements are not num_kv_heads");
    t = dense_tensor((int64_t[]){NB, NL, 3, NH * BS * HS}, 4, 0);
    expect_refused(lmc_kv_detect_trtllm(&t, 1, &trt, &g, err, sizeof err), err,
                   "third dimension must be 2");
    t = dense_tensor((int64_t[]){NB, NL, 2 * NH * BS * HS}, 3, 0);
    expect_refused(lmc_kv_detect_trtllm(&t, 1, &trt, &g, err, sizeof err), err,
                   "got 3 dimensions");
}

/* The chunk object of one group: [kv_size, nl, slots, nh*hs], which for a
 * single group at full chunk is the engine-driven path's [2, L, chunk, H]. */
/* SGLang unified: each tensor its own block view, K and V separately;
 * opaque state only where the group says recurrent_state. */
static void test_unified_views(void **state)
{
    (void)state;
    lmc_kv_geometry g;
    char err[256] = "";
    lmc_shared_tensor st = dense_tensor((int64_t[]){NB, 1, 1, 1000}, 4, 0);
    assert_int_equal(lmc_kv_detect_unified(&st, 1, true, &g, err, sizeof err), 0);
    assert_int_equal(g.format, LMC_KV_NL_X_NB_BS_NH_HS);
    assert_int_equal(g.kv_size, 1);
    assert_int_equal(g.bs, 1);
    assert_int_equal(g.nh, 1);
    assert_int_equal(g.hs, 1000);
    lmc_shared_tensor kv[2] = {dense_tensor((int64_t[]){NB, BS, NH, HS}, 4, 0),
                               dense_tensor((int64_t[]){NB, BS, NH, HS}, 4, 0)};
    assert_int_equal(lmc_kv_detect_unified(kv, 2, false, &g, err, sizeof err), 0);
    assert_int_equal(g.nl, 2);   /* K and V: two single-plane "layers" */
    assert_int_equal(g.kv_size, 1);
    expect_refused(lmc_kv_detect_unified(kv, 2, true, &g, err, sizeof err), err,
                   "recurrent_state group's tensors must be opaque state views");
    lmc_shared_tensor mla = dense_tensor((int64_t[]){NB, BS, HS}, 3, 0);
    expect_refused(lmc_kv_detect_unified(&mla, 1, true, &g, err, sizeof err), err,
                   "recurrent_state group's tensors must be opaque state views");
    lmc_shared_tensor flat = dense_tensor((int64_t[]){NB * BS, NH * HS}, 2, 0);
    expect_refused(lmc_kv_detect_unified(&flat, 1, false, &g, err, sizeof err), err,
                   "kv_list_layout \"unified\" tensors are [blocks, slots, heads, head size]");
    lmc_shared_tensor padded = dense_tensor((int64_t[]){NB, BS, HS}, 3, 8);
    expect_refused(lmc_kv_detect_unified(&padded, 1, false, &g, err, sizeof err), err,
                   "must be dense");
}

static void test_object_offsets(void **state)
{
    (void)state;
    lmc_kv_geometry g = {.format = LMC_KV_NL_X_TWO_NB_BS_NH_HS, .kv_size = 2, .nl = NL,
                         .nb = NB, .bs = BS, .nh = NH, .hs = HS};
    const uint32_t chunk = 16, row = NH * HS;
    uint64_t expect = 0;
    for (uint32_t kv = 0; kv < 2; kv++)
        for (uint32_t l = 0; l < NL; l++)
            for (uint32_t s = 0; s < chunk; s++)
                for (uint32_t h = 0; h < NH; h++)
                    for (uint32_t e = 0; e < HS; e++)
                        assert_int_equal(lmc_kv_object_offset(&g, chunk, kv, l, s, h, e),
                                         expect++);
    assert_int_equal(expect, 2ull * NL * chunk * row);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_formats_and_offsets),
        cmocka_unit_test(test_detection_rules),
        cmocka_unit_test(test_sizes_that_overflow_are_refused),
        cmocka_unit_test(test_sglang_and_trtllm_refusals),
        cmocka_unit_test(test_unified_views),
        cmocka_unit_test(test_object_offsets),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
