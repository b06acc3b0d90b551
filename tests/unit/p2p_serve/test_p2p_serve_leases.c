/* The P2P serving side's lease registry (docs/p2p.md, "Serving side"):
 * what the transfer channel may read, release, expiry and the bound. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

#include "modules/p2p/lease_registry.h"

static int64_t fake_now;

static int64_t fake_clock(void *user)
{
    (void)user;
    return fake_now;
}

static lmc_p2p_serve_held held(uint8_t tag, uint64_t offset, uint64_t size, int64_t expiry)
{
    lmc_p2p_serve_held h;
    memset(&h, 0, sizeof h);
    h.key.chunk_hash[0] = tag;
    h.key.chunk_hash_len = 32;
    h.key.model_name = "m";
    h.key.cache_salt = "";
    h.lease.kind = LMC_LEASE_COPY;
    h.lease.offset = offset;
    h.lease.size = (size + 63) & ~(uint64_t)63;
    h.lease.object_size = size;
    h.lease.shares = 1;
    h.lease.expiry_ms = expiry;
    return h;
}

static lmc_p2p_serve_reg *new_reg(size_t max)
{
    fake_now = 1000;
    lmc_p2p_serve_reg *r = lmc_p2p_serve_reg_new(max, fake_clock, NULL);
    assert_non_null(r);
    return r;
}

static void test_covers_inside_one_object_only(void **st)
{
    (void)st;
    lmc_p2p_serve_reg *r = new_reg(8);
    lmc_p2p_serve_held h = held(1, 4096, 1000, 5000);
    assert_true(lmc_p2p_serve_reg_add(r, &h, 1));
    assert_true(lmc_p2p_serve_reg_covers(r, 4096, 1000));
    assert_true(lmc_p2p_serve_reg_covers(r, 4100, 10));
    assert_false(lmc_p2p_serve_reg_covers(r, 4095, 10));     /* starts before */
    assert_false(lmc_p2p_serve_reg_covers(r, 4096, 1001));   /* runs past the object */
    assert_false(lmc_p2p_serve_reg_covers(r, 5096, 1));      /* padding is not handed out */
    assert_false(lmc_p2p_serve_reg_covers(r, 4096, 0));
    assert_false(lmc_p2p_serve_reg_covers(r, UINT64_MAX - 4, 10)); /* wraps */
    assert_false(lmc_p2p_serve_reg_covers(r, 0, 1));
    lmc_p2p_serve_reg_free(r);
}

static void test_adjacent_and_overlapping_ranges(void **st)
{
    (void)st;
    lmc_p2p_serve_reg *r = new_reg(8);
    lmc_p2p_serve_held hs[3] = {held(1, 0, 100, 5000), held(2, 100, 100, 5000),
                                held(3, 300, 100, 5000)};
    assert_true(lmc_p2p_serve_reg_add(r, hs, 3));
    assert_true(lmc_p2p_serve_reg_covers(r, 50, 100));    /* across two adjacent objects */
    assert_true(lmc_p2p_serve_reg_covers(r, 0, 200));
    assert_false(lmc_p2p_serve_reg_covers(r, 150, 200));  /* the gap [200, 300) */
    assert_false(lmc_p2p_serve_reg_covers(r, 0, 400));
    assert_true(lmc_p2p_serve_reg_covers(r, 300, 100));
    lmc_p2p_serve_reg_free(r);
}

static void test_take_releases_one_lease_of_the_key(void **st)
{
    (void)st;
    lmc_p2p_serve_reg *r = new_reg(8);
    /* Two peers lease the same object: each unlock gives back one. */
    lmc_p2p_serve_held hs[2] = {held(1, 0, 100, 6000), held(1, 0, 100, 5000)};
    assert_true(lmc_p2p_serve_reg_add(r, hs, 2));
    lmc_p2p_serve_held out;
    assert_true(lmc_p2p_serve_reg_take(r, &hs[0].key, NULL, &out));
    assert_int_equal(out.lease.expiry_ms, 5000);          /* the oldest first */
    assert_true(lmc_p2p_serve_reg_covers(r, 0, 100));
    assert_true(lmc_p2p_serve_reg_take(r, &hs[0].key, NULL, &out));
    assert_false(lmc_p2p_serve_reg_covers(r, 0, 100));
    assert_false(lmc_p2p_serve_reg_take(r, &hs[0].key, NULL, &out)); /* nothing left: ignored */
    lmc_p2p_serve_held other = held(9, 0, 100, 5000);
    assert_false(lmc_p2p_serve_reg_take(r, &other.key, NULL, &out));
    size_t n;
    uint64_t bytes;
    lmc_p2p_serve_reg_counts(r, &n, &bytes);
    assert_int_equal(n, 0);
    assert_int_equal(bytes, 0);
    lmc_p2p_serve_reg_free(r);
}

