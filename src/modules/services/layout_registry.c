#include "modules/services/layout_registry.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/grow.h"

/* A handful of models per server: a flat array is enough. */
typedef struct {
    char *model;
    uint32_t world_size;
    lmc_layout layout;
    uint32_t refcount;
} entry;

struct lmc_layout_registry {
    pthread_mutex_t lock;
    entry *entries;
    size_t count, cap;
};

lmc_layout_registry *lmc_layout_registry_new(void)
{
    lmc_layout_registry *r = calloc(1, sizeof *r);
    if (r)
        pthread_mutex_init(&r->lock, NULL);
    return r;
}

void lmc_layout_registry_free(lmc_layout_registry *r)
{
    if (!r)
        return;
    for (size_t i = 0; i < r->count; i++)
        free(r->entries[i].model);
    free(r->entries);
    pthread_mutex_destroy(&r->lock);
    free(r);
}

uint32_t lmc_dtype_itemsize(const char *d, size_t len)
{
    static const struct { const char *name; uint32_t size; } table[] = {
        {"float16", 2}, {"bfloat16", 2}, {"half", 2}, {"float32", 4}, {"float", 4},
        {"uint8", 1}, {"int8", 1}, {"float8_e4m3fn", 1}, {"float8_e5m2", 1},
        {"float8_e4m3fnuz", 1}, {"float8_e5m2fnuz", 1},
    };
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
        if (strlen(table[i].name) == len && memcmp(table[i].name, d, len) == 0)
            return table[i].size;
    }
    return 0;
}

int lmc_layout_build(lmc_layout *out, uint32_t cs, uint32_t num_layers, uint32_t hidden_dim,
                     const char *dtype, size_t dtype_len, bool use_mla, char *err, size_t errlen)
{
    uint32_t item = lmc_dtype_itemsize(dtype, dtype_len);
    if (item == 0 || dtype_len >= LMC_LAYOUT_DTYPE_MAX) {
        snprintf(err, errlen, "unsupported dtype '%.*s'", (int)(dtype_len < 64 ? dtype_len : 64),
                 dtype);
        return -1;
    }
    if (cs == 0 || num_layers == 0 || hidden_dim == 0) {
        snprintf(err, errlen, "num_layers and hidden_dim_size must be > 0");
        return -1;
    }
    *out = (lmc_layout){.num_layers = num_layers, .hidden_dim = hidden_dim,
                        .use_mla = use_mla, .num_groups = 1};
    memcpy(out->dtype, dtype, dtype_len);
    uint32_t d = 0;
    if (!use_mla)
        out->shape[d++] = 2;   /* K and V */
    out->shape[d++] = num_layers;
    out->shape[d++] = cs;
    out->shape[d++] = hidden_dim;
    out->ndim = d;
    out->object_size = item;
    for (uint32_t i = 0; i < d; i++)
        out->object_size *= out->shape[i];
    out->group_sizes[0] = out->object_size;
    out->chunks_in_sw[0] = -1;
    return 0;
}

int lmc_layout_for_groups(lmc_layout *out, uint32_t cs, bool plain, uint32_t kv_size,
                          uint32_t nl, uint32_t slots, uint32_t row, const char *dtype,
                          uint32_t n_groups, const uint64_t *sizes, const int32_t *sw, char *err,
                          size_t errlen)
{
    if (n_groups == 0 || n_groups > LMC_LAYOUT_MAX_GROUPS)
        return snprintf(err, errlen, "%u object groups (1..%d)", n_groups,
                        LMC_LAYOUT_MAX_GROUPS), -1;
    if (!plain || lmc_layout_build(out, cs, nl, row, dtype, strlen(dtype), kv_size == 1, err,
                                   errlen) != 0) {
        if (strlen(dtype) >= LMC_LAYOUT_DTYPE_MAX)
            return snprintf(err, errlen, "unsupported dtype"), -1;
        *out = (lmc_layout){.object_size = sizes[0], .ndim = 4,
                            .shape = {kv_size, nl, slots, row}, .num_layers = nl,
                            .hidden_dim = row, .use_mla = kv_size == 1};
        memcpy(out->dtype, dtype, strlen(dtype) + 1);
    }
    out->num_groups = n_groups;
    for (uint32_t i = 0; i < n_groups; i++) {
        out->group_sizes[i] = sizes[i];
        out->chunks_in_sw[i] = sw[i];
    }
    return 0;
}

static entry *find_locked(lmc_layout_registry *r, const char *model, size_t len, uint32_t ws)
{
    for (size_t i = 0; i < r->count; i++) {
        entry *e = &r->entries[i];
        if (e->world_size == ws && strlen(e->model) == len && memcmp(e->model, model, len) == 0)
            return e;
    }
    return NULL;
}

