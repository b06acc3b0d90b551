/* Kernel groups and object groups of a server-driven registration
 * (docs/protocol.md, "Kernel groups and object groups"): how layers are
 * grouped with and without EngineGroupInfos, the block, window and skip
 * arithmetic of each group, how groups share chunk objects, and what a
 * registration is refused for.  Also the layer batches of a layerwise
 * RETRIEVE ("RETRIEVE_LAYERWISE"): layers in registration order per object
 * group, cut into batches, and the bytes of each batch's reply. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "kv/kv_layerwise.h"
#include "kv/kv_plan.h"

static lmc_shared_tensor fa_nhd(int64_t nb, int64_t bs, int64_t nh, int64_t hs)
{
    lmc_shared_tensor t = {.wrapper = LMC_WRAPPER_CPU_SHM, .itemsize = 2, .ndim = 5,
                           .shape = {2, nb, bs, nh, hs}};
    strcpy(t.dtype, "float16");
    int64_t acc = 1;
    for (int d = 4; d >= 0; d--) {
        t.stride[d] = acc;
        acc *= t.shape[d];
    }
    return t;
}

static lmc_kv_plan_options opts(uint32_t cs, const lmc_engine_group_info *infos, size_t n,
                                bool separate)
{
    return (lmc_kv_plan_options){.engine = LMC_ENGINE_VLLM, .chunk_size = cs,
                                 .separate_object_groups = separate, .infos = infos,
                                 .n_infos = n};
}

static void test_groups_by_tensor_kind(void **state)
{
    (void)state;
    lmc_shared_tensor t[4] = {fa_nhd(8, 16, 2, 8), fa_nhd(8, 16, 4, 8), fa_nhd(8, 16, 2, 8),
                              fa_nhd(8, 16, 4, 8)};
    lmc_kv_plan p;
    lmc_kv_plan_options o = opts(32, NULL, 0, true);
    char err[256] = "";
    assert_int_equal(lmc_kv_plan_build(t, 4, &o, &p, err, sizeof err), 0);
    assert_int_equal(p.n_kg, 2);
    assert_int_equal(p.kg[0].n_tensors, 2);
    assert_int_equal(p.kg[0].tensors[0], 0);
    assert_int_equal(p.kg[0].tensors[1], 2);
    assert_int_equal(p.kg[1].tensors[0], 1);
    assert_int_equal(p.kg[0].blocks_per_chunk, 2);
    assert_int_equal(p.kg[0].slots, 32);
    /* One object holds both groups' entries, back to back. */
    assert_int_equal(p.n_og, 1);
    assert_int_equal(p.kg[0].entry_bytes, 2 * 2 * 32 * 16 * 2);
    assert_int_equal(p.kg[1].entry_offset, p.kg[0].entry_bytes);
    assert_int_equal(p.og[0].object_size, p.kg[0].entry_bytes + p.kg[1].entry_bytes);
    assert_int_equal(p.og[0].chunks_in_sw, -1);
    lmc_kv_plan_free(&p);
}

static void hybrid(bool separate, lmc_kv_plan *p)
{
    lmc_shared_tensor t[5] = {fa_nhd(8, 16, 2, 8), fa_nhd(8, 16, 2, 8), fa_nhd(8, 32, 1, 16),
                              fa_nhd(8, 16, 2, 4), fa_nhd(8, 16, 2, 4)};
    static const uint32_t l0[] = {0, 1}, l1[] = {2}, l2[] = {3, 4};
    lmc_engine_group_info infos[3] = {
        {.engine_group_id = 0, .layers = l0, .n_layers = 2, .tokens_per_block = 16,
         .sw_size_tokens = -1, .has_null_block = true},
        {.engine_group_id = 1, .layers = l1, .n_layers = 1, .tokens_per_block = 32,
         .sw_size_tokens = -1, .has_null_block = true},
        {.engine_group_id = 2, .layers = l2, .n_layers = 2, .tokens_per_block = 16,
         .sw_size_tokens = 32, .has_null_block = true},
    };
    lmc_kv_plan_options o = opts(64, infos, 3, separate);
    char err[256] = "";
    if (lmc_kv_plan_build(t, 5, &o, p, err, sizeof err) != 0)
        fail_msg("%s", err);
}

