#include "obs/event_bus.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>

#define MAX_SUBSCRIBERS 32

typedef struct {
    const char *type;
    lmc_event_fn fn;
    void *user;
} subscriber;

struct lmc_event_bus {
    pthread_mutex_t lock;
    pthread_cond_t ready;
    pthread_cond_t idle;      /* signalled when the queue empties */
    bool delivering;
    pthread_t thread;
    bool stopping;
    lmc_event *ring;          /* capacity slots, head..head+count */
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

static void *drain_main(void *arg)
{
    lmc_event_bus *bus = arg;
    pthread_mutex_lock(&bus->lock);
    for (;;) {
        while (bus->count == 0 && !bus->stopping)
            pthread_cond_wait(&bus->ready, &bus->lock);
        if (bus->count == 0)
            break;
        lmc_event ev = bus->ring[bus->head];
        bus->head = (bus->head + 1) % bus->capacity;
        bus->count--;
        bus->delivering = true;
        subscriber subs[MAX_SUBSCRIBERS];
        size_t n = bus->n_subs;
        memcpy(subs, bus->subs, n * sizeof subs[0]);
        pthread_mutex_unlock(&bus->lock);
        deliver(&ev, subs, n); /* subscribers run without the bus lock */
        json_decref(ev.metadata);
        pthread_mutex_lock(&bus->lock);
        bus->delivered++;
        bus->delivering = false;
        if (bus->count == 0)
            pthread_cond_broadcast(&bus->idle);
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
    pthread_cond_init(&bus->ready, NULL);
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

void lmc_event_bus_publish(lmc_event_bus *bus, const char *type, const char *session_id,
                           json_t *metadata)
{
    struct timeval tv;
    gettimeofday(&tv, NULL);
    lmc_event ev = {.type = type, .timestamp = tv.tv_sec + tv.tv_usec / 1e6, .metadata = metadata};
    snprintf(ev.session_id, sizeof ev.session_id, "%s", session_id ? session_id : "");
    pthread_mutex_lock(&bus->lock);
    bus->published++;
    if (bus->count == bus->capacity || bus->stopping) {
        bus->dropped++;
        pthread_mutex_unlock(&bus->lock);
        json_decref(metadata);
        return;
    }
    bus->ring[(bus->head + bus->count) % bus->capacity] = ev;
    bus->count++;
    pthread_cond_signal(&bus->ready);
    pthread_mutex_unlock(&bus->lock);
}

lmc_event_bus_stats lmc_event_bus_get_stats(lmc_event_bus *bus)
{
    pthread_mutex_lock(&bus->lock);
    lmc_event_bus_stats st = {bus->published, bus->delivered, bus->dropped, bus->count, 0};
    if (bus->count)
        st.oldest_timestamp = bus->ring[bus->head].timestamp;
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
