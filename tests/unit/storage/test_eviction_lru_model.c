/* The LRU policy against a reference LRU kept as a plain array (oldest
 * first): random batches of adds, touches, removals and victim selections
 * over keys of several models, salts, ranks and groups, including equal
 * strings at different addresses.  Victims must come out in the same order
 * and as the very keys that went in (same string pointers). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "storage/eviction_policy.h"

#define POOL 5000
#define MAX_BATCH 300

static char model_a[] = "model-a", model_a_again[] = "model-a", model_b[] = "org/model-b";
static char salt_none[] = "", salt_x[] = "tenant-x", salt_x_again[] = "tenant-x";

static uint64_t rng_state = 0x853c49e6748fea9bULL;

static uint64_t rng(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

/* Key `id` with one of several string spellings; `spelling` picks the
 * address of equal strings, so the key's identity does not depend on it. */
static lmc_object_key make_key(uint32_t id, unsigned spelling)
{
    lmc_object_key k;
    memset(&k, 0, sizeof(k));
    uint64_t head = (uint64_t)id * 0xd6e8feb86659fd93ULL;
    if (id % 50 == 0)
        head = 1;   /* a crowd of keys in one bucket */
    memcpy(k.chunk_hash, &head, sizeof(head));
    memcpy(&k.chunk_hash[8], &id, sizeof(id));
    k.chunk_hash[31] = (uint8_t)id;
    k.chunk_hash_len = id % 97 == 0 ? 16 : 32;
    k.kv_rank = lmc_kv_rank_for_worker(4, id % 4);
    k.object_group_id = id % 7 == 0 ? 1 : 0;
    switch (id % 3) {
    case 0:
        k.model_name = spelling ? model_a_again : model_a;
        break;
    case 1:
        k.model_name = model_b;
        break;
    default:
        k.model_name = model_a;
        break;
    }
    k.cache_salt = id % 5 == 0 ? (spelling ? salt_x_again : salt_x) : salt_none;
    return k;
}

static uint32_t key_id(const lmc_object_key *k)
{
    uint32_t id;
    memcpy(&id, &k->chunk_hash[8], sizeof(id));
    return id;
}

/* The reference: keys oldest first, each as it was first added. */
typedef struct model {
    lmc_object_key keys[POOL];
    size_t n;
} model;

static ssize_t model_find(const model *m, const lmc_object_key *k)
{
    for (size_t i = 0; i < m->n; i++)
        if (lmc_object_key_equal(&m->keys[i], k))
            return (ssize_t)i;
    return -1;
}

static void model_erase(model *m, size_t i)
{
    memmove(&m->keys[i], &m->keys[i + 1], (m->n - i - 1) * sizeof(m->keys[0]));
    m->n--;
}

static void model_refresh(model *m, const lmc_object_key *keys, size_t n, bool create)
{
    for (size_t j = n; j-- > 0;) {
        ssize_t i = model_find(m, &keys[j]);
        lmc_object_key kept = keys[j];
        if (i >= 0) {
            kept = m->keys[i];
            model_erase(m, (size_t)i);
        } else if (!create) {
            continue;
        }
        m->keys[m->n++] = kept;
    }
}

static void model_remove(model *m, const lmc_object_key *keys, size_t n)
{
    for (size_t j = 0; j < n; j++) {
        ssize_t i = model_find(m, &keys[j]);
        if (i >= 0)
            model_erase(m, (size_t)i);
    }
}

static uint8_t verdict_of[POOL];

static lmc_l1_evictability judge(void *user, const lmc_object_key *key)
{
    (void)user;
    return (lmc_l1_evictability)verdict_of[key_id(key)];
}

static size_t model_select(model *m, size_t max, lmc_object_key *out)
{
    size_t found = 0;
    for (size_t i = 0; i < m->n && found < max;) {
        lmc_l1_evictability v = judge(NULL, &m->keys[i]);
        if (v == LMC_L1_EVICTABLE)
            out[found++] = m->keys[i];
        if (v == LMC_L1_GONE)
            model_erase(m, i);
        else
            i++;
    }
    return found;
}

static void same_keys(const lmc_object_key *a, const lmc_object_key *b, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(key_id(&a[i]), key_id(&b[i]));
        assert_memory_equal(a[i].chunk_hash, b[i].chunk_hash, LMC_CHUNK_HASH_MAX);
        assert_int_equal(a[i].chunk_hash_len, b[i].chunk_hash_len);
        assert_int_equal(a[i].kv_rank, b[i].kv_rank);
        assert_int_equal(a[i].object_group_id, b[i].object_group_id);
        assert_ptr_equal(a[i].model_name, b[i].model_name);
        assert_ptr_equal(a[i].cache_salt, b[i].cache_salt);
    }
}

