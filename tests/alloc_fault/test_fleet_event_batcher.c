/* Allocation failures in the cache-event batcher (src/fleet/event_batcher.c,
 * docs/fleet.md "Cache-event stream"): whatever fails, every entry added
 * is either in a delivered post or counted as dropped, exactly once; a
 * body that goes out is right to the byte of what it says (a capacity
 * never reads "unlimited" for want of memory, a name that is UTF-8 is
 * never counted as unencodable); a declaration that did not go out is
 * still pending; and the batcher keeps working afterwards. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "alloc_fault.h"
#include "fleet/event_batcher.h"

#define ADDED 6   /* entries the scenario adds */

static lmc_object_key key_n(uint8_t n)
{
    lmc_object_key k = {.chunk_hash_len = 32, .kv_rank = 0x02010201u, .object_group_id = 0,
                        .model_name = "m\xc3\xa9", .cache_salt = "s"}; /* "mé": UTF-8 */
    memset(k.chunk_hash, n, sizeof k.chunk_hash);
    return k;
}

static const lmc_fleet_event_compartment DECL[] = {
    {.tier = LMC_CEV_L1, .backend = "dram", .shared = false, .capacity_bytes = 1u << 30},
    {.tier = LMC_CEV_L2, .backend = "fs", .shared = true, .capacity_bytes = 5ull << 30},
};

static json_int_t int_of(const json_t *o, const char *field)
{
    return json_integer_value(json_object_get(o, field));
}

/* The body against what it says it holds: seqs consecutive from first_seq,
 * config batches with the declared capacities, every entry's model name
 * intact.  0, or a violation. */
static int body_is_right(json_t *body, const lmc_fleet_event_take *t, json_int_t first_seq)
{
    json_t *list = json_object_get(body, "batches");
    size_t n = json_array_size(list), entries = 0;
    if (n != t->config_batches + t->placement_batches)
        return lmc_fault_violation("%zu batches for %zu config + %zu placement", n,
                                   t->config_batches, t->placement_batches);
    for (size_t i = 0; i < n; i++) {
        json_t *b = json_array_get(list, i);
        if (int_of(b, "seq") != first_seq + (json_int_t)i)
            return lmc_fault_violation("batch %zu has seq %lld, want %lld", i,
                                       (long long)int_of(b, "seq"), (long long)(first_seq + i));
        const char *type = json_string_value(json_object_get(b, "event_type"));
        if (i < t->config_batches) {
            if (!type || strcmp(type, "config") != 0 ||
                int_of(b, "capacity_bytes") != (json_int_t)DECL[i].capacity_bytes ||
                int_of(b, "capacity_revision") != (json_int_t)t->revision)
                return lmc_fault_violation("config batch %zu declares %lld bytes, revision %lld",
                                           i, (long long)int_of(b, "capacity_bytes"),
                                           (long long)int_of(b, "capacity_revision"));
            continue;
        }
        json_t *list_e = json_object_get(b, "entries");
        for (size_t j = 0; j < json_array_size(list_e); j++) {
            json_t *key = json_object_get(json_array_get(list_e, j), "key");
            const char *model = json_string_value(json_object_get(key, "model_name"));
            if (!model || strcmp(model, "m\xc3\xa9") != 0)
                return lmc_fault_violation("an entry's model name is %s", model ? model : "gone");
            entries++;
        }
    }
    if (entries != t->placement_entries)
        return lmc_fault_violation("%zu entries for %zu taken", entries, t->placement_entries);
    return 0;
}

/* Everything added is delivered or dropped, once. */
static int books_balance(lmc_fleet_event_batcher *b, uint64_t added)
{
    lmc_fleet_event_stats st = lmc_fleet_event_batcher_stats(b);
    if (st.entries_unencodable != 0)
        return lmc_fault_violation("%llu UTF-8 entries counted as unencodable",
                                   (unsigned long long)st.entries_unencodable);
    if (st.entries_sent + st.entries_dropped + st.queued != added)
        return lmc_fault_violation("%llu sent + %llu dropped + %zu queued != %llu added",
                                   (unsigned long long)st.entries_sent,
                                   (unsigned long long)st.entries_dropped, st.queued,
                                   (unsigned long long)added);
    return 0;
}

