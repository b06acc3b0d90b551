#include "storage/l1/l1_alloc.h"

#include <stdlib.h>
#include <string.h>

#include "core/grow.h"

struct lmc_l1_alloc {
    lmc_l1_range *blocks;    /* free blocks, sorted by offset */
    size_t num_blocks;
    size_t cap_blocks;
    uint64_t align;
    uint64_t heap;           /* committed bytes: [0, heap) */
    uint64_t free_bytes;
    uint64_t allocated_bytes;
};

static int ensure_block_capacity(lmc_l1_alloc *a, size_t needed)
{
    void *blocks = a->blocks;
    int rc = lmc_grow_array(&blocks, &a->cap_blocks, needed, sizeof *a->blocks, 16);
    a->blocks = blocks;
    return rc;
}

static void insert_block_at(lmc_l1_alloc *a, size_t i, lmc_l1_range r)
{
    memmove(&a->blocks[i + 1], &a->blocks[i], (a->num_blocks - i) * sizeof(*a->blocks));
    a->blocks[i] = r;
    a->num_blocks++;
}

static void remove_block_at(lmc_l1_alloc *a, size_t i)
{
    memmove(&a->blocks[i], &a->blocks[i + 1], (a->num_blocks - i - 1) * sizeof(*a->blocks));
    a->num_blocks--;
}

lmc_l1_alloc *lmc_l1_alloc_new(uint64_t align, uint64_t initial_heap)
{
    if (align == 0 || (align & (align - 1)) != 0)
        return NULL;
    lmc_l1_alloc *a = calloc(1, sizeof(*a));
    if (!a)
        return NULL;
    a->align = align;
    if (ensure_block_capacity(a, 16) != 0) {
        free(a);
        return NULL;
    }
    lmc_l1_alloc_sbrk(a, initial_heap);
    return a;
}

void lmc_l1_alloc_destroy(lmc_l1_alloc *a)
{
    if (!a)
        return;
    free(a->blocks);
    free(a);
}

uint64_t lmc_l1_alloc_aligned_size(const lmc_l1_alloc *a, uint64_t raw)
{
    if (raw == 0 || raw > UINT64_MAX - (a->align - 1))
        return 0;
    return (raw + a->align - 1) & ~(a->align - 1);
}

int lmc_l1_alloc_allocate(lmc_l1_alloc *a, uint64_t raw, lmc_l1_range *out)
{
    uint64_t size = lmc_l1_alloc_aligned_size(a, raw);
    if (size == 0)
        return -1;
    for (size_t i = 0; i < a->num_blocks; i++) {
        lmc_l1_range *b = &a->blocks[i];
        if (b->size < size)
            continue;
        out->offset = b->offset;
        out->size = size;
        b->offset += size;
        b->size -= size;
        if (b->size == 0)
            remove_block_at(a, i);
        a->free_bytes -= size;
        a->allocated_bytes += size;
        return 0;
    }
    return -1;
}

static bool batch_fits(const lmc_l1_alloc *a, uint64_t unit, size_t count)
{
    size_t found = 0;
    for (size_t i = 0; i < a->num_blocks && found < count; i++) {
        uint64_t fit = a->blocks[i].size / unit;
        found += fit > count - found ? count - found : (size_t)fit;
    }
    return found >= count;
}

int lmc_l1_alloc_batch(lmc_l1_alloc *a, uint64_t raw, size_t count, uint64_t *offsets,
                       uint64_t *unit_size)
{
    uint64_t unit = lmc_l1_alloc_aligned_size(a, raw);
    if (unit == 0 || count == 0 || !batch_fits(a, unit, count))
        return -1;
    size_t done = 0, kept = 0;
    for (size_t i = 0; i < a->num_blocks; i++) {
        lmc_l1_range b = a->blocks[i];
        while (done < count && b.size >= unit) {
            offsets[done++] = b.offset;
            b.offset += unit;
            b.size -= unit;
        }
        if (b.size > 0)
            a->blocks[kept++] = b;
    }
    a->num_blocks = kept;
    a->free_bytes -= unit * count;
    a->allocated_bytes += unit * count;
    *unit_size = unit;
    return 0;
}