static void random_batch(lmc_object_key *keys, size_t n, uint32_t range)
{
    uint32_t base = (uint32_t)(rng() % range);
    for (size_t i = 0; i < n; i++) {
        /* Mostly runs of consecutive ids, as a prompt's chunks are. */
        uint32_t id = rng() % 4 ? (base + (uint32_t)i) % range : (uint32_t)(rng() % range);
        keys[i] = make_key(id, (unsigned)(rng() % 2));
    }
}

static void run_model(size_t steps, uint32_t range)
{
    static model m;
    static lmc_object_key keys[MAX_BATCH], got[MAX_BATCH], want[MAX_BATCH];
    m.n = 0;
    lmc_eviction_policy *p = lmc_eviction_policy_lru_new();
    assert_non_null(p);
    for (size_t step = 0; step < steps; step++) {
        unsigned op = (unsigned)(rng() % 100);
        size_t n = 1 + (size_t)(rng() % (rng() % 8 ? 32 : MAX_BATCH));
        random_batch(keys, n, range);
        if (op < 45) {
            p->ops->on_keys_added(p, keys, n);
            model_refresh(&m, keys, n, true);
        } else if (op < 60) {
            p->ops->on_keys_accessed(p, keys, n);
            model_refresh(&m, keys, n, false);
        } else if (op < 85) {
            p->ops->on_keys_removed(p, keys, n);
            model_remove(&m, keys, n);
        } else {
            unsigned gone = (unsigned)(rng() % 40);
            for (uint32_t i = 0; i < POOL; i++) {
                unsigned r = (unsigned)(rng() % 100);
                verdict_of[i] = r < gone                ? LMC_L1_GONE
                                : r < gone + 10 ? LMC_L1_NOT_EVICTABLE
                                                : LMC_L1_EVICTABLE;
            }
            size_t max = 1 + (size_t)(rng() % MAX_BATCH);
            size_t want_n = model_select(&m, max, want);
            assert_int_equal(p->ops->select_victims(p, max, judge, NULL, got), want_n);
            same_keys(got, want, want_n);
        }
        assert_int_equal(p->ops->num_tracked(p), m.n);
    }
    /* The whole order, oldest first. */
    memset(verdict_of, LMC_L1_EVICTABLE, sizeof(verdict_of));
    static lmc_object_key all_got[POOL];
    assert_int_equal(p->ops->select_victims(p, POOL, judge, NULL, all_got), m.n);
    same_keys(all_got, m.keys, m.n);
    /* Drained, then refilled from the freed nodes. */
    p->ops->on_keys_removed(p, m.keys, m.n);
    assert_int_equal(p->ops->num_tracked(p), 0);
    assert_int_equal(p->ops->select_victims(p, POOL, judge, NULL, all_got), 0);
    for (uint32_t i = 0; i < POOL; i++)
        all_got[i] = make_key(i, 0);
    p->ops->on_keys_added(p, all_got, POOL);
    assert_int_equal(p->ops->num_tracked(p), POOL);
    assert_int_equal(p->ops->select_victims(p, 1, judge, NULL, got), 1);
    assert_int_equal(key_id(&got[0]), POOL - 1);
    lmc_eviction_policy_free(p);
}

static void test_small_working_set(void **state)
{
    (void)state;
    run_model(20000, 300);
}

static void test_large_working_set(void **state)
{
    (void)state;
    run_model(4000, POOL);
}

/* Forgetting GONE keys while walking frees nodes under the walk; it must
 * still visit every other key once, in order. */
static void test_select_forgets_while_walking(void **state)
{
    (void)state;
    lmc_eviction_policy *p = lmc_eviction_policy_lru_new();
    static lmc_object_key keys[3000], out[3000];
    for (uint32_t i = 0; i < 3000; i++)
        keys[i] = make_key(i, 0);
    p->ops->on_keys_added(p, keys, 3000);   /* oldest: key 2999 */
    for (uint32_t i = 0; i < 3000; i++)
        verdict_of[i] = i % 3 == 0 ? LMC_L1_GONE : LMC_L1_EVICTABLE;
    assert_int_equal(p->ops->select_victims(p, 3000, judge, NULL, out), 2000);
    size_t k = 0;
    for (uint32_t i = 3000; i-- > 0;)
        if (i % 3 != 0)
            assert_int_equal(key_id(&out[k++]), i);
    assert_int_equal(p->ops->num_tracked(p), 2000);
    lmc_eviction_policy_free(p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_small_working_set),
        cmocka_unit_test(test_large_working_set),
        cmocka_unit_test(test_select_forgets_while_walking),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
