/* Wire encodings: what our packers emit must be what upstream's msgspec
 * emits (docs/protocol.md, "Serialization"), and the accessors must apply
 * its decoding rules (coercions only where msgspec coerces). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "rpc/wire.h"

typedef struct {
    msgpack_sbuffer sb;
    msgpack_packer pk;
} packbuf;

static void pb_init(packbuf *b)
{
    msgpack_sbuffer_init(&b->sb);
    msgpack_packer_init(&b->pk, &b->sb, msgpack_sbuffer_write);
}

static void expect_bytes(packbuf *b, const char *hex_bytes, size_t n)
{
    assert_int_equal(b->sb.size, n);
    assert_memory_equal(b->sb.data, hex_bytes, n);
    msgpack_sbuffer_destroy(&b->sb);
}

static void test_ints_use_the_smallest_form(void **state)
{
    (void)state;
    struct { int64_t v; const char *bytes; size_t n; } cases[] = {
        {0, "\x00", 1},
        {127, "\x7f", 1},
        {128, "\xcc\x80", 2},
        {256, "\xcd\x01\x00", 3},            /* GET_CHUNK_SIZE 256 */
        {65536, "\xce\x00\x01\x00\x00", 5},
        {2704798079673665322LL, "\xcf\x25\x89\x5f\x85\xd8\x1b\x87\x2a", 9}, /* 63-bit id */
        {-1, "\xff", 1},
        {-32, "\xe0", 1},
        {-33, "\xd0\xdf", 2},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        packbuf b;
        pb_init(&b);
        msgpack_pack_int64(&b.pk, cases[i].v);
        expect_bytes(&b, cases[i].bytes, cases[i].n);
    }
}

static void test_str_bin_float_bool_nil(void **state)
{
    (void)state;
    packbuf b;
    pb_init(&b);
    lmc_mp_pack_cstr(&b.pk, "OK");
    expect_bytes(&b, "\xa2OK", 3);                      /* NOOP reply */
    pb_init(&b);
    char s40[41];
    memset(s40, 'x', 40);
    s40[40] = 0;
    lmc_mp_pack_cstr(&b.pk, s40);                       /* str8, as msgspec */
    assert_int_equal((unsigned char)b.sb.data[0], 0xd9);
    assert_int_equal((unsigned char)b.sb.data[1], 40);
    msgpack_sbuffer_destroy(&b.sb);
    pb_init(&b);
    msgpack_pack_array(&b.pk, 2);                      /* (b"", True) */
    msgpack_pack_bin(&b.pk, 0);
    msgpack_pack_true(&b.pk);
    expect_bytes(&b, "\x92\xc4\x00\xc3", 4);
    pb_init(&b);
    msgpack_pack_double(&b.pk, 1.5);
    expect_bytes(&b, "\xcb\x3f\xf8\x00\x00\x00\x00\x00\x00", 9);
    pb_init(&b);
    msgpack_pack_array(&b.pk, 0);                      /* GET_EXPERIMENTAL [] */
    expect_bytes(&b, "\x90", 1);
    pb_init(&b);
    msgpack_pack_nil(&b.pk);
    expect_bytes(&b, "\xc0", 1);
}

