/* "p2p" backend over the discovered peers (docs/p2p.md, "Requesting side"):
 * one p2p backend per peer (l2_p2p.c), added, replaced and dropped as
 * discovery sees them.  A lookup asks the peers in turn for the keys the
 * earlier ones did not have; each hit key remembers its peer, so that its
 * load and unlock go to that peer.  A peer that is dropped or replaced
 * stays alive (retired) until the backend is destroyed, so that a task
 * under way, or a key it leased, never holds a freed peer. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "storage/key_table.h"
#include "storage/l2/l2_adapter.h"

#define MAX_PEERS 256

typedef struct peer {
    char id[256];
    lmc_l2_backend *be;
} peer;

typedef struct owner {            /* a hit key and the peer that leased it */
    lmc_object_key key;           /* strings interned in pool.interner */
    lmc_l2_backend *be;
    uint32_t count;
} owner;

typedef struct pool {
    lmc_l2_backend base;          /* first */
    pthread_mutex_t mu;           /* everything below */
    peer live[MAX_PEERS];
    size_t n_live;
    lmc_l2_backend **retired;
    size_t n_retired;
    lmc_key_table owners;
    lmc_key_interner *interner;
    double lookup_s, load_s;
    bool ucx;
    char *token;                  /* the channel's, NULL: none */
    atomic_size_t active;         /* lookups under way */
} pool;

static int64_t pool_store(lmc_l2_backend *b, const lmc_object_key *keys, uint8_t *const *bufs,
                          const uint64_t *sizes, size_t n)
{
    (void)b, (void)keys, (void)bufs, (void)sizes, (void)n;
    return 0;   /* read-only: a 0-byte success (docs/p2p.md) */
}

static void own(pool *p, const lmc_object_key *k, lmc_l2_backend *be)
{
    owner *o = lmc_key_table_find(&p->owners, k);
    if (o) {
        o->be = be;
        o->count++;
        return;
    }
    o = calloc(1, sizeof *o);
    if (!o)
        return;
    o->key = *k;
    o->key.model_name = lmc_intern(p->interner, k->model_name, strlen(k->model_name));
    o->key.cache_salt = lmc_intern(p->interner, k->cache_salt, strlen(k->cache_salt));
    o->key.interned = 0;
    o->be = be;
    o->count = 1;
    if (!o->key.model_name || !o->key.cache_salt || lmc_key_table_insert(&p->owners, o) != 0)
        free(o);
}

static void pool_lookup(lmc_l2_backend *b, const lmc_object_key *keys, const uint64_t *sizes,
                        size_t n, uint8_t *found)
{
    pool *p = (pool *)b;
    memset(found, 0, n);
    atomic_fetch_add(&p->active, 1);
    pthread_mutex_lock(&p->mu);
    size_t np = p->n_live;
    lmc_l2_backend *bes[MAX_PEERS];
    for (size_t i = 0; i < np; i++)
        bes[i] = p->live[i].be;
    pthread_mutex_unlock(&p->mu);
    lmc_object_key *sub = malloc((n ? n : 1) * sizeof *sub);
    uint64_t *subsz = malloc((n ? n : 1) * sizeof *subsz);
    size_t *idx = malloc((n ? n : 1) * sizeof *idx);
    uint8_t *hit = malloc(n ? n : 1);
    for (size_t pi = 0; sub && subsz && idx && hit && pi < np; pi++) {
        size_t m = 0;
        for (size_t i = 0; i < n; i++)
            if (!found[i]) {
                sub[m] = keys[i];
                subsz[m] = sizes ? sizes[i] : 0;
                idx[m++] = i;
            }
        if (m == 0)
            break;
        bes[pi]->ops->lookup_and_lock(bes[pi], sub, sizes ? subsz : NULL, m, hit);
        pthread_mutex_lock(&p->mu);
        for (size_t j = 0; j < m; j++)
            if (hit[j]) {
                found[idx[j]] = 1;
                own(p, &sub[j], bes[pi]);
            }
        pthread_mutex_unlock(&p->mu);
    }
    free(sub);
    free(subsz);
    free(idx);
    free(hit);
    atomic_fetch_sub(&p->active, 1);
}

