/* L1 manager: every state transition and result code of storage.md §3.3,
 * TTL expiry through an injected clock, listeners outside the lock. */
#include <pthread.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "storage/l1_manager.h"

#define PAGE 4096ull
#define WRITE_TTL_MS 600000
#define READ_TTL_MS 300000

typedef struct fake_clock {
    int64_t now;
} fake_clock;

static int64_t read_fake_clock(void *user)
{
    return ((fake_clock *)user)->now;
}

static lmc_object_key make_key(uint64_t id)
{
    lmc_object_key k;
    memset(&k, 0, sizeof(k));
    k.chunk_hash_len = 32;
    for (int i = 0; i < 32; i++)
        k.chunk_hash[i] = (uint8_t)((id * 0x9e3779b97f4a7c15ull) >> ((i % 8) * 8)) ^ (uint8_t)i;
    memcpy(k.chunk_hash, &id, sizeof(id));
    k.kv_rank = lmc_kv_rank_for_worker(1, 0);
    k.model_name = "test-model";
    k.cache_salt = "";
    return k;
}

typedef struct fixture {
    fake_clock clock;
    lmc_l1_manager *m;
} fixture;

static lmc_l1_manager *new_manager(fake_clock *clock, uint64_t configured, uint64_t committed)
{
    lmc_l1_manager_options o = {
        .configured_bytes = configured,
        .committed_bytes = committed,
        .align_bytes = PAGE,
        .write_ttl_ms = WRITE_TTL_MS,
        .read_ttl_ms = READ_TTL_MS,
        .clock = read_fake_clock,
        .clock_user = clock,
    };
    lmc_l1_manager *m = lmc_l1_manager_new(&o);
    assert_non_null(m);
    return m;
}

static int setup(void **state)
{
    fixture *f = calloc(1, sizeof(*f));
    f->clock.now = 1000;
    f->m = new_manager(&f->clock, 16 * PAGE, 16 * PAGE);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fixture *f = *state;
    assert_true(lmc_l1_manager_memcheck(f->m));
    lmc_l1_manager_free(f->m);
    free(f);
    return 0;
}

/* One-key helpers returning the result code. */
static lmc_l1_result reserve1(lmc_l1_manager *m, uint64_t id, const char *tag, bool temp,
                              uint64_t *offset)
{
    lmc_object_key k = make_key(id);
    lmc_l1_result r;
    uint64_t off = UINT64_MAX;
    assert_int_equal(lmc_l1_manager_reserve_write(m, &k, &temp, 1, PAGE, tag, &off, &r), 0);
    if (offset)
        *offset = off;
    return r;
}

static lmc_l1_result finish1(lmc_l1_manager *m, uint64_t id, const char *tag)
{
    lmc_object_key k = make_key(id);
    lmc_l1_result r;
    assert_int_equal(lmc_l1_manager_finish_write(m, &k, 1, tag, &r), 0);
    return r;
}

static lmc_l1_result read_lock1(lmc_l1_manager *m, uint64_t id, uint32_t n)
{
    lmc_object_key k = make_key(id);
    lmc_l1_result r;
    assert_int_equal(lmc_l1_manager_reserve_read(m, &k, 1, n, &r), 0);
    return r;
}

static lmc_l1_result unlock1(lmc_l1_manager *m, uint64_t id, uint32_t n)
{
    lmc_object_key k = make_key(id);
    lmc_l1_result r;
    assert_int_equal(lmc_l1_manager_finish_read(m, &k, NULL, 1, n, &r), 0);
    return r;
}

static lmc_l1_result peek1(lmc_l1_manager *m, uint64_t id, lmc_l1_range *range)
{
    lmc_object_key k = make_key(id);
    lmc_l1_result r;
    lmc_l1_range tmp;
    assert_int_equal(lmc_l1_manager_unsafe_read(m, &k, 1, range ? range : &tmp, &r), 0);
    return r;
}

static void unpin1(lmc_l1_manager *m, uint64_t id, lmc_l1_range range)
{
    lmc_object_key k = make_key(id);
    lmc_l1_manager_unpin(m, &k, &range, 1);
}

static lmc_l1_result delete1(lmc_l1_manager *m, uint64_t id, bool force)
{
    lmc_object_key k = make_key(id);
    lmc_l1_result r;
    assert_int_equal(lmc_l1_manager_delete(m, &k, 1, force, &r), 0);
    return r;
}

static lmc_l1_evictability evictable1(lmc_l1_manager *m, uint64_t id)
{
    lmc_object_key k = make_key(id);
    return lmc_l1_manager_is_evictable(m, &k);
}

static void put_resident(lmc_l1_manager *m, uint64_t id)
{
    assert_int_equal(reserve1(m, id, "w", false, NULL), LMC_L1_SUCCESS);
    assert_int_equal(finish1(m, id, "w"), LMC_L1_SUCCESS);
}

static lmc_l1_stats stats(lmc_l1_manager *m)
{
    lmc_l1_stats s;
    lmc_l1_manager_stats(m, &s);
    return s;
}

/* ---- write path ---------------------------------------------------------- */

static void test_reserve_then_finish(void **state)
{
    fixture *f = *state;
    lmc_object_key keys[3] = {make_key(1), make_key(2), make_key(3)};
    uint64_t offs[3];
    lmc_l1_result res[3];
    assert_int_equal(lmc_l1_manager_reserve_write(f->m, keys, NULL, 3, 100, "w", offs, res), 0);
    for (int i = 0; i < 3; i++)
        assert_int_equal(res[i], LMC_L1_SUCCESS);
    assert_true(offs[0] != offs[1] && offs[1] != offs[2] && offs[0] != offs[2]);
    lmc_l1_stats s = stats(f->m);
    assert_int_equal(s.num_staging, 3);
    assert_int_equal(s.num_objects, 0);
    assert_int_equal(s.staging_bytes, 3 * PAGE);
    assert_int_equal(s.used_bytes, 3 * PAGE);
    /* staging is invisible to readers */
    assert_int_equal(peek1(f->m, 1, NULL), LMC_L1_KEY_NOT_EXIST);
    assert_int_equal(read_lock1(f->m, 1, 1), LMC_L1_KEY_NOT_EXIST);
    assert_int_equal(lmc_l1_manager_finish_write(f->m, keys, 3, "w", res), 0);
    for (int i = 0; i < 3; i++)
        assert_int_equal(res[i], LMC_L1_SUCCESS);
    s = stats(f->m);
    assert_int_equal(s.num_staging, 0);
    assert_int_equal(s.num_objects, 3);
    assert_int_equal(s.object_bytes, 3 * PAGE);
    /* resident but not read-locked */
    assert_int_equal(peek1(f->m, 2, NULL), LMC_L1_KEY_NOT_READABLE);
    assert_int_equal(read_lock1(f->m, 2, 1), LMC_L1_SUCCESS);
    lmc_l1_range range;
    assert_int_equal(peek1(f->m, 2, &range), LMC_L1_SUCCESS);
    assert_int_equal(range.offset, offs[1]);
    assert_int_equal(range.size, PAGE);
    assert_int_equal(unlock1(f->m, 2, 1), LMC_L1_SUCCESS);
}

