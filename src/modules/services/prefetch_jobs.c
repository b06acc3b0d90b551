#include "modules/services/prefetch_jobs.h"

#include <pthread.h>
#include <stdlib.h>

#include "modules/services/rid_table.h"

typedef struct job {
    lmc_rid_node node;        /* first: a node pointer is a job pointer */
    uint64_t id;
    bool done;
    int64_t hits;
    bool lookup_known;
    int64_t lookup_hits;
} job;

typedef struct waiter {
    job *job;
    lmc_job_waiter_fn fn;
    void *user;
    int64_t deadline_ms;
    lmc_job_status st;        /* filled when it fires */
    int64_t hits;
    struct waiter *next;
} waiter;

struct lmc_jobs {
    lmc_jobs_options o;
    pthread_mutex_t lock;
    pthread_cond_t wake;      /* timer thread: new earliest deadline or stop */
    lmc_rid_table table;
    waiter *waiters;          /* every parked waiter, any job */
    size_t n_waiters;
    uint64_t next_id;
    bool stop;
    bool has_thread;
    pthread_t thread;
};

static int64_t now_ms(lmc_jobs *j)
{
    return j->o.clock ? j->o.clock(j->o.clock_user) : lmc_monotonic_ms(NULL);
}

/* Fires the waiters collected in `fired` (outside the lock). */
static void fire(waiter *fired)
{
    while (fired) {
        waiter *w = fired;
        fired = w->next;
        w->fn(w->user, w->st, w->hits);
        free(w);
    }
}

/* Moves every waiter of `jb` from the parked list to `*fired`.  The first
 * one gets `first_st`, the rest `rest_st`. */
static void detach_waiters(lmc_jobs *j, job *jb, lmc_job_status first_st, int64_t hits,
                           lmc_job_status rest_st, waiter **fired)
{
    bool first = true;
    for (waiter **p = &j->waiters; *p;) {
        waiter *w = *p;
        if (w->job != jb) {
            p = &w->next;
            continue;
        }
        *p = w->next;
        j->n_waiters--;
        w->st = first ? first_st : rest_st;
        w->hits = first ? hits : 0;
        first = false;
        w->next = *fired;
        *fired = w;
    }
}

static void remove_job(lmc_jobs *j, job *jb, waiter **fired)
{
    detach_waiters(j, jb, LMC_JOB_UNKNOWN, 0, LMC_JOB_UNKNOWN, fired);
    lmc_rid_table_remove(&j->table, &jb->node);
    free(jb);
}

static void *timer_main(void *arg);

lmc_jobs *lmc_jobs_new(const lmc_jobs_options *o)
{
    lmc_jobs *j = calloc(1, sizeof *j);
    if (!j)
        return NULL;
    j->o = *o;
    if (j->o.max_jobs == 0)
        j->o.max_jobs = 65536;
    if (j->o.max_waiters == 0)
        j->o.max_waiters = 4096;
    j->next_id = 1;
    if (lmc_rid_table_init(&j->table, 16) != 0) {
        free(j);
        return NULL;
    }
    pthread_mutex_init(&j->lock, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&j->wake, &ca);
    pthread_condattr_destroy(&ca);
    if (o->timer_thread && pthread_create(&j->thread, NULL, timer_main, j) == 0)
        j->has_thread = true;
    return j;
}

void lmc_jobs_free(lmc_jobs *j)
{
    if (!j)
        return;
    pthread_mutex_lock(&j->lock);
    j->stop = true;
    pthread_cond_signal(&j->wake);
    pthread_mutex_unlock(&j->lock);
    if (j->has_thread)
        pthread_join(j->thread, NULL);
    waiter *fired = NULL;
    while (j->waiters) {
        waiter *w = j->waiters;
        j->waiters = w->next;
        j->n_waiters--;
        w->st = LMC_JOB_RUNNING;
        w->next = fired;
        fired = w;
    }
    fire(fired);
    while (j->table.oldest) {
        job *jb = (job *)j->table.oldest;
        lmc_rid_table_remove(&j->table, &jb->node);
        free(jb);
    }
    lmc_rid_table_destroy(&j->table);
    pthread_cond_destroy(&j->wake);
    pthread_mutex_destroy(&j->lock);
    free(j);
}

