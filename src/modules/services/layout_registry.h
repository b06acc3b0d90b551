/* Layout registry: what one stored chunk object of (model_name, world_size)
 * looks like.  The transfer modules register a layout when a worker
 * registers and drop their reference when it leaves; LOOKUP needs one to
 * know how many object groups a chunk has (none registered = no hits).
 * Thread-safe; one mutex, never held while calling out. */
#ifndef LMC_MODULES_SERVICES_LAYOUT_REGISTRY_H
#define LMC_MODULES_SERVICES_LAYOUT_REGISTRY_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define LMC_LAYOUT_MAX_DIMS 4
#define LMC_LAYOUT_DTYPE_MAX 32
#define LMC_LAYOUT_MAX_GROUPS 8

typedef struct {
    uint64_t object_size;           /* bytes = prod(shape) * itemsize */
    uint32_t ndim;
    uint64_t shape[LMC_LAYOUT_MAX_DIMS];
    char dtype[LMC_LAYOUT_DTYPE_MAX];   /* torch name, e.g. "float16" */
    uint32_t num_layers;
    uint32_t hidden_dim;
    bool use_mla;
    uint32_t num_groups;            /* object groups per chunk */
    /* Per object group (entries past num_groups are zero): its objects'
     * bytes, and how many trailing chunks of a prefix it needs (-1: all;
     * a sliding-window group, docs/protocol.md "Kernel groups and object
     * groups").  The fields above describe group 0. */
    uint64_t group_sizes[LMC_LAYOUT_MAX_GROUPS];
    int32_t chunks_in_sw[LMC_LAYOUT_MAX_GROUPS];
} lmc_layout;

typedef struct lmc_layout_registry lmc_layout_registry;

lmc_layout_registry *lmc_layout_registry_new(void);
void lmc_layout_registry_free(lmc_layout_registry *r);

/* Item size of a torch dtype name (float16/bfloat16 2, float32 4,
 * float8_* / uint8 / int8 1), 0 when unsupported. */
uint32_t lmc_dtype_itemsize(const char *dtype, size_t len);
/* Fills `out` for a single-group engine-driven layout.  0, or -1 with a
 * reason when the dtype is unsupported or a dimension is zero. */
int lmc_layout_build(lmc_layout *out, uint32_t chunk_size, uint32_t num_layers,
                     uint32_t hidden_dim, const char *dtype, size_t dtype_len, bool use_mla,
                     char *err, size_t errlen);

/* The layout of a chunk of several object groups, or of one group that
 * the single-group form does not describe (`plain` false): group 0's first
 * entry [kv_size, num_layers, slots, row] stands for the shape, and every
 * group has its size and window.  Both transfer paths build their layouts
 * here, so that their registrations of one model agree and share objects
 * (docs/protocol.md, "Engine-driven multi-group layouts").  `plain`: the
 * single-group form of lmc_layout_build (one group, one entry, slots ==
 * chunk size).  0, or -1 with a reason. */
int lmc_layout_for_groups(lmc_layout *out, uint32_t chunk_size, bool plain, uint32_t kv_size,
                          uint32_t num_layers, uint32_t slots, uint32_t row, const char *dtype,
                          uint32_t n_groups, const uint64_t *group_sizes,
                          const int32_t *chunks_in_sw, char *err, size_t errlen);

/* Adds a reference to (model, world_size) -> layout.  A second registration
 * must describe the same layout: -1 (conflict) otherwise.  0 on success. */
int lmc_layout_registry_acquire(lmc_layout_registry *r, const char *model, uint32_t world_size,
                                const lmc_layout *layout);
/* Drops one reference; the entry goes away at zero. */
void lmc_layout_registry_release(lmc_layout_registry *r, const char *model, uint32_t world_size);
bool lmc_layout_registry_get(lmc_layout_registry *r, const char *model, size_t model_len,
                             uint32_t world_size, lmc_layout *out);
/* The first registration of `model`, whatever its world size (HTTP KV
 * endpoints name only the model). */
bool lmc_layout_registry_find_model(lmc_layout_registry *r, const char *model, size_t len,
                                    uint32_t *world_size, lmc_layout *out);
size_t lmc_layout_registry_count(lmc_layout_registry *r);
/* [{model_name, world_size, object_size, shape, dtype, use_mla, refcount}]:
 * a new reference, or NULL on allocation failure (never a partial list). */
json_t *lmc_layout_registry_to_json(lmc_layout_registry *r);

#endif