static void test_reserve_conflicts(void **state)
{
    fixture *f = *state;
    put_resident(f->m, 1);
    assert_int_equal(reserve1(f->m, 1, "w", false, NULL), LMC_L1_KEY_NOT_WRITABLE);
    assert_int_equal(reserve1(f->m, 2, "a", false, NULL), LMC_L1_SUCCESS);
    assert_int_equal(reserve1(f->m, 2, "a", false, NULL), LMC_L1_KEY_NOT_WRITABLE);
    uint64_t off_b;
    assert_int_equal(reserve1(f->m, 2, "b", false, &off_b), LMC_L1_SUCCESS);   /* other tag */
    assert_int_equal(stats(f->m).num_staging, 2);
    assert_int_equal(finish1(f->m, 2, "a"), LMC_L1_SUCCESS);
    /* b's copy arrives second: freed, still SUCCESS */
    uint64_t used_before = stats(f->m).used_bytes;
    assert_int_equal(finish1(f->m, 2, "b"), LMC_L1_SUCCESS);
    assert_int_equal(stats(f->m).used_bytes, used_before - PAGE);
    assert_int_equal(stats(f->m).num_objects, 2);
    lmc_l1_range range;
    assert_int_equal(read_lock1(f->m, 2, 1), LMC_L1_SUCCESS);
    assert_int_equal(peek1(f->m, 2, &range), LMC_L1_SUCCESS);
    assert_true(range.offset != off_b);
    assert_int_equal(unlock1(f->m, 2, 1), LMC_L1_SUCCESS);
}

static void test_duplicate_key_in_batch(void **state)
{
    fixture *f = *state;
    lmc_object_key keys[3] = {make_key(7), make_key(8), make_key(7)};
    uint64_t offs[3];
    lmc_l1_result res[3];
    assert_int_equal(lmc_l1_manager_reserve_write(f->m, keys, NULL, 3, PAGE, "w", offs, res), 0);
    assert_int_equal(res[0], LMC_L1_SUCCESS);
    assert_int_equal(res[1], LMC_L1_SUCCESS);
    assert_int_equal(res[2], LMC_L1_KEY_NOT_WRITABLE);
    assert_int_equal(stats(f->m).staging_bytes, 2 * PAGE);
    assert_int_equal(stats(f->m).used_bytes, 2 * PAGE);
}

static void test_out_of_memory_is_all_or_nothing(void **state)
{
    fixture *f = *state;
    lmc_object_key keys[16];
    uint64_t offs[16];
    lmc_l1_result res[16];
    for (int i = 0; i < 16; i++)
        keys[i] = make_key(100 + (uint64_t)i);
    assert_int_equal(lmc_l1_manager_reserve_write(f->m, keys, NULL, 14, PAGE, "w", offs, res), 0);
    assert_int_equal(lmc_l1_manager_finish_write(f->m, keys, 1, "w", res), 0);
    /* 2 pages free: key 100 is resident, 3 new keys need 3 pages */
    lmc_object_key batch[4] = {keys[0], make_key(1), make_key(2), make_key(3)};
    assert_int_equal(lmc_l1_manager_reserve_write(f->m, batch, NULL, 4, PAGE, "x", offs, res), 0);
    assert_int_equal(res[0], LMC_L1_KEY_NOT_WRITABLE);
    for (int i = 1; i < 4; i++)
        assert_int_equal(res[i], LMC_L1_OUT_OF_MEMORY);
    lmc_l1_stats s = stats(f->m);
    assert_int_equal(s.num_staging, 13);
    assert_int_equal(s.used_bytes, 14 * PAGE);
    /* two fit */
    assert_int_equal(lmc_l1_manager_reserve_write(f->m, batch + 1, NULL, 2, PAGE, "x", offs, res),
                     0);
    assert_int_equal(res[0], LMC_L1_SUCCESS);
    assert_int_equal(res[1], LMC_L1_SUCCESS);
    /* bad arguments */
    assert_int_equal(lmc_l1_manager_reserve_write(f->m, batch, NULL, 1, 0, "x", offs, res), -1);
    assert_int_equal(lmc_l1_manager_reserve_write(f->m, batch, NULL, 1, PAGE, NULL, offs, res),
                     -1);
}

static void test_finish_write_errors_and_expiry(void **state)
{
    fixture *f = *state;
    assert_int_equal(finish1(f->m, 1, "w"), LMC_L1_KEY_NOT_EXIST);
    assert_int_equal(reserve1(f->m, 1, "w", false, NULL), LMC_L1_SUCCESS);
    assert_int_equal(finish1(f->m, 1, "other"), LMC_L1_KEY_NOT_EXIST);
    assert_int_equal(evictable1(f->m, 1), LMC_L1_NOT_EVICTABLE);
    f->clock.now += WRITE_TTL_MS - 1;
    assert_int_equal(evictable1(f->m, 1), LMC_L1_NOT_EVICTABLE);
    f->clock.now += 1;   /* expired */
    assert_int_equal(evictable1(f->m, 1), LMC_L1_EVICTABLE);
    assert_int_equal(finish1(f->m, 1, "w"), LMC_L1_KEY_IN_WRONG_STATE);
    assert_int_equal(stats(f->m).num_staging, 1);   /* left for reclamation */
    lmc_object_key k = make_key(1);
    lmc_l1_result r;
    assert_int_equal(lmc_l1_manager_finish_write_and_reserve_read(f->m, &k, 1, 1, "w", &r, NULL),
                     0);
    assert_int_equal(r, LMC_L1_KEY_IN_WRONG_STATE);
    assert_int_equal(lmc_l1_manager_finish_write_and_delete(f->m, &k, 1, "w", &r), 0);
    assert_int_equal(r, LMC_L1_KEY_IN_WRONG_STATE);
    assert_int_equal(evictable1(f->m, 99), LMC_L1_GONE);
}

static void test_takeover_of_expired_staging(void **state)
{
    fixture *f = *state;
    uint64_t first, second;
    assert_int_equal(reserve1(f->m, 1, "w", false, &first), LMC_L1_SUCCESS);
    f->clock.now += WRITE_TTL_MS + 5;
    assert_int_equal(reserve1(f->m, 1, "other", false, NULL), LMC_L1_SUCCESS);  /* other tag */
    assert_int_equal(reserve1(f->m, 1, "w", false, &second), LMC_L1_SUCCESS);
    assert_int_equal(second, first);                      /* same buffer taken over */
    assert_int_equal(stats(f->m).num_staging, 2);
    assert_int_equal(evictable1(f->m, 1), LMC_L1_NOT_EVICTABLE);
    assert_int_equal(finish1(f->m, 1, "w"), LMC_L1_SUCCESS);   /* lock renewed */
    /* expired reservation with a different size: replaced */
    assert_int_equal(reserve1(f->m, 2, "w", false, &first), LMC_L1_SUCCESS);
    f->clock.now += WRITE_TTL_MS;
    lmc_object_key k = make_key(2);
    lmc_l1_result r;
    assert_int_equal(lmc_l1_manager_reserve_write(f->m, &k, NULL, 1, 3 * PAGE, "w", &second, &r),
                     0);
    assert_int_equal(r, LMC_L1_SUCCESS);
    assert_int_equal(stats(f->m).staging_bytes, 3 * PAGE + PAGE);   /* + "other" on key 1 */
    assert_true(lmc_l1_manager_memcheck(f->m));
}

