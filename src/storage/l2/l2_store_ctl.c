/* Store controller: L1 -> L2 write-behind, never on the request path.
 *
 * The storage manager's on_written listener only appends keys to a queue
 * (own mutex) and bumps an eventfd.  The controller thread takes a COPY
 * lease on each still-resident key (docs/storage.md, "Leases": the object
 * stays resident and its buffer stays put), submits one store task per
 * adapter, and gives the leases back once every adapter is done; with
 * skip_l1 the keys are then deleted from L1 if every adapter stored them.  Failures are counted
 * and logged, never retried (upstream behaviour). */
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "obs/events.h"
#include "core/grow.h"
#include "obs/log.h"
#include "storage/l2/l2_internal.h"

#define MAX_QUEUED_KEYS (1u << 20)   /* beyond: dropped (counted), L1 keeps them */
#define BATCH_KEYS 256

typedef struct batch {
    lmc_object_key *keys;
    lmc_lease *leases;        /* COPY leases, given back when every adapter is done */
    size_t n;
    size_t pending;           /* adapters still storing */
    bool ok;
} batch;

typedef struct inflight {
    uint64_t id;
    batch *b;
    uint64_t bytes;           /* what the task writes */
    double submitted_s;
    struct inflight *next;
} inflight;

struct lmc_l2_store_ctl {
    lmc_storage_manager *sm;
    lmc_l2_adapter *const *ad;
    size_t na;
    bool skip_l1;
    lmc_storage_listener listener;
    pthread_mutex_t mu;       /* guards q, qn, qcap */
    lmc_object_key *q;
    size_t qn, qcap;
    int efd;
    pthread_t thread;
    bool running;
    atomic_bool stop;
    inflight **fl;            /* per adapter; controller thread only */
    atomic_uint_fast64_t queued, dropped, not_resident, submitted_keys, tasks_ok, tasks_failed,
        l1_deleted, batches_in_flight;
};

int64_t lmc_l2_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void on_written(void *user, const lmc_object_key *keys, size_t n)
{
    lmc_l2_store_ctl *c = user;
    pthread_mutex_lock(&c->mu);
    if (c->qn + n <= MAX_QUEUED_KEYS) /* else, or out of memory, the keys do not fit */
        (void)lmc_grow_array(&c->q, &c->qcap, c->qn + n, sizeof *c->q, 256);
    bool fits = c->qn + n <= c->qcap;
    if (fits) {
        memcpy(c->q + c->qn, keys, n * sizeof *keys);
        lmc_keys_hold(c->q + c->qn, n); /* queued past the event that named them */
        c->qn += n;
    }
    pthread_mutex_unlock(&c->mu);
    atomic_fetch_add(fits ? &c->queued : &c->dropped, n);
    uint64_t one = 1;
    if (fits)
        (void)!write(c->efd, &one, sizeof one);
}

static void free_batch(batch *b)
{
    lmc_keys_drop(b->keys, b->n);
    free(b->keys);
    free(b->leases);
    free(b);
}

static void finish_batch(lmc_l2_store_ctl *c, batch *b)
{
    lmc_storage_manager_give_back(c->sm, b->keys, b->leases, b->n);   /* all have copied */
    if (c->skip_l1 && b->ok) {
        size_t deleted = 0;
        lmc_storage_manager_delete(c->sm, b->keys, b->n, false, &deleted, NULL);
        atomic_fetch_add(&c->l1_deleted, deleted);
    }
    if (b->ok)
        lmc_l2_publish_by_salt(c->sm, LMC_EVENT_L2_STORE_COMPLETED, b->keys, b->n);
    atomic_fetch_sub(&c->batches_in_flight, 1);
    free_batch(b);
}

/* One adapter is done with `b` (stored, failed, or never submitted). */
static void adapter_done(lmc_l2_store_ctl *c, batch *b, bool ok)
{
    b->ok = b->ok && ok;
    if (--b->pending == 0)
        finish_batch(c, b);
}