/* A PREPARE_STORE reply as upstream encodes it (docs/protocol.md, "Serialization"). */
static void test_prepare_store_reply_example(void **state)
{
    (void)state;
    packbuf b;
    pb_init(&b);
    msgpack_packer *pk = &b.pk;
    msgpack_pack_map(pk, 1);
    lmc_mp_pack_cstr(pk, "context");
    msgpack_pack_map(pk, 2);
    lmc_mp_pack_cstr(pk, "slots");
    msgpack_pack_array(pk, 1);
    msgpack_pack_map(pk, 4);
    lmc_mp_pack_cstr(pk, "offset");
    msgpack_pack_uint64(pk, 0);
    lmc_mp_pack_cstr(pk, "length");
    msgpack_pack_uint64(pk, 8);
    lmc_mp_pack_cstr(pk, "shape");
    msgpack_pack_array(pk, 4);
    msgpack_pack_int(pk, 2);
    msgpack_pack_int(pk, 1);
    msgpack_pack_int(pk, 4);
    msgpack_pack_int(pk, 1);
    lmc_mp_pack_cstr(pk, "dtype");
    lmc_mp_pack_cstr(pk, "float16");
    lmc_mp_pack_cstr(pk, "chunk_indices");
    msgpack_pack_array(pk, 1);
    msgpack_pack_int(pk, 0);
    static const char expected[] =
        "\x81\xa7" "context" "\x82\xa5" "slots" "\x91\x84\xa6" "offset" "\x00\xa6" "length"
        "\x08\xa5" "shape" "\x94\x02\x01\x04\x01\xa5" "dtype" "\xa7" "float16"
        "\xad" "chunk_indices" "\x91\x00";
    expect_bytes(&b, expected, sizeof expected - 1);
}

static msgpack_object decode(msgpack_zone *z, const char *bytes, size_t n)
{
    msgpack_object o;
    size_t off = 0;
    assert_true(lmc_mp_validate((const uint8_t *)bytes, n, 8));
    assert_int_equal(msgpack_unpack(bytes, n, &off, z, &o), MSGPACK_UNPACK_SUCCESS);
    return o;
}

static void test_accessors_follow_msgspec_rules(void **state)
{
    (void)state;
    msgpack_zone z;
    msgpack_zone_init(&z, 1024);
    int64_t i;
    uint64_t u;
    double d;
    bool b;
    msgpack_object o = decode(&z, "\xcf\x25\x89\x5f\x85\xd8\x1b\x87\x2a", 9);
    assert_true(lmc_mp_get_int(&o, &i) && i == 2704798079673665322LL);
    o = decode(&z, "\xcf\xff\xff\xff\xff\xff\xff\xff\xff", 9);  /* > INT64_MAX */
    assert_false(lmc_mp_get_int(&o, &i));
    assert_true(lmc_mp_get_uint(&o, &u) && u == UINT64_MAX);
    o = decode(&z, "\xd0\xdf", 2);
    assert_true(lmc_mp_get_int(&o, &i) && i == -33);
    assert_false(lmc_mp_get_uint(&o, &u));
    o = decode(&z, "\xca\x3f\xc0\x00\x00", 5);                  /* float32 accepted */
    assert_true(lmc_mp_get_double(&o, &d) && d == 1.5);
    o = decode(&z, "\x05", 1);
    assert_true(lmc_mp_get_double(&o, &d) && d == 5.0);
    assert_true(lmc_mp_get_bool(&o, &b) == false);              /* 5 is not a bool */
    o = decode(&z, "\x01", 1);
    assert_true(lmc_mp_get_bool(&o, &b) && b);                  /* whole-frame bool: 0/1 */
    o = decode(&z, "\xc2", 1);
    assert_true(lmc_mp_get_bool(&o, &b) && !b);
    o = decode(&z, "\xa2OK", 3);
    const char *p;
    size_t n;
    assert_true(lmc_mp_get_str(&o, &p, &n) && n == 2 && memcmp(p, "OK", 2) == 0);
    assert_false(lmc_mp_get_bin(&o, (const uint8_t **)&p, &n)); /* str is never bytes */
    o = decode(&z, "\xa0", 1);                                  /* "": msgpack-c's ptr is NULL */
    assert_true(lmc_mp_get_str(&o, &p, &n) && n == 0 && p != NULL);
    o = decode(&z, "\xc4\x00", 2);                              /* b"" */
    assert_true(lmc_mp_get_bin(&o, (const uint8_t **)&p, &n) && n == 0 && p != NULL);
    o = decode(&z, "\x82\xa1" "a" "\x01\xa1" "b" "\xc0", 7);
    assert_non_null(lmc_mp_map_get(&o, "a"));
    assert_true(lmc_mp_is_nil(lmc_mp_map_get(&o, "b")));
    assert_null(lmc_mp_map_get(&o, "c"));
    msgpack_zone_destroy(&z);
}

