/* Open-addressing hash table of items that embed an lmc_object_key.
 *
 * The table stores pointers to caller-owned items; `key_offset` says where
 * the key lives inside an item (offsetof(item_type, key)).  Linear probing
 * with backward-shift deletion (no tombstones), load factor <= 3/4.
 *
 * A slot is the item pointer plus the low 32 bits of its key's hash, kept
 * in two parallel arrays, 12 bytes a slot where a {hash, pointer} struct is
 * padded to 16: the L1 holds millions of small objects and pays for its
 * slots per object (docs/storage.md, "Metadata per object").  32 bits still
 * both place an item (the capacity is a power of two far below 2^32) and
 * turn away almost every foreign item on a probe without touching it, and
 * a probe run reads 16 hashes per cache line.  Both arrays stay naturally
 * aligned, so a leak checker scanning for pointers still sees every item.
 *
 * Not thread-safe: the owner serializes access (the L1 manager under its
 * mutex, the LRU policy under its own). */
#ifndef LMC_STORAGE_KEY_TABLE_H
#define LMC_STORAGE_KEY_TABLE_H

#include <stddef.h>
#include <stdint.h>

#include "storage/object_key.h"

typedef struct lmc_key_table {
    void **items;        /* NULL = empty slot; one allocation with hashes */
    uint32_t *hashes;    /* low 32 bits of lmc_object_key_hash() per slot */
    size_t capacity;     /* power of two */
    size_t count;
    size_t key_offset;
} lmc_key_table;

/* Returns 0, or -1 on allocation failure. */
int lmc_key_table_init(lmc_key_table *t, size_t key_offset, size_t initial_capacity);
/* Frees the slot array only; items stay owned by the caller. */
void lmc_key_table_destroy(lmc_key_table *t);

void *lmc_key_table_find(const lmc_key_table *t, const lmc_object_key *key);
/* The item's key must not be in the table yet.  0, or -1 when growing the
 * table failed (the table is unchanged then). */
int lmc_key_table_insert(lmc_key_table *t, void *item);
/* Removes and returns the item with `key`, or NULL if absent. */
void *lmc_key_table_remove(lmc_key_table *t, const lmc_object_key *key);

/* Bytes of the slot arrays (benchmarks, diagnostics). */
size_t lmc_key_table_memory(const lmc_key_table *t);

/* Iteration: item in slot `i` (0 <= i < capacity) or NULL.  Removing items
 * while iterating may move later items to earlier slots, so collect first. */
static inline void *lmc_key_table_slot_item(const lmc_key_table *t, size_t i)
{
    return t->items[i];
}

#endif
