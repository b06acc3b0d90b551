/* CacheBlend fingerprint matcher (docs/cacheblend.md, "Matcher").
 *
 * Layout: a direct-mapped table of 2^20 slots, slot = (fingerprint ^
 * namespace digest) mod 2^20, holding id + 1 of the chunk that last took
 * it (0 = empty); a fixed array of max_chunks entries; and a chained index
 * (namespace, chained hash) -> entry for the dedup, removal and strike
 * paths.  Ids are stored + 1 everywhere so that calloc'ed memory is already
 * "empty" and no page is touched before it is used. */
#include "modules/blend/blend_matcher.h"

#include "core/checked.h"
#include "core/errbuf.h"
#include "core/fnv.h"
#include "core/mix.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define TABLE_SLOTS ((size_t)1 << LMC_BLEND_TABLE_BITS)
#define TABLE_MASK ((uint64_t)TABLE_SLOTS - 1)

struct entry {
    uint64_t fp;     /* fingerprint of the chunk's tokens */
    uint64_t old_st; /* its stored position */
    uint64_t ns;     /* namespace digest */
    uint8_t hash[LMC_BLEND_HASH_MAX];
    uint32_t next; /* id + 1 of the next entry in its index chain or the free list */
    uint8_t live, strikes;
    uint8_t pad[2];
};
_Static_assert(sizeof(struct entry) == LMC_BLEND_ENTRY_BYTES, "docs/cacheblend.md cost");

struct lmc_blend_matcher {
    pthread_rwlock_t lock;
    uint32_t cs;
    size_t hash_len, max;
    bool dedup;
    uint32_t *table;
    struct entry *e;
    uint32_t *bucket;
    size_t bucket_mask;
    uint32_t free_head; /* id + 1 of a removed entry to reuse, 0 = none */
    size_t hwm;         /* entries ever handed out */
    size_t live;
    bool ever; /* a chunk was registered once: before that no match can hit */
    uint64_t registered, refused, removed;
};

static uint64_t ns_digest(const lmc_blend_ns *ns)
{
    uint64_t h = lmc_fnv1a64_str(LMC_FNV1A64_OFFSET_BASIS, ns->model_name);
    h = lmc_fnv1a64(h, "", 1); /* the separator: ("ab","c") != ("a","bc") */
    h = lmc_fnv1a64_str(h, ns->cache_salt ? ns->cache_salt : "");
    h = lmc_fnv1a64(h, "", 1);
    h = lmc_fnv1a64(h, &ns->world_size, sizeof ns->world_size);
    return lmc_core_mix64(h);
}

static bool ns_ok(const lmc_blend_ns *ns)
{
    return ns && ns->model_name;
}

static size_t buckets_for(size_t max)
{
    size_t nb = 1;
    while (nb < max)
        nb <<= 1;
    return nb;
}

size_t lmc_blend_matcher_bytes(size_t max_chunks)
{
    if (max_chunks == 0 || max_chunks > LMC_BLEND_MAX_CHUNKS)
        return 0;
    return sizeof(struct lmc_blend_matcher) + TABLE_SLOTS * sizeof(uint32_t) +
           max_chunks * sizeof(struct entry) + buckets_for(max_chunks) * sizeof(uint32_t);
}

int lmc_blend_matcher_new(const lmc_blend_matcher_opts *o, lmc_blend_matcher **out, char *err,
                          size_t errlen)
{
    if (!o || !out)
        return lmc_err(err, errlen, "blend matcher: no options or no result pointer");
    *out = NULL;
    if (o->chunk_size == 0)
        return lmc_err(err, errlen, "blend matcher: chunk_size must be at least 1");
    if (o->hash_len == 0 || o->hash_len > LMC_BLEND_HASH_MAX)
        return lmc_err(err, errlen, "blend matcher: hash_len %zu is not in 1..%d", o->hash_len,
                       LMC_BLEND_HASH_MAX);
    if (o->max_chunks == 0 || o->max_chunks > LMC_BLEND_MAX_CHUNKS)
        return lmc_err(err, errlen, "blend matcher: max_chunks %zu is not in 1..%u",
                       o->max_chunks, LMC_BLEND_MAX_CHUNKS);
    lmc_blend_matcher *m = calloc(1, sizeof *m);
    if (!m)
        goto nomem;
    m->cs = o->chunk_size;
    m->hash_len = o->hash_len;
    m->max = o->max_chunks;
    m->dedup = o->dedup_content;
    m->bucket_mask = buckets_for(o->max_chunks) - 1;
    m->table = calloc(TABLE_SLOTS, sizeof *m->table);
    m->e = calloc(o->max_chunks, sizeof *m->e);
    m->bucket = calloc(m->bucket_mask + 1, sizeof *m->bucket);
    if (!m->table || !m->e || !m->bucket || pthread_rwlock_init(&m->lock, NULL) != 0)
        goto nomem;
    /* A long prompt probes nearly every page of the table: faulted in here,
     * not in the first lookup (BENCHMARKS.md, row 50's first round). */
    for (size_t i = 0; i < TABLE_SLOTS; i += 4096 / sizeof *m->table)
        ((volatile uint32_t *)m->table)[i] = 0;
    *out = m;
    return 0;
nomem:
    if (m) {
        free(m->table);
        free(m->e);
        free(m->bucket);
        free(m);
    }
    return lmc_err(err, errlen, "blend matcher: out of memory for max_chunks %zu",
                   o->max_chunks);
}

