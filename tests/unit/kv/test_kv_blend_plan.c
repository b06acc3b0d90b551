/* CacheBlend's retrieve plan and CPU executor (kv/kv_blend_plan.h,
 * docs/cacheblend.md "Retrieve plan and CPU executor").  The plan's
 * tables are asserted row by row for small cases worked out by hand
 * (waves, double buffering, runs, NoPE groups, unaligned starts, several
 * kernel groups of different block sizes); the executor is run end to end
 * on CPU memory: chunks stored as L1-style objects are retrieved at new
 * offsets and every element of every paged tensor is checked (rotated K
 * against rope_ref.h's float64 reference and tolerance, everything else
 * of the named slots byte-identical, every other byte the sentinel). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kv/kv_blend_plan.h"
#include "rope_ref.h"

enum { SENTINEL = 0xA5, MAX_POS = 128, NL = 2, MAX_CHUNKS = 8 };

/* ---- plan tables ---- */

/* A plan of kernel groups with only what planning reads. */
typedef struct toy {
    lmc_kv_kernel_group kg[2];
    lmc_kv_plan kv;
    int64_t table[2][32];
    const int64_t *blocks[2];
    uint64_t n_blocks[2];
    bool rope_on[2];
    uint32_t read[2];
    lmc_kv_blend_input in;
    void *mem;
    lmc_kv_blend_plan p;
} toy;

static void toy_group(toy *t, uint32_t i, uint32_t bs, uint64_t nb, uint32_t slots,
                      uint64_t entry_offset, uint64_t entry_bytes)
{
    t->kg[i] = (lmc_kv_kernel_group){0};
    t->kg[i].geo.bs = bs;
    t->kg[i].geo.nb = nb;
    t->kg[i].tokens_per_block = bs;
    t->kg[i].slots = slots;
    t->kg[i].entry_offset = entry_offset;
    t->kg[i].entry_bytes = entry_bytes;
    for (int j = 0; j < 32; j++)
        t->table[i][j] = (j * 5 + 3) % (int64_t)nb;
    t->blocks[i] = t->table[i];
    t->n_blocks[i] = 32;
    t->rope_on[i] = true;
}

/* One object group {kg 0} of 100 bytes: 8-token chunks, 4-slot blocks. */
static void toy_one(toy *t, const lmc_kv_blend_chunk *c, uint32_t n, uint32_t max_batch)
{
    memset(t, 0, sizeof *t);
    toy_group(t, 0, 4, 16, 8, 0, 100);
    t->kv = (lmc_kv_plan){.kg = t->kg, .n_kg = 1, .n_og = 1};
    t->kv.og[0] = (lmc_kv_object_group){.members = {0}, .n_members = 1, .object_size = 100};
    t->read[0] = 0;
    t->in = (lmc_kv_blend_input){&t->kv, t->read, 1, c, n, t->blocks, t->n_blocks, t->rope_on,
                                 max_batch};
}

static int toy_build(toy *t, char *err)
{
    uint64_t bytes = 0;
    int rc = lmc_kv_blend_plan_size(&t->in, &bytes, err, 256);
    if (rc != 0)
        return rc;
    t->mem = malloc(bytes + 8);
    return lmc_kv_blend_plan_build(&t->in, t->mem, bytes, &t->p, err, 256);
}

static void toy_free(toy *t)
{
    free(t->mem);
}

static void expect_staging(const lmc_kv_blend_staging *s, int64_t chunk, int64_t read,
                           int64_t slot, int64_t dst, int64_t nbytes)
{
    int64_t got[5] = {s->chunk, s->read, s->slot, s->dst_offset, s->nbytes};
    int64_t want[5] = {chunk, read, slot, dst, nbytes};
    assert_memory_equal(got, want, sizeof got);
}

