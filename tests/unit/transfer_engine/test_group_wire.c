/* Multi-group engine-driven registrations (docs/protocol.md, "Engine-driven
 * multi-group layouts"): where each kernel group's entry lies in a chunk
 * object, the layout LOOKUP sees, the two encodings of the wire structs,
 * the single-group case that must equal the legacy layout, windows, and
 * what is refused. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "modules/transfer/engine/group_wire.h"
#include "rpc/wire.h"

#define CS 16

typedef struct {
    int id, eg, kv, nl, slots, hidden, bs;
    const char *dtype;
} kg_spec;

typedef struct {
    const kg_spec *kgs;
    int n_kg;
    const int (*members)[4];   /* per object group, -1 terminated */
    const int *sw;
    int n_og;
    bool arrays;               /* msgspec array_like wire structs */
    int tokens_per_chunk;
} spec;

static void str(msgpack_packer *pk, const char *s)
{
    lmc_mp_pack_cstr(pk, s);
}

static void pack_kg(msgpack_packer *pk, const kg_spec *k, int first_layer, bool arrays)
{
    const char *names[] = {"kernel_group_id", "engine_group_id", "layer_indices",
                           "blocks_per_chunk", "blocks_per_window",
                           "slots_per_chunk_in_window", "kv_size", "num_layers",
                           "hidden_dim_size", "slots_per_block", "tokens_per_block",
                           "dtype_str", "engine_kv_format_int"};
    int ints[] = {k->id, k->eg, 0, CS / k->bs, k->slots / k->bs, k->slots, k->kv, k->nl,
                  k->hidden, k->bs, k->bs, 0, 1};
    arrays ? msgpack_pack_array(pk, 13) : msgpack_pack_map(pk, 13);
    for (int f = 0; f < 13; f++) {
        if (!arrays)
            str(pk, names[f]);
        if (f == 2) {
            msgpack_pack_array(pk, k->nl);
            for (int l = 0; l < k->nl; l++)
                msgpack_pack_int(pk, first_layer + l);
        } else if (f == 11) {
            str(pk, k->dtype);
        } else {
            msgpack_pack_int(pk, ints[f]);
        }
    }
}

static int members_of(const spec *s, int og)
{
    int n = 0;
    while (n < 4 && s->members[og][n] >= 0)
        n++;
    return n;
}

static void pack_shape(msgpack_packer *pk, const kg_spec *k)
{
    bool plane = k->kv == 1;   /* sent as [layers, slots, hidden] */
    msgpack_pack_array(pk, plane ? 3 : 4);
    if (!plane)
        msgpack_pack_int(pk, k->kv);
    msgpack_pack_int(pk, k->nl);
    msgpack_pack_int(pk, k->slots);
    msgpack_pack_int(pk, k->hidden);
}

static void pack_wire(msgpack_packer *pk, const spec *s)
{
    s->arrays ? msgpack_pack_array(pk, 4) : msgpack_pack_map(pk, 4);
    if (!s->arrays)
        str(pk, "num_chunks_in_sw");
    msgpack_pack_array(pk, s->n_og);
    for (int g = 0; g < s->n_og; g++)
        msgpack_pack_int(pk, s->sw[g]);
    if (!s->arrays)
        str(pk, "tokens_per_chunk");
    msgpack_pack_int(pk, s->tokens_per_chunk);
    if (!s->arrays)
        str(pk, "kernel_groups");
    msgpack_pack_array(pk, s->n_kg);
    for (int k = 0, layer = 0; k < s->n_kg; layer += s->kgs[k].nl, k++)
        pack_kg(pk, &s->kgs[k], layer, s->arrays);
    if (!s->arrays)
        str(pk, "object_groups");
    msgpack_pack_array(pk, s->n_og);
    for (int g = 0; g < s->n_og; g++) {
        s->arrays ? msgpack_pack_array(pk, 3) : msgpack_pack_map(pk, 3);
        if (!s->arrays)
            str(pk, "object_group_id");
        msgpack_pack_int(pk, g);
        if (!s->arrays)
            str(pk, "kernel_group_ids");
        msgpack_pack_array(pk, members_of(s, g));
        for (int i = 0; i < members_of(s, g); i++)
            msgpack_pack_int(pk, s->members[g][i]);
        if (!s->arrays)
            str(pk, "sw_size_chunks");
        msgpack_pack_int(pk, s->sw[g]);
    }
}

