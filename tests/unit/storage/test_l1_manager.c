/* L1 manager: every state transition and result code (docs/storage.md,
 * "L1 manager"), the lease rules ("Leases") with their ledger, TTL expiry
 * through an injected clock, listeners outside the lock.  Every
 * manager here checks its books after each mutating call, so a broken
 * invariant aborts the test that broke it. */
#include <pthread.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "storage/l1/l1_internal.h"   /* test_books_catch_corruption pokes the books */
#include "storage/l1/l1_manager.h"

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
        .check_books = true,
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

static void assert_books_balance(lmc_l1_manager *m)
{
    assert_true(lmc_l1_manager_check_books(m));
    assert_int_equal(lmc_l1_manager_invariant_violations(m), 0);
}

static int teardown(void **state)
{
    fixture *f = *state;
    assert_books_balance(f->m);
    lmc_l1_manager_free(f->m);
    free(f);
    return 0;
}

/* One-key helpers returning the result code; a lease that was not granted
 * is NONE. */
static lmc_l1_result write1(lmc_l1_manager *m, uint64_t id, const char *tag, bool temp,
                            lmc_lease *lease)
{
    lmc_object_key k = make_key(id);
    lmc_l1_result r;
    lmc_lease tmp;
    lmc_lease *l = lease ? lease : &tmp;
    assert_int_equal(lmc_l1_manager_lease_write(m, &k, &temp, 1, PAGE, tag, l, &r), 0);
    assert_int_equal(l->kind, r == LMC_L1_SUCCESS ? LMC_LEASE_WRITE : LMC_LEASE_NONE);
    return r;
}

static lmc_l1_result publish1(lmc_l1_manager *m, uint64_t id, lmc_lease *lease,
                              uint32_t readers)
{
    lmc_object_key k = make_key(id);
    lmc_l1_result r;
    assert_int_equal(lmc_l1_manager_publish_writes(m, &k, lease, 1, readers, &r), 0);
    return r;
}

static lmc_l1_result read1(lmc_l1_manager *m, uint64_t id, uint32_t readers, lmc_lease *lease)
{
    lmc_object_key k = make_key(id);
    lmc_l1_result r;
    lmc_lease tmp;
    lmc_lease *l = lease ? lease : &tmp;
    size_t granted = lmc_l1_manager_lease_read(m, &k, 1, readers, false, NULL, l, &r);
    assert_int_equal(granted, r == LMC_L1_SUCCESS);
    assert_int_equal(l->kind, r == LMC_L1_SUCCESS ? LMC_LEASE_READ : LMC_LEASE_NONE);
    return r;
}

static lmc_l1_result copy1(lmc_l1_manager *m, uint64_t id, lmc_copy_share share,
                           lmc_lease *lease)
{
    lmc_object_key k = make_key(id);
    lmc_l1_result r;
    lmc_lease tmp;
    lmc_lease *l = lease ? lease : &tmp;
    size_t granted = lmc_l1_manager_lease_copy(m, &k, 1, share, false, NULL, l, &r);
    assert_int_equal(granted, r == LMC_L1_SUCCESS);
    assert_int_equal(l->kind, r == LMC_L1_SUCCESS ? LMC_LEASE_COPY : LMC_LEASE_NONE);
    /* A probe that was refused must not leave a lease behind to leak. */
    assert_true(lease || r != LMC_L1_SUCCESS);
    return r;
}

/* Whether a retrieve could copy the key now: it needs a live read lock,
 * which is what the old unsafe_read reported.  Takes nothing when it says
 * no; callers only ask this when the answer is expected to be no. */
static lmc_l1_result readable1(lmc_l1_manager *m, uint64_t id)
{
    return copy1(m, id, LMC_COPY_CARRIES_SHARE, NULL);
}

static void back1(lmc_l1_manager *m, uint64_t id, lmc_lease *lease)
{
    lmc_object_key k = make_key(id);
    lmc_l1_manager_give_back(m, &k, lease, 1);
    assert_int_equal(lease->kind, lease->kind == LMC_LEASE_NONE ? LMC_LEASE_NONE
                                                                : LMC_LEASE_RETURNED);
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
    lmc_lease w;
    assert_int_equal(write1(m, id, "w", false, &w), LMC_L1_SUCCESS);
    assert_int_equal(publish1(m, id, &w, 0), LMC_L1_SUCCESS);
    assert_int_equal(w.kind, LMC_LEASE_RETURNED);
}

static lmc_l1_stats stats(lmc_l1_manager *m)
{
    lmc_l1_stats s;
    lmc_l1_manager_stats(m, &s);
    return s;
}

static lmc_lease_counts ledger(lmc_l1_manager *m)
{
    lmc_lease_counts c;
    lmc_l1_manager_lease_counts(m, &c);
    return c;
}

static uint64_t outstanding(const lmc_lease_counts *c, lmc_lease_kind k)
{
    return c->granted[k] - c->returned[k] - c->lapsed[k];
}

/* ---- write path ---------------------------------------------------------- */

static void test_reserve_then_finish(void **state)
{
    fixture *f = *state;
    lmc_object_key keys[3] = {make_key(1), make_key(2), make_key(3)};
    lmc_lease w[3];
    lmc_l1_result res[3];
    assert_int_equal(lmc_l1_manager_lease_write(f->m, keys, NULL, 3, 100, "w", w, res), 0);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(res[i], LMC_L1_SUCCESS);
        assert_int_equal(w[i].kind, LMC_LEASE_WRITE);
        assert_int_equal(w[i].size, PAGE);
        assert_int_equal(w[i].object_size, 100);
        assert_int_not_equal(w[i].copy, 0);
    }
    assert_true(w[0].offset != w[1].offset && w[1].offset != w[2].offset &&
                w[0].offset != w[2].offset);
    uint64_t offs[3] = {w[0].offset, w[1].offset, w[2].offset};
    lmc_l1_stats s = stats(f->m);
    assert_int_equal(s.num_staging, 3);
    assert_int_equal(s.num_objects, 0);
    assert_int_equal(s.staging_bytes, 3 * PAGE);
    assert_int_equal(s.used_bytes, 3 * PAGE);
    /* staging is invisible to readers */
    assert_int_equal(readable1(f->m, 1), LMC_L1_KEY_NOT_EXIST);
    assert_int_equal(read1(f->m, 1, 1, NULL), LMC_L1_KEY_NOT_EXIST);
    assert_int_equal(lmc_l1_manager_publish_writes(f->m, keys, w, 3, 0, res), 0);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(res[i], LMC_L1_SUCCESS);
        assert_int_equal(w[i].kind, LMC_LEASE_RETURNED);
    }
    s = stats(f->m);
    assert_int_equal(s.num_staging, 0);
    assert_int_equal(s.num_objects, 3);
    assert_int_equal(s.object_bytes, 3 * PAGE);
    /* resident but not read-locked */
    assert_int_equal(readable1(f->m, 2), LMC_L1_KEY_NOT_READABLE);
    lmc_lease lookup, copy;
    assert_int_equal(read1(f->m, 2, 1, &lookup), LMC_L1_SUCCESS);
    assert_int_equal(lookup.offset, offs[1]);
    assert_int_equal(copy1(f->m, 2, LMC_COPY_CARRIES_SHARE, &copy), LMC_L1_SUCCESS);
    assert_int_equal(copy.offset, offs[1]);
    assert_int_equal(copy.size, PAGE);
    assert_int_equal(copy.object_size, 100);   /* what L2 copies, not the aligned size */
    assert_int_equal(copy.copy, lookup.copy);
    back1(f->m, 2, &copy);                     /* with the lookup's share it carried */
    assert_int_equal(evictable1(f->m, 2), LMC_L1_EVICTABLE);
}

static void test_reserve_conflicts(void **state)
{
    fixture *f = *state;
    put_resident(f->m, 1);
    assert_int_equal(write1(f->m, 1, "w", false, NULL), LMC_L1_KEY_NOT_WRITABLE);
    lmc_lease a, b;
    assert_int_equal(write1(f->m, 2, "a", false, &a), LMC_L1_SUCCESS);
    assert_int_equal(write1(f->m, 2, "a", false, NULL), LMC_L1_KEY_NOT_WRITABLE);
    assert_int_equal(write1(f->m, 2, "b", false, &b), LMC_L1_SUCCESS);   /* other tag */
    assert_int_equal(stats(f->m).num_staging, 2);
    assert_int_equal(publish1(f->m, 2, &a, 0), LMC_L1_SUCCESS);
    /* b's copy arrives second: freed, still SUCCESS */
    uint64_t used_before = stats(f->m).used_bytes;
    assert_int_equal(publish1(f->m, 2, &b, 0), LMC_L1_SUCCESS);
    assert_int_equal(stats(f->m).used_bytes, used_before - PAGE);
    assert_int_equal(stats(f->m).num_objects, 2);
    lmc_lease lookup, copy;
    assert_int_equal(read1(f->m, 2, 1, &lookup), LMC_L1_SUCCESS);
    assert_int_equal(copy1(f->m, 2, LMC_COPY_CARRIES_SHARE, &copy), LMC_L1_SUCCESS);
    assert_true(copy.offset != b.offset);
    assert_int_equal(copy.offset, a.offset);
    back1(f->m, 2, &copy);
}

static void test_duplicate_key_in_batch(void **state)
{
    fixture *f = *state;
    lmc_object_key keys[3] = {make_key(7), make_key(8), make_key(7)};
    lmc_lease w[3];
    lmc_l1_result res[3];
    assert_int_equal(lmc_l1_manager_lease_write(f->m, keys, NULL, 3, PAGE, "w", w, res), 0);
    assert_int_equal(res[0], LMC_L1_SUCCESS);
    assert_int_equal(res[1], LMC_L1_SUCCESS);
    assert_int_equal(res[2], LMC_L1_KEY_NOT_WRITABLE);
    assert_int_equal(w[2].kind, LMC_LEASE_NONE);
    assert_int_equal(stats(f->m).staging_bytes, 2 * PAGE);
    assert_int_equal(stats(f->m).used_bytes, 2 * PAGE);
    lmc_lease_counts c = ledger(f->m);
    assert_int_equal(c.granted[LMC_LEASE_WRITE], 2);
}