static void expect_rope(const lmc_kv_blend_rope *r, int64_t g, int64_t slot, int64_t o,
                        int64_t c)
{
    int64_t got[4] = {r->group, r->slot, r->old_st, r->cur_st}, want[4] = {g, slot, o, c};
    assert_memory_equal(got, want, sizeof got);
}

static void expect_scatter(const lmc_kv_blend_scatter *s, int64_t g, int64_t slot, int64_t off,
                           int64_t n)
{
    int64_t got[4] = {s->group, s->slot, s->token_offset, s->n_tok}, want[4] = {g, slot, off, n};
    assert_memory_equal(got, want, sizeof got);
}

static void expect_step(const lmc_kv_blend_step *s, int64_t a, int64_t b, int64_t c)
{
    int64_t got[3] = {s->staging_end, s->ropes_end, s->scatters_end}, want[3] = {a, b, c};
    assert_memory_equal(got, want, sizeof got);
}

/* A run of three shifted chunks (10..34) and an unshifted partial one at
 * 50..55; max_batch 4: waves of 2, the run cut after its second chunk. */
static void test_plan_runs_and_waves(void **state)
{
    (void)state;
    static const lmc_kv_blend_chunk c[] = {{0, 10, 18}, {8, 18, 26}, {40, 26, 34}, {50, 50, 55}};
    toy t;
    char err[256] = "";
    toy_one(&t, c, 4, 4);
    if (toy_build(&t, err) != 0)
        fail_msg("refused: %s", err);
    const lmc_kv_blend_plan *p = &t.p;
    assert_int_equal(p->n_groups, 1);
    assert_int_equal(p->slot_stride, 256);
    assert_int_equal(p->wave, 2);
    assert_int_equal(p->n_pos, 29);
    for (int j = 0; j < 24; j++)
        assert_int_equal(p->pos[j], 10 + j);
    for (int j = 0; j < 5; j++)
        assert_int_equal(p->pos[24 + j], 50 + j);
    /* pos 10: block 2 -> id 13, 13*4 + 2; pos 33: block 8 -> id 11; pos 50: block 12 -> id 15 */
    assert_int_equal(p->slot_map[0], 54);
    assert_int_equal(p->slot_map[23], 45);
    assert_int_equal(p->slot_map[24], 62);
    assert_int_equal(p->n_waves, 3);
    assert_int_equal(p->n_staging, 4);
    expect_staging(&p->staging[0], 0, 0, 0, 0, 100);
    expect_staging(&p->staging[1], 1, 0, 1, 256, 100);
    expect_staging(&p->staging[2], 2, 0, 2, 512, 100);
    expect_staging(&p->staging[3], 3, 0, 0, 0, 100);
    assert_int_equal(p->n_ropes, 3);
    expect_rope(&p->ropes[0], 0, 0, 0, 10);
    expect_rope(&p->ropes[1], 0, 1, 8, 18);
    expect_rope(&p->ropes[2], 0, 2, 40, 26);
    assert_int_equal(p->n_scatters, 4);
    expect_scatter(&p->scatters[0], 0, 0, 0, 8);
    expect_scatter(&p->scatters[1], 0, 1, 8, 8);
    expect_scatter(&p->scatters[2], 0, 2, 16, 8);
    expect_scatter(&p->scatters[3], 0, 0, 24, 5);
    expect_step(&p->steps[0], 2, 2, 2);
    expect_step(&p->steps[1], 3, 3, 3);
    expect_step(&p->steps[2], 4, 3, 4);
    toy_free(&t);
}

/* max_batch 5 (odd): waves of 2 alternate halves 0-1 / 2-3; two
 * one-chunk runs with room in a wave still get a wave each. */
