#include "storage/key_table.h"

#include <stdlib.h>

static const lmc_object_key *item_key(const lmc_key_table *t, const void *item)
{
    return (const lmc_object_key *)((const char *)item + t->key_offset);
}

static uint32_t key_hash(const lmc_object_key *key)
{
    return (uint32_t)lmc_object_key_hash(key);
}

static size_t round_up_pow2(size_t n)
{
    size_t p = 16;
    while (p < n)
        p <<= 1;
    return p;
}

/* Items, then hashes, in one block: both naturally aligned. */
static int alloc_slots(void ***items, uint32_t **hashes, size_t capacity)
{
    void **block = calloc(capacity, sizeof(void *) + sizeof(uint32_t));
    if (!block)
        return -1;
    *items = block;
    *hashes = (uint32_t *)(block + capacity);
    return 0;
}

int lmc_key_table_init(lmc_key_table *t, size_t key_offset, size_t initial_capacity)
{
    t->capacity = round_up_pow2(initial_capacity);
    t->count = 0;
    t->key_offset = key_offset;
    if (alloc_slots(&t->items, &t->hashes, t->capacity) != 0) {
        t->items = NULL;
        t->hashes = NULL;
        return -1;
    }
    return 0;
}

void lmc_key_table_destroy(lmc_key_table *t)
{
    free(t->items);
    t->items = NULL;
    t->hashes = NULL;
    t->capacity = t->count = 0;
}

size_t lmc_key_table_memory(const lmc_key_table *t)
{
    return t->capacity * (sizeof(void *) + sizeof(uint32_t));
}

static size_t find_slot(const lmc_key_table *t, const lmc_object_key *key, uint32_t hash)
{
    size_t mask = t->capacity - 1;
    for (size_t i = hash & mask;; i = (i + 1) & mask) {
        if (!t->items[i])
            return i;
        if (t->hashes[i] == hash && lmc_object_key_equal(item_key(t, t->items[i]), key))
            return i;
    }
}

void *lmc_key_table_find(const lmc_key_table *t, const lmc_object_key *key)
{
    return t->items[find_slot(t, key, key_hash(key))];
}

static void place(void **items, uint32_t *hashes, size_t capacity, void *item, uint32_t hash)
{
    size_t mask = capacity - 1;
    size_t i = hash & mask;
    while (items[i])
        i = (i + 1) & mask;
    items[i] = item;
    hashes[i] = hash;
}

static int grow(lmc_key_table *t)
{
    size_t new_capacity = t->capacity * 2;
    void **items;
    uint32_t *hashes;
    if (alloc_slots(&items, &hashes, new_capacity) != 0)
        return -1;
    for (size_t i = 0; i < t->capacity; i++)
        if (t->items[i])
            place(items, hashes, new_capacity, t->items[i], t->hashes[i]);
    free(t->items);
    t->items = items;
    t->hashes = hashes;
    t->capacity = new_capacity;
    return 0;
}

int lmc_key_table_insert(lmc_key_table *t, void *item)
{
    if ((t->count + 1) * 4 > t->capacity * 3 && grow(t) != 0)
        return -1;
    place(t->items, t->hashes, t->capacity, item, key_hash(item_key(t, item)));
    t->count++;
    return 0;
}

/* Backward-shift deletion: pull later members of the probe run into the
 * hole so that lookups never stop early at it. */
void *lmc_key_table_remove(lmc_key_table *t, const lmc_object_key *key)
{
    size_t mask = t->capacity - 1;
    size_t hole = find_slot(t, key, key_hash(key));
    void *item = t->items[hole];
    if (!item)
        return NULL;
    for (size_t j = (hole + 1) & mask; t->items[j]; j = (j + 1) & mask) {
        size_t home = t->hashes[j] & mask;
        /* j may move to `hole` only if its home is not in (hole, j]. */
        size_t dist_home = (j - home) & mask;
        size_t dist_hole = (j - hole) & mask;
        if (dist_home >= dist_hole) {
            t->items[hole] = t->items[j];
            t->hashes[hole] = t->hashes[j];
            hole = j;
        }
    }
    t->items[hole] = NULL;
    t->hashes[hole] = 0;
    t->count--;
    return item;
}