/* Keeps the registry bounded: abandoned jobs (never queried) would leak. */
static void prune_locked(lmc_jobs *j, int64_t now, waiter **fired)
{
    while (j->table.oldest && (j->table.count >= j->o.max_jobs ||
                               (j->o.max_age_ms > 0 &&
                                now - j->table.oldest->last_used_ms > j->o.max_age_ms)))
        remove_job(j, (job *)j->table.oldest, fired);
}

uint64_t lmc_jobs_submit(lmc_jobs *j, const char *rid, size_t len, bool *replaced_unconsumed)
{
    waiter *fired = NULL;
    uint64_t id = 0;
    int64_t now = now_ms(j);
    pthread_mutex_lock(&j->lock);
    job *jb = (job *)lmc_rid_table_find(&j->table, rid, len);
    *replaced_unconsumed = jb != NULL;
    if (jb) {
        lmc_rid_table_touch(&j->table, &jb->node, now);
    } else {
        prune_locked(j, now, &fired);
        jb = calloc(1, sizeof *jb);
        if (jb && lmc_rid_table_insert(&j->table, &jb->node, rid, len, now) != 0) {
            free(jb);
            jb = NULL;
        }
    }
    if (jb) {
        id = j->next_id++;
        jb->id = id;
        jb->done = jb->lookup_known = false;
        jb->hits = jb->lookup_hits = 0;
    }
    pthread_mutex_unlock(&j->lock);
    fire(fired);
    return id;
}

static job *find_id(lmc_jobs *j, const char *rid, size_t len, uint64_t id)
{
    job *jb = (job *)lmc_rid_table_find(&j->table, rid, len);
    return jb && jb->id == id ? jb : NULL;
}

void lmc_jobs_set_lookup_hits(lmc_jobs *j, const char *rid, size_t len, uint64_t id,
                              int64_t hits)
{
    pthread_mutex_lock(&j->lock);
    job *jb = find_id(j, rid, len, id);
    if (jb) {
        jb->lookup_known = true;
        jb->lookup_hits = hits;
    }
    pthread_mutex_unlock(&j->lock);
}

bool lmc_jobs_is_current(lmc_jobs *j, const char *rid, size_t len, uint64_t id)
{
    pthread_mutex_lock(&j->lock);
    job *jb = find_id(j, rid, len, id);
    bool current = jb && !jb->done;
    pthread_mutex_unlock(&j->lock);
    return current;
}

void lmc_jobs_complete(lmc_jobs *j, const char *rid, size_t len, uint64_t id, int64_t hits)
{
    waiter *fired = NULL;
    pthread_mutex_lock(&j->lock);
    job *jb = find_id(j, rid, len, id);
    if (jb) {
        jb->done = true;
        jb->hits = hits;
        if (!jb->lookup_known) {
            jb->lookup_known = true;
            jb->lookup_hits = hits;
        }
        detach_waiters(j, jb, LMC_JOB_DONE, hits, LMC_JOB_UNKNOWN, &fired);
        if (fired) {  /* a waiter took the result: exactly once */
            lmc_rid_table_remove(&j->table, &jb->node);
            free(jb);
        }
    }
    pthread_mutex_unlock(&j->lock);
    fire(fired);
}

lmc_job_status lmc_jobs_query(lmc_jobs *j, const char *rid, size_t len, int64_t *hits)
{
    lmc_job_status st = LMC_JOB_UNKNOWN;
    *hits = 0;
    pthread_mutex_lock(&j->lock);
    job *jb = (job *)lmc_rid_table_find(&j->table, rid, len);
    if (jb && jb->done) {
        st = LMC_JOB_DONE;
        *hits = jb->hits;
        lmc_rid_table_remove(&j->table, &jb->node);
        free(jb);
    } else if (jb) {
        st = LMC_JOB_RUNNING;
        lmc_rid_table_touch(&j->table, &jb->node, now_ms(j));
    }
    pthread_mutex_unlock(&j->lock);
    return st;
}

lmc_job_status lmc_jobs_lookup_hits(lmc_jobs *j, const char *rid, size_t len, int64_t *hits)
{
    lmc_job_status st = LMC_JOB_UNKNOWN;
    *hits = 0;
    pthread_mutex_lock(&j->lock);
    job *jb = (job *)lmc_rid_table_find(&j->table, rid, len);
    if (jb && jb->lookup_known) {
        st = LMC_JOB_DONE;
        *hits = jb->lookup_hits;
    } else if (jb) {
        st = LMC_JOB_RUNNING;
    }
    pthread_mutex_unlock(&j->lock);
    return st;
}