/* COPY leases on the resident keys, compacted into a batch. */
static batch *lock_batch(lmc_l2_store_ctl *c, const lmc_object_key *keys, size_t n,
                         uint64_t *offsets, uint64_t *sizes)
{
    lmc_l1_result res[BATCH_KEYS];
    batch *b = calloc(1, sizeof *b);
    lmc_object_key *k = malloc(n * sizeof *k);
    lmc_lease *leases = malloc(n * sizeof *leases);
    if (!b || !k || !leases) {
        free(b);
        free(k);
        free(leases);
        return NULL;
    }
    lmc_storage_manager_lease_copy(c->sm, keys, n, LMC_COPY_TAKES_SHARE, false, NULL, leases, res);
    for (size_t i = 0; i < n; i++) {
        if (res[i] != LMC_L1_SUCCESS)
            continue;
        offsets[b->n] = leases[i].offset;
        sizes[b->n] = leases[i].object_size;
        leases[b->n] = leases[i];
        k[b->n++] = keys[i];
    }
    lmc_keys_hold(k, b->n); /* the batch outlives the queue's copies */
    atomic_fetch_add(&c->not_resident, n - b->n);
    if (b->n < n)
        lmc_storage_manager_report_read_failure(c->sm, "l2_store", "not_found", &keys[0],
                                                n - b->n);
    b->keys = k;
    b->leases = leases;
    b->pending = c->na;
    b->ok = true;
    return b;
}

static void submit_batch(lmc_l2_store_ctl *c, const lmc_object_key *keys, size_t n)
{
    uint64_t offsets[BATCH_KEYS], sizes[BATCH_KEYS];
    batch *b = lock_batch(c, keys, n, offsets, sizes);
    if (!b)
        return;
    if (b->n == 0) {
        free_batch(b);
        return;
    }
    atomic_fetch_add(&c->batches_in_flight, 1);
    atomic_fetch_add(&c->submitted_keys, b->n);
    lmc_l2_publish_by_salt(c->sm, LMC_EVENT_L2_STORE_SUBMITTED, b->keys, b->n);
    uint64_t bytes = 0;
    for (size_t i = 0; i < b->n; i++)
        bytes += sizes[i];
    size_t na = c->na;
    for (size_t a = 0; a < na; a++) {
        inflight *f = malloc(sizeof *f);
        uint64_t id = f ? lmc_l2_adapter_submit_store(c->ad[a], b->keys, offsets, sizes, b->n) : 0;
        if (!id) {
            free(f);
            atomic_fetch_add(&c->tasks_failed, 1);
            adapter_done(c, b, false);   /* may free b: only on the last adapter */
            continue;
        }
        *f = (inflight){id, b, bytes, lmc_l2_now_s(), c->fl[a]};
        c->fl[a] = f;
    }
}

static void drain_queue(lmc_l2_store_ctl *c)
{
    pthread_mutex_lock(&c->mu);
    lmc_object_key *q = c->q;
    size_t n = c->qn;
    c->q = NULL;
    c->qn = c->qcap = 0;
    pthread_mutex_unlock(&c->mu);
    for (size_t i = 0; i < n; i += BATCH_KEYS)
        submit_batch(c, q + i, n - i < BATCH_KEYS ? n - i : BATCH_KEYS);
    lmc_keys_drop(q, n);
    free(q);
}

static void reap(lmc_l2_store_ctl *c, size_t a)
{
    uint64_t id;
    int64_t result;
    while (lmc_l2_adapter_pop_completed_store(c->ad[a], &id, &result)) {
        for (inflight **p = &c->fl[a]; *p; p = &(*p)->next) {
            if ((*p)->id != id)
                continue;
            inflight *f = *p;
            *p = f->next;
            if (result < 0)
                LMC_WARN("L2 store to adapter %zu (%s) failed for %zu keys", a,
                         lmc_l2_adapter_type(c->ad[a]), f->b->n);
            atomic_fetch_add(result >= 0 ? &c->tasks_ok : &c->tasks_failed, 1);
            if (result >= 0)
                lmc_l2_publish_task(c->sm, LMC_EVENT_L2_STORE_TASK, c->ad[a], f->bytes,
                                    lmc_l2_now_s() - f->submitted_s);
            adapter_done(c, f->b, result >= 0);
            free(f);
            break;
        }
    }
}