static void test_finish_write_and_reserve_read(void **state)
{
    fixture *f = *state;
    lmc_object_key k = make_key(5);
    lmc_l1_result r;
    lmc_l1_copy_id locked, resident;
    assert_int_equal(reserve1(f->m, 5, "w", false, NULL), LMC_L1_SUCCESS);
    assert_int_equal(lmc_l1_manager_finish_write_and_reserve_read(f->m, &k, 1, 2, "w", &r, &locked),
                     0);
    assert_int_equal(r, LMC_L1_SUCCESS);
    assert_int_equal(lmc_l1_manager_reserve_read_prefix(f->m, &k, 1, 1, &resident), 1);
    assert_int_not_equal(locked, 0);
    assert_int_equal(locked, resident);
    assert_int_equal(unlock1(f->m, 5, 1), LMC_L1_SUCCESS);   /* that probe's share */
    assert_int_equal(peek1(f->m, 5, NULL), LMC_L1_SUCCESS);
    assert_int_equal(stats(f->m).num_locked, 1);
    assert_int_equal(delete1(f->m, 5, false), LMC_L1_KEY_IS_LOCKED);
    assert_int_equal(unlock1(f->m, 5, 1), LMC_L1_SUCCESS);
    assert_int_equal(peek1(f->m, 5, NULL), LMC_L1_SUCCESS);
    assert_int_equal(unlock1(f->m, 5, 1), LMC_L1_SUCCESS);
    assert_int_equal(peek1(f->m, 5, NULL), LMC_L1_KEY_NOT_READABLE);
    assert_int_equal(unlock1(f->m, 5, 1), LMC_L1_KEY_IN_WRONG_STATE);
    assert_int_equal(unlock1(f->m, 6, 1), LMC_L1_KEY_NOT_EXIST);
    /* already resident: a second writer's copy is freed, lock goes to the resident copy */
    assert_int_equal(reserve1(f->m, 5, "w", false, NULL), LMC_L1_KEY_NOT_WRITABLE);
    k = make_key(7);
    assert_int_equal(reserve1(f->m, 7, "a", false, NULL), LMC_L1_SUCCESS);
    assert_int_equal(reserve1(f->m, 7, "b", false, NULL), LMC_L1_SUCCESS);
    assert_int_equal(finish1(f->m, 7, "a"), LMC_L1_SUCCESS);
    assert_int_equal(lmc_l1_manager_reserve_read_prefix(f->m, &k, 1, 1, &resident), 1);
    assert_int_equal(lmc_l1_manager_finish_write_and_reserve_read(f->m, &k, 1, 1, "b", &r, &locked),
                     0);
    assert_int_equal(r, LMC_L1_SUCCESS);
    assert_int_equal(locked, resident);   /* b's copy was dropped; a's is the one locked */
    assert_int_equal(stats(f->m).used_bytes, 2 * PAGE);
    lmc_l1_copy_id both[2] = {locked, resident};
    lmc_object_key twice[2] = {k, k};
    assert_int_equal(lmc_l1_manager_finish_read_copies(f->m, twice, both, 2, 1, NULL), 0);
    assert_int_equal(delete1(f->m, 7, false), LMC_L1_SUCCESS);   /* no share left */
}

static void test_finish_write_and_delete(void **state)
{
    fixture *f = *state;
    lmc_object_key k = make_key(5);
    lmc_l1_result r;
    assert_int_equal(reserve1(f->m, 5, "w", false, NULL), LMC_L1_SUCCESS);
    assert_int_equal(lmc_l1_manager_finish_write_and_delete(f->m, &k, 1, "w", &r), 0);
    assert_int_equal(r, LMC_L1_SUCCESS);
    assert_int_equal(stats(f->m).used_bytes, 0);
    assert_int_equal(evictable1(f->m, 5), LMC_L1_GONE);
}

/* ---- read path ----------------------------------------------------------- */

static void test_read_count_is_clamped(void **state)
{
    fixture *f = *state;
    put_resident(f->m, 1);
    assert_int_equal(read_lock1(f->m, 1, 1000), LMC_L1_SUCCESS);   /* = 128 */
    assert_int_equal(unlock1(f->m, 1, 127), LMC_L1_SUCCESS);
    assert_int_equal(peek1(f->m, 1, NULL), LMC_L1_SUCCESS);
    assert_int_equal(unlock1(f->m, 1, 1), LMC_L1_SUCCESS);
    assert_int_equal(peek1(f->m, 1, NULL), LMC_L1_KEY_NOT_READABLE);
    assert_int_equal(read_lock1(f->m, 1, 0), LMC_L1_SUCCESS);      /* = 1 */
    assert_int_equal(read_lock1(f->m, 1, 2), LMC_L1_SUCCESS);      /* 3 in all */
    assert_int_equal(unlock1(f->m, 1, 2), LMC_L1_SUCCESS);
    assert_int_equal(peek1(f->m, 1, NULL), LMC_L1_SUCCESS);
    assert_int_equal(unlock1(f->m, 1, 5), LMC_L1_SUCCESS);         /* floors at 0 */
    assert_int_equal(peek1(f->m, 1, NULL), LMC_L1_KEY_NOT_READABLE);
}

static void test_expired_read_lock_is_ignored(void **state)
{
    fixture *f = *state;
    put_resident(f->m, 1);
    assert_int_equal(read_lock1(f->m, 1, 3), LMC_L1_SUCCESS);
    assert_int_equal(evictable1(f->m, 1), LMC_L1_NOT_EVICTABLE);
    f->clock.now += READ_TTL_MS;
    assert_int_equal(peek1(f->m, 1, NULL), LMC_L1_KEY_NOT_READABLE);
    assert_int_equal(evictable1(f->m, 1), LMC_L1_EVICTABLE);
    assert_int_equal(stats(f->m).num_locked, 0);
    assert_int_equal(unlock1(f->m, 1, 1), LMC_L1_KEY_IN_WRONG_STATE);
    /* re-locking an expired lock starts from 0 */
    assert_int_equal(read_lock1(f->m, 1, 1), LMC_L1_SUCCESS);
    assert_int_equal(unlock1(f->m, 1, 1), LMC_L1_SUCCESS);
    assert_int_equal(peek1(f->m, 1, NULL), LMC_L1_KEY_NOT_READABLE);
    assert_int_equal(read_lock1(f->m, 1, 1), LMC_L1_SUCCESS);
    f->clock.now += READ_TTL_MS + 1;
    assert_int_equal(delete1(f->m, 1, false), LMC_L1_SUCCESS);
}

static void test_reserve_read_prefix(void **state)
{
    fixture *f = *state;
    put_resident(f->m, 1);
    put_resident(f->m, 2);
    put_resident(f->m, 4);
    lmc_object_key keys[4] = {make_key(1), make_key(2), make_key(3), make_key(4)};
    assert_int_equal(lmc_l1_manager_reserve_read_prefix(f->m, keys, 4, 2, NULL), 2);
    assert_int_equal(peek1(f->m, 1, NULL), LMC_L1_SUCCESS);
    assert_int_equal(peek1(f->m, 2, NULL), LMC_L1_SUCCESS);
    assert_int_equal(peek1(f->m, 4, NULL), LMC_L1_KEY_NOT_READABLE);   /* after the miss */
    assert_int_equal(lmc_l1_manager_reserve_read_prefix(f->m, keys + 2, 2, 1, NULL), 0);
    lmc_l1_result res[2];
    assert_int_equal(lmc_l1_manager_finish_read(f->m, keys, NULL, 2, 2, res), 0);
    assert_int_equal(stats(f->m).num_locked, 0);
}