static void test_out_of_memory_is_all_or_nothing(void **state)
{
    fixture *f = *state;
    lmc_object_key keys[16];
    lmc_lease w[16];
    lmc_l1_result res[16];
    for (int i = 0; i < 16; i++)
        keys[i] = make_key(100 + (uint64_t)i);
    assert_int_equal(lmc_l1_manager_lease_write(f->m, keys, NULL, 14, PAGE, "w", w, res), 0);
    assert_int_equal(lmc_l1_manager_publish_writes(f->m, keys, w, 1, 0, res), 0);
    /* 2 pages free: key 100 is resident, 3 new keys need 3 pages */
    lmc_object_key batch[4] = {keys[0], make_key(1), make_key(2), make_key(3)};
    lmc_lease x[4];
    assert_int_equal(lmc_l1_manager_lease_write(f->m, batch, NULL, 4, PAGE, "x", x, res), 0);
    assert_int_equal(res[0], LMC_L1_KEY_NOT_WRITABLE);
    for (int i = 1; i < 4; i++)
        assert_int_equal(res[i], LMC_L1_OUT_OF_MEMORY);
    for (int i = 0; i < 4; i++)
        assert_int_equal(x[i].kind, LMC_LEASE_NONE);
    lmc_l1_stats s = stats(f->m);
    assert_int_equal(s.num_staging, 13);
    assert_int_equal(s.used_bytes, 14 * PAGE);
    /* two fit */
    assert_int_equal(lmc_l1_manager_lease_write(f->m, batch + 1, NULL, 2, PAGE, "x", x, res), 0);
    assert_int_equal(res[0], LMC_L1_SUCCESS);
    assert_int_equal(res[1], LMC_L1_SUCCESS);
    /* bad arguments */
    assert_int_equal(lmc_l1_manager_lease_write(f->m, batch, NULL, 1, 0, "x", x, res), -1);
    assert_int_equal(lmc_l1_manager_lease_write(f->m, batch, NULL, 1, PAGE, NULL, x, res), -1);
}

static void test_finish_write_errors_and_expiry(void **state)
{
    fixture *f = *state;
    lmc_lease none = {0}, w;
    assert_int_equal(publish1(f->m, 1, &none, 0), LMC_L1_KEY_NOT_EXIST);
    assert_int_equal(none.kind, LMC_LEASE_NONE);
    assert_int_equal(write1(f->m, 1, "w", false, &w), LMC_L1_SUCCESS);
    /* Another writer, holding no WRITE lease of the key, publishes nothing. */
    assert_int_equal(publish1(f->m, 1, &none, 0), LMC_L1_KEY_NOT_EXIST);
    assert_int_equal(stats(f->m).num_staging, 1);
    assert_int_equal(evictable1(f->m, 1), LMC_L1_NOT_EVICTABLE);
    f->clock.now += WRITE_TTL_MS - 1;
    assert_int_equal(evictable1(f->m, 1), LMC_L1_NOT_EVICTABLE);
    f->clock.now += 1;   /* expired */
    assert_int_equal(evictable1(f->m, 1), LMC_L1_EVICTABLE);
    assert_int_equal(publish1(f->m, 1, &w, 0), LMC_L1_KEY_IN_WRONG_STATE);
    assert_int_equal(w.kind, LMC_LEASE_WRITE);       /* still the holder's to give back */
    assert_int_equal(stats(f->m).num_staging, 1);   /* left for reclamation */
    assert_int_equal(publish1(f->m, 1, &w, 1), LMC_L1_KEY_IN_WRONG_STATE);
    assert_int_equal(w.kind, LMC_LEASE_WRITE);
    assert_int_equal(stats(f->m).num_locked, 0);
    /* Giving the lapsed write back frees it (give_back never fails) and
     * says it came too late. */
    back1(f->m, 1, &w);
    lmc_lease_counts c = ledger(f->m);
    assert_int_equal(c.returned_expired, 1);
    assert_int_equal(c.returned[LMC_LEASE_WRITE], 1);
    assert_int_equal(stats(f->m).num_staging, 0);
    assert_int_equal(stats(f->m).used_bytes, 0);
    assert_int_equal(evictable1(f->m, 1), LMC_L1_GONE);
    assert_int_equal(evictable1(f->m, 99), LMC_L1_GONE);
}

static void test_takeover_of_expired_staging(void **state)
{
    fixture *f = *state;
    lmc_lease first, second;
    assert_int_equal(write1(f->m, 1, "w", false, &first), LMC_L1_SUCCESS);
    f->clock.now += WRITE_TTL_MS + 5;
    assert_int_equal(write1(f->m, 1, "other", false, NULL), LMC_L1_SUCCESS);   /* other tag */
    assert_int_equal(write1(f->m, 1, "w", false, &second), LMC_L1_SUCCESS);
    assert_int_equal(second.offset, first.offset);        /* same buffer taken over */
    assert_int_not_equal(second.copy, first.copy);         /* under a new name */
    assert_int_equal(ledger(f->m).lapsed[LMC_LEASE_WRITE], 1);
    assert_int_equal(stats(f->m).num_staging, 2);
    assert_int_equal(evictable1(f->m, 1), LMC_L1_NOT_EVICTABLE);
    /* The first lease names the old write: it publishes nothing. */
    lmc_lease late = first;
    assert_int_equal(publish1(f->m, 1, &late, 0), LMC_L1_KEY_NOT_EXIST);
    assert_int_equal(stats(f->m).num_staging, 2);
    assert_int_equal(publish1(f->m, 1, &second, 0), LMC_L1_SUCCESS);   /* lock renewed */
    /* expired reservation with a different size: replaced */
    assert_int_equal(write1(f->m, 2, "w", false, &first), LMC_L1_SUCCESS);
    f->clock.now += WRITE_TTL_MS;
    lmc_object_key k = make_key(2);
    lmc_l1_result r;
    assert_int_equal(lmc_l1_manager_lease_write(f->m, &k, NULL, 1, 3 * PAGE, "w", &second, &r),
                     0);
    assert_int_equal(r, LMC_L1_SUCCESS);
    assert_int_equal(second.size, 3 * PAGE);
    assert_int_equal(stats(f->m).staging_bytes, 3 * PAGE + PAGE);   /* + "other" on key 1 */
    assert_int_equal(ledger(f->m).lapsed[LMC_LEASE_WRITE], 2);
    assert_books_balance(f->m);
}

static void test_finish_write_and_reserve_read(void **state)
{
    fixture *f = *state;
    lmc_object_key k = make_key(5);
    lmc_lease w, probe, c;
    assert_int_equal(write1(f->m, 5, "w", false, &w), LMC_L1_SUCCESS);
    lmc_l1_copy_id written = w.copy;
    assert_int_equal(publish1(f->m, 5, &w, 2), LMC_L1_SUCCESS);
    assert_int_equal(w.kind, LMC_LEASE_READ);
    assert_int_equal(w.shares, 2);
    assert_int_not_equal(w.copy, 0);
    assert_int_equal(w.copy, written);
    lmc_l1_result r;
    assert_int_equal(lmc_l1_manager_lease_read(f->m, &k, 1, 1, true, NULL, &probe, &r), 1);
    assert_int_equal(probe.copy, w.copy);
    back1(f->m, 5, &probe);                                    /* that probe's share */
    assert_int_equal(evictable1(f->m, 5), LMC_L1_NOT_EVICTABLE);
    assert_int_equal(stats(f->m).num_locked, 1);
    assert_int_equal(delete1(f->m, 5, false), LMC_L1_KEY_IS_LOCKED);
    /* The two readers' retrieves each carry one of the publish's shares. */
    assert_int_equal(copy1(f->m, 5, LMC_COPY_CARRIES_SHARE, &c), LMC_L1_SUCCESS);
    back1(f->m, 5, &c);
    assert_int_equal(evictable1(f->m, 5), LMC_L1_NOT_EVICTABLE);
    assert_int_equal(copy1(f->m, 5, LMC_COPY_CARRIES_SHARE, &c), LMC_L1_SUCCESS);
    back1(f->m, 5, &c);
    assert_int_equal(readable1(f->m, 5), LMC_L1_KEY_NOT_READABLE);
    /* No share left for the publish's lease itself: it finds no lock. */
    uint64_t expired = ledger(f->m).returned_expired;
    back1(f->m, 5, &w);
    assert_int_equal(ledger(f->m).returned_expired, expired + 1);
    assert_int_equal(readable1(f->m, 5), LMC_L1_KEY_NOT_READABLE);
    /* A share given back for a key no longer stored changes nothing. */
    lmc_lease gone;
    put_resident(f->m, 6);
    assert_int_equal(read1(f->m, 6, 1, &gone), LMC_L1_SUCCESS);
    assert_int_equal(delete1(f->m, 6, true), LMC_L1_SUCCESS);
    uint64_t stale = ledger(f->m).returned_stale;
    back1(f->m, 6, &gone);
    assert_int_equal(ledger(f->m).returned_stale, stale + 1);
    /* already resident: a second writer's copy is freed, lock goes to the resident copy */
    assert_int_equal(write1(f->m, 5, "w", false, NULL), LMC_L1_KEY_NOT_WRITABLE);
    k = make_key(7);
    lmc_lease a, b, resident;
    assert_int_equal(write1(f->m, 7, "a", false, &a), LMC_L1_SUCCESS);
    assert_int_equal(write1(f->m, 7, "b", false, &b), LMC_L1_SUCCESS);
    assert_int_equal(publish1(f->m, 7, &a, 0), LMC_L1_SUCCESS);
    assert_int_equal(lmc_l1_manager_lease_read(f->m, &k, 1, 1, true, NULL, &resident, &r), 1);
    assert_int_equal(publish1(f->m, 7, &b, 1), LMC_L1_SUCCESS);
    assert_int_equal(b.kind, LMC_LEASE_READ);
    assert_int_equal(b.copy, resident.copy);   /* b's copy was dropped; a's is the one locked */
    assert_int_equal(b.offset, a.offset);
    assert_int_equal(stats(f->m).used_bytes, 2 * PAGE);
    lmc_lease both[2] = {b, resident};
    lmc_object_key twice[2] = {k, k};
    lmc_l1_manager_give_back(f->m, twice, both, 2);
    assert_int_equal(delete1(f->m, 7, false), LMC_L1_SUCCESS);   /* no share left */
}

static void test_finish_write_and_delete(void **state)
{
    fixture *f = *state;
    lmc_lease w;
    assert_int_equal(write1(f->m, 5, "w", false, &w), LMC_L1_SUCCESS);
    back1(f->m, 5, &w);
    assert_int_equal(stats(f->m).used_bytes, 0);
    assert_int_equal(evictable1(f->m, 5), LMC_L1_GONE);
    lmc_lease_counts c = ledger(f->m);
    assert_int_equal(c.returned[LMC_LEASE_WRITE], 1);
    assert_int_equal(outstanding(&c, LMC_LEASE_WRITE), 0);
}

/* ---- read path ----------------------------------------------------------- */

static void test_read_count_is_clamped(void **state)
{
    fixture *f = *state;
    put_resident(f->m, 1);
    lmc_lease lookup, one, two, c;
    assert_int_equal(read1(f->m, 1, 1000, &lookup), LMC_L1_SUCCESS);
    assert_int_equal(lookup.shares, 128);
    /* 128 shares, given back one by one by the retrieves that carry them */
    for (int i = 0; i < 127; i++) {
        assert_int_equal(copy1(f->m, 1, LMC_COPY_CARRIES_SHARE, &c), LMC_L1_SUCCESS);
        back1(f->m, 1, &c);
    }
    assert_int_equal(evictable1(f->m, 1), LMC_L1_NOT_EVICTABLE);
    assert_int_equal(copy1(f->m, 1, LMC_COPY_CARRIES_SHARE, &c), LMC_L1_SUCCESS);
    back1(f->m, 1, &c);
    assert_int_equal(readable1(f->m, 1), LMC_L1_KEY_NOT_READABLE);
    assert_int_equal(read1(f->m, 1, 0, &one), LMC_L1_SUCCESS);       /* = 1 */
    assert_int_equal(one.shares, 1);
    assert_int_equal(read1(f->m, 1, 2, &two), LMC_L1_SUCCESS);       /* 3 in all */
    assert_int_equal(two.shares, 2);
    back1(f->m, 1, &two);
    assert_int_equal(evictable1(f->m, 1), LMC_L1_NOT_EVICTABLE);
    back1(f->m, 1, &one);
    assert_int_equal(readable1(f->m, 1), LMC_L1_KEY_NOT_READABLE);
}