static void test_validate_fast_path_edges(void **state)
{
    (void)state;
    /* array16 of ints mixing widths, then truncated variants */
    const char ok[] = "\xdc\x00\x05\x01\xcc\x80\xcd\x01\x00\xce\x00\x01\x00\x00\x7f";
    assert_true(lmc_mp_validate((const uint8_t *)ok, sizeof ok - 1, 4));
    for (size_t cut = 1; cut < sizeof ok - 1; cut++)
        assert_false(lmc_mp_validate((const uint8_t *)ok, cut, 4));
    const char extra[] = "\x91\x01\x02";                         /* trailing byte */
    assert_false(lmc_mp_validate((const uint8_t *)extra, 3, 4));
    const char nested[] = "\x92\x91\x01\x92\x02\x03";
    assert_true(lmc_mp_validate((const uint8_t *)nested, 6, 4));
    assert_false(lmc_mp_validate((const uint8_t *)nested, 6, 1));
}

/* The validator's depth limit is msgpack-c's: 32 open containers, empty
 * ones included (msgpack-c needs a stack slot to open any container), so
 * whatever it accepts unpacks. */
static void test_validate_depth_matches_msgpack_c(void **state)
{
    (void)state;
    for (int empty = 0; empty < 2; empty++) {
        for (int depth = 31; depth <= 34; depth++) {
            uint8_t buf[64];
            size_t n = 0;
            for (int i = 0; i < depth - 1; i++)
                buf[n++] = 0x91;                      /* [ ... ] of one element */
            if (empty) {
                buf[n++] = 0x80;                      /* {} innermost */
            } else {
                buf[n++] = 0x91;
                buf[n++] = 0x01;
            }
            msgpack_unpacked up;
            msgpack_unpacked_init(&up);
            size_t off = 0;
            bool unpacks = msgpack_unpack_next(&up, (const char *)buf, n, &off) ==
                           MSGPACK_UNPACK_SUCCESS;
            msgpack_unpacked_destroy(&up);
            assert_int_equal(unpacks, depth <= 32);
            assert_int_equal(lmc_mp_validate(buf, n, 32), unpacks);
        }
    }
}

static void test_pull_reader(void **state)
{
    (void)state;
    /* {"a": [1, 200, 300, 70000, 2^33], "b": None, "s": "hi", "n": -5} */
    const char doc[] = "\x84\xa1" "a" "\x95\x01\xcc\xc8\xcd\x01\x2c\xce\x00\x01\x11\x70"
                       "\xcf\x00\x00\x00\x02\x00\x00\x00\x00"
                       "\xa1" "b" "\xc0\xa1" "s" "\xa2" "hi" "\xa1" "n" "\xfb";
    lmc_mp_reader r;
    lmc_mpr_init(&r, (const uint8_t *)doc, sizeof doc - 1);
    uint32_t n;
    const char *p;
    size_t len;
    uint64_t v[5];
    int64_t i;
    assert_false(lmc_mpr_array(&r, &n));                 /* it is a map: nothing consumed */
    assert_true(lmc_mpr_map(&r, &n) && n == 4);
    assert_true(lmc_mpr_str(&r, &p, &len) && len == 1 && *p == 'a');
    assert_true(lmc_mpr_array(&r, &n) && n == 5);
    assert_int_equal(lmc_mpr_uints(&r, 5, UINT32_MAX, v), 4); /* 2^33 > max */
    assert_int_equal(v[0], 1);
    assert_int_equal(v[1], 200);
    assert_int_equal(v[2], 300);
    assert_int_equal(v[3], 70000);
    assert_true(lmc_mpr_skip(&r, 4));                    /* the rejected element */
    assert_true(lmc_mpr_str(&r, &p, &len));
    assert_true(lmc_mpr_nil(&r));
    assert_true(lmc_mpr_str(&r, &p, &len));
    assert_false(lmc_mpr_int(&r, &i));                   /* a str, not an int */
    assert_true(lmc_mpr_str(&r, &p, &len) && len == 2 && memcmp(p, "hi", 2) == 0);
    assert_true(lmc_mpr_str(&r, &p, &len));
    uint64_t u;
    assert_false(lmc_mpr_uint(&r, &u));                  /* negative */
    assert_true(lmc_mpr_int(&r, &i) && i == -5);
    assert_true(lmc_mpr_at_end(&r));
    /* Truncation anywhere is detected, and bools are never ints. */
    for (size_t cut = 0; cut < sizeof doc - 1; cut++) {
        lmc_mpr_init(&r, (const uint8_t *)doc, cut);
        assert_false(lmc_mpr_skip(&r, 4) && lmc_mpr_at_end(&r) && cut == sizeof doc - 1);
    }
    lmc_mpr_init(&r, (const uint8_t *)"\xc3", 1);
    assert_false(lmc_mpr_int(&r, &i));
    lmc_mpr_init(&r, (const uint8_t *)"\xd1\xff\x00", 3);  /* int16 -256 */
    assert_true(lmc_mpr_int(&r, &i) && i == -256);
    lmc_mpr_init(&r, (const uint8_t *)"\xdc\xff\xff\x01", 4); /* array16 too long */
    assert_false(lmc_mpr_array(&r, &n));
}

