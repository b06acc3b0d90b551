/* The fleet fragment index (coord_blend.h; docs/coordinator.md, "Blend
 * lookup").  Two chained tables: contents by exact fingerprint, claims by
 * (namespace, chunk hash).  A claim points at its content and is on the
 * content's list; a content goes with its last claim. */
#include "coordinator/coord_blend.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "core/fnv.h"
#include "core/mix.h"
#include "hash/poly_fingerprint.h"

typedef struct content content;

typedef struct claim {
    struct claim *next;       /* in its by_key bucket */
    struct claim *sibling;    /* next claim of the same content */
    content *content;
    uint64_t key, old_st, stamp;
    uint32_t world_size;
    uint16_t model_len, salt_len;
    uint8_t hash_len;
    uint8_t hash[COORD_HASH_MAX];
    char names[]; /* model then salt, not terminated */
} claim;

struct content {
    content *next; /* in its by_fp bucket */
    uint64_t fp;
    claim *claims;
    uint32_t tokens[];
};

struct coordinator_blend {
    pthread_mutex_t mu;
    coordinator_blend_opts o;
    content **by_fp;
    claim **by_key;
    size_t mask; /* both tables have mask + 1 buckets */
    uint64_t stamp; /* one per match call: a claim reported in this call */
    coordinator_blend_stats st;
};

coordinator_blend *coordinator_blend_new(const coordinator_blend_opts *o)
{
    if (!o || !o->chunk_size || !o->probe_stride || !o->max_chunks ||
        o->max_chunks > COORD_BLEND_MAX_MAX_CHUNKS)
        return NULL;
    coordinator_blend *b = calloc(1, sizeof *b);
    if (!b)
        return NULL;
    b->o = *o;
    size_t n = 1024;
    while (n < o->max_chunks)
        n <<= 1;
    b->mask = n - 1;
    b->by_fp = calloc(n, sizeof *b->by_fp);
    b->by_key = calloc(n, sizeof *b->by_key);
    if (!b->by_fp || !b->by_key) {
        coordinator_blend_free(b);
        return NULL;
    }
    b->st.max_chunks = o->max_chunks;
    pthread_mutex_init(&b->mu, NULL);
    return b;
}

void coordinator_blend_free(coordinator_blend *b)
{
    if (!b)
        return;
    for (size_t i = 0; b->by_key && i <= b->mask; i++)
        for (claim *c = b->by_key[i], *n; c; c = n) {
            n = c->next;
            free(c);
        }
    for (size_t i = 0; b->by_fp && i <= b->mask; i++)
        for (content *c = b->by_fp[i], *n; c; c = n) {
            n = c->next;
            free(c);
        }
    if (b->by_fp && b->by_key)
        pthread_mutex_destroy(&b->mu);
    free(b->by_fp);
    free(b->by_key);
    free(b);
}

static uint64_t claim_key(const coordinator_blend_ns *ns, const uint8_t *hash, size_t hash_len)
{
    uint64_t h = lmc_fnv1a64(LMC_FNV1A64_OFFSET_BASIS, ns->model, ns->model_len);
    h = lmc_fnv1a64(h, "", 1); /* ("ab","c") is not ("a","bc") */
    h = lmc_fnv1a64(h, ns->salt, ns->salt_len);
    h = lmc_fnv1a64(h, "", 1);
    h = lmc_fnv1a64(h, &ns->world_size, sizeof ns->world_size);
    return lmc_core_mix64(lmc_fnv1a64(h, hash, hash_len));
}

static bool in_ns(const claim *c, const coordinator_blend_ns *ns)
{
    return c->world_size == ns->world_size && c->model_len == ns->model_len &&
           c->salt_len == ns->salt_len && memcmp(c->names, ns->model, ns->model_len) == 0 &&
           memcmp(c->names + c->model_len, ns->salt, ns->salt_len) == 0;
}

static claim **find_claim(coordinator_blend *b, uint64_t key, const coordinator_blend_ns *ns,
                          const uint8_t *hash, size_t hash_len)
{
    claim **p = &b->by_key[key & b->mask];
    for (; *p; p = &(*p)->next)
        if ((*p)->key == key && (*p)->hash_len == hash_len &&
            memcmp((*p)->hash, hash, hash_len) == 0 && in_ns(*p, ns))
            break;
    return p;
}