size_t lmc_l2_p2p_peers_active_lookups(lmc_l2_backend *b)
{
    return atomic_load(&((pool *)b)->active);
}

/* Runs op for each peer over the keys it owns: gathers them into the
 * scratch arrays, op(be, keys, idx, m).  Under no lock: owners are read
 * under mu first. */
typedef void (*per_peer_fn)(lmc_l2_backend *be, const lmc_object_key *keys, const size_t *idx,
                            size_t m, void *ctx);

static void for_each_peer(pool *p, const lmc_object_key *keys, size_t n, per_peer_fn fn,
                          void *ctx)
{
    lmc_l2_backend **who = calloc(n ? n : 1, sizeof *who);
    lmc_object_key *sub = malloc((n ? n : 1) * sizeof *sub);
    size_t *idx = malloc((n ? n : 1) * sizeof *idx);
    if (who && sub && idx) {
        pthread_mutex_lock(&p->mu);
        for (size_t i = 0; i < n; i++) {
            const owner *o = lmc_key_table_find(&p->owners, &keys[i]);
            who[i] = o ? o->be : NULL;
        }
        pthread_mutex_unlock(&p->mu);
        for (size_t i = 0; i < n; i++) {
            lmc_l2_backend *be = who[i];
            if (!be)
                continue;
            size_t m = 0;
            for (size_t j = i; j < n; j++)
                if (who[j] == be) {
                    sub[m] = keys[j];
                    idx[m++] = j;
                    who[j] = NULL;
                }
            fn(be, sub, idx, m, ctx);
        }
    }
    free(who);
    free(sub);
    free(idx);
}

typedef struct load_ctx {
    uint8_t *const *bufs;
    const uint64_t *sizes;
    uint8_t *ok;
} load_ctx;

static void load_from(lmc_l2_backend *be, const lmc_object_key *keys, const size_t *idx,
                      size_t m, void *ctx)
{
    load_ctx *c = ctx;
    uint8_t **bufs = calloc(m, sizeof *bufs);
    uint64_t *sizes = calloc(m, sizeof *sizes);
    uint8_t *ok = calloc(m, 1);
    if (bufs && sizes && ok) {
        for (size_t j = 0; j < m; j++) {
            bufs[j] = c->bufs[idx[j]];
            sizes[j] = c->sizes[idx[j]];
        }
        be->ops->load(be, keys, bufs, sizes, m, ok);
        for (size_t j = 0; j < m; j++)
            c->ok[idx[j]] = ok[j];
    }
    free(bufs);
    free(sizes);
    free(ok);
}

static void pool_load(lmc_l2_backend *b, const lmc_object_key *keys, uint8_t *const *bufs,
                      const uint64_t *sizes, size_t n, uint8_t *ok)
{
    memset(ok, 0, n);
    load_ctx c = {bufs, sizes, ok};
    for_each_peer((pool *)b, keys, n, load_from, &c);
}

static void unlock_at(lmc_l2_backend *be, const lmc_object_key *keys, const size_t *idx,
                      size_t m, void *ctx)
{
    (void)idx, (void)ctx;
    be->ops->unlock(be, keys, m);
}

static void pool_unlock(lmc_l2_backend *b, const lmc_object_key *keys, size_t n)
{
    pool *p = (pool *)b;
    for_each_peer(p, keys, n, unlock_at, NULL);
    pthread_mutex_lock(&p->mu);
    for (size_t i = 0; i < n; i++) {
        owner *o = lmc_key_table_find(&p->owners, &keys[i]);
        if (o && --o->count == 0)
            free(lmc_key_table_remove(&p->owners, &keys[i]));
    }
    pthread_mutex_unlock(&p->mu);
}

static size_t pool_remove(lmc_l2_backend *b, const lmc_object_key *keys, size_t n)
{
    (void)b, (void)keys, (void)n;
    return 0;
}

static void pool_usage(lmc_l2_backend *b, lmc_l2_usage *u)
{
    (void)b;
    *u = (lmc_l2_usage){0};
}

static void pool_list(lmc_l2_backend *b, const char *model, json_t *entries)
{
    (void)b, (void)model, (void)entries;
}

