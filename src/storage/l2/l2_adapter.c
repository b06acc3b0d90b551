/* Asynchronous adapter over a synchronous backend: a FIFO of tasks, N worker
 * threads, one completed list and one eventfd per kind of task.  Workers
 * take parts of the head task (part_len), so one request's keys run in
 * parallel; the worker whose part finishes last completes the task.  A
 * store on a backend with store_batch ops is first reserved whole by one
 * worker (the others wait for it), then split (docs/l2.md, "Parts"). */
#include "storage/l2/l2_adapter.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

typedef struct task {
    uint64_t id;
    lmc_l2_op op;
    size_t n;
    lmc_object_key *keys;     /* copies holding their names once keys_held */
    bool keys_held;
    uint64_t *sizes;          /* NULL for a lookup without sizes */
    uint8_t **bufs;           /* store/load */
    uint8_t *bitmap;          /* lookup/load result */
    int64_t result;           /* store result: bytes, -1 once a part failed */
    size_t next;              /* first key no worker has taken yet */
    size_t finished;          /* keys whose part returned */
    size_t running;           /* parts on a worker now */
    void *batch;              /* store_begin's reservation, until store_end */
    bool begun;               /* store_begin ran (batch NULL: refused) */
    bool beginning;           /* a worker runs store_begin: nobody takes parts */
    struct task *next_task;
} task;

struct lmc_l2_adapter {
    lmc_l2_backend *be;
    uint8_t *base;
    pthread_mutex_t mu;       /* guards queue, done lists, next_id, stop */
    pthread_cond_t cv;
    task *head, *tail;
    task *done[LMC_L2_NUM_OPS];
    uint64_t next_id;
    bool stop;
    int efd[LMC_L2_NUM_OPS];
    pthread_t *workers;
    size_t num_workers;
    size_t max_parts;         /* most parts of one task that ran at once (status) */
    atomic_uint_fast64_t stores_ok, stores_failed, bytes_stored, lookups, lookup_keys,
        lookup_hits, loads, load_keys, load_ok, deleted;
    lmc_l2_observer obs;      /* all callbacks NULL unless L2 eviction tracks us */
    lmc_l2_observer reporter; /* placement reports (lmc_l2_adapter_set_reporter) */
};

static void task_free(task *t)
{
    if (!t)
        return;
    if (t->keys_held)
        lmc_keys_drop(t->keys, t->n);
    free(t->keys);
    free(t->sizes);
    free(t->bufs);
    free(t->bitmap);
    free(t);
}

/* A task leaves the adapter: its reservation, if any, goes back first. */
static const lmc_l2_store_batch_ops *batch_ops(const lmc_l2_adapter *a)
{
    return a->be->split_ops & LMC_L2_SPLIT_STORE_BATCH
               ? ((const lmc_l2_batch_backend *)a->be)->store_batch
               : NULL;
}

static void task_drop(lmc_l2_adapter *a, task *t)
{
    if (t && t->batch)
        batch_ops(a)->end(a->be, t->batch);
    task_free(t);
}

void lmc_l2_drain_fd(int fd)
{
    uint64_t v;
    while (read(fd, &v, sizeof v) == (ssize_t)sizeof v) {
    }
}

/* Keys [from, to) of t: the backend's answer for that part.  Store: bytes
 * or -1; lookup and load fill their slice of the bitmap. */
static int64_t run_part(lmc_l2_adapter *a, task *t, size_t from, size_t to)
{
    const lmc_l2_backend_ops *ops = a->be->ops;
    size_t n = to - from;
    const uint64_t *sizes = t->sizes ? t->sizes + from : NULL;
    switch (t->op) {
    case LMC_L2_OP_STORE:
        if (t->batch)
            return batch_ops(a)->part(a->be, t->batch, from, t->keys + from, t->bufs + from,
                                   sizes, n);
        return ops->store(a->be, t->keys + from, t->bufs + from, sizes, n);
    case LMC_L2_OP_LOOKUP:
        ops->lookup_and_lock(a->be, t->keys + from, sizes, n, t->bitmap + from);
        return 0;
    case LMC_L2_OP_LOAD:
        ops->load(a->be, t->keys + from, t->bufs + from, sizes, n, t->bitmap + from);
        return 0;
    default:
        return 0;
    }
}

