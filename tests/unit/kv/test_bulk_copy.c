/* Bulk copies (kv/bulk_copy.h): every way of copying leaves exactly
 * what memcpy leaves, the source bytes in [dst, dst+n) and nothing else
 * touched, for every length up to a few cache lines and a few large ones,
 * at every source misalignment 0..31 and destination misalignment 0..63
 * (the streaming kernels split a copy at dst's 64-byte line boundaries). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kv/bulk_copy.h"

/* The source holds values 0..250 only, so a destination byte still GUARD
 * was not written and a guard byte not GUARD was. */
enum { GUARD = 0xFF, SRC_MIS = 32, DST_MIS = 64, PAD = 64, SMALL_MAX = 300 };

typedef void (*copy_fn)(void *dst, const void *src, size_t n);

typedef struct {
    const char *name;
    copy_fn copy;
    bool needs_avx2;
} kernel;

static void via_memcpy(void *dst, const void *src, size_t n)
{
    lmc_bulk_copy(LMC_COPY_MEMCPY, dst, src, n);
}

static void via_stream(void *dst, const void *src, size_t n)
{
    lmc_bulk_copy(LMC_COPY_STREAM, dst, src, n);
    lmc_bulk_copy_fence(LMC_COPY_STREAM);
}

static void via_stream16(void *dst, const void *src, size_t n)
{
    lmc_bulk_copy_stream16(dst, src, n);
    lmc_bulk_copy_fence(LMC_COPY_STREAM);
}

static void via_stream32(void *dst, const void *src, size_t n)
{
    lmc_bulk_copy_stream32(dst, src, n);
    lmc_bulk_copy_fence(LMC_COPY_STREAM);
}

/* Prefetching the next copy's source (here its own, which is readable) is
 * a hint: the bytes must come out as memcpy's whether the prefetched span
 * is part of the copy or longer than it. */
static void via_ahead_part(void *dst, const void *src, size_t n)
{
    lmc_bulk_copy_ahead(LMC_COPY_STREAM, dst, src, n, src, n / 3 + 1);
    lmc_bulk_copy_fence(LMC_COPY_STREAM);
}

static void via_ahead_all(void *dst, const void *src, size_t n)
{
    lmc_bulk_copy_ahead(LMC_COPY_STREAM, dst, src, n, src, n + 100);
    lmc_bulk_copy_fence(LMC_COPY_STREAM);
}

static void via_ahead_memcpy(void *dst, const void *src, size_t n)
{
    lmc_bulk_copy_ahead(LMC_COPY_MEMCPY, dst, src, n, src, n / 2 + 1);
}

static const kernel kernels[] = {
    {"memcpy", via_memcpy, false},
    {"stream", via_stream, false},
    {"ahead_part", via_ahead_part, false},
    {"ahead_all", via_ahead_all, false},
    {"ahead_memcpy", via_ahead_memcpy, false},
    {"stream16", via_stream16, false},
    {"stream32", via_stream32, true},
};

typedef struct {
    uint8_t *src;   /* SRC_MIS + n bytes of pattern */
    uint8_t *dst;   /* PAD + DST_MIS + n + PAD bytes, GUARD between copies */
    size_t dst_len;
} bufs;

static bufs bufs_new(size_t n)
{
    bufs b = {.dst_len = PAD + DST_MIS + n + PAD};
    size_t src_len = (SRC_MIS + n + 63) & ~(size_t)63;
    b.src = aligned_alloc(64, src_len);
    b.dst = aligned_alloc(64, (b.dst_len + 63) & ~(size_t)63);
    assert_non_null(b.src);
    assert_non_null(b.dst);
    uint64_t x = 0x9e3779b97f4a7c15ULL;
    for (size_t i = 0; i < src_len; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        b.src[i] = (uint8_t)(x % 251);
    }
    memset(b.dst, GUARD, b.dst_len);
    return b;
}

static void bufs_free(bufs *b)
{
    free(b->src);
    free(b->dst);
}

/* Offset of the first byte of p[0, len) that is not `v`, or len. */
static size_t first_not(const uint8_t *p, size_t len, uint8_t v)
{
    for (size_t i = 0; i < len; i++)
        if (p[i] != v)
            return i;
    return len;
}

/* One copy of n bytes from src+sa to dst+PAD+da, checked, then undone. */
static void check_one(const kernel *k, bufs *b, size_t n, size_t sa, size_t da)
{
    uint8_t *dst = b->dst + PAD + da;
    const uint8_t *src = b->src + sa;
    k->copy(dst, src, n);
    size_t before = PAD + da, after = b->dst_len - before - n;
    if (first_not(b->dst, before, GUARD) != before)
        fail_msg("%s n=%zu sa=%zu da=%zu: wrote before dst", k->name, n, sa, da);
    if (first_not(dst + n, after, GUARD) != after)
        fail_msg("%s n=%zu sa=%zu da=%zu: wrote past dst+n", k->name, n, sa, da);
    if (n && memcmp(dst, src, n) != 0)
        fail_msg("%s n=%zu sa=%zu da=%zu: differs from memcpy", k->name, n, sa, da);
    memset(dst, GUARD, n);
}

