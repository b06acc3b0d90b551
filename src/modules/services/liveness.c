#include "modules/services/liveness.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* An open-addressing table keyed by instance id (linear probing, deletion
 * by backward shift: no tombstones), so every op's touch is O(1) however
 * many ids it holds.  Registered instances stay until forgotten; ids only
 * a PING named are kept in a ring of LMC_LIVENESS_MAX_UNREGISTERED, the
 * oldest first heard from dropped first (docs/security.md, "Bounds"). */
typedef struct {
    lmc_liveness_entry e;
    bool used, registered;
} slot;

struct lmc_liveness {
    pthread_mutex_t lock;
    slot *slots;
    size_t cap, count;          /* cap: a power of two */
    int64_t ring[LMC_LIVENESS_MAX_UNREGISTERED];
    size_t ring_head, ring_len; /* unregistered ids, oldest at ring_head */
};

lmc_liveness *lmc_liveness_new(void)
{
    lmc_liveness *lv = calloc(1, sizeof *lv);
    if (!lv)
        return NULL;
    lv->cap = 64;
    lv->slots = calloc(lv->cap, sizeof *lv->slots);
    if (!lv->slots) {
        free(lv);
        return NULL;
    }
    pthread_mutex_init(&lv->lock, NULL);
    return lv;
}

void lmc_liveness_free(lmc_liveness *lv)
{
    if (!lv)
        return;
    pthread_mutex_destroy(&lv->lock);
    free(lv->slots);
    free(lv);
}

static size_t home(const lmc_liveness *lv, int64_t id)
{
    uint64_t h = (uint64_t)id * 0x9e3779b97f4a7c15ull;   /* Fibonacci hashing */
    return (size_t)(h >> 32) & (lv->cap - 1);
}

static slot *find_locked(lmc_liveness *lv, int64_t id)
{
    for (size_t i = home(lv, id);; i = (i + 1) & (lv->cap - 1)) {
        if (!lv->slots[i].used)
            return NULL;
        if (lv->slots[i].e.instance_id == id)
            return &lv->slots[i];
    }
}

static void remove_locked(lmc_liveness *lv, slot *s)
{
    size_t hole = (size_t)(s - lv->slots), mask = lv->cap - 1;
    lv->slots[hole].used = false;
    lv->count--;
    /* Backward shift: pull later members of the run into the hole when the
     * hole lies between their home and where they sit. */
    for (size_t i = (hole + 1) & mask; lv->slots[i].used; i = (i + 1) & mask) {
        size_t h = home(lv, lv->slots[i].e.instance_id);
        if (((i - h) & mask) >= ((i - hole) & mask)) {
            lv->slots[hole] = lv->slots[i];
            lv->slots[i].used = false;
            hole = i;
        }
    }
}

static int grow_locked(lmc_liveness *lv)
{
    size_t old_cap = lv->cap;
    slot *old = lv->slots;
    slot *fresh = calloc(old_cap * 2, sizeof *fresh);
    if (!fresh)
        return -1;
    lv->slots = fresh;
    lv->cap = old_cap * 2;
    for (size_t i = 0; i < old_cap; i++) {
        if (!old[i].used)
            continue;
        size_t j = home(lv, old[i].e.instance_id);
        while (lv->slots[j].used)
            j = (j + 1) & (lv->cap - 1);
        lv->slots[j] = old[i];
    }
    free(old);
    return 0;
}

static slot *insert_locked(lmc_liveness *lv, int64_t id)
{
    if ((lv->count + 1) * 10 > lv->cap * 7 && grow_locked(lv) != 0)
        return NULL;
    size_t i = home(lv, id);
    while (lv->slots[i].used)
        i = (i + 1) & (lv->cap - 1);
    lv->slots[i] = (slot){.e = {.instance_id = id}, .used = true};
    lv->count++;
    return &lv->slots[i];
}

/* Keeps the ring of unregistered ids bounded: the oldest goes when full
 * (unless it has been registered or forgotten since). */
static void remember_unregistered_locked(lmc_liveness *lv, int64_t id)
{
    if (lv->ring_len == LMC_LIVENESS_MAX_UNREGISTERED) {
        int64_t oldest = lv->ring[lv->ring_head];
        lv->ring_head = (lv->ring_head + 1) % LMC_LIVENESS_MAX_UNREGISTERED;
        lv->ring_len--;
        slot *s = find_locked(lv, oldest);
        if (s && !s->registered)
            remove_locked(lv, s);
    }
    lv->ring[(lv->ring_head + lv->ring_len++) % LMC_LIVENESS_MAX_UNREGISTERED] = id;
}

int lmc_liveness_register(lmc_liveness *lv, int64_t instance_id, int64_t now_ms)
{
    pthread_mutex_lock(&lv->lock);
    slot *s = find_locked(lv, instance_id);
    if (!s)
        s = insert_locked(lv, instance_id);
    if (s) {
        s->registered = true;
        s->e.last_seen_ms = now_ms;
    }
    pthread_mutex_unlock(&lv->lock);
    return s ? 0 : -1;
}

int lmc_liveness_touch(lmc_liveness *lv, int64_t instance_id, int64_t now_ms, bool ping)
{
    int rc = 0;
    pthread_mutex_lock(&lv->lock);
    slot *s = find_locked(lv, instance_id);
    if (!s && ping) {   /* a worker may ping before it registers: remember, bounded */
        s = insert_locked(lv, instance_id);
        if (s)
            remember_unregistered_locked(lv, instance_id);
        else
            rc = -1;
    }
    if (s) {
        s->e.last_seen_ms = now_ms;
        s->e.pinged = s->e.pinged || ping;
    }
    pthread_mutex_unlock(&lv->lock);
    return rc;
}

bool lmc_liveness_get(lmc_liveness *lv, int64_t instance_id, lmc_liveness_entry *out)
{
    pthread_mutex_lock(&lv->lock);
    slot *s = find_locked(lv, instance_id);
    if (s)
        *out = s->e;
    pthread_mutex_unlock(&lv->lock);
    return s != NULL;
}

void lmc_liveness_forget(lmc_liveness *lv, int64_t instance_id)
{
    pthread_mutex_lock(&lv->lock);
    slot *s = find_locked(lv, instance_id);
    if (s)
        remove_locked(lv, s);   /* a ring entry left behind is skipped when it comes due */
    pthread_mutex_unlock(&lv->lock);
}

size_t lmc_liveness_count(lmc_liveness *lv)
{
    pthread_mutex_lock(&lv->lock);
    size_t n = lv->count;
    pthread_mutex_unlock(&lv->lock);
    return n;
}