/* Counters and observers of a task whose last part finished (no lock held). */
static void finish_task(lmc_l2_adapter *a, task *t)
{
    size_t hits = 0;
    for (size_t i = 0; t->bitmap && i < t->n; i++)
        hits += t->bitmap[i] != 0;
    switch (t->op) {
    case LMC_L2_OP_STORE:
        atomic_fetch_add(t->result >= 0 ? &a->stores_ok : &a->stores_failed, 1);
        if (t->result > 0)
            atomic_fetch_add(&a->bytes_stored, (uint64_t)t->result);
        if (t->result >= 0 && a->obs.on_stored)
            a->obs.on_stored(a->obs.user, t->keys, t->sizes, t->n);
        if (t->result >= 0 && a->reporter.on_stored)
            a->reporter.on_stored(a->reporter.user, t->keys, t->sizes, t->n);
        return;
    case LMC_L2_OP_LOOKUP:
        atomic_fetch_add(&a->lookups, 1);
        atomic_fetch_add(&a->lookup_keys, t->n);
        atomic_fetch_add(&a->lookup_hits, hits);
        return;
    case LMC_L2_OP_LOAD:
        atomic_fetch_add(&a->loads, 1);
        atomic_fetch_add(&a->load_keys, t->n);
        atomic_fetch_add(&a->load_ok, hits);
        if (a->obs.on_loaded)
            a->obs.on_loaded(a->obs.user, t->keys, t->bitmap, t->n);
        if (a->reporter.on_loaded)
            a->reporter.on_loaded(a->reporter.user, t->keys, t->bitmap, t->n);
        return;
    default:
        return;
    }
}

/* How many keys the next part of t takes.  A backend that cannot split the
 * op gets the whole task; else at most an even share per worker, and for
 * stores and loads no more than PART_BYTES, so a prompt of 2 MiB chunks
 * goes one chunk per part to whichever worker is free (issue 18). */
#define PART_BYTES (1u << 20)
static size_t part_len(const lmc_l2_adapter *a, const task *t)
{
    static const unsigned bit[LMC_L2_NUM_OPS] = {LMC_L2_SPLIT_STORE, LMC_L2_SPLIT_LOOKUP,
                                                 LMC_L2_SPLIT_LOAD};
    size_t left = t->n - t->next;
    if (!(a->be->split_ops & bit[t->op]) && !t->batch)
        return left;
    size_t most = (t->n + a->num_workers - 1) / a->num_workers;
    if (most > left)
        most = left;
    if (t->op == LMC_L2_OP_LOOKUP || !t->sizes)
        return most;
    size_t k = 0;
    for (uint64_t bytes = 0; k < most && bytes < PART_BYTES; k++)
        bytes += t->sizes[t->next + k];
    return k;
}

/* Takes the next part of the queue's head; the task leaves the queue with
 * its last part.  Caller holds a->mu and the queue is not empty. */
static task *take_part(lmc_l2_adapter *a, size_t *from, size_t *to)
{
    task *t = a->head;
    *from = t->next;
    *to = t->next += part_len(a, t);
    if (t->next == t->n) {
        a->head = t->next_task;
        if (!a->head)
            a->tail = NULL;
    }
    return t;
}

/* Completes t, whose parts all returned (or none will run).  Called and
 * returns with a->mu held. */
static void complete(lmc_l2_adapter *a, task *t)
{
    pthread_mutex_unlock(&a->mu);
    if (t->batch && !batch_ops(a)->end(a->be, t->batch))
        t->result = -1;
    t->batch = NULL;
    finish_task(a, t);
    pthread_mutex_lock(&a->mu);
    t->next_task = a->done[t->op];
    a->done[t->op] = t;
    uint64_t one = 1;
    /* An eventfd write only fails on counter overflow: not reachable. */
    (void)!write(a->efd[t->op], &one, sizeof one);
}

/* The head task is a store whose backend checks capacity per batch: this
 * worker reserves the whole batch (outside a->mu; the others wait) before
 * any part is written.  A refused batch fails whole, writing nothing.
 * Called and returns with a->mu held. */
