/* Decoding a multi-group engine-driven registration (group_wire.h).  The
 * checks follow what upstream's server checks, so that a payload one
 * refuses the other refuses too, plus the bounds every network input gets
 * here (docs/protocol.md, "Engine-driven multi-group layouts"). */
#include "modules/transfer/engine/group_wire.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rpc/wire.h"

#define MAX_FORMAT 16                 /* the engine KV formats a client may name */
#define MAX_ENTRY_BYTES (1ull << 40)  /* far above any real chunk; keeps sums exact */
#define MAX_ENGINE_GROUPS LMC_KV_MAX_KERNEL_GROUPS

/* The wire structs' fields in declaration order: a map names them, an
 * array (msgspec's array_like encoding) lists them in this order. */
enum { TM_SW, TM_TOKENS, TM_KGS, TM_OGS, TM_FIELDS };
static const char *const tm_names[TM_FIELDS] = {"num_chunks_in_sw", "tokens_per_chunk",
                                                "kernel_groups", "object_groups"};
enum {
    KG_ID, KG_ENGINE_GROUP, KG_LAYERS, KG_BPC, KG_BPW, KG_SLOTS, KG_KV, KG_NL, KG_HIDDEN,
    KG_SPB, KG_TPB, KG_DTYPE, KG_FORMAT, KG_FIELDS
};
static const char *const kg_names[KG_FIELDS] = {
    "kernel_group_id", "engine_group_id", "layer_indices", "blocks_per_chunk",
    "blocks_per_window", "slots_per_chunk_in_window", "kv_size", "num_layers",
    "hidden_dim_size", "slots_per_block", "tokens_per_block", "dtype_str",
    "engine_kv_format_int"};
enum { OG_ID, OG_MEMBERS, OG_SW, OG_FIELDS };
static const char *const og_names[OG_FIELDS] = {"object_group_id", "kernel_group_ids",
                                                "sw_size_chunks"};

typedef struct {
    int64_t engine_group, kv, nl, slots, hidden;
    const msgpack_object *layers;
    const char *dtype;
    size_t dtype_len;
} wire_kg;

typedef struct {
    char *err;
    size_t errlen;
} why;

