#include "rpc/pool.h"

#include <pthread.h>
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

struct lmc_pool {
    lmc_pool_run_fn run;
    void *user;
    size_t n_queues, n_threads, started;
    size_t max_queued, max_bytes;   /* per queue; 0: no bound */
    task_queue *queues;
    pool_worker *workers;
};

static lmc_pool_task *queue_pop_wait(task_queue *q)
{
    pthread_mutex_lock(&q->lock);
    while (!q->head && !q->stopping)
        pthread_cond_wait(&q->ready, &q->lock);
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
    while ((t = queue_pop_wait(w->queue)) != NULL) {
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
    free(pool->queues);
    free(pool->workers);
    free(pool);
}
