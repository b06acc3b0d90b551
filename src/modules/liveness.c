#include "modules/liveness.h"

#include <pthread.h>
#include <stdlib.h>

/* Tens of workers per node at most: a flat array beats a hash table here. */
struct lmc_liveness {
    pthread_mutex_t lock;
    lmc_liveness_entry *entries;
    size_t count, cap;
};

lmc_liveness *lmc_liveness_new(void)
{
    lmc_liveness *lv = calloc(1, sizeof *lv);
    if (lv)
        pthread_mutex_init(&lv->lock, NULL);
    return lv;
}

void lmc_liveness_free(lmc_liveness *lv)
{
    if (!lv)
        return;
    pthread_mutex_destroy(&lv->lock);
    free(lv->entries);
    free(lv);
}

static lmc_liveness_entry *find_locked(lmc_liveness *lv, int64_t id)
{
    for (size_t i = 0; i < lv->count; i++) {
        if (lv->entries[i].instance_id == id)
            return &lv->entries[i];
    }
    return NULL;
}

int lmc_liveness_touch(lmc_liveness *lv, int64_t instance_id, int64_t now_ms, bool ping)
{
    int rc = 0;
    pthread_mutex_lock(&lv->lock);
    lmc_liveness_entry *e = find_locked(lv, instance_id);
    if (!e) {
        if (lv->count == lv->cap) {
            size_t cap = lv->cap ? lv->cap * 2 : 16;
            lmc_liveness_entry *grown = realloc(lv->entries, cap * sizeof *grown);
            if (!grown) {
                rc = -1;
                goto out;
            }
            lv->entries = grown;
            lv->cap = cap;
        }
        e = &lv->entries[lv->count++];
        *e = (lmc_liveness_entry){.instance_id = instance_id};
    }
    e->last_seen_ms = now_ms;
    e->pinged = e->pinged || ping;
out:
    pthread_mutex_unlock(&lv->lock);
    return rc;
}

bool lmc_liveness_get(lmc_liveness *lv, int64_t instance_id, lmc_liveness_entry *out)
{
    pthread_mutex_lock(&lv->lock);
    lmc_liveness_entry *e = find_locked(lv, instance_id);
    if (e)
        *out = *e;
    pthread_mutex_unlock(&lv->lock);
    return e != NULL;
}

void lmc_liveness_forget(lmc_liveness *lv, int64_t instance_id)
{
    pthread_mutex_lock(&lv->lock);
    lmc_liveness_entry *e = find_locked(lv, instance_id);
    if (e)
        *e = lv->entries[--lv->count];
    pthread_mutex_unlock(&lv->lock);
}

size_t lmc_liveness_count(lmc_liveness *lv)
{
    pthread_mutex_lock(&lv->lock);
    size_t n = lv->count;
    pthread_mutex_unlock(&lv->lock);
    return n;
}