void lmc_blend_matcher_free(lmc_blend_matcher *m)
{
    if (!m)
        return;
    pthread_rwlock_destroy(&m->lock);
    free(m->table);
    free(m->e);
    free(m->bucket);
    free(m);
}

/* ---- the (namespace, chained hash) index; callers hold the lock ---- */

static size_t bucket_of(const lmc_blend_matcher *m, uint64_t ns, const uint8_t *hash)
{
    return lmc_core_mix64(lmc_fnv1a64(ns, hash, m->hash_len)) & m->bucket_mask;
}

/* id + 1 of the live entry of (ns, hash), 0 if none. */
static uint32_t find(const lmc_blend_matcher *m, uint64_t ns, const uint8_t *hash)
{
    for (uint32_t v = m->bucket[bucket_of(m, ns, hash)]; v; v = m->e[v - 1].next) {
        const struct entry *e = &m->e[v - 1];
        if (e->ns == ns && memcmp(e->hash, hash, m->hash_len) == 0)
            return v;
    }
    return 0;
}

static void unlink_index(lmc_blend_matcher *m, uint32_t v)
{
    struct entry *e = &m->e[v - 1];
    uint32_t *link = &m->bucket[bucket_of(m, e->ns, e->hash)];
    while (*link != v)
        link = &m->e[*link - 1].next;
    *link = e->next;
}

static size_t slot_of(uint64_t fp, uint64_t ns)
{
    return (size_t)((fp ^ ns) & TABLE_MASK);
}

/* Frees entry v.  Its table slot is cleared only while it still owns it:
 * a newer chunk that took the slot stays findable (docs/cacheblend.md,
 * "Matcher"). */
static void remove_locked(lmc_blend_matcher *m, uint32_t v)
{
    struct entry *e = &m->e[v - 1];
    size_t slot = slot_of(e->fp, e->ns);
    if (m->table[slot] == v)
        m->table[slot] = 0;
    unlink_index(m, v);
    memset(e, 0, sizeof *e);
    e->next = m->free_head;
    m->free_head = v;
    m->live--;
    m->removed++;
}

static uint32_t alloc_entry(lmc_blend_matcher *m)
{
    if (m->free_head) {
        uint32_t v = m->free_head;
        m->free_head = m->e[v - 1].next;
        return v;
    }
    return (uint32_t)++m->hwm;
}

/* ---- a small set of 64-bit keys, local to one call ---- */

typedef struct {
    uint64_t *key;
    uint8_t *used;
    size_t mask, n;
} u64set;

static int set_init(u64set *s, size_t want)
{
    size_t cap = 16;
    while (cap < want * 2 && cap < ((size_t)1 << 40))
        cap <<= 1;
    s->key = calloc(cap, sizeof *s->key);
    s->used = calloc(cap, 1);
    s->mask = cap - 1;
    s->n = 0;
    return s->key && s->used ? 0 : -1;
}

static void set_free(u64set *s)
{
    free(s->key);
    free(s->used);
}

static size_t set_pos(const u64set *s, uint64_t k)
{
    size_t i = lmc_core_mix64(k) & s->mask;
    while (s->used[i] && s->key[i] != k)
        i = (i + 1) & s->mask;
    return i;
}

static bool set_has(const u64set *s, uint64_t k)
{
    return s->used[set_pos(s, k)];
}

static int set_put(u64set *s, uint64_t k)
{
    if ((s->n + 1) * 2 > s->mask + 1) {
        u64set g;
        if (set_init(&g, s->mask + 1) != 0) {
            set_free(&g);
            return -1;
        }
        for (size_t i = 0; i <= s->mask; i++)
            if (s->used[i])
                set_put(&g, s->key[i]);
        set_free(s);
        *s = g;
    }
    size_t i = set_pos(s, k);
    if (!s->used[i]) {
        s->used[i] = 1;
        s->key[i] = k;
        s->n++;
    }
    return 0;
}

/* ---- registration ---- */

/* Whether a live chunk of namespace ns with fingerprint fp owns its slot:
 * the dedup-content rule compares whole fingerprints, so a chunk that only
 * shares the slot does not count. */