static void test_engine_groups_windows_and_object_groups(void **state)
{
    (void)state;
    lmc_kv_plan p;
    hybrid(true, &p);
    assert_int_equal(p.n_kg, 3);
    assert_int_equal(p.kg[0].blocks_per_chunk, 4);
    assert_int_equal(p.kg[1].blocks_per_chunk, 2);     /* 32-token blocks */
    assert_int_equal(p.kg[1].engine_group_id, 1);
    /* A 32-token window in 64-token chunks keeps the last 2 of 4 blocks. */
    assert_int_equal(p.kg[2].blocks_per_chunk, 4);
    assert_int_equal(p.kg[2].keep_blocks, 2);
    assert_int_equal(p.kg[2].slots, 32);
    assert_int_equal(p.n_og, 2);
    assert_int_equal(p.og[0].n_members, 2);
    assert_int_equal(p.og[1].members[0], 2);
    assert_int_equal(p.og[1].chunks_in_sw, 1);
    assert_int_equal(p.kg[2].entry_offset, 0);
    /* RETRIEVE's skip: 48 tokens cover 3 blocks, of which the window
     * dropped 2; 16 tokens cover only a dropped one. */
    assert_int_equal(lmc_kv_skip_blocks(&p.kg[2], 48), 1);
    assert_int_equal(lmc_kv_skip_blocks(&p.kg[2], 16), 0);
    assert_int_equal(lmc_kv_skip_blocks(&p.kg[0], 48), 3);
    assert_int_equal(lmc_kv_skip_blocks(&p.kg[1], 48), 1);
    lmc_kv_plan_free(&p);
    hybrid(false, &p);
    assert_int_equal(p.n_og, 1);
    assert_int_equal(p.og[0].n_members, 3);
    assert_int_equal(p.og[0].chunks_in_sw, -1);
    lmc_kv_plan_free(&p);
}

/* A window from the wire as large as int64 allows: its count in chunks is
 * a ceiling that must not overflow (found by fuzz_kv_geometry). */
static void test_huge_window_does_not_overflow(void **state)
{
    (void)state;
    lmc_shared_tensor t[1] = {fa_nhd(8, 16, 2, 8)};
    static const uint32_t l0[] = {0};
    lmc_engine_group_info infos[1] = {
        {.engine_group_id = 0, .layers = l0, .n_layers = 1, .tokens_per_block = 16,
         .sw_size_tokens = INT64_MAX, .has_null_block = true},
    };
    lmc_kv_plan_options o = opts(64, infos, 1, true);
    lmc_kv_plan p;
    char err[256] = "";
    if (lmc_kv_plan_build(t, 1, &o, &p, err, sizeof err) == 0) {
        assert_int_equal(p.og[0].chunks_in_sw, INT32_MAX);   /* clamped */
        lmc_kv_plan_free(&p);
    }
}

static void test_compressed_blocks(void **state)
{
    (void)state;
    /* 32 logical tokens per 16-slot block: a 64-token chunk is 2 blocks,
     * 32 stored slots. */
    lmc_shared_tensor t = fa_nhd(8, 16, 2, 8);
    static const uint32_t l0[] = {0};
    lmc_engine_group_info info = {.layers = l0, .n_layers = 1, .tokens_per_block = 32,
                                  .sw_size_tokens = -1, .has_null_block = true};
    lmc_kv_plan_options o = opts(64, &info, 1, true);
    lmc_kv_plan p;
    char err[256] = "";
    assert_int_equal(lmc_kv_plan_build(&t, 1, &o, &p, err, sizeof err), 0);
    assert_int_equal(p.kg[0].blocks_per_chunk, 2);
    assert_int_equal(p.kg[0].slots, 32);
    lmc_kv_plan_free(&p);
}

static void refused(const lmc_shared_tensor *t, size_t n, const lmc_engine_group_info *infos,
                    size_t n_infos, const char *why)
{
    lmc_kv_plan_options o = opts(64, infos, n_infos, true);
    lmc_kv_plan p;
    char err[256] = "";
    assert_int_equal(lmc_kv_plan_build(t, n, &o, &p, err, sizeof err), -1);
    if (!strstr(err, why))
        fail_msg("wanted '%s', got '%s'", why, err);
}


