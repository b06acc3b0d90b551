/* The device executor of CacheBlend's retrieve plan (docs/cacheblend.md,
 * "CUDA kernels"; the CPU executor is kv_blend_plan.c's).  Every index
 * formula comes from kv_rope.h and kv_format.h, the headers the CPU path
 * compiles: which elements pair up, where a position's cos/sin sit, the
 * rotation, the element conversions, a slot_map entry's block and slot,
 * the staged entry's and the paged tensors' offsets.
 *
 * One call: check everything the kernels will index, lay the group
 * descriptors, tensor addresses and the plan's tables out in one host
 * buffer, and enqueue on the stream: one stream-ordered allocation (slot
 * pool, then the tables), one H2D copy of the tables, then per wave its
 * staging copies, one rope launch and one scatter launch, and the free. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/cuda_blend.h"
#include "cuda/cuda_err.h"
#include "cuda/cuda_launch.h"
#include "kv/kv_rope.h"

#define BLEND_THREADS 256u
#define BLEND_TABLE_ALIGN 256u

/* A staged group as the kernels read it (device memory). */
typedef struct blend_group {
    lmc_kv_geometry geo;
    lmc_kv_rope_geom rope;
    uint64_t entry_offset;     /* the group's entry in a slot */
    uint64_t cos_sin;          /* device address; 0: not rotated */
    uint32_t tensor0;          /* its first address in the tensor table */
    uint32_t slots;
    lmc_kv_rope_dtype cache_dtype;
    lmc_kv_rope_dtype k_dtype;
} blend_group;

/* One launch's view of the call's device memory; first: the wave's first
 * row in the rope or scatter table. */
typedef struct blend_args {
    uint8_t *pool;
    uint64_t slot_stride;
    const blend_group *groups;
    const uint64_t *tensors;
    const int64_t *slot_map;
    uint64_t n_pos;
    const lmc_kv_blend_rope *ropes;
    const lmc_kv_blend_scatter *scatters;
    int64_t first;
} blend_args;

/* "blend_execute: what: CUDA's reason" */
static int bcheck(cudaError_t e, const char *what, char *err, size_t errlen)
{
    char w[96];
    snprintf(w, sizeof w, "blend_execute: %s", what);
    return check(e, w, err, errlen);
}

/* ---- kernels ------------------------------------------------------------ */

/* Rope row blockIdx.y of the wave, K row blockIdx.x of its staged entry
 * (layer by layer, lmc_kv_rope_entry_row): rotated in place from
 * old_st + slot to cur_st + slot, threads over (head, pair). */
__global__ void __launch_bounds__(BLEND_THREADS) lmc_cuda_blend_rope_kernel(const blend_args a)
{
    const lmc_kv_blend_rope r = a.ropes[a.first + blockIdx.y];
    const blend_group g = a.groups[r.group];
    if ((uint64_t)blockIdx.x >= (uint64_t)g.geo.nl * g.slots)
        return;
    uint32_t layer, tok;
    lmc_kv_rope_entry_row(g.slots, blockIdx.x, &layer, &tok);
    uint8_t *row = a.pool + (uint64_t)r.slot * a.slot_stride + g.entry_offset +
                   lmc_kv_object_offset(&g.geo, g.slots, 0, layer, tok, 0, 0) * g.geo.element_size;
    const void *cache = (const void *)(uintptr_t)g.cos_sin;
    uint32_t half = g.rope.rot_dim / 2, n = g.rope.n_heads * half;
    for (uint32_t k = threadIdx.x; k < n; k += blockDim.x) {
        uint32_t h = k / half, i = k % half, x, y;
        float cd, sd, xo, yo;
        lmc_kv_rope_pair(&g.rope, h, i, &x, &y);
        lmc_kv_rope_delta_at(g.cache_dtype, cache, g.rope.rot_dim, (uint64_t)r.old_st + tok,
                             (uint64_t)r.cur_st + tok, i, &cd, &sd);
        lmc_kv_rope_apply(lmc_kv_rope_load(g.k_dtype, row, x), lmc_kv_rope_load(g.k_dtype, row, y),
                          cd, sd, &xo, &yo);
        lmc_kv_rope_store(g.k_dtype, row, x, xo);
        lmc_kv_rope_store(g.k_dtype, row, y, yo);
    }
}