lmc_job_status lmc_jobs_wait(lmc_jobs *j, const char *rid, size_t len, int64_t timeout_ms,
                             lmc_job_waiter_fn fn, void *user, int64_t *hits)
{
    lmc_job_status st = lmc_jobs_query(j, rid, len, hits);
    if (st != LMC_JOB_RUNNING)
        return st;
    waiter *w = calloc(1, sizeof *w);
    if (!w)
        return LMC_JOB_RUNNING;   /* answer None rather than block */
    pthread_mutex_lock(&j->lock);
    if (j->n_waiters >= j->o.max_waiters) {
        /* Each parked wait holds its request's frames: a bound, so that
         * waits on a slow prefetch cannot pile up (issue 17).  None now
         * is what a timeout answers; the client asks again. */
        pthread_mutex_unlock(&j->lock);
        free(w);
        return LMC_JOB_RUNNING;
    }
    /* Re-check: the job may have completed between query() and here. */
    job *jb = (job *)lmc_rid_table_find(&j->table, rid, len);
    if (!jb || jb->done) {
        pthread_mutex_unlock(&j->lock);
        free(w);
        return lmc_jobs_query(j, rid, len, hits);
    }
    *w = (waiter){.job = jb, .fn = fn, .user = user,
                  .deadline_ms = now_ms(j) + (timeout_ms > 0 ? timeout_ms : 0),
                  .next = j->waiters};
    j->waiters = w;
    j->n_waiters++;
    pthread_cond_signal(&j->wake);
    pthread_mutex_unlock(&j->lock);
    return LMC_JOB_WAITING;
}

bool lmc_jobs_drop(lmc_jobs *j, const char *rid, size_t len)
{
    waiter *fired = NULL;
    pthread_mutex_lock(&j->lock);
    job *jb = (job *)lmc_rid_table_find(&j->table, rid, len);
    if (jb)
        remove_job(j, jb, &fired);
    pthread_mutex_unlock(&j->lock);
    fire(fired);
    return jb != NULL;
}

/* Detaches expired waiters; returns the earliest remaining deadline or
 * INT64_MAX. */
static int64_t expire_locked(lmc_jobs *j, int64_t now, waiter **fired, size_t *n)
{
    int64_t next = INT64_MAX;
    for (waiter **p = &j->waiters; *p;) {
        waiter *w = *p;
        if (w->deadline_ms <= now) {
            *p = w->next;
            j->n_waiters--;
            w->st = LMC_JOB_RUNNING;
            w->next = *fired;
            *fired = w;
            (*n)++;
        } else {
            next = w->deadline_ms < next ? w->deadline_ms : next;
            p = &w->next;
        }
    }
    return next;
}

size_t lmc_jobs_expire(lmc_jobs *j)
{
    waiter *fired = NULL;
    size_t n = 0;
    pthread_mutex_lock(&j->lock);
    expire_locked(j, now_ms(j), &fired, &n);
    pthread_mutex_unlock(&j->lock);
    fire(fired);
    return n;
}

/* Sleeps until the earliest deadline (no polling), fires expired waiters. */
static void *timer_main(void *arg)
{
    lmc_jobs *j = arg;
    pthread_mutex_lock(&j->lock);
    while (!j->stop) {
        waiter *fired = NULL;
        size_t n = 0;
        int64_t next = expire_locked(j, now_ms(j), &fired, &n);
        if (fired) {
            pthread_mutex_unlock(&j->lock);
            fire(fired);
            pthread_mutex_lock(&j->lock);
            continue;
        }
        if (next == INT64_MAX) {
            pthread_cond_wait(&j->wake, &j->lock);
        } else {
            struct timespec ts = {.tv_sec = next / 1000, .tv_nsec = (next % 1000) * 1000000};
            pthread_cond_timedwait(&j->wake, &j->lock, &ts);
        }
    }
    pthread_mutex_unlock(&j->lock);
    return NULL;
}

size_t lmc_jobs_count(lmc_jobs *j)
{
    pthread_mutex_lock(&j->lock);
    size_t n = j->table.count;
    pthread_mutex_unlock(&j->lock);
    return n;
}

size_t lmc_jobs_waiter_count(lmc_jobs *j)
{
    pthread_mutex_lock(&j->lock);
    size_t n = j->n_waiters;
    pthread_mutex_unlock(&j->lock);
    return n;
}
