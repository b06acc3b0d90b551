/* The core helpers (docs/architecture.md, "Libraries"): FNV-1a against
 * known vectors (the span trace ids and the RPC worker choice depend on
 * the exact numbers), the error buffer, hex, and the growable array. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "core/errbuf.h"
#include "core/fnv.h"
#include "core/grow.h"
#include "core/hex.h"

static void fnv_known_vectors(void **state)
{
    (void)state;
    assert_true(lmc_fnv1a64(LMC_FNV1A64_OFFSET_BASIS, "", 0) == 0xcbf29ce484222325ULL);
    assert_true(lmc_fnv1a64(LMC_FNV1A64_OFFSET_BASIS, "a", 1) == 0xaf63dc4c8601ec8cULL);
    assert_true(lmc_fnv1a64(LMC_FNV1A64_OFFSET_BASIS, "foobar", 6) == 0x85944171f73967e8ULL);
    assert_true(lmc_fnv1a64_str(LMC_FNV1A64_OFFSET_BASIS, "foobar") == 0x85944171f73967e8ULL);
    assert_true(lmc_fnv1a64_str(LMC_FNV1A64_SHORT_BASIS, "foobar") == 0x88fad7c0a8ff07f2ULL);
    /* Hashing in pieces is hashing the whole. */
    uint64_t h = lmc_fnv1a64(LMC_FNV1A64_OFFSET_BASIS, "foo", 3);
    assert_true(lmc_fnv1a64(h, "bar", 3) == 0x85944171f73967e8ULL);
}

static void errbuf_writes_and_returns_minus_one(void **state)
{
    (void)state;
    char err[16];
    assert_int_equal(lmc_err(err, sizeof err, "bad %d of %s", 3, "x"), -1);
    assert_string_equal(err, "bad 3 of x");
    assert_int_equal(lmc_err(err, 4, "truncated"), -1);
    assert_string_equal(err, "tru");
    assert_int_equal(lmc_err(NULL, 0, "dropped"), -1);
}

static void hex_round_trip_and_refusals(void **state)
{
    (void)state;
    const uint8_t bytes[] = {0x00, 0x9a, 0xff, 0x10};
    char text[2 * sizeof bytes + 1];
    lmc_hex_encode(bytes, sizeof bytes, text);
    assert_string_equal(text, "009aff10");
    uint8_t back[sizeof bytes];
    assert_true(lmc_hex_decode(text, sizeof back, back));
    assert_memory_equal(back, bytes, sizeof bytes);
    assert_false(lmc_hex_decode("0A", 1, back)); /* upper case has no place in a key */
    assert_false(lmc_hex_decode("g0", 1, back));
    assert_int_equal(lmc_hex_nibble('f'), 15);
    assert_int_equal(lmc_hex_nibble('F'), -1);
}

static void grow_doubles_from_first_capacity(void **state)
{
    (void)state;
    int *items = NULL;
    size_t cap = 0;
    assert_int_equal(lmc_grow_array((void **)&items, &cap, 1, sizeof *items, 4), 0);
    assert_int_equal(cap, 4);
    assert_int_equal(lmc_grow_array((void **)&items, &cap, 4, sizeof *items, 4), 0);
    assert_int_equal(cap, 4);
    assert_int_equal(lmc_grow_array((void **)&items, &cap, 5, sizeof *items, 4), 0);
    assert_int_equal(cap, 8);
    assert_int_equal(lmc_grow_array((void **)&items, &cap, 33, sizeof *items, 4), 0);
    assert_int_equal(cap, 64);
    items[32] = 7;
    /* A size that cannot be addressed leaves the array as it was. */
    int *before = items;
    assert_int_equal(lmc_grow_array((void **)&items, &cap, SIZE_MAX / 2, sizeof *items, 4), -1);
    assert_ptr_equal(items, before);
    assert_int_equal(cap, 64);
    assert_int_equal(items[32], 7);
    free(items);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(fnv_known_vectors),
        cmocka_unit_test(errbuf_writes_and_returns_minus_one),
        cmocka_unit_test(hex_round_trip_and_refusals),
        cmocka_unit_test(grow_doubles_from_first_capacity),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
