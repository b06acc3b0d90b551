/* L1 allocator: first fit, split, coalescing, batches, sbrk, memcheck,
 * plus long random sequences checked against a unit map model. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "storage/l1/l1_alloc.h"

#define PAGE 4096ull

static lmc_l1_alloc *new_alloc(uint64_t align, uint64_t heap)
{
    lmc_l1_alloc *a = lmc_l1_alloc_new(align, heap);
    assert_non_null(a);
    assert_true(lmc_l1_alloc_memcheck(a));
    return a;
}

static void expect_blocks(const lmc_l1_alloc *a, const lmc_l1_range *want, size_t n)
{
    assert_int_equal(lmc_l1_alloc_free_block_count(a), n);
    for (size_t i = 0; i < n; i++) {
        lmc_l1_range got = lmc_l1_alloc_free_block(a, i);
        assert_int_equal(got.offset, want[i].offset);
        assert_int_equal(got.size, want[i].size);
    }
}

static void test_aligned_size_and_bad_args(void **state)
{
    (void)state;
    assert_null(lmc_l1_alloc_new(3000, PAGE));
    assert_null(lmc_l1_alloc_new(0, PAGE));
    lmc_l1_alloc *a = new_alloc(PAGE, 10 * PAGE + 123);   /* rounded down */
    assert_int_equal(lmc_l1_alloc_heap_size(a), 10 * PAGE);
    assert_int_equal(lmc_l1_alloc_aligned_size(a, 1), PAGE);
    assert_int_equal(lmc_l1_alloc_aligned_size(a, PAGE), PAGE);
    assert_int_equal(lmc_l1_alloc_aligned_size(a, PAGE + 1), 2 * PAGE);
    assert_int_equal(lmc_l1_alloc_aligned_size(a, 0), 0);
    lmc_l1_range r;
    assert_int_equal(lmc_l1_alloc_allocate(a, 0, &r), -1);
    assert_int_equal(lmc_l1_alloc_allocate(a, 11 * PAGE, &r), -1);
    lmc_l1_alloc_destroy(a);
}

static void test_first_fit_split_and_coalesce(void **state)
{
    (void)state;
    lmc_l1_alloc *a = new_alloc(PAGE, 8 * PAGE);
    lmc_l1_range r[5];
    for (int i = 0; i < 5; i++) {
        assert_int_equal(lmc_l1_alloc_allocate(a, PAGE - 7, &r[i]), 0);
        assert_int_equal(r[i].offset, (uint64_t)i * PAGE);
        assert_int_equal(r[i].size, PAGE);
    }
    assert_int_equal(lmc_l1_alloc_free_size(a), 3 * PAGE);
    assert_int_equal(lmc_l1_alloc_release(a, r[1].offset, PAGE), 0);
    assert_int_equal(lmc_l1_alloc_release(a, r[3].offset, PAGE), 0);
    lmc_l1_range three[] = {{PAGE, PAGE}, {3 * PAGE, PAGE}, {5 * PAGE, 3 * PAGE}};
    expect_blocks(a, three, 3);
    /* first fit: a one-page request takes the lowest hole */
    lmc_l1_range x;
    assert_int_equal(lmc_l1_alloc_allocate(a, PAGE, &x), 0);
    assert_int_equal(x.offset, PAGE);
    /* a two-page request skips the one-page hole and splits the tail */
    assert_int_equal(lmc_l1_alloc_allocate(a, 2 * PAGE, &x), 0);
    assert_int_equal(x.offset, 5 * PAGE);
    lmc_l1_range split[] = {{3 * PAGE, PAGE}, {7 * PAGE, PAGE}};
    expect_blocks(a, split, 2);
    /* free 4 (merges with 3 before it), then 2 (merges both sides) */
    assert_int_equal(lmc_l1_alloc_release(a, 4 * PAGE, PAGE), 0);
    lmc_l1_range merged_prev[] = {{3 * PAGE, 2 * PAGE}, {7 * PAGE, PAGE}};
    expect_blocks(a, merged_prev, 2);
    assert_int_equal(lmc_l1_alloc_release(a, 5 * PAGE, 2 * PAGE), 0);
    lmc_l1_range merged_both[] = {{3 * PAGE, 5 * PAGE}};
    expect_blocks(a, merged_both, 1);
    assert_true(lmc_l1_alloc_memcheck(a));
    lmc_l1_alloc_destroy(a);
}

