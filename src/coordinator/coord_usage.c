/* The usage view per (salt, tier) and each salt's L2 LRU, fed by the
 * event stream (docs/coordinator.md, "Usage and eviction"). */
#include <stdlib.h>

#include "coordinator/coord_state.h"

static void lru_unlink(coordinator_state *s, coordinator_salt *sa, uint32_t idx)
{
    coordinator_entry *e = &s->keys.e[idx];
    if (e->lru_prev != COORD_NONE)
        s->keys.e[e->lru_prev].lru_next = e->lru_next;
    else
        sa->lru_head = e->lru_next;
    if (e->lru_next != COORD_NONE)
        s->keys.e[e->lru_next].lru_prev = e->lru_prev;
    else
        sa->lru_tail = e->lru_prev;
    e->lru_prev = e->lru_next = COORD_NONE;
}

static void lru_push_tail(coordinator_state *s, coordinator_salt *sa, uint32_t idx)
{
    coordinator_entry *e = &s->keys.e[idx];
    e->lru_prev = sa->lru_tail;
    e->lru_next = COORD_NONE;
    if (sa->lru_tail != COORD_NONE)
        s->keys.e[sa->lru_tail].lru_next = idx;
    else
        sa->lru_head = idx;
    sa->lru_tail = idx;
}

/* Keeps the list ordered by touch: a backfilled or reloaded key goes
 * before the first key touched later than it.  A key never touched (the
 * startup resync's backfill) is as old as it gets: it goes first at once,
 * not after a walk past every key the stream reported, which made a
 * backfill of n keys cost n times the list. */
static void lru_insert_ordered(coordinator_state *s, coordinator_salt *sa, uint32_t idx)
{
    coordinator_entry *e = &s->keys.e[idx];
    uint32_t after = e->touch == 0 ? COORD_NONE : sa->lru_tail;
    while (after != COORD_NONE && s->keys.e[after].touch > e->touch)
        after = s->keys.e[after].lru_prev;
    e->lru_prev = after;
    e->lru_next = after == COORD_NONE ? sa->lru_head : s->keys.e[after].lru_next;
    if (e->lru_next != COORD_NONE)
        s->keys.e[e->lru_next].lru_prev = idx;
    else
        sa->lru_tail = idx;
    if (after != COORD_NONE)
        s->keys.e[after].lru_next = idx;
    else
        sa->lru_head = idx;
}

static void add_l2(coordinator_state *s, coordinator_salt *sa, coordinator_entry *e, uint64_t size)
{
    e->flags |= COORD_IN_L2;
    e->l2_size = size;
    sa->l2_bytes += size;
    sa->l2_count++;
    s->l2_bytes += size;
    s->l2_entries++;
}

int coordinator_usage_l2_store(coordinator_state *s, uint32_t idx, uint64_t size, uint32_t backend,
                         bool shared)
{
    coordinator_entry *e = &s->keys.e[idx];
    coordinator_salt *sa = coordinator_salt_at(s, e->salt);
    if (!sa)
        return -1;
    e = &s->keys.e[idx];
    if (e->flags & COORD_IN_L2) {
        sa->l2_bytes = sa->l2_bytes - e->l2_size + size;
        s->l2_bytes = s->l2_bytes - e->l2_size + size;
        e->l2_size = size;
        lru_unlink(s, sa, idx);
    } else {
        add_l2(s, sa, e, size);
    }
    e->l2_backend = (uint16_t)backend;
    e->flags = (uint8_t)((e->flags & ~COORD_L2_SHARED) | (shared ? COORD_L2_SHARED : 0));
    e->touch = ++s->clock;
    lru_push_tail(s, sa, idx);
    return 0;
}

void coordinator_usage_l2_touch(coordinator_state *s, uint32_t idx)
{
    coordinator_entry *e = &s->keys.e[idx];
    if (!(e->flags & COORD_IN_L2))
        return;
    coordinator_salt *sa = &s->salt[e->salt];
    e->touch = ++s->clock;
    lru_unlink(s, sa, idx);
    lru_push_tail(s, sa, idx);
}

void coordinator_usage_l2_delete(coordinator_state *s, uint32_t idx)
{
    coordinator_entry *e = &s->keys.e[idx];
    if (e->flags & COORD_IN_L2) {
        coordinator_salt *sa = &s->salt[e->salt];
        lru_unlink(s, sa, idx);
        sa->l2_bytes -= e->l2_size;
        sa->l2_count--;
        s->l2_bytes -= e->l2_size;
        s->l2_entries--;
        e->l2_size = 0;
        e->flags &= (uint8_t)~(COORD_IN_L2 | COORD_L2_SHARED);
    }
    coordinator_keys_release(&s->keys, idx);
}

