/* Allocation failures in the storage manager and its L1 leases
 * (docs/storage.md, "Leases" and "Invariants"; docs/testing.md): a store
 * through WRITE leases, a lookup's READ leases, a retrieve's COPY leases, a
 * forced clear in the middle of a copy, and eviction, each with the n-th
 * allocation failing.  Every call either succeeds or says it failed; after
 * every run the books balance, no lease is left out, nothing was published
 * that its writer did not publish, and closing the manager frees it all. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "alloc_fault.h"
#include "storage/storage_manager.h"
#include "storage/storage_manager_testing.h"

#define N 16
#define OBJ 3000   /* not a multiple of the alignment: object_size != size */

typedef struct {
    lmc_storage_manager *sm;
    lmc_object_key keys[N];
    lmc_lease writes[N], reads[N], copies[N];
    lmc_l1_result res[N];
} run_state;

static void make_keys(lmc_object_key *keys, int salt)
{
    for (int i = 0; i < N; i++) {
        memset(&keys[i], 0, sizeof keys[i]);
        keys[i].chunk_hash_len = 32;
        keys[i].chunk_hash[0] = (uint8_t)i;
        keys[i].chunk_hash[1] = (uint8_t)salt;
        keys[i].model_name = "org/model";
        keys[i].cache_salt = "";
        keys[i].kv_rank = lmc_kv_rank_for_worker(1, 0);
    }
}

static lmc_storage_manager *open_manager(uint64_t l1_bytes)
{
    lmc_storage_options o;
    lmc_storage_options_defaults(&o);
    o.l1_size_bytes = l1_bytes;
    o.l1_use_lazy = false;
    o.shm_auto = false;
    o.shm_name[0] = '\0';            /* private memory */
    o.eviction_period_ms = 0;        /* no thread: eviction runs when asked */
    o.eviction_ratio = 1.0;          /* one pass empties the unlocked L1 */
    o.check_books = true;            /* abort() on the first broken rule */
    char err[256];
    lmc_storage_manager *sm = lmc_storage_manager_create(&o, err, sizeof err);
    /* The committer thread's pre-fault changes what a store sees (writes
     * wait while it runs) and allocates on its own thread: both must be
     * over before the counted sequence goes on, or runs differ. */
    if (sm && !lmc_storage_manager_wait_prefault(sm, 10000)) {
        lmc_storage_manager_close(sm);
        return NULL;
    }
    return sm;
}

static bool all(const lmc_l1_result *res, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (res[i] != LMC_L1_SUCCESS)
            return false;
    return true;
}

/* With nothing failing: how many of keys are resident (a prefix lease
 * taken and given straight back). */
static size_t resident(run_state *r, const lmc_object_key *keys, size_t n)
{
    lmc_lease probe[N];
    lmc_fault_pause();
    size_t hits = lmc_storage_manager_lease_read(r->sm, keys, n, 1, true, NULL, probe, NULL);
    lmc_storage_manager_give_back(r->sm, keys, probe, hits);
    lmc_fault_resume();
    return hits;
}

static void give_back_held(run_state *r, lmc_lease *leases)
{
    for (int i = 0; i < N; i++)
        if (lmc_lease_held(&leases[i]))
            lmc_storage_manager_give_back(r->sm, &r->keys[i], &leases[i], 1);
}

/* A broken contract: recorded, and the run still cleans up after itself so
 * that the report names the broken rule, not a leak. */
static void close_quietly(run_state *r);
#define BROKEN(r, ...) (lmc_fault_violation(__VA_ARGS__), close_quietly(r), LMC_FAULT_VIOLATION)

static void close_quietly(run_state *r)
{
    give_back_held(r, r->copies);
    give_back_held(r, r->reads);
    give_back_held(r, r->writes);
    lmc_storage_manager_close(r->sm);
}

/* Gives back whatever a run still holds, checks the books and the ledger,
 * closes the manager.  LMC_FAULT_ERROR, or a violation. */
static int unwind(run_state *r)
{
    give_back_held(r, r->copies);
    give_back_held(r, r->reads);
    give_back_held(r, r->writes);
    lmc_fault_pause();
    lmc_lease_counts c;
    lmc_storage_manager_lease_counts(r->sm, &c);
    bool books = lmc_storage_manager_check_books(r->sm);
    lmc_fault_resume();
    lmc_storage_manager_close(r->sm);
    if (!books)
        return lmc_fault_violation("the L1 books do not balance after a failure");
    /* READ shares are counted, not matched (docs/storage.md, "Invariants"). */
    for (int k = LMC_LEASE_WRITE; k <= LMC_LEASE_COPY; k += LMC_LEASE_COPY - LMC_LEASE_WRITE)
        if (c.granted[k] != c.returned[k] + c.lapsed[k])
            return lmc_fault_violation("%s leases left out: granted %llu, returned %llu",
                                       lmc_lease_kind_name((lmc_lease_kind)k),
                                       (unsigned long long)c.granted[k],
                                       (unsigned long long)c.returned[k]);
    if (c.returned_twice)
        return lmc_fault_violation("a lease was given back twice");
    return LMC_FAULT_ERROR;
}

/* Store (WRITE leases, publish), look up (READ), retrieve (COPY carrying
 * the lookup's share), then a forced clear while a second copy is out. */