/* Index of the first free block whose offset is >= `offset`. */
static size_t lower_bound(const lmc_l1_alloc *a, uint64_t offset)
{
    size_t lo = 0, hi = a->num_blocks;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (a->blocks[mid].offset < offset)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static bool release_is_valid(const lmc_l1_alloc *a, uint64_t offset, uint64_t size, size_t i)
{
    if (size == 0 || (offset | size) & (a->align - 1))
        return false;
    if (offset > a->heap || size > a->heap - offset || size > a->allocated_bytes)
        return false;
    if (i > 0) {
        const lmc_l1_range *prev = &a->blocks[i - 1];
        if (prev->offset + prev->size > offset)
            return false;
    }
    return i == a->num_blocks || offset + size <= a->blocks[i].offset;
}

int lmc_l1_alloc_release(lmc_l1_alloc *a, uint64_t offset, uint64_t size)
{
    size_t i = lower_bound(a, offset);
    if (!release_is_valid(a, offset, size, i))
        return -1;
    bool joins_prev = i > 0 && a->blocks[i - 1].offset + a->blocks[i - 1].size == offset;
    bool joins_next = i < a->num_blocks && offset + size == a->blocks[i].offset;
    if (joins_prev && joins_next) {
        a->blocks[i - 1].size += size + a->blocks[i].size;
        remove_block_at(a, i);
    } else if (joins_prev) {
        a->blocks[i - 1].size += size;
    } else if (joins_next) {
        a->blocks[i].offset = offset;
        a->blocks[i].size += size;
    } else {
        if (ensure_block_capacity(a, a->num_blocks + 1) != 0)
            return -1;
        insert_block_at(a, i, (lmc_l1_range){offset, size});
    }
    a->free_bytes += size;
    a->allocated_bytes -= size;
    return 0;
}

uint64_t lmc_l1_alloc_sbrk(lmc_l1_alloc *a, uint64_t n)
{
    n &= ~(a->align - 1);
    if (n == 0 || n > UINT64_MAX - a->heap)
        return a->heap;
    lmc_l1_range *tail = a->num_blocks ? &a->blocks[a->num_blocks - 1] : NULL;
    if (tail && tail->offset + tail->size == a->heap) {
        tail->size += n;
    } else {
        if (ensure_block_capacity(a, a->num_blocks + 1) != 0)
            return a->heap;
        a->blocks[a->num_blocks++] = (lmc_l1_range){a->heap, n};
    }
    a->heap += n;
    a->free_bytes += n;
    return a->heap;
}

uint64_t lmc_l1_alloc_heap_size(const lmc_l1_alloc *a) { return a->heap; }
uint64_t lmc_l1_alloc_free_size(const lmc_l1_alloc *a) { return a->free_bytes; }
uint64_t lmc_l1_alloc_allocated_size(const lmc_l1_alloc *a) { return a->allocated_bytes; }
uint64_t lmc_l1_alloc_align(const lmc_l1_alloc *a) { return a->align; }
size_t lmc_l1_alloc_free_block_count(const lmc_l1_alloc *a) { return a->num_blocks; }

lmc_l1_range lmc_l1_alloc_free_block(const lmc_l1_alloc *a, size_t index)
{
    return index < a->num_blocks ? a->blocks[index] : (lmc_l1_range){0, 0};
}

bool lmc_l1_alloc_memcheck(const lmc_l1_alloc *a)
{
    uint64_t sum = 0, end_of_prev = 0;
    for (size_t i = 0; i < a->num_blocks; i++) {
        const lmc_l1_range *b = &a->blocks[i];
        if (b->size == 0 || ((b->offset | b->size) & (a->align - 1)))
            return false;
        if (i > 0 && b->offset <= end_of_prev)   /* overlap or mergeable */
            return false;
        if (b->offset > a->heap || b->size > a->heap - b->offset)
            return false;
        end_of_prev = b->offset + b->size;
        sum += b->size;
    }
    return sum == a->free_bytes && sum + a->allocated_bytes == a->heap;
}

static int compare_ranges(const void *x, const void *y)
{
    const lmc_l1_range *a = x, *b = y;
    return a->offset < b->offset ? -1 : a->offset > b->offset;
}

/* Appends `r` to the merged list, coalescing with the last block; false if
 * it overlaps the last block. */
static bool append_merged(lmc_l1_range *out, size_t *n, lmc_l1_range r)
{
    if (*n > 0) {
        lmc_l1_range *last = &out[*n - 1];
        if (last->offset + last->size > r.offset)
            return false;
        if (last->offset + last->size == r.offset) {
            last->size += r.size;
            return true;
        }
    }
    out[(*n)++] = r;
    return true;
}

static bool ranges_are_valid(const lmc_l1_alloc *a, const lmc_l1_range *ranges, size_t n)
{
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++) {
        const lmc_l1_range *r = &ranges[i];
        if (r->size == 0 || ((r->offset | r->size) & (a->align - 1)) ||
            r->offset > a->heap || r->size > a->heap - r->offset)
            return false;
        total += r->size;
    }
    return total <= a->allocated_bytes;
}

int lmc_l1_alloc_release_batch(lmc_l1_alloc *a, lmc_l1_range *ranges, size_t n)
{
    if (n == 0)
        return 0;
    qsort(ranges, n, sizeof(*ranges), compare_ranges);
    if (!ranges_are_valid(a, ranges, n))
        return -1;
    size_t cap = a->num_blocks + n;
    lmc_l1_range *merged = malloc(cap * sizeof(*merged));
    if (!merged)
        return -1;
    size_t i = 0, j = 0, count = 0;
    uint64_t released = 0;
    while (i < a->num_blocks || j < n) {
        bool take_free = j == n || (i < a->num_blocks && a->blocks[i].offset < ranges[j].offset);
        lmc_l1_range r = take_free ? a->blocks[i++] : ranges[j++];
        released += take_free ? 0 : r.size;
        if (!append_merged(merged, &count, r)) {
            free(merged);
            return -1;
        }
    }
    free(a->blocks);
    a->blocks = merged;
    a->num_blocks = count;
    a->cap_blocks = cap;
    a->free_bytes += released;
    a->allocated_bytes -= released;
    return 0;
}