static void test_exact_fit_and_invalid_release(void **state)
{
    (void)state;
    lmc_l1_alloc *a = new_alloc(PAGE, 4 * PAGE);
    lmc_l1_range r, x;
    assert_int_equal(lmc_l1_alloc_allocate(a, 4 * PAGE, &r), 0);
    assert_int_equal(lmc_l1_alloc_free_block_count(a), 0);
    assert_int_equal(lmc_l1_alloc_free_size(a), 0);
    assert_int_equal(lmc_l1_alloc_allocate(a, 1, &x), -1);
    assert_true(lmc_l1_alloc_memcheck(a));
    assert_int_equal(lmc_l1_alloc_release(a, 0, 4 * PAGE), 0);
    /* double free, misaligned, outside the heap */
    assert_int_equal(lmc_l1_alloc_release(a, 0, PAGE), -1);
    assert_int_equal(lmc_l1_alloc_release(a, 5, PAGE), -1);
    assert_int_equal(lmc_l1_alloc_release(a, 4 * PAGE, PAGE), -1);
    assert_int_equal(lmc_l1_alloc_free_size(a), 4 * PAGE);
    assert_true(lmc_l1_alloc_memcheck(a));
    lmc_l1_alloc_destroy(a);
}

static void fragment_even_pages(lmc_l1_alloc *a, int pages)
{
    lmc_l1_range r;
    for (int i = 0; i < pages; i++)
        assert_int_equal(lmc_l1_alloc_allocate(a, PAGE, &r), 0);
    for (int i = 0; i < pages; i += 2)
        assert_int_equal(lmc_l1_alloc_release(a, (uint64_t)i * PAGE, PAGE), 0);
}

static void test_fragmentation_and_batch(void **state)
{
    (void)state;
    lmc_l1_alloc *a = new_alloc(PAGE, 8 * PAGE);
    fragment_even_pages(a, 8);   /* holes at 0, 2, 4, 6 */
    assert_int_equal(lmc_l1_alloc_free_size(a), 4 * PAGE);
    lmc_l1_range r;
    assert_int_equal(lmc_l1_alloc_allocate(a, 2 * PAGE, &r), -1);   /* fragmented */
    uint64_t offs[5], unit = 0;
    /* batch of 5 does not fit: nothing changes */
    assert_int_equal(lmc_l1_alloc_batch(a, PAGE, 5, offs, &unit), -1);
    lmc_l1_range holes[] = {{0, PAGE}, {2 * PAGE, PAGE}, {4 * PAGE, PAGE}, {6 * PAGE, PAGE}};
    expect_blocks(a, holes, 4);
    assert_int_equal(lmc_l1_alloc_free_size(a), 4 * PAGE);
    /* batch of 3 takes the first three holes in address order */
    assert_int_equal(lmc_l1_alloc_batch(a, 100, 3, offs, &unit), 0);
    assert_int_equal(unit, PAGE);
    assert_int_equal(offs[0], 0);
    assert_int_equal(offs[1], 2 * PAGE);
    assert_int_equal(offs[2], 4 * PAGE);
    lmc_l1_range last[] = {{6 * PAGE, PAGE}};
    expect_blocks(a, last, 1);
    assert_true(lmc_l1_alloc_memcheck(a));
    lmc_l1_alloc_destroy(a);
}