static void test_expired_read_lock_is_ignored(void **state)
{
    fixture *f = *state;
    lmc_lease three, one;
    put_resident(f->m, 1);
    assert_int_equal(read1(f->m, 1, 3, &three), LMC_L1_SUCCESS);
    assert_int_equal(three.expiry_ms, f->clock.now + READ_TTL_MS);
    assert_int_equal(evictable1(f->m, 1), LMC_L1_NOT_EVICTABLE);
    f->clock.now += READ_TTL_MS;
    assert_int_equal(readable1(f->m, 1), LMC_L1_KEY_NOT_READABLE);
    assert_int_equal(evictable1(f->m, 1), LMC_L1_EVICTABLE);
    assert_int_equal(stats(f->m).num_locked, 0);
    back1(f->m, 1, &three);
    assert_int_equal(ledger(f->m).returned_expired, 1);
    /* re-locking an expired lock starts from 0 */
    assert_int_equal(read1(f->m, 1, 1, &one), LMC_L1_SUCCESS);
    back1(f->m, 1, &one);
    assert_int_equal(readable1(f->m, 1), LMC_L1_KEY_NOT_READABLE);
    assert_int_equal(read1(f->m, 1, 1, &one), LMC_L1_SUCCESS);
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
    lmc_lease l[4];
    lmc_l1_result res[4];
    assert_int_equal(lmc_l1_manager_lease_read(f->m, keys, 4, 2, true, NULL, l, res), 2);
    assert_int_equal(res[2], LMC_L1_KEY_NOT_EXIST);
    assert_int_equal(l[2].kind, LMC_LEASE_NONE);
    assert_int_equal(l[3].kind, LMC_LEASE_NONE);
    assert_int_equal(l[0].shares, 2);
    assert_int_equal(evictable1(f->m, 1), LMC_L1_NOT_EVICTABLE);
    assert_int_equal(evictable1(f->m, 2), LMC_L1_NOT_EVICTABLE);
    assert_int_equal(readable1(f->m, 4), LMC_L1_KEY_NOT_READABLE);   /* after the miss */
    assert_int_equal(lmc_l1_manager_lease_read(f->m, keys + 2, 2, 1, true, NULL, l + 2, res), 0);
    assert_int_equal(l[3].kind, LMC_LEASE_NONE);
    lmc_l1_manager_give_back(f->m, keys, l, 4);   /* NONE leases are skipped */
    assert_int_equal(stats(f->m).num_locked, 0);
    assert_int_equal(ledger(f->m).returned_twice, 0);
    /* Without prefix every key stands on its own. */
    assert_int_equal(lmc_l1_manager_lease_read(f->m, keys, 4, 1, false, NULL, l, res), 3);
    assert_int_equal(res[2], LMC_L1_KEY_NOT_EXIST);
    assert_int_equal(res[3], LMC_L1_SUCCESS);
    assert_int_equal(stats(f->m).num_locked, 3);
    lmc_l1_manager_give_back(f->m, keys, l, 4);
    assert_int_equal(stats(f->m).num_locked, 0);
}

static void test_temporary_freed_on_last_read(void **state)
{
    fixture *f = *state;
    lmc_lease w, c;
    assert_int_equal(write1(f->m, 9, "prefetch", true, &w), LMC_L1_SUCCESS);
    assert_int_equal(publish1(f->m, 9, &w, 2), LMC_L1_SUCCESS);
    assert_int_equal(stats(f->m).num_temporary, 1);
    assert_int_equal(copy1(f->m, 9, LMC_COPY_CARRIES_SHARE, &c), LMC_L1_SUCCESS);
    back1(f->m, 9, &c);                                   /* the first reader is done */
    assert_int_equal(evictable1(f->m, 9), LMC_L1_NOT_EVICTABLE);
    assert_int_equal(copy1(f->m, 9, LMC_COPY_CARRIES_SHARE, &c), LMC_L1_SUCCESS);
    back1(f->m, 9, &c);                                   /* the last one */
    assert_int_equal(readable1(f->m, 9), LMC_L1_KEY_NOT_EXIST);
    lmc_l1_stats s = stats(f->m);
    assert_int_equal(s.num_temporary, 0);
    assert_int_equal(s.num_objects, 0);
    assert_int_equal(s.used_bytes, 0);
    /* The last share goes while a copy still runs (a FREE_LOOKUP_LOCKS
     * racing a retrieve): the key goes, the buffer waits for the copy. */
    assert_int_equal(write1(f->m, 9, "prefetch", true, &w), LMC_L1_SUCCESS);
    assert_int_equal(publish1(f->m, 9, &w, 1), LMC_L1_SUCCESS);
    assert_int_equal(copy1(f->m, 9, LMC_COPY_CARRIES_SHARE, &c), LMC_L1_SUCCESS);
    back1(f->m, 9, &w);
    assert_int_equal(readable1(f->m, 9), LMC_L1_KEY_NOT_EXIST);
    s = stats(f->m);
    assert_int_equal(s.num_temporary, 0);
    assert_int_equal(s.num_objects, 0);
    assert_int_equal(s.used_bytes, PAGE);   /* the copy still runs */
    back1(f->m, 9, &c);
    assert_int_equal(stats(f->m).used_bytes, 0);
}

/* ---- delete / clear ------------------------------------------------------ */

static void test_delete_cases(void **state)
{
    fixture *f = *state;
    lmc_lease r, a;
    assert_int_equal(delete1(f->m, 1, false), LMC_L1_KEY_NOT_EXIST);
    put_resident(f->m, 1);
    assert_int_equal(delete1(f->m, 1, false), LMC_L1_SUCCESS);
    assert_int_equal(delete1(f->m, 1, false), LMC_L1_KEY_NOT_EXIST);
    put_resident(f->m, 2);
    assert_int_equal(read1(f->m, 2, 1, &r), LMC_L1_SUCCESS);
    assert_int_equal(delete1(f->m, 2, false), LMC_L1_KEY_IS_LOCKED);
    assert_int_equal(delete1(f->m, 2, true), LMC_L1_SUCCESS);
    assert_int_equal(readable1(f->m, 2), LMC_L1_KEY_NOT_EXIST);
    /* live staging blocks a non-force delete */
    assert_int_equal(write1(f->m, 3, "a", false, NULL), LMC_L1_SUCCESS);
    assert_int_equal(delete1(f->m, 3, false), LMC_L1_KEY_IS_LOCKED);
    /* expired staging is reclaimed first; a live one of another tag still locks */
    f->clock.now += WRITE_TTL_MS;
    assert_int_equal(write1(f->m, 3, "b", false, NULL), LMC_L1_SUCCESS);
    assert_int_equal(stats(f->m).num_staging, 2);
    assert_int_equal(delete1(f->m, 3, false), LMC_L1_KEY_IS_LOCKED);
    assert_int_equal(stats(f->m).num_staging, 1);
    f->clock.now += WRITE_TTL_MS;
    assert_int_equal(delete1(f->m, 3, false), LMC_L1_SUCCESS);   /* only expired staging */
    assert_int_equal(stats(f->m).num_staging, 0);
    assert_int_equal(ledger(f->m).lapsed[LMC_LEASE_WRITE], 2);
    /* force drops live staging too */
    assert_int_equal(write1(f->m, 4, "a", false, &a), LMC_L1_SUCCESS);
    assert_int_equal(delete1(f->m, 4, true), LMC_L1_SUCCESS);
    assert_int_equal(publish1(f->m, 4, &a, 0), LMC_L1_KEY_NOT_EXIST);
    /* resident + live staging of the same key: IS_LOCKED without force */
    put_resident(f->m, 5);
    assert_int_equal(write1(f->m, 5, "z", false, NULL), LMC_L1_KEY_NOT_WRITABLE);
    assert_int_equal(stats(f->m).used_bytes, PAGE);
}

