#include "modules/transfer/instance_registry.h"

#include <stdlib.h>

#include "obs/log.h"

/* The reaper's snapshot of the ids (modules/services/reaper.h). */
static size_t list_ids(void *user, int64_t *ids, size_t cap)
{
    lmc_transfer_registry *r = user;
    pthread_mutex_lock(&r->lock);
    size_t n = r->n;
    for (size_t i = 0; i < n && i < cap; i++)
        ids[i] = r->items[i].instance_id;
    pthread_mutex_unlock(&r->lock);
    return n;
}

static void reap_one(void *user, int64_t id)
{
    lmc_transfer_registry *r = user;
    if (lmc_transfer_registry_drop(r, id)) {
        atomic_fetch_add(&r->reaped, 1);
        LMC_WARN("reaped %s instance %lld (silent too long)", r->ops.mode, (long long)id);
    }
}

int lmc_transfer_registry_init(lmc_transfer_registry *r, const lmc_transfer_registry_ops *ops,
                               lmc_liveness *lv, double reap_timeout_s, double grace_s)
{
    r->items = NULL;
    r->n = r->cap = 0;
    r->ops = *ops;
    atomic_init(&r->reaped, 0);
    pthread_mutex_init(&r->lock, NULL);
    lmc_reaper_options ro = {.liveness = lv, .list = list_ids, .reap = reap_one, .user = r,
                             .start_thread = true};
    lmc_reaper_set_timeouts(&ro, reap_timeout_s, grace_s);
    r->reap_timeout_ms = ro.timeout_ms;
    r->reaper = lmc_reaper_new(&ro);
    if (!r->reaper) {
        pthread_mutex_destroy(&r->lock);
        return -1;
    }
    return 0;
}

void lmc_transfer_registry_stop(lmc_transfer_registry *r)
{
    lmc_reaper_free(r->reaper);
    r->reaper = NULL;
}

void *lmc_transfer_registry_pop(lmc_transfer_registry *r)
{
    return r->n ? r->items[--r->n].ctx : NULL;
}

void lmc_transfer_registry_destroy(lmc_transfer_registry *r)
{
    free(r->items);
    r->items = NULL;
    pthread_mutex_destroy(&r->lock);
}

void *lmc_transfer_registry_find_locked(const lmc_transfer_registry *r, int64_t id)
{
    for (size_t i = 0; i < r->n; i++) {
        if (r->items[i].instance_id == id)
            return r->items[i].ctx;
    }
    return NULL;
}

bool lmc_transfer_registry_has(lmc_transfer_registry *r, int64_t id)
{
    pthread_mutex_lock(&r->lock);
    bool known = lmc_transfer_registry_find_locked(r, id) != NULL;
    pthread_mutex_unlock(&r->lock);
    return known;
}

int lmc_transfer_registry_add(lmc_transfer_registry *r, int64_t id, void *ctx)
{
    int rc = 0;
    pthread_mutex_lock(&r->lock);
    if (r->n == r->cap) {
        size_t cap = r->cap ? r->cap * 2 : 8;
        lmc_transfer_instance *grown = realloc(r->items, cap * sizeof *grown);
        if (grown) {
            r->items = grown;
            r->cap = cap;
        } else {
            rc = -1;
        }
    }
    if (rc == 0)
        r->items[r->n++] = (lmc_transfer_instance){.instance_id = id, .ctx = ctx};
    pthread_mutex_unlock(&r->lock);
    return rc;
}

bool lmc_transfer_registry_drop(lmc_transfer_registry *r, int64_t id)
{
    void *ctx = NULL;
    pthread_mutex_lock(&r->lock);
    for (size_t i = 0; i < r->n && !ctx; i++) {
        if (r->items[i].instance_id == id) {
            ctx = r->items[i].ctx;
            r->items[i] = r->items[--r->n];
        }
    }
    pthread_mutex_unlock(&r->lock);
    if (!ctx)
        return false;
    r->ops.drop(r->ops.user, ctx, id);
    return true;
}
