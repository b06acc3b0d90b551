/* The P2P serving side's lookup results (tasks.h).  A fixed table of
 * max_tasks slots; ids grow, so the oldest task is the smallest id. */
#include "modules/p2p/tasks.h"

#include <pthread.h>
#include <stdlib.h>

typedef struct task {
    uint64_t id;   /* 0: a free slot */
    int64_t created_ms;
    size_t n;
    lmc_p2p_serve_addr *addrs;
    lmc_p2p_serve_owner owner;
    struct task *next;   /* on the abandoned list */
} task;

struct lmc_p2p_serve_tasks {
    pthread_mutex_t lock;
    task *slots;
    size_t max_tasks, max_entries, entries;
    int64_t ttl_ms;
    uint64_t next_id, expired, dropped;
    task *abandoned;     /* dropped unqueried, their leases not yet given back */
    lmc_clock_ms_fn clock;
    void *clock_user;
};

lmc_p2p_serve_tasks *lmc_p2p_serve_tasks_new(size_t max_tasks, size_t max_entries,
                                             int64_t ttl_ms, lmc_clock_ms_fn clock,
                                             void *clock_user)
{
    if (max_tasks == 0 || max_entries == 0 || ttl_ms <= 0)
        return NULL;
    lmc_p2p_serve_tasks *t = calloc(1, sizeof *t);
    if (t)
        t->slots = calloc(max_tasks, sizeof *t->slots);
    if (!t || !t->slots) {
        free(t);
        return NULL;
    }
    pthread_mutex_init(&t->lock, NULL);
    t->max_tasks = max_tasks;
    t->max_entries = max_entries;
    t->ttl_ms = ttl_ms;
    t->clock = clock ? clock : lmc_monotonic_ms;
    t->clock_user = clock_user;
    return t;
}

/* Frees slot s.  Caller locks. */
static void forget(lmc_p2p_serve_tasks *t, task *s)
{
    t->entries -= s->n;
    free(s->addrs);
    *s = (task){0};
}

/* Frees slot s, moving its result to the abandoned list (forgotten outright
 * when there is no memory: its leases then lapse at their TTL).  Caller
 * locks. */
static void abandon(lmc_p2p_serve_tasks *t, task *s)
{
    task *a = malloc(sizeof *a);
    if (a) {
        *a = *s;
        a->next = t->abandoned;
        t->abandoned = a;
        s->addrs = NULL;
    }
    forget(t, s);
}

void lmc_p2p_serve_tasks_free(lmc_p2p_serve_tasks *t)
{
    if (!t)
        return;
    for (size_t i = 0; i < t->max_tasks; i++)
        free(t->slots[i].addrs);
    while (t->abandoned) {
        task *a = t->abandoned;
        t->abandoned = a->next;
        free(a->addrs);
        free(a);
    }
    pthread_mutex_destroy(&t->lock);
    free(t->slots);
    free(t);
}

/* A free slot once the table has room for n more entries, dropping the
 * oldest tasks as needed.  Caller locks. */
static task *make_room(lmc_p2p_serve_tasks *t, size_t n)
{
    for (;;) {
        task *free_slot = NULL, *oldest = NULL;
        for (size_t i = 0; i < t->max_tasks; i++) {
            task *s = &t->slots[i];
            if (!s->id)
                free_slot = free_slot ? free_slot : s;
            else if (!oldest || s->id < oldest->id)
                oldest = s;
        }
        if (free_slot && t->entries + n <= t->max_entries)
            return free_slot;
        abandon(t, oldest);   /* non-NULL: the table holds something */
        t->dropped++;
    }
}

uint64_t lmc_p2p_serve_tasks_add(lmc_p2p_serve_tasks *t, const lmc_p2p_serve_owner *owner,
                                 lmc_p2p_serve_addr *addrs, size_t n)
{
    if (n > t->max_entries) {
        free(addrs);
        return 0;
    }
    pthread_mutex_lock(&t->lock);
    task *s = make_room(t, n);
    *s = (task){.id = ++t->next_id, .created_ms = t->clock(t->clock_user), .n = n,
                .addrs = addrs, .owner = *owner};
    t->entries += n;
    uint64_t id = s->id;
    pthread_mutex_unlock(&t->lock);
    return id;
}

bool lmc_p2p_serve_tasks_take(lmc_p2p_serve_tasks *t, uint64_t id, lmc_p2p_serve_addr **addrs,
                              size_t *n)
{
    bool found = false;
    pthread_mutex_lock(&t->lock);
    int64_t now = t->clock(t->clock_user);
    for (size_t i = 0; id && i < t->max_tasks && !found; i++) {
        task *s = &t->slots[i];
        if (s->id != id || now - s->created_ms >= t->ttl_ms)
            continue;
        *addrs = s->addrs;
        *n = s->n;
        s->addrs = NULL;
        forget(t, s);
        found = true;
    }
    pthread_mutex_unlock(&t->lock);
    return found;
}

size_t lmc_p2p_serve_tasks_sweep(lmc_p2p_serve_tasks *t)
{
    size_t dropped = 0;
    pthread_mutex_lock(&t->lock);
    int64_t now = t->clock(t->clock_user);
    for (size_t i = 0; i < t->max_tasks; i++) {
        task *s = &t->slots[i];
        if (s->id && now - s->created_ms >= t->ttl_ms) {
            abandon(t, s);
            dropped++;
        }
    }
    t->expired += dropped;
    pthread_mutex_unlock(&t->lock);
    return dropped;
}

void lmc_p2p_serve_tasks_counts(lmc_p2p_serve_tasks *t, lmc_p2p_serve_task_counts *out)
{
    pthread_mutex_lock(&t->lock);
    size_t pending = 0;
    for (size_t i = 0; i < t->max_tasks; i++)
        pending += t->slots[i].id != 0;
    *out = (lmc_p2p_serve_task_counts){.pending = pending, .entries = t->entries,
                                        .expired = t->expired, .dropped = t->dropped};
    pthread_mutex_unlock(&t->lock);
}

size_t lmc_p2p_serve_tasks_reap(lmc_p2p_serve_tasks *t, lmc_p2p_serve_abandoned_fn fn,
                                void *user)
{
    pthread_mutex_lock(&t->lock);
    task *list = t->abandoned;
    t->abandoned = NULL;
    pthread_mutex_unlock(&t->lock);
    size_t n = 0;
    while (list) {
        task *a = list;
        list = a->next;
        fn(user, &a->owner, a->addrs, a->n);
        free(a->addrs);
        free(a);
        n++;
    }
    return n;
}