/* A dense tensor of any shape (SGLang unified views). */
static lmc_shared_tensor view(uint32_t ndim, const int64_t *shape, uint32_t itemsize)
{
    lmc_shared_tensor t = {.wrapper = LMC_WRAPPER_CPU_SHM, .itemsize = itemsize, .ndim = ndim};
    strcpy(t.dtype, itemsize == 4 ? "float32" : "bfloat16");
    int64_t acc = 1;
    for (int d = (int)ndim - 1; d >= 0; d--) {
        t.shape[d] = shape[d];
        t.stride[d] = acc;
        acc *= shape[d];
    }
    return t;
}

/* The hybrid of the e2e test: K0 V0 K1 V1 attention [NB, 4, 2, 8], then
 * two layers' opaque Mamba state [NS, 1, 1, 24] checkpointed every 16
 * tokens (docs/protocol.md, "SGLang unified layout"). */
static int unified_hybrid(bool separate, int64_t state_sw, bool state_recurrent,
                          lmc_kv_plan *p, char *err, size_t errlen)
{
    lmc_shared_tensor t[6];
    for (int i = 0; i < 4; i++)
        t[i] = view(4, (int64_t[]){12, 4, 2, 8}, 2);
    t[4] = t[5] = view(4, (int64_t[]){5, 1, 1, 24}, 4);
    static const uint32_t attn[] = {0, 1, 2, 3}, st[] = {4, 5};
    lmc_engine_group_info infos[2] = {
        {.engine_group_id = 0, .layers = attn, .n_layers = 4, .tokens_per_block = 4,
         .sw_size_tokens = -1, .has_null_block = true},
        {.engine_group_id = 1, .layers = st, .n_layers = 2, .tokens_per_block = 16,
         .sw_size_tokens = state_sw, .has_null_block = true,
         .recurrent_state = state_recurrent},
    };
    lmc_kv_plan_options o = opts(16, infos, 2, separate);
    o.engine = LMC_ENGINE_SGLANG;
    o.hints.kv_list_layout = LMC_KV_LIST_UNIFIED;
    return lmc_kv_plan_build(t, 6, &o, p, err, errlen);
}

static void test_unified_hybrid(void **state)
{
    (void)state;
    lmc_kv_plan p;
    char err[256] = "";
    if (unified_hybrid(true, -1, true, &p, err, sizeof err) != 0)
        fail_msg("%s", err);
    assert_int_equal(p.n_kg, 2);
    const lmc_kv_kernel_group *a = &p.kg[0], *s = &p.kg[1];
    assert_int_equal(a->geo.format, LMC_KV_NL_X_NB_BS_NH_HS);
    assert_int_equal(a->geo.kv_size, 1);
    assert_int_equal(a->geo.nl, 4);          /* K0 V0 K1 V1, each its own plane */
    assert_int_equal(a->n_tensors, 4);
    assert_int_equal(a->blocks_per_chunk, 4);
    assert_int_equal(a->slots, 16);
    assert_int_equal(a->entry_bytes, 4 * 16 * 16 * 2);
    assert_false(a->recurrent_state);
    assert_true(s->recurrent_state);
    assert_int_equal(s->geo.bs, 1);
    assert_int_equal(s->geo.hs, 24);
    assert_int_equal(s->blocks_per_chunk, 1);   /* one checkpoint per chunk at most */
    assert_int_equal(s->entry_bytes, 2 * 24 * 4);
    /* State has its own objects, of which a prefix needs the last. */
    assert_int_equal(p.n_og, 2);
    assert_int_equal(a->object_group, 0);
    assert_int_equal(s->object_group, 1);
    assert_int_equal(p.og[0].chunks_in_sw, -1);
    assert_int_equal(p.og[1].chunks_in_sw, 1);
    assert_int_equal(p.og[1].object_size, s->entry_bytes);
    lmc_kv_plan_free(&p);
    /* Without recurrent_state the same views are plain attention groups. */
    if (unified_hybrid(false, -1, false, &p, err, sizeof err) != 0)
        fail_msg("%s", err);
    assert_int_equal(p.n_og, 1);
    assert_int_equal(p.kg[1].blocks_per_chunk, 1);
    lmc_kv_plan_free(&p);
}