static void begin_store(lmc_l2_adapter *a, task *t)
{
    t->beginning = true;
    pthread_mutex_unlock(&a->mu);
    void *batch = batch_ops(a)->begin(a->be, t->keys, t->sizes, t->n);
    pthread_mutex_lock(&a->mu);
    t->beginning = false;
    t->begun = true;
    t->batch = batch;
    pthread_cond_broadcast(&a->cv);
    if (batch)
        return;
    a->head = t->next_task; /* refused: no part will run */
    if (!a->head)
        a->tail = NULL;
    t->result = -1;
    complete(a, t);
}

static bool needs_begin(const lmc_l2_adapter *a, const task *t)
{
    return t->op == LMC_L2_OP_STORE && batch_ops(a) && !t->begun && t->sizes;
}

static void *worker_main(void *arg)
{
    lmc_l2_adapter *a = arg;
    pthread_mutex_lock(&a->mu);
    for (;;) {
        while (!a->stop && (!a->head || a->head->beginning))
            pthread_cond_wait(&a->cv, &a->mu);
        if (a->stop)
            break;
        if (needs_begin(a, a->head)) {
            begin_store(a, a->head);
            continue;
        }
        size_t from, to;
        task *t = take_part(a, &from, &to);
        if (++t->running > a->max_parts)
            a->max_parts = t->running;
        pthread_mutex_unlock(&a->mu);
        int64_t r = run_part(a, t, from, to);
        pthread_mutex_lock(&a->mu);
        t->running--;
        t->result = t->result < 0 || r < 0 ? -1 : t->result + r;
        t->finished += to - from;
        if (t->finished >= t->n)
            complete(a, t);
    }
    pthread_mutex_unlock(&a->mu);
    return NULL;
}

static int start(lmc_l2_adapter *a, size_t num_workers)
{
    for (int k = 0; k < LMC_L2_NUM_OPS; k++) {
        a->efd[k] = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
        if (a->efd[k] < 0)
            return -1;
    }
    a->workers = calloc(num_workers, sizeof *a->workers);
    if (!a->workers)
        return -1;
    for (size_t i = 0; i < num_workers; i++) {
        if (pthread_create(&a->workers[i], NULL, worker_main, a) != 0)
            return -1;
        a->num_workers++;
    }
    return 0;
}

lmc_l2_adapter *lmc_l2_adapter_new(lmc_l2_backend *be, uint8_t *arena_base, size_t num_workers)
{
    lmc_l2_adapter *a = calloc(1, sizeof *a);
    if (!a) {
        be->ops->destroy(be);
        return NULL;
    }
    a->be = be;
    a->base = arena_base;
    a->next_id = 1;
    for (int k = 0; k < LMC_L2_NUM_OPS; k++)
        a->efd[k] = -1;
    pthread_mutex_init(&a->mu, NULL);
    pthread_cond_init(&a->cv, NULL);
    if (start(a, num_workers ? num_workers : 1) != 0) {
        lmc_l2_adapter_close(a);
        return NULL;
    }
    return a;
}

static void free_list(lmc_l2_adapter *a, task *t)
{
    while (t) {
        task *next = t->next_task;
        task_drop(a, t);
        t = next;
    }
}

void lmc_l2_adapter_close(lmc_l2_adapter *a)
{
    if (!a)
        return;
    pthread_mutex_lock(&a->mu);
    a->stop = true;
    pthread_cond_broadcast(&a->cv);
    pthread_mutex_unlock(&a->mu);
    for (size_t i = 0; i < a->num_workers; i++)
        pthread_join(a->workers[i], NULL);
    free(a->workers);
    free_list(a, a->head);
    for (int k = 0; k < LMC_L2_NUM_OPS; k++) {
        free_list(a, a->done[k]);
        if (a->efd[k] >= 0)
            close(a->efd[k]);
    }
    a->be->ops->destroy(a->be);
    pthread_cond_destroy(&a->cv);
    pthread_mutex_destroy(&a->mu);
    free(a);
}

const char *lmc_l2_adapter_type(const lmc_l2_adapter *a)
{
    return a->be->type;
}

int lmc_l2_adapter_event_fd(const lmc_l2_adapter *a, lmc_l2_op op)
{
    return a->efd[op];
}

