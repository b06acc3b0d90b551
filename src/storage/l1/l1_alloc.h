/* L1 address manager (docs/storage.md, "Allocator (`lmc_l1_alloc`)"): hands
 * out arena-relative byte ranges.
 *
 * Free blocks are kept in an array sorted by offset; allocation is first
 * fit with splitting, freeing coalesces with both neighbours, and every size
 * is rounded up to the alignment.  The "heap" is the committed prefix of the
 * arena: lmc_l1_alloc_sbrk() grows it (lazy L1), and usage is measured
 * against it.
 *
 * Caller-locked: the allocator has no mutex of its own.  Inside lmcached it
 * is owned by one L1 manager and only touched under that manager's mutex.
 * Every operation is O(number of free blocks). */
#ifndef LMC_STORAGE_L1_L1_ALLOC_H
#define LMC_STORAGE_L1_L1_ALLOC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct lmc_l1_alloc lmc_l1_alloc;

typedef struct lmc_l1_range {
    uint64_t offset;
    uint64_t size;
} lmc_l1_range;

/* `align` must be a power of two; `initial_heap` is rounded down to it.
 * NULL on bad arguments or allocation failure. */
lmc_l1_alloc *lmc_l1_alloc_new(uint64_t align, uint64_t initial_heap);
void lmc_l1_alloc_destroy(lmc_l1_alloc *a);

/* (raw + align - 1) & ~(align - 1); 0 for raw 0 or on overflow. */
uint64_t lmc_l1_alloc_aligned_size(const lmc_l1_alloc *a, uint64_t raw);

/* First fit.  0 and *out = (offset, aligned size), or -1 when raw is 0 or
 * no free block is large enough. */
int lmc_l1_alloc_allocate(lmc_l1_alloc *a, uint64_t raw, lmc_l1_range *out);

/* `count` units of aligned(raw) bytes each, carved from the free blocks in
 * address order.  All-or-nothing: on -1 the free list is unchanged.
 * On 0, offsets[0..count) are filled and *unit_size is the aligned size. */
int lmc_l1_alloc_batch(lmc_l1_alloc *a, uint64_t raw, size_t count, uint64_t *offsets,
                       uint64_t *unit_size);

/* Returns a range obtained from allocate/batch (size = the aligned size).
 * -1 if it is misaligned, outside the heap or overlaps a free block (a
 * double free); the free list is unchanged then. */
int lmc_l1_alloc_release(lmc_l1_alloc *a, uint64_t offset, uint64_t size);

/* Returns many ranges at once in O(F + n log n) (F = free blocks), instead
 * of n single releases at O(F) each: sorts `ranges` in place, then merges
 * them into the free list.  All-or-nothing: -1 (nothing changed) if any
 * range is invalid or overlaps another or a free block, or on allocation
 * failure. */
int lmc_l1_alloc_release_batch(lmc_l1_alloc *a, lmc_l1_range *ranges, size_t n);

/* Appends [heap, heap + n) to the heap (n rounded down to the alignment)
 * and merges it with a free tail block.  Returns the new heap size; the
 * heap is unchanged if recording the block fails. */
uint64_t lmc_l1_alloc_sbrk(lmc_l1_alloc *a, uint64_t n);

uint64_t lmc_l1_alloc_heap_size(const lmc_l1_alloc *a);
uint64_t lmc_l1_alloc_free_size(const lmc_l1_alloc *a);
uint64_t lmc_l1_alloc_allocated_size(const lmc_l1_alloc *a);
uint64_t lmc_l1_alloc_align(const lmc_l1_alloc *a);

/* Free list inspection (tests, diagnostics). */
size_t lmc_l1_alloc_free_block_count(const lmc_l1_alloc *a);
lmc_l1_range lmc_l1_alloc_free_block(const lmc_l1_alloc *a, size_t index);

/* free + allocated == heap, blocks sorted, inside the heap, aligned,
 * non-empty and no two of them adjacent (they would have been merged). */
bool lmc_l1_alloc_memcheck(const lmc_l1_alloc *a);

#endif