static void test_clear_non_force_and_force(void **state)
{
    fixture *f = *state;
    lmc_lease r2, c, w4;
    assert_int_equal(write1(f->m, 3, "old", false, NULL), LMC_L1_SUCCESS);
    f->clock.now += WRITE_TTL_MS;                                 /* 3: expired staging */
    put_resident(f->m, 1);                                        /* unlocked: dropped */
    put_resident(f->m, 2);
    assert_int_equal(read1(f->m, 2, 1, &r2), LMC_L1_SUCCESS);     /* locked: kept */
    assert_int_equal(write1(f->m, 4, "new", false, &w4), LMC_L1_SUCCESS);   /* live */
    assert_int_equal(lmc_l1_manager_clear(f->m, false), 2);
    lmc_l1_stats s = stats(f->m);
    assert_int_equal(s.num_objects, 1);
    assert_int_equal(s.num_staging, 1);
    assert_int_equal(s.used_bytes, 2 * PAGE);
    /* A copy that takes its own share leaves r2's in place when done. */
    assert_int_equal(copy1(f->m, 2, LMC_COPY_TAKES_SHARE, &c), LMC_L1_SUCCESS);
    back1(f->m, 2, &c);                                           /* that copy is done */
    assert_int_equal(evictable1(f->m, 2), LMC_L1_NOT_EVICTABLE);
    assert_books_balance(f->m);
    assert_int_equal(lmc_l1_manager_clear(f->m, true), 2);
    s = stats(f->m);
    assert_int_equal(s.num_objects + s.num_staging, 0);
    /* Key 4's writer still holds its buffer; key 2's read share had no copy
     * in flight any more, so its buffer went at once. */
    assert_int_equal(s.num_retired, 1);
    assert_int_equal(s.used_bytes, PAGE);
    assert_int_equal(readable1(f->m, 2), LMC_L1_KEY_NOT_EXIST);
    uint64_t stale = ledger(f->m).returned_stale;
    back1(f->m, 2, &r2);
    assert_int_equal(ledger(f->m).returned_stale, stale + 1);
    assert_int_equal(publish1(f->m, 4, &w4, 0), LMC_L1_KEY_NOT_EXIST);
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
    lmc_lease writing, w2, lookup, c1, c2, w;
    assert_int_equal(write1(f->m, 1, "engine", false, &writing), LMC_L1_SUCCESS);
    assert_int_equal(write1(f->m, 2, "engine", false, &w2), LMC_L1_SUCCESS);
    assert_int_equal(publish1(f->m, 2, &w2, 0), LMC_L1_SUCCESS);
    uint64_t reading = w2.offset;
    assert_int_equal(read1(f->m, 2, 3, &lookup), LMC_L1_SUCCESS);       /* three shares, */
    assert_int_equal(copy1(f->m, 2, LMC_COPY_CARRIES_SHARE, &c1), LMC_L1_SUCCESS);   /* two */
    assert_int_equal(copy1(f->m, 2, LMC_COPY_CARRIES_SHARE, &c2), LMC_L1_SUCCESS);   /* copying */
    assert_int_equal(lmc_l1_manager_clear(f->m, true), 2);
    for (uint64_t id = 100; id < 114; id++) {                     /* the other 14 pages */
        assert_int_equal(write1(f->m, id, "other", false, &w), LMC_L1_SUCCESS);
        assert_true(w.offset != writing.offset && w.offset != reading);
    }
    assert_int_equal(write1(f->m, 114, "other", false, NULL), LMC_L1_OUT_OF_MEMORY);
    back1(f->m, 2, &lookup);                                      /* shares are gone... */
    assert_int_equal(ledger(f->m).returned_stale, 1);
    assert_int_equal(write1(f->m, 114, "other", false, NULL), LMC_L1_OUT_OF_MEMORY);
    back1(f->m, 2, &c1);                                          /* ...copies are not */
    assert_int_equal(write1(f->m, 114, "other", false, NULL), LMC_L1_OUT_OF_MEMORY);
    back1(f->m, 2, &c2);                                          /* the last copy */
    back1(f->m, 2, &c2);                                          /* once too often: ignored */
    assert_int_equal(ledger(f->m).returned_twice, 1);
    assert_int_equal(write1(f->m, 114, "other", false, &w), LMC_L1_SUCCESS);
    assert_int_equal(w.offset, reading);
    /* A writer that never comes back: its buffer returns at its lock's TTL. */
    assert_int_equal(write1(f->m, 115, "other", false, NULL), LMC_L1_OUT_OF_MEMORY);
    f->clock.now += WRITE_TTL_MS;
    lmc_lease w115;
    assert_int_equal(write1(f->m, 115, "other", false, &w115), LMC_L1_SUCCESS);
    assert_int_equal(w115.offset, writing.offset);
    assert_int_equal(publish1(f->m, 1, &writing, 0), LMC_L1_KEY_NOT_EXIST);
    assert_int_equal(stats(f->m).num_retired, 0);
    /* A forced delete of a read-locked key does the same. */
    assert_int_equal(lmc_l1_manager_clear(f->m, true), 16);  /* 100..115 */
    assert_int_equal(stats(f->m).used_bytes, PAGE);          /* 115's writer is live */
    assert_int_equal(publish1(f->m, 115, &w115, 0), LMC_L1_KEY_NOT_EXIST);
    assert_int_equal(stats(f->m).used_bytes, 0);
    lmc_lease r, c;
    put_resident(f->m, 3);
    assert_int_equal(read1(f->m, 3, 1, &r), LMC_L1_SUCCESS);
    assert_int_equal(copy1(f->m, 3, LMC_COPY_CARRIES_SHARE, &c), LMC_L1_SUCCESS);
    assert_int_equal(delete1(f->m, 3, true), LMC_L1_SUCCESS);
    assert_int_equal(stats(f->m).used_bytes, PAGE);
    back1(f->m, 3, &c);
    assert_int_equal(stats(f->m).used_bytes, 0);
    /* Shares released under a copy (a FREE_LOOKUP_LOCKS racing a retrieve):
     * the copy becomes evictable, but its buffer waits for the copy. */
    put_resident(f->m, 5);
    assert_int_equal(read1(f->m, 5, 1, &r), LMC_L1_SUCCESS);
    assert_int_equal(copy1(f->m, 5, LMC_COPY_CARRIES_SHARE, &c), LMC_L1_SUCCESS);
    back1(f->m, 5, &r);
    assert_int_equal(delete1(f->m, 5, false), LMC_L1_SUCCESS);    /* as eviction does */
    assert_int_equal(stats(f->m).used_bytes, PAGE);
    back1(f->m, 5, &c);
    assert_int_equal(stats(f->m).used_bytes, 0);
    /* A copy finished before the clear leaves nothing to keep. */
    put_resident(f->m, 4);
    assert_int_equal(read1(f->m, 4, 1, &r), LMC_L1_SUCCESS);
    assert_int_equal(copy1(f->m, 4, LMC_COPY_TAKES_SHARE, &c), LMC_L1_SUCCESS);
    back1(f->m, 4, &c);
    assert_int_equal(lmc_l1_manager_clear(f->m, true), 1);
    assert_int_equal(stats(f->m).used_bytes, 0);
}

/* A copy retired under a reader and a new copy of the same key, stored after
 * the clear and read by another reader, are two buffers: each reader's
 * COPY lease goes back to the one it copied out of, never the other. */
static void test_unpin_reaches_the_copy_read(void **state)
{
    fixture *f = *state;
    lmc_lease r1, old_copy, r2, new_copy, w;
    put_resident(f->m, 7);
    assert_int_equal(read1(f->m, 7, 1, &r1), LMC_L1_SUCCESS);
    assert_int_equal(copy1(f->m, 7, LMC_COPY_CARRIES_SHARE, &old_copy), LMC_L1_SUCCESS);
    assert_int_equal(lmc_l1_manager_clear(f->m, true), 1);
    put_resident(f->m, 7);                                         /* stored again */
    assert_int_equal(read1(f->m, 7, 1, &r2), LMC_L1_SUCCESS);
    assert_int_equal(copy1(f->m, 7, LMC_COPY_TAKES_SHARE, &new_copy), LMC_L1_SUCCESS);
    assert_true(new_copy.offset != old_copy.offset);
    assert_int_not_equal(new_copy.copy, old_copy.copy);
    assert_int_equal(stats(f->m).used_bytes, 2 * PAGE);
    back1(f->m, 7, &old_copy);                                     /* reader 1 is done */
    lmc_l1_stats s = stats(f->m);
    assert_int_equal(s.num_retired, 0);
    assert_int_equal(s.used_bytes, PAGE);
    /* Reader 2's copy is still pinned: a second clear must keep it. */
    assert_int_equal(lmc_l1_manager_clear(f->m, true), 1);
    for (uint64_t id = 100; id < 115; id++) {
        assert_int_equal(write1(f->m, id, "other", false, &w), LMC_L1_SUCCESS);
        assert_true(w.offset != new_copy.offset);
    }
    back1(f->m, 7, &new_copy);
    assert_int_equal(write1(f->m, 115, "other", false, &w), LMC_L1_SUCCESS);
    assert_int_equal(w.offset, new_copy.offset);
    assert_books_balance(f->m);
}

/* A COPY lease gives a reader's share back on the copy it read: after a
 * forced clear and a new store, the new copy keeps its own lookups' shares. */
static void test_end_read_releases_the_copy_read(void **state)
{
    fixture *f = *state;
    lmc_lease r_old, old_copy, r_new, new_copy;
    put_resident(f->m, 6);
    assert_int_equal(read1(f->m, 6, 1, &r_old), LMC_L1_SUCCESS);
    assert_int_equal(copy1(f->m, 6, LMC_COPY_CARRIES_SHARE, &old_copy), LMC_L1_SUCCESS);
    assert_int_equal(lmc_l1_manager_clear(f->m, true), 1);
    put_resident(f->m, 6);
    assert_int_equal(read1(f->m, 6, 1, &r_new), LMC_L1_SUCCESS);   /* another lookup's share */
    /* A READ lease naming the old copy does not reach the new one... */
    back1(f->m, 6, &r_old);
    assert_int_equal(ledger(f->m).returned_stale, 1);
    back1(f->m, 6, &old_copy);                                     /* ...nor does a COPY */
    lmc_l1_stats s = stats(f->m);
    assert_int_equal(s.num_retired, 0);
    assert_int_equal(s.used_bytes, PAGE);
    assert_int_equal(delete1(f->m, 6, false), LMC_L1_KEY_IS_LOCKED);   /* its share stays */
    /* The usual case: the copy read is the resident one. */
    assert_int_equal(copy1(f->m, 6, LMC_COPY_CARRIES_SHARE, &new_copy), LMC_L1_SUCCESS);
    back1(f->m, 6, &new_copy);
    assert_int_equal(delete1(f->m, 6, false), LMC_L1_SUCCESS);   /* no share, no pin left */
    assert_int_equal(stats(f->m).used_bytes, 0);
    /* A temporary's last share, given back this way, frees it at once. */
    lmc_lease w;
    assert_int_equal(write1(f->m, 9, "prefetch", true, &w), LMC_L1_SUCCESS);
    assert_int_equal(publish1(f->m, 9, &w, 1), LMC_L1_SUCCESS);
    assert_int_equal(copy1(f->m, 9, LMC_COPY_CARRIES_SHARE, &new_copy), LMC_L1_SUCCESS);
    back1(f->m, 9, &new_copy);
    s = stats(f->m);
    assert_int_equal(s.num_objects + s.num_retired, 0);
    assert_int_equal(s.used_bytes, 0);
    assert_books_balance(f->m);
}

/* A LOOKUP's shares outlive every copy (nothing is pinned), so a forced
 * clear frees the old copy outright and the next copy of the key may sit at
 * the same offset: only the copy id tells the two apart. */
static void test_finish_read_copies_spares_a_newer_copy(void **state)
{
    fixture *f = *state;
    lmc_object_key k = make_key(4), missing = make_key(5);
    lmc_lease old_l, new_l, none;
    lmc_l1_result r;
    put_resident(f->m, 4);
    assert_int_equal(lmc_l1_manager_lease_read(f->m, &k, 1, 2, true, NULL, &old_l, &r), 1);
    assert_int_not_equal(old_l.copy, 0);
    assert_int_equal(lmc_l1_manager_clear(f->m, true), 1);
    put_resident(f->m, 4);
    assert_int_equal(lmc_l1_manager_lease_read(f->m, &k, 1, 1, true, NULL, &new_l, &r), 1);
    assert_int_not_equal(new_l.copy, old_l.copy);
    assert_int_equal(new_l.offset, old_l.offset);   /* why an offset cannot tell them */
    assert_int_equal(lmc_l1_manager_lease_read(f->m, &missing, 1, 1, true, NULL, &none, &r), 0);
    assert_int_equal(none.kind, LMC_LEASE_NONE);
    /* The first lookup's two shares went with the old copy: nothing to give. */
    back1(f->m, 4, &old_l);
    assert_int_equal(ledger(f->m).returned_stale, 1);
    assert_int_equal(delete1(f->m, 4, false), LMC_L1_KEY_IS_LOCKED);   /* the share stays */
    back1(f->m, 4, &none);   /* a key the lookup did not lock */
    lmc_lease_counts c = ledger(f->m);
    assert_int_equal(c.returned_stale + c.returned_twice + c.returned[LMC_LEASE_READ], 1);
    assert_int_equal(delete1(f->m, 4, false), LMC_L1_KEY_IS_LOCKED);
    back1(f->m, 4, &new_l);
    assert_int_equal(ledger(f->m).returned[LMC_LEASE_READ], 1);
    assert_int_equal(delete1(f->m, 4, false), LMC_L1_SUCCESS);
}