static void test_plan_double_buffering(void **state)
{
    (void)state;
    static const lmc_kv_blend_chunk c[] = {{0, 8, 16},   {0, 16, 24},  {0, 24, 32},
                                           {0, 32, 40},  {0, 40, 48},  {0, 64, 72},
                                           {80, 80, 88}};
    static const int64_t slots[] = {0, 1, 2, 3, 0, 2, 0};
    toy t;
    char err[256] = "";
    toy_one(&t, c, 7, 5);
    if (toy_build(&t, err) != 0)
        fail_msg("refused: %s", err);
    assert_int_equal(t.p.wave, 2);
    assert_int_equal(t.p.n_waves, 5);
    for (int i = 0; i < 7; i++) {
        assert_int_equal(t.p.staging[i].slot, slots[i]);
        assert_int_equal(t.p.scatters[i].slot, slots[i]);
    }
    static const int64_t ends[] = {2, 4, 5, 6, 7};
    for (int w = 0; w < 5; w++)
        expect_step(&t.p.steps[w], ends[w], ends[w] - (w == 4), ends[w]);
    toy_free(&t);
}

/* Two object groups read, one kernel group each: kg 0 rotated, 4-slot
 * blocks; kg 1 NoPE, 8-slot blocks, at offset 16 of a 64-byte object.
 * The chunk starts at 3 (unaligned), its second one at 11. */
static void test_plan_groups_and_nope(void **state)
{
    (void)state;
    static const lmc_kv_blend_chunk c[] = {{16, 3, 11}, {24, 11, 17}};
    toy t;
    char err[256] = "";
    toy_one(&t, c, 2, 2);
    toy_group(&t, 1, 8, 32, 8, 16, 40);
    t.rope_on[1] = false;
    t.kv.n_kg = 2;
    t.kv.n_og = 2;
    t.kv.og[1] = (lmc_kv_object_group){.members = {1}, .n_members = 1, .object_size = 64};
    t.read[1] = 1;
    t.in.n_read = 2;
    if (toy_build(&t, err) != 0)
        fail_msg("refused: %s", err);
    const lmc_kv_blend_plan *p = &t.p;
    assert_int_equal(p->n_groups, 2);
    assert_int_equal(p->slot_stride, 256);   /* round_up(100 + 64, 256) */
    assert_int_equal(p->group_offset[0], 0);
    assert_int_equal(p->group_offset[1], 116);
    assert_int_equal(p->n_pos, 14);
    assert_int_equal(p->n_waves, 2);   /* wave 1: one chunk a wave */
    expect_staging(&p->staging[0], 0, 0, 0, 0, 100);
    expect_staging(&p->staging[1], 0, 1, 0, 100, 64);
    expect_staging(&p->staging[2], 1, 0, 1, 256, 100);
    expect_staging(&p->staging[3], 1, 1, 1, 356, 64);
    assert_int_equal(p->n_ropes, 2);   /* no rows for the NoPE group */
    expect_rope(&p->ropes[0], 0, 0, 16, 3);
    expect_rope(&p->ropes[1], 0, 1, 24, 11);
    expect_scatter(&p->scatters[0], 0, 0, 0, 8);
    expect_scatter(&p->scatters[1], 1, 0, 0, 8);
    expect_scatter(&p->scatters[2], 0, 1, 8, 6);
    expect_scatter(&p->scatters[3], 1, 1, 8, 6);
    expect_step(&p->steps[0], 2, 1, 2);
    expect_step(&p->steps[1], 4, 2, 4);
    for (uint64_t j = 0; j < p->n_pos; j++) {
        int64_t q = p->pos[j];
        assert_int_equal(q, j < 8 ? 3 + (int64_t)j : 11 + (int64_t)j - 8);
        assert_int_equal(p->slot_map[j], t.table[0][q / 4] * 4 + q % 4);
        assert_int_equal(p->slot_map[p->n_pos + j], t.table[1][q / 8] * 8 + q % 8);
    }
    /* pos 3 through the 8-slot table: block 0 -> id 3 */
    assert_int_equal(p->slot_map[p->n_pos], 27);
    t.in.rope_on = NULL;   /* a NoPE model */
    toy_free(&t);
    t.mem = NULL;
    assert_int_equal(toy_build(&t, err), 0);
    assert_int_equal(t.p.n_ropes, 0);
    toy_free(&t);
}

