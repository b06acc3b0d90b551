/* The P2P serving side's lease registry (lease_registry.h; docs/p2p.md,
 * "Serving side").  A flat array under one mutex: it holds at most
 * max_leases entries, and its one hot reader (the transfer channel's
 * may-read check) scans it, which is cheap next to the read it guards. */
#include "modules/p2p/lease_registry.h"

#include <pthread.h>
#include <stdlib.h>

struct lmc_p2p_serve_reg {
    pthread_mutex_t lock;
    lmc_p2p_serve_held *items;
    size_t n, cap, max;
    lmc_clock_ms_fn clock;
    void *clock_user;
};

lmc_p2p_serve_reg *lmc_p2p_serve_reg_new(size_t max_leases, lmc_clock_ms_fn clock,
                                         void *clock_user)
{
    if (max_leases == 0)
        return NULL;
    lmc_p2p_serve_reg *r = calloc(1, sizeof *r);
    if (!r)
        return NULL;
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
        lmc_keys_drop(&r->items[i].key, 1);
    pthread_mutex_destroy(&r->lock);
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
    lmc_p2p_serve_held *items = realloc(r->items, cap * sizeof *items);
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
    if (ok) {
        for (size_t i = 0; i < n; i++) {
            r->items[r->n + i] = held[i];
            lmc_keys_hold(&held[i].key, 1);
        }
        r->n += n;
    }
    pthread_mutex_unlock(&r->lock);
    return ok;
}

/* Moves entry i out (the last entry takes its place).  Caller locks. */
static void remove_at(lmc_p2p_serve_reg *r, size_t i, lmc_p2p_serve_held *out)
{
    *out = r->items[i];
    r->items[i] = r->items[--r->n];
}

bool lmc_p2p_serve_reg_take(lmc_p2p_serve_reg *r, const lmc_object_key *key,
                            lmc_p2p_serve_held *out)
{
    pthread_mutex_lock(&r->lock);
    size_t best = r->n;
    for (size_t i = 0; i < r->n; i++)
        if (lmc_object_key_equal(&r->items[i].key, key) &&
            (best == r->n || r->items[i].lease.expiry_ms < r->items[best].lease.expiry_ms))
            best = i;
    bool found = best < r->n;
    if (found)
        remove_at(r, best, out);
    pthread_mutex_unlock(&r->lock);
    return found;
}

static size_t take_where(lmc_p2p_serve_reg *r, lmc_p2p_serve_held *out, size_t cap,
                         bool expired_only)
{
    pthread_mutex_lock(&r->lock);
    int64_t now = r->clock(r->clock_user);
    size_t got = 0;
    for (size_t i = 0; i < r->n && got < cap;) {
        if (!expired_only || r->items[i].lease.expiry_ms <= now)
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

/* The end of a live leased range holding byte `pos`, or 0 when none does.
 * Caller locks. */
static uint64_t live_end_at(const lmc_p2p_serve_reg *r, uint64_t pos, int64_t now)
{
    for (size_t i = 0; i < r->n; i++) {
        const lmc_lease *l = &r->items[i].lease;
        if (l->expiry_ms > now && pos >= l->offset && pos - l->offset < l->object_size)
            return l->offset + l->object_size;
    }
    return 0;
}

bool lmc_p2p_serve_reg_covers(lmc_p2p_serve_reg *r, uint64_t offset, uint64_t len)
{
    if (len == 0 || offset + len < offset)
        return false;
    uint64_t end = offset + len;
    pthread_mutex_lock(&r->lock);
    int64_t now = r->clock(r->clock_user);
    uint64_t pos = offset;
    while (pos < end) {
        uint64_t next = live_end_at(r, pos, now);
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
        b += r->items[i].lease.object_size;
    *leases = r->n;
    *bytes = b;
    pthread_mutex_unlock(&r->lock);
}
