/* Multi-group engine-driven registrations (docs/protocol.md, "Engine-driven
 * multi-group layouts"): a hybrid model (sliding-window layers, groups of
 * different head sizes or block sizes) registers one object group per
 * attention window, each chunk object holding one dense entry per kernel
 * group.  This decodes and checks the registration's object-group fields
 * and says where each entry lies inside an object, which is what the
 * PREPARE_* replies hand the worker.
 *
 * Pure decoding over msgpack objects: unit-tested without a server. */
#ifndef LMC_MODULES_TRANSFER_ENGINE_GROUP_WIRE_H
#define LMC_MODULES_TRANSFER_ENGINE_GROUP_WIRE_H

#include <msgpack.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kv/kv_plan.h"
#include "modules/services/layout_registry.h"

/* One kernel group's dense tensor inside a chunk object. */
typedef struct lmc_engine_driven_entry {
    uint64_t offset;                 /* bytes into the object */
    uint64_t bytes;
    uint32_t ndim;                   /* 4, or 3: a single plane registered without its 1 */
    uint64_t shape[LMC_LAYOUT_MAX_DIMS];
    char dtype[LMC_LAYOUT_DTYPE_MAX];
} lmc_engine_driven_entry;

/* The object groups of one registration; immutable once decoded, shared by
 * the context and the ops in flight through `refs`. */
typedef struct lmc_engine_driven_groups {
    atomic_uint refs;
    uint32_t n_groups;
    /* entries of object group g: entries[first[g] .. first[g + 1]) */
    uint32_t first[LMC_LAYOUT_MAX_GROUPS + 1];
    lmc_engine_driven_entry entries[LMC_KV_MAX_KERNEL_GROUPS];
    int32_t chunks_in_sw[LMC_LAYOUT_MAX_GROUPS];   /* -1: full attention */
} lmc_engine_driven_groups;

/* Whether the payload map carries multi-group fields (a non-empty
 * object_group_layout_shapes, or a transfer_metadata_wire). */
bool lmc_engine_driven_groups_present(const msgpack_object *payload);

/* Decodes and checks the multi-group fields of a registration payload
 * against the server's chunk size; fills *layout (what LOOKUP and the
 * layout registry see).  Returns a new object with one reference, or NULL
 * with the reason in err (refused, or out of memory). */
lmc_engine_driven_groups *lmc_engine_driven_groups_decode(const msgpack_object *payload, uint32_t chunk_size,
                                    lmc_layout *layout, char *err, size_t errlen);

lmc_engine_driven_groups *lmc_engine_driven_groups_ref(lmc_engine_driven_groups *g);
void lmc_engine_driven_groups_unref(lmc_engine_driven_groups *g);

/* The first chunk of `n` that object group g transfers on RETRIEVE: 0 for
 * full attention, the start of its last chunks_in_sw chunks otherwise. */
size_t lmc_engine_driven_groups_window_start(const lmc_engine_driven_groups *g, uint32_t og, size_t n);

#endif