static void test_unified_mla_and_refusals(void **state)
{
    (void)state;
    lmc_kv_plan p;
    char err[256] = "";
    lmc_shared_tensor mla[3];
    for (int i = 0; i < 3; i++)
        mla[i] = view(3, (int64_t[]){6, 4, 36}, 2);
    lmc_kv_plan_options o = opts(16, NULL, 0, true);
    o.engine = LMC_ENGINE_SGLANG;
    o.hints.kv_list_layout = LMC_KV_LIST_UNIFIED;
    assert_int_equal(lmc_kv_plan_build(mla, 3, &o, &p, err, sizeof err), 0);
    assert_int_equal(p.n_kg, 1);
    assert_int_equal(p.kg[0].geo.format, LMC_KV_NL_X_NB_BS_HS);
    assert_int_equal(p.kg[0].geo.nl, 3);
    assert_int_equal(p.kg[0].slots, 16);
    assert_int_equal(p.og[0].object_size, 3 * 16 * 36 * 2);
    lmc_kv_plan_free(&p);

    assert_int_equal(unified_hybrid(false, -1, true, &p, err, sizeof err), -1);
    assert_non_null(strstr(err, "recurrent_state, which needs --separate-object-groups"));
    assert_int_equal(unified_hybrid(true, 32, true, &p, err, sizeof err), -1);
    assert_non_null(strstr(err, "recurrent_state and sw_size_tokens 32 exclude each other"));
    /* Attention views cannot be state. */
    lmc_shared_tensor t[2] = {view(4, (int64_t[]){12, 4, 2, 8}, 2),
                              view(4, (int64_t[]){12, 4, 2, 8}, 2)};
    static const uint32_t l[] = {0, 1};
    lmc_engine_group_info info = {.layers = l, .n_layers = 2, .tokens_per_block = 4,
                                  .sw_size_tokens = -1, .has_null_block = true,
                                  .recurrent_state = true};
    o.infos = &info;
    o.n_infos = 1;
    assert_int_equal(lmc_kv_plan_build(t, 2, &o, &p, err, sizeof err), -1);
    assert_non_null(strstr(err, "recurrent_state group's tensors must be opaque state views"));
}

static void test_refusals(void **state)
{
    (void)state;
    lmc_shared_tensor t[2] = {fa_nhd(8, 16, 2, 8), fa_nhd(8, 16, 4, 8)};
    static const uint32_t both[] = {0, 1}, back[] = {1, 0}, zero[] = {0}, one[] = {1};
    lmc_engine_group_info i = {.layers = zero, .n_layers = 1, .tokens_per_block = 24,
                               .sw_size_tokens = -1};
    refused(t, 2, &i, 1, "tokens_per_block 24 must be a multiple");
    i.tokens_per_block = 16;
    i.sw_size_tokens = 24;
    refused(t, 2, &i, 1, "a sliding window of 24 tokens");
    /* p must divide a tokens_per_block above 0; 2^32 once wrapped to a
     * divisor of 0 (found by fuzz_kv_geometry). */
    i.sw_size_tokens = -1;
    static const struct { int64_t tpb, p; } bad_p[] = {
        {16, 32}, {16, 3}, {0, 2}, {16, (int64_t)UINT32_MAX + 1}};
    for (size_t k = 0; k < sizeof bad_p / sizeof bad_p[0]; k++) {
        char why[160];
        i.tokens_per_block = bad_p[k].tpb;
        i.physical_per_engine = bad_p[k].p;
        snprintf(why, sizeof why, "physical_blocks_per_engine_block %lld must be 1, or divide "
                 "a tokens_per_block above 0 (got %lld)", (long long)bad_p[k].p,
                 (long long)bad_p[k].tpb);
        refused(t, 2, &i, 1, why);
    }
    i.tokens_per_block = 16;
    i.physical_per_engine = 0;
    i = (lmc_engine_group_info){.layers = both, .n_layers = 2, .sw_size_tokens = -1};
    refused(t, 2, &i, 1, "cannot share a kernel group");
    i.layers = back;
    refused(t, 2, &i, 1, "out of range, repeated or out of order");
    lmc_engine_group_info two[2] = {
        {.layers = one, .n_layers = 1, .sw_size_tokens = -1},
        {.engine_group_id = 1, .layers = zero, .n_layers = 1, .sw_size_tokens = -1}};
    refused(t, 2, two, 2, "in the order of their first layer");
    two[1].layers = one;
    refused(t, 2, two, 2, "out of range, repeated or out of order");
    bool hnd;
    char err[128];
    assert_int_equal(lmc_kv_layout_parse("LBHNC", 5, &hnd, err, sizeof err), 0);
    assert_true(hnd);
    assert_int_equal(lmc_kv_layout_parse("NHD", 3, &hnd, err, sizeof err), 0);
    assert_false(hnd);
    assert_int_equal(lmc_kv_layout_parse("BLNHC", 5, &hnd, err, sizeof err), -1);
    assert_non_null(strstr(err, "not supported yet"));
    assert_int_equal(lmc_kv_layout_parse("XYZ", 3, &hnd, err, sizeof err), -1);
}