/* lmc_mpr_uints against msgpack-c on arrays mixing every width a non-negative
 * int can take, at every length around the 8-element blocks of its fast
 * path, with one element of another kind (too big, negative, a str, a
 * uint64) at every position, and every truncation: the count read, the
 * values and where the reader stops must all agree. */
static void test_uints_agree_with_msgpack_c(void **state)
{
    (void)state;
    static const uint64_t widths[] = {5, 127, 200, 255, 300, 65535, 70000, 0xffffffffull};
    enum { N = 40 };
    for (size_t odd = 0; odd <= N; odd++) {          /* odd == N: all good */
        for (int kind = 0; kind < 8; kind++) {       /* kind >= 4: only 5-byte ids */
            msgpack_sbuffer sb;
            msgpack_packer pk;
            msgpack_sbuffer_init(&sb);
            msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
            uint64_t want[N];
            for (size_t i = 0; i < N; i++) {
                want[i] = kind < 4 ? widths[(i * 5 + kind) % 8] : 70000 + i;
                if (i != odd)
                    msgpack_pack_uint64(&pk, want[i]);
                else if (kind % 4 == 0)
                    msgpack_pack_uint64(&pk, 1ull << 33);
                else if (kind % 4 == 1)
                    msgpack_pack_int64(&pk, -1);
                else if (kind % 4 == 2)
                    msgpack_pack_str_with_body(&pk, "x", 1);
                else   /* a small value in the 8-byte form: still an int <= max */
                    msgpack_sbuffer_write(&sb, "\xcf\0\0\0\0\0\0\0\x07", 9);
            }
            if (kind % 4 == 3 && odd < N)
                want[odd] = 7;
            size_t good = kind % 4 == 3 || odd == N ? N : odd;
            for (size_t cut = sb.size; cut > 0; cut--) {
                lmc_mp_reader r;
                uint64_t got[N];
                uint8_t *exact = malloc(cut);   /* reads past `cut` trip ASan */
                assert_non_null(exact);
                memcpy(exact, sb.data, cut);
                lmc_mpr_init(&r, exact, cut);
                size_t n = lmc_mpr_uints(&r, N, UINT32_MAX, got);
                /* whole elements that fit in `cut` bytes, up to the first bad one */
                size_t fit = 0, off = 0;
                while (fit < good) {
                    msgpack_unpacked u;
                    msgpack_unpacked_init(&u);
                    size_t at = off;
                    bool ok = msgpack_unpack_next(&u, sb.data, cut, &at) == MSGPACK_UNPACK_SUCCESS;
                    msgpack_unpacked_destroy(&u);
                    if (!ok)
                        break;
                    off = at;
                    fit++;
                }
                assert_int_equal(n, fit);
                assert_memory_equal(got, want, n * sizeof *got);
                assert_ptr_equal(r.p, exact + off);
                free(exact);
            }
            msgpack_sbuffer_destroy(&sb);
        }
    }
}