static void test_temporary_freed_on_last_read(void **state)
{
    fixture *f = *state;
    lmc_l1_range copy;
    lmc_object_key k = make_key(9);
    lmc_l1_result r;
    assert_int_equal(reserve1(f->m, 9, "prefetch", true, NULL), LMC_L1_SUCCESS);
    assert_int_equal(
        lmc_l1_manager_finish_write_and_reserve_read(f->m, &k, 1, 2, "prefetch", &r, NULL), 0);
    assert_int_equal(r, LMC_L1_SUCCESS);
    assert_int_equal(stats(f->m).num_temporary, 1);
    assert_int_equal(unlock1(f->m, 9, 1), LMC_L1_SUCCESS);
    assert_int_equal(peek1(f->m, 9, &copy), LMC_L1_SUCCESS);
    assert_int_equal(unlock1(f->m, 9, 1), LMC_L1_SUCCESS);
    assert_int_equal(peek1(f->m, 9, NULL), LMC_L1_KEY_NOT_EXIST);
    lmc_l1_stats s = stats(f->m);
    assert_int_equal(s.num_temporary, 0);
    assert_int_equal(s.num_objects, 0);
    assert_int_equal(s.used_bytes, PAGE);   /* the copy the peek began still runs */
    unpin1(f->m, 9, copy);
    assert_int_equal(stats(f->m).used_bytes, 0);
}

/* ---- delete / clear ------------------------------------------------------ */

static void test_delete_cases(void **state)
{
    fixture *f = *state;
    assert_int_equal(delete1(f->m, 1, false), LMC_L1_KEY_NOT_EXIST);
    put_resident(f->m, 1);
    assert_int_equal(delete1(f->m, 1, false), LMC_L1_SUCCESS);
    assert_int_equal(delete1(f->m, 1, false), LMC_L1_KEY_NOT_EXIST);
    put_resident(f->m, 2);
    assert_int_equal(read_lock1(f->m, 2, 1), LMC_L1_SUCCESS);
    assert_int_equal(delete1(f->m, 2, false), LMC_L1_KEY_IS_LOCKED);
    assert_int_equal(delete1(f->m, 2, true), LMC_L1_SUCCESS);
    assert_int_equal(peek1(f->m, 2, NULL), LMC_L1_KEY_NOT_EXIST);
    /* live staging blocks a non-force delete */
    assert_int_equal(reserve1(f->m, 3, "a", false, NULL), LMC_L1_SUCCESS);
    assert_int_equal(delete1(f->m, 3, false), LMC_L1_KEY_IS_LOCKED);
    /* expired staging is reclaimed first; a live one of another tag still locks */
    f->clock.now += WRITE_TTL_MS;
    assert_int_equal(reserve1(f->m, 3, "b", false, NULL), LMC_L1_SUCCESS);
    assert_int_equal(stats(f->m).num_staging, 2);
    assert_int_equal(delete1(f->m, 3, false), LMC_L1_KEY_IS_LOCKED);
    assert_int_equal(stats(f->m).num_staging, 1);
    f->clock.now += WRITE_TTL_MS;
    assert_int_equal(delete1(f->m, 3, false), LMC_L1_SUCCESS);   /* only expired staging */
    assert_int_equal(stats(f->m).num_staging, 0);
    /* force drops live staging too */
    assert_int_equal(reserve1(f->m, 4, "a", false, NULL), LMC_L1_SUCCESS);
    assert_int_equal(delete1(f->m, 4, true), LMC_L1_SUCCESS);
    assert_int_equal(finish1(f->m, 4, "a"), LMC_L1_KEY_NOT_EXIST);
    /* resident + live staging of the same key: IS_LOCKED without force */
    put_resident(f->m, 5);
    assert_int_equal(reserve1(f->m, 5, "z", false, NULL), LMC_L1_KEY_NOT_WRITABLE);
    assert_int_equal(stats(f->m).used_bytes, PAGE);
}

static void test_clear_non_force_and_force(void **state)
{
    fixture *f = *state;
    lmc_l1_range copy;
    assert_int_equal(reserve1(f->m, 3, "old", false, NULL), LMC_L1_SUCCESS);
    f->clock.now += WRITE_TTL_MS;                                 /* 3: expired staging */
    put_resident(f->m, 1);                                        /* unlocked: dropped */
    put_resident(f->m, 2);
    assert_int_equal(read_lock1(f->m, 2, 1), LMC_L1_SUCCESS);     /* locked: kept */
    assert_int_equal(reserve1(f->m, 4, "new", false, NULL), LMC_L1_SUCCESS);  /* live */
    assert_int_equal(lmc_l1_manager_clear(f->m, false), 2);
    lmc_l1_stats s = stats(f->m);
    assert_int_equal(s.num_objects, 1);
    assert_int_equal(s.num_staging, 1);
    assert_int_equal(s.used_bytes, 2 * PAGE);
    assert_int_equal(peek1(f->m, 2, &copy), LMC_L1_SUCCESS);
    unpin1(f->m, 2, copy);                                              /* that copy is done */
    assert_true(lmc_l1_manager_memcheck(f->m));
    assert_int_equal(lmc_l1_manager_clear(f->m, true), 2);
    s = stats(f->m);
    assert_int_equal(s.num_objects + s.num_staging, 0);
    /* Key 4's writer still holds its buffer; key 2's read share had no copy
     * in flight any more, so its buffer went at once. */
    assert_int_equal(s.num_retired, 1);
    assert_int_equal(s.used_bytes, PAGE);
    assert_int_equal(peek1(f->m, 2, NULL), LMC_L1_KEY_NOT_EXIST);
    assert_int_equal(unlock1(f->m, 2, 1), LMC_L1_KEY_NOT_EXIST);
    assert_int_equal(finish1(f->m, 4, "new"), LMC_L1_KEY_NOT_EXIST);
    s = stats(f->m);
    assert_int_equal(s.num_retired, 0);
    assert_int_equal(s.used_bytes, 0);
    assert_int_equal(lmc_l1_manager_clear(f->m, true), 0);
}

/* A forced clear unlinks keys at once but leaves the buffers of a writer
 * still copying in and of readers still copying out to them: no new
 * object is placed there until they finish or their locks expire. */
