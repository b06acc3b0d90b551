/* The P2P serving side's lease registry (lease_registry.h; docs/p2p.md,
 * "Serving side").  An array of at most max_leases entries under one
 * mutex, chained into two hash indexes: by key, so that an unlock finds a
 * key's leases without a scan (a peer may unlock 16384 keys at a time while
 * 65536 are leased), and by start offset, so that the transfer channel's
 * check of a read of whole objects costs a lookup per object.  A range that
 * starts inside an object falls back to a scan. */

#include "modules/p2p/lease_registry.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define NONE UINT32_MAX

typedef struct {
    lmc_p2p_serve_held h;
    uint32_t next[2];   /* the next entry of its bucket, per index */
} entry;

enum { BY_KEY, BY_OFFSET };

struct lmc_p2p_serve_reg {
    pthread_mutex_t lock;
    entry *items;
    size_t n, cap, max;
    uint32_t *heads[2];   /* per index: 2^bits buckets, NONE when empty */
    unsigned bits;
    lmc_clock_ms_fn clock;
    void *clock_user;
};

static size_t bucket_of(const lmc_p2p_serve_reg *r, const lmc_p2p_serve_held *h, int index)
{
    uint64_t v = index == BY_KEY ? lmc_object_key_hash(&h->key) : h->lease.offset;
    return (size_t)((v * 0x9e3779b97f4a7c15ULL) >> (64 - r->bits));
}

static bool owned_by(const lmc_p2p_serve_held *h, const lmc_p2p_serve_owner *owner);

static size_t bucket_of_offset(const lmc_p2p_serve_reg *r, uint64_t offset)
{
    lmc_p2p_serve_held probe = {.lease.offset = offset};
    return bucket_of(r, &probe, BY_OFFSET);
}

lmc_p2p_serve_reg *lmc_p2p_serve_reg_new(size_t max_leases, lmc_clock_ms_fn clock,
                                         void *clock_user)
{
    if (max_leases == 0 || max_leases >= NONE)
        return NULL;
    lmc_p2p_serve_reg *r = calloc(1, sizeof *r);
    if (!r)
        return NULL;
    r->bits = 1;
    while (((size_t)1 << r->bits) < max_leases)
        r->bits++;
    for (int x = 0; x < 2; x++) {
        r->heads[x] = malloc(((size_t)1 << r->bits) * sizeof *r->heads[x]);
        if (!r->heads[x]) {
            free(r->heads[0]);
            free(r);
            return NULL;
        }
        for (size_t b = 0; b < ((size_t)1 << r->bits); b++)
            r->heads[x][b] = NONE;
    }
    pthread_mutex_init(&r->lock, NULL);
    r->max = max_leases;
    r->clock = clock ? clock : lmc_monotonic_ms;
    r->clock_user = clock_user;
    return r;
}

void lmc_p2p_serve_reg_free(lmc_p2p_serve_reg *r)
{
    if (!r)
        return;
    for (size_t i = 0; i < r->n; i++)
        lmc_keys_drop(&r->items[i].h.key, 1);
    pthread_mutex_destroy(&r->lock);
    free(r->heads[0]);
    free(r->heads[1]);
    free(r->items);
    free(r);
}

size_t lmc_p2p_serve_reg_room(lmc_p2p_serve_reg *r)
{
    pthread_mutex_lock(&r->lock);
    size_t room = r->max - r->n;
    pthread_mutex_unlock(&r->lock);
    return room;
}

/* Grows the array to hold `need` entries (need <= max).  Caller locks. */
static bool reserve(lmc_p2p_serve_reg *r, size_t need)
{
    if (need <= r->cap)
        return true;
    size_t cap = r->cap ? r->cap : 64;
    while (cap < need)
        cap *= 2;
    if (cap > r->max)
        cap = r->max;
    entry *items = realloc(r->items, cap * sizeof *items);
    if (!items)
        return false;
    r->items = items;
    r->cap = cap;
    return true;
}

