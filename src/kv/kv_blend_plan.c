#include "kv/kv_blend_plan.h"

#include <stdlib.h>
#include <string.h>

#include "core/checked.h"
#include "core/errbuf.h"

/* The staged kernel groups (every member of every read object group, in
 * read order) and where each read group sits in a staging slot. */
static int stage_groups(const lmc_kv_blend_input *in, lmc_kv_blend_plan *p, char *err,
                        size_t errlen)
{
    const lmc_kv_plan *kv = in->kv;
    uint64_t off = 0;
    if (in->n_read == 0 || in->n_read > LMC_KV_MAX_OBJECT_GROUPS || !in->read_ogs)
        return lmc_err(err, errlen, "read set: %u object groups", in->n_read);
    for (uint32_t r = 0; r < in->n_read; r++) {
        uint32_t og = in->read_ogs[r];
        if (og >= kv->n_og || (r && og <= in->read_ogs[r - 1]))
            return lmc_err(err, errlen, "read set: object group %u of %u, or not ascending", og,
                           kv->n_og);
        p->read_offset[r] = off;
        if (!lmc_add_u64(off, kv->og[og].object_size, &off))
            return lmc_err(err, errlen, "read set: object sizes overflow");
        for (uint32_t i = 0; i < kv->og[og].n_members; i++) {
            uint32_t kg = kv->og[og].members[i];
            uint64_t end;
            if (p->n_groups == LMC_KV_MAX_KERNEL_GROUPS || kg >= kv->n_kg ||
                !lmc_add_u64(kv->kg[kg].entry_offset, kv->kg[kg].entry_bytes, &end) ||
                end > kv->og[og].object_size)
                return lmc_err(err, errlen, "read set: object group %u's members", og);
            p->group_offset[p->n_groups] = p->read_offset[r] + kv->kg[kg].entry_offset;
            p->groups[p->n_groups++] = kg;
        }
    }
    if (!lmc_add_u64(off, LMC_KV_BLEND_SLOT_ALIGN - 1, &off))
        return lmc_err(err, errlen, "read set: object sizes overflow");
    p->slot_stride = off / LMC_KV_BLEND_SLOT_ALIGN * LMC_KV_BLEND_SLOT_ALIGN;
    return 0;
}

/* One staged group against one chunk: its tokens within the chunk's
 * slots, every position on the block list, every block id in the tensor,
 * every paged slot index an int64. */
static int check_group_chunk(const lmc_kv_blend_input *in, uint32_t kg, uint32_t c, char *err,
                             size_t errlen)
{
    const lmc_kv_kernel_group *k = &in->kv->kg[kg];
    const lmc_kv_blend_chunk *ch = &in->chunks[c];
    uint64_t bs = k->geo.bs, last = (ch->cur_ed - 1) / bs, idx;
    if (ch->cur_ed - ch->cur_st > k->slots)
        return lmc_err(err, errlen, "chunk %u: %llu tokens, kernel group %u stores %u", c,
                       (unsigned long long)(ch->cur_ed - ch->cur_st), kg, k->slots);
    if (last >= in->n_blocks[kg])
        return lmc_err(err, errlen,
                       "chunk %u: position %llu past kernel group %u's %llu blocks of %llu", c,
                       (unsigned long long)(ch->cur_ed - 1), kg,
                       (unsigned long long)in->n_blocks[kg], (unsigned long long)bs);
    for (uint64_t j = ch->cur_st / bs; j <= last; j++) {
        int64_t b = in->blocks[kg][j];
        if (b < 0 || (uint64_t)b >= k->geo.nb || !lmc_muladd_u64((uint64_t)b, bs, bs, &idx) ||
            idx > (uint64_t)INT64_MAX)
            return lmc_err(err, errlen, "chunk %u: block id %lld outside kernel group %u's %llu",
                           c, (long long)b, kg, (unsigned long long)k->geo.nb);
    }
    return 0;
}