static int l2_place(coordinator_state *s, uint32_t idx, uint64_t size, uint32_t backend,
                    uint64_t touch, bool ordered)
{
    coordinator_entry *e = &s->keys.e[idx];
    if (e->flags & COORD_IN_L2)
        return 0;
    coordinator_salt *sa = coordinator_salt_at(s, e->salt);
    if (!sa)
        return -1;
    e = &s->keys.e[idx];
    add_l2(s, sa, e, size);
    e->l2_backend = (uint16_t)backend;
    e->touch = touch;
    if (touch > s->clock)
        s->clock = touch;
    if (ordered)
        lru_insert_ordered(s, sa, idx);
    else
        lru_push_tail(s, sa, idx);
    return 0;
}

int coordinator_usage_l2_insert_at(coordinator_state *s, uint32_t idx, uint64_t size, uint32_t backend,
                             uint64_t touch)
{
    return l2_place(s, idx, size, backend, touch, true);
}

int coordinator_usage_l2_append(coordinator_state *s, uint32_t idx, uint64_t size, uint32_t backend,
                          uint64_t touch)
{
    return l2_place(s, idx, size, backend, touch, false);
}

static int by_touch(const void *a, const void *b, void *arg)
{
    const coordinator_entry *e = arg;
    uint32_t i = *(const uint32_t *)a, j = *(const uint32_t *)b;
    uint64_t x = e[i].touch, y = e[j].touch;
    return x != y ? (x > y) - (x < y) : (i > j) - (i < j); /* ties: a fixed order */
}

int coordinator_usage_l2_sort(coordinator_state *s)
{
    uint32_t *order = NULL;
    size_t cap = 0;
    for (uint32_t salt = 0; salt < s->salt_cap; salt++) {
        coordinator_salt *sa = &s->salt[salt];
        if (sa->l2_count > cap) {
            uint32_t *grown = realloc(order, sa->l2_count * sizeof *order);
            if (!grown)
                return free(order), -1;
            order = grown;
            cap = sa->l2_count;
        }
        size_t n = 0;
        for (uint32_t i = sa->lru_head; i != COORD_NONE && n < cap; i = s->keys.e[i].lru_next)
            order[n++] = i;
        qsort_r(order, n, sizeof *order, by_touch, s->keys.e);
        sa->lru_head = sa->lru_tail = COORD_NONE;
        for (size_t i = 0; i < n; i++)
            lru_push_tail(s, sa, order[i]);
    }
    free(order);
    return 0;
}

static coordinator_l1_place *find_place(coordinator_entry *e, uint32_t inst)
{
    for (uint16_t i = 0; i < e->n_l1; i++)
        if (e->l1[i].instance == inst)
            return &e->l1[i];
    return NULL;
}

int coordinator_usage_l1_store(coordinator_state *s, uint32_t idx, uint32_t inst, uint32_t backend,
                         uint64_t size)
{
    coordinator_entry *e = &s->keys.e[idx];
    coordinator_salt *sa = coordinator_salt_at(s, e->salt);
    if (!sa)
        return -1;
    e = &s->keys.e[idx];
    coordinator_l1_place *p = find_place(e, inst);
    if (!p) {
        if (e->n_l1 == UINT16_MAX)
            return -1;
        coordinator_l1_place *grown = realloc(e->l1, (e->n_l1 + 1u) * sizeof *grown);
        if (!grown)
            return -1;
        e->l1 = grown;
        p = &e->l1[e->n_l1++];
        *p = (coordinator_l1_place){.instance = inst};
        sa->l1_count++;
        s->l1_entries++;
    }
    sa->l1_bytes = sa->l1_bytes - p->size + size;
    s->l1_bytes = s->l1_bytes - p->size + size;
    p->size = size;
    p->backend = backend;
    return 0;
}

static void drop_place(coordinator_state *s, coordinator_entry *e, coordinator_l1_place *p)
{
    coordinator_salt *sa = &s->salt[e->salt];
    sa->l1_bytes -= p->size;
    sa->l1_count--;
    s->l1_bytes -= p->size;
    s->l1_entries--;
    *p = e->l1[--e->n_l1];
    if (!e->n_l1) {
        free(e->l1);
        e->l1 = NULL;
    }
}

void coordinator_usage_l1_delete(coordinator_state *s, uint32_t idx, uint32_t inst)
{
    coordinator_entry *e = &s->keys.e[idx];
    coordinator_l1_place *p = find_place(e, inst);
    if (p)
        drop_place(s, e, p);
    coordinator_keys_release(&s->keys, idx);
}

size_t coordinator_usage_l1_void(coordinator_state *s, uint32_t inst)
{
    size_t n = 0;
    for (uint32_t i = 0; i < s->keys.n_slots; i++) {
        coordinator_entry *e = &s->keys.e[i];
        coordinator_l1_place *p = e->hash_len && e->n_l1 ? find_place(e, inst) : NULL;
        if (p) {
            drop_place(s, e, p);
            coordinator_keys_release(&s->keys, i);
            n++;
        }
    }
    return n;
}
