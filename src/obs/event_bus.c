#include "obs/event_bus.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>

#define MAX_SUBSCRIBERS 32
/* After a wake-up the drain thread stays awake this long, delivering what
 * arrived meanwhile in one batch; publishers only wake a sleeping thread.
 * On a busy server a request thread then never pays for a futex wake-up
 * (an IPI to an idle CPU: tens of µs on some VMs), at the cost of events
 * reaching subscribers up to this much later. */
#define LINGER_NS 5000000L

typedef struct {
    const char *type;
    lmc_event_fn fn;
    void *user;
} subscriber;

typedef struct {
    lmc_event ev;
    lmc_event_build_fn build;   /* non-NULL: ev.metadata is still build(arg) */
    void *arg;
} queued_event;

struct lmc_event_bus {
    pthread_mutex_t lock;
    pthread_cond_t ready;
    pthread_cond_t idle;      /* signalled when the queue empties */
    bool delivering;
    bool awake;               /* drain thread running or lingering: no need to signal */
    bool flush;               /* lmc_event_bus_drain() waits: deliver without lingering */
    pthread_t thread;
    bool stopping;
    queued_event *ring;       /* capacity slots, head..head+count */
    size_t capacity, head, count;
    subscriber subs[MAX_SUBSCRIBERS];
    size_t n_subs;
    uint64_t published, delivered, dropped;
};

static void deliver(const lmc_event *ev, const subscriber *subs, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (!subs[i].type || strcmp(subs[i].type, ev->type) == 0)
            subs[i].fn(ev, subs[i].user);
    }
}

/* Waits for work with bus->lock held.  An awake thread lingers (a timed
 * wait nobody signals, except a flush or a filling queue) and falls asleep
 * once a linger passes with nothing published. */
static void wait_for_events(lmc_event_bus *bus)
{
    while (bus->count == 0 && !bus->stopping) {
        bus->flush = false;   /* nothing left to flush */
        if (!bus->awake) {
            pthread_cond_wait(&bus->ready, &bus->lock);
            continue;
        }
        struct timespec until;
        clock_gettime(CLOCK_MONOTONIC, &until);
        until.tv_nsec += LINGER_NS;
        if (until.tv_nsec >= 1000000000L) {
            until.tv_sec++;
            until.tv_nsec -= 1000000000L;
        }
        int rc = 0;
        while (rc == 0 && !bus->flush && !bus->stopping && bus->count < bus->capacity / 2)
            rc = pthread_cond_timedwait(&bus->ready, &bus->lock, &until);
        if (bus->count == 0)
            bus->awake = false;   /* a quiet linger: sleep until the next publish */
    }
}

static void *drain_main(void *arg)
{
    lmc_event_bus *bus = arg;
    pthread_mutex_lock(&bus->lock);
    for (;;) {
        wait_for_events(bus);
        if (bus->count == 0)
            break;
        queued_event q = bus->ring[bus->head];
        bus->head = (bus->head + 1) % bus->capacity;
        bus->count--;
        bus->delivering = true;
        subscriber subs[MAX_SUBSCRIBERS];
        size_t n = bus->n_subs;
        memcpy(subs, bus->subs, n * sizeof subs[0]);
        pthread_mutex_unlock(&bus->lock);
        if (q.build)
            q.ev.metadata = q.build(q.arg);
        deliver(&q.ev, subs, n); /* subscribers run without the bus lock */
        json_decref(q.ev.metadata);
        pthread_mutex_lock(&bus->lock);
        bus->delivered++;
        bus->delivering = false;
        if (bus->count == 0) {
            bus->flush = false;
            pthread_cond_broadcast(&bus->idle);
        }
    }
    pthread_cond_broadcast(&bus->idle);
    pthread_mutex_unlock(&bus->lock);
    return NULL;
}

lmc_event_bus *lmc_event_bus_new(size_t capacity)
{
    if (capacity == 0)
        return NULL;
    lmc_event_bus *bus = calloc(1, sizeof *bus);
    if (!bus)
        return NULL;
    bus->ring = calloc(capacity, sizeof *bus->ring);
    if (!bus->ring) {
        free(bus);
        return NULL;
    }
    bus->capacity = capacity;
    pthread_mutex_init(&bus->lock, NULL);
    pthread_condattr_t monotonic;   /* the linger must not jump with the wall clock */
    pthread_condattr_init(&monotonic);
    pthread_condattr_setclock(&monotonic, CLOCK_MONOTONIC);
    pthread_cond_init(&bus->ready, &monotonic);
    pthread_condattr_destroy(&monotonic);
    pthread_cond_init(&bus->idle, NULL);
    if (pthread_create(&bus->thread, NULL, drain_main, bus) != 0) {
        pthread_mutex_destroy(&bus->lock);
        pthread_cond_destroy(&bus->ready);
        pthread_cond_destroy(&bus->idle);
        free(bus->ring);
        free(bus);
        return NULL;
    }
    pthread_setname_np(bus->thread, "lmc-events");
    return bus;
}

