/* The read locks a unified lookup found for its matches, kept on the
 * request's session for the retrieves (docs/cacheblend.md, "Read locks"):
 * every share is given back exactly once, by a retrieve that consumed it
 * or by the stash when it goes. */
#include <stdlib.h>
#include <string.h>

#include "modules/blend/serve/blend_serve.h"
#include "storage/storage_manager.h"

static void entry_release(cb_stash *s, cb_stash_entry *e)
{
    lmc_storage_manager_give_back(s->storage, e->keys, e->leases, s->ranks);
    lmc_keys_drop(e->keys, s->ranks);
    free(e->keys);
    free(e->leases);
}

static void stash_ext_release(lmc_session_ext *ext)
{
    lmc_blend_serve_stash_release((cb_stash *)ext);
}

cb_stash *lmc_blend_serve_stash_new(lmc_storage_manager *sm, uint32_t ranks, size_t cap)
{
    cb_stash *s = calloc(1, sizeof *s);
    if (!s || !(s->e = calloc(cap ? cap : 1, sizeof *s->e))) {
        free(s);
        return NULL;
    }
    s->ext.release = stash_ext_release;
    s->storage = sm;
    s->ranks = ranks;
    return s;
}

void lmc_blend_serve_stash_release(cb_stash *s)
{
    if (!s)
        return;
    for (size_t i = 0; i < s->n; i++)
        entry_release(s, &s->e[i]);
    free(s->e);
    free(s);
}

cb_stash_entry *lmc_blend_serve_stash_find(cb_stash *s, const uint8_t *hash)
{
    for (size_t i = 0; s && i < s->n; i++)
        if (memcmp(s->e[i].hash, hash, LMC_BLEND_HASH_BYTES) == 0)
            return &s->e[i];
    return NULL;
}

size_t lmc_blend_serve_stash_release_others(cb_stash *s, const uint8_t *hashes, size_t n)
{
    size_t w = 0, released = 0;
    for (size_t i = 0; i < s->n; i++) {
        bool kept = false;
        for (size_t j = 0; !kept && j < n; j++)
            kept = memcmp(s->e[i].hash, hashes + j * LMC_BLEND_HASH_BYTES,
                          LMC_BLEND_HASH_BYTES) == 0;
        if (kept) {
            s->e[w++] = s->e[i];
        } else {
            entry_release(s, &s->e[i]);
            released++;
        }
    }
    s->n = w;
    return released;
}