static bool content_live(const lmc_blend_matcher *m, uint64_t fp, uint64_t ns)
{
    uint32_t v = m->table[slot_of(fp, ns)];
    return v && m->e[v - 1].fp == fp && m->e[v - 1].ns == ns && m->e[v - 1].live;
}

/* Marks sel[i] for the chunks to register and returns how many (or -1 on
 * no memory): not known under their hash, and with dedup-content neither
 * known nor earlier in this job by their fingerprint. */
static long select_new(const lmc_blend_matcher *m, uint64_t ns, const uint64_t *fp,
                       const uint8_t *hashes, size_t first, size_t n, uint8_t *sel)
{
    u64set batch = {0};
    if (m->dedup && set_init(&batch, n - first) != 0) {
        set_free(&batch);
        return -1;
    }
    long count = 0;
    for (size_t i = first; i < n; i++) {
        uint64_t f = fp[i - first];
        if (find(m, ns, hashes + i * m->hash_len))
            continue;
        if (m->dedup) {
            if (set_has(&batch, f) || content_live(m, f, ns))
                continue;
            set_put(&batch, f); /* room for n - first keys: cannot grow */
        }
        sel[i - first] = 1;
        count++;
    }
    set_free(&batch);
    return count;
}

/* Takes the slot of each selected chunk (overwriting any older occupant:
 * the most recently registered chunk of a slot is the one matched). */
static size_t insert_selected(lmc_blend_matcher *m, uint64_t ns, const uint64_t *fp,
                              const uint8_t *hashes, size_t first, size_t n, const uint8_t *sel,
                              uint64_t position_offset)
{
    size_t done = 0;
    for (size_t i = first; i < n; i++) {
        const uint8_t *h = hashes + i * m->hash_len;
        if (!sel[i - first] || find(m, ns, h)) /* find: a hash twice in one job */
            continue;
        uint32_t v = alloc_entry(m);
        struct entry *e = &m->e[v - 1];
        e->fp = fp[i - first];
        e->ns = ns;
        e->old_st = position_offset + (uint64_t)i * m->cs;
        memcpy(e->hash, h, m->hash_len);
        e->live = 1;
        size_t b = bucket_of(m, ns, h);
        e->next = m->bucket[b];
        m->bucket[b] = v;
        m->table[slot_of(e->fp, ns)] = v;
        done++;
    }
    return done;
}

static int register_locked(lmc_blend_matcher *m, uint64_t ns, const uint64_t *fp,
                           const uint8_t *hashes, size_t first, size_t n, uint64_t offset,
                           size_t *n_registered)
{
    uint8_t *sel = calloc(n - first, 1);
    long want = sel ? select_new(m, ns, fp, hashes, first, n, sel) : -1;
    if (want < 0) {
        free(sel);
        return LMC_BLEND_ENOMEM;
    }
    if (m->live + (size_t)want > m->max) {
        m->refused += (uint64_t)want;
        free(sel);
        return LMC_BLEND_EFULL;
    }
    size_t done = insert_selected(m, ns, fp, hashes, first, n, sel, offset);
    m->live += done;
    m->registered += done;
    m->ever = m->ever || done > 0;
    *n_registered = done;
    free(sel);
    return LMC_BLEND_OK;
}

int lmc_blend_matcher_register(lmc_blend_matcher *m, const lmc_blend_ns *ns,
                               const uint64_t *tokens, size_t n_tokens, const uint8_t *hashes,
                               size_t n_hashes, size_t start_chunk, uint64_t position_offset,
                               size_t *n_registered)
{
    if (!m || !ns_ok(ns) || !n_registered || (n_tokens && (!tokens || !hashes)))
        return LMC_BLEND_EINVAL;
    *n_registered = 0;
    size_t n = n_tokens / m->cs;
    if (n == 0 || start_chunk >= n)
        return LMC_BLEND_OK;
    uint64_t last_end; /* old_st + chunk_size of the last chunk must fit */
    if (n_hashes < n || !lmc_muladd_u64(n, m->cs, position_offset, &last_end))
        return LMC_BLEND_EINVAL;
    uint64_t *fp = malloc((n - start_chunk) * sizeof *fp); /* n <= n_tokens: no overflow */
    if (!fp)
        return LMC_BLEND_ENOMEM;
    for (size_t i = start_chunk; i < n; i++)
        fp[i - start_chunk] = lmc_blend_fingerprint(tokens + i * m->cs, m->cs);
    uint64_t d = ns_digest(ns);
    pthread_rwlock_wrlock(&m->lock);
    int rc = register_locked(m, d, fp, hashes, start_chunk, n, position_offset, n_registered);
    pthread_rwlock_unlock(&m->lock);
    free(fp);
    return rc;
}

/* ---- matching ---- */

typedef struct {
    lmc_blend_candidate *v;
    size_t n, cap;
} match_list;

