/* Decoding the P2P serving ops' arguments (docs/p2p.md, "Serving side"):
 * ObjectKey maps and the object sizes of group_layout_descs. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <string.h>

#include "modules/p2p/p2p_wire.h"
#include "rpc/wire.h"

typedef struct {
    msgpack_sbuffer sb;
    msgpack_packer pk;
    msgpack_unpacked up;
} doc;

static void doc_begin(doc *d)
{
    msgpack_sbuffer_init(&d->sb);
    msgpack_packer_init(&d->pk, &d->sb, msgpack_sbuffer_write);
    msgpack_unpacked_init(&d->up);
}

static const msgpack_object *doc_end(doc *d)
{
    assert_int_equal(msgpack_unpack_next(&d->up, d->sb.data, d->sb.size, NULL),
                     MSGPACK_UNPACK_SUCCESS);
    return &d->up.data;
}

static void doc_free(doc *d)
{
    msgpack_unpacked_destroy(&d->up);
    msgpack_sbuffer_destroy(&d->sb);
}

/* {group: {"shapes": [shape], "dtypes": [dtype]}} with one tensor per entry. */
static void pack_desc(msgpack_packer *pk, size_t n, const int64_t (*shapes)[3],
                      const char *const *dtypes)
{
    msgpack_pack_map(pk, 2);
    lmc_mp_pack_cstr(pk, "shapes");
    msgpack_pack_array(pk, (uint32_t)n);
    for (size_t t = 0; t < n; t++) {
        msgpack_pack_array(pk, 3);
        for (int d = 0; d < 3; d++)
            msgpack_pack_int64(pk, shapes[t][d]);
    }
    lmc_mp_pack_cstr(pk, "dtypes");
    msgpack_pack_array(pk, (uint32_t)n);
    for (size_t t = 0; t < n; t++)
        lmc_mp_pack_cstr(pk, dtypes[t]);
}

static int decode_one(const int64_t (*shapes)[3], const char *const *dtypes, size_t n,
                      uint64_t *size)
{
    doc d;
    doc_begin(&d);
    msgpack_pack_map(&d.pk, 1);
    msgpack_pack_int(&d.pk, 3);
    pack_desc(&d.pk, n, shapes, dtypes);
    lmc_p2p_serve_group_size gs[4];
    size_t got = 0;
    char err[256];
    int rc = lmc_p2p_serve_decode_layouts(doc_end(&d), gs, 4, &got, err, sizeof err);
    if (rc == 0) {
        assert_int_equal(got, 1);
        assert_int_equal(gs[0].group, 3);
        *size = gs[0].size;
    }
    doc_free(&d);
    return rc;
}

static void test_layout_sizes(void **st)
{
    (void)st;
    const int64_t two[2][3] = {{2, 4, 16}, {1, 3, 5}};
    const char *const names[2] = {"bfloat16", "torch.float32"};
    uint64_t size = 0;
    assert_int_equal(decode_one(two, names, 2, &size), 0);
    assert_int_equal(size, 2 * 4 * 16 * 2 + 1 * 3 * 5 * 4);
    const int64_t negative[1][3] = {{2, -1, 4}};
    assert_int_equal(decode_one(negative, names, 1, &size), -1);
    const int64_t huge[1][3] = {{INT64_MAX, INT64_MAX, 2}};
    assert_int_equal(decode_one(huge, names, 1, &size), -1);
    const int64_t fits[1][3] = {{1, 1, (int64_t)1 << 61}};
    const char *const f64[1] = {"float32"};      /* 2^63 bytes: fits */
    assert_int_equal(decode_one(fits, f64, 1, &size), 0);
    const int64_t over[1][3] = {{1, 2, (int64_t)1 << 61}};   /* 2^64 bytes: does not */
    assert_int_equal(decode_one(over, f64, 1, &size), -1);
    const char *const unknown[1] = {"complex128"};
    assert_int_equal(decode_one(fits, unknown, 1, &size), -1);
}