/* A task with copies of the arguments; offsets become arena pointers. */
static task *make_task(lmc_l2_adapter *a, lmc_l2_op op, const lmc_object_key *keys,
                       const uint64_t *offsets, const uint64_t *sizes, size_t n)
{
    task *t = calloc(1, sizeof *t);
    if (!t)
        return NULL;
    t->op = op;
    t->n = n;
    size_t m = n ? n : 1;
    t->keys = malloc(m * sizeof *t->keys);
    t->sizes = sizes ? malloc(m * sizeof *t->sizes) : NULL;
    t->bufs = offsets ? malloc(m * sizeof *t->bufs) : NULL;
    t->bitmap = op != LMC_L2_OP_STORE ? calloc(m, 1) : NULL;
    if (!t->keys || (sizes && !t->sizes) || (offsets && !t->bufs) ||
        (op != LMC_L2_OP_STORE && !t->bitmap)) {
        task_free(t);
        return NULL;
    }
    memcpy(t->keys, keys, n * sizeof *keys);
    lmc_keys_hold(t->keys, n); /* a task may outlive its submitter's keys */
    t->keys_held = true;
    if (sizes)
        memcpy(t->sizes, sizes, n * sizeof *sizes);
    for (size_t i = 0; offsets && i < n; i++)
        t->bufs[i] = a->base + offsets[i];
    return t;
}

static uint64_t submit(lmc_l2_adapter *a, task *t)
{
    if (!t)
        return 0;
    uint64_t id = 0;
    pthread_mutex_lock(&a->mu);
    if (!a->stop) {
        id = t->id = a->next_id++;
        t->next_task = NULL;
        if (a->tail)
            a->tail->next_task = t;
        else
            a->head = t;
        a->tail = t;
        /* Every idle worker may take a part of it. */
        pthread_cond_broadcast(&a->cv);
    }
    pthread_mutex_unlock(&a->mu);
    if (!id)
        task_free(t);
    return id;
}

uint64_t lmc_l2_adapter_submit_store(lmc_l2_adapter *a, const lmc_object_key *keys,
                                     const uint64_t *offsets, const uint64_t *sizes, size_t n)
{
    return submit(a, make_task(a, LMC_L2_OP_STORE, keys, offsets, sizes, n));
}

uint64_t lmc_l2_adapter_submit_lookup_and_lock(lmc_l2_adapter *a, const lmc_object_key *keys,
                                               const uint64_t *sizes, size_t n)
{
    return submit(a, make_task(a, LMC_L2_OP_LOOKUP, keys, NULL, sizes, n));
}

uint64_t lmc_l2_adapter_submit_load(lmc_l2_adapter *a, const lmc_object_key *keys,
                                    const uint64_t *offsets, const uint64_t *sizes, size_t n)
{
    return submit(a, make_task(a, LMC_L2_OP_LOAD, keys, offsets, sizes, n));
}

/* Unlinks the completed task `id` (0: any) of kind op, or NULL. */
static task *take_done(lmc_l2_adapter *a, lmc_l2_op op, uint64_t id)
{
    pthread_mutex_lock(&a->mu);
    task *found = NULL;
    for (task **p = &a->done[op]; *p; p = &(*p)->next_task) {
        if (id == 0 || (*p)->id == id) {
            found = *p;
            *p = found->next_task;
            break;
        }
    }
    pthread_mutex_unlock(&a->mu);
    return found;
}

bool lmc_l2_adapter_pop_completed_store(lmc_l2_adapter *a, uint64_t *id, int64_t *result)
{
    task *t = take_done(a, LMC_L2_OP_STORE, 0);
    if (!t)
        return false;
    *id = t->id;
    *result = t->result;
    task_free(t);
    return true;
}

static bool query(lmc_l2_adapter *a, lmc_l2_op op, uint64_t id, uint8_t *out)
{
    task *t = take_done(a, op, id);
    if (!t)
        return false;
    memcpy(out, t->bitmap, t->n);
    task_free(t);
    return true;
}

bool lmc_l2_adapter_query_lookup(lmc_l2_adapter *a, uint64_t id, uint8_t *found)
{
    return query(a, LMC_L2_OP_LOOKUP, id, found);
}