static int batch_round(void *arg)
{
    (void)arg;
    lmc_fleet_event_batcher *b = lmc_fleet_event_batcher_new("mp-1", 1700000000, 64);
    if (!b)
        return LMC_FAULT_ERROR;
    bool failed = lmc_fleet_event_batcher_declare(b, DECL, 2) != 0;
    lmc_object_key k[ADDED];
    for (uint8_t i = 0; i < ADDED; i++)
        k[i] = key_n((uint8_t)(i + 1));
    uint64_t sizes[ADDED] = {10, 11, 12, 13, 14, 15};
    lmc_fleet_event_batcher_add(b, LMC_CEV_STORE, LMC_CEV_L1, "dram", false, k, sizes, 0, 3);
    lmc_fleet_event_batcher_add(b, LMC_CEV_DELETE, LMC_CEV_L1, "dram", false, k + 3, NULL, 0, 1);
    lmc_fleet_event_batcher_add(b, LMC_CEV_STORE, LMC_CEV_L2, "fs", true, k + 4, sizes + 4, 0, 2);
    lmc_fleet_event_take t;
    json_t *body = lmc_fleet_event_batcher_take(b, 1.0, NULL, NULL, &t);
    failed |= body == NULL;

    int verdict = LMC_FAULT_OK;
    lmc_fault_pause();
    if (body && body_is_right(body, &t, 1) != 0)
        verdict = LMC_FAULT_VIOLATION;
    if (body)
        lmc_fleet_event_batcher_settle(b, &t, LMC_CEV_DELIVERED);
    json_decref(body);
    if (verdict == LMC_FAULT_OK && books_balance(b, ADDED) != 0)
        verdict = LMC_FAULT_VIOLATION;

    /* Afterwards, with memory back: one more entry, and the declaration
     * if it has not gone out yet; seqs go on after the ones spent. */
    lmc_fleet_event_stats before = lmc_fleet_event_batcher_stats(b);
    lmc_object_key more = key_n(9);
    lmc_fleet_event_batcher_add(b, LMC_CEV_STORE, LMC_CEV_L1, "dram", false, &more, sizes, 0, 1);
    if (before.capacity_revision == 0 && lmc_fleet_event_batcher_declare(b, DECL, 2) != 0)
        verdict = lmc_fault_violation("declare failed with memory back");
    bool pending = before.capacity_revision == 0 || before.capacity_pending;
    json_t *next = lmc_fleet_event_batcher_take(b, 2.0, NULL, NULL, &t);
    if (verdict == LMC_FAULT_OK) {
        if (!next)
            verdict = lmc_fault_violation("nothing to send after the failure");
        else if (t.placement_entries != 1 || t.config_batches != (pending ? 2u : 0u))
            verdict = lmc_fault_violation("the next post holds %zu entries, %zu config batches "
                                          "(want 1, %d)", t.placement_entries,
                                          t.config_batches, pending ? 2 : 0);
        else if (body_is_right(next, &t, (json_int_t)before.seq + 1) != 0)
            verdict = LMC_FAULT_VIOLATION;
    }
    if (next)
        lmc_fleet_event_batcher_settle(b, &t, LMC_CEV_DELIVERED);
    json_decref(next);
    if (verdict == LMC_FAULT_OK && books_balance(b, ADDED + 1) != 0)
        verdict = LMC_FAULT_VIOLATION;
    lmc_fleet_event_batcher_free(b);
    lmc_fault_resume();
    /* add() says nothing to its caller: a lost entry shows in the books. */
    failed |= before.entries_dropped > 0;
    return verdict == LMC_FAULT_OK && failed ? LMC_FAULT_ERROR : verdict;
}

static void test_take(void **state)
{
    (void)state;
    assert_int_equal(lmc_fault_run("event_batcher.take", batch_round, NULL, NULL, 0), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_take)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
