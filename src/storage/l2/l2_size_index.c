/* See l2_size_index.h. */
#include "storage/l2/l2_size_index.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "core/grow.h"
#include "blake3.h"

typedef struct {
    uint64_t id;       /* 0 = empty slot */
    uint64_t size;
} slot;

struct lmc_l2_size_index {
    pthread_mutex_t mu;          /* guards everything below */
    slot *slots;
    size_t cap, count;           /* cap: a power of two */
    uint64_t used, reserved, capacity;
};

#define INITIAL_SLOTS 1024u

lmc_l2_size_index *lmc_l2_size_index_new(uint64_t capacity_bytes)
{
    lmc_l2_size_index *ix = calloc(1, sizeof *ix);
    if (!ix)
        return NULL;
    ix->slots = calloc(INITIAL_SLOTS, sizeof *ix->slots);
    if (!ix->slots) {
        free(ix);
        return NULL;
    }
    ix->cap = INITIAL_SLOTS;
    ix->capacity = capacity_bytes;
    pthread_mutex_init(&ix->mu, NULL);
    return ix;
}

void lmc_l2_size_index_free(lmc_l2_size_index *ix)
{
    if (!ix)
        return;
    pthread_mutex_destroy(&ix->mu);
    free(ix->slots);
    free(ix);
}

uint64_t lmc_l2_key_id(const char *name, size_t len)
{
    blake3_hasher h;
    uint64_t id;
    blake3_hasher_init(&h);
    blake3_hasher_update(&h, name, len);
    blake3_hasher_finalize(&h, (uint8_t *)&id, sizeof id);
    return id ? id : 1;
}

/* ---- the table (callers hold ix->mu) --------------------------------------- */

static size_t home(const lmc_l2_size_index *ix, uint64_t id)
{
    return (size_t)id & (ix->cap - 1); /* ids are hash output already */
}

static slot *find(lmc_l2_size_index *ix, uint64_t id)
{
    for (size_t i = home(ix, id);; i = (i + 1) & (ix->cap - 1)) {
        if (ix->slots[i].id == id)
            return &ix->slots[i];
        if (ix->slots[i].id == 0)
            return NULL;
    }
}

/* Inserts a new id; the caller made room. */
static void insert_new(lmc_l2_size_index *ix, uint64_t id, uint64_t size)
{
    size_t i = home(ix, id);
    while (ix->slots[i].id != 0)
        i = (i + 1) & (ix->cap - 1);
    ix->slots[i] = (slot){id, size};
    ix->count++;
}

/* Room for `more` new ids at a load of at most 3/4. */
static int make_room(lmc_l2_size_index *ix, size_t more)
{
    size_t cap = ix->cap;
    while ((ix->count + more) * 4 > cap * 3)
        cap *= 2;
    if (cap == ix->cap)
        return 0;
    slot *old = ix->slots, *fresh = calloc(cap, sizeof *fresh);
    if (!fresh)
        return -1;
    size_t old_cap = ix->cap;
    ix->slots = fresh;
    ix->cap = cap;
    ix->count = 0;
    for (size_t i = 0; i < old_cap; i++) {
        if (old[i].id)
            insert_new(ix, old[i].id, old[i].size);
    }
    free(old);
    return 0;
}

/* Backward-shift deletion keeps every probe run unbroken without tombstones. */
static void remove_at(lmc_l2_size_index *ix, size_t hole)
{
    size_t mask = ix->cap - 1;
    for (size_t i = (hole + 1) & mask; ix->slots[i].id; i = (i + 1) & mask) {
        size_t want = home(ix, ix->slots[i].id);
        /* Move slot i into the hole unless its home lies cyclically in (hole, i]. */
        bool stays = hole <= i ? (hole < want && want <= i) : (hole < want || want <= i);
        if (!stays) {
            ix->slots[hole] = ix->slots[i];
            hole = i;
        }
    }
    ix->slots[hole] = (slot){0, 0};
    ix->count--;
}

static void set_size(lmc_l2_size_index *ix, uint64_t id, uint64_t size)
{
    slot *s = find(ix, id);
    if (s) {
        ix->used = ix->used - s->size + size;
        s->size = size;
    } else {
        insert_new(ix, id, size);
        ix->used += size;
    }
}

/* ---- operations -------------------------------------------------------------- */

struct lmc_l2_reservation {
    size_t n, settled;           /* settled and ok: under ix->mu */
    bool ok;
    uint64_t *ids, *sizes, *grow;
};

static void reservation_free(lmc_l2_reservation *r)
{
    if (!r)
        return;
    free(r->ids);
    free(r->sizes);
    free(r->grow);
    free(r);
}

lmc_l2_reservation *lmc_l2_size_index_reserve_batch(lmc_l2_size_index *ix, const uint64_t *ids,
                                                    const uint64_t *sizes, size_t n)
{
    lmc_l2_reservation *r = calloc(1, sizeof *r);
    size_t m = n ? n : 1;
    if (!r || !(r->ids = malloc(m * sizeof *r->ids)) ||
        !(r->sizes = malloc(m * sizeof *r->sizes)) || !(r->grow = malloc(m * sizeof *r->grow))) {
        reservation_free(r);
        return NULL;
    }
    r->n = n;
    r->ok = true;
    memcpy(r->ids, ids, n * sizeof *ids);
    memcpy(r->sizes, sizes, n * sizeof *sizes);
    pthread_mutex_lock(&ix->mu);
    uint64_t grow = 0;
    for (size_t i = 0; i < n; i++) {
        const slot *s = find(ix, ids[i]);
        uint64_t old = s ? s->size : 0;
        r->grow[i] = sizes[i] > old ? sizes[i] - old : 0;
        grow += r->grow[i];
    }
    bool fits = (!ix->capacity || ix->used + ix->reserved + grow <= ix->capacity) &&
                make_room(ix, n) == 0;
    if (fits)
        ix->reserved += grow;
    pthread_mutex_unlock(&ix->mu);
    if (!fits) {
        reservation_free(r);
        return NULL;
    }
    return r;
}