/* Scatter row blockIdx.y of the wave: its slot's token blockIdx.x, plane
 * and layer blockIdx.z, to the paged slot slot_map names; threads over
 * (head, unit of the head's row).  U: the copy unit (every address and
 * row size a multiple of it). */
template <typename U>
__global__ void __launch_bounds__(BLEND_THREADS) lmc_cuda_blend_scatter_kernel(const blend_args a)
{
    const lmc_kv_blend_scatter sc = a.scatters[a.first + blockIdx.y];
    const blend_group g = a.groups[sc.group];
    const uint32_t tok = blockIdx.x, plane = blockIdx.z;
    if ((int64_t)tok >= sc.n_tok || plane >= g.geo.kv_size * g.geo.nl)
        return;
    const uint32_t kv = plane / g.geo.nl, l = plane % g.geo.nl;
    const uint64_t es = g.geo.element_size, upr = (uint64_t)g.geo.hs * es / sizeof(U);
    int64_t b;
    uint32_t s;
    lmc_kv_rope_slot_split(a.slot_map[(uint64_t)sc.group * a.n_pos + sc.token_offset + tok],
                           g.geo.bs, &b, &s);
    const uint8_t *src = a.pool + (uint64_t)sc.slot * a.slot_stride + g.entry_offset +
                         lmc_kv_object_offset(&g.geo, g.slots, kv, l, tok, 0, 0) * es;
    uint8_t *tensor = (uint8_t *)(uintptr_t)a.tensors[g.tensor0 + lmc_kv_rope_tensor(&g.geo, kv, l)];
    for (uint64_t k = threadIdx.x; k < g.geo.nh * upr; k += blockDim.x) {
        uint32_t h = (uint32_t)(k / upr);
        U *dst = (U *)(tensor + lmc_kv_rope_dst_offset(&g.geo, kv, l, (uint64_t)b, s, h) * es);
        const U *from = (const U *)(src + (uint64_t)h * g.geo.hs * es);
        __stcg(dst + k % upr, __ldcg(from + k % upr));
    }
}

/* ---- checks ------------------------------------------------------------- */

/* One staged group: its entry inside a slot, its sizes, its tensors, its
 * rotation against its row and cache. */
static int check_group(const lmc_cuda_blend *b, uint32_t i, char *err, size_t errlen)
{
    const lmc_cuda_blend_group *bg = &b->groups[i];
    const lmc_kv_kernel_group *k = bg->g;
    if (!k || !bg->tensors)
        return fail(err, errlen, "blend_execute: group %u has no geometry or tensors", i);
    const lmc_kv_geometry *g = &k->geo;
    uint64_t entry = 1, f[] = {g->kv_size, g->nl, k->slots, g->nh, g->hs, g->element_size};
    for (size_t j = 0; j < sizeof f / sizeof f[0]; j++)
        if (__builtin_mul_overflow(entry, f[j], &entry))
            entry = 0;   /* no entry is 0 bytes: refused below */
    if ((g->kv_size != 1 && g->kv_size != 2) || g->bs == 0 || g->nl == 0 || g->hs == 0 ||
        g->nh == 0 || k->slots == 0 || k->tokens_per_block != g->bs ||
        g->element_size != lmc_kv_rope_dtype_size(bg->k_dtype) || entry != k->entry_bytes ||
        b->plan->group_offset[i] > b->plan->slot_stride ||
        entry > b->plan->slot_stride - b->plan->group_offset[i])
        return fail(err, errlen, "blend_execute: group %u's geometry, K dtype or entry does "
                     "not fit a slot of %llu bytes", i,
                     (unsigned long long)b->plan->slot_stride);
    if (k->n_tensors < lmc_cuda_tensors_needed(g))
        return fail(err, errlen, "blend_execute: group %u has %u tensors, its format uses %u", i,
                     k->n_tensors, lmc_cuda_tensors_needed(g));
    for (uint32_t t = 0; t < lmc_cuda_tensors_needed(g); t++)
        if (!bg->tensors[t])
            return fail(err, errlen, "blend_execute: group %u's tensor %u is NULL", i, t);
    if (!bg->cos_sin)
        return 0;
    const lmc_kv_rope_geom *r = &bg->rope;
    if ((uint64_t)r->n_heads * r->head_stride != (uint64_t)g->nh * g->hs || r->rot_dim == 0 ||
        r->rot_dim % 2 || (uint64_t)r->rot_offset + r->rot_dim > r->head_stride ||
        bg->cache_dtype > LMC_KV_ROPE_F32 || bg->cache_rows == 0)
        return fail(err, errlen, "blend_execute: group %u's rope geometry or cos/sin cache "
                     "does not fit its row of %u x %u", i, g->nh, g->hs);
    return 0;
}