/* The payload's object-group fields (the flat ones are not read here). */
static void pack_payload(msgpack_packer *pk, const spec *s)
{
    msgpack_pack_map(pk, 4);
    str(pk, "object_group_layout_shapes");
    msgpack_pack_array(pk, s->n_og);
    for (int g = 0; g < s->n_og; g++) {
        msgpack_pack_array(pk, members_of(s, g));
        for (int i = 0; i < members_of(s, g); i++)
            pack_shape(pk, &s->kgs[s->members[g][i]]);
    }
    str(pk, "object_group_layout_dtype_strs");
    msgpack_pack_array(pk, s->n_og);
    for (int g = 0; g < s->n_og; g++) {
        msgpack_pack_array(pk, members_of(s, g));
        for (int i = 0; i < members_of(s, g); i++)
            str(pk, s->kgs[s->members[g][i]].dtype);
    }
    str(pk, "num_chunks_in_sw");
    msgpack_pack_array(pk, s->n_og);
    for (int g = 0; g < s->n_og; g++)
        msgpack_pack_int(pk, s->sw[g]);
    str(pk, "transfer_metadata_wire");
    pack_wire(pk, s);
}

/* Decodes the payload of `s`; NULL with err when refused. */
static lmc_engine_driven_groups *decode(const spec *s, lmc_layout *layout, char *err, size_t errlen)
{
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    pack_payload(&pk, s);
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    size_t off = 0;
    assert_int_equal(msgpack_unpack_next(&u, sb.data, sb.size, &off), MSGPACK_UNPACK_SUCCESS);
    assert_true(lmc_engine_driven_groups_present(&u.data));
    lmc_engine_driven_groups *g = lmc_engine_driven_groups_decode(&u.data, CS, layout, err, errlen);
    msgpack_unpacked_destroy(&u);
    msgpack_sbuffer_destroy(&sb);
    return g;
}

/* Object group 0: two planes of 2 layers x 8, and a single bf16 plane of
 * 4; object group 1: a window of 8 slots kept per chunk, 1 chunk. */
static const kg_spec HYBRID[] = {{0, 0, 2, 2, CS, 8, 8, "float16"},
                                 {1, 1, 1, 1, CS, 4, 16, "bfloat16"},
                                 {2, 2, 2, 1, 8, 8, 8, "float16"}};
static const int HYBRID_MEMBERS[][4] = {{0, 1, -1}, {2, -1}};
static const int HYBRID_SW[] = {-1, 1};

static spec hybrid(bool arrays)
{
    return (spec){HYBRID, 3, HYBRID_MEMBERS, HYBRID_SW, 2, arrays, CS};
}

static void test_entries_offsets_and_layout(void **state)
{
    (void)state;
    char err[256] = "";
    lmc_layout l;
    spec s = hybrid(false);
    lmc_engine_driven_groups *g = decode(&s, &l, err, sizeof err);
    assert_non_null(g);
    assert_int_equal(g->n_groups, 2);
    assert_int_equal(g->first[0], 0);
    assert_int_equal(g->first[1], 2);
    assert_int_equal(g->first[2], 3);
    const lmc_engine_driven_entry *e = g->entries;
    assert_int_equal(e[0].offset, 0);
    assert_int_equal(e[0].bytes, 2 * 2 * CS * 8 * 2);
    assert_int_equal(e[0].ndim, 4);
    assert_int_equal(e[1].offset, e[0].bytes);             /* back to back, member order */
    assert_int_equal(e[1].bytes, 1 * 1 * CS * 4 * 2);
    assert_int_equal(e[1].ndim, 3);                         /* as the worker registered it */
    assert_string_equal(e[1].dtype, "bfloat16");
    assert_int_equal(e[2].offset, 0);                       /* another object */
    assert_int_equal(e[2].bytes, 2 * 1 * 8 * 8 * 2);
    assert_int_equal(l.num_groups, 2);
    assert_int_equal(l.group_sizes[0], e[0].bytes + e[1].bytes);
    assert_int_equal(l.group_sizes[1], e[2].bytes);
    assert_int_equal(l.object_size, l.group_sizes[0]);
    assert_int_equal(l.chunks_in_sw[0], -1);
    assert_int_equal(l.chunks_in_sw[1], 1);
    uint64_t shape[LMC_LAYOUT_MAX_DIMS] = {2, 2, CS, 8};
    assert_int_equal(l.ndim, 4);
    assert_memory_equal(l.shape, shape, sizeof shape);
    assert_string_equal(l.dtype, "float16");
    /* RETRIEVE windows: the window group reads only its last chunk */
    assert_int_equal(lmc_engine_driven_groups_window_start(g, 0, 4), 0);
    assert_int_equal(lmc_engine_driven_groups_window_start(g, 1, 4), 3);
    assert_int_equal(lmc_engine_driven_groups_window_start(g, 1, 1), 0);
    lmc_engine_driven_groups_unref(g);
}