static void test_batch_carves_several_units_per_block(void **state)
{
    (void)state;
    lmc_l1_alloc *a = new_alloc(PAGE, 9 * PAGE);
    lmc_l1_range r;
    assert_int_equal(lmc_l1_alloc_allocate(a, 3 * PAGE, &r), 0);
    assert_int_equal(lmc_l1_alloc_allocate(a, PAGE, &r), 0);      /* page 3 */
    assert_int_equal(lmc_l1_alloc_release(a, 0, 3 * PAGE), 0);    /* hole 0..3 */
    uint64_t offs[4], unit;
    /* two-page units: one from the 3-page hole, two from the 5-page tail */
    assert_int_equal(lmc_l1_alloc_batch(a, 2 * PAGE, 4, offs, &unit), -1);
    assert_int_equal(lmc_l1_alloc_batch(a, 2 * PAGE, 3, offs, &unit), 0);
    assert_int_equal(offs[0], 0);
    assert_int_equal(offs[1], 4 * PAGE);
    assert_int_equal(offs[2], 6 * PAGE);
    lmc_l1_range left[] = {{2 * PAGE, PAGE}, {8 * PAGE, PAGE}};
    expect_blocks(a, left, 2);
    assert_true(lmc_l1_alloc_memcheck(a));
    lmc_l1_alloc_destroy(a);
}

static void test_sbrk_grows_and_merges_tail(void **state)
{
    (void)state;
    lmc_l1_alloc *a = new_alloc(PAGE, 2 * PAGE);
    lmc_l1_range r;
    assert_int_equal(lmc_l1_alloc_allocate(a, PAGE, &r), 0);
    assert_int_equal(lmc_l1_alloc_sbrk(a, 2 * PAGE + 17), 4 * PAGE);   /* rounded down */
    lmc_l1_range merged[] = {{PAGE, 3 * PAGE}};
    expect_blocks(a, merged, 1);
    assert_int_equal(lmc_l1_alloc_allocate(a, 3 * PAGE, &r), 0);
    assert_int_equal(r.offset, PAGE);
    /* tail allocated: the new range becomes its own block */
    assert_int_equal(lmc_l1_alloc_sbrk(a, PAGE), 5 * PAGE);
    lmc_l1_range appended[] = {{4 * PAGE, PAGE}};
    expect_blocks(a, appended, 1);
    assert_int_equal(lmc_l1_alloc_sbrk(a, 100), 5 * PAGE);   /* below alignment: no-op */
    /* freeing the block before the old tail merges across the sbrk edge */
    assert_int_equal(lmc_l1_alloc_release(a, PAGE, 3 * PAGE), 0);
    lmc_l1_range all[] = {{PAGE, 4 * PAGE}};
    expect_blocks(a, all, 1);
    assert_true(lmc_l1_alloc_memcheck(a));
    lmc_l1_alloc_destroy(a);
}

static void test_release_batch(void **state)
{
    (void)state;
    lmc_l1_alloc *a = new_alloc(PAGE, 8 * PAGE);
    uint64_t offs[8], unit;
    assert_int_equal(lmc_l1_alloc_batch(a, PAGE, 8, offs, &unit), 0);
    assert_int_equal(lmc_l1_alloc_release(a, 3 * PAGE, PAGE), 0);
    /* overlaps the free block at 3: rejected, nothing changes */
    lmc_l1_range bad[] = {{0, PAGE}, {3 * PAGE, PAGE}};
    assert_int_equal(lmc_l1_alloc_release_batch(a, bad, 2), -1);
    lmc_l1_range dup[] = {{5 * PAGE, PAGE}, {5 * PAGE, PAGE}};
    assert_int_equal(lmc_l1_alloc_release_batch(a, dup, 2), -1);
    assert_int_equal(lmc_l1_alloc_free_size(a), PAGE);
    /* unsorted input, merging with each other and with the free block */
    lmc_l1_range good[] = {{4 * PAGE, PAGE}, {7 * PAGE, PAGE}, {2 * PAGE, PAGE}, {0, PAGE}};
    assert_int_equal(lmc_l1_alloc_release_batch(a, good, 4), 0);
    lmc_l1_range want[] = {{0, PAGE}, {2 * PAGE, 3 * PAGE}, {7 * PAGE, PAGE}};
    expect_blocks(a, want, 3);
    assert_true(lmc_l1_alloc_memcheck(a));
    lmc_l1_alloc_destroy(a);
}