/* The waves' ends climb to the table sizes. */
static int check_steps(const lmc_kv_blend_plan *p, char *err, size_t errlen)
{
    lmc_kv_blend_step prev = {0, 0, 0};
    for (uint64_t w = 0; w < p->n_waves; w++) {
        const lmc_kv_blend_step *s = &p->steps[w];
        if (s->staging_end < prev.staging_end || s->ropes_end < prev.ropes_end ||
            s->scatters_end < prev.scatters_end)
            return fail(err, errlen, "blend_execute: wave %llu's rows go backwards",
                         (unsigned long long)w);
        prev = *s;
    }
    if (prev.staging_end != (int64_t)p->n_staging || prev.ropes_end != (int64_t)p->n_ropes ||
        prev.scatters_end != (int64_t)p->n_scatters)
        return fail(err, errlen, "blend_execute: the waves do not end at the tables' ends");
    return 0;
}

static int check_rows(const lmc_cuda_blend *b, uint64_t pool_bytes, char *err, size_t errlen)
{
    const lmc_kv_blend_plan *p = b->plan;
    for (uint64_t i = 0; i < p->n_staging; i++) {
        const lmc_kv_blend_staging *s = &p->staging[i];
        if (s->chunk < 0 || s->chunk >= b->n_chunks || s->read < 0 || s->read >= b->n_read ||
            !b->objects[s->chunk * b->n_read + s->read] || s->dst_offset < 0 ||
            s->nbytes < 0 || (uint64_t)s->dst_offset > pool_bytes ||
            (uint64_t)s->nbytes > pool_bytes - (uint64_t)s->dst_offset)
            return fail(err, errlen, "blend_execute: staging row %llu: no object, or outside "
                         "the %llu-byte pool", (unsigned long long)i,
                         (unsigned long long)pool_bytes);
    }
    for (uint64_t i = 0; i < p->n_ropes; i++) {
        const lmc_kv_blend_rope *r = &p->ropes[i];
        if (r->group < 0 || r->group >= p->n_groups || r->slot < 0 || r->slot >= b->max_batch ||
            !b->groups[r->group].cos_sin || r->old_st < 0 || r->cur_st < 0)
            return fail(err, errlen, "blend_execute: rope row %llu: group, slot or cache",
                         (unsigned long long)i);
        const lmc_cuda_blend_group *bg = &b->groups[r->group];
        uint64_t rows = bg->cache_rows, slots = bg->g->slots;
        if (slots > rows || (uint64_t)r->old_st > rows - slots ||
            (uint64_t)r->cur_st > rows - slots)
            return fail(err, errlen, "blend_execute: rope row %llu: positions %lld/%lld + %llu "
                         "past the cos/sin cache's %llu rows", (unsigned long long)i,
                         (long long)r->old_st, (long long)r->cur_st, (unsigned long long)slots,
                         (unsigned long long)rows);
    }
    for (uint64_t i = 0; i < p->n_scatters; i++) {
        const lmc_kv_blend_scatter *s = &p->scatters[i];
        if (s->group < 0 || s->group >= p->n_groups || s->slot < 0 || s->slot >= b->max_batch ||
            s->token_offset < 0 || s->n_tok < 0 || s->n_tok > b->groups[s->group].g->slots ||
            (uint64_t)s->token_offset > p->n_pos ||
            (uint64_t)s->n_tok > p->n_pos - (uint64_t)s->token_offset)
            return fail(err, errlen, "blend_execute: scatter row %llu: group, slot or tokens",
                         (unsigned long long)i);
    }
    return 0;
}