static void test_take_gives_back_only_the_owners_lease(void **st)
{
    (void)st;
    lmc_p2p_serve_reg *r = new_reg(8);
    lmc_p2p_serve_owner a, b, a_again, long_a, long_b;
    lmc_p2p_serve_owner_set(&a, (const uint8_t *)"\x00\x01\x02\x03\x04", 5);
    lmc_p2p_serve_owner_set(&b, (const uint8_t *)"\x00\x01\x02\x03\x05", 5);
    lmc_p2p_serve_owner_set(&a_again, (const uint8_t *)"\x00\x01\x02\x03\x04", 5);
    uint8_t id[40];
    memset(id, 'x', sizeof id);
    lmc_p2p_serve_owner_set(&long_a, id, sizeof id);
    id[39] = 'y';   /* differs past the head: told apart by the hash */
    lmc_p2p_serve_owner_set(&long_b, id, sizeof id);
    assert_false(lmc_p2p_serve_owner_equal(&long_a, &long_b));
    lmc_p2p_serve_held hs[2] = {held(1, 0, 100, 5000), held(1, 0, 100, 6000)};
    hs[0].owner = a;
    hs[1].owner = long_a;
    assert_true(lmc_p2p_serve_reg_add(r, hs, 2));
    lmc_p2p_serve_held out;
    assert_false(lmc_p2p_serve_reg_take(r, &hs[0].key, &b, &out));
    assert_false(lmc_p2p_serve_reg_take(r, &hs[0].key, &long_b, &out));
    assert_true(lmc_p2p_serve_reg_take(r, &hs[0].key, &long_a, &out));
    assert_int_equal(out.lease.expiry_ms, 6000);          /* its own, not the oldest */
    assert_false(lmc_p2p_serve_reg_take(r, &hs[0].key, &long_a, &out));
    assert_true(lmc_p2p_serve_reg_covers(r, 0, 100));     /* a's is still held */
    assert_true(lmc_p2p_serve_reg_take(r, &hs[0].key, &a_again, &out));
    assert_false(lmc_p2p_serve_reg_covers(r, 0, 100));
    lmc_p2p_serve_reg_free(r);
}

/* Records hs[0..n), hs[i] taken by owners[i]. */
static void add_owned(lmc_p2p_serve_reg *r, lmc_p2p_serve_held *hs,
                      const lmc_p2p_serve_owner *const *owners, size_t n)
{
    for (size_t i = 0; i < n; i++)
        hs[i].owner = *owners[i];
    assert_true(lmc_p2p_serve_reg_add(r, hs, n));
}

/* A range counts for an owner only through that owner's leases: adjacent
 * objects of two peers cover the range for neither. */
static void test_covers_for_counts_the_owners_leases_only(void **st)
{
    (void)st;
    lmc_p2p_serve_reg *r = new_reg(8);
    lmc_p2p_serve_owner a, b, c;
    lmc_p2p_serve_owner_set(&a, (const uint8_t *)"peer-a", 6);
    lmc_p2p_serve_owner_set(&b, (const uint8_t *)"peer-b", 6);
    lmc_p2p_serve_owner_set(&c, (const uint8_t *)"peer-c", 6);
    lmc_p2p_serve_held hs[3] = {held(1, 0, 100, 5000), held(2, 100, 100, 5000),
                                held(3, 200, 100, 5000)};
    add_owned(r, hs, (const lmc_p2p_serve_owner *[]){&a, &a, &b}, 3);
    assert_true(lmc_p2p_serve_reg_covers_for(r, &a, 0, 200));
    assert_true(lmc_p2p_serve_reg_covers_for(r, &a, 150, 20));    /* inside its object */
    assert_false(lmc_p2p_serve_reg_covers_for(r, &a, 150, 100));  /* into b's */
    assert_true(lmc_p2p_serve_reg_covers_for(r, &b, 200, 100));
    assert_false(lmc_p2p_serve_reg_covers_for(r, &b, 0, 100));
    assert_false(lmc_p2p_serve_reg_covers_for(r, &c, 0, 100));
    assert_true(lmc_p2p_serve_reg_covers_for(r, NULL, 0, 300));   /* anyone's */
    assert_true(lmc_p2p_serve_reg_covers(r, 0, 300));
    lmc_p2p_serve_reg_free(r);
}

