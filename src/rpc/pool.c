#include "rpc/pool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

#include "obs/log.h"

typedef struct {
    pthread_mutex_t lock;
    pthread_cond_t ready;
    lmc_pool_task *head, *tail;
    size_t pending;   /* queued + running */
    size_t waiting, waiting_bytes;   /* queued, not yet started */
    bool stopping;
} task_queue;

typedef struct {
    lmc_pool *pool;
    task_queue *queue;
    pthread_t thread;
} pool_worker;

/* A share in progress: it lives on the sharing thread's stack, and is in
 * the pool's list while some of its pieces are unclaimed. */
typedef struct share_job {
    struct share_job *next;
    lmc_pool_piece_fn fn;
    void *arg;
    size_t n, claimed, done;   /* under share_lock */
    bool ok;
    pthread_cond_t finished;   /* done == n */
} share_job;

struct lmc_pool {
    lmc_pool_run_fn run;
    void *user;
    size_t n_queues, n_threads, started;
    size_t max_queued, max_bytes;   /* per queue; 0: no bound */
    task_queue *queues;
    pool_worker *workers;
    pthread_mutex_t share_lock;
    share_job *jobs, *jobs_tail;  /* shares with unclaimed pieces, oldest first */
    atomic_size_t open_jobs;      /* their number; idle threads read it without a lock */
    atomic_size_t helped;         /* lmc_pool_pieces_helped */
};

/* Takes the next piece of `j` (caller holds share_lock, pieces remain);
 * the last one takes the job off the list. */
static size_t claim_piece(lmc_pool *pool, share_job *j)
{
    size_t i = j->claimed++;
    if (j->claimed == j->n) {
        share_job **at = &pool->jobs, *prev = NULL;
        while (*at != j) {
            prev = *at;
            at = &(*at)->next;
        }
        *at = j->next;
        if (pool->jobs_tail == j)
            pool->jobs_tail = prev;
        atomic_fetch_sub(&pool->open_jobs, 1);
    }
    return i;
}

/* Runs piece i of j and counts it done (share_lock not held on entry,
 * held on return). */
static void run_piece(lmc_pool *pool, share_job *j, size_t i)
{
    bool ok = j->fn(j->arg, i);
    pthread_mutex_lock(&pool->share_lock);
    j->ok = j->ok && ok;
    if (++j->done == j->n)
        pthread_cond_signal(&j->finished);
}

/* An idle thread's turn: one piece of the oldest open share, if any. */
static void help_once(lmc_pool *pool)
{
    pthread_mutex_lock(&pool->share_lock);
    share_job *j = pool->jobs;
    if (j) {
        size_t i = claim_piece(pool, j);
        pthread_mutex_unlock(&pool->share_lock);
        run_piece(pool, j, i);   /* j stays alive until its done == n */
        atomic_fetch_add(&pool->helped, 1);
    }
    pthread_mutex_unlock(&pool->share_lock);
}

/* The next task of q; while none is queued, the thread helps with shares. */
static lmc_pool_task *queue_pop_wait(lmc_pool *pool, task_queue *q)
{
    pthread_mutex_lock(&q->lock);
    while (!q->head && !q->stopping) {
        if (atomic_load(&pool->open_jobs) > 0) {
            pthread_mutex_unlock(&q->lock);
            help_once(pool);
            pthread_mutex_lock(&q->lock);
            continue;
        }
        pthread_cond_wait(&q->ready, &q->lock);
    }
    lmc_pool_task *t = q->head;
    if (t) {
        q->head = t->next;
        if (!q->head)
            q->tail = NULL;
        q->waiting--;
        q->waiting_bytes -= t->bytes;
    }
    pthread_mutex_unlock(&q->lock);
    return t;
}

static void *worker_main(void *arg)
{
    pool_worker *w = arg;
    lmc_pool_task *t;
    while ((t = queue_pop_wait(w->pool, w->queue)) != NULL) {
        t->next = NULL;
        w->pool->run(t, w->pool->user);
        pthread_mutex_lock(&w->queue->lock);
        w->queue->pending--;
        pthread_mutex_unlock(&w->queue->lock);
    }
    return NULL;
}

lmc_pool *lmc_pool_new(const char *name, int n_threads, int n_queues, size_t max_queued,
                       size_t max_bytes, lmc_pool_run_fn run, void *user)
{
    if (n_threads < 1 || n_queues < 1 || n_queues > n_threads)
        return NULL;
    lmc_pool *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    p->run = run;
    p->user = user;
    p->max_queued = max_queued;
    p->max_bytes = max_bytes;
    p->n_queues = (size_t)n_queues;
    p->n_threads = (size_t)n_threads;
    pthread_mutex_init(&p->share_lock, NULL);
    p->queues = calloc(p->n_queues, sizeof *p->queues);
    p->workers = calloc(p->n_threads, sizeof *p->workers);
    if (!p->queues || !p->workers)
        goto fail;
    for (size_t i = 0; i < p->n_queues; i++) {
        pthread_mutex_init(&p->queues[i].lock, NULL);
        pthread_cond_init(&p->queues[i].ready, NULL);
    }
    for (size_t i = 0; i < p->n_threads; i++) {
        pool_worker *w = &p->workers[i];
        w->pool = p;
        w->queue = &p->queues[i % p->n_queues];
        if (pthread_create(&w->thread, NULL, worker_main, w) != 0) {
            LMC_ERROR("%s pool: cannot start worker thread %zu", name, i);
            goto fail;
        }
        char tname[32];
        snprintf(tname, sizeof tname, "lmc-%.6s-%u", name, (unsigned)(i % 1000));
        tname[15] = '\0'; /* the kernel limit for thread names */
        pthread_setname_np(w->thread, tname);
        p->started++;
    }
    return p;
fail:
    lmc_pool_free(p);
    return NULL;
}

