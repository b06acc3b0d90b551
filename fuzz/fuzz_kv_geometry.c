/* Fuzz target: a server-driven registration's claimed geometry (tensor
 * shapes, strides, offsets, segment sizes, layout hints, an engine group
 * info) through format detection, planning and span computation
 * (src/kv/kv_format.c, kv_plan.c, kv_copy.c), as REGISTER_KV_CACHE
 * runs them (docs/security.md, "Sizes from the wire").
 *
 * Whatever plan is accepted must keep every copy inside its memory: the
 * span of each kernel group is where its offset formulas end, each entry
 * lies inside its object, and where the registration's segment check
 * passes (the same arithmetic as register.c), a real gather and
 * scatter of a chunk between segments and an object of exactly their
 * claimed sizes stays in bounds (ASan watches in the fuzz build). */
#include "check.h"
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/checked.h"
#include "kv/kv_copy.h"
#include "kv/kv_plan.h"

#define MAX_TENSORS 4
#define COPY_LIMIT (1u << 20)   /* real copies only for memory this small */

typedef struct {
    const uint8_t *p, *end;
} reader;

static uint64_t take(reader *r, size_t n)
{
    uint64_t v = 0;
    for (size_t i = 0; i < n && r->p < r->end; i++)
        v |= (uint64_t)*r->p++ << (8 * i);
    return v;
}

/* Small values are the interesting ones most of the time; a flag byte
 * lets the fuzzer reach the full 64-bit range too. */
static int64_t number(reader *r)
{
    uint8_t kind = (uint8_t)take(r, 1);
    return kind & 1 ? (int64_t)take(r, 8) : (int64_t)(take(r, 2) % 4097);
}

static const struct {
    const char *name;
    uint32_t size;
} dtypes[] = {{"float16", 2}, {"float32", 4}, {"float8_e4m3fn", 1}, {"float64", 8}};

static void tensor(reader *r, lmc_shared_tensor *t)
{
    memset(t, 0, sizeof *t);
    t->wrapper = LMC_WRAPPER_CPU_SHM;
    uint8_t dt = (uint8_t)take(r, 1) % 4;
    strcpy(t->dtype, dtypes[dt].name);
    t->itemsize = dtypes[dt].size;
    t->ndim = 1 + (uint32_t)take(r, 1) % 6;
    for (uint32_t d = 0; d < t->ndim; d++)
        t->shape[d] = number(r);
    for (uint32_t d = 0; d < t->ndim; d++)
        t->stride[d] = number(r);
    t->storage_offset = number(r);
    t->storage_bytes = (uint64_t)number(r);
}

/* register.c's check: the group's span fits after the tensor's offset. */
static bool fits_segment(const lmc_shared_tensor *t, uint64_t span, uint64_t *off)
{
    return lmc_u64_of_i64(t->storage_offset, off) && lmc_mul_u64(*off, t->itemsize, off) &&
           *off <= t->storage_bytes && span <= t->storage_bytes - *off;
}