/* No chunks: no rows, and no memory needed to lay them out. */
static void test_plan_empty(void **state)
{
    (void)state;
    toy t;
    char err[256] = "";
    uint64_t bytes = 1;
    toy_one(&t, NULL, 0, 4);
    assert_int_equal(lmc_kv_blend_plan_size(&t.in, &bytes, err, sizeof err), 0);
    assert_int_equal(bytes, 0);
    if (lmc_kv_blend_plan_build(&t.in, NULL, 0, &t.p, err, sizeof err) != 0)
        fail_msg("refused: %s", err);
    assert_int_equal(t.p.n_waves + t.p.n_pos + t.p.n_staging + t.p.n_scatters, 0);
}

static void expect_plan_refused(toy *t, const char *needle)
{
    char err[256] = "";
    uint64_t bytes;
    assert_int_equal(lmc_kv_blend_plan_size(&t->in, &bytes, err, sizeof err), -1);
    if (!strstr(err, needle))
        fail_msg("reason '%s' lacks '%s'", err, needle);
}

static void test_plan_refusals(void **state)
{
    (void)state;
    lmc_kv_blend_chunk c[] = {{0, 8, 16}, {0, 20, 28}};
    toy t;
    toy_one(&t, c, 2, 1);
    expect_plan_refused(&t, "max_batch 1");
    t.in.max_batch = 2;
    t.n_blocks[0] = 6;   /* 24 positions: 27 is past them */
    expect_plan_refused(&t, "position 27 past kernel group 0's 6 blocks");
    t.n_blocks[0] = 32;
    t.table[0][5] = 16;   /* position 20's block */
    expect_plan_refused(&t, "block id 16 outside kernel group 0's 16");
    t.table[0][5] = -1;
    expect_plan_refused(&t, "block id -1");
    t.table[0][5] = 2;
    c[1].cur_st = 12;
    c[1].cur_ed = 20;
    expect_plan_refused(&t, "overlapping");
    c[1].cur_st = 20;
    c[1].cur_ed = 29;
    expect_plan_refused(&t, "9 tokens, kernel group 0 stores 8");
    c[1].cur_ed = 28;
    t.kg[0].tokens_per_block = 2;
    expect_plan_refused(&t, "2 tokens per block of 4 slots");
    t.kg[0].tokens_per_block = 4;
    t.read[0] = 1;
    expect_plan_refused(&t, "object group 1 of 1");
    t.read[0] = 0;
    char err[256] = "";
    uint64_t bytes;
    assert_int_equal(lmc_kv_blend_plan_size(&t.in, &bytes, err, sizeof err), 0);
    uint64_t mem[64];
    assert_int_equal(lmc_kv_blend_plan_build(&t.in, mem, bytes - 1, &t.p, err, sizeof err), -1);
    assert_non_null(strstr(err, "bytes of 8-byte aligned memory"));
}

/* ---- the executor, end to end ---- */

/* One kernel group's registered tensors (FlashAttention NHD, a tensor
 * per layer) and what each element should end up as. */
typedef struct egroup {
    uint8_t *tensors[NL];
    uint8_t *expect[NL];    /* sentinel, or the stored bytes */
    uint8_t *rotated[NL];   /* 1: compare against ref within the tolerance */
    double *ref[NL], *mag[NL];
    uint64_t span;
    lmc_kv_rope_geom rope;
    lmc_kv_rope_cache cache;
} egroup;

typedef struct efix {
    toy t;
    egroup eg[2];
    lmc_kv_blend_group_io io[2];
    lmc_kv_rope_dtype kd;
    uint8_t *cache_data;
    uint8_t *objects[MAX_CHUNKS];
    uint8_t *pool;
    uint64_t pool_bytes;
} efix;