/* Object names are at most this long; a longer one is not an object of
 * ours (the adapters refuse to store it). */
#define NAME_MAX_LEN 1024

lmc_l2_reservation *lmc_l2_size_index_reserve_keys(lmc_l2_size_index *ix,
                                                   const lmc_object_key *keys,
                                                   const uint64_t *sizes, size_t n,
                                                   bool *refused)
{
    *refused = false;
    uint64_t *ids = malloc((n ? n : 1) * sizeof *ids);
    if (!ids)
        return NULL;
    for (size_t i = 0; i < n; i++) {
        char name[NAME_MAX_LEN];
        int len = lmc_object_key_to_string(&keys[i], name, sizeof name);
        if (len <= 0) {
            free(ids);
            return NULL;
        }
        ids[i] = lmc_l2_key_id(name, (size_t)len);
    }
    lmc_l2_reservation *r = lmc_l2_size_index_reserve_batch(ix, ids, sizes, n);
    *refused = !r;
    free(ids);
    return r;
}

uint64_t lmc_l2_reservation_bytes(const lmc_l2_reservation *r)
{
    uint64_t bytes = 0;
    for (size_t i = 0; i < r->n; i++)
        bytes += r->sizes[i];
    return bytes;
}

void lmc_l2_size_index_settle(lmc_l2_size_index *ix, lmc_l2_reservation *r, size_t from,
                              size_t n, const uint8_t *written, bool ok)
{
    pthread_mutex_lock(&ix->mu);
    for (size_t i = from; i < from + n && i < r->n; i++) {
        ix->reserved -= r->grow[i];
        r->grow[i] = 0; /* settled: release() must not give it back again */
        if (written[i - from] && make_room(ix, 1) == 0)
            set_size(ix, r->ids[i], r->sizes[i]);
    }
    r->settled += n;
    r->ok = r->ok && ok;
    pthread_mutex_unlock(&ix->mu);
}

bool lmc_l2_size_index_release(lmc_l2_size_index *ix, lmc_l2_reservation *r)
{
    pthread_mutex_lock(&ix->mu);
    for (size_t i = 0; i < r->n; i++)
        ix->reserved -= r->grow[i];
    bool ok = r->ok && r->settled == r->n;
    pthread_mutex_unlock(&ix->mu);
    reservation_free(r);
    return ok;
}

int lmc_l2_size_index_put(lmc_l2_size_index *ix, uint64_t id, uint64_t size)
{
    pthread_mutex_lock(&ix->mu);
    int rc = make_room(ix, 1);
    if (rc == 0)
        set_size(ix, id, size);
    pthread_mutex_unlock(&ix->mu);
    return rc;
}

bool lmc_l2_size_index_forget(lmc_l2_size_index *ix, uint64_t id)
{
    pthread_mutex_lock(&ix->mu);
    slot *s = find(ix, id);
    if (s) {
        ix->used -= s->size;
        remove_at(ix, (size_t)(s - ix->slots));
    }
    pthread_mutex_unlock(&ix->mu);
    return s != NULL;
}

void lmc_l2_size_index_usage(lmc_l2_size_index *ix, lmc_l2_usage *u)
{
    pthread_mutex_lock(&ix->mu);
    *u = (lmc_l2_usage){.used_bytes = ix->used, .capacity_bytes = ix->capacity,
                        .num_keys = ix->count};
    pthread_mutex_unlock(&ix->mu);
}

/* ---- objects found at start-up -------------------------------------------------- */

int lmc_l2_found_add(lmc_l2_found_list *l, const lmc_object_key *k, uint64_t size,
                     int64_t batch, int64_t order)
{
    if (lmc_grow_array(&l->v, &l->cap, l->n + 1, sizeof *l->v, 1024) != 0)
        return -1;
    l->v[l->n++] = (lmc_l2_found){*k, size, batch, order};
    return 0;
}

static int by_batch_then_order(const void *a, const void *b)
{
    const lmc_l2_found *x = a, *y = b;
    if (x->batch != y->batch)
        return x->batch < y->batch ? -1 : 1;
    return (x->order > y->order) - (x->order < y->order);
}

void lmc_l2_found_hand_over(lmc_l2_found_list *l, lmc_l2_recovered_fn fn, void *user)
{
    enum { MAX_BATCH = 4096 };
    lmc_object_key *keys = malloc(MAX_BATCH * sizeof *keys);
    uint64_t *sizes = malloc(MAX_BATCH * sizeof *sizes);
    if (keys && sizes && l->n)
        qsort(l->v, l->n, sizeof *l->v, by_batch_then_order);
    for (size_t i = 0; keys && sizes && i < l->n;) {
        size_t m = 0;
        int64_t batch = l->v[i].batch;
        for (; i < l->n && l->v[i].batch == batch && m < MAX_BATCH; i++, m++) {
            keys[m] = l->v[i].key;
            sizes[m] = l->v[i].size;
        }
        fn(user, keys, sizes, m);
    }
    free(keys);
    free(sizes);
    lmc_l2_found_clear(l);
}

void lmc_l2_found_clear(lmc_l2_found_list *l)
{
    free(l->v);
    *l = (lmc_l2_found_list){0};
}
