/* Growing an array by doubling: the one way a list in lmcached grows
 * (docs/architecture.md, "Libraries"), so that no site doubles by hand and
 * gets the overflow or the failure path wrong. */
#ifndef LMC_CORE_GROW_H
#define LMC_CORE_GROW_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Makes room for `needed` items of `item_size` bytes in the array that
 * items_ptr points to (a T **, so that callers pass &list->items as it
 * is), of capacity *cap, growing first to `first_cap` and then by
 * doubling.  0, or -1 with nothing changed. */
static inline int lmc_grow_array(void *items_ptr, size_t *cap, size_t needed, size_t item_size,
                                 size_t first_cap)
{
    if (needed <= *cap)
        return 0;
    size_t grown_cap = *cap ? *cap : first_cap;
    while (grown_cap < needed) {
        if (grown_cap > SIZE_MAX / 2)
            return -1;
        grown_cap *= 2;
    }
    if (grown_cap > SIZE_MAX / item_size)
        return -1;
    void *items;
    memcpy(&items, items_ptr, sizeof items); /* any T * reads as a void * here */
    void *grown = realloc(items, grown_cap * item_size);
    if (!grown)
        return -1;
    memcpy(items_ptr, &grown, sizeof grown);
    *cap = grown_cap;
    return 0;
}

#endif