static bool same_layout(const lmc_layout *a, const lmc_layout *b)
{
    return a->object_size == b->object_size && a->ndim == b->ndim &&
           memcmp(a->shape, b->shape, sizeof a->shape) == 0 && strcmp(a->dtype, b->dtype) == 0 &&
           a->use_mla == b->use_mla && a->num_groups == b->num_groups &&
           memcmp(a->group_sizes, b->group_sizes, sizeof a->group_sizes) == 0 &&
           memcmp(a->chunks_in_sw, b->chunks_in_sw, sizeof a->chunks_in_sw) == 0;
}

static int add_locked(lmc_layout_registry *r, const char *model, uint32_t ws, const lmc_layout *l)
{
    if (lmc_grow_array(&r->entries, &r->cap, r->count + 1, sizeof *r->entries, 4) != 0)
        return -1;
    char *copy = strdup(model);
    if (!copy)
        return -1;
    r->entries[r->count++] = (entry){.model = copy, .world_size = ws, .layout = *l, .refcount = 1};
    return 0;
}

int lmc_layout_registry_acquire(lmc_layout_registry *r, const char *model, uint32_t ws,
                                const lmc_layout *layout)
{
    int rc = 0;
    pthread_mutex_lock(&r->lock);
    entry *e = find_locked(r, model, strlen(model), ws);
    if (e && !same_layout(&e->layout, layout))
        rc = -1;
    else if (e)
        e->refcount++;
    else
        rc = add_locked(r, model, ws, layout);
    pthread_mutex_unlock(&r->lock);
    return rc;
}

void lmc_layout_registry_release(lmc_layout_registry *r, const char *model, uint32_t ws)
{
    pthread_mutex_lock(&r->lock);
    entry *e = find_locked(r, model, strlen(model), ws);
    if (e && --e->refcount == 0) {
        free(e->model);
        *e = r->entries[--r->count];
    }
    pthread_mutex_unlock(&r->lock);
}

bool lmc_layout_registry_get(lmc_layout_registry *r, const char *model, size_t len, uint32_t ws,
                             lmc_layout *out)
{
    pthread_mutex_lock(&r->lock);
    entry *e = find_locked(r, model, len, ws);
    if (e && out)
        *out = e->layout;
    pthread_mutex_unlock(&r->lock);
    return e != NULL;
}

bool lmc_layout_registry_find_model(lmc_layout_registry *r, const char *model, size_t len,
                                    uint32_t *world_size, lmc_layout *out)
{
    bool found = false;
    pthread_mutex_lock(&r->lock);
    for (size_t i = 0; i < r->count && !found; i++) {
        entry *e = &r->entries[i];
        if (strlen(e->model) == len && memcmp(e->model, model, len) == 0) {
            *world_size = e->world_size;
            *out = e->layout;
            found = true;
        }
    }
    pthread_mutex_unlock(&r->lock);
    return found;
}

size_t lmc_layout_registry_count(lmc_layout_registry *r)
{
    pthread_mutex_lock(&r->lock);
    size_t n = r->count;
    pthread_mutex_unlock(&r->lock);
    return n;
}

static json_t *shape_json(const lmc_layout *l)
{
    json_t *a = json_array();
    for (uint32_t i = 0; i < l->ndim; i++)
        json_array_append_new(a, json_integer((json_int_t)l->shape[i]));
    return a;
}

/* [{object_size, chunks_in_sw}] per object group. */
static json_t *groups_json(const lmc_layout *l)
{
    json_t *a = json_array();
    for (uint32_t g = 0; a && g < l->num_groups && g < LMC_LAYOUT_MAX_GROUPS; g++)
        json_array_append_new(a, json_pack("{s:I, s:i}", "object_size",
                                           (json_int_t)l->group_sizes[g], "chunks_in_sw",
                                           (int)l->chunks_in_sw[g]));
    return a;
}

json_t *lmc_layout_registry_to_json(lmc_layout_registry *r)
{
    json_t *arr = json_array();
    pthread_mutex_lock(&r->lock);
    for (size_t i = 0; arr && i < r->count; i++) {
        const entry *e = &r->entries[i];
        json_t *item = json_pack("{s:s, s:i, s:I, s:o, s:s, s:b, s:i, s:o}", "model_name",
                                 e->model, "world_size", (int)e->world_size, "object_size",
                                 (json_int_t)e->layout.object_size, "shape",
                                 shape_json(&e->layout), "dtype", e->layout.dtype, "use_mla",
                                 e->layout.use_mla, "refcount", (int)e->refcount,
                                 "object_groups", groups_json(&e->layout));
        /* A list missing a layout would be read as "not registered". */
        if (json_array_append_new(arr, item) != 0) {
            json_decref(arr);
            arr = NULL;
        }
    }
    pthread_mutex_unlock(&r->lock);
    return arr;
}