static void check_size(bufs *b, size_t n, size_t dst_mis)
{
    for (size_t i = 0; i < sizeof kernels / sizeof kernels[0]; i++) {
        const kernel *k = &kernels[i];
        if (k->needs_avx2 && !lmc_bulk_copy_has_avx2())
            continue;
        for (size_t sa = 0; sa < SRC_MIS; sa++)
            for (size_t da = 0; da < dst_mis; da++)
                check_one(k, b, n, sa, da);
    }
}

static void test_small_sizes(void **state)
{
    (void)state;
    bufs b = bufs_new(SMALL_MAX);
    for (size_t n = 0; n <= SMALL_MAX; n++)
        check_size(&b, n, DST_MIS);
    bufs_free(&b);
}

/* A page, a large run with a ragged tail, and a whole chunk object with one.
 * The 2 MiB copies sweep destination misalignments 0..31 only, which keeps
 * the test at seconds: the line split they share with every other size was
 * swept over 0..63 above. */
static void test_big_sizes(void **state)
{
    (void)state;
    static const size_t sizes[] = {4096, 65536 + 13, (2u << 20) + 7};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        bufs b = bufs_new(sizes[i]);
        check_size(&b, sizes[i], sizes[i] > 65536 + 13 ? DST_MIS / 2 : DST_MIS);
        bufs_free(&b);
    }
}

/* An empty run of a gather may come with no buffer at all. */
static void test_empty_null(void **state)
{
    (void)state;
    lmc_bulk_copy(LMC_COPY_MEMCPY, NULL, NULL, 0);
    lmc_bulk_copy(LMC_COPY_STREAM, NULL, NULL, 0);
    lmc_bulk_copy_ahead(LMC_COPY_STREAM, NULL, NULL, 0, NULL, 0);
    lmc_bulk_copy_ahead(LMC_COPY_STREAM, NULL, NULL, 0, "next", 4);
    lmc_bulk_copy_fence(LMC_COPY_MEMCPY);
    lmc_bulk_copy_fence(LMC_COPY_STREAM);
}

static void test_names(void **state)
{
    (void)state;
    lmc_copy_method m = LMC_COPY_STREAM;
    assert_int_equal(lmc_copy_method_parse("memcpy", &m), 0);
    assert_int_equal(m, LMC_COPY_MEMCPY);
    assert_int_equal(lmc_copy_method_parse("stream", &m), 0);
    assert_int_equal(m, LMC_COPY_STREAM);
    assert_int_equal(lmc_copy_method_parse("STREAM", &m), -1);
    assert_int_equal(lmc_copy_method_parse("", &m), -1);
    assert_int_equal(lmc_copy_method_parse(NULL, &m), -1);
    assert_int_equal(m, LMC_COPY_STREAM);
    assert_string_equal(lmc_copy_method_name(LMC_COPY_MEMCPY), "memcpy");
    assert_string_equal(lmc_copy_method_name(LMC_COPY_STREAM), "stream");
#if defined(__x86_64__)
    assert_int_equal(lmc_copy_method_default(), LMC_COPY_STREAM);
#else
    assert_int_equal(lmc_copy_method_default(), LMC_COPY_MEMCPY);
    assert_false(lmc_bulk_copy_has_avx2());
#endif
}

/* Transposes [a][b][row] into [b][a][row] at every destination
 * misalignment up to 32 (the 32-byte kernel streams only when aligned, and
 * row sizes that are not a multiple of 32 take the memcpy path; 96 and 160
 * end in half a line), for both methods and both walking orders; the guard
 * bytes around dst stay. */
static void test_transpose(void **state)
{
    (void)state;
    static const size_t rows[] = {32, 64, 96, 160, 256, 48, 2};
    static const size_t dims[][2] = {{2, 16}, {16, 2}, {1, 5}, {3, 1}, {7, 3}};
    for (int method = 0; method < 4; method++) {
        for (size_t r = 0; r < sizeof rows / sizeof rows[0]; r++) {
            for (size_t d = 0; d < sizeof dims / sizeof dims[0]; d++) {
                size_t row = rows[r], a = dims[d][0], bb = dims[d][1], n = row * a * bb;
                for (size_t mis = 0; mis <= 32; mis += 8) {
                    uint8_t *src = malloc(n), *dst = malloc(n + 128), *next = malloc(n);
                    for (size_t i = 0; i < n; i++)
                        src[i] = (uint8_t)(i * 131 + 7) | 1;
                    memset(dst, 0, n + 128);
                    lmc_bulk_copy_transpose(method % 2 ? LMC_COPY_STREAM : LMC_COPY_MEMCPY,
                                            dst + 64 + mis, src, row, a, bb, method >= 2,
                                            mis % 16 ? next : NULL);   /* a hint only */
                    lmc_bulk_copy_fence(LMC_COPY_STREAM);
                    for (size_t j = 0; j < bb; j++)
                        for (size_t i = 0; i < a; i++)
                            assert_memory_equal(dst + 64 + mis + (j * a + i) * row,
                                                src + (i * bb + j) * row, row);
                    assert_int_equal(first_not(dst, 64 + mis, 0), 64 + mis);
                    assert_int_equal(first_not(dst + 64 + mis + n, 64 - mis, 0), 64 - mis);
                    free(src);
                    free(dst);
                    free(next);
                }
            }
        }
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_small_sizes),
        cmocka_unit_test(test_big_sizes),
        cmocka_unit_test(test_empty_null),
        cmocka_unit_test(test_names),
        cmocka_unit_test(test_transpose),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