/* ---- randomized model check ------------------------------------------- */

#define UNIT 64ull
#define MAX_UNITS 512
#define MAX_LIVE 4096

typedef struct model {
    uint8_t used[MAX_UNITS];
    size_t heap_units;
    lmc_l1_range live[MAX_LIVE];
    size_t num_live;
    uint64_t rng;
} model;

static uint64_t next_rand(model *m)
{
    m->rng ^= m->rng << 13;
    m->rng ^= m->rng >> 7;
    m->rng ^= m->rng << 17;
    return m->rng;
}

/* Start of the first maximal free run of >= need units, or -1. */
static long first_fit(const model *m, size_t need)
{
    for (size_t i = 0; i < m->heap_units;) {
        if (m->used[i]) {
            i++;
            continue;
        }
        size_t j = i;
        while (j < m->heap_units && !m->used[j])
            j++;
        if (j - i >= need)
            return (long)i;
        i = j;
    }
    return -1;
}

static void mark(model *m, uint64_t offset, uint64_t size, uint8_t value)
{
    for (uint64_t u = offset / UNIT; u < (offset + size) / UNIT; u++) {
        assert_true(u < m->heap_units);
        assert_int_equal(m->used[u], !value);
        m->used[u] = value;
    }
}

static void add_live(model *m, uint64_t offset, uint64_t size)
{
    mark(m, offset, size, 1);
    m->live[m->num_live++] = (lmc_l1_range){offset, size};
}

static void step_allocate(model *m, lmc_l1_alloc *a)
{
    uint64_t raw = 1 + next_rand(m) % (6 * UNIT);
    size_t need = (size_t)((raw + UNIT - 1) / UNIT);
    long expect = first_fit(m, need);
    lmc_l1_range r;
    int rc = lmc_l1_alloc_allocate(a, raw, &r);
    if (expect < 0 || m->num_live == MAX_LIVE) {
        assert_true(rc == -1 || m->num_live == MAX_LIVE);
        if (rc == 0)
            assert_int_equal(lmc_l1_alloc_release(a, r.offset, r.size), 0);
        return;
    }
    assert_int_equal(rc, 0);
    assert_int_equal(r.offset, (uint64_t)expect * UNIT);
    assert_int_equal(r.size, need * UNIT);
    add_live(m, r.offset, r.size);
}

static size_t batch_capacity(const model *m, size_t need)
{
    size_t total = 0;
    for (size_t i = 0; i < m->heap_units;) {
        size_t j = i;
        while (j < m->heap_units && !m->used[j])
            j++;
        total += (j - i) / need;
        i = j > i ? j : i + 1;
    }
    return total;
}

static void step_batch(model *m, lmc_l1_alloc *a)
{
    uint64_t raw = 1 + next_rand(m) % (3 * UNIT);
    size_t count = 1 + next_rand(m) % 6;
    size_t need = (size_t)((raw + UNIT - 1) / UNIT);
    if (m->num_live + count > MAX_LIVE)
        return;
    bool fits = batch_capacity(m, need) >= count;
    uint64_t offs[6], unit = 0;
    size_t blocks_before = lmc_l1_alloc_free_block_count(a);
    uint64_t free_before = lmc_l1_alloc_free_size(a);
    int rc = lmc_l1_alloc_batch(a, raw, count, offs, &unit);
    assert_int_equal(rc, fits ? 0 : -1);
    if (!fits) {
        assert_int_equal(lmc_l1_alloc_free_block_count(a), blocks_before);
        assert_int_equal(lmc_l1_alloc_free_size(a), free_before);
        return;
    }
    assert_int_equal(unit, need * UNIT);
    for (size_t i = 0; i < count; i++) {
        if (i > 0)
            assert_true(offs[i] > offs[i - 1]);   /* address order */
        add_live(m, offs[i], unit);
    }
}