/* take_at finds the lease by its object's offset and owner only. */
static void test_take_at_takes_the_owners_lease_at_the_offset(void **st)
{
    (void)st;
    lmc_p2p_serve_reg *r = new_reg(8);
    lmc_p2p_serve_owner a, b;
    lmc_p2p_serve_owner_set(&a, (const uint8_t *)"peer-a", 6);
    lmc_p2p_serve_owner_set(&b, (const uint8_t *)"peer-b", 6);
    lmc_p2p_serve_held hs[3] = {held(1, 0, 100, 5000), held(1, 0, 100, 5000),
                                held(2, 128, 100, 5000)};
    add_owned(r, hs, (const lmc_p2p_serve_owner *[]){&a, &b, &a}, 3);
    lmc_p2p_serve_held out;
    assert_false(lmc_p2p_serve_reg_take_at(r, 50, &a, &out));      /* not an object's start */
    assert_false(lmc_p2p_serve_reg_take_at(r, 128, &b, &out));     /* a's, not b's */
    assert_true(lmc_p2p_serve_reg_take_at(r, 0, &b, &out));
    assert_memory_equal(out.owner.head, "peer-b", 6);
    assert_false(lmc_p2p_serve_reg_take_at(r, 0, &b, &out));
    assert_true(lmc_p2p_serve_reg_covers_for(r, &a, 0, 100));      /* a's stays */
    assert_true(lmc_p2p_serve_reg_take_at(r, 128, NULL, &out));
    size_t n;
    uint64_t bytes;
    lmc_p2p_serve_reg_counts(r, &n, &bytes);
    assert_int_equal(n, 1);
    lmc_p2p_serve_reg_free(r);
}

static void test_expired_leases_cover_nothing_and_are_taken_out(void **st)
{
    (void)st;
    lmc_p2p_serve_reg *r = new_reg(8);
    lmc_p2p_serve_held hs[2] = {held(1, 0, 100, 2000), held(2, 100, 100, 3000)};
    assert_true(lmc_p2p_serve_reg_add(r, hs, 2));
    lmc_p2p_serve_held out[4];
    assert_int_equal(lmc_p2p_serve_reg_take_expired(r, out, 4), 0);
    fake_now = 2000;
    assert_false(lmc_p2p_serve_reg_covers(r, 0, 100));    /* lapsed at its expiry */
    assert_true(lmc_p2p_serve_reg_covers(r, 100, 100));
    assert_false(lmc_p2p_serve_reg_covers(r, 50, 100));
    assert_int_equal(lmc_p2p_serve_reg_take_expired(r, out, 4), 1);
    assert_int_equal(out[0].key.chunk_hash[0], 1);
    fake_now = 10000;
    assert_int_equal(lmc_p2p_serve_reg_take_expired(r, out, 4), 1);
    assert_int_equal(lmc_p2p_serve_reg_room(r), 8);
    lmc_p2p_serve_reg_free(r);
}

static void test_bound_is_all_or_nothing(void **st)
{
    (void)st;
    lmc_p2p_serve_reg *r = new_reg(3);
    lmc_p2p_serve_held hs[4] = {held(1, 0, 10, 5000), held(2, 10, 10, 5000),
                                held(3, 20, 10, 5000), held(4, 30, 10, 5000)};
    assert_false(lmc_p2p_serve_reg_add(r, hs, 4));
    assert_int_equal(lmc_p2p_serve_reg_room(r), 3);
    assert_false(lmc_p2p_serve_reg_covers(r, 0, 10));
    assert_true(lmc_p2p_serve_reg_add(r, hs, 2));
    assert_false(lmc_p2p_serve_reg_add(r, hs + 2, 2));
    assert_true(lmc_p2p_serve_reg_add(r, hs + 2, 1));
    assert_int_equal(lmc_p2p_serve_reg_room(r), 0);
    size_t n;
    uint64_t bytes;
    lmc_p2p_serve_reg_counts(r, &n, &bytes);
    assert_int_equal(n, 3);
    assert_int_equal(bytes, 30);
    lmc_p2p_serve_held out[4];
    assert_int_equal(lmc_p2p_serve_reg_take_all(r, out, 4), 3);
    assert_int_equal(lmc_p2p_serve_reg_room(r), 3);
    assert_null(lmc_p2p_serve_reg_new(0, NULL, NULL));
    lmc_p2p_serve_reg_free(r);
}

/* Many leases, taken out in a scrambled order, some by expiry: after each
 * step the registry answers as a plain list of what is left would. */