/* Every paged slot index on its group's blocks. */
static int check_slot_map(const lmc_cuda_blend *b, char *err, size_t errlen)
{
    const lmc_kv_blend_plan *p = b->plan;
    for (uint32_t g = 0; g < p->n_groups; g++) {
        const lmc_kv_geometry *geo = &b->groups[g].g->geo;
        for (uint64_t j = 0; j < p->n_pos; j++) {
            int64_t v = p->slot_map[g * p->n_pos + j], blk;
            uint32_t s;
            if (v < 0)
                return fail(err, errlen, "blend_execute: slot_map[%u][%llu] = %lld", g,
                             (unsigned long long)j, (long long)v);
            lmc_kv_rope_slot_split(v, geo->bs, &blk, &s);
            if ((uint64_t)blk >= geo->nb)
                return fail(err, errlen, "blend_execute: slot_map[%u][%llu]: block %lld of %llu",
                             g, (unsigned long long)j, (long long)blk,
                             (unsigned long long)geo->nb);
        }
    }
    return 0;
}

static int check_blend(const lmc_cuda_blend *b, uint64_t *pool_bytes, char *err, size_t errlen)
{
    if (!b || !b->plan || (b->plan->n_groups && !b->groups))
        return fail(err, errlen, "blend_execute: no plan or groups");
    const lmc_kv_blend_plan *p = b->plan;
    if (p->n_groups > LMC_KV_MAX_KERNEL_GROUPS || b->max_batch < 2 || b->n_read == 0 ||
        p->slot_stride == 0 || p->slot_stride % LMC_KV_BLEND_SLOT_ALIGN ||
        p->slot_stride > UINT64_MAX / b->max_batch)
        return fail(err, errlen, "blend_execute: %u groups, max_batch %u, %u read groups, "
                     "slots of %llu bytes", p->n_groups, b->max_batch, b->n_read,
                     (unsigned long long)p->slot_stride);
    if ((p->n_pos && (!p->pos || !p->slot_map)) || (p->n_staging && (!p->staging || !b->objects)) ||
        (p->n_ropes && !p->ropes) || (p->n_scatters && !p->scatters) ||
        (p->n_waves && !p->steps))
        return fail(err, errlen, "blend_execute: the plan's tables are missing");
    *pool_bytes = p->slot_stride * b->max_batch;
    for (uint32_t g = 0; g < p->n_groups; g++)
        if (check_group(b, g, err, errlen) != 0)
            return -1;
    if (check_steps(p, err, errlen) != 0 || check_rows(b, *pool_bytes, err, errlen) != 0)
        return -1;
    return check_slot_map(b, err, errlen);
}

/* ---- layout ------------------------------------------------------------- */

/* Byte offsets, from the start of the call's device allocation, of what
 * it holds: the pool first (256-aligned like the allocation), then the
 * tables the host buffer copies in. */
typedef struct blend_layout {
    uint64_t groups, tensors, slot_map, ropes, scatters, end;
    uint32_t n_tensors;
} blend_layout;