static int check_input(const lmc_kv_blend_input *in, lmc_kv_blend_plan *p, char *err,
                       size_t errlen)
{
    if (!in || !in->kv || (in->n_chunks && !in->chunks) || !in->blocks || !in->n_blocks)
        return lmc_err(err, errlen, "retrieve plan: missing input");
    if (in->max_batch < 2)
        return lmc_err(err, errlen, "max_batch %u: double-buffered waves need 2 slots or more",
                       in->max_batch);
    if (stage_groups(in, p, err, errlen) != 0)
        return -1;
    for (uint32_t g = 0; g < p->n_groups; g++) {
        const lmc_kv_kernel_group *k = &in->kv->kg[p->groups[g]];
        if (k->geo.bs == 0 || k->tokens_per_block != k->geo.bs)
            return lmc_err(err, errlen, "kernel group %u: %u tokens per block of %u slots",
                           p->groups[g], k->tokens_per_block, k->geo.bs);
        if (!in->blocks[p->groups[g]] && in->n_blocks[p->groups[g]])
            return lmc_err(err, errlen, "kernel group %u: no block list", p->groups[g]);
    }
    for (uint32_t c = 0; c < in->n_chunks; c++) {
        const lmc_kv_blend_chunk *ch = &in->chunks[c];
        uint64_t end;
        if (ch->cur_ed <= ch->cur_st || (c && ch->cur_st < in->chunks[c - 1].cur_ed) ||
            !lmc_add_u64(ch->old_st, ch->cur_ed - ch->cur_st, &end) ||
            ch->cur_ed > (uint64_t)INT64_MAX || end > (uint64_t)INT64_MAX)
            return lmc_err(err, errlen,
                           "chunk %u: [%llu, %llu) from %llu empty, unsorted or overlapping", c,
                           (unsigned long long)ch->cur_st, (unsigned long long)ch->cur_ed,
                           (unsigned long long)ch->old_st);
        for (uint32_t g = 0; g < p->n_groups; g++)
            if (check_group_chunk(in, p->groups[g], c, err, errlen) != 0)
                return -1;
        p->n_pos += ch->cur_ed - ch->cur_st;   /* <= n_chunks * slots: no overflow */
    }
    p->wave = in->max_batch / 2;
    return 0;
}

/* The rows of one chunk, at its slot; counted only when p's tables are
 * not laid out yet. */
static void chunk_rows(const lmc_kv_blend_input *in, lmc_kv_blend_plan *p, uint32_t c,
                       uint64_t slot, uint64_t tok)
{
    const lmc_kv_blend_chunk *ch = &in->chunks[c];
    bool shifted = ch->old_st != ch->cur_st;
    for (uint32_t r = 0; r < in->n_read; r++, p->n_staging++)
        if (p->staging)
            p->staging[p->n_staging] = (lmc_kv_blend_staging){
                c, r, (int64_t)slot, (int64_t)(slot * p->slot_stride + p->read_offset[r]),
                (int64_t)in->kv->og[in->read_ogs[r]].object_size};
    for (uint32_t g = 0; g < p->n_groups && shifted; g++)
        if (in->rope_on && in->rope_on[p->groups[g]]) {
            if (p->ropes)
                p->ropes[p->n_ropes] = (lmc_kv_blend_rope){g, (int64_t)slot,
                                                           (int64_t)ch->old_st,
                                                           (int64_t)ch->cur_st};
            p->n_ropes++;
        }
    for (uint32_t g = 0; g < p->n_groups; g++, p->n_scatters++)
        if (p->scatters)
            p->scatters[p->n_scatters] = (lmc_kv_blend_scatter){
                g, (int64_t)slot, (int64_t)tok, (int64_t)(ch->cur_ed - ch->cur_st)};
}

/* Runs (chunks abutting in the new prompt) cut into waves of at most
 * p->wave chunks; wave s uses slots (s mod 2) * wave + i. */
static void walk(const lmc_kv_blend_input *in, lmc_kv_blend_plan *p)
{
    uint64_t tok = 0, in_wave = 0;
    p->n_staging = p->n_ropes = p->n_scatters = p->n_waves = 0;
    for (uint32_t c = 0; c < in->n_chunks; c++) {
        bool joins = c && in->chunks[c - 1].cur_ed == in->chunks[c].cur_st;
        if (c == 0 || !joins || in_wave == p->wave) {
            p->n_waves++;
            in_wave = 0;
        }
        chunk_rows(in, p, c, (p->n_waves - 1) % 2 * p->wave + in_wave, tok);
        in_wave++;
        tok += in->chunks[c].cur_ed - in->chunks[c].cur_st;
        bool last = c + 1 == in->n_chunks || in->chunks[c].cur_ed != in->chunks[c + 1].cur_st ||
                    in_wave == p->wave;
        if (last && p->steps)
            p->steps[p->n_waves - 1] = (lmc_kv_blend_step){
                (int64_t)p->n_staging, (int64_t)p->n_ropes, (int64_t)p->n_scatters};
    }
}

static bool plan_bytes(const lmc_kv_blend_plan *p, uint64_t *bytes)
{
    uint64_t f[][2] = {{p->n_pos, 8},
                       {p->n_pos, 8ull * p->n_groups},
                       {p->n_staging, sizeof(lmc_kv_blend_staging)},
                       {p->n_ropes, sizeof(lmc_kv_blend_rope)},
                       {p->n_scatters, sizeof(lmc_kv_blend_scatter)},
                       {p->n_waves, sizeof(lmc_kv_blend_step)}};
    uint64_t sum = 0;
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
        if (!lmc_muladd_u64(f[i][0], f[i][1], sum, &sum))
            return false;
    *bytes = sum;
    return sum <= SIZE_MAX;
}

