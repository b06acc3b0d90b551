/* key_table against a plain array: random inserts, finds and removes,
 * with many keys sharing a hash so that probe runs get long and
 * backward-shift deletion has work to do. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "storage/key_table.h"

#define POOL 6000

typedef struct item {
    uint32_t id;
    lmc_object_key key;
} item;

static uint64_t rng_state = 0x2545f4914f6cdd1dULL;

static uint64_t rng(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

/* Keys i and i ^ 1 differ only past the 8 bytes the hash reads, and every
 * 16th key repeats the first bytes of key 0: both collide. */
static void make_item(item *it, uint32_t id)
{
    memset(it, 0, sizeof(*it));
    it->id = id;
    uint64_t head = id % 16 == 0 ? 7 : (uint64_t)(id >> 1) * 0x9e3779b97f4a7c15ULL;
    memcpy(it->key.chunk_hash, &head, sizeof(head));
    memcpy(&it->key.chunk_hash[8], &id, sizeof(id));
    it->key.chunk_hash_len = 32;
    it->key.kv_rank = id % 3;
    it->key.model_name = "m";
    it->key.cache_salt = "";
}

static void test_against_array(void **state)
{
    (void)state;
    static item items[POOL];
    static bool in[POOL];
    for (uint32_t i = 0; i < POOL; i++)
        make_item(&items[i], i);
    lmc_key_table t;
    assert_int_equal(lmc_key_table_init(&t, offsetof(item, key), 1), 0);
    assert_int_equal(t.capacity, 16);
    size_t count = 0;
    for (int step = 0; step < 200000; step++) {
        uint32_t id = (uint32_t)(rng() % POOL);
        item *found = lmc_key_table_find(&t, &items[id].key);
        assert_ptr_equal(found, in[id] ? &items[id] : NULL);
        if (rng() % 100 < (count < POOL / 2 ? 60 : 40)) {
            if (!in[id]) {
                assert_int_equal(lmc_key_table_insert(&t, &items[id]), 0);
                in[id] = true;
                count++;
            }
        } else {
            assert_ptr_equal(lmc_key_table_remove(&t, &items[id].key), in[id] ? &items[id] : NULL);
            count -= in[id];
            in[id] = false;
        }
        assert_int_equal(t.count, count);
        assert_true(t.count * 4 <= t.capacity * 3);
    }
    size_t seen = 0;
    for (size_t i = 0; i < t.capacity; i++) {
        item *it = lmc_key_table_slot_item(&t, i);
        if (it) {
            assert_true(in[it->id]);
            seen++;
        }
    }
    assert_int_equal(seen, count);
    for (uint32_t i = 0; i < POOL; i++)
        assert_ptr_equal(lmc_key_table_find(&t, &items[i].key), in[i] ? &items[i] : NULL);
    assert_int_equal(lmc_key_table_memory(&t), t.capacity * 12);
    lmc_key_table_destroy(&t);
    assert_null(t.items);
}

/* Equal keys are found whatever pointers their strings have. */
static void test_strings_compare_by_content(void **state)
{
    (void)state;
    static char model_a[] = "model", model_b[] = "model", salt_a[] = "s", salt_b[] = "s";
    item it;
    make_item(&it, 5);
    it.key.model_name = model_a;
    it.key.cache_salt = salt_a;
    lmc_key_table t;
    assert_int_equal(lmc_key_table_init(&t, offsetof(item, key), 16), 0);
    assert_int_equal(lmc_key_table_insert(&t, &it), 0);
    lmc_object_key probe = it.key;
    probe.model_name = model_b;
    probe.cache_salt = salt_b;
    assert_ptr_equal(lmc_key_table_find(&t, &probe), &it);
    probe.cache_salt = "";
    assert_null(lmc_key_table_find(&t, &probe));
    assert_ptr_equal(lmc_key_table_remove(&t, &it.key), &it);
    assert_int_equal(t.count, 0);
    lmc_key_table_destroy(&t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_against_array),
        cmocka_unit_test(test_strings_compare_by_content),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