/* The polynomial fingerprints of every window start of tokens[0..n)
 * (n >= chunk_size) into r[n - chunk_size + 1]; -1 out of memory. */
static int fingerprints(const coordinator_blend *b, const uint32_t *tokens, size_t n, uint64_t *r)
{
    uint64_t *wide = malloc(n * sizeof *wide);
    if (!wide)
        return -1;
    for (size_t i = 0; i < n; i++)
        wide[i] = tokens[i];
    lmc_hash_poly_rolling(wide, n, b->o.chunk_size, r);
    free(wide);
    for (size_t p = 0; b->o.fp_mask && p + b->o.chunk_size <= n; p++)
        r[p] &= b->o.fp_mask;
    return 0;
}

/* The content of these exact tokens, made when new (NULL out of memory). */
static content *content_of(coordinator_blend *b, uint64_t fp, const uint32_t *tokens)
{
    size_t bytes = (size_t)b->o.chunk_size * sizeof *tokens;
    content **p = &b->by_fp[fp & b->mask];
    for (content *c = *p; c; c = c->next)
        if (c->fp == fp && memcmp(c->tokens, tokens, bytes) == 0)
            return c;
    content *c = malloc(sizeof *c + bytes);
    if (!c)
        return NULL;
    *c = (content){.next = *p, .fp = fp};
    memcpy(c->tokens, tokens, bytes);
    *p = c;
    b->st.contents++;
    return c;
}

static void drop_content(coordinator_blend *b, content *t)
{
    content **q = &b->by_fp[t->fp & b->mask];
    while (*q != t)
        q = &(*q)->next;
    *q = t->next;
    free(t);
    b->st.contents--;
}

/* Takes c off its content, which goes when c was its last claim. */
static void detach(coordinator_blend *b, claim *c)
{
    content *t = c->content;
    claim **p = &t->claims;
    while (*p != c)
        p = &(*p)->sibling;
    *p = c->sibling;
    if (!t->claims)
        drop_content(b, t);
}

static void attach(claim *c, content *t, uint64_t old_st)
{
    c->content = t;
    c->sibling = t->claims;
    t->claims = c;
    c->old_st = old_st;
}

static claim *new_claim(const coordinator_blend_ns *ns, uint64_t key, const uint8_t *hash,
                        size_t hash_len)
{
    claim *c = calloc(1, sizeof *c + ns->model_len + ns->salt_len);
    if (!c)
        return NULL;
    c->key = key;
    c->world_size = ns->world_size;
    c->model_len = (uint16_t)ns->model_len;
    c->salt_len = (uint16_t)ns->salt_len;
    c->hash_len = (uint8_t)hash_len;
    memcpy(c->hash, hash, hash_len);
    memcpy(c->names, ns->model, ns->model_len);
    memcpy(c->names + ns->model_len, ns->salt, ns->salt_len);
    return c;
}

static int add_locked(coordinator_blend *b, const coordinator_blend_ns *ns, const uint8_t *hash,
                      size_t hash_len, uint64_t fp, const uint32_t *tokens, uint64_t old_st)
{
    uint64_t key = claim_key(ns, hash, hash_len);
    claim **p = find_claim(b, key, ns, hash, hash_len);
    claim *c = *p;
    if (c && c->content->fp == fp &&
        memcmp(c->content->tokens, tokens, (size_t)b->o.chunk_size * sizeof *tokens) == 0) {
        c->old_st = old_st;
        return COORD_BLEND_KNOWN;
    }
    if (!c && b->st.chunks >= b->o.max_chunks)
        return b->st.refused++, COORD_BLEND_FULL;
    content *t = content_of(b, fp, tokens);
    if (!t)
        return COORD_BLEND_NOMEM;
    if (c) { /* the chunk hash was stored again with other tokens */
        detach(b, c);
        attach(c, t, old_st);
        return COORD_BLEND_KNOWN;
    }
    if (!(c = new_claim(ns, key, hash, hash_len))) {
        if (!t->claims)
            drop_content(b, t);
        return COORD_BLEND_NOMEM;
    }
    attach(c, t, old_st);
    c->next = b->by_key[key & b->mask];
    b->by_key[key & b->mask] = c;
    b->st.chunks++;
    b->st.added++;
    return COORD_BLEND_ADDED;
}