/* A writer whose buffer of a key was retired by a forced clear cannot
 * lease that key again until that write is given back: publishing would
 * otherwise leave two writes of one writer in flight for one key. */
static void test_writer_cannot_restage_a_retired_key(void **state)
{
    fixture *f = *state;
    lmc_lease first, other, again;
    assert_int_equal(write1(f->m, 8, "engine", false, &first), LMC_L1_SUCCESS);
    assert_int_equal(lmc_l1_manager_clear(f->m, true), 1);
    assert_int_equal(write1(f->m, 8, "engine", false, NULL), LMC_L1_KEY_IN_WRONG_STATE);
    assert_int_equal(write1(f->m, 8, "other", false, &other), LMC_L1_SUCCESS);
    assert_true(other.offset != first.offset);
    assert_int_equal(publish1(f->m, 8, &first, 0), LMC_L1_KEY_NOT_EXIST);   /* void */
    assert_int_equal(stats(f->m).num_retired, 0);
    assert_int_equal(readable1(f->m, 8), LMC_L1_KEY_NOT_EXIST);            /* not published */
    assert_int_equal(write1(f->m, 8, "engine", false, &again), LMC_L1_SUCCESS);
    assert_int_equal(publish1(f->m, 8, &again, 0), LMC_L1_SUCCESS);
    assert_int_equal(publish1(f->m, 8, &other, 0), LMC_L1_SUCCESS);   /* already resident */
    assert_int_equal(stats(f->m).num_objects, 1);
    /* A retired write whose lock expired no longer blocks its writer. */
    assert_int_equal(write1(f->m, 9, "engine", false, NULL), LMC_L1_SUCCESS);
    assert_int_equal(lmc_l1_manager_clear(f->m, true), 2);
    f->clock.now += WRITE_TTL_MS;
    assert_int_equal(write1(f->m, 9, "engine", false, NULL), LMC_L1_SUCCESS);
    assert_int_equal(stats(f->m).num_retired, 0);
    assert_int_equal(ledger(f->m).lapsed[LMC_LEASE_WRITE], 1);
    assert_books_balance(f->m);
}

/* ---- the lease rules (docs/storage.md, "Leases") -------------------------- */

/* Everything in the ledger but returned_twice. */
static void assert_ledger_same_but_twice(const lmc_lease_counts *a, const lmc_lease_counts *b)
{
    lmc_lease_counts x = *a, y = *b;
    x.returned_twice = y.returned_twice = 0;
    assert_memory_equal(&x, &y, sizeof x);
}

static void assert_stats_same(lmc_l1_manager *m, const lmc_l1_stats *before)
{
    lmc_l1_stats now = stats(m);
    assert_int_equal(now.num_objects, before->num_objects);
    assert_int_equal(now.num_staging, before->num_staging);
    assert_int_equal(now.num_locked, before->num_locked);
    assert_int_equal(now.num_retired, before->num_retired);
    assert_int_equal(now.used_bytes, before->used_bytes);
}

static void test_give_back_twice(void **state)
{
    fixture *f = *state;
    lmc_lease a, b, c, w;
    put_resident(f->m, 1);
    assert_int_equal(read1(f->m, 1, 2, &a), LMC_L1_SUCCESS);            /* holder A */
    assert_int_equal(read1(f->m, 1, 1, &b), LMC_L1_SUCCESS);            /* holder B */
    assert_int_equal(copy1(f->m, 1, LMC_COPY_TAKES_SHARE, &c), LMC_L1_SUCCESS);   /* A copies */
    assert_int_equal(write1(f->m, 2, "w", false, &w), LMC_L1_SUCCESS);
    lmc_lease_counts held = ledger(f->m);
    back1(f->m, 1, &a);
    back1(f->m, 1, &c);
    back1(f->m, 2, &w);
    lmc_lease_counts once = ledger(f->m);
    for (int k = LMC_LEASE_WRITE; k <= LMC_LEASE_COPY; k++)
        assert_int_equal(once.returned[k], held.returned[k] + 1);
    assert_int_equal(once.returned_twice, 0);
    lmc_l1_stats before = stats(f->m);
    assert_int_equal(before.num_locked, 1);   /* B's share */
    /* Each of them again: counted, and nothing else moves. */
    back1(f->m, 1, &a);
    back1(f->m, 1, &c);
    back1(f->m, 2, &w);
    lmc_lease_counts twice = ledger(f->m);
    assert_int_equal(twice.returned_twice, 3);
    assert_ledger_same_but_twice(&once, &twice);
    assert_stats_same(f->m, &before);
    /* A second give-back of A's two shares did not take B's: B's is the
     * one share left, and it holds the copy until B gives it back. */
    assert_int_equal(delete1(f->m, 1, false), LMC_L1_KEY_IS_LOCKED);
    lmc_lease bc;
    assert_int_equal(copy1(f->m, 1, LMC_COPY_CARRIES_SHARE, &bc), LMC_L1_SUCCESS);
    back1(f->m, 1, &bc);
    assert_int_equal(readable1(f->m, 1), LMC_L1_KEY_NOT_READABLE);
    /* A returned WRITE lease publishes nothing either. */
    assert_int_equal(publish1(f->m, 2, &w, 0), LMC_L1_KEY_NOT_EXIST);
    assert_int_equal(evictable1(f->m, 2), LMC_L1_GONE);
    assert_int_equal(ledger(f->m).returned[LMC_LEASE_WRITE], once.returned[LMC_LEASE_WRITE]);
    assert_books_balance(f->m);
}

/* After a forced clear a lease names a copy that is gone; a new copy of the
 * same key, stored since at the very same offset, is not touched by it. */
static void test_give_back_after_forced_clear(void **state)
{
    fixture *f = *state;
    lmc_lease old_r, b, w, new_w;
    put_resident(f->m, 1);
    assert_int_equal(read1(f->m, 1, 1, &old_r), LMC_L1_SUCCESS);
    assert_int_equal(lmc_l1_manager_clear(f->m, true), 1);
    assert_int_equal(stats(f->m).num_retired, 0);   /* no copy out: freed at once */
    assert_int_equal(write1(f->m, 1, "w", false, &new_w), LMC_L1_SUCCESS);
    assert_int_equal(new_w.offset, old_r.offset);
    assert_int_not_equal(new_w.copy, old_r.copy);
    assert_int_equal(publish1(f->m, 1, &new_w, 0), LMC_L1_SUCCESS);
    assert_int_equal(read1(f->m, 1, 1, &b), LMC_L1_SUCCESS);   /* a new holder's share */
    assert_int_equal(b.offset, old_r.offset);
    lmc_lease_counts before = ledger(f->m);
    lmc_l1_stats s = stats(f->m);
    back1(f->m, 1, &old_r);
    lmc_lease_counts after = ledger(f->m);
    assert_int_equal(after.returned_stale, before.returned_stale + 1);
    after.returned_stale = before.returned_stale;
    assert_memory_equal(&after, &before, sizeof after);
    assert_stats_same(f->m, &s);
    assert_int_equal(delete1(f->m, 1, false), LMC_L1_KEY_IS_LOCKED);   /* B's share stands */
    back1(f->m, 1, &b);
    assert_int_equal(ledger(f->m).returned[LMC_LEASE_READ], 1);
    assert_int_equal(delete1(f->m, 1, false), LMC_L1_SUCCESS);
    /* A WRITE lease the clear retired, given back unpublished: the buffer
     * kept for its writer goes now. */
    assert_int_equal(write1(f->m, 2, "w", false, &w), LMC_L1_SUCCESS);
    assert_int_equal(lmc_l1_manager_clear(f->m, true), 1);
    assert_int_equal(stats(f->m).num_retired, 1);
    back1(f->m, 2, &w);   /* given back unpublished: the retired buffer goes */
    assert_int_equal(stats(f->m).num_retired, 0);
    assert_int_equal(stats(f->m).used_bytes, 0);
    lmc_lease_counts c = ledger(f->m);
    assert_int_equal(outstanding(&c, LMC_LEASE_WRITE), 0);
    assert_int_equal(outstanding(&c, LMC_LEASE_COPY), 0);
    assert_books_balance(f->m);
}

static void test_give_back_after_expiry(void **state)
{
    fixture *f = *state;
    lmc_lease w, taken, r, c, lookup;
    /* WRITE: its buffer is still there, so it goes now; counted late. */
    assert_int_equal(write1(f->m, 1, "w", false, &w), LMC_L1_SUCCESS);
    f->clock.now += WRITE_TTL_MS;
    back1(f->m, 1, &w);
    lmc_lease_counts c0 = ledger(f->m);
    assert_int_equal(c0.returned_expired, 1);
    assert_int_equal(c0.returned[LMC_LEASE_WRITE], 1);
    assert_int_equal(stats(f->m).used_bytes, 0);
    /* WRITE taken over by its writer after expiry: the old lease is stale
     * and does not touch the new one. */
    assert_int_equal(write1(f->m, 2, "w", false, &w), LMC_L1_SUCCESS);
    f->clock.now += WRITE_TTL_MS;
    assert_int_equal(write1(f->m, 2, "w", false, &taken), LMC_L1_SUCCESS);
    back1(f->m, 2, &w);
    assert_int_equal(ledger(f->m).returned_stale, 1);
    assert_int_equal(evictable1(f->m, 2), LMC_L1_NOT_EVICTABLE);
    assert_int_equal(publish1(f->m, 2, &taken, 0), LMC_L1_SUCCESS);
    /* READ: the lock lapsed; its shares are no longer there to give. */
    assert_int_equal(read1(f->m, 2, 2, &r), LMC_L1_SUCCESS);
    f->clock.now = r.expiry_ms;
    assert_int_equal(evictable1(f->m, 2), LMC_L1_EVICTABLE);
    back1(f->m, 2, &r);
    assert_int_equal(ledger(f->m).returned_expired, 2);
    assert_int_equal(evictable1(f->m, 2), LMC_L1_EVICTABLE);
    /* COPY of a copy a forced clear retired: at the lock's expiry its
     * buffer is no longer held for it. */
    put_resident(f->m, 3);
    assert_int_equal(read1(f->m, 3, 1, &lookup), LMC_L1_SUCCESS);
    assert_int_equal(copy1(f->m, 3, LMC_COPY_CARRIES_SHARE, &c), LMC_L1_SUCCESS);
    assert_int_equal(lmc_l1_manager_clear(f->m, true), 2);
    assert_int_equal(stats(f->m).num_retired, 1);
    f->clock.now = c.expiry_ms;
    back1(f->m, 3, &c);
    lmc_lease_counts c1 = ledger(f->m);
    assert_int_equal(c1.returned_expired, 3);
    assert_int_equal(c1.returned[LMC_LEASE_COPY], 1);
    assert_int_equal(c1.lapsed[LMC_LEASE_COPY], 0);
    assert_int_equal(outstanding(&c1, LMC_LEASE_COPY), 0);
    assert_int_equal(stats(f->m).num_retired, 0);
    assert_int_equal(stats(f->m).used_bytes, 0);
    assert_books_balance(f->m);
}