static void *store_main(void *arg)
{
    lmc_l2_store_ctl *c = arg;
    struct pollfd *fds = calloc(c->na + 1, sizeof *fds);
    if (!fds)
        return NULL;
    fds[0] = (struct pollfd){.fd = c->efd, .events = POLLIN};
    for (size_t a = 0; a < c->na; a++)
        fds[a + 1] = (struct pollfd){.fd = lmc_l2_adapter_event_fd(c->ad[a], LMC_L2_OP_STORE),
                                     .events = POLLIN};
    while (!atomic_load(&c->stop)) {
        poll(fds, c->na + 1, 500);
        lmc_l2_drain_fd(c->efd);
        drain_queue(c);
        for (size_t a = 0; a < c->na; a++) {
            lmc_l2_drain_fd(fds[a + 1].fd);
            reap(c, a);
        }
    }
    free(fds);
    return NULL;
}

lmc_l2_store_ctl *lmc_l2_store_ctl_new(lmc_storage_manager *sm, lmc_l2_adapter *const *ad,
                                       size_t n_adapters, bool skip_l1)
{
    lmc_l2_store_ctl *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    *c = (lmc_l2_store_ctl){.sm = sm, .ad = ad, .na = n_adapters, .skip_l1 = skip_l1};
    pthread_mutex_init(&c->mu, NULL);
    c->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    c->fl = calloc(n_adapters ? n_adapters : 1, sizeof *c->fl);
    c->listener = (lmc_storage_listener){.on_written = on_written, .user = c};
    if (c->efd < 0 || !c->fl || pthread_create(&c->thread, NULL, store_main, c) != 0) {
        lmc_l2_store_ctl_free(c);
        return NULL;
    }
    c->running = true;
    if (lmc_storage_manager_add_listener(sm, &c->listener) != 0) {
        lmc_l2_store_ctl_stop(c);
        lmc_l2_store_ctl_free(c);
        return NULL;
    }
    return c;
}

void lmc_l2_store_ctl_stop(lmc_l2_store_ctl *c)
{
    lmc_storage_manager_remove_listener(c->sm, &c->listener);
    atomic_store(&c->stop, true);
    uint64_t one = 1;
    (void)!write(c->efd, &one, sizeof one);
    if (c->running)
        pthread_join(c->thread, NULL);
    c->running = false;
}

void lmc_l2_store_ctl_free(lmc_l2_store_ctl *c)
{
    if (!c)
        return;
    for (size_t a = 0; c->fl && a < c->na; a++) {
        while (c->fl[a]) {
            inflight *f = c->fl[a];
            c->fl[a] = f->next;
            adapter_done(c, f->b, false);   /* the adapter is closed: give locks back */
            free(f);
        }
    }
    free(c->fl);
    if (c->q)
        lmc_keys_drop(c->q, c->qn);
    free(c->q);
    if (c->efd >= 0)
        close(c->efd);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

json_t *lmc_l2_store_ctl_status(lmc_l2_store_ctl *c)
{
    pthread_mutex_lock(&c->mu);
    size_t qn = c->qn;
    pthread_mutex_unlock(&c->mu);
    return json_pack("{s:b, s:s, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I}", "is_healthy", 1,
                     "policy", c->skip_l1 ? "skip_l1" : "default", "queued_keys",
                     (json_int_t)qn, "keys_seen", (json_int_t)atomic_load(&c->queued),
                     "keys_dropped", (json_int_t)atomic_load(&c->dropped), "keys_not_resident",
                     (json_int_t)atomic_load(&c->not_resident), "keys_submitted",
                     (json_int_t)atomic_load(&c->submitted_keys), "stores_ok",
                     (json_int_t)atomic_load(&c->tasks_ok), "stores_failed",
                     (json_int_t)atomic_load(&c->tasks_failed), "l1_deleted",
                     (json_int_t)atomic_load(&c->l1_deleted), "batches_in_flight",
                     (json_int_t)atomic_load(&c->batches_in_flight));
}