static void eg_setup(efix *f, uint32_t i, uint32_t bs, uint32_t nh, uint32_t hs,
                     uint64_t entry_offset, bool rope)
{
    uint32_t es = lmc_kv_rope_dtype_size(f->kd);
    toy_group(&f->t, i, bs, 32, 8, entry_offset, (uint64_t)2 * NL * 8 * nh * hs * es);
    lmc_kv_kernel_group *k = &f->t.kg[i];
    k->geo = (lmc_kv_geometry){LMC_KV_NL_X_TWO_NB_BS_NH_HS, 2, NL, 32, bs, nh, hs, es,
                               (uint64_t)bs * hs};
    k->n_tensors = NL;
    egroup *e = &f->eg[i];
    assert_true(lmc_kv_span_bytes(&k->geo, &e->span));
    for (int l = 0; l < NL; l++) {
        e->tensors[l] = malloc(e->span);
        e->expect[l] = malloc(e->span);
        memset(e->tensors[l], SENTINEL, e->span);
        memset(e->expect[l], SENTINEL, e->span);
        e->rotated[l] = calloc(e->span / es, 1);
        e->ref[l] = calloc(e->span / es, sizeof(double));
        e->mag[l] = calloc(e->span / es, sizeof(double));
    }
    f->t.rope_on[i] = rope;
    f->io[i] = (lmc_kv_blend_group_io){e->tensors, e->span, NULL, NULL, f->kd};
    if (!rope)
        return;
    char err[256];
    assert_int_equal(lmc_kv_rope_geometry(&k->geo, hs, true, false, 0, 0, hs, &e->rope, err,
                                          sizeof err),
                     0);
    assert_int_equal(lmc_kv_rope_cache_init(&e->cache, f->cache_data,
                                            (uint64_t)MAX_POS * hs * es, f->kd, MAX_POS, hs, err,
                                            sizeof err),
                     0);
    f->io[i].cache = &e->cache;
    f->io[i].rope = &e->rope;
}

/* Stored chunks as L1 objects of object group 0 (both kernel groups),
 * values multiples of 1/64 in (-2, 2), exact in every type. */
static void make_objects(efix *f, uint32_t n)
{
    uint32_t es = lmc_kv_rope_dtype_size(f->kd);
    uint64_t size = f->t.kv.og[0].object_size;
    for (uint32_t c = 0; c < n; c++) {
        f->objects[c] = malloc(size);
        for (uint64_t k = 0; k < size / es; k++)
            enc(f->kd, f->objects[c] + k * es, (double)((int)((k * 37 + c * 11) % 255) - 127) / 64);
    }
}

/* What chunk c should leave in kernel group i's tensors. */
static void expect_chunk(efix *f, uint32_t i, uint32_t c)
{
    const lmc_kv_kernel_group *k = &f->t.kg[i];
    const lmc_kv_geometry *g = &k->geo;
    const lmc_kv_blend_chunk *ch = &f->t.in.chunks[c];
    egroup *e = &f->eg[i];
    uint32_t es = g->element_size;
    bool shifted = f->t.rope_on[i] && ch->old_st != ch->cur_st;
    for (uint32_t kv = 0; kv < 2; kv++)
        for (uint32_t l = 0; l < NL; l++)
            for (uint32_t t = 0; t < ch->cur_ed - ch->cur_st; t++) {
                uint64_t pos = ch->cur_st + t, b = (uint64_t)f->t.table[i][pos / g->bs];
                const uint8_t *row = f->objects[c] + k->entry_offset +
                                     (((uint64_t)kv * NL + l) * k->slots + t) * g->nh * g->hs * es;
                for (uint32_t r = 0; r < g->nh * g->hs; r++) {
                    uint64_t o = lmc_kv_paged_offset(g, kv, 0, b, pos % g->bs, r / g->hs,
                                                     r % g->hs);
                    memcpy(e->expect[l] + o * es, row + (uint64_t)r * es, es);
                    if (shifted && kv == 0 && rope_ref_in_window(&e->rope, r)) {
                        e->rotated[l][o] = 1;
                        e->ref[l][o] = rope_ref_rotated(&e->rope, f->kd, f->kd, f->cache_data,
                                                        row, r, ch->old_st + t, pos,
                                                        &e->mag[l][o]);
                    }
                }
            }
}