/* A lease whose lock lapsed, given back after a new holder locked the same
 * copy again: the shares it names went with the lapsed lock, so it must
 * not give back the new holder's. */
static void test_expired_lease_spares_a_new_lock(void **state)
{
    fixture *f = *state;
    lmc_lease late, fresh, late_copy, lookup;
    put_resident(f->m, 2);
    assert_int_equal(read1(f->m, 2, 1, &late), LMC_L1_SUCCESS);
    f->clock.now = late.expiry_ms + 1;
    assert_int_equal(read1(f->m, 2, 1, &fresh), LMC_L1_SUCCESS);
    back1(f->m, 2, &late);
    assert_int_equal(ledger(f->m).returned_expired, 1);
    assert_int_equal(evictable1(f->m, 2), LMC_L1_NOT_EVICTABLE);
    assert_int_equal(stats(f->m).num_locked, 1);
    back1(f->m, 2, &fresh);
    assert_int_equal(evictable1(f->m, 2), LMC_L1_EVICTABLE);
    /* The same for a COPY lease: it unpins, but takes no share. */
    assert_int_equal(copy1(f->m, 2, LMC_COPY_TAKES_SHARE, &late_copy), LMC_L1_SUCCESS);
    f->clock.now = late_copy.expiry_ms;
    assert_int_equal(read1(f->m, 2, 1, &lookup), LMC_L1_SUCCESS);
    back1(f->m, 2, &late_copy);
    lmc_lease_counts c = ledger(f->m);
    assert_int_equal(c.returned_expired, 2);
    assert_int_equal(outstanding(&c, LMC_LEASE_COPY), 0);
    assert_int_equal(evictable1(f->m, 2), LMC_L1_NOT_EVICTABLE);
    back1(f->m, 2, &lookup);
    assert_int_equal(evictable1(f->m, 2), LMC_L1_EVICTABLE);
    assert_books_balance(f->m);
}

/* A holder that died: a reaper gives its leases back for it, in the
 * holder's own array, so that the holder's late give-back (it was only
 * slow) finds them RETURNED and changes nothing. */
typedef struct holder {
    lmc_object_key keys[3];
    lmc_lease leases[3];
} holder;

static void test_reaped_holder(void **state)
{
    fixture *f = *state;
    lmc_l1_result res[3];
    holder h = {.keys = {make_key(1), make_key(2), make_key(3)}};
    lmc_lease other[2];
    put_resident(f->m, 2);
    put_resident(f->m, 3);
    assert_int_equal(write1(f->m, 1, "engine", false, &h.leases[0]), LMC_L1_SUCCESS);
    assert_int_equal(read1(f->m, 2, 2, &h.leases[1]), LMC_L1_SUCCESS);
    assert_int_equal(copy1(f->m, 3, LMC_COPY_TAKES_SHARE, &h.leases[2]), LMC_L1_SUCCESS);
    assert_int_equal(read1(f->m, 2, 1, &other[0]), LMC_L1_SUCCESS);
    assert_int_equal(read1(f->m, 3, 1, &other[1]), LMC_L1_SUCCESS);
    lmc_lease_counts held = ledger(f->m);
    lmc_l1_manager_give_back(f->m, h.keys, h.leases, 3);   /* the reaper */
    for (int i = 0; i < 3; i++)
        assert_int_equal(h.leases[i].kind, LMC_LEASE_RETURNED);
    lmc_lease_counts reaped = ledger(f->m);
    for (int k = LMC_LEASE_WRITE; k <= LMC_LEASE_COPY; k++)
        assert_int_equal(reaped.returned[k], held.returned[k] + 1);
    assert_int_equal(reaped.returned_stale + reaped.returned_expired + reaped.returned_twice, 0);
    assert_int_equal(outstanding(&reaped, LMC_LEASE_WRITE), 0);
    assert_int_equal(outstanding(&reaped, LMC_LEASE_COPY), 0);
    assert_int_equal(evictable1(f->m, 1), LMC_L1_GONE);
    lmc_l1_stats s = stats(f->m);
    assert_int_equal(s.num_locked, 2);   /* the other holder's */
    /* The holder comes back late: a counted no-op, whatever it tries. */
    assert_int_equal(lmc_l1_manager_publish_writes(f->m, h.keys, h.leases, 1, 0, res), 0);
    assert_int_equal(res[0], LMC_L1_KEY_NOT_EXIST);
    assert_int_equal(evictable1(f->m, 1), LMC_L1_GONE);
    lmc_l1_manager_give_back(f->m, h.keys, h.leases, 3);
    lmc_lease_counts late = ledger(f->m);
    assert_int_equal(late.returned_twice, 3);
    assert_ledger_same_but_twice(&reaped, &late);
    assert_stats_same(f->m, &s);
    assert_int_equal(delete1(f->m, 2, false), LMC_L1_KEY_IS_LOCKED);
    assert_int_equal(delete1(f->m, 3, false), LMC_L1_KEY_IS_LOCKED);
    lmc_object_key ok[2] = {make_key(2), make_key(3)};
    lmc_l1_manager_give_back(f->m, ok, other, 2);
    assert_int_equal(stats(f->m).num_locked, 0);
    assert_books_balance(f->m);
}

/* A COPY lease keeps its buffer through a forced delete: the memory is not
 * handed to a writer (not even of the same key) until the lease comes back,
 * and is freed then. */
static void test_copy_lease_outlives_forced_delete(void **state)
{
    fixture *f = *state;
    lmc_lease c, w;
    put_resident(f->m, 1);
    assert_int_equal(copy1(f->m, 1, LMC_COPY_TAKES_SHARE, &c), LMC_L1_SUCCESS);
    assert_int_equal(delete1(f->m, 1, true), LMC_L1_SUCCESS);
    lmc_l1_stats s = stats(f->m);
    assert_int_equal(s.num_objects, 0);
    assert_int_equal(s.num_retired, 1);
    assert_int_equal(s.retired_bytes, PAGE);
    assert_int_equal(s.used_bytes, PAGE);
    assert_int_equal(evictable1(f->m, 1), LMC_L1_GONE);
    assert_int_equal(outstanding(&s.leases, LMC_LEASE_COPY), 1);
    for (uint64_t id = 1; id < 16; id++) {   /* key 1 again, then the rest */
        assert_int_equal(write1(f->m, id, "w", false, &w), LMC_L1_SUCCESS);
        assert_true(w.offset != c.offset);
    }
    assert_int_equal(write1(f->m, 16, "w", false, NULL), LMC_L1_OUT_OF_MEMORY);
    back1(f->m, 1, &c);
    s = stats(f->m);
    assert_int_equal(s.num_retired, 0);
    assert_int_equal(s.retired_bytes, 0);
    assert_int_equal(s.used_bytes, 15 * PAGE);
    assert_int_equal(s.leases.returned[LMC_LEASE_COPY], 1);
    assert_int_equal(s.leases.lapsed[LMC_LEASE_COPY], 0);
    assert_int_equal(s.leases.returned_stale + s.leases.returned_expired, 0);
    assert_int_equal(write1(f->m, 16, "w", false, &w), LMC_L1_SUCCESS);
    assert_int_equal(w.offset, c.offset);
    assert_books_balance(f->m);
}

typedef struct write_events {
    size_t finished;   /* keys in WRITE_FINISHED or WRITE_FINISHED_READ_RESERVED */
} write_events;

static void count_writes(void *user, lmc_l1_event_kind kind, const lmc_object_key *keys,
                         size_t n)
{
    (void)keys;
    if (kind == LMC_L1_EVENT_WRITE_FINISHED || kind == LMC_L1_EVENT_WRITE_FINISHED_READ_RESERVED)
        ((write_events *)user)->finished += n;
}

static void test_write_voided_by_forced_clear(void **state)
{
    fixture *f = *state;
    write_events ev = {0};
    assert_int_equal(lmc_l1_manager_add_listener(f->m, count_writes, &ev), 0);
    lmc_lease w, wr;
    assert_int_equal(write1(f->m, 1, "engine", false, &w), LMC_L1_SUCCESS);
    assert_int_equal(write1(f->m, 2, "engine", false, &wr), LMC_L1_SUCCESS);
    assert_int_equal(lmc_l1_manager_clear(f->m, true), 2);
    assert_int_equal(stats(f->m).num_retired, 2);
    assert_int_equal(publish1(f->m, 1, &w, 0), LMC_L1_KEY_NOT_EXIST);
    assert_false(lmc_lease_held(&w));
    assert_int_equal(publish1(f->m, 2, &wr, 3), LMC_L1_KEY_NOT_EXIST);
    assert_false(lmc_lease_held(&wr));   /* not a READ lease either */
    lmc_l1_stats s = stats(f->m);
    assert_int_equal(s.num_objects, 0);
    assert_int_equal(s.num_locked, 0);
    assert_int_equal(s.num_retired, 0);
    assert_int_equal(s.used_bytes, 0);
    assert_int_equal(readable1(f->m, 1), LMC_L1_KEY_NOT_EXIST);
    assert_int_equal(evictable1(f->m, 2), LMC_L1_GONE);
    assert_int_equal(ev.finished, 0);
    assert_int_equal(s.leases.granted[LMC_LEASE_READ], 0);
    assert_int_equal(s.leases.returned[LMC_LEASE_WRITE], 2);
    assert_int_equal(outstanding(&s.leases, LMC_LEASE_WRITE), 0);
    /* Its holder giving it back afterwards is harmless. */
    back1(f->m, 2, &wr);
    assert_stats_same(f->m, &s);
    /* The writer may write the key again now. */
    assert_int_equal(write1(f->m, 1, "engine", false, &w), LMC_L1_SUCCESS);
    assert_int_equal(publish1(f->m, 1, &w, 0), LMC_L1_SUCCESS);
    assert_int_equal(ev.finished, 1);
    lmc_l1_manager_remove_listener(f->m, count_writes, &ev);
    assert_books_balance(f->m);
}