static int count(const lmc_kv_blend_input *in, lmc_kv_blend_plan *p, uint64_t *bytes, char *err,
                 size_t errlen)
{
    memset(p, 0, sizeof *p);
    if (check_input(in, p, err, errlen) != 0)
        return -1;
    walk(in, p);
    if (!plan_bytes(p, bytes))
        return lmc_err(err, errlen, "retrieve plan: tables overflow");
    return 0;
}

int lmc_kv_blend_plan_size(const lmc_kv_blend_input *in, uint64_t *bytes, char *err,
                           size_t errlen)
{
    lmc_kv_blend_plan p;
    return count(in, &p, bytes, err, errlen);
}

/* pos and, per staged group, slot_g[j] = B[pos[j] / bs] * bs + pos[j] % bs
 * (kv_rope.h's lmc_kv_rope_slot_index, which the CUDA kernels invert). */
static void fill_positions(const lmc_kv_blend_input *in, lmc_kv_blend_plan *p)
{
    uint64_t j = 0;
    for (uint32_t c = 0; c < in->n_chunks; c++)
        for (uint64_t q = in->chunks[c].cur_st; q < in->chunks[c].cur_ed; q++)
            p->pos[j++] = (int64_t)q;
    for (uint32_t g = 0; g < p->n_groups; g++) {
        uint32_t kg = p->groups[g];
        uint32_t bs = in->kv->kg[kg].geo.bs;
        for (j = 0; j < p->n_pos; j++)   /* check_input: on the table */
            lmc_kv_rope_slot_index(in->blocks[kg], in->n_blocks[kg], bs, (uint64_t)p->pos[j],
                                   &p->slot_map[g * p->n_pos + j]);
    }
}

int lmc_kv_blend_plan_build(const lmc_kv_blend_input *in, void *mem, uint64_t mem_bytes,
                            lmc_kv_blend_plan *out, char *err, size_t errlen)
{
    uint64_t need;
    if (count(in, out, &need, err, errlen) != 0)
        return -1;
    if (need == 0)
        return 0;   /* no chunks: every table empty, none laid out */
    if (!mem || mem_bytes < need || (uintptr_t)mem % 8)
        return lmc_err(err, errlen, "retrieve plan: %llu bytes of 8-byte aligned memory needed",
                       (unsigned long long)need);
    uint8_t *m = mem;
    out->pos = (int64_t *)m;
    out->slot_map = out->pos + out->n_pos;
    m = (uint8_t *)(out->slot_map + (size_t)out->n_pos * out->n_groups);
    out->staging = (lmc_kv_blend_staging *)m;
    out->ropes = (lmc_kv_blend_rope *)(out->staging + out->n_staging);
    out->scatters = (lmc_kv_blend_scatter *)(out->ropes + out->n_ropes);
    out->steps = (lmc_kv_blend_step *)(out->scatters + out->n_scatters);
    fill_positions(in, out);
    walk(in, out);
    return 0;
}

/* Kernel group g's target: with its rotation (rot) or without (scatter:
 * the slot's K is already at its new positions). */
static lmc_kv_rope_target target_of(const lmc_kv_blend_input *in, const lmc_kv_blend_plan *p,
                                    const lmc_kv_blend_group_io *io, uint32_t g, bool rot)
{
    uint32_t kg = p->groups[g];
    const lmc_kv_blend_group_io *o = &io[kg];
    return (lmc_kv_rope_target){&in->kv->kg[kg], o->bases, o->tensor_bytes, in->blocks[kg],
                                in->n_blocks[kg], rot ? o->cache : NULL, rot ? o->rope : NULL,
                                o->k_dtype};
}

/* Staged group g's entry in slot `slot`, as a match of n_tok tokens. */
static lmc_kv_rope_match slot_match(const lmc_kv_blend_input *in, const lmc_kv_blend_plan *p,
                                    const uint8_t *pool, uint32_t g, int64_t slot,
                                    uint64_t old_st, uint64_t cur_st, uint64_t n_tok)
{
    const lmc_kv_kernel_group *k = &in->kv->kg[p->groups[g]];
    return (lmc_kv_rope_match){pool + (uint64_t)slot * p->slot_stride + p->group_offset[g],
                               k->entry_bytes, old_st, cur_st, (uint32_t)n_tok};
}