static uint64_t check_group(const efix *f, uint32_t i)
{
    const egroup *e = &f->eg[i];
    uint32_t es = f->t.kg[i].geo.element_size;
    uint64_t rotated = 0;
    for (uint32_t l = 0; l < NL; l++)
        for (uint64_t o = 0; o < e->span / es; o++) {
            const uint8_t *p = e->tensors[l] + o * es;
            if (!e->rotated[l][o]) {
                if (memcmp(p, e->expect[l] + o * es, es) != 0)
                    fail_msg("group %u layer %u element %llu: not the %s", i, l,
                             (unsigned long long)o,
                             memcmp(e->expect[l] + o * es, "\xA5\xA5\xA5\xA5", es) == 0
                                 ? "sentinel"
                                 : "stored bytes");
                continue;
            }
            double got = dec(f->kd, p), d = got - e->ref[l][o];
            double tol = rope_ref_tolerance(f->kd, e->mag[l][o]);
            if (d > tol || d < -tol)
                fail_msg("group %u layer %u element %llu: %.9g, reference %.9g", i, l,
                         (unsigned long long)o, got, e->ref[l][o]);
            rotated++;
        }
    return rotated;
}

static void efix_free(efix *f, uint32_t n_groups, uint32_t n_chunks)
{
    for (uint32_t i = 0; i < n_groups; i++)
        for (int l = 0; l < NL; l++) {
            free(f->eg[i].tensors[l]);
            free(f->eg[i].expect[l]);
            free(f->eg[i].rotated[l]);
            free(f->eg[i].ref[l]);
            free(f->eg[i].mag[l]);
        }
    for (uint32_t c = 0; c < n_chunks; c++)
        free(f->objects[c]);
    free(f->pool);
    free(f->cache_data);
    toy_free(&f->t);
}

/* Plans and executes; the return code of the executor. */
static int efix_run(efix *f, uint32_t n_chunks, char *err)
{
    if (toy_build(&f->t, err) != 0)
        fail_msg("plan refused: %s", err);
    f->pool_bytes = f->t.p.slot_stride * f->t.in.max_batch;
    f->pool = malloc(f->pool_bytes);
    memset(f->pool, SENTINEL, f->pool_bytes);
    make_objects(f, n_chunks);
    return lmc_kv_blend_execute(&f->t.in, &f->t.p, (const uint8_t *const *)f->objects, f->io,
                                f->pool, f->pool_bytes, err, 256);
}

/* Chunks moved (a run of three across two waves, two slots), moved
 * backwards, left in place but partial; two kernel groups in one object
 * group, the second NoPE with 8-slot blocks. */
static void run_executor(lmc_kv_rope_dtype kd)
{
    static const lmc_kv_blend_chunk c[] = {
        {32, 5, 13}, {64, 13, 21}, {0, 21, 29}, {80, 40, 48}, {88, 88, 93}};
    efix f;
    memset(&f, 0, sizeof f);
    f.kd = kd;
    toy_one(&f.t, c, 5, 2);
    f.cache_data = rope_ref_cache(kd, 16, MAX_POS);
    f.t.kv.n_kg = 2;
    eg_setup(&f, 0, 4, 2, 16, 32, true);
    eg_setup(&f, 1, 8, 1, 16, 32 + f.t.kg[0].entry_bytes, false);
    f.t.kv.og[0] = (lmc_kv_object_group){
        .members = {0, 1}, .n_members = 2,
        .object_size = 32 + f.t.kg[0].entry_bytes + f.t.kg[1].entry_bytes + 8};
    char err[256] = "";
    int rc = efix_run(&f, 5, err);
    if (rc != 0)
        fail_msg("refused: %s", err);
    for (uint32_t i = 0; i < 2; i++)
        for (uint32_t ch = 0; ch < 5; ch++)
            expect_chunk(&f, i, ch);
    assert_true(check_group(&f, 0) > 0);
    assert_int_equal(check_group(&f, 1), 0);
    efix_free(&f, 2, 5);
}

