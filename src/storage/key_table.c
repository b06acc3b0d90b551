#include "storage/key_table.h"

#include <stdlib.h>

_Static_assert(sizeof(lmc_key_slot) == 12, "key table slots must stay 12 bytes");

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

int lmc_key_table_init(lmc_key_table *t, size_t key_offset, size_t initial_capacity)
{
    t->capacity = round_up_pow2(initial_capacity);
    t->count = 0;
    t->key_offset = key_offset;
    t->slots = calloc(t->capacity, sizeof(*t->slots));
    return t->slots ? 0 : -1;
}

void lmc_key_table_destroy(lmc_key_table *t)
{
    free(t->slots);
    t->slots = NULL;
    t->capacity = t->count = 0;
}

size_t lmc_key_table_memory(const lmc_key_table *t)
{
    return t->capacity * sizeof(*t->slots);
}

static size_t find_slot(const lmc_key_table *t, const lmc_object_key *key, uint32_t hash)
{
    size_t mask = t->capacity - 1;
    for (size_t i = hash & mask;; i = (i + 1) & mask) {
        const lmc_key_slot *s = &t->slots[i];
        if (!s->item)
            return i;
        if (s->hash == hash && lmc_object_key_equal(item_key(t, s->item), key))
            return i;
    }
}

void *lmc_key_table_find(const lmc_key_table *t, const lmc_object_key *key)
{
    return t->slots[find_slot(t, key, key_hash(key))].item;
}

static void place(lmc_key_slot *slots, size_t capacity, lmc_key_slot s)
{
    size_t mask = capacity - 1;
    size_t i = s.hash & mask;
    while (slots[i].item)
        i = (i + 1) & mask;
    slots[i] = s;
}

static int grow(lmc_key_table *t)
{
    size_t new_capacity = t->capacity * 2;
    lmc_key_slot *fresh = calloc(new_capacity, sizeof(*fresh));
    if (!fresh)
        return -1;
    for (size_t i = 0; i < t->capacity; i++)
        if (t->slots[i].item)
            place(fresh, new_capacity, t->slots[i]);
    free(t->slots);
    t->slots = fresh;
    t->capacity = new_capacity;
    return 0;
}

int lmc_key_table_insert(lmc_key_table *t, void *item)
{
    if ((t->count + 1) * 4 > t->capacity * 3 && grow(t) != 0)
        return -1;
    lmc_key_slot s = {key_hash(item_key(t, item)), item};
    place(t->slots, t->capacity, s);
    t->count++;
    return 0;
}

/* Backward-shift deletion: pull later members of the probe run into the
 * hole so that lookups never stop early at it. */
void *lmc_key_table_remove(lmc_key_table *t, const lmc_object_key *key)
{
    size_t mask = t->capacity - 1;
    size_t hole = find_slot(t, key, key_hash(key));
    void *item = t->slots[hole].item;
    if (!item)
        return NULL;
    for (size_t j = (hole + 1) & mask; t->slots[j].item; j = (j + 1) & mask) {
        size_t home = t->slots[j].hash & mask;
        /* j may move to `hole` only if its home is not in (hole, j]. */
        size_t dist_home = (j - home) & mask;
        size_t dist_hole = (j - hole) & mask;
        if (dist_home >= dist_hole) {
            t->slots[hole] = t->slots[j];
            hole = j;
        }
    }
    t->slots[hole].item = NULL;
    t->slots[hole].hash = 0;
    t->count--;
    return item;
}