bool lmc_p2p_serve_reg_add(lmc_p2p_serve_reg *r, const lmc_p2p_serve_held *held, size_t n)
{
    pthread_mutex_lock(&r->lock);
    bool ok = n <= r->max - r->n && reserve(r, r->n + n);
    for (size_t i = 0; ok && i < n; i++) {
        entry *e = &r->items[r->n];
        e->h = held[i];
        lmc_keys_hold(&e->h.key, 1);
        for (int x = 0; x < 2; x++) {
            uint32_t *head = &r->heads[x][bucket_of(r, &e->h, x)];
            e->next[x] = *head;
            *head = (uint32_t)r->n;
        }
        r->n++;
    }
    pthread_mutex_unlock(&r->lock);
    return ok;
}

/* The link that names entry i in index x.  Caller locks. */
static uint32_t *link_to(lmc_p2p_serve_reg *r, uint32_t i, int x)
{
    uint32_t *p = &r->heads[x][bucket_of(r, &r->items[i].h, x)];
    while (*p != i)
        p = &r->items[*p].next[x];
    return p;
}

/* Moves entry i out; the last entry takes its place.  Caller locks. */
static void remove_at(lmc_p2p_serve_reg *r, size_t i, lmc_p2p_serve_held *out)
{
    uint32_t last = (uint32_t)(r->n - 1);
    *out = r->items[i].h;
    for (int x = 0; x < 2; x++)
        *link_to(r, (uint32_t)i, x) = r->items[i].next[x];
    if (i != last) {
        for (int x = 0; x < 2; x++)
            *link_to(r, last, x) = (uint32_t)i;
        r->items[i] = r->items[last];
    }
    r->n--;
}

void lmc_p2p_serve_owner_set(lmc_p2p_serve_owner *o, const uint8_t *id, size_t len)
{
    memset(o, 0, sizeof *o);
    uint64_t h = 0xcbf29ce484222325ULL;   /* FNV-1a */
    for (size_t i = 0; i < len; i++)
        h = (h ^ id[i]) * 0x100000001b3ULL;
    o->hash = h;
    o->len = (uint8_t)(len > 255 ? 255 : len);
    memcpy(o->head, id, len < LMC_P2P_SERVE_OWNER_HEAD ? len : LMC_P2P_SERVE_OWNER_HEAD);
}

bool lmc_p2p_serve_owner_equal(const lmc_p2p_serve_owner *a, const lmc_p2p_serve_owner *b)
{
    return a->hash == b->hash && a->len == b->len && memcmp(a->head, b->head, sizeof a->head) == 0;
}

bool lmc_p2p_serve_reg_take(lmc_p2p_serve_reg *r, const lmc_object_key *key,
                            const lmc_p2p_serve_owner *owner, lmc_p2p_serve_held *out)
{
    lmc_p2p_serve_held probe = {.key = *key};
    pthread_mutex_lock(&r->lock);
    uint32_t best = NONE;
    for (uint32_t i = r->heads[BY_KEY][bucket_of(r, &probe, BY_KEY)]; i != NONE;
         i = r->items[i].next[BY_KEY])
        if (lmc_object_key_equal(&r->items[i].h.key, key) &&
            (!owner || lmc_p2p_serve_owner_equal(&r->items[i].h.owner, owner)) &&
            (best == NONE || r->items[i].h.lease.expiry_ms < r->items[best].h.lease.expiry_ms))
            best = i;
    bool found = best != NONE;
    if (found)
        remove_at(r, best, out);
    pthread_mutex_unlock(&r->lock);
    return found;
}

bool lmc_p2p_serve_reg_take_at(lmc_p2p_serve_reg *r, uint64_t offset,
                               const lmc_p2p_serve_owner *owner, lmc_p2p_serve_held *out)
{
    pthread_mutex_lock(&r->lock);
    uint32_t hit = NONE;
    for (uint32_t i = r->heads[BY_OFFSET][bucket_of_offset(r, offset)]; i != NONE && hit == NONE;
         i = r->items[i].next[BY_OFFSET])
        if (r->items[i].h.lease.offset == offset && owned_by(&r->items[i].h, owner))
            hit = i;
    if (hit != NONE)
        remove_at(r, hit, out);
    pthread_mutex_unlock(&r->lock);
    return hit != NONE;
}