bool lmc_l2_adapter_query_load(lmc_l2_adapter *a, uint64_t id, uint8_t *ok)
{
    return query(a, LMC_L2_OP_LOAD, id, ok);
}

void lmc_l2_adapter_unlock(lmc_l2_adapter *a, const lmc_object_key *keys, size_t n)
{
    if (n)
        a->be->ops->unlock(a->be, keys, n);
}

size_t lmc_l2_adapter_delete(lmc_l2_adapter *a, const lmc_object_key *keys, size_t n)
{
    size_t d = n ? a->be->ops->remove(a->be, keys, n) : 0;
    atomic_fetch_add(&a->deleted, d);
    if (d == n && n && a->obs.on_deleted) /* partial: the caller retries per key */
        a->obs.on_deleted(a->obs.user, keys, n);
    if (d == n && n && a->reporter.on_deleted)
        a->reporter.on_deleted(a->reporter.user, keys, n);
    return d;
}

void lmc_l2_adapter_set_observer(lmc_l2_adapter *a, const lmc_l2_observer *obs)
{
    a->obs = *obs;
}

void lmc_l2_adapter_set_reporter(lmc_l2_adapter *a, const lmc_l2_observer *obs)
{
    a->reporter = *obs;
}

void lmc_l2_adapter_usage(lmc_l2_adapter *a, lmc_l2_usage *u)
{
    memset(u, 0, sizeof *u);
    a->be->ops->usage(a->be, u);
}

lmc_l2_backend *lmc_l2_adapter_backend(lmc_l2_adapter *a)
{
    return a->be;
}

void lmc_l2_adapter_counts(lmc_l2_adapter *a, lmc_storage_l2_counts *out)
{
    lmc_l2_usage u;
    lmc_l2_adapter_usage(a, &u);
    *out = (lmc_storage_l2_counts){
        .type_name = a->be->type,
        .stores_completed = atomic_load(&a->stores_ok) + atomic_load(&a->stores_failed),
        .loads = atomic_load(&a->loads),
        .used_bytes = u.used_bytes,
        .capacity_bytes = u.capacity_bytes,
    };
}

int lmc_l2_adapter_probe(lmc_l2_adapter *a, char *why, size_t cap)
{
    if (cap)
        why[0] = '\0';
    return a->be->ops->probe ? a->be->ops->probe(a->be, why, cap) : 0;
}

json_t *lmc_l2_adapter_status(lmc_l2_adapter *a)
{
    lmc_l2_usage u;
    lmc_l2_adapter_usage(a, &u);
    json_t *be = a->be->ops->status(a->be);
    pthread_mutex_lock(&a->mu);
    size_t max_parts = a->max_parts;
    pthread_mutex_unlock(&a->mu);
    json_t *st = json_pack(
        "{s:s, s:b, s:I, s:I, s:{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I}, s:I, s:I, s:I,"
        " s:f}",
        "type_name", a->be->type, "is_healthy", 1, "num_workers", (json_int_t)a->num_workers,
        "max_parts_in_flight", (json_int_t)max_parts,
        "counters", "stores_ok", (json_int_t)atomic_load(&a->stores_ok), "stores_failed",
        (json_int_t)atomic_load(&a->stores_failed), "bytes_stored",
        (json_int_t)atomic_load(&a->bytes_stored), "lookups", (json_int_t)atomic_load(&a->lookups),
        "lookup_keys", (json_int_t)atomic_load(&a->lookup_keys), "lookup_hits",
        (json_int_t)atomic_load(&a->lookup_hits), "loads", (json_int_t)atomic_load(&a->loads),
        "load_keys", (json_int_t)atomic_load(&a->load_keys), "load_ok",
        (json_int_t)atomic_load(&a->load_ok), "deleted", (json_int_t)atomic_load(&a->deleted),
        "used_bytes", (json_int_t)u.used_bytes, "capacity_bytes", (json_int_t)u.capacity_bytes,
        "num_keys", (json_int_t)u.num_keys, "usage_fraction",
        u.capacity_bytes ? (double)u.used_bytes / (double)u.capacity_bytes : -1.0);
    if (st && be)
        json_object_update(st, be);
    json_decref(be);
    return st;
}