/* Five layers; with infos, layers 0, 2 and 4 in one group and 1, 3 in
 * another (a window of its own object group when `window`). */
static void plan5(bool infos, bool window, lmc_kv_plan *p)
{
    lmc_shared_tensor t[5];
    for (int i = 0; i < 5; i++)
        t[i] = fa_nhd(8, 16, 2, 8);
    static const uint32_t even[] = {0, 2, 4}, odd[] = {1, 3};
    lmc_engine_group_info gi[2] = {
        {.engine_group_id = 0, .layers = even, .n_layers = 3, .tokens_per_block = 16,
         .sw_size_tokens = -1, .physical_per_engine = 1},
        {.engine_group_id = 1, .layers = odd, .n_layers = 2, .tokens_per_block = 16,
         .sw_size_tokens = window ? 32 : -1, .physical_per_engine = 1},
    };
    lmc_kv_plan_options o = {.engine = LMC_ENGINE_VLLM, .chunk_size = 32,
                             .separate_object_groups = true, .infos = infos ? gi : NULL,
                             .n_infos = infos ? 2 : 0};
    char err[256] = "";
    if (lmc_kv_plan_build(t, 5, &o, p, err, sizeof err) != 0)
        fail_msg("%s", err);
}

static void expect_batches(const lmc_kv_layer_batches *b, const uint32_t *idx, size_t n,
                           const size_t *starts, size_t n_batches)
{
    assert_int_equal(b->n_refs, n);
    for (size_t i = 0; i < n; i++)
        assert_int_equal(b->refs[i].index, idx[i]);
    assert_int_equal(b->n_batches, n_batches);
    for (size_t i = 0; i <= n_batches; i++)
        assert_int_equal(b->starts[i], starts[i]);
}

static void test_batches_of_one_group(void **state)
{
    (void)state;
    lmc_kv_plan p;
    plan5(false, false, &p);
    assert_int_equal(lmc_kv_plan_layers(&p), 5);
    assert_int_equal(lmc_kv_layer_pool_size(&p), 5);
    lmc_kv_layer_batches b;
    static const uint32_t all[] = {0, 1, 2, 3, 4};
    assert_int_equal(lmc_kv_layer_batches_build(&p, 0, 2, &b), 0);
    expect_batches(&b, all, 5, (const size_t[]){0, 2, 4, 5}, 3);
    assert_int_equal(b.refs[3].layer, 3);
    lmc_kv_layer_batches_free(&b);
    /* A batch of at least every layer: one batch; 0 counts as 1. */
    assert_int_equal(lmc_kv_layer_batches_build(&p, 0, 4096, &b), 0);
    expect_batches(&b, all, 5, (const size_t[]){0, 5}, 1);
    lmc_kv_layer_batches_free(&b);
    assert_int_equal(lmc_kv_layer_batches_build(&p, 0, 0, &b), 0);
    assert_int_equal(b.n_batches, 5);
    lmc_kv_layer_batches_free(&b);
    lmc_kv_plan_free(&p);
}