static int store_lookup_retrieve(void *arg)
{
    (void)arg;
    run_state r = {0};
    make_keys(r.keys, 1);
    if (!(r.sm = open_manager(4u << 20)))
        return LMC_FAULT_ERROR;
    if (lmc_storage_manager_lease_write(r.sm, r.keys, N, OBJ, false, "w", r.writes, r.res) != 0 ||
        !all(r.res, N))
        return unwind(&r);
    uint8_t *base = lmc_storage_manager_l1_arena(r.sm)->base;
    for (int i = 0; i < N; i++)   /* the writer fills its buffers */
        memset(base + r.writes[i].offset, i, OBJ);
    if (lmc_storage_manager_publish_writes(r.sm, r.keys, r.writes, N, 0, r.res) != 0) {
        if (resident(&r, r.keys, N) != 0)
            return BROKEN(&r, "a failed publish made keys visible");
        return unwind(&r);
    }
    if (!all(r.res, N))
        return BROKEN(&r, "publish of live WRITE leases said %s",
                                   lmc_l1_result_name(r.res[0]));
    size_t hits = lmc_storage_manager_lease_read(r.sm, r.keys, N, 2, true, NULL, r.reads, r.res);
    if (hits != N)
        return r.res[hits] == LMC_L1_OUT_OF_MEMORY
                   ? unwind(&r)
                   : BROKEN(&r, "lookup hit %zu of %d stored keys", hits, N);
    size_t got = lmc_storage_manager_lease_copy(r.sm, r.keys, N, LMC_COPY_CARRIES_SHARE, true, NULL,
                                                r.copies, r.res);
    if (got != N)
        return r.res[0] == LMC_L1_OUT_OF_MEMORY
                   ? unwind(&r)
                   : BROKEN(&r, "retrieve got %zu of %d", got, N);
    for (int i = 0; i < N; i++)
        if (r.copies[i].object_size != OBJ ||
            base[r.copies[i].offset] != (uint8_t)i)
            return BROKEN(&r, "COPY lease %d names the wrong bytes", i);
    lmc_storage_manager_give_back(r.sm, r.keys, r.copies, N);
    got = lmc_storage_manager_lease_copy(r.sm, r.keys, N, LMC_COPY_TAKES_SHARE, false, NULL,
                                         r.copies,
                                         r.res);
    if (got != N)
        return unwind(&r);
    if (lmc_storage_manager_clear(r.sm, true) < 0)
        return unwind(&r);
    if (resident(&r, r.keys, N) != 0)
        return BROKEN(&r, "keys survived a forced clear");
    lmc_storage_manager_give_back(r.sm, r.keys, r.copies, N);   /* retired buffers go */
    lmc_storage_manager_give_back(r.sm, r.keys, r.reads, N);    /* stale: no effect */
    lmc_lease_counts c;
    lmc_storage_manager_lease_counts(r.sm, &c);
    if (c.returned_stale != N)
        return BROKEN(&r, "%llu stale give-backs, want %d",
                                   (unsigned long long)c.returned_stale, N);
    if (unwind(&r) != LMC_FAULT_ERROR)
        return LMC_FAULT_VIOLATION;
    return LMC_FAULT_OK;
}

/* An L1 that holds about half the prompt: the store of the second half
 * fails for lack of space until eviction makes room. */
static int store_past_capacity(void *arg)
{
    (void)arg;
    run_state r = {0};
    make_keys(r.keys, 2);
    if (!(r.sm = open_manager((uint64_t)N / 2 * 4096)))
        return LMC_FAULT_ERROR;
    for (int half = 0; half < 2; half++) {
        lmc_object_key *k = r.keys + half * N / 2;
        lmc_lease *w = r.writes + half * N / 2;
        if (lmc_storage_manager_lease_write(r.sm, k, N / 2, OBJ, false, NULL, w, r.res) != 0)
            return unwind(&r);
        size_t oom = 0;
        for (size_t i = 0; i < N / 2; i++)
            oom += r.res[i] == LMC_L1_OUT_OF_MEMORY;
        if (oom > 0 && oom < N / 2)   /* bookkeeping memory ran out for some keys */
            return unwind(&r);
        if (oom == N / 2) {           /* the L1 is full: evict, then again */
            if (half == 0)   /* an empty L1 has room: the bookkeeping ran out */
                return unwind(&r);
            if (lmc_storage_manager_run_eviction_once(r.sm) == 0)
                return unwind(&r);   /* the eviction pass could not allocate */
            if (lmc_storage_manager_lease_write(r.sm, k, N / 2, OBJ, false, NULL, w, r.res) != 0 ||
                !all(r.res, N / 2))
                return unwind(&r);
        } else if (!all(r.res, N / 2)) {
            return BROKEN(&r, "store said %s", lmc_l1_result_name(r.res[0]));
        }
        if (lmc_storage_manager_publish_writes(r.sm, k, w, N / 2, 0, r.res) != 0)
            return unwind(&r);
    }
    if (resident(&r, r.keys + N / 2, N / 2) != N / 2)
        return BROKEN(&r, "the second half is not resident after eviction");
    if (unwind(&r) != LMC_FAULT_ERROR)
        return LMC_FAULT_VIOLATION;
    return LMC_FAULT_OK;
}

static void test_store_lookup_retrieve(void **state)
{
    (void)state;
    assert_int_equal(lmc_fault_run("storage.store_lookup_retrieve", store_lookup_retrieve, NULL,
                                   NULL, 0),
                     0);
}

static void test_store_past_capacity(void **state)
{
    (void)state;
    assert_int_equal(
        lmc_fault_run("storage.store_past_capacity", store_past_capacity, NULL, NULL, 0), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_store_lookup_retrieve),
        cmocka_unit_test(test_store_past_capacity),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
