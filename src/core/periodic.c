/* The periodic thread (core/periodic.h). */
#include "core/periodic.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <time.h>

struct lmc_core_periodic {
    int64_t period_ms;
    lmc_core_periodic_fn fn;
    void *user;
    pthread_mutex_t lock;
    pthread_cond_t wake; /* on CLOCK_MONOTONIC: a clock step neither stalls nor hurries it */
    bool woken;
    bool stop;
    pthread_t thread;
};

static struct timespec period_from_now(int64_t period_ms)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    int64_t at_ms = (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000 + period_ms;
    return (struct timespec){.tv_sec = at_ms / 1000, .tv_nsec = (at_ms % 1000) * 1000000};
}

static void *periodic_main(void *arg)
{
    lmc_core_periodic *p = arg;
    pthread_mutex_lock(&p->lock);
    while (!p->stop) {
        struct timespec deadline = period_from_now(p->period_ms);
        while (!p->stop && !p->woken &&
               pthread_cond_timedwait(&p->wake, &p->lock, &deadline) == 0)
            ;
        if (p->stop)
            break;
        p->woken = false;
        /* Unlocked, so that wake and stop never wait for the callback. */
        pthread_mutex_unlock(&p->lock);
        p->fn(p->user);
        pthread_mutex_lock(&p->lock);
    }
    pthread_mutex_unlock(&p->lock);
    return NULL;
}

lmc_core_periodic *lmc_core_periodic_start(const char *name, int64_t period_ms,
                                           lmc_core_periodic_fn fn, void *user)
{
    lmc_core_periodic *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    *p = (lmc_core_periodic){.period_ms = period_ms > 0 ? period_ms : 1, .fn = fn, .user = user};
    pthread_condattr_t ca;
    if (pthread_condattr_init(&ca) != 0)
        goto fail_alloc;
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    int cond_rc = pthread_cond_init(&p->wake, &ca);
    pthread_condattr_destroy(&ca);
    if (cond_rc != 0)
        goto fail_alloc;
    if (pthread_mutex_init(&p->lock, NULL) != 0)
        goto fail_cond;
    if (pthread_create(&p->thread, NULL, periodic_main, p) != 0)
        goto fail_mutex;
    if (name)
        pthread_setname_np(p->thread, name);
    return p;
fail_mutex:
    pthread_mutex_destroy(&p->lock);
fail_cond:
    pthread_cond_destroy(&p->wake);
fail_alloc:
    free(p);
    return NULL;
}

void lmc_core_periodic_wake(lmc_core_periodic *p)
{
    pthread_mutex_lock(&p->lock);
    p->woken = true;
    pthread_cond_signal(&p->wake);
    pthread_mutex_unlock(&p->lock);
}

void lmc_core_periodic_stop(lmc_core_periodic *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->lock);
    p->stop = true;
    pthread_cond_signal(&p->wake);
    pthread_mutex_unlock(&p->lock);
    pthread_join(p->thread, NULL);
    pthread_cond_destroy(&p->wake);
    pthread_mutex_destroy(&p->lock);
    free(p);
}