static void test_interleaved_groups_follow_the_registration_order(void **state)
{
    (void)state;
    lmc_kv_plan p;
    plan5(true, false, &p);      /* two kernel groups, one object group */
    assert_int_equal(p.n_og, 1);
    lmc_kv_layer_batches b;
    assert_int_equal(lmc_kv_layer_batches_build(&p, 0, 3, &b), 0);
    static const uint32_t all[] = {0, 1, 2, 3, 4};
    expect_batches(&b, all, 5, (const size_t[]){0, 3, 5}, 2);
    assert_int_equal(b.refs[1].kg, 1);
    assert_int_equal(b.refs[1].layer, 0);
    assert_int_equal(b.refs[2].kg, 0);
    assert_int_equal(b.refs[2].layer, 1);
    lmc_kv_layer_batches_free(&b);
    lmc_kv_plan_free(&p);
    plan5(true, true, &p);       /* the window group is an object group of its own */
    assert_int_equal(lmc_kv_layer_pool_size(&p), 5);
    assert_int_equal(p.n_og, 2);
    assert_int_equal(lmc_kv_layer_batches_build(&p, 1, 2, &b), 0);
    expect_batches(&b, (const uint32_t[]){1, 3}, 2, (const size_t[]){0, 2}, 1);
    lmc_kv_layer_batches_free(&b);
    lmc_kv_plan_free(&p);
}

static void test_pool_covers_every_layer_index(void **state)
{
    (void)state;
    /* Layers 1 and 3 in no group (shared KV): not copied, but the pool is
     * indexed by registration index, so it still reaches layer 4. */
    lmc_shared_tensor t[5];
    for (int i = 0; i < 5; i++)
        t[i] = fa_nhd(8, 16, 2, 8);
    static const uint32_t even[] = {0, 2, 4};
    lmc_engine_group_info gi = {.layers = even, .n_layers = 3, .tokens_per_block = 16,
                                .sw_size_tokens = -1, .physical_per_engine = 1};
    lmc_kv_plan_options o = {.engine = LMC_ENGINE_VLLM, .chunk_size = 32,
                             .separate_object_groups = true, .infos = &gi, .n_infos = 1};
    lmc_kv_plan p;
    char err[256] = "";
    if (lmc_kv_plan_build(t, 5, &o, &p, err, sizeof err) != 0)
        fail_msg("%s", err);
    assert_int_equal(lmc_kv_plan_layers(&p), 3);
    assert_int_equal(lmc_kv_layer_pool_size(&p), 5);
    lmc_kv_layer_batches b;
    assert_int_equal(lmc_kv_layer_batches_build(&p, 0, 2, &b), 0);
    expect_batches(&b, (const uint32_t[]){0, 2, 4}, 3, (const size_t[]){0, 2, 3}, 2);
    lmc_kv_layer_batches_free(&b);
    lmc_kv_plan_free(&p);
}

static int32_t le32(const uint8_t *p)
{
    return (int32_t)((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                     (uint32_t)p[3] << 24);
}

static void test_frames(void **state)
{
    (void)state;
    uint8_t out[LMC_KV_LAYERWISE_FRAME_MAX(3)];
    lmc_kv_layer_ref run[2] = {{.index = 4}, {.index = 5}};
    assert_int_equal(lmc_kv_layerwise_frame(run, 2, out), 12);
    assert_int_equal(le32(out), 4);
    assert_int_equal(le32(out + 4), 2);
    assert_int_equal(le32(out + 8), 4);
    lmc_kv_layer_ref gaps[3] = {{.index = 1}, {.index = 3}, {.index = 300}};
    assert_int_equal(lmc_kv_layerwise_frame(gaps, 3, out), 24);
    static const uint8_t want[24] = {0xff, 0xff, 0xff, 0xff, 3, 0, 0, 0, 1, 0, 0, 0,
                                     1, 0, 0, 0, 3, 0, 0, 0, 0x2c, 1, 0, 0};
    assert_memory_equal(out, want, sizeof want);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_groups_by_tensor_kind),
        cmocka_unit_test(test_engine_groups_windows_and_object_groups),
        cmocka_unit_test(test_compressed_blocks),
        cmocka_unit_test(test_huge_window_does_not_overflow),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_unified_hybrid),
        cmocka_unit_test(test_unified_mla_and_refusals),
        cmocka_unit_test(test_batches_of_one_group),
        cmocka_unit_test(test_interleaved_groups_follow_the_registration_order),
        cmocka_unit_test(test_pool_covers_every_layer_index),
        cmocka_unit_test(test_frames),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