static int push_match(match_list *l, const struct entry *e, size_t hash_len, uint64_t cur_st)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 16;
        lmc_blend_candidate *v = realloc(l->v, cap * sizeof *v); /* cap <= 2 * max_chunks */
        if (!v)
            return -1;
        l->v = v;
        l->cap = cap;
    }
    lmc_blend_candidate *r = &l->v[l->n++];
    memset(r, 0, sizeof *r);
    r->old_st = e->old_st;
    r->cur_st = cur_st;
    memcpy(r->hash, e->hash, hash_len);
    return 0;
}

/* Every window start in ascending order; a chunk is reported at its first
 * hit only, and a slot hit whose full fingerprint or namespace differs is
 * a bucket collision, not a match. */
static int probe_locked(const lmc_blend_matcher *m, uint64_t ns, const uint64_t *r, size_t np,
                        match_list *l)
{
    u64set seen;
    int rc = set_init(&seen, 16);
    for (size_t p = 0; rc == 0 && p < np; p++) {
        uint32_t v = m->table[slot_of(r[p], ns)];
        if (!v || set_has(&seen, v))
            continue;
        const struct entry *e = &m->e[v - 1];
        if (e->fp != r[p] || e->ns != ns || !e->live)
            continue;
        rc = set_put(&seen, v);
        if (rc == 0)
            rc = push_match(l, e, m->hash_len, p);
    }
    set_free(&seen);
    return rc;
}

int lmc_blend_matcher_match(lmc_blend_matcher *m, const lmc_blend_ns *ns, const uint64_t *tokens,
                            size_t n, lmc_blend_candidate **out, size_t *n_out)
{
    if (!m || !ns_ok(ns) || !out || !n_out || (n && !tokens))
        return LMC_BLEND_EINVAL;
    *out = NULL;
    *n_out = 0;
    if (n < m->cs)
        return LMC_BLEND_OK;
    size_t np = n - m->cs + 1;
    uint64_t bytes;
    uint64_t *r = lmc_mul_u64(np, sizeof *r, &bytes) && bytes <= SIZE_MAX ? malloc(bytes) : NULL;
    if (!r)
        return LMC_BLEND_ENOMEM;
    lmc_hash_poly_rolling(tokens, n, m->cs, r);
    uint64_t d = ns_digest(ns);
    match_list l = {0};
    int rc = 0;
    pthread_rwlock_rdlock(&m->lock);
    if (m->ever)
        rc = probe_locked(m, d, r, np, &l);
    pthread_rwlock_unlock(&m->lock);
    free(r);
    if (rc != 0) {
        free(l.v);
        return LMC_BLEND_ENOMEM;
    }
    *out = l.v;
    *n_out = l.n;
    return LMC_BLEND_OK;
}

/* ---- removal and strikes ---- */

bool lmc_blend_matcher_remove(lmc_blend_matcher *m, const lmc_blend_ns *ns, const uint8_t *hash)
{
    if (!m || !ns_ok(ns) || !hash)
        return false;
    uint64_t d = ns_digest(ns);
    pthread_rwlock_wrlock(&m->lock);
    uint32_t v = find(m, d, hash);
    if (v)
        remove_locked(m, v);
    pthread_rwlock_unlock(&m->lock);
    return v != 0;
}

void lmc_blend_matcher_found(lmc_blend_matcher *m, const lmc_blend_ns *ns, const uint8_t *hash)
{
    if (!m || !ns_ok(ns) || !hash)
        return;
    uint64_t d = ns_digest(ns);
    pthread_rwlock_wrlock(&m->lock);
    uint32_t v = find(m, d, hash);
    if (v)
        m->e[v - 1].strikes = 0;
    pthread_rwlock_unlock(&m->lock);
}

bool lmc_blend_matcher_stale(lmc_blend_matcher *m, const lmc_blend_ns *ns, const uint8_t *hash)
{
    if (!m || !ns_ok(ns) || !hash)
        return false;
    uint64_t d = ns_digest(ns);
    bool gone = false;
    pthread_rwlock_wrlock(&m->lock);
    uint32_t v = find(m, d, hash);
    if (v && ++m->e[v - 1].strikes >= LMC_BLEND_STRIKES) {
        remove_locked(m, v);
        gone = true;
    }
    pthread_rwlock_unlock(&m->lock);
    return gone;
}

lmc_blend_matcher_stats lmc_blend_matcher_get_stats(lmc_blend_matcher *m)
{
    lmc_blend_matcher_stats s = {0};
    if (!m)
        return s;
    pthread_rwlock_rdlock(&m->lock);
    s.live = m->live;
    s.max_chunks = m->max;
    s.registered = m->registered;
    s.refused = m->refused;
    s.removed = m->removed;
    s.near_full = m->live * 5 > m->max * 4;
    pthread_rwlock_unlock(&m->lock);
    return s;
}