static uint64_t round_up(uint64_t v)
{
    return (v + BLEND_TABLE_ALIGN - 1) / BLEND_TABLE_ALIGN * BLEND_TABLE_ALIGN;
}

static blend_layout layout_of(const lmc_cuda_blend *b, uint64_t pool_bytes)
{
    const lmc_kv_blend_plan *p = b->plan;
    blend_layout l;
    l.n_tensors = 0;
    for (uint32_t g = 0; g < p->n_groups; g++)
        l.n_tensors += lmc_cuda_tensors_needed(&b->groups[g].g->geo);
    l.groups = round_up(pool_bytes);
    l.tensors = round_up(l.groups + (uint64_t)p->n_groups * sizeof(blend_group));
    l.slot_map = round_up(l.tensors + (uint64_t)l.n_tensors * 8);
    l.ropes = round_up(l.slot_map + p->n_pos * p->n_groups * 8);
    l.scatters = round_up(l.ropes + p->n_ropes * sizeof(lmc_kv_blend_rope));
    l.end = l.scatters + p->n_scatters * sizeof(lmc_kv_blend_scatter);
    return l;
}

/* The tables as the device will hold them, from offset l->groups on. */
static void fill_tables(const lmc_cuda_blend *b, const blend_layout *l, uint8_t *host)
{
    const lmc_kv_blend_plan *p = b->plan;
#define AT(off) (host + ((off) - l->groups))   /* a device offset in the host buffer */
    uint32_t t0 = 0;
    for (uint32_t g = 0; g < p->n_groups; g++) {
        const lmc_cuda_blend_group *bg = &b->groups[g];
        uint32_t nt = lmc_cuda_tensors_needed(&bg->g->geo);
        blend_group d;
        memset(&d, 0, sizeof d);
        d.geo = bg->g->geo;
        d.rope = bg->rope;
        d.entry_offset = p->group_offset[g];
        d.cos_sin = bg->cos_sin;
        d.tensor0 = t0;
        d.slots = bg->g->slots;
        d.cache_dtype = bg->cache_dtype;
        d.k_dtype = bg->k_dtype;
        memcpy(AT(l->groups + g * sizeof d), &d, sizeof d);
        memcpy(AT(l->tensors + (uint64_t)t0 * 8), bg->tensors, (size_t)nt * 8);
        t0 += nt;
    }
    memcpy(AT(l->slot_map), p->slot_map, (size_t)(p->n_pos * p->n_groups * 8));
    memcpy(AT(l->ropes), p->ropes, (size_t)(p->n_ropes * sizeof(lmc_kv_blend_rope)));
    memcpy(AT(l->scatters), p->scatters, (size_t)(p->n_scatters * sizeof(lmc_kv_blend_scatter)));
#undef AT
}

/* The widest copy unit every scattered row start and size is a multiple
 * of (cuda_launch.h's rule), and the launches' widths. */
typedef struct blend_shape {
    uint64_t rows, bits;               /* row sizes and offsets OR'ed, for the unit */
    uint32_t unit;                     /* set once the pool's address is known */
    uint32_t rope_x, rope_threads;     /* K rows of the largest rotated entry; threads */
    uint32_t scatter_x, scatter_z, scatter_threads;
} blend_shape;