static json_t *pool_status(lmc_l2_backend *b)
{
    pool *p = (pool *)b;
    json_t *peers = json_array();
    pthread_mutex_lock(&p->mu);
    for (size_t i = 0; peers && i < p->n_live; i++) {
        json_t *st = p->live[i].be->ops->status(p->live[i].be);
        if (st)
            json_object_set_new(st, "instance_id", json_string(p->live[i].id));
        json_array_append_new(peers, st ? st : json_null());
    }
    json_t *o = json_pack("{s:o?, s:I}", "peers", peers, "retired_peers",
                          (json_int_t)p->n_retired);
    pthread_mutex_unlock(&p->mu);
    return o;
}

static void pool_destroy(lmc_l2_backend *b)
{
    pool *p = (pool *)b;
    for (size_t i = 0; i < p->n_live; i++)
        p->live[i].be->ops->destroy(p->live[i].be);
    for (size_t i = 0; i < p->n_retired; i++)
        p->retired[i]->ops->destroy(p->retired[i]);
    for (size_t i = 0; i < p->owners.capacity; i++)
        free(lmc_key_table_slot_item(&p->owners, i));
    lmc_key_table_destroy(&p->owners);
    lmc_key_interner_free(p->interner);
    free(p->retired);
    free(p->token);
    pthread_mutex_destroy(&p->mu);
    free(p);
}

static const lmc_l2_backend_ops pool_ops = {
    pool_store, pool_lookup, pool_load, pool_unlock, pool_remove, pool_usage, pool_list,
    pool_status, pool_destroy, NULL, NULL,
};

lmc_l2_backend *lmc_l2_p2p_peers_new(double lookup_timeout_s, double load_timeout_s, bool ucx,
                                     const char *auth_token)
{
    pool *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    if (auth_token && auth_token[0] && !(p->token = strdup(auth_token))) {
        free(p);
        return NULL;
    }
    p->base = (lmc_l2_backend){&pool_ops, "p2p", 0};
    p->lookup_s = lookup_timeout_s;
    p->load_s = load_timeout_s;
    p->ucx = ucx;
    p->interner = lmc_key_interner_new();
    if (!p->interner || lmc_key_table_init(&p->owners, offsetof(owner, key), 64) != 0) {
        lmc_key_interner_free(p->interner);
        free(p->token);
        free(p);
        return NULL;
    }
    pthread_mutex_init(&p->mu, NULL);
    return &p->base;
}

/* Under mu: moves live[i] to the retired list (false: no memory, kept). */
static bool retire(pool *p, size_t i)
{
    lmc_l2_backend **r = realloc(p->retired, (p->n_retired + 1) * sizeof *r);
    if (!r)
        return false;
    p->retired = r;
    p->retired[p->n_retired++] = p->live[i].be;
    p->live[i] = p->live[--p->n_live];
    return true;
}

int lmc_l2_p2p_peers_set(lmc_l2_backend *b, const char *id, const char *mq_url,
                         const char *chan_url, char *err, size_t errlen)
{
    pool *p = (pool *)b;
    lmc_l2_p2p_options o = {mq_url, chan_url, p->lookup_s, p->load_s, p->ucx, p->token};
    lmc_l2_backend *be = lmc_l2_p2p_new(&o, err, errlen);
    if (!be)
        return -1;
    pthread_mutex_lock(&p->mu);
    for (size_t i = 0; i < p->n_live; i++)
        if (strcmp(p->live[i].id, id) == 0 && !retire(p, i))
            goto full;
    if (p->n_live == MAX_PEERS)
        goto full;
    snprintf(p->live[p->n_live].id, sizeof p->live[p->n_live].id, "%s", id);
    p->live[p->n_live++].be = be;
    pthread_mutex_unlock(&p->mu);
    return 0;
full:
    pthread_mutex_unlock(&p->mu);
    be->ops->destroy(be);
    snprintf(err, errlen, "no room for peer %s", id);
    return -1;
}

void lmc_l2_p2p_peers_drop(lmc_l2_backend *b, const char *id)
{
    pool *p = (pool *)b;
    pthread_mutex_lock(&p->mu);
    for (size_t i = 0; i < p->n_live; i++)
        if (strcmp(p->live[i].id, id) == 0) {
            retire(p, i);
            break;
        }
    pthread_mutex_unlock(&p->mu);
}