static size_t take_where(lmc_p2p_serve_reg *r, lmc_p2p_serve_held *out, size_t cap,
                         bool expired_only)
{
    pthread_mutex_lock(&r->lock);
    int64_t now = r->clock(r->clock_user);
    size_t got = 0;
    for (size_t i = 0; i < r->n && got < cap;) {
        if (!expired_only || r->items[i].h.lease.expiry_ms <= now)
            remove_at(r, i, &out[got++]);   /* item i is now another: look again */
        else
            i++;
    }
    pthread_mutex_unlock(&r->lock);
    return got;
}

size_t lmc_p2p_serve_reg_take_expired(lmc_p2p_serve_reg *r, lmc_p2p_serve_held *out, size_t cap)
{
    return take_where(r, out, cap, true);
}

size_t lmc_p2p_serve_reg_take_all(lmc_p2p_serve_reg *r, lmc_p2p_serve_held *out, size_t cap)
{
    return take_where(r, out, cap, false);
}

static bool live_holds(const lmc_lease *l, uint64_t pos, int64_t now)
{
    return l->expiry_ms > now && pos >= l->offset && pos - l->offset < l->object_size;
}

/* The end of a live leased range holding byte `pos`, or 0 when none does:
 * one starting at pos through the offset index, else by a scan.  Caller
 * locks. */
static bool owned_by(const lmc_p2p_serve_held *h, const lmc_p2p_serve_owner *owner)
{
    return !owner || lmc_p2p_serve_owner_equal(&h->owner, owner);
}

static uint64_t live_end_at(const lmc_p2p_serve_reg *r, const lmc_p2p_serve_owner *owner,
                            uint64_t pos, int64_t now)
{
    for (uint32_t i = r->heads[BY_OFFSET][bucket_of_offset(r, pos)]; i != NONE;
         i = r->items[i].next[BY_OFFSET]) {
        const lmc_lease *l = &r->items[i].h.lease;
        if (l->offset == pos && live_holds(l, pos, now) && owned_by(&r->items[i].h, owner))
            return l->offset + l->object_size;
    }
    for (size_t i = 0; i < r->n; i++) {
        const lmc_lease *l = &r->items[i].h.lease;
        if (live_holds(l, pos, now) && owned_by(&r->items[i].h, owner))
            return l->offset + l->object_size;
    }
    return 0;
}

bool lmc_p2p_serve_reg_covers(lmc_p2p_serve_reg *r, uint64_t offset, uint64_t len)
{
    return lmc_p2p_serve_reg_covers_for(r, NULL, offset, len);
}

bool lmc_p2p_serve_reg_covers_for(lmc_p2p_serve_reg *r, const lmc_p2p_serve_owner *owner,
                                  uint64_t offset, uint64_t len)
{
    if (len == 0 || offset + len < offset)
        return false;
    uint64_t end = offset + len;
    pthread_mutex_lock(&r->lock);
    int64_t now = r->clock(r->clock_user);
    uint64_t pos = offset;
    while (pos < end) {
        uint64_t next = live_end_at(r, owner, pos, now);
        if (next == 0)
            break;
        pos = next;
    }
    pthread_mutex_unlock(&r->lock);
    return pos >= end;
}

void lmc_p2p_serve_reg_counts(lmc_p2p_serve_reg *r, size_t *leases, uint64_t *bytes)
{
    pthread_mutex_lock(&r->lock);
    uint64_t b = 0;
    for (size_t i = 0; i < r->n; i++)
        b += r->items[i].h.lease.object_size;
    *leases = r->n;
    *bytes = b;
    pthread_mutex_unlock(&r->lock);
}
