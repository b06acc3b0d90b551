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

/* One peer's reader, shared by reference: the live list holds one, each
 * key it leased (an owner) one, each call under way one.  A peer dropped
 * or replaced leaves the live list; its reader goes when the last
 * reference does, so that its unlocks are still sent and nothing under way
 * ever holds a freed peer. */
typedef struct reader {
    lmc_l2_backend *be;
    char id[256];
    unsigned refs;                /* under pool.mu */
    bool retired;                 /* off the live list */
    lmc_l2_p2p_stats carried;     /* the books of the readers it replaced */
    struct reader *next;          /* every reader alive, for destroy */
} reader;

typedef struct owner {            /* a hit key and the peer that leased it */
    lmc_object_key key;           /* strings interned in pool.interner */
    reader *rd;                   /* holds a reference */
    uint32_t count;
} owner;

typedef struct pool {
    lmc_l2_backend base;          /* first */
    pthread_mutex_t mu;           /* everything below */
    reader *live[MAX_PEERS];
    size_t n_live;
    reader *all;
    size_t n_retired_alive;
    uint64_t n_retired_freed;
    lmc_key_table owners;
    lmc_key_interner *interner;
    double lookup_s, load_s;
    bool ucx;
    char *token;                  /* the channel's, NULL: none */
    atomic_size_t active;         /* lookups under way */
} pool;

/* Under mu. */
static reader *hold(reader *r)
{
    if (r)
        r->refs++;
    return r;
}

/* Under mu: drops a reference; the reader, when it was the last, is
 * unlinked and returned for the caller to destroy outside mu. */
static reader *unref(pool *p, reader *r)
{
    if (!r || --r->refs > 0)
        return NULL;
    for (reader **at = &p->all; *at; at = &(*at)->next)
        if (*at == r) {
            *at = r->next;
            break;
        }
    if (r->retired) {
        p->n_retired_alive--;
        p->n_retired_freed++;
    }
    return r;
}

static void reader_free(reader *r)
{
    if (r) {
        r->be->ops->destroy(r->be);   /* sends what unlocks it still has queued */
        free(r);
    }
}

/* Under mu: r (NULL: nothing) goes on the list of readers to destroy. */
static void doom(reader **list, reader *r)
{
    if (r) {
        r->next = *list;
        *list = r;
    }
}

/* Outside mu: destroys the readers of the list. */
static void free_doomed(reader *list)
{
    while (list) {
        reader *next = list->next;
        reader_free(list);
        list = next;
    }
}

/* Drops n references, destroying the readers that were the last. */
static void release(pool *p, reader **rs, size_t n)
{
    reader *gone = NULL;
    pthread_mutex_lock(&p->mu);
    for (size_t i = 0; i < n; i++)
        doom(&gone, unref(p, rs[i]));
    pthread_mutex_unlock(&p->mu);
    free_doomed(gone);
}

static int64_t pool_store(lmc_l2_backend *b, const lmc_object_key *keys, uint8_t *const *bufs,
                          const uint64_t *sizes, size_t n)
{
    (void)b, (void)keys, (void)bufs, (void)sizes, (void)n;
    return 0;   /* read-only: a 0-byte success (docs/p2p.md) */
}