static void test_indexes_follow_every_removal(void **st)
{
    (void)st;
    enum { N = 2000 };
    lmc_p2p_serve_reg *r = new_reg(N);
    static lmc_p2p_serve_held hs[N];
    static bool left[N];
    for (int i = 0; i < N; i++) {
        hs[i] = held((uint8_t)i, (uint64_t)i * 128, 100, i % 7 == 0 ? 1500 : 1 << 30);
        hs[i].key.chunk_hash[1] = (uint8_t)(i >> 8);
        left[i] = true;
    }
    assert_true(lmc_p2p_serve_reg_add(r, hs, N / 2));
    assert_true(lmc_p2p_serve_reg_add(r, hs + N / 2, N / 2));
    lmc_p2p_serve_held out[N];
    fake_now = 2000;   /* every 7th has lapsed */
    size_t lapsed = lmc_p2p_serve_reg_take_expired(r, out, N);
    assert_int_equal(lapsed, (N + 6) / 7);
    for (size_t j = 0; j < lapsed; j++)
        left[(out[j].key.chunk_hash[1] << 8) | out[j].key.chunk_hash[0]] = false;
    for (int step = 0; step < N; step++) {
        int i = (step * 7919) % N;   /* 7919 is prime to N: every index once */
        lmc_p2p_serve_held got;
        assert_int_equal(lmc_p2p_serve_reg_take(r, &hs[i].key, NULL, &got), left[i]);
        if (left[i])
            assert_int_equal(got.lease.offset, hs[i].lease.offset);
        left[i] = false;
        if (step % 97 == 0) {
            for (int k = 0; k < N; k++)
                assert_int_equal(lmc_p2p_serve_reg_covers(r, hs[k].lease.offset, 100), left[k]);
        }
    }
    assert_int_equal(lmc_p2p_serve_reg_room(r), N);
    lmc_p2p_serve_reg_free(r);
}

/* The transfer channel asks while lookups add and unlocks take: every
 * answer is one of the two states the range can be in, and the books add
 * up afterwards (run under TSan by the thread build). */
typedef struct {
    lmc_p2p_serve_reg *r;
    atomic_bool stop;
    atomic_int wrong;
} race;

static void *reader(void *arg)
{
    race *rc = arg;
    while (!atomic_load(&rc->stop)) {
        if (!lmc_p2p_serve_reg_covers(rc->r, 0, 100))   /* always leased */
            atomic_fetch_add(&rc->wrong, 1);
        if (lmc_p2p_serve_reg_covers(rc->r, 0, 1000))   /* never all of it */
            atomic_fetch_add(&rc->wrong, 1);
        (void)lmc_p2p_serve_reg_covers(rc->r, 100, 100);
    }
    return NULL;
}

static void test_concurrent_readers(void **st)
{
    (void)st;
    race rc = {.r = new_reg(64)};
    lmc_p2p_serve_held always = held(1, 0, 100, 1 << 30);
    assert_true(lmc_p2p_serve_reg_add(rc.r, &always, 1));
    pthread_t th[2];
    for (int i = 0; i < 2; i++)
        assert_int_equal(pthread_create(&th[i], NULL, reader, &rc), 0);
    lmc_p2p_serve_held churn = held(2, 100, 100, 1 << 30), out;
    for (int i = 0; i < 20000; i++) {
        assert_true(lmc_p2p_serve_reg_add(rc.r, &churn, 1));
        assert_true(lmc_p2p_serve_reg_take(rc.r, &churn.key, NULL, &out));
    }
    atomic_store(&rc.stop, true);
    for (int i = 0; i < 2; i++)
        pthread_join(th[i], NULL);
    assert_int_equal(atomic_load(&rc.wrong), 0);
    assert_int_equal(lmc_p2p_serve_reg_room(rc.r), 63);
    lmc_p2p_serve_reg_free(rc.r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_covers_inside_one_object_only),
        cmocka_unit_test(test_adjacent_and_overlapping_ranges),
        cmocka_unit_test(test_take_releases_one_lease_of_the_key),
        cmocka_unit_test(test_take_gives_back_only_the_owners_lease),
        cmocka_unit_test(test_covers_for_counts_the_owners_leases_only),
        cmocka_unit_test(test_take_at_takes_the_owners_lease_at_the_offset),
        cmocka_unit_test(test_expired_leases_cover_nothing_and_are_taken_out),
        cmocka_unit_test(test_bound_is_all_or_nothing),
        cmocka_unit_test(test_indexes_follow_every_removal),
        cmocka_unit_test(test_concurrent_readers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