static void test_layouts_none_empty_and_bounded(void **st)
{
    (void)st;
    lmc_p2p_serve_group_size gs[2];
    size_t n = 9;
    char err[256];
    assert_int_equal(lmc_p2p_serve_decode_layouts(NULL, gs, 2, &n, err, sizeof err), 0);
    assert_int_equal(n, 0);
    doc d;
    doc_begin(&d);
    msgpack_pack_map(&d.pk, 3);
    for (int g = 0; g < 3; g++) {
        msgpack_pack_int(&d.pk, g);
        msgpack_pack_nil(&d.pk);
    }
    assert_int_equal(lmc_p2p_serve_decode_layouts(doc_end(&d), gs, 2, &n, err, sizeof err), -1);
    assert_non_null(strstr(err, "at most 2"));
    doc_free(&d);
}

static void pack_key(msgpack_packer *pk, const char *model, const char *salt, bool group)
{
    msgpack_pack_map(pk, 3 + (salt != NULL) + group);
    lmc_mp_pack_cstr(pk, "chunk_hash");
    msgpack_pack_bin(pk, 32);
    msgpack_pack_bin_body(pk, "0123456789abcdef0123456789abcdef", 32);
    lmc_mp_pack_cstr(pk, "model_name");
    lmc_mp_pack_cstr(pk, model);
    lmc_mp_pack_cstr(pk, "kv_rank");
    msgpack_pack_uint32(pk, 0x01000100);
    if (group) {
        lmc_mp_pack_cstr(pk, "object_group_id");
        msgpack_pack_int(pk, 2);
    }
    if (salt) {
        lmc_mp_pack_cstr(pk, "cache_salt");
        lmc_mp_pack_cstr(pk, salt);
    }
}

static int decode_key(lmc_key_interner *in, const char *model, const char *salt, bool group,
                      lmc_object_key *k)
{
    doc d;
    doc_begin(&d);
    pack_key(&d.pk, model, salt, group);
    char err[256];
    int rc = lmc_p2p_serve_decode_key(doc_end(&d), in, k, err, sizeof err);
    doc_free(&d);
    return rc;
}

static void test_keys_defaults_and_unknown_names(void **st)
{
    (void)st;
    lmc_key_interner *in = lmc_key_interner_new();
    const char *m = lmc_intern(in, "m", 1), *empty = lmc_intern(in, "", 0);
    lmc_object_key k;
    assert_int_equal(decode_key(in, "m", NULL, false, &k), 0);   /* defaults: 0, "" */
    assert_ptr_equal(k.model_name, m);
    assert_ptr_equal(k.cache_salt, empty);
    assert_int_equal(k.object_group_id, 0);
    assert_int_equal(k.kv_rank, 0x01000100);
    assert_int_equal(k.chunk_hash_len, 32);
    assert_memory_equal(k.chunk_hash, "0123456789abcdef", 16);
    lmc_keys_drop(&k, 1);
    assert_int_equal(decode_key(in, "m", "", true, &k), 0);
    assert_int_equal(k.object_group_id, 2);
    lmc_keys_drop(&k, 1);
    /* A model or salt never stored here: valid, but it names no object. */
    assert_int_equal(decode_key(in, "other", NULL, false, &k), 0);
    assert_null(k.model_name);
    assert_int_equal(decode_key(in, "m", "tenant", false, &k), 0);
    assert_null(k.model_name);
    assert_int_equal(lmc_key_interner_count(in), 2);          /* nothing interned */
    assert_int_equal(decode_key(in, "a@b", NULL, false, &k), -1);
    assert_int_equal(decode_key(in, "m", "a/b", false, &k), -1);
    lmc_intern_release(m);
    lmc_intern_release(empty);
    lmc_key_interner_free(in);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layout_sizes),
        cmocka_unit_test(test_layouts_none_empty_and_bounded),
        cmocka_unit_test(test_keys_defaults_and_unknown_names),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