/* Under mu: key k was leased by reader r; its load and unlock go there. */
static void own(pool *p, const lmc_object_key *k, reader *r, reader **dropped)
{
    owner *o = lmc_key_table_find(&p->owners, k);
    if (o) {
        *dropped = unref(p, o->rd);
        o->rd = hold(r);
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
    o->count = 1;
    if (!o->key.model_name || !o->key.cache_salt || lmc_key_table_insert(&p->owners, o) != 0) {
        free(o);
        return;
    }
    o->rd = hold(r);
}

/* Asks reader r for the keys not found yet; records its hits. */
static void ask(pool *p, reader *r, const lmc_object_key *keys, const uint64_t *sizes, size_t n,
                uint8_t *found, lmc_object_key *sub, uint64_t *subsz, size_t *idx, uint8_t *hit)
{
    size_t m = 0;
    for (size_t i = 0; i < n; i++)
        if (!found[i]) {
            sub[m] = keys[i];
            subsz[m] = sizes ? sizes[i] : 0;
            idx[m++] = i;
        }
    if (m == 0)
        return;
    r->be->ops->lookup_and_lock(r->be, sub, sizes ? subsz : NULL, m, hit);
    reader *dropped = NULL;
    pthread_mutex_lock(&p->mu);
    for (size_t j = 0; j < m; j++)
        if (hit[j]) {
            found[idx[j]] = 1;
            reader *d = NULL;
            own(p, &sub[j], r, &d);
            doom(&dropped, d);   /* the key's earlier peer lost its last reference */
        }
    pthread_mutex_unlock(&p->mu);
    free_doomed(dropped);
}

static void pool_lookup(lmc_l2_backend *b, const lmc_object_key *keys, const uint64_t *sizes,
                        size_t n, uint8_t *found)
{
    pool *p = (pool *)b;
    memset(found, 0, n);
    atomic_fetch_add(&p->active, 1);
    reader *rs[MAX_PEERS];
    pthread_mutex_lock(&p->mu);
    size_t np = p->n_live;
    for (size_t i = 0; i < np; i++)
        rs[i] = hold(p->live[i]);
    pthread_mutex_unlock(&p->mu);
    size_t k = n ? n : 1;
    lmc_object_key *sub = malloc(k * sizeof *sub);
    uint64_t *subsz = malloc(k * sizeof *subsz);
    size_t *idx = malloc(k * sizeof *idx);
    uint8_t *hit = malloc(k);
    for (size_t pi = 0; sub && subsz && idx && hit && pi < np; pi++)
        ask(p, rs[pi], keys, sizes, n, found, sub, subsz, idx, hit);
    free(sub);
    free(subsz);
    free(idx);
    free(hit);
    release(p, rs, np);
    atomic_fetch_sub(&p->active, 1);
}

size_t lmc_l2_p2p_peers_active_lookups(lmc_l2_backend *b)
{
    return atomic_load(&((pool *)b)->active);
}

/* Runs fn for each peer over the keys it owns (gathered into scratch
 * arrays): fn(be, keys, idx, m, ctx), under no lock, each peer held for
 * the call. */
typedef void (*per_peer_fn)(lmc_l2_backend *be, const lmc_object_key *keys, const size_t *idx,
                            size_t m, void *ctx);

static void for_each_peer(pool *p, const lmc_object_key *keys, size_t n, per_peer_fn fn,
                          void *ctx)
{
    reader **who = calloc(n ? n : 1, sizeof *who);
    reader **held = calloc(n ? n : 1, sizeof *held);
    lmc_object_key *sub = malloc((n ? n : 1) * sizeof *sub);
    size_t *idx = malloc((n ? n : 1) * sizeof *idx);
    if (who && held && sub && idx) {
        pthread_mutex_lock(&p->mu);
        for (size_t i = 0; i < n; i++) {
            const owner *o = lmc_key_table_find(&p->owners, &keys[i]);
            who[i] = held[i] = o ? hold(o->rd) : NULL;
        }
        pthread_mutex_unlock(&p->mu);
        for (size_t i = 0; i < n; i++) {
            reader *r = who[i];
            if (!r)
                continue;
            size_t m = 0;
            for (size_t j = i; j < n; j++)
                if (who[j] == r) {
                    sub[m] = keys[j];
                    idx[m++] = j;
                    who[j] = NULL;
                }
            fn(r->be, sub, idx, m, ctx);
        }
        release(p, held, n);
    }
    free(who);
    free(held);
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
    reader **gone = calloc(n ? n : 1, sizeof *gone);
    pthread_mutex_lock(&p->mu);
    for (size_t i = 0; i < n; i++) {
        owner *o = lmc_key_table_find(&p->owners, &keys[i]);
        if (o && --o->count == 0) {
            lmc_key_table_remove(&p->owners, &keys[i]);
            if (gone)
                gone[i] = o->rd;   /* its reference, dropped below */
            else
                unref(p, o->rd);   /* no memory: a retired reader may outlive its use */
            free(o);
        }
    }
    pthread_mutex_unlock(&p->mu);
    if (gone)
        release(p, gone, n);
    free(gone);
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
        json_t *st = p->live[i]->be->ops->status(p->live[i]->be);
        if (st)
            json_object_set_new(st, "instance_id", json_string(p->live[i]->id));
        json_array_append_new(peers, st ? st : json_null());
    }
    json_t *o = json_pack("{s:o?, s:I, s:I}", "peers", peers, "retired_peers",
                          (json_int_t)p->n_retired_alive, "retired_peers_freed",
                          (json_int_t)p->n_retired_freed);
    pthread_mutex_unlock(&p->mu);
    return o;
}