static void step_free(model *m, lmc_l1_alloc *a)
{
    if (m->num_live == 0)
        return;
    size_t i = next_rand(m) % m->num_live;
    lmc_l1_range r = m->live[i];
    assert_int_equal(lmc_l1_alloc_release(a, r.offset, r.size), 0);
    mark(m, r.offset, r.size, 0);
    m->live[i] = m->live[--m->num_live];
}

static void step_free_batch(model *m, lmc_l1_alloc *a)
{
    lmc_l1_range picked[5];
    size_t n = 0, want = 1 + next_rand(m) % 5;
    while (n < want && m->num_live > 0) {
        size_t i = next_rand(m) % m->num_live;
        picked[n++] = m->live[i];
        m->live[i] = m->live[--m->num_live];
    }
    assert_int_equal(lmc_l1_alloc_release_batch(a, picked, n), 0);
    for (size_t i = 0; i < n; i++)
        mark(m, picked[i].offset, picked[i].size, 0);
}

static void step_sbrk(model *m, lmc_l1_alloc *a)
{
    size_t grow = 1 + next_rand(m) % 16;
    if (m->heap_units + grow > MAX_UNITS)
        return;
    assert_int_equal(lmc_l1_alloc_sbrk(a, grow * UNIT), (m->heap_units + grow) * UNIT);
    m->heap_units += grow;
}

static void check_against_model(const model *m, const lmc_l1_alloc *a)
{
    assert_true(lmc_l1_alloc_memcheck(a));
    size_t block = 0, free_units = 0;
    for (size_t i = 0; i < m->heap_units;) {
        if (m->used[i]) {
            i++;
            continue;
        }
        size_t j = i;
        while (j < m->heap_units && !m->used[j])
            j++;
        lmc_l1_range b = lmc_l1_alloc_free_block(a, block++);
        assert_int_equal(b.offset, i * UNIT);
        assert_int_equal(b.size, (j - i) * UNIT);
        free_units += j - i;
        i = j;
    }
    assert_int_equal(lmc_l1_alloc_free_block_count(a), block);
    assert_int_equal(lmc_l1_alloc_free_size(a), free_units * UNIT);
}

static void run_random(uint64_t seed, size_t steps)
{
    model *m = calloc(1, sizeof(*m));
    assert_non_null(m);
    m->rng = seed;
    m->heap_units = 128;
    lmc_l1_alloc *a = new_alloc(UNIT, m->heap_units * UNIT);
    for (size_t s = 0; s < steps; s++) {
        uint64_t pick = next_rand(m) % 100;
        if (pick < 40)
            step_allocate(m, a);
        else if (pick < 55)
            step_batch(m, a);
        else if (pick < 90)
            step_free(m, a);
        else if (pick < 99)
            step_free_batch(m, a);
        else
            step_sbrk(m, a);
        check_against_model(m, a);
    }
    while (m->num_live)
        step_free(m, a);
    check_against_model(m, a);
    assert_int_equal(lmc_l1_alloc_free_block_count(a), 1);
    lmc_l1_alloc_destroy(a);
    free(m);
}

static void test_random_sequences(void **state)
{
    (void)state;
    run_random(0x9e3779b97f4a7c15ull, 40000);
    run_random(12345, 40000);
    run_random(987654321, 20000);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_aligned_size_and_bad_args),
        cmocka_unit_test(test_first_fit_split_and_coalesce),
        cmocka_unit_test(test_exact_fit_and_invalid_release),
        cmocka_unit_test(test_fragmentation_and_batch),
        cmocka_unit_test(test_batch_carves_several_units_per_block),
        cmocka_unit_test(test_sbrk_grows_and_merges_tail),
        cmocka_unit_test(test_release_batch),
        cmocka_unit_test(test_random_sequences),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