static blend_shape shape_of(const lmc_cuda_blend *b)
{
    const lmc_kv_blend_plan *p = b->plan;
    blend_shape s;
    memset(&s, 0, sizeof s);
    uint64_t rope_x = 0, rope_n = 0, sc_n = 0;
    s.bits = p->slot_stride;
    for (uint32_t g = 0; g < p->n_groups; g++) {
        const lmc_cuda_blend_group *bg = &b->groups[g];
        const lmc_kv_geometry *geo = &bg->g->geo;
        uint64_t row = (uint64_t)geo->hs * geo->element_size;
        s.rows |= row;
        s.bits |= p->group_offset[g] | geo->block_stride * geo->element_size;
        for (uint32_t t = 0; t < lmc_cuda_tensors_needed(geo); t++)
            s.bits |= bg->tensors[t];
        if (bg->cos_sin) {
            uint64_t x = (uint64_t)geo->nl * bg->g->slots, n = (uint64_t)bg->rope.n_heads *
                                                                   (bg->rope.rot_dim / 2);
            rope_x = x > rope_x ? x : rope_x;
            rope_n = n > rope_n ? n : rope_n;
        }
        s.scatter_x = bg->g->slots > s.scatter_x ? bg->g->slots : s.scatter_x;
        uint32_t z = geo->kv_size * geo->nl;
        s.scatter_z = z > s.scatter_z ? z : s.scatter_z;
        sc_n = geo->nh * row > sc_n ? geo->nh * row : sc_n;   /* in bytes; units below */
    }
    sc_n /= lmc_cuda_copy_unit(s.rows, s.bits);   /* at least the final unit's count */
    s.rope_x = rope_x > 0x7fffffffu ? 0 : (uint32_t)rope_x;
    s.rope_threads = rope_n >= BLEND_THREADS ? BLEND_THREADS : (uint32_t)(rope_n + 31) / 32 * 32;
    s.scatter_threads = sc_n >= BLEND_THREADS ? BLEND_THREADS : (uint32_t)(sc_n + 31) / 32 * 32;
    return s;
}

/* The grid limits: y and z at most 65535 (rows of one wave, planes). */
static int check_shape(const lmc_cuda_blend *b, const blend_shape *s, char *err, size_t errlen)
{
    const lmc_kv_blend_plan *p = b->plan;
    int64_t prev_r = 0, prev_s = 0;
    for (uint64_t w = 0; w < p->n_waves; w++) {
        if (p->steps[w].ropes_end - prev_r > LMC_CUDA_MAX_GRID_YZ ||
            p->steps[w].scatters_end - prev_s > LMC_CUDA_MAX_GRID_YZ)
            return fail(err, errlen, "blend_execute: wave %llu has over %u rope or scatter rows",
                         (unsigned long long)w, LMC_CUDA_MAX_GRID_YZ);
        prev_r = p->steps[w].ropes_end;
        prev_s = p->steps[w].scatters_end;
    }
    if (s->scatter_z > LMC_CUDA_MAX_GRID_YZ || (p->n_ropes && s->rope_x == 0))
        return fail(err, errlen, "blend_execute: %u planes x layers, or too many K rows",
                     s->scatter_z);
    return 0;
}

/* ---- enqueue ------------------------------------------------------------ */

static int launch_scatter(const blend_shape *s, dim3 grid, const blend_args *a, cudaStream_t st,
                          char *err, size_t errlen)
{
    const void *fn;
    switch (s->unit) {
    case 16: fn = (const void *)lmc_cuda_blend_scatter_kernel<uint4>; break;
    case 8: fn = (const void *)lmc_cuda_blend_scatter_kernel<uint2>; break;
    case 4: fn = (const void *)lmc_cuda_blend_scatter_kernel<uint32_t>; break;
    case 2: fn = (const void *)lmc_cuda_blend_scatter_kernel<uint16_t>; break;
    default: fn = (const void *)lmc_cuda_blend_scatter_kernel<uint8_t>; break;
    }
    void *args[1] = {(void *)a};
    return bcheck(cudaLaunchKernel(fn, grid, dim3(s->scatter_threads), args, 0, st),
                  "scatter kernel launch", err, errlen);
}