static void test_publish_with_readers(void **state)
{
    fixture *f = *state;
    lmc_object_key keys[2] = {make_key(1), make_key(2)};
    lmc_lease w[2], c;
    lmc_l1_result res[2];
    assert_int_equal(lmc_l1_manager_lease_write(f->m, keys, NULL, 2, 1000, "prefetch", w, res), 0);
    lmc_lease staged[2] = {w[0], w[1]};
    int64_t published_at = f->clock.now + 5;
    f->clock.now = published_at;
    assert_int_equal(lmc_l1_manager_publish_writes(f->m, keys, w, 2, 3, res), 0);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(res[i], LMC_L1_SUCCESS);
        assert_int_equal(w[i].kind, LMC_LEASE_READ);
        assert_int_equal(w[i].shares, 3);
        assert_int_equal(w[i].copy, staged[i].copy);   /* names the copy now resident */
        assert_int_equal(w[i].offset, staged[i].offset);
        assert_int_equal(w[i].object_size, 1000);
        assert_int_equal(w[i].expiry_ms, published_at + READ_TTL_MS);
    }
    lmc_l1_stats s = stats(f->m);
    assert_int_equal(s.num_objects, 2);
    assert_int_equal(s.num_locked, 2);
    assert_int_equal(s.leases.granted[LMC_LEASE_WRITE], 2);
    assert_int_equal(s.leases.returned[LMC_LEASE_WRITE], 2);
    assert_int_equal(s.leases.granted[LMC_LEASE_READ], 2);
    /* Three shares: two retrieves carry one each, the third stays. */
    for (int i = 0; i < 2; i++) {
        assert_int_equal(copy1(f->m, 1, LMC_COPY_CARRIES_SHARE, &c), LMC_L1_SUCCESS);
        assert_int_equal(c.copy, w[0].copy);
        back1(f->m, 1, &c);
    }
    assert_int_equal(evictable1(f->m, 1), LMC_L1_NOT_EVICTABLE);
    /* The lease gives back exactly the copy it names. */
    lmc_l1_manager_give_back(f->m, keys + 1, w + 1, 1);
    assert_int_equal(evictable1(f->m, 2), LMC_L1_EVICTABLE);
    assert_int_equal(ledger(f->m).returned[LMC_LEASE_READ], 1);
    /* Readers are clamped as for lease_read. */
    lmc_lease many;
    assert_int_equal(write1(f->m, 3, "prefetch", false, &many), LMC_L1_SUCCESS);
    assert_int_equal(publish1(f->m, 3, &many, 1000), LMC_L1_SUCCESS);
    assert_int_equal(many.shares, LMC_L1_MAX_READERS);
    back1(f->m, 3, &many);
    assert_int_equal(evictable1(f->m, 3), LMC_L1_EVICTABLE);
    assert_books_balance(f->m);
}

static void test_lease_copy_all_or_none(void **state)
{
    fixture *f = *state;
    lmc_object_key keys[3] = {make_key(1), make_key(2), make_key(3)};
    lmc_lease l[3], lookup;
    lmc_l1_result res[3];
    put_resident(f->m, 1);
    put_resident(f->m, 2);
    assert_int_equal(read1(f->m, 1, 1, &lookup), LMC_L1_SUCCESS);   /* only 1 is locked */
    /* Carrying: 2 has no share to carry, 3 is missing: none is granted. */
    assert_int_equal(
        lmc_l1_manager_lease_copy(f->m, keys, 3, LMC_COPY_CARRIES_SHARE, true, NULL, l, res), 0);
    assert_int_equal(res[0], LMC_L1_SUCCESS);   /* could have been copied */
    assert_int_equal(res[1], LMC_L1_KEY_NOT_READABLE);
    assert_int_equal(res[2], LMC_L1_KEY_NOT_EXIST);
    for (int i = 0; i < 3; i++)
        assert_int_equal(l[i].kind, LMC_LEASE_NONE);
    /* Taking: 3 is still missing, so 1 and 2 take no share either. */
    assert_int_equal(
        lmc_l1_manager_lease_copy(f->m, keys, 3, LMC_COPY_TAKES_SHARE, true, NULL, l, res), 0);
    assert_int_equal(res[0], LMC_L1_SUCCESS);
    assert_int_equal(res[1], LMC_L1_SUCCESS);
    assert_int_equal(res[2], LMC_L1_KEY_NOT_EXIST);
    lmc_l1_stats s = stats(f->m);
    assert_int_equal(s.leases.granted[LMC_LEASE_COPY], 0);
    assert_int_equal(s.num_locked, 1);
    assert_int_equal(evictable1(f->m, 2), LMC_L1_EVICTABLE);
    assert_int_equal(delete1(f->m, 2, true), LMC_L1_SUCCESS);   /* no pin kept it */
    assert_int_equal(stats(f->m).num_retired, 0);
    put_resident(f->m, 2);
    /* All there: all granted. */
    assert_int_equal(
        lmc_l1_manager_lease_copy(f->m, keys, 2, LMC_COPY_TAKES_SHARE, true, NULL, l, res), 2);
    assert_int_equal(l[0].kind, LMC_LEASE_COPY);
    assert_int_equal(l[1].kind, LMC_LEASE_COPY);
    assert_int_equal(evictable1(f->m, 2), LMC_L1_NOT_EVICTABLE);
    lmc_l1_manager_give_back(f->m, keys, l, 2);
    assert_int_equal(evictable1(f->m, 2), LMC_L1_EVICTABLE);
    /* Without all_or_none each key stands on its own. */
    assert_int_equal(
        lmc_l1_manager_lease_copy(f->m, keys, 3, LMC_COPY_CARRIES_SHARE, false, NULL, l, res), 1);
    assert_int_equal(l[0].kind, LMC_LEASE_COPY);
    assert_int_equal(l[1].kind, LMC_LEASE_NONE);
    assert_int_equal(l[2].kind, LMC_LEASE_NONE);
    lmc_l1_manager_give_back(f->m, keys, l, 3);   /* with lookup's share it carried */
    s = stats(f->m);
    assert_int_equal(s.num_locked, 0);
    assert_int_equal(s.leases.granted[LMC_LEASE_COPY], 3);
    assert_int_equal(s.leases.returned[LMC_LEASE_COPY], 3);
    assert_books_balance(f->m);
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
    assert_int_equal(write1(m, 1, "w", false, NULL), LMC_L1_SUCCESS);
    lmc_object_key keys[2] = {make_key(2), make_key(3)};
    lmc_lease w[2];
    lmc_l1_result res[2];
    assert_int_equal(lmc_l1_manager_lease_write(m, keys, NULL, 2, PAGE, "w", w, res), 0);
    assert_int_equal(res[0], LMC_L1_OUT_OF_MEMORY);
    lmc_l1_manager_usage(m, &used, &total);
    assert_int_equal(used, PAGE);                    /* ratio 0.5 of the committed part */
    assert_int_equal(lmc_l1_manager_grow(m, 2 * PAGE), 4 * PAGE);
    assert_int_equal(lmc_l1_manager_lease_write(m, keys, NULL, 2, PAGE, "w", w, res), 0);
    assert_int_equal(res[1], LMC_L1_SUCCESS);
    assert_int_equal(lmc_l1_manager_grow(m, 100 * PAGE), 8 * PAGE);   /* clamped */
    lmc_l1_stats s = stats(m);
    assert_int_equal(s.configured_bytes, 8 * PAGE);
    assert_int_equal(s.committed_bytes, 8 * PAGE);
    assert_books_balance(m);
    lmc_l1_manager_free(m);
}

static void test_report_status(void **state)
{
    fixture *f = *state;
    lmc_lease r;
    put_resident(f->m, 1);
    assert_int_equal(read1(f->m, 1, 1, &r), LMC_L1_SUCCESS);
    assert_int_equal(write1(f->m, 2, "w", true, NULL), LMC_L1_SUCCESS);
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
    assert_int_equal(json_integer_value(json_object_get(st, "invariant_violations")), 0);
    json_int_t checks = json_integer_value(json_object_get(st, "books_checks"));
    assert_true(checks >= 1); /* this report's own check counts */
    json_t *leases = json_object_get(st, "leases");
    json_t *writes = json_object_get(leases, "write");
    assert_int_equal(json_integer_value(json_object_get(writes, "granted")), 2);
    assert_int_equal(json_integer_value(json_object_get(writes, "returned")), 1);
    assert_int_equal(json_integer_value(json_object_get(writes, "outstanding")), 1);
    assert_int_equal(
        json_integer_value(json_object_get(json_object_get(leases, "read"), "granted")), 1);
    assert_int_equal(json_integer_value(json_object_get(leases, "returned_twice")), 0);
    json_decref(st);
    st = lmc_l1_manager_report_status(f->m);      /* every report runs the check again */
    assert_true(json_integer_value(json_object_get(st, "books_checks")) > checks);
    json_decref(st);
    back1(f->m, 1, &r);
}

static void test_many_objects(void **state)
{
    (void)state;
    enum { N = 300000, BATCH = 1000 };
    fake_clock clock = {0};
    lmc_l1_manager_options o = {
        .configured_bytes = (uint64_t)N * 64, .committed_bytes = (uint64_t)N * 64,
        .align_bytes = 64, .write_ttl_ms = 1000, .read_ttl_ms = 1000,
        .clock = read_fake_clock, .clock_user = &clock, .check_books = true,
    };
    lmc_l1_manager *m = lmc_l1_manager_new(&o);
    assert_non_null(m);
    lmc_object_key *keys = malloc(BATCH * sizeof(*keys));
    lmc_lease *leases = malloc(BATCH * sizeof(*leases));
    lmc_l1_result *res = malloc(BATCH * sizeof(*res));
    for (uint64_t base = 0; base < N; base += BATCH) {
        for (int i = 0; i < BATCH; i++)
            keys[i] = make_key(base + (uint64_t)i);
        assert_int_equal(lmc_l1_manager_lease_write(m, keys, NULL, BATCH, 64, "w", leases, res),
                         0);
        assert_int_equal(res[BATCH - 1], LMC_L1_SUCCESS);
        assert_int_equal(lmc_l1_manager_publish_writes(m, keys, leases, BATCH, 0, res), 0);
    }
    assert_int_equal(stats(m).num_objects, N);
    assert_int_equal(stats(m).used_bytes, (uint64_t)N * 64);
    /* One batch: the books are checked after every call, a walk of every
     * object, so one call per key would make this test quadratic. */
    size_t num_deleted = 0;
    for (uint64_t id = 0; id < N; id += 997)
        keys[num_deleted++] = make_key(id);
    assert_true(num_deleted <= BATCH);
    assert_int_equal(lmc_l1_manager_delete(m, keys, num_deleted, false, res), 0);
    for (size_t i = 0; i < num_deleted; i++)
        assert_int_equal(res[i], LMC_L1_SUCCESS);
    assert_int_equal(readable1(m, 997), LMC_L1_KEY_NOT_EXIST);
    assert_int_equal(read1(m, 998, 1, NULL), LMC_L1_SUCCESS);
    assert_books_balance(m);
    assert_int_equal(lmc_l1_manager_clear(m, true), N - (N + 996) / 997);
    free(keys);
    free(leases);
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
    lmc_lease locked[8];           /* what that call was granted */
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
        assert_int_equal(lmc_l1_manager_lease_read(rec->m, keys, n, 1, false, NULL,
                                                   rec->locked, res),
                         n);
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
    lmc_lease l[2], none = {0}, t;
    lmc_l1_result res[2];
    assert_int_equal(lmc_l1_manager_lease_write(f->m, keys, NULL, 2, PAGE, "w", l, res), 0);
    assert_int_equal(lmc_l1_manager_publish_writes(f->m, keys, l, 2, 0, res), 0);
    assert_int_equal(lmc_l1_manager_lease_read(f->m, keys, 2, 1, false, NULL, l, res), 2);
    lmc_l1_manager_give_back(f->m, keys, l, 2);
    lmc_l1_manager_touch(f->m, keys + 1, 1);
    assert_int_equal(lmc_l1_manager_delete(f->m, keys, 2, false, res), 0);
    assert_int_equal(publish1(f->m, 3, &none, 0), LMC_L1_KEY_NOT_EXIST);   /* no event */
    assert_int_equal(write1(f->m, 3, "t", true, &t), LMC_L1_SUCCESS);
    assert_int_equal(publish1(f->m, 3, &t, 0), LMC_L1_SUCCESS);   /* temporary: no write event */
    assert_int_equal(read1(f->m, 3, 1, &t), LMC_L1_SUCCESS);
    back1(f->m, 3, &t);                                            /* frees it */
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
    lmc_lease w[3];
    lmc_l1_result res[3];
    assert_int_equal(lmc_l1_manager_lease_write(f->m, keys, NULL, 3, PAGE, "w", w, res), 0);
    assert_int_equal(lmc_l1_manager_publish_writes(f->m, keys, w, 3, 0, res), 0);
    /* the nested lease_read ran and its event followed the outer one */
    assert_int_equal(evictable1(f->m, 2), LMC_L1_NOT_EVICTABLE);
    assert_int_equal(rec.locked[1].kind, LMC_LEASE_READ);
    expect_event(&rec, 1, LMC_L1_EVENT_WRITE_FINISHED, 3, 1);
    expect_event(&rec, 2, LMC_L1_EVENT_READ_RESERVED, 3, 1);
    assert_int_equal(rec.num, 3);
    assert_int_equal(lmc_l1_manager_clear(f->m, true), 3);
    assert_int_equal(rec.num, 4);
    assert_int_equal(rec.kinds[3], LMC_L1_EVENT_DELETED);
    assert_int_equal(rec.counts[3], 3);
}