int lmc_event_bus_subscribe(lmc_event_bus *bus, const char *type, lmc_event_fn fn, void *user)
{
    int rc = -1;
    pthread_mutex_lock(&bus->lock);
    if (bus->n_subs < MAX_SUBSCRIBERS) {
        bus->subs[bus->n_subs++] = (subscriber){type, fn, user};
        rc = 0;
    }
    pthread_mutex_unlock(&bus->lock);
    return rc;
}

static void enqueue(lmc_event_bus *bus, const char *type, const char *session_id,
                    json_t *metadata, lmc_event_build_fn build, void *arg)
{
    struct timeval tv;
    gettimeofday(&tv, NULL);
    queued_event q = {
        .ev = {.type = type, .timestamp = tv.tv_sec + tv.tv_usec / 1e6, .metadata = metadata},
        .build = build,
        .arg = arg,
    };
    snprintf(q.ev.session_id, sizeof q.ev.session_id, "%s", session_id ? session_id : "");
    pthread_mutex_lock(&bus->lock);
    bus->published++;
    if (bus->count == bus->capacity || bus->stopping) {
        bus->dropped++;
        pthread_mutex_unlock(&bus->lock);
        json_decref(build ? build(arg) : metadata);
        return;
    }
    bus->ring[(bus->head + bus->count) % bus->capacity] = q;
    bus->count++;
    bool wake = !bus->awake || bus->count == bus->capacity / 2;
    bus->awake = true;
    pthread_mutex_unlock(&bus->lock);
    if (wake)
        pthread_cond_signal(&bus->ready);
}

void lmc_event_bus_publish(lmc_event_bus *bus, const char *type, const char *session_id,
                           json_t *metadata)
{
    enqueue(bus, type, session_id, metadata, NULL, NULL);
}

void lmc_event_bus_publish_deferred(lmc_event_bus *bus, const char *type, const char *session_id,
                                    lmc_event_build_fn build, void *arg)
{
    enqueue(bus, type, session_id, NULL, build, arg);
}

lmc_event_bus_stats lmc_event_bus_get_stats(lmc_event_bus *bus)
{
    pthread_mutex_lock(&bus->lock);
    lmc_event_bus_stats st = {bus->published, bus->delivered, bus->dropped, bus->count, 0};
    if (bus->count)
        st.oldest_timestamp = bus->ring[bus->head].ev.timestamp;
    pthread_mutex_unlock(&bus->lock);
    return st;
}

int lmc_event_bus_drain(lmc_event_bus *bus, double timeout_s)
{
    struct timespec deadline;
    clock_gettime(CLOCK_REALTIME, &deadline);
    double whole = (double)(time_t)timeout_s;
    deadline.tv_sec += (time_t)timeout_s;
    deadline.tv_nsec += (long)((timeout_s - whole) * 1e9);
    if (deadline.tv_nsec >= 1000000000L) {
        deadline.tv_sec++;
        deadline.tv_nsec -= 1000000000L;
    }
    int rc = 0;
    pthread_mutex_lock(&bus->lock);
    if (bus->count > 0) {
        bus->flush = true;   /* cut the linger short */
        pthread_cond_signal(&bus->ready);
    }
    while ((bus->count > 0 || bus->delivering) && rc == 0)
        rc = pthread_cond_timedwait(&bus->idle, &bus->lock, &deadline);
    bool drained = bus->count == 0 && !bus->delivering;
    pthread_mutex_unlock(&bus->lock);
    return drained ? 0 : -1;
}

void lmc_event_bus_free(lmc_event_bus *bus)
{
    if (!bus)
        return;
    pthread_mutex_lock(&bus->lock);
    bus->stopping = true;
    pthread_cond_broadcast(&bus->ready);
    pthread_mutex_unlock(&bus->lock);
    pthread_join(bus->thread, NULL);
    pthread_mutex_destroy(&bus->lock);
    pthread_cond_destroy(&bus->ready);
    pthread_cond_destroy(&bus->idle);
    free(bus->ring);
    free(bus);
}
