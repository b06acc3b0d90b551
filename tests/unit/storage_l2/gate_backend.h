/* Test backend shared by the storage_l2 tests (issue 18): forwards to an
 * inner backend, but each store and load call waits (at most 2 s) until
 * `want` calls are inside at once, so a test sees whether the adapter runs
 * the parts of one task in parallel (max_inside), and a load of the key
 * whose chunk_hash[0] is fail_hash reports that key missing. */
#ifndef LMC_TEST_GATE_BACKEND_H
#define LMC_TEST_GATE_BACKEND_H

#include <pthread.h>
#include <stdlib.h>
#include <time.h>

#include "storage/l2/l2_adapter.h"

typedef struct gate {
    lmc_l2_backend base;     /* first */
    lmc_l2_backend *inner;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int inside, max_inside, want;
    bool opened;             /* want calls were inside once: no more waiting */
    int fail_hash;           /* -1: none */
} gate;

static void gate_enter(gate *g)
{
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 2;
    pthread_mutex_lock(&g->mu);
    if (++g->inside > g->max_inside)
        g->max_inside = g->inside;
    if (g->inside >= g->want)
        g->opened = true;
    pthread_cond_broadcast(&g->cv);
    while (!g->opened && pthread_cond_timedwait(&g->cv, &g->mu, &until) == 0) {
    }
    pthread_mutex_unlock(&g->mu);
}

static void gate_leave(gate *g)
{
    pthread_mutex_lock(&g->mu);
    g->inside--;
    pthread_mutex_unlock(&g->mu);
}

static int64_t gate_store(lmc_l2_backend *b, const lmc_object_key *keys, uint8_t *const *bufs,
                          const uint64_t *sizes, size_t n)
{
    gate *g = (gate *)b;
    gate_enter(g);
    int64_t r = g->inner->ops->store(g->inner, keys, bufs, sizes, n);
    gate_leave(g);
    return r;
}

static void gate_lookup(lmc_l2_backend *b, const lmc_object_key *keys, const uint64_t *sizes,
                        size_t n, uint8_t *found)
{
    gate *g = (gate *)b;
    g->inner->ops->lookup_and_lock(g->inner, keys, sizes, n, found);
}

static void gate_load(lmc_l2_backend *b, const lmc_object_key *keys, uint8_t *const *bufs,
                      const uint64_t *sizes, size_t n, uint8_t *ok)
{
    gate *g = (gate *)b;
    gate_enter(g);
    g->inner->ops->load(g->inner, keys, bufs, sizes, n, ok);
    for (size_t i = 0; i < n; i++)
        if (keys[i].chunk_hash[0] == g->fail_hash)
            ok[i] = 0;
    gate_leave(g);
}

static void gate_unlock(lmc_l2_backend *b, const lmc_object_key *keys, size_t n)
{
    gate *g = (gate *)b;
    g->inner->ops->unlock(g->inner, keys, n);
}

static size_t gate_remove(lmc_l2_backend *b, const lmc_object_key *keys, size_t n)
{
    gate *g = (gate *)b;
    return g->inner->ops->remove(g->inner, keys, n);
}

static void gate_usage(lmc_l2_backend *b, lmc_l2_usage *u)
{
    gate *g = (gate *)b;
    g->inner->ops->usage(g->inner, u);
}

static void gate_list(lmc_l2_backend *b, const char *model, json_t *entries)
{
    gate *g = (gate *)b;
    g->inner->ops->list(g->inner, model, entries);
}

static json_t *gate_status(lmc_l2_backend *b)
{
    gate *g = (gate *)b;
    return g->inner->ops->status(g->inner);
}

static void gate_destroy(lmc_l2_backend *b)
{
    gate *g = (gate *)b;
    g->inner->ops->destroy(g->inner);
    pthread_cond_destroy(&g->cv);
    pthread_mutex_destroy(&g->mu);
    free(g);
}

static const lmc_l2_backend_ops gate_ops = {
    gate_store, gate_lookup, gate_load, gate_unlock, gate_remove,
    gate_usage, gate_list, gate_status, gate_destroy, NULL, NULL,
};

/* Takes ownership of inner.  The caller keeps *out to read max_inside. */
static lmc_l2_backend *gate_new(lmc_l2_backend *inner, int want, int fail_hash, gate **out)
{
    gate *g = calloc(1, sizeof *g);
    g->base = (lmc_l2_backend){&gate_ops, "gate", inner->split_ops & ~LMC_L2_SPLIT_STORE_BATCH};
    g->inner = inner;
    g->want = want;
    g->fail_hash = fail_hash;
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, NULL);
    *out = g;
    return &g->base;
}

static int gate_max_inside(gate *g)
{
    pthread_mutex_lock(&g->mu);
    int m = g->max_inside;
    pthread_mutex_unlock(&g->mu);
    return m;
}

#endif