static void assert_same_layout(const lmc_layout *a, const lmc_layout *b)
{
    assert_int_equal(a->object_size, b->object_size);
    assert_int_equal(a->ndim, b->ndim);
    assert_memory_equal(a->shape, b->shape, sizeof a->shape);
    assert_string_equal(a->dtype, b->dtype);
    assert_int_equal(a->num_layers, b->num_layers);
    assert_int_equal(a->hidden_dim, b->hidden_dim);
    assert_int_equal(a->use_mla, b->use_mla);
    assert_int_equal(a->num_groups, b->num_groups);
    assert_memory_equal(a->group_sizes, b->group_sizes, sizeof a->group_sizes);
    assert_memory_equal(a->chunks_in_sw, b->chunks_in_sw, sizeof a->chunks_in_sw);
}

static void test_array_form_reads_like_the_map_form(void **state)
{
    (void)state;
    char err[256] = "";
    lmc_layout a, b;
    spec sm = hybrid(false), sa = hybrid(true);
    lmc_engine_driven_groups *gm = decode(&sm, &a, err, sizeof err);
    lmc_engine_driven_groups *ga = decode(&sa, &b, err, sizeof err);
    assert_non_null(gm);
    assert_non_null(ga);
    assert_memory_equal(gm->entries, ga->entries, sizeof gm->entries);
    assert_memory_equal(gm->first, ga->first, sizeof gm->first);
    assert_same_layout(&a, &b);
    lmc_engine_driven_groups_unref(gm);
    lmc_engine_driven_groups_unref(ga);
}

static void test_one_plain_group_is_the_legacy_layout(void **state)
{
    (void)state;
    static const kg_spec one[] = {{0, 0, 2, 3, CS, 8, 8, "float16"}};
    static const int members[][4] = {{0, -1}};
    static const int sw[] = {-1};
    spec s = {one, 1, members, sw, 1, false, CS};
    char err[256] = "";
    lmc_layout got, want;
    lmc_engine_driven_groups *g = decode(&s, &got, err, sizeof err);
    assert_non_null(g);
    assert_int_equal(lmc_layout_build(&want, CS, 3, 8, "float16", 7, false, err, sizeof err), 0);
    assert_same_layout(&got, &want);
    lmc_engine_driven_groups_unref(g);
}

static void test_refused(void **state)
{
    (void)state;
    char err[256] = "";
    lmc_layout l;
    spec s = hybrid(false);
    s.tokens_per_chunk = 2 * CS;
    assert_null(decode(&s, &l, err, sizeof err));
    assert_non_null(strstr(err, "tokens_per_chunk"));
    static const int twice[][4] = {{0, 1, -1}, {1, -1}};   /* kernel group 1 twice, 2 never */
    s = hybrid(false);
    s.members = twice;
    assert_null(decode(&s, &l, err, sizeof err));
    assert_non_null(strstr(err, "more than one object group"));
    static const int zero_window[] = {-1, 0};
    s = hybrid(true);
    s.sw = zero_window;
    assert_null(decode(&s, &l, err, sizeof err));
    assert_non_null(strstr(err, "sw_size_chunks"));
    kg_spec bad[3];
    memcpy(bad, HYBRID, sizeof bad);
    bad[1].dtype = "complex64";
    s = hybrid(false);
    s.kgs = bad;
    assert_null(decode(&s, &l, err, sizeof err));
    assert_non_null(strstr(err, "dtype"));
}

static void test_present_only_with_object_group_fields(void **state)
{
    (void)state;
    msgpack_object_kv kv[2] = {
        {.key = {.type = MSGPACK_OBJECT_STR, .via.str = {26, "object_group_layout_shapes"}},
         .val = {.type = MSGPACK_OBJECT_ARRAY, .via.array = {0, NULL}}},
        {.key = {.type = MSGPACK_OBJECT_STR, .via.str = {22, "transfer_metadata_wire"}},
         .val = {.type = MSGPACK_OBJECT_NIL}}};
    msgpack_object map = {.type = MSGPACK_OBJECT_MAP, .via.map = {2, kv}};
    assert_false(lmc_engine_driven_groups_present(&map));   /* empty and nil: a legacy payload */
    kv[1].val.type = MSGPACK_OBJECT_MAP;
    kv[1].val.via.map = (msgpack_object_map){0, NULL};
    assert_true(lmc_engine_driven_groups_present(&map));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_entries_offsets_and_layout),
        cmocka_unit_test(test_array_form_reads_like_the_map_form),
        cmocka_unit_test(test_one_plain_group_is_the_legacy_layout),
        cmocka_unit_test(test_refused),
        cmocka_unit_test(test_present_only_with_object_group_fields),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
