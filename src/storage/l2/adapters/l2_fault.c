/* "fault_inject" backend: forwards to an inner backend but fails or delays a
 * seeded, reproducible fraction of calls (tests of the controllers' failure
 * paths).  A failed call does not reach the inner backend, so it leaves no
 * locks or partial objects behind. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "storage/l2/l2_adapter.h"

typedef struct fault {
    lmc_l2_backend base;     /* first */
    lmc_l2_backend *inner;
    lmc_l2_fault_options o;
    pthread_mutex_t mu;      /* guards rng and counters */
    uint64_t rng;
    uint64_t calls, failed, delayed;
} fault;

/* splitmix64: tiny, seedable, good enough for fault decisions. */
static double next_unit(fault *f)
{
    uint64_t z = (f->rng += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    z ^= z >> 31;
    return (double)(z >> 11) / (double)(1ULL << 53);
}

/* Decides this call's fate (true: fail it), sleeping first when delayed. */
static bool inject(fault *f)
{
    pthread_mutex_lock(&f->mu);
    bool delay = next_unit(f) < f->o.delay_rate;
    bool fail = next_unit(f) < f->o.fail_rate;
    f->calls++;
    f->delayed += delay;
    f->failed += fail;
    pthread_mutex_unlock(&f->mu);
    if (delay && f->o.delay_ms) {
        struct timespec ts = {f->o.delay_ms / 1000, (long)(f->o.delay_ms % 1000) * 1000000L};
        while (nanosleep(&ts, &ts) != 0) {
        }
    }
    return fail;
}

static int64_t fault_store(lmc_l2_backend *b, const lmc_object_key *keys, uint8_t *const *bufs,
                           const uint64_t *sizes, size_t n)
{
    fault *f = (fault *)b;
    return inject(f) ? -1 : f->inner->ops->store(f->inner, keys, bufs, sizes, n);
}

static void fault_lookup(lmc_l2_backend *b, const lmc_object_key *keys, const uint64_t *sizes,
                         size_t n, uint8_t *found)
{
    fault *f = (fault *)b;
    if (inject(f))
        memset(found, 0, n);
    else
        f->inner->ops->lookup_and_lock(f->inner, keys, sizes, n, found);
}

static void fault_load(lmc_l2_backend *b, const lmc_object_key *keys, uint8_t *const *bufs,
                       const uint64_t *sizes, size_t n, uint8_t *ok)
{
    fault *f = (fault *)b;
    if (inject(f))
        memset(ok, 0, n);
    else
        f->inner->ops->load(f->inner, keys, bufs, sizes, n, ok);
}

/* Unlock, delete and the views are never faulted: unlock must succeed. */
static void fault_unlock(lmc_l2_backend *b, const lmc_object_key *keys, size_t n)
{
    fault *f = (fault *)b;
    f->inner->ops->unlock(f->inner, keys, n);
}

static size_t fault_remove(lmc_l2_backend *b, const lmc_object_key *keys, size_t n)
{
    fault *f = (fault *)b;
    return f->inner->ops->remove(f->inner, keys, n);
}

static void fault_usage(lmc_l2_backend *b, lmc_l2_usage *u)
{
    fault *f = (fault *)b;
    f->inner->ops->usage(f->inner, u);
}

static void fault_list(lmc_l2_backend *b, const char *model, json_t *entries)
{
    fault *f = (fault *)b;
    f->inner->ops->list(f->inner, model, entries);
}

static void fault_for_each_recovered(lmc_l2_backend *b, lmc_l2_recovered_fn fn, void *user)
{
    fault *f = (fault *)b;
    if (f->inner->ops->for_each_recovered)
        f->inner->ops->for_each_recovered(f->inner, fn, user);
}

/* Health is the inner backend's: injected faults are the test's, not an
 * outage of the store behind them. */
static int fault_probe(lmc_l2_backend *b, char *why, size_t cap)
{
    fault *f = (fault *)b;
    return f->inner->ops->probe ? f->inner->ops->probe(f->inner, why, cap) : 0;
}

static json_t *fault_status(lmc_l2_backend *b)
{
    fault *f = (fault *)b;
    pthread_mutex_lock(&f->mu);
    json_t *st = json_pack("{s:{s:I, s:I, s:I}}", "fault_inject", "calls", (json_int_t)f->calls,
                           "failed", (json_int_t)f->failed, "delayed", (json_int_t)f->delayed);
    pthread_mutex_unlock(&f->mu);
    json_t *in = f->inner->ops->status(f->inner);
    if (st && in)
        json_object_set_new(st, "inner", json_pack("{s:s, s:O}", "type_name", f->inner->type,
                                                   "status", in));
    json_decref(in);
    return st;
}

static void fault_destroy(lmc_l2_backend *b)
{
    fault *f = (fault *)b;
    f->inner->ops->destroy(f->inner);
    pthread_mutex_destroy(&f->mu);
    free(f);
}

static const lmc_l2_backend_ops fault_ops = {
    fault_store, fault_lookup, fault_load, fault_unlock, fault_remove,
    fault_usage, fault_list, fault_status, fault_destroy, fault_for_each_recovered,
    fault_probe,
};

lmc_l2_backend *lmc_l2_fault_new(lmc_l2_backend *inner, const lmc_l2_fault_options *o)
{
    fault *f = calloc(1, sizeof *f);
    if (!f) {
        inner->ops->destroy(inner);
        return NULL;
    }
    /* Split as the inner backend splits: each part is then one faulted call.
     * Not a batch backend itself: stores of one that is run whole here. */
    f->base = (lmc_l2_backend){&fault_ops, "fault_inject",
                               inner->split_ops & ~LMC_L2_SPLIT_STORE_BATCH};
    f->inner = inner;
    f->o = *o;
    f->rng = o->seed;
    pthread_mutex_init(&f->mu, NULL);
    return &f->base;
}