/* ---- concurrency (meaningful under TSan) --------------------------------- */

/* One holder per thread: the leases it holds at any time, each kind in its
 * own array so that a new grant first gives the previous ones back. */
typedef struct worker {
    lmc_l1_manager *m;
    unsigned seed;
    char tag[8];
    lmc_object_key wk[4], rk[4], ck[4];
    lmc_lease w[4], r[4], c[4];
} worker;

static void random_keys(worker *w, lmc_object_key *keys)
{
    for (int i = 0; i < 4; i++)
        keys[i] = make_key((uint64_t)(rand_r(&w->seed) % 24));
}

static void worker_give_back_all(worker *w)
{
    lmc_l1_manager_give_back(w->m, w->wk, w->w, 4);
    lmc_l1_manager_give_back(w->m, w->rk, w->r, 4);
    lmc_l1_manager_give_back(w->m, w->ck, w->c, 4);
}

static void *worker_main(void *arg)
{
    worker *w = arg;
    lmc_l1_result res[4];
    for (int step = 0; step < 3000; step++) {
        bool flag = rand_r(&w->seed) % 2;
        switch (rand_r(&w->seed) % 7) {
        case 0:
            lmc_l1_manager_give_back(w->m, w->wk, w->w, 4);
            random_keys(w, w->wk);
            lmc_l1_manager_lease_write(w->m, w->wk, NULL, 4, PAGE, w->tag, w->w, res);
            break;
        case 1:   /* with readers, the WRITE leases become READ leases */
            lmc_l1_manager_publish_writes(w->m, w->wk, w->w, 4, flag ? 2 : 0, res);
            break;
        case 2:
            lmc_l1_manager_give_back(w->m, w->rk, w->r, 4);
            random_keys(w, w->rk);
            lmc_l1_manager_lease_read(w->m, w->rk, 4, 1, flag, NULL, w->r, res);
            break;
        case 3:
            lmc_l1_manager_give_back(w->m, w->rk, w->r, 4);
            lmc_l1_manager_give_back(w->m, w->wk, w->w, 4);
            break;
        case 4: {
            lmc_object_key keys[4];
            random_keys(w, keys);
            lmc_l1_manager_delete(w->m, keys, 4, false, res);
            break;
        }
        case 5:
            lmc_l1_manager_give_back(w->m, w->ck, w->c, 4);
            random_keys(w, w->ck);
            lmc_l1_manager_lease_copy(w->m, w->ck, 4,
                                      flag ? LMC_COPY_TAKES_SHARE : LMC_COPY_CARRIES_SHARE,
                                      rand_r(&w->seed) % 2, NULL, w->c, res);
            break;
        default:
            lmc_l1_manager_give_back(w->m, w->ck, w->c, 4);
            break;
        }
    }
    worker_give_back_all(w);
    return NULL;
}

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

static void test_concurrent_operations(void **state)
{
    fixture *f = *state;
    size_t events = 0;
    assert_int_equal(lmc_l1_manager_add_listener(f->m, count_listener, &events), 0);
    pthread_t threads[4];
    worker *workers = calloc(4, sizeof(*workers));
    for (int i = 0; i < 4; i++) {
        workers[i].m = f->m;
        workers[i].seed = 17u + (unsigned)i;
        snprintf(workers[i].tag, sizeof(workers[i].tag), "t%d", i % 2);
        assert_int_equal(pthread_create(&threads[i], NULL, worker_main, &workers[i]), 0);
    }
    for (int i = 0; i < 4; i++)
        pthread_join(threads[i], NULL);
    free(workers);
    assert_books_balance(f->m);
    assert_true(count_events(&events, 0) > 0);
    /* Every holder gave everything back: nothing may still hold a buffer. */
    lmc_lease_counts c = ledger(f->m);
    assert_int_equal(outstanding(&c, LMC_LEASE_WRITE), 0);
    assert_int_equal(outstanding(&c, LMC_LEASE_COPY), 0);
    assert_int_equal(stats(f->m).num_staging, 0);
    lmc_l1_manager_clear(f->m, true);
    lmc_l1_stats s = stats(f->m);
    assert_int_equal(s.num_retired, 0);
    assert_int_equal(s.used_bytes, 0);
    lmc_l1_manager_remove_listener(f->m, count_listener, &events);
}

/* The checker itself: books corrupted behind the manager's back are caught,
 * the ledger rules by the cheap check a status report runs and by the full
 * one, the walk-only rules by the full one; each finding is counted. */
static void test_books_catch_corruption(void **state)
{
    (void)state;
    fake_clock clock = {.now = 1000};
    fixture fx = {.m = new_manager(&clock, 64 * PAGE, 64 * PAGE)}, *f = &fx;
    lmc_lease c;
    put_resident(f->m, 1);
    assert_int_equal(copy1(f->m, 1, LMC_COPY_TAKES_SHARE, &c), LMC_L1_SUCCESS);
    f->m->check_books = false;   /* the calls below would abort() on the broken books */
    f->m->total_pins++;          /* a pin nobody holds a COPY lease for */
    assert_false(lmc_l1_manager_check_books(f->m));
    json_t *st = lmc_l1_manager_report_status(f->m);
    assert_true(json_is_false(json_object_get(st, "is_healthy")));
    json_decref(st);
    assert_int_equal(lmc_l1_manager_invariant_violations(f->m), 2);
    f->m->total_pins--;
    f->m->num_temporary++;       /* only a walk of the objects can tell */
    st = lmc_l1_manager_report_status(f->m);
    assert_true(json_is_true(json_object_get(st, "is_healthy")));
    json_decref(st);
    assert_false(lmc_l1_manager_check_books(f->m));
    assert_int_equal(lmc_l1_manager_invariant_violations(f->m), 3);
    f->m->num_temporary--;
    f->m->check_books = true;
    back1(f->m, 1, &c);
    assert_true(lmc_l1_manager_check_books(f->m));
    lmc_l1_manager_free(f->m);
}

/* The pre-fault's room (docs/storage.md, "Pre-fault"): while a commit
 * target is set, usage counts it as capacity and a waiter wakes when the
 * committed size grows; with none, or once it is reached, nobody waits. */
typedef struct {
    lmc_l1_manager *m;
} grower_arg;

static void *grow_later(void *arg)
{
    grower_arg *g = arg;
    struct timespec pause = {0, 50 * 1000 * 1000};
    nanosleep(&pause, NULL);
    lmc_l1_manager_grow(g->m, 4 * PAGE);
    return NULL;
}

static void test_commit_target_and_waiting_for_growth(void **state)
{
    (void)state;
    fake_clock clock = {.now = 1000};
    lmc_l1_manager *m = new_manager(&clock, 16 * PAGE, 4 * PAGE);
    uint64_t used, total;
    lmc_l1_manager_usage(m, &used, &total);
    assert_int_equal(total, 4 * PAGE);
    assert_false(lmc_l1_manager_wait_growth(m, 4 * PAGE, 1000));   /* no target: no wait */
    lmc_l1_manager_set_commit_target(m, 12 * PAGE);
    lmc_l1_manager_usage(m, &used, &total);
    assert_int_equal(total, 12 * PAGE);
    pthread_t th;
    grower_arg g = {m};
    assert_int_equal(pthread_create(&th, NULL, grow_later, &g), 0);
    assert_true(lmc_l1_manager_wait_growth(m, 4 * PAGE, 10000));
    pthread_join(th, NULL);
    lmc_l1_manager_usage(m, &used, &total);
    assert_int_equal(total, 12 * PAGE);   /* 8 committed, 12 on their way */
    lmc_l1_manager_grow(m, 4 * PAGE);
    assert_false(lmc_l1_manager_wait_growth(m, 12 * PAGE, 10000));   /* target reached */
    lmc_l1_manager_set_commit_target(m, 0);
    lmc_l1_manager_usage(m, &used, &total);
    assert_int_equal(total, 12 * PAGE);
    lmc_l1_manager_free(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_commit_target_and_waiting_for_growth),
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
        cmocka_unit_test_setup_teardown(test_give_back_twice, setup, teardown),
        cmocka_unit_test_setup_teardown(test_give_back_after_forced_clear, setup, teardown),
        cmocka_unit_test_setup_teardown(test_give_back_after_expiry, setup, teardown),
        cmocka_unit_test_setup_teardown(test_expired_lease_spares_a_new_lock, setup, teardown),
        cmocka_unit_test_setup_teardown(test_reaped_holder, setup, teardown),
        cmocka_unit_test_setup_teardown(test_copy_lease_outlives_forced_delete, setup, teardown),
        cmocka_unit_test_setup_teardown(test_write_voided_by_forced_clear, setup, teardown),
        cmocka_unit_test_setup_teardown(test_publish_with_readers, setup, teardown),
        cmocka_unit_test_setup_teardown(test_lease_copy_all_or_none, setup, teardown),
        cmocka_unit_test(test_books_catch_corruption),
        cmocka_unit_test(test_lazy_growth_and_usage),
        cmocka_unit_test_setup_teardown(test_report_status, setup, teardown),
        cmocka_unit_test(test_many_objects),
        cmocka_unit_test_setup_teardown(test_listener_events, setup, teardown),
        cmocka_unit_test_setup_teardown(test_listener_may_call_back, setup, teardown),
        cmocka_unit_test_setup_teardown(test_concurrent_operations, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