static int refuse(why *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int refuse(why *w, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(w->err, w->errlen, fmt, ap);
    va_end(ap);
    return -1;
}

static const msgpack_object *field(const msgpack_object *o, const char *const *names, size_t i)
{
    if (o->type == MSGPACK_OBJECT_MAP)
        return lmc_mp_map_get(o, names[i]);
    if (o->type == MSGPACK_OBJECT_ARRAY && i < o->via.array.size)
        return &o->via.array.ptr[i];
    return NULL;
}

static bool int_in(const msgpack_object *o, int64_t lo, int64_t hi, int64_t *out)
{
    return o && o->type != MSGPACK_OBJECT_BOOLEAN && lmc_mp_get_int(o, out) && *out >= lo &&
           *out <= hi;
}

static const msgpack_object *array_of(const msgpack_object *o, uint32_t max)
{
    return o && o->type == MSGPACK_OBJECT_ARRAY && o->via.array.size <= max ? o : NULL;
}

static bool is_empty(const msgpack_object *o)
{
    return !o || lmc_mp_is_nil(o) || (o->type == MSGPACK_OBJECT_ARRAY && o->via.array.size == 0);
}

bool lmc_engine_driven_groups_present(const msgpack_object *p)
{
    return !is_empty(lmc_mp_map_get(p, "object_group_layout_shapes")) ||
           !is_empty(lmc_mp_map_get(p, "transfer_metadata_wire"));
}

/* An int field of kernel group idx in lo..hi, or the refusal naming it. */
static int kg_int(const msgpack_object *o, uint32_t idx, int f, int64_t lo, int64_t hi,
                  int64_t *out, why *w)
{
    if (int_in(field(o, kg_names, (size_t)f), lo, hi, out))
        return 0;
    return refuse(w, "kernel group %u: %s must be an int in %lld..%lld", idx, kg_names[f],
                  (long long)lo, (long long)hi);
}

static int decode_kg(const msgpack_object *o, uint32_t idx, uint32_t cs, wire_kg *kg, why *w)
{
    int64_t id, bpc, bpw, spb, tpb, format;
    if (!o || (o->type != MSGPACK_OBJECT_MAP && o->type != MSGPACK_OBJECT_ARRAY))
        return refuse(w, "kernel group %u is not a struct", idx);
    if (!int_in(field(o, kg_names, KG_ID), 0, LMC_KV_MAX_KERNEL_GROUPS, &id) || id != idx)
        return refuse(w, "kernel_groups[%u].kernel_group_id must be %u", idx, idx);
    kg->layers = array_of(field(o, kg_names, KG_LAYERS), LMC_KV_MAX_LAYERS);
    if (!kg->layers)
        return refuse(w, "kernel group %u: layer_indices must be a list of at most %d", idx,
                      LMC_KV_MAX_LAYERS);
    if (kg_int(o, idx, KG_ENGINE_GROUP, 0, INT32_MAX, &kg->engine_group, w) ||
        kg_int(o, idx, KG_KV, 1, 2, &kg->kv, w) ||
        kg_int(o, idx, KG_NL, 1, LMC_KV_MAX_LAYERS, &kg->nl, w) ||
        kg_int(o, idx, KG_SLOTS, 1, cs, &kg->slots, w) ||
        kg_int(o, idx, KG_HIDDEN, 1, 1 << 24, &kg->hidden, w) ||
        kg_int(o, idx, KG_BPC, 1, cs, &bpc, w) || kg_int(o, idx, KG_BPW, 1, bpc, &bpw, w) ||
        kg_int(o, idx, KG_SPB, 1, cs, &spb, w) || kg_int(o, idx, KG_TPB, spb, cs, &tpb, w) ||
        kg_int(o, idx, KG_FORMAT, 0, MAX_FORMAT, &format, w))
        return -1;
    const msgpack_object *dt = field(o, kg_names, KG_DTYPE);
    if (!dt || !lmc_mp_get_str(dt, &kg->dtype, &kg->dtype_len))
        return refuse(w, "kernel group %u: dtype_str must be a str", idx);
    if (tpb % spb != 0)
        return refuse(w, "kernel group %u: tokens_per_block %lld is not a multiple of "
                         "slots_per_block %lld", idx, (long long)tpb, (long long)spb);
    for (uint32_t i = 0; i < kg->layers->via.array.size; i++) {
        int64_t layer;
        if (!int_in(&kg->layers->via.array.ptr[i], 0, LMC_KV_MAX_LAYERS - 1, &layer))
            return refuse(w, "kernel group %u: layer_indices must be ints in 0..%d", idx,
                          LMC_KV_MAX_LAYERS - 1);
    }
    if (lmc_dtype_itemsize(kg->dtype, kg->dtype_len) == 0 ||
        kg->dtype_len >= LMC_LAYOUT_DTYPE_MAX)
        return refuse(w, "kernel group %u: unsupported dtype_str '%.*s'", idx,
                      (int)(kg->dtype_len < 32 ? kg->dtype_len : 32), kg->dtype);
    return 0;
}

/* Group og's members (kernel group ids) into g->first / member order. */
static int decode_og(const msgpack_object *o, uint32_t idx, uint32_t n_kg, bool *used,
                     uint32_t *members, uint32_t *n_members, int64_t *sw, why *w)
{
    int64_t id;
    if (!o || (o->type != MSGPACK_OBJECT_MAP && o->type != MSGPACK_OBJECT_ARRAY))
        return refuse(w, "object group %u is not a struct", idx);
    const msgpack_object *ids = array_of(field(o, og_names, OG_MEMBERS), n_kg);
    if (!int_in(field(o, og_names, OG_ID), 0, LMC_LAYOUT_MAX_GROUPS, &id) || id != idx)
        return refuse(w, "object_groups[%u].object_group_id must be %u", idx, idx);
    if (!ids || ids->via.array.size == 0)
        return refuse(w, "object group %u: kernel_group_ids must list 1..%u kernel groups", idx,
                      n_kg);
    if (!int_in(field(o, og_names, OG_SW), -1, INT32_MAX, sw) || *sw == 0)
        return refuse(w, "object group %u: sw_size_chunks must be -1 or positive", idx);
    *n_members = ids->via.array.size;
    for (uint32_t i = 0; i < *n_members; i++) {
        int64_t k;
        if (!int_in(&ids->via.array.ptr[i], 0, (int64_t)n_kg - 1, &k))
            return refuse(w, "object group %u names kernel group outside 0..%u", idx, n_kg - 1);
        if (used[k])
            return refuse(w, "kernel group %lld belongs to more than one object group",
                          (long long)k);
        used[k] = true;
        members[i] = (uint32_t)k;
    }
    return 0;
}

/* The per-engine-group layer lists of the infos and of the kernel groups
 * must be the same lists in the same order (upstream's check 6). */
static int append_layers(const msgpack_object *layers, int64_t *out, size_t *n, why *w)
{
    for (uint32_t i = 0; layers && i < layers->via.array.size; i++) {
        if (*n == LMC_KV_MAX_LAYERS)
            return refuse(w, "more than %d layers listed", LMC_KV_MAX_LAYERS);
        if (!int_in(&layers->via.array.ptr[i], 0, LMC_KV_MAX_LAYERS - 1, &out[(*n)++]))
            return refuse(w, "layer_indices must be ints in 0..%d", LMC_KV_MAX_LAYERS - 1);
    }
    return 0;
}

typedef struct {
    int64_t order[MAX_ENGINE_GROUPS];
    size_t n;
} eg_order;

static int note_group(eg_order *o, int64_t eg, why *w)
{
    for (size_t i = 0; i < o->n; i++)
        if (o->order[i] == eg)
            return 0;
    if (o->n == MAX_ENGINE_GROUPS)
        return refuse(w, "more than %d engine groups", MAX_ENGINE_GROUPS);
    o->order[o->n++] = eg;
    return 0;
}

static int check_infos(const msgpack_object *infos, const wire_kg *kg, uint32_t n_kg, why *w)
{
    if (is_empty(infos))
        return 0;
    if (!array_of(infos, LMC_KV_MAX_LAYERS))
        return refuse(w, "engine_group_infos must be an array");
    eg_order a = {0}, b = {0};
    int64_t *la = malloc(2 * LMC_KV_MAX_LAYERS * sizeof *la), *lb = la + LMC_KV_MAX_LAYERS;
    size_t na = 0, nb = 0;
    int rc = la ? 0 : refuse(w, "out of memory");
    for (uint32_t i = 0; rc == 0 && i < infos->via.array.size; i++) {
        const msgpack_object *e = &infos->via.array.ptr[i];
        int64_t eg;
        if (e->type != MSGPACK_OBJECT_MAP ||
            !int_in(lmc_mp_map_get(e, "engine_group_id"), 0, INT32_MAX, &eg))
            rc = refuse(w, "engine_group_infos[%u] needs an engine_group_id", i);
        else
            rc = note_group(&a, eg, w);
    }
    for (uint32_t k = 0; rc == 0 && k < n_kg; k++)
        rc = note_group(&b, kg[k].engine_group, w);
    if (rc == 0 && (a.n != b.n || memcmp(a.order, b.order, a.n * sizeof a.order[0]) != 0))
        rc = refuse(w, "engine_group_infos and the kernel groups order engine groups "
                       "differently");
    for (size_t g = 0; rc == 0 && g < a.n; g++) {
        na = nb = 0;
        for (uint32_t i = 0; rc == 0 && i < infos->via.array.size; i++) {
            const msgpack_object *e = &infos->via.array.ptr[i];
            int64_t eg;
            lmc_mp_get_int(lmc_mp_map_get(e, "engine_group_id"), &eg);
            const msgpack_object *l = lmc_mp_map_get(e, "layer_indices");
            if (eg == a.order[g])
                rc = l && !array_of(l, LMC_KV_MAX_LAYERS)
                         ? refuse(w, "engine_group_infos[%u].layer_indices must be an array", i)
                         : append_layers(l, la, &na, w);
        }
        for (uint32_t k = 0; rc == 0 && k < n_kg; k++)
            if (kg[k].engine_group == a.order[g])
                rc = append_layers(kg[k].layers, lb, &nb, w);
        if (rc == 0 && (na != nb || memcmp(la, lb, na * sizeof *la) != 0))
            rc = refuse(w, "engine group %lld: engine_group_infos and the kernel groups list "
                           "different layers", (long long)a.order[g]);
    }
    free(la);
    return rc;
}

/* The entry of kernel group kg as the payload's layout lists it: its
 * [kv, layers, slots, hidden] shape (or [layers, slots, hidden] for a
 * single plane) and dtype must be what the transfer metadata says. */
static int decode_entry(const msgpack_object *shape, const msgpack_object *dtype,
                        const wire_kg *kg, uint32_t og, uint32_t k, lmc_engine_driven_entry *e, why *w)
{
    const int64_t full[4] = {kg->kv, kg->nl, kg->slots, kg->hidden};
    const msgpack_object *s = array_of(shape, LMC_LAYOUT_MAX_DIMS);
    const char *d;
    size_t dlen;
    if (!s || (s->via.array.size != 4 && !(s->via.array.size == 3 && kg->kv == 1)))
        return refuse(w, "object group %u entry %u: the shape must be [kv_size, num_layers, "
                         "slots, hidden_dim_size]", og, k);
    e->ndim = s->via.array.size;
    for (uint32_t i = 0; i < e->ndim; i++) {
        int64_t v;
        if (!int_in(&s->via.array.ptr[i], 1, INT32_MAX, &v) || v != full[i + 4 - e->ndim])
            return refuse(w, "object group %u entry %u: the shape does not match the transfer "
                             "metadata", og, k);
        e->shape[i] = (uint64_t)v;
    }
    if (!dtype || !lmc_mp_get_str(dtype, &d, &dlen) || dlen != kg->dtype_len ||
        memcmp(d, kg->dtype, dlen) != 0)
        return refuse(w, "object group %u entry %u: the dtype does not match the transfer "
                         "metadata", og, k);
    memcpy(e->dtype, d, dlen);
    e->dtype[dlen] = '\0';
    e->bytes = (uint64_t)kg->kv * (uint64_t)kg->nl * (uint64_t)kg->slots *
               (uint64_t)kg->hidden * lmc_dtype_itemsize(d, dlen);
    if (e->bytes > MAX_ENTRY_BYTES)
        return refuse(w, "object group %u entry %u is larger than 1 TiB", og, k);
    return 0;
}

/* The payload's per-group shapes and dtypes, entry by entry. */
static int decode_layouts(const msgpack_object *p, const wire_kg *kg, const uint32_t *members,
                          lmc_engine_driven_groups *g, why *w)
{
    const msgpack_object *shapes = array_of(lmc_mp_map_get(p, "object_group_layout_shapes"),
                                            LMC_LAYOUT_MAX_GROUPS);
    const msgpack_object *dtypes =
        array_of(lmc_mp_map_get(p, "object_group_layout_dtype_strs"), LMC_LAYOUT_MAX_GROUPS);
    if (!shapes || !dtypes || shapes->via.array.size != g->n_groups ||
        dtypes->via.array.size != g->n_groups)
        return refuse(w, "object_group_layout_shapes and object_group_layout_dtype_strs must "
                         "have one entry per object group (%u)", g->n_groups);
    for (uint32_t og = 0; og < g->n_groups; og++) {
        uint32_t n = g->first[og + 1] - g->first[og];
        const msgpack_object *s = array_of(&shapes->via.array.ptr[og], n);
        const msgpack_object *d = array_of(&dtypes->via.array.ptr[og], n);
        if (!s || !d || s->via.array.size != n || d->via.array.size != n)
            return refuse(w, "object group %u: one shape and one dtype per kernel group (%u)",
                          og, n);
        uint64_t offset = 0;
        for (uint32_t k = 0; k < n; k++) {
            lmc_engine_driven_entry *e = &g->entries[g->first[og] + k];
            if (decode_entry(&s->via.array.ptr[k], &d->via.array.ptr[k],
                             &kg[members[g->first[og] + k]], og, k, e, w) != 0)
                return -1;
            e->offset = offset;
            offset += e->bytes;
        }
    }
    return 0;
}

/* num_chunks_in_sw: the wire's, which the payload's top-level copy (when
 * sent) must equal, and each group's sw_size_chunks too. */
static int decode_windows(const msgpack_object *p, const msgpack_object *tm,
                          const int64_t *og_sw, lmc_engine_driven_groups *g, why *w)
{
    const msgpack_object *wire = array_of(field(tm, tm_names, TM_SW), LMC_LAYOUT_MAX_GROUPS);
    const msgpack_object *top = lmc_mp_map_get(p, "num_chunks_in_sw");
    if (!wire || wire->via.array.size != g->n_groups)
        return refuse(w, "transfer_metadata_wire.num_chunks_in_sw must have one entry per "
                         "object group (%u)", g->n_groups);
    if (!is_empty(top) && (!array_of(top, LMC_LAYOUT_MAX_GROUPS) ||
                           top->via.array.size != g->n_groups))
        return refuse(w, "num_chunks_in_sw must have one entry per object group (%u)",
                      g->n_groups);
    for (uint32_t og = 0; og < g->n_groups; og++) {
        int64_t v, t;
        if (!int_in(&wire->via.array.ptr[og], -1, INT32_MAX, &v) || v == 0 || v != og_sw[og])
            return refuse(w, "object group %u: sw_size_chunks does not match num_chunks_in_sw",
                          og);
        if (!is_empty(top) && (!int_in(&top->via.array.ptr[og], -1, INT32_MAX, &t) || t != v))
            return refuse(w, "object group %u: num_chunks_in_sw differs from the transfer "
                             "metadata's", og);
        g->chunks_in_sw[og] = (int32_t)v;
    }
    return 0;
}

static int decode_all(const msgpack_object *p, uint32_t cs, lmc_engine_driven_groups *g, wire_kg *kg,
                      why *w)
{
    const msgpack_object *tm = lmc_mp_map_get(p, "transfer_metadata_wire");
    int64_t tokens, og_sw[LMC_LAYOUT_MAX_GROUPS];
    if (is_empty(tm) || (tm->type != MSGPACK_OBJECT_MAP && tm->type != MSGPACK_OBJECT_ARRAY))
        return refuse(w, "a multi-group registration needs transfer_metadata_wire");
    if (!int_in(field(tm, tm_names, TM_TOKENS), 1, INT64_MAX, &tokens) || tokens != cs)
        return refuse(w, "transfer_metadata_wire.tokens_per_chunk must equal the server's "
                         "chunk size %u", cs);
    const msgpack_object *kgs = array_of(field(tm, tm_names, TM_KGS), LMC_KV_MAX_KERNEL_GROUPS);
    const msgpack_object *ogs = array_of(field(tm, tm_names, TM_OGS), LMC_LAYOUT_MAX_GROUPS);
    if (!kgs || !ogs || kgs->via.array.size == 0 || ogs->via.array.size == 0)
        return refuse(w, "transfer_metadata_wire needs 1..%d kernel groups and 1..%d object "
                         "groups", LMC_KV_MAX_KERNEL_GROUPS, LMC_LAYOUT_MAX_GROUPS);
    uint32_t n_kg = kgs->via.array.size, members[LMC_KV_MAX_KERNEL_GROUPS];
    for (uint32_t k = 0; k < n_kg; k++)
        if (decode_kg(&kgs->via.array.ptr[k], k, cs, &kg[k], w) != 0)
            return -1;
    bool used[LMC_KV_MAX_KERNEL_GROUPS] = {0};
    g->n_groups = ogs->via.array.size;
    for (uint32_t og = 0; og < g->n_groups; og++) {
        uint32_t n = 0;
        if (decode_og(&ogs->via.array.ptr[og], og, n_kg, used, members + g->first[og], &n,
                      &og_sw[og], w) != 0)
            return -1;
        g->first[og + 1] = g->first[og] + n;
    }
    if (g->first[g->n_groups] != n_kg)
        return refuse(w, "every kernel group must belong to an object group");
    if (decode_windows(p, tm, og_sw, g, w) != 0 ||
        check_infos(lmc_mp_map_get(p, "engine_group_infos"), kg, n_kg, w) != 0)
        return -1;
    return decode_layouts(p, kg, members, g, w);
}

lmc_engine_driven_groups *lmc_engine_driven_groups_decode(const msgpack_object *p, uint32_t cs, lmc_layout *layout,
                                    char *err, size_t errlen)
{
    why w = {err, errlen};
    lmc_engine_driven_groups *g = calloc(1, sizeof *g);
    wire_kg *kg = calloc(LMC_KV_MAX_KERNEL_GROUPS, sizeof *kg);
    if (!g || !kg) {
        refuse(&w, "out of memory");
        goto fail;
    }
    if (decode_all(p, cs, g, kg, &w) != 0)
        goto fail;
    uint64_t sizes[LMC_LAYOUT_MAX_GROUPS];
    for (uint32_t og = 0; og < g->n_groups; og++) {
        const lmc_engine_driven_entry *last = &g->entries[g->first[og + 1] - 1];
        sizes[og] = last->offset + last->bytes;
    }
    const lmc_engine_driven_entry *e0 = &g->entries[0];
    uint32_t kv = e0->ndim == 3 ? 1 : (uint32_t)e0->shape[0], off = e0->ndim == 3 ? 1 : 0;
    bool plain = g->n_groups == 1 && g->first[1] == 1 && e0->shape[2 - off] == cs;
    if (lmc_layout_for_groups(layout, cs, plain, kv, (uint32_t)e0->shape[1 - off],
                              (uint32_t)e0->shape[2 - off], (uint32_t)e0->shape[3 - off],
                              e0->dtype, g->n_groups, sizes, g->chunks_in_sw, err, errlen) != 0)
        goto fail;
    free(kg);
    atomic_init(&g->refs, 1);
    return g;
fail:
    free(kg);
    free(g);
    return NULL;
}

lmc_engine_driven_groups *lmc_engine_driven_groups_ref(lmc_engine_driven_groups *g)
{
    if (g)
        atomic_fetch_add(&g->refs, 1);
    return g;
}

void lmc_engine_driven_groups_unref(lmc_engine_driven_groups *g)
{
    if (g && atomic_fetch_sub(&g->refs, 1) == 1)
        free(g);
}

size_t lmc_engine_driven_groups_window_start(const lmc_engine_driven_groups *g, uint32_t og, size_t n)
{
    int32_t w = g->chunks_in_sw[og];
    return w < 0 || (size_t)w >= n ? 0 : n - (size_t)w;
}