static void check_group(const lmc_kv_plan *p, const lmc_kv_kernel_group *g,
                        const lmc_shared_tensor *t, reader *r)
{
    const lmc_kv_geometry *geo = &g->geo;
    uint32_t es = geo->element_size;
    uint32_t last_kv = lmc_kv_format_kv_lists(geo->format) ? 0 : geo->kv_size - 1;
    uint32_t last_layer = lmc_kv_format_cross_layer(geo->format) ? geo->nl - 1 : 0;
    /* Offsets grow with every index, so the highest indices end the span. */
    uint64_t last = lmc_kv_paged_offset(geo, last_kv, last_layer, geo->nb - 1, geo->bs - 1,
                                        geo->nh - 1, geo->hs - 1);
    CHECK((last + 1) * es == g->span_bytes);
    const lmc_kv_object_group *og = &p->og[g->object_group];
    CHECK(g->entry_offset <= og->object_size && g->entry_bytes <= og->object_size - g->entry_offset);
    CHECK(g->slots == 0 ||
          (lmc_kv_object_offset(geo, g->slots, geo->kv_size - 1, geo->nl - 1, g->slots - 1,
                                geo->nh - 1, geo->hs - 1) + 1) * es == g->entry_bytes);

    uint64_t off[MAX_TENSORS];
    CHECK(g->n_tensors <= MAX_TENSORS);
    for (uint32_t i = 0; i < g->n_tensors; i++)
        if (!fits_segment(&t[g->tensors[i]], g->span_bytes, &off[i]))
            return;   /* the registration refuses it */
    if (t[0].storage_bytes > COPY_LIMIT ||
        og->object_size > COPY_LIMIT || g->keep_blocks == 0)
        return;
    uint8_t *segs[MAX_TENSORS], *bases[MAX_TENSORS];
    uint8_t *object = malloc(og->object_size);
    int64_t *blocks = malloc(g->keep_blocks * sizeof *blocks);
    CHECK(object && blocks);
    for (uint32_t i = 0; i < g->n_tensors; i++) {
        segs[i] = malloc(t[g->tensors[i]].storage_bytes);
        CHECK(segs[i]);
        memset(segs[i], 0x5a, t[g->tensors[i]].storage_bytes);
        bases[i] = segs[i] + off[i];
    }
    for (uint32_t j = 0; j < g->keep_blocks; j++)   /* ids the server checked < nb */
        blocks[j] = (int64_t)(take(r, 4) % geo->nb);
    lmc_kv_chunk_copy c = {.g = g, .bases = bases, .blocks = blocks,
                           .entry = object + g->entry_offset,
                           .skip_blocks = (uint32_t)take(r, 1) % (g->keep_blocks + 1),
                           .method = LMC_COPY_MEMCPY};
    lmc_kv_gather_chunk(&c);
    lmc_kv_scatter_chunk(&c);
    for (uint32_t i = 0; i < g->n_tensors; i++)
        free(segs[i]);
    free(object);
    free(blocks);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t len)
{
    reader r = {data, data + len};
    static const uint32_t chunks[] = {16, 32, 64, 256};
    uint8_t engine = (uint8_t)take(&r, 1), flags = (uint8_t)take(&r, 1);
    uint32_t n = 1 + (uint32_t)take(&r, 1) % MAX_TENSORS;
    lmc_kv_plan_options o = {
        .engine = engine % 3 == 1 ? LMC_ENGINE_SGLANG : engine % 3 == 2 ? LMC_ENGINE_TRTLLM
                                                                         : LMC_ENGINE_VLLM,
        .hnd = flags & 1, .force_hnd = flags & 2, .separate_object_groups = flags & 4,
        .chunk_size = chunks[(flags >> 3) & 3]};
    o.hints.kv_list_layout = (lmc_kv_list_layout)((flags >> 5) % 3);
    o.hints.tokens_per_block = number(&r);
    o.hints.num_kv_heads = number(&r);
    o.hints.head_dim = number(&r);
    uint32_t layers[MAX_TENSORS];
    lmc_engine_group_info info = {.layers = layers, .n_layers = n, .sw_size_tokens = -1,
                                  .has_null_block = true};
    for (uint32_t i = 0; i < n; i++)
        layers[i] = i;
    if (flags & 0x80) {   /* one engine group info over every layer */
        info.tokens_per_block = number(&r);
        info.sw_size_tokens = number(&r);
        info.physical_per_engine = number(&r);
        info.recurrent_state = engine & 0x10;   /* SGLang unified state groups */
        o.infos = &info;
        o.n_infos = 1;
    }
    lmc_shared_tensor t[MAX_TENSORS];
    tensor(&r, &t[0]);
    for (uint32_t i = 1; i < n; i++)
        t[i] = t[0];   /* registrations list layers of one kind */
    lmc_kv_plan p;
    char err[256];
    int rc = lmc_kv_plan_build(t, n, &o, &p, err, sizeof err);
    if (rc != 0) {
        CHECK(rc == -1 || rc == -2);
        CHECK(memchr(err, '\0', sizeof err) && (rc == -2 || err[0] != '\0'));
        return 0;
    }
    CHECK(p.n_kg >= 1 && p.n_og >= 1);
    for (uint32_t k = 0; k < p.n_kg; k++)
        check_group(&p, &p.kg[k], t, &r);
    lmc_kv_plan_free(&p);
    return 0;
}