static void test_forced_clear_keeps_buffers_in_use(void **state)
{
    fixture *f = *state;
    lmc_l1_range copy;
    uint64_t writing, reading, off;
    assert_int_equal(reserve1(f->m, 1, "engine", false, &writing), LMC_L1_SUCCESS);
    assert_int_equal(reserve1(f->m, 2, "engine", false, &reading), LMC_L1_SUCCESS);
    assert_int_equal(finish1(f->m, 2, "engine"), LMC_L1_SUCCESS);
    assert_int_equal(read_lock1(f->m, 2, 3), LMC_L1_SUCCESS);    /* three shares, */
    assert_int_equal(peek1(f->m, 2, &copy), LMC_L1_SUCCESS);       /* two copying out */
    assert_int_equal(peek1(f->m, 2, NULL), LMC_L1_SUCCESS);
    assert_int_equal(lmc_l1_manager_clear(f->m, true), 2);
    for (uint64_t id = 100; id < 114; id++) {                     /* the other 14 pages */
        assert_int_equal(reserve1(f->m, id, "other", false, &off), LMC_L1_SUCCESS);
        assert_true(off != writing && off != reading);
    }
    assert_int_equal(reserve1(f->m, 114, "other", false, NULL), LMC_L1_OUT_OF_MEMORY);
    assert_int_equal(unlock1(f->m, 2, 1), LMC_L1_KEY_NOT_EXIST);  /* shares are gone... */
    assert_int_equal(reserve1(f->m, 114, "other", false, NULL), LMC_L1_OUT_OF_MEMORY);
    unpin1(f->m, 2, copy);                                              /* ...copies are not */
    assert_int_equal(reserve1(f->m, 114, "other", false, NULL), LMC_L1_OUT_OF_MEMORY);
    unpin1(f->m, 2, copy);                                              /* the last copy */
    unpin1(f->m, 2, copy);                                              /* one too many: ignored */
    assert_int_equal(reserve1(f->m, 114, "other", false, &off), LMC_L1_SUCCESS);
    assert_int_equal(off, reading);
    /* A writer that never comes back: its buffer returns at its lock's TTL. */
    assert_int_equal(reserve1(f->m, 115, "other", false, NULL), LMC_L1_OUT_OF_MEMORY);
    f->clock.now += WRITE_TTL_MS;
    assert_int_equal(reserve1(f->m, 115, "other", false, &off), LMC_L1_SUCCESS);
    assert_int_equal(off, writing);
    assert_int_equal(finish1(f->m, 1, "engine"), LMC_L1_KEY_NOT_EXIST);
    assert_int_equal(stats(f->m).num_retired, 0);
    /* A forced delete of a read-locked key does the same. */
    assert_int_equal(lmc_l1_manager_clear(f->m, true), 16);  /* 100..115 */
    assert_int_equal(stats(f->m).used_bytes, PAGE);          /* 115's writer is live */
    assert_int_equal(finish1(f->m, 115, "other"), LMC_L1_KEY_NOT_EXIST);
    assert_int_equal(stats(f->m).used_bytes, 0);
    put_resident(f->m, 3);
    assert_int_equal(read_lock1(f->m, 3, 1), LMC_L1_SUCCESS);
    assert_int_equal(peek1(f->m, 3, &copy), LMC_L1_SUCCESS);
    assert_int_equal(delete1(f->m, 3, true), LMC_L1_SUCCESS);
    assert_int_equal(stats(f->m).used_bytes, PAGE);
    unpin1(f->m, 3, copy);
    assert_int_equal(stats(f->m).used_bytes, 0);
    /* Shares released under a copy (a FREE_LOOKUP_LOCKS racing a retrieve):
     * the copy becomes evictable, but its buffer waits for the copy. */
    put_resident(f->m, 5);
    assert_int_equal(read_lock1(f->m, 5, 1), LMC_L1_SUCCESS);
    assert_int_equal(peek1(f->m, 5, &copy), LMC_L1_SUCCESS);
    assert_int_equal(unlock1(f->m, 5, 1), LMC_L1_SUCCESS);
    assert_int_equal(delete1(f->m, 5, false), LMC_L1_SUCCESS);    /* as eviction does */
    assert_int_equal(stats(f->m).used_bytes, PAGE);
    unpin1(f->m, 5, copy);
    assert_int_equal(stats(f->m).used_bytes, 0);
    /* A copy finished before the clear leaves nothing to keep. */
    put_resident(f->m, 4);
    assert_int_equal(read_lock1(f->m, 4, 1), LMC_L1_SUCCESS);
    assert_int_equal(peek1(f->m, 4, &copy), LMC_L1_SUCCESS);
    unpin1(f->m, 4, copy);
    assert_int_equal(lmc_l1_manager_clear(f->m, true), 1);
    assert_int_equal(stats(f->m).used_bytes, 0);
}

/* A copy retired under a reader and a new copy of the same key, stored after
 * the clear and read by another reader, are two buffers: each reader's
 * unpin reaches the one it copied out of, never the other. */
static void test_unpin_reaches_the_copy_read(void **state)
{
    fixture *f = *state;
    lmc_l1_range old_copy, new_copy;
    put_resident(f->m, 7);
    assert_int_equal(read_lock1(f->m, 7, 1), LMC_L1_SUCCESS);
    assert_int_equal(peek1(f->m, 7, &old_copy), LMC_L1_SUCCESS);   /* reader 1 copies */
    assert_int_equal(lmc_l1_manager_clear(f->m, true), 1);
    put_resident(f->m, 7);                                         /* stored again */
    assert_int_equal(read_lock1(f->m, 7, 1), LMC_L1_SUCCESS);
    assert_int_equal(peek1(f->m, 7, &new_copy), LMC_L1_SUCCESS);   /* reader 2 copies */
    assert_true(new_copy.offset != old_copy.offset);
    assert_int_equal(stats(f->m).used_bytes, 2 * PAGE);
    unpin1(f->m, 7, old_copy);                                     /* reader 1 is done */
    lmc_l1_stats s = stats(f->m);
    assert_int_equal(s.num_retired, 0);
    assert_int_equal(s.used_bytes, PAGE);
    /* Reader 2's copy is still pinned: a second clear must keep it. */
    assert_int_equal(lmc_l1_manager_clear(f->m, true), 1);
    uint64_t off;
    for (uint64_t id = 100; id < 115; id++) {
        assert_int_equal(reserve1(f->m, id, "other", false, &off), LMC_L1_SUCCESS);
        assert_true(off != new_copy.offset);
    }
    unpin1(f->m, 7, new_copy);
    assert_int_equal(reserve1(f->m, 115, "other", false, &off), LMC_L1_SUCCESS);
    assert_int_equal(off, new_copy.offset);
    assert_true(lmc_l1_manager_memcheck(f->m));
}

/* end_read gives a reader's share back on the copy it read: after a forced
 * clear and a new store, the new copy keeps its own lookups' shares. */
static void test_end_read_releases_the_copy_read(void **state)
{
    fixture *f = *state;
    lmc_object_key k = make_key(6);
    lmc_l1_range old_copy, new_copy;
    lmc_l1_result r;
    put_resident(f->m, 6);
    assert_int_equal(read_lock1(f->m, 6, 1), LMC_L1_SUCCESS);
    assert_int_equal(peek1(f->m, 6, &old_copy), LMC_L1_SUCCESS);
    assert_int_equal(lmc_l1_manager_clear(f->m, true), 1);
    put_resident(f->m, 6);
    assert_int_equal(read_lock1(f->m, 6, 1), LMC_L1_SUCCESS);    /* another lookup's share */
    /* A share release naming the old copy does not reach the new one... */
    assert_int_equal(lmc_l1_manager_finish_read(f->m, &k, &old_copy, 1, 1, &r), 0);
    assert_int_equal(r, LMC_L1_KEY_NOT_EXIST);
    lmc_l1_manager_end_read(f->m, &k, &old_copy, 1);             /* ...nor does end_read */
    lmc_l1_stats s = stats(f->m);
    assert_int_equal(s.num_retired, 0);
    assert_int_equal(s.used_bytes, PAGE);
    assert_int_equal(delete1(f->m, 6, false), LMC_L1_KEY_IS_LOCKED);   /* its share stays */
    /* The usual case: the copy read is the resident one. */
    assert_int_equal(peek1(f->m, 6, &new_copy), LMC_L1_SUCCESS);
    lmc_l1_manager_end_read(f->m, &k, &new_copy, 1);
    assert_int_equal(delete1(f->m, 6, false), LMC_L1_SUCCESS);   /* no share, no pin left */
    assert_int_equal(stats(f->m).used_bytes, 0);
    /* A temporary's last share, given back this way, frees it at once. */
    k = make_key(9);
    assert_int_equal(reserve1(f->m, 9, "prefetch", true, NULL), LMC_L1_SUCCESS);
    assert_int_equal(
        lmc_l1_manager_finish_write_and_reserve_read(f->m, &k, 1, 1, "prefetch", &r, NULL), 0);
    assert_int_equal(peek1(f->m, 9, &new_copy), LMC_L1_SUCCESS);
    lmc_l1_manager_end_read(f->m, &k, &new_copy, 1);
    s = stats(f->m);
    assert_int_equal(s.num_objects + s.num_retired, 0);
    assert_int_equal(s.used_bytes, 0);
    assert_true(lmc_l1_manager_memcheck(f->m));
}