size_t lmc_pool_queue_count(const lmc_pool *pool)
{
    return pool->n_queues;
}

/* Caller holds q->lock. */
static bool queue_full(const lmc_pool *pool, const task_queue *q, size_t bytes, bool releases)
{
    if (q->waiting == 0)
        return false;
    size_t max_queued = releases ? 2 * pool->max_queued : pool->max_queued;
    return (max_queued && q->waiting >= max_queued) ||
           (pool->max_bytes && q->waiting_bytes + bytes > pool->max_bytes);
}

bool lmc_pool_submit(lmc_pool *pool, size_t queue_index, lmc_pool_task *task, size_t bytes,
                     bool releases)
{
    task_queue *q = &pool->queues[queue_index % pool->n_queues];
    task->next = NULL;
    task->bytes = bytes;
    pthread_mutex_lock(&q->lock);
    if (queue_full(pool, q, bytes, releases)) {
        pthread_mutex_unlock(&q->lock);
        return false;
    }
    q->waiting++;
    q->waiting_bytes += bytes;
    if (q->tail)
        q->tail->next = task;
    else
        q->head = task;
    q->tail = task;
    q->pending++;
    /* With several threads on one queue, wake exactly one per task. */
    pthread_cond_signal(&q->ready);
    pthread_mutex_unlock(&q->lock);
    return true;
}

size_t lmc_pool_thread_count(const lmc_pool *pool)
{
    return pool->n_threads;
}

size_t lmc_pool_pieces_helped(lmc_pool *pool)
{
    return atomic_load(&pool->helped);
}

/* Wakes the threads waiting for a task: they check open_jobs under their
 * queue's lock before they wait, so none sleeps through a new share. */
static void wake_idle(lmc_pool *pool)
{
    for (size_t i = 0; i < pool->n_queues; i++) {
        task_queue *q = &pool->queues[i];
        pthread_mutex_lock(&q->lock);
        pthread_cond_broadcast(&q->ready);
        pthread_mutex_unlock(&q->lock);
    }
}

bool lmc_pool_share(lmc_pool *pool, size_t n_pieces, lmc_pool_piece_fn fn, void *arg)
{
    bool ok = true;
    if (n_pieces < 2 || pool->n_threads < 2) {
        for (size_t i = 0; i < n_pieces; i++)
            ok = fn(arg, i) && ok;
        return ok;
    }
    share_job j = {.fn = fn, .arg = arg, .n = n_pieces, .ok = true};
    pthread_cond_init(&j.finished, NULL);
    pthread_mutex_lock(&pool->share_lock);
    if (pool->jobs_tail)
        pool->jobs_tail->next = &j;
    else
        pool->jobs = &j;
    pool->jobs_tail = &j;
    atomic_fetch_add(&pool->open_jobs, 1);
    pthread_mutex_unlock(&pool->share_lock);
    wake_idle(pool);
    pthread_mutex_lock(&pool->share_lock);
    while (j.claimed < j.n) {
        size_t i = claim_piece(pool, &j);
        pthread_mutex_unlock(&pool->share_lock);
        run_piece(pool, &j, i);
    }
    while (j.done < j.n)
        pthread_cond_wait(&j.finished, &pool->share_lock);
    ok = j.ok;
    pthread_mutex_unlock(&pool->share_lock);
    pthread_cond_destroy(&j.finished);
    return ok;
}

bool lmc_pool_queue_idle(lmc_pool *pool, size_t queue_index)
{
    task_queue *q = &pool->queues[queue_index % pool->n_queues];
    pthread_mutex_lock(&q->lock);
    bool idle = q->pending == 0;
    pthread_mutex_unlock(&q->lock);
    return idle;
}

void lmc_pool_free(lmc_pool *pool)
{
    if (!pool)
        return;
    if (pool->queues) {
        for (size_t i = 0; i < pool->n_queues; i++) {
            pthread_mutex_lock(&pool->queues[i].lock);
            pool->queues[i].stopping = true;
            pthread_cond_broadcast(&pool->queues[i].ready);
            pthread_mutex_unlock(&pool->queues[i].lock);
        }
    }
    for (size_t i = 0; i < pool->started; i++)
        pthread_join(pool->workers[i].thread, NULL);
    if (pool->queues) {
        for (size_t i = 0; i < pool->n_queues; i++) {
            pthread_mutex_destroy(&pool->queues[i].lock);
            pthread_cond_destroy(&pool->queues[i].ready);
        }
    }
    pthread_mutex_destroy(&pool->share_lock);
    free(pool->queues);
    free(pool->workers);
    free(pool);
}
