/* Adapter-level views that need no worker: key listing pages and status. */
#include "storage/l2/l2_adapter.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int by_name(const void *a, const void *b)
{
    const char *x = json_string_value(json_object_get(*(json_t *const *)a, "name"));
    const char *y = json_string_value(json_object_get(*(json_t *const *)b, "name"));
    return strcmp(x ? x : "", y ? y : "");
}

/* The page after `cursor` (a canonical key string) of entries sorted by name;
 * the name is an internal field and is dropped from the output. */
static json_t *page_of(json_t *all, size_t page_size, const char *cursor)
{
    size_t n = json_array_size(all);
    json_t **v = malloc((n ? n : 1) * sizeof *v);
    json_t *entries = json_array();
    if (!v || !entries) {
        free(v);
        json_decref(entries);
        return NULL;
    }
    for (size_t i = 0; i < n; i++)
        v[i] = json_array_get(all, i);
    qsort(v, n, sizeof *v, by_name);
    const char *last = NULL;
    bool more = false;
    for (size_t i = 0; i < n; i++) {
        const char *name = json_string_value(json_object_get(v[i], "name"));
        if (cursor && strcmp(name, cursor) <= 0)
            continue;
        if (json_array_size(entries) == page_size) {
            more = true;
            break;
        }
        json_array_append_new(entries, json_pack("{s:O, s:O}", "key",
                                                 json_object_get(v[i], "key"), "size_bytes",
                                                 json_object_get(v[i], "size_bytes")));
        last = name;
    }
    json_t *page = json_pack("{s:o, s:o}", "entries", entries, "next_page_token",
                             more && last ? json_string(last) : json_null());
    free(v);
    return page;
}

json_t *lmc_l2_adapter_list_keys(lmc_l2_adapter *a, const char *model, size_t page_size,
                                 const char *cursor)
{
    lmc_l2_backend *be = lmc_l2_adapter_backend(a);
    json_t *all = json_array();
    if (!all)
        return NULL;
    be->ops->list(be, model, all);
    json_t *page = page_of(all, page_size ? page_size : 500, cursor);
    json_decref(all);
    return page;
}