/* Everything the waves will touch, before the first of them writes. */
static int check_execute(const lmc_kv_blend_input *in, const lmc_kv_blend_plan *p,
                         const uint8_t *const *objects, const lmc_kv_blend_group_io *io,
                         const uint8_t *pool, uint64_t pool_bytes, char *err, size_t errlen)
{
    uint64_t need;
    if (!io || (p->n_staging && !objects) ||
        !lmc_mul_u64(in->max_batch, p->slot_stride, &need) || !pool || pool_bytes < need)
        return lmc_err(err, errlen,
                       "retrieve executor: no objects, or a pool under %u slots of %llu",
                       in->max_batch, (unsigned long long)p->slot_stride);
    for (uint64_t i = 0; i < p->n_staging; i++)
        if (!objects[p->staging[i].chunk * in->n_read + p->staging[i].read])
            return lmc_err(err, errlen, "retrieve executor: chunk %lld has no object",
                           (long long)p->staging[i].chunk);
    for (uint32_t g = 0; g < p->n_groups; g++) {
        bool on = in->rope_on && in->rope_on[p->groups[g]];
        if (on != (io[p->groups[g]].cache != NULL))
            return lmc_err(err, errlen, "kernel group %u: rope %s in the plan, cos_sin_cache %s",
                           p->groups[g], on ? "on" : "off", on ? "missing" : "given");
    }
    for (uint64_t i = 0; i < p->n_scatters; i++) {
        const lmc_kv_blend_scatter *s = &p->scatters[i];
        const lmc_kv_blend_chunk *ch = &in->chunks[i / p->n_groups];
        lmc_kv_rope_target t = target_of(in, p, io, (uint32_t)s->group, true);
        lmc_kv_rope_match m = slot_match(in, p, pool, (uint32_t)s->group, s->slot, ch->old_st,
                                         ch->cur_st, (uint64_t)s->n_tok);
        if (lmc_kv_rope_check(&t, &m, 1, err, errlen) != 0)
            return -1;
    }
    return 0;
}

/* One wave's three phases: stage, rope, scatter (docs/cacheblend.md). */
static int run_wave(const lmc_kv_blend_input *in, const lmc_kv_blend_plan *p, uint64_t w,
                    const uint8_t *const *objects, const lmc_kv_blend_group_io *io, uint8_t *pool,
                    char *err, size_t errlen)
{
    const lmc_kv_blend_step *from = w ? &p->steps[w - 1] : &(lmc_kv_blend_step){0, 0, 0};
    const lmc_kv_blend_step *to = &p->steps[w];
    for (int64_t i = from->staging_end; i < to->staging_end; i++) {
        const lmc_kv_blend_staging *s = &p->staging[i];
        memcpy(pool + s->dst_offset, objects[s->chunk * in->n_read + s->read], (size_t)s->nbytes);
    }
    for (int64_t i = from->ropes_end; i < to->ropes_end; i++) {
        const lmc_kv_blend_rope *r = &p->ropes[i];
        lmc_kv_rope_target t = target_of(in, p, io, (uint32_t)r->group, true);
        lmc_kv_rope_match m = slot_match(in, p, pool, (uint32_t)r->group, r->slot,
                                         (uint64_t)r->old_st, (uint64_t)r->cur_st, 0);
        if (lmc_kv_rope_rotate_entry(&t, &m, err, errlen) != 0)
            return -2;
    }
    for (int64_t i = from->scatters_end; i < to->scatters_end; i++) {
        const lmc_kv_blend_scatter *s = &p->scatters[i];
        uint64_t at = (uint64_t)p->pos[s->token_offset];
        lmc_kv_rope_target t = target_of(in, p, io, (uint32_t)s->group, false);
        lmc_kv_rope_match m =
            slot_match(in, p, pool, (uint32_t)s->group, s->slot, at, at, (uint64_t)s->n_tok);
        int rc = lmc_kv_rope_scatter(&t, &m, 1, err, errlen);
        if (rc != 0)
            return rc;
    }
    return 0;
}

int lmc_kv_blend_execute(const lmc_kv_blend_input *in, const lmc_kv_blend_plan *p,
                         const uint8_t *const *objects, const lmc_kv_blend_group_io *io,
                         uint8_t *pool, uint64_t pool_bytes, char *err, size_t errlen)
{
    if (!in || !p)
        return lmc_err(err, errlen, "retrieve executor: no plan");
    if (check_execute(in, p, objects, io, pool, pool_bytes, err, errlen) != 0)
        return -1;
    for (uint64_t w = 0; w < p->n_waves; w++) {
        int rc = run_wave(in, p, w, objects, io, pool, err, errlen);
        if (rc != 0)
            return rc;
    }
    return 0;
}