/* A LOOKUP's shares outlive every range (nothing is pinned), so a forced
 * clear frees the old copy outright and the next copy of the key may sit at
 * the same offset: only the copy id tells the two apart. */
static void test_finish_read_copies_spares_a_newer_copy(void **state)
{
    fixture *f = *state;
    lmc_object_key k = make_key(4), missing = make_key(5);
    lmc_l1_copy_id old_id, new_id, now_id;
    lmc_l1_range old_at, new_at;
    lmc_l1_result r;
    put_resident(f->m, 4);
    assert_int_equal(lmc_l1_manager_reserve_read_prefix(f->m, &k, 1, 2, &old_id), 1);
    assert_int_not_equal(old_id, 0);
    assert_int_equal(peek1(f->m, 4, &old_at), LMC_L1_SUCCESS);
    unpin1(f->m, 4, old_at);
    assert_int_equal(lmc_l1_manager_clear(f->m, true), 1);
    put_resident(f->m, 4);
    assert_int_equal(lmc_l1_manager_reserve_read_prefix(f->m, &k, 1, 1, &new_id), 1);
    assert_int_not_equal(new_id, old_id);
    assert_int_equal(peek1(f->m, 4, &new_at), LMC_L1_SUCCESS);
    unpin1(f->m, 4, new_at);
    assert_int_equal(new_at.offset, old_at.offset);   /* why a range cannot tell them */
    assert_int_equal(lmc_l1_manager_reserve_read_prefix(f->m, &missing, 1, 1, &now_id), 0);
    /* The first lookup's two shares went with the old copy: nothing to give. */
    assert_int_equal(lmc_l1_manager_finish_read_copies(f->m, &k, &old_id, 1, 2, &r), 0);
    assert_int_equal(r, LMC_L1_KEY_NOT_EXIST);
    assert_int_equal(delete1(f->m, 4, false), LMC_L1_KEY_IS_LOCKED);   /* the share stays */
    now_id = 0;   /* a key the lookup did not lock */
    assert_int_equal(lmc_l1_manager_finish_read_copies(f->m, &k, &now_id, 1, 1, &r), 0);
    assert_int_equal(r, LMC_L1_KEY_NOT_EXIST);
    assert_int_equal(delete1(f->m, 4, false), LMC_L1_KEY_IS_LOCKED);
    assert_int_equal(lmc_l1_manager_finish_read_copies(f->m, &k, &new_id, 1, 1, &r), 0);
    assert_int_equal(r, LMC_L1_SUCCESS);
    assert_int_equal(delete1(f->m, 4, false), LMC_L1_SUCCESS);
    /* NULL copies: any resident copy, as finish_read by key. */
    put_resident(f->m, 4);
    assert_int_equal(lmc_l1_manager_reserve_read_prefix(f->m, &k, 1, 1, NULL), 1);
    assert_int_equal(lmc_l1_manager_finish_read_copies(f->m, &k, NULL, 1, 1, &r), 0);
    assert_int_equal(r, LMC_L1_SUCCESS);
    assert_int_equal(delete1(f->m, 4, false), LMC_L1_SUCCESS);
}

/* A writer whose buffer of a key was retired by a forced clear cannot
 * reserve that key again until that write is finished: its finish would
 * otherwise publish the second buffer, which may not be written yet. */
static void test_writer_cannot_restage_a_retired_key(void **state)
{
    fixture *f = *state;
    uint64_t first, off;
    assert_int_equal(reserve1(f->m, 8, "engine", false, &first), LMC_L1_SUCCESS);
    assert_int_equal(lmc_l1_manager_clear(f->m, true), 1);
    assert_int_equal(reserve1(f->m, 8, "engine", false, NULL), LMC_L1_KEY_IN_WRONG_STATE);
    assert_int_equal(reserve1(f->m, 8, "other", false, &off), LMC_L1_SUCCESS);
    assert_true(off != first);
    assert_int_equal(finish1(f->m, 8, "engine"), LMC_L1_KEY_NOT_EXIST);   /* void */
    assert_int_equal(stats(f->m).num_retired, 0);
    assert_int_equal(peek1(f->m, 8, NULL), LMC_L1_KEY_NOT_EXIST);          /* not published */
    assert_int_equal(reserve1(f->m, 8, "engine", false, &off), LMC_L1_SUCCESS);
    assert_int_equal(finish1(f->m, 8, "engine"), LMC_L1_SUCCESS);
    assert_int_equal(finish1(f->m, 8, "other"), LMC_L1_SUCCESS);   /* already resident */
    assert_int_equal(stats(f->m).num_objects, 1);
    /* A retired write whose lock expired no longer blocks its writer. */
    assert_int_equal(reserve1(f->m, 9, "engine", false, NULL), LMC_L1_SUCCESS);
    assert_int_equal(lmc_l1_manager_clear(f->m, true), 2);
    f->clock.now += WRITE_TTL_MS;
    assert_int_equal(reserve1(f->m, 9, "engine", false, NULL), LMC_L1_SUCCESS);
    assert_int_equal(stats(f->m).num_retired, 0);
    assert_true(lmc_l1_manager_memcheck(f->m));
}

/* ---- lazy growth, status, scale ------------------------------------------ */

static void test_lazy_growth_and_usage(void **state)
{
    (void)state;
    fake_clock clock = {0};
    lmc_l1_manager *m = new_manager(&clock, 8 * PAGE, 2 * PAGE);
    uint64_t used, total;
    lmc_l1_manager_usage(m, &used, &total);
    assert_int_equal(total, 2 * PAGE);
    assert_int_equal(reserve1(m, 1, "w", false, NULL), LMC_L1_SUCCESS);
    lmc_object_key keys[2] = {make_key(2), make_key(3)};
    uint64_t offs[2];
    lmc_l1_result res[2];
    assert_int_equal(lmc_l1_manager_reserve_write(m, keys, NULL, 2, PAGE, "w", offs, res), 0);
    assert_int_equal(res[0], LMC_L1_OUT_OF_MEMORY);
    lmc_l1_manager_usage(m, &used, &total);
    assert_int_equal(used, PAGE);                    /* ratio 0.5 of the committed part */
    assert_int_equal(lmc_l1_manager_grow(m, 2 * PAGE), 4 * PAGE);
    assert_int_equal(lmc_l1_manager_reserve_write(m, keys, NULL, 2, PAGE, "w", offs, res), 0);
    assert_int_equal(res[1], LMC_L1_SUCCESS);
    assert_int_equal(lmc_l1_manager_grow(m, 100 * PAGE), 8 * PAGE);   /* clamped */
    lmc_l1_stats s = stats(m);
    assert_int_equal(s.configured_bytes, 8 * PAGE);
    assert_int_equal(s.committed_bytes, 8 * PAGE);
    assert_true(lmc_l1_manager_memcheck(m));
    lmc_l1_manager_free(m);
}