static void test_execute_f32(void **state)
{
    (void)state;
    run_executor(LMC_KV_ROPE_F32);
}

static void test_execute_bf16_f16(void **state)
{
    (void)state;
    run_executor(LMC_KV_ROPE_BF16);
    run_executor(LMC_KV_ROPE_F16);
}

/* A plan the tensors cannot take is refused with pool and tensors as
 * they were. */
static void test_execute_refusals(void **state)
{
    (void)state;
    static const lmc_kv_blend_chunk c[] = {{0, 4, 12}, {100, 12, 20}};
    efix f;
    memset(&f, 0, sizeof f);
    f.kd = LMC_KV_ROPE_F32;
    toy_one(&f.t, c, 2, 2);
    f.cache_data = rope_ref_cache(f.kd, 16, MAX_POS);
    eg_setup(&f, 0, 4, 2, 16, 0, true);
    f.t.kv.og[0].object_size = f.t.kg[0].entry_bytes;
    char err[256] = "";
    /* tensors a byte short of what the group's formulas reach */
    f.io[0].tensor_bytes = f.eg[0].span - 1;
    assert_int_equal(efix_run(&f, 2, err), -1);
    assert_non_null(strstr(err, "tensors of"));
    check_group(&f, 0);
    for (uint64_t b = 0; b < f.pool_bytes; b++)
        assert_int_equal(f.pool[b], SENTINEL);
    f.io[0].tensor_bytes = f.eg[0].span;
    f.io[0].cache = NULL;   /* the plan rotates group 0 */
    assert_int_equal(lmc_kv_blend_execute(&f.t.in, &f.t.p, (const uint8_t *const *)f.objects,
                                          f.io, f.pool, f.pool_bytes, err, sizeof err),
                     -1);
    assert_non_null(strstr(err, "cos_sin_cache missing"));
    f.io[0].cache = &f.eg[0].cache;
    f.t.in.chunks = (lmc_kv_blend_chunk[]){{0, 4, 12}, {121, 12, 20}};   /* 121 + 8 > 128 */
    assert_int_equal(lmc_kv_blend_execute(&f.t.in, &f.t.p, (const uint8_t *const *)f.objects,
                                          f.io, f.pool, f.pool_bytes, err, sizeof err),
                     -1);
    assert_non_null(strstr(err, "past cos_sin_cache"));
    f.t.in.chunks = c;
    assert_int_equal(lmc_kv_blend_execute(&f.t.in, &f.t.p, (const uint8_t *const *)f.objects,
                                          f.io, f.pool, f.pool_bytes - 1, err, sizeof err),
                     -1);
    assert_non_null(strstr(err, "pool under 2 slots"));
    check_group(&f, 0);
    for (uint64_t b = 0; b < f.pool_bytes; b++)
        assert_int_equal(f.pool[b], SENTINEL);
    efix_free(&f, 1, 2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plan_runs_and_waves),
        cmocka_unit_test(test_plan_double_buffering),
        cmocka_unit_test(test_plan_groups_and_nope),
        cmocka_unit_test(test_plan_empty),
        cmocka_unit_test(test_plan_refusals),
        cmocka_unit_test(test_execute_f32),
        cmocka_unit_test(test_execute_bf16_f16),
        cmocka_unit_test(test_execute_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