/* issue 17: error frames quote client bytes and are cut to a limit; what
 * comes out must decode as UTF-8 whatever went in. */
static void test_utf8_sanitize(void **state)
{
    (void)state;
    char out[16];
    /* valid text passes unchanged */
    assert_int_equal(lmc_utf8_sanitize(out, sizeof out, "ab\xc3\xa9\xe2\x82\xac", 7), 7);
    assert_string_equal(out, "ab\xc3\xa9\xe2\x82\xac");
    /* a cap inside a character stops before it: "x" + 7 x "é" = 15 bytes
     * do not fit 16 with the NUL... 14 do */
    const char *e7 = "x\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9";
    assert_int_equal(lmc_utf8_sanitize(out, 15, e7, strlen(e7)), 13);
    assert_memory_equal(out, e7, 13);
    assert_int_equal(out[13], 0);
    assert_int_equal(lmc_utf8_sanitize(out, 16, e7, strlen(e7)), 15);
    /* bytes that start no sequence become '?' */
    assert_int_equal(lmc_utf8_sanitize(out, sizeof out, "a\xff\xfe" "b\x80", 5), 5);
    assert_string_equal(out, "a??b?");
    /* overlong forms, surrogates and code points past U+10FFFF are invalid */
    lmc_utf8_sanitize(out, sizeof out, "\xc0\xaf\xed\xa0\x80\xf4\x90\x80\x80", 9);
    assert_string_equal(out, "?????????");
    /* a sequence the end cuts short is dropped, one the next byte breaks is not */
    assert_int_equal(lmc_utf8_sanitize(out, sizeof out, "ok\xe2\x82", 4), 2);
    assert_string_equal(out, "ok");
    assert_int_equal(lmc_utf8_sanitize(out, sizeof out, "\xe2\x82z", 3), 3);
    assert_string_equal(out, "??z");
    /* cap 1: just the NUL; cap 0 writes nothing */
    assert_int_equal(lmc_utf8_sanitize(out, 1, "abc", 3), 0);
    assert_string_equal(out, "");
    out[0] = 'q';
    assert_int_equal(lmc_utf8_sanitize(out, 0, "abc", 3), 0);
    assert_int_equal(out[0], 'q');
    /* every 4-byte input of these bytes comes out valid (checked by a
     * second pass, which must change nothing) */
    static const unsigned char bytes[] = {0x41, 0x80, 0xbf, 0xc2, 0xdf, 0xe0, 0xed, 0xef,
                                          0xf0, 0xf4, 0xf5, 0xff, 0xa0, 0x90, 0x8f, 0x00};
    for (size_t a = 0; a < 16; a++)
        for (size_t b = 0; b < 16; b++)
            for (size_t c = 0; c < 16; c++)
                for (size_t d = 0; d < 16; d++) {
                    char in[4] = {(char)bytes[a], (char)bytes[b], (char)bytes[c], (char)bytes[d]};
                    char once[16], twice[16];
                    size_t n = lmc_utf8_sanitize(once, sizeof once, in, 4);
                    assert_int_equal(lmc_utf8_sanitize(twice, sizeof twice, once, n), n);
                    assert_memory_equal(once, twice, n);
                }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ints_use_the_smallest_form),
        cmocka_unit_test(test_str_bin_float_bool_nil),
        cmocka_unit_test(test_prepare_store_reply_example),
        cmocka_unit_test(test_accessors_follow_msgspec_rules),
        cmocka_unit_test(test_validate_fast_path_edges),
        cmocka_unit_test(test_validate_depth_matches_msgpack_c),
        cmocka_unit_test(test_pull_reader),
        cmocka_unit_test(test_uints_agree_with_msgpack_c),
        cmocka_unit_test(test_utf8_sanitize),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