static void test_report_status(void **state)
{
    fixture *f = *state;
    put_resident(f->m, 1);
    assert_int_equal(read_lock1(f->m, 1, 1), LMC_L1_SUCCESS);
    assert_int_equal(reserve1(f->m, 2, "w", true, NULL), LMC_L1_SUCCESS);
    json_t *st = lmc_l1_manager_report_status(f->m);
    assert_non_null(st);
    assert_true(json_is_true(json_object_get(st, "is_healthy")));
    assert_int_equal(json_integer_value(json_object_get(st, "num_objects")), 1);
    assert_int_equal(json_integer_value(json_object_get(st, "num_staging_objects")), 1);
    assert_int_equal(json_integer_value(json_object_get(st, "num_locked_objects")), 1);
    assert_int_equal(json_integer_value(json_object_get(st, "num_temporary_objects")), 0);
    assert_int_equal(json_integer_value(json_object_get(st, "memory_used_bytes")), 2 * PAGE);
    assert_int_equal(json_integer_value(json_object_get(st, "memory_total_bytes")), 16 * PAGE);
    assert_int_equal(json_integer_value(json_object_get(st, "memory_configured_bytes")),
                     16 * PAGE);
    assert_true(json_real_value(json_object_get(st, "memory_usage_ratio")) == 0.125);
    json_t *by_backend = json_object_get(st, "capacity_bytes_by_backend");
    assert_int_equal(json_integer_value(json_object_get(by_backend, "dram")), 16 * PAGE);
    assert_int_equal(json_integer_value(json_object_get(st, "write_ttl_seconds")), 600);
    assert_int_equal(json_integer_value(json_object_get(st, "read_ttl_seconds")), 300);
    json_decref(st);
    assert_int_equal(unlock1(f->m, 1, 1), LMC_L1_SUCCESS);
}

static void test_many_objects(void **state)
{
    (void)state;
    enum { N = 300000, BATCH = 1000 };
    fake_clock clock = {0};
    lmc_l1_manager_options o = {
        .configured_bytes = (uint64_t)N * 64, .committed_bytes = (uint64_t)N * 64,
        .align_bytes = 64, .write_ttl_ms = 1000, .read_ttl_ms = 1000,
        .clock = read_fake_clock, .clock_user = &clock,
    };
    lmc_l1_manager *m = lmc_l1_manager_new(&o);
    assert_non_null(m);
    lmc_object_key *keys = malloc(BATCH * sizeof(*keys));
    uint64_t *offs = malloc(BATCH * sizeof(*offs));
    lmc_l1_result *res = malloc(BATCH * sizeof(*res));
    for (uint64_t base = 0; base < N; base += BATCH) {
        for (int i = 0; i < BATCH; i++)
            keys[i] = make_key(base + (uint64_t)i);
        assert_int_equal(lmc_l1_manager_reserve_write(m, keys, NULL, BATCH, 64, "w", offs, res),
                         0);
        assert_int_equal(res[BATCH - 1], LMC_L1_SUCCESS);
        assert_int_equal(lmc_l1_manager_finish_write(m, keys, BATCH, "w", res), 0);
    }
    assert_int_equal(stats(m).num_objects, N);
    assert_int_equal(stats(m).used_bytes, (uint64_t)N * 64);
    for (uint64_t id = 0; id < N; id += 997)
        assert_int_equal(delete1(m, id, false), LMC_L1_SUCCESS);
    assert_int_equal(peek1(m, 997, NULL), LMC_L1_KEY_NOT_EXIST);
    assert_int_equal(read_lock1(m, 998, 1), LMC_L1_SUCCESS);
    assert_true(lmc_l1_manager_memcheck(m));
    assert_int_equal(lmc_l1_manager_clear(m, true), N - (N + 996) / 997);
    free(keys);
    free(offs);
    free(res);
    lmc_l1_manager_free(m);
}

/* ---- listeners ----------------------------------------------------------- */

#define MAX_RECORDED 64

typedef struct recorder {
    lmc_l1_manager *m;
    lmc_l1_event_kind kinds[MAX_RECORDED];
    size_t counts[MAX_RECORDED];
    uint64_t first_ids[MAX_RECORDED];
    size_t num;
    bool lock_on_write_finished;   /* call back into the manager */
} recorder;

static uint64_t key_id(const lmc_object_key *k)
{
    uint64_t id;
    memcpy(&id, k->chunk_hash, sizeof(id));
    return id;
}

static void record_event(void *user, lmc_l1_event_kind kind, const lmc_object_key *keys,
                         size_t n)
{
    recorder *rec = user;
    assert_true(rec->num < MAX_RECORDED);
    rec->kinds[rec->num] = kind;
    rec->counts[rec->num] = n;
    rec->first_ids[rec->num] = key_id(&keys[0]);
    rec->num++;
    /* would deadlock if the manager mutex were held here */
    lmc_l1_stats s;
    lmc_l1_manager_stats(rec->m, &s);
    if (rec->lock_on_write_finished && kind == LMC_L1_EVENT_WRITE_FINISHED) {
        lmc_l1_result res[8];
        assert_true(n <= 8);
        assert_int_equal(lmc_l1_manager_reserve_read(rec->m, keys, n, 1, res), 0);
        for (size_t i = 0; i < n; i++)
            assert_int_equal(res[i], LMC_L1_SUCCESS);
    }
}

static void expect_event(const recorder *rec, size_t i, lmc_l1_event_kind kind, size_t n,
                         uint64_t first_id)
{
    assert_true(i < rec->num);
    assert_string_equal(lmc_l1_event_kind_name(rec->kinds[i]), lmc_l1_event_kind_name(kind));
    assert_int_equal(rec->counts[i], n);
    assert_int_equal(rec->first_ids[i], first_id);
}

static void test_listener_events(void **state)
{
    fixture *f = *state;
    recorder rec = {.m = f->m};
    assert_int_equal(lmc_l1_manager_add_listener(f->m, record_event, &rec), 0);
    lmc_object_key keys[2] = {make_key(1), make_key(2)};
    uint64_t offs[2];
    lmc_l1_result res[2];
    assert_int_equal(lmc_l1_manager_reserve_write(f->m, keys, NULL, 2, PAGE, "w", offs, res), 0);
    assert_int_equal(lmc_l1_manager_finish_write(f->m, keys, 2, "w", res), 0);
    assert_int_equal(lmc_l1_manager_reserve_read(f->m, keys, 2, 1, res), 0);
    assert_int_equal(lmc_l1_manager_finish_read(f->m, keys, NULL, 2, 1, res), 0);
    lmc_l1_manager_touch(f->m, keys + 1, 1);
    assert_int_equal(lmc_l1_manager_delete(f->m, keys, 2, false, res), 0);
    assert_int_equal(finish1(f->m, 3, "w"), LMC_L1_KEY_NOT_EXIST);   /* no event */
    assert_int_equal(reserve1(f->m, 3, "t", true, NULL), LMC_L1_SUCCESS);
    assert_int_equal(finish1(f->m, 3, "t"), LMC_L1_SUCCESS);   /* temporary: no write event */
    assert_int_equal(read_lock1(f->m, 3, 1), LMC_L1_SUCCESS);
    assert_int_equal(unlock1(f->m, 3, 1), LMC_L1_SUCCESS);     /* frees it */
    expect_event(&rec, 0, LMC_L1_EVENT_WRITE_RESERVED, 2, 1);
    expect_event(&rec, 1, LMC_L1_EVENT_WRITE_FINISHED, 2, 1);
    expect_event(&rec, 2, LMC_L1_EVENT_READ_RESERVED, 2, 1);
    expect_event(&rec, 3, LMC_L1_EVENT_READ_FINISHED, 2, 1);
    expect_event(&rec, 4, LMC_L1_EVENT_ACCESSED, 1, 2);
    expect_event(&rec, 5, LMC_L1_EVENT_DELETED, 2, 1);
    expect_event(&rec, 6, LMC_L1_EVENT_WRITE_RESERVED, 1, 3);
    expect_event(&rec, 7, LMC_L1_EVENT_READ_RESERVED, 1, 3);
    expect_event(&rec, 8, LMC_L1_EVENT_READ_FINISHED, 1, 3);
    expect_event(&rec, 9, LMC_L1_EVENT_DELETED, 1, 3);
    assert_int_equal(rec.num, 10);
    lmc_l1_manager_remove_listener(f->m, record_event, &rec);
    put_resident(f->m, 4);
    assert_int_equal(rec.num, 10);
}