/* Wave w: staging copies, the rope launch, the scatter launch. */
static int run_wave(const lmc_cuda_blend *b, const blend_shape *s, blend_args a, uint64_t w,
                    cudaStream_t st, char *err, size_t errlen)
{
    const lmc_kv_blend_plan *p = b->plan;
    lmc_kv_blend_step from = w ? p->steps[w - 1] : lmc_kv_blend_step{0, 0, 0};
    const lmc_kv_blend_step to = p->steps[w];
    for (int64_t i = from.staging_end; i < to.staging_end; i++) {
        const lmc_kv_blend_staging *r = &p->staging[i];
        if (bcheck(cudaMemcpyAsync(a.pool + r->dst_offset,
                                   b->objects[r->chunk * b->n_read + r->read], (size_t)r->nbytes,
                                   cudaMemcpyHostToDevice, st),
                   "cudaMemcpyAsync (object to slot)", err, errlen) != 0)
            return -1;
    }
    if (to.ropes_end > from.ropes_end) {
        a.first = from.ropes_end;
        void *args[1] = {(void *)&a};
        dim3 grid(s->rope_x, (uint32_t)(to.ropes_end - from.ropes_end));
        if (bcheck(cudaLaunchKernel((const void *)lmc_cuda_blend_rope_kernel, grid,
                                    dim3(s->rope_threads), args, 0, st),
                   "rope kernel launch", err, errlen) != 0)
            return -1;
    }
    if (to.scatters_end > from.scatters_end && s->scatter_x > 0) {
        a.first = from.scatters_end;
        dim3 grid(s->scatter_x, (uint32_t)(to.scatters_end - from.scatters_end), s->scatter_z);
        return launch_scatter(s, grid, &a, st, err, errlen);
    }
    return 0;
}

static int enqueue(const lmc_cuda_blend *b, const blend_layout *l, blend_shape *s,
                   const uint8_t *host, cudaStream_t st, char *err, size_t errlen)
{
    uint8_t *dev = NULL;
    if (bcheck(cudaMallocAsync((void **)&dev, (size_t)l->end, st), "cudaMallocAsync", err,
               errlen) != 0)
        return -1;
    s->unit = lmc_cuda_copy_unit(s->rows, s->bits | (uint64_t)(uintptr_t)dev);
    int rc = bcheck(cudaMemcpyAsync(dev + l->groups, host, (size_t)(l->end - l->groups),
                                    cudaMemcpyHostToDevice, st),
                    "cudaMemcpyAsync (plan tables)", err, errlen);
    blend_args a;
    a.pool = dev;
    a.slot_stride = b->plan->slot_stride;
    a.groups = (const blend_group *)(dev + l->groups);
    a.tensors = (const uint64_t *)(dev + l->tensors);
    a.slot_map = (const int64_t *)(dev + l->slot_map);
    a.n_pos = b->plan->n_pos;
    a.ropes = (const lmc_kv_blend_rope *)(dev + l->ropes);
    a.scatters = (const lmc_kv_blend_scatter *)(dev + l->scatters);
    a.first = 0;
    for (uint64_t w = 0; rc == 0 && w < b->plan->n_waves; w++)
        rc = run_wave(b, s, a, w, st, err, errlen);
    if (cudaFreeAsync(dev, st) != cudaSuccess)
        (void)cudaGetLastError();
    return rc;
}

int lmc_cuda_blend_run(cudaStream_t st, const lmc_cuda_blend *b, char *err, size_t errlen)
{
    uint64_t pool_bytes = 0;
    if (check_blend(b, &pool_bytes, err, errlen) != 0)
        return -1;
    if (b->plan->n_waves == 0)
        return 0;   /* an empty plan: nothing to enqueue */
    blend_shape s = shape_of(b);
    if (check_shape(b, &s, err, errlen) != 0)
        return -1;
    blend_layout l = layout_of(b, pool_bytes);
    uint8_t *host = (uint8_t *)calloc(1, (size_t)(l.end - l.groups));
    if (!host)
        return fail(err, errlen, "blend_execute: out of memory");
    fill_tables(b, &l, host);
    /* a pageable source: the copy has taken the bytes when it returns */
    int rc = enqueue(b, &l, &s, host, st, err, errlen);
    free(host);
    return rc;
}