/* At shutdown every reference is dropped: each reader sends the unlocks it
 * still has queued (l2_p2p.c) and goes. */
static void pool_destroy(lmc_l2_backend *b)
{
    pool *p = (pool *)b;
    while (p->all) {
        reader *r = p->all;
        p->all = r->next;
        reader_free(r);
    }
    for (size_t i = 0; i < p->owners.capacity; i++)
        free(lmc_key_table_slot_item(&p->owners, i));
    lmc_key_table_destroy(&p->owners);
    lmc_key_interner_free(p->interner);
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

static void stats_add(lmc_l2_p2p_stats *to, const lmc_l2_p2p_stats *a)
{
    to->lookups += a->lookups;
    to->lookup_failures += a->lookup_failures;
    to->lookup_timeouts += a->lookup_timeouts;
    to->bad_answers += a->bad_answers;
    to->lookups_skipped += a->lookups_skipped;
    to->hits += a->hits;
    to->loads += a->loads;
    to->loaded_bytes += a->loaded_bytes;
    to->load_failures += a->load_failures;
    to->unlocks += a->unlocks;
}

/* Under mu: takes live[i] off the live list; the caller drops its
 * reference (outside mu). */
static reader *retire(pool *p, size_t i)
{
    reader *r = p->live[i];
    r->retired = true;
    p->n_retired_alive++;
    p->live[i] = p->live[--p->n_live];
    return r;
}

int lmc_l2_p2p_peers_set(lmc_l2_backend *b, const char *id, const char *mq_url,
                         const char *chan_url, char *err, size_t errlen)
{
    pool *p = (pool *)b;
    lmc_l2_p2p_options o = {mq_url, chan_url, p->lookup_s, p->load_s, p->ucx, p->token};
    reader *r = calloc(1, sizeof *r);
    if (!r || !(r->be = lmc_l2_p2p_new(&o, err, errlen))) {
        if (!r)
            snprintf(err, errlen, "out of memory");
        free(r);
        return -1;
    }
    snprintf(r->id, sizeof r->id, "%s", id);
    r->refs = 1;
    reader *old = NULL;
    pthread_mutex_lock(&p->mu);
    for (size_t i = 0; i < p->n_live; i++)
        if (strcmp(p->live[i]->id, id) == 0) {
            old = retire(p, i);
            /* The peer's books go on across its moves (metrics are counters). */
            lmc_l2_p2p_stats now;
            lmc_l2_p2p_stats_get(old->be, &now);
            r->carried = old->carried;
            stats_add(&r->carried, &now);
            break;
        }
    bool room = p->n_live < MAX_PEERS;
    if (room) {
        p->live[p->n_live++] = r;
        r->next = p->all;
        p->all = r;
    }
    pthread_mutex_unlock(&p->mu);
    release(p, &old, old != NULL);
    if (!room) {
        reader_free(r);
        snprintf(err, errlen, "no room for peer %s", id);
        return -1;
    }
    return 0;
}

void lmc_l2_p2p_peers_drop(lmc_l2_backend *b, const char *id)
{
    pool *p = (pool *)b;
    reader *old = NULL;
    pthread_mutex_lock(&p->mu);
    for (size_t i = 0; i < p->n_live && !old; i++)
        if (strcmp(p->live[i]->id, id) == 0)
            old = retire(p, i);
    pthread_mutex_unlock(&p->mu);
    release(p, &old, old != NULL);
}

size_t lmc_l2_p2p_peers_stats(lmc_l2_backend *b, lmc_l2_p2p_peer_stats *out, size_t cap)
{
    pool *p = (pool *)b;
    pthread_mutex_lock(&p->mu);
    size_t n = p->n_live < cap ? p->n_live : cap;
    for (size_t i = 0; i < n; i++) {
        snprintf(out[i].id, sizeof out[i].id, "%s", p->live[i]->id);
        lmc_l2_p2p_stats_get(p->live[i]->be, &out[i].st);
        stats_add(&out[i].st, &p->live[i]->carried);
    }
    pthread_mutex_unlock(&p->mu);
    return n;
}