static void test_listener_may_call_back(void **state)
{
    fixture *f = *state;
    recorder rec = {.m = f->m, .lock_on_write_finished = true};
    assert_int_equal(lmc_l1_manager_add_listener(f->m, record_event, &rec), 0);
    lmc_object_key keys[3] = {make_key(1), make_key(2), make_key(3)};
    uint64_t offs[3];
    lmc_l1_result res[3];
    assert_int_equal(lmc_l1_manager_reserve_write(f->m, keys, NULL, 3, PAGE, "w", offs, res), 0);
    assert_int_equal(lmc_l1_manager_finish_write(f->m, keys, 3, "w", res), 0);
    /* the nested reserve_read ran and its event followed the outer one */
    assert_int_equal(peek1(f->m, 2, NULL), LMC_L1_SUCCESS);
    expect_event(&rec, 1, LMC_L1_EVENT_WRITE_FINISHED, 3, 1);
    expect_event(&rec, 2, LMC_L1_EVENT_READ_RESERVED, 3, 1);
    assert_int_equal(rec.num, 3);
    assert_int_equal(lmc_l1_manager_clear(f->m, true), 3);
    assert_int_equal(rec.num, 4);
    assert_int_equal(rec.kinds[3], LMC_L1_EVENT_DELETED);
    assert_int_equal(rec.counts[3], 3);
}

/* ---- concurrency (meaningful under TSan) --------------------------------- */

typedef struct worker {
    lmc_l1_manager *m;
    unsigned seed;
    char tag[8];
} worker;

static size_t count_events(void *user, size_t add)
{
    size_t *counter = user;
    return __atomic_add_fetch(counter, add, __ATOMIC_RELAXED);
}

static void count_listener(void *user, lmc_l1_event_kind kind, const lmc_object_key *keys,
                           size_t n)
{
    (void)kind;
    (void)keys;
    count_events(user, n);
}

static void *worker_main(void *arg)
{
    worker *w = arg;
    lmc_object_key keys[4];
    uint64_t offs[4];
    lmc_l1_result res[4];
    lmc_l1_range ranges[4];
    for (int step = 0; step < 3000; step++) {
        for (int i = 0; i < 4; i++)
            keys[i] = make_key((uint64_t)(rand_r(&w->seed) % 24));
        switch (rand_r(&w->seed) % 6) {
        case 0: lmc_l1_manager_reserve_write(w->m, keys, NULL, 4, PAGE, w->tag, offs, res); break;
        case 1: lmc_l1_manager_finish_write(w->m, keys, 4, w->tag, res); break;
        case 2: lmc_l1_manager_reserve_read(w->m, keys, 4, 1, res); break;
        case 3: lmc_l1_manager_finish_read(w->m, keys, NULL, 4, 1, res); break;
        case 4: lmc_l1_manager_delete(w->m, keys, 4, false, res); break;
        default: lmc_l1_manager_unsafe_read(w->m, keys, 4, ranges, res); break;
        }
    }
    return NULL;
}

static void test_concurrent_operations(void **state)
{
    fixture *f = *state;
    size_t events = 0;
    assert_int_equal(lmc_l1_manager_add_listener(f->m, count_listener, &events), 0);
    pthread_t threads[4];
    worker workers[4];
    for (int i = 0; i < 4; i++) {
        workers[i] = (worker){.m = f->m, .seed = 17u + (unsigned)i};
        snprintf(workers[i].tag, sizeof(workers[i].tag), "t%d", i % 2);
        assert_int_equal(pthread_create(&threads[i], NULL, worker_main, &workers[i]), 0);
    }
    for (int i = 0; i < 4; i++)
        pthread_join(threads[i], NULL);
    assert_true(lmc_l1_manager_memcheck(f->m));
    assert_true(count_events(&events, 0) > 0);
    lmc_l1_manager_clear(f->m, true);
    f->clock.now += WRITE_TTL_MS;   /* locks the workers left behind expire */
    lmc_l1_manager_clear(f->m, true);
    assert_int_equal(stats(f->m).used_bytes, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_reserve_then_finish, setup, teardown),
        cmocka_unit_test_setup_teardown(test_reserve_conflicts, setup, teardown),
        cmocka_unit_test_setup_teardown(test_duplicate_key_in_batch, setup, teardown),
        cmocka_unit_test_setup_teardown(test_out_of_memory_is_all_or_nothing, setup, teardown),
        cmocka_unit_test_setup_teardown(test_finish_write_errors_and_expiry, setup, teardown),
        cmocka_unit_test_setup_teardown(test_takeover_of_expired_staging, setup, teardown),
        cmocka_unit_test_setup_teardown(test_finish_write_and_reserve_read, setup, teardown),
        cmocka_unit_test_setup_teardown(test_finish_write_and_delete, setup, teardown),
        cmocka_unit_test_setup_teardown(test_read_count_is_clamped, setup, teardown),
        cmocka_unit_test_setup_teardown(test_expired_read_lock_is_ignored, setup, teardown),
        cmocka_unit_test_setup_teardown(test_reserve_read_prefix, setup, teardown),
        cmocka_unit_test_setup_teardown(test_temporary_freed_on_last_read, setup, teardown),
        cmocka_unit_test_setup_teardown(test_delete_cases, setup, teardown),
        cmocka_unit_test_setup_teardown(test_clear_non_force_and_force, setup, teardown),
        cmocka_unit_test_setup_teardown(test_forced_clear_keeps_buffers_in_use, setup, teardown),
        cmocka_unit_test_setup_teardown(test_unpin_reaches_the_copy_read, setup, teardown),
        cmocka_unit_test_setup_teardown(test_end_read_releases_the_copy_read, setup, teardown),
        cmocka_unit_test_setup_teardown(test_finish_read_copies_spares_a_newer_copy, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_writer_cannot_restage_a_retired_key, setup, teardown),
        cmocka_unit_test(test_lazy_growth_and_usage),
        cmocka_unit_test_setup_teardown(test_report_status, setup, teardown),
        cmocka_unit_test(test_many_objects),
        cmocka_unit_test_setup_teardown(test_listener_events, setup, teardown),
        cmocka_unit_test_setup_teardown(test_listener_may_call_back, setup, teardown),
        cmocka_unit_test_setup_teardown(test_concurrent_operations, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