int coordinator_blend_add(coordinator_blend *b, const coordinator_blend_ns *ns, const uint8_t *hash,
                          size_t hash_len, const uint32_t *tokens, uint64_t old_st)
{
    if (!hash_len || hash_len > COORD_HASH_MAX || ns->model_len > UINT16_MAX ||
        ns->salt_len > UINT16_MAX)
        return COORD_BLEND_NOMEM;
    uint64_t fp;
    if (fingerprints(b, tokens, b->o.chunk_size, &fp) != 0) /* before the lock */
        return COORD_BLEND_NOMEM;
    pthread_mutex_lock(&b->mu);
    int rc = add_locked(b, ns, hash, hash_len, fp, tokens, old_st);
    pthread_mutex_unlock(&b->mu);
    return rc;
}

bool coordinator_blend_remove(coordinator_blend *b, const coordinator_blend_ns *ns,
                              const uint8_t *hash, size_t hash_len)
{
    if (!hash_len || hash_len > COORD_HASH_MAX)
        return false;
    uint64_t key = claim_key(ns, hash, hash_len);
    pthread_mutex_lock(&b->mu);
    claim **p = find_claim(b, key, ns, hash, hash_len);
    claim *c = *p;
    if (c) {
        *p = c->next;
        detach(b, c);
        free(c);
        b->st.chunks--;
        b->st.removed++;
    }
    pthread_mutex_unlock(&b->mu);
    return c != NULL;
}

/* The first claim of ns on content t, or NULL. */
static claim *claim_in(content *t, const coordinator_blend_ns *ns)
{
    for (claim *c = t->claims; c; c = c->sibling)
        if (in_ns(c, ns))
            return c;
    return NULL;
}

typedef struct {
    coordinator_blend_hit *v;
    size_t n, cap;
} match_list;

static int emit(match_list *l, const claim *c, uint64_t cur_st)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 16;
        coordinator_blend_hit *v = realloc(l->v, cap * sizeof *v);
        if (!v)
            return -1;
        l->v = v;
        l->cap = cap;
    }
    coordinator_blend_hit *m = &l->v[l->n++];
    memset(m, 0, sizeof *m);
    memcpy(m->hash, c->hash, c->hash_len);
    m->hash_len = c->hash_len;
    m->old_st = c->old_st;
    m->cur_st = cur_st;
    return 0;
}

/* Probes position p (fingerprint fp) of the query: every content of that
 * exact fingerprint and those exact tokens that ns claims, once per call. */
static int probe(coordinator_blend *b, const coordinator_blend_ns *ns, const uint32_t *window,
                 uint64_t fp, uint64_t p, match_list *l)
{
    size_t bytes = (size_t)b->o.chunk_size * sizeof *window;
    for (content *t = b->by_fp[fp & b->mask]; t; t = t->next) {
        if (t->fp != fp || memcmp(t->tokens, window, bytes) != 0)
            continue;
        claim *c = claim_in(t, ns);
        if (!c || c->stamp == b->stamp)
            continue;
        c->stamp = b->stamp;
        if (emit(l, c, p) != 0)
            return -1;
    }
    return 0;
}

int coordinator_blend_match(coordinator_blend *b, const coordinator_blend_ns *ns,
                            const uint32_t *tokens, size_t n, coordinator_blend_hit **out,
                            size_t *n_out)
{
    *out = NULL;
    *n_out = 0;
    if (n < b->o.chunk_size)
        return 0;
    uint64_t *r = malloc((n - b->o.chunk_size + 1) * sizeof *r);
    if (!r || fingerprints(b, tokens, n, r) != 0) /* before the lock */
        return free(r), -1;
    match_list l = {0};
    int rc = 0;
    pthread_mutex_lock(&b->mu);
    b->stamp++;
    for (size_t p = 0; rc == 0 && p + b->o.chunk_size <= n; p += b->o.probe_stride)
        rc = probe(b, ns, tokens + p, r[p], p, &l);
    pthread_mutex_unlock(&b->mu);
    free(r);
    if (rc != 0) {
        free(l.v);
        return -1;
    }
    *out = l.v;
    *n_out = l.n;
    return 0;
}

coordinator_blend_stats coordinator_blend_get_stats(coordinator_blend *b)
{
    pthread_mutex_lock(&b->mu);
    coordinator_blend_stats st = b->st;
    pthread_mutex_unlock(&b->mu);
    return st;
}
