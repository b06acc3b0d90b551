/* L1 listener events (l1_manager.h, "Locking"): queued under the manager's
 * mutex in the order the calls took it, delivered after it is released.
 *
 * A call allocates its events before it changes anything, so that a call
 * which cannot allocate them fails whole (-1, nothing changed) instead of
 * changing L1 behind the back of the LRU policy and the L2 write-behind.
 * Only a give-back, which must never fail, can be left without its event:
 * it then counts the keys as lost, logged and visible in the status. */
#include <stdlib.h>
#include <string.h>

#include "obs/log.h"
#include "storage/l1/l1_internal.h"

const char *lmc_l1_event_kind_name(lmc_l1_event_kind kind)
{
    static const char *const names[] = {
        "write_reserved", "write_finished", "write_finished_read_reserved",
        "read_reserved", "read_finished", "deleted", "accessed",
    };
    return (unsigned)kind < sizeof(names) / sizeof(names[0]) ? names[kind] : "unknown";
}

/* NULL when nobody listens or memory ran out; the caller tells them apart
 * with m->num_listeners. */
l1_event *lmc_l1_event_begin(lmc_l1_manager *m, lmc_l1_event_kind kind, size_t capacity)
{
    if (m->num_listeners == 0 || capacity == 0)
        return NULL;
    l1_event *ev = malloc(sizeof(*ev) + capacity * sizeof(lmc_object_key));
    if (!ev)
        return NULL;
    ev->next = NULL;
    ev->kind = kind;
    ev->n = 0;
    return ev;
}

void lmc_l1_event_add(lmc_l1_manager *m, l1_event *ev, const lmc_object_key *key)
{
    if (ev) {
        ev->keys[ev->n++] = *key;
    } else if (m->num_listeners > 0) {
        if (m->events_lost++ == 0)
            LMC_ERROR("L1: out of memory for a listener event; its keys are lost to the "
                      "eviction policy and the L2 write-behind (status events_lost)");
    }
}

/* Queues the event (in mutex order) or drops an empty one. */
void lmc_l1_event_commit(lmc_l1_manager *m, l1_event *ev)
{
    if (!ev)
        return;
    if (ev->n == 0) {
        free(ev);
        return;
    }
    /* The event outlives the call: its copies hold the names until
     * delivered (the caller's keys hold them until here). */
    lmc_keys_hold(ev->keys, ev->n);
    if (m->queue_tail)
        m->queue_tail->next = ev;
    else
        m->queue_head = ev;
    m->queue_tail = ev;
}

static l1_event *detach_queue(lmc_l1_manager *m, l1_listener *snapshot, size_t *num)
{
    pthread_mutex_lock(&m->mutex);
    l1_event *batch = m->queue_head;
    m->queue_head = m->queue_tail = NULL;
    memcpy(snapshot, m->listeners, m->num_listeners * sizeof(*snapshot));
    *num = m->num_listeners;
    pthread_mutex_unlock(&m->mutex);
    return batch;
}

static void deliver(l1_event *batch, const l1_listener *listeners, size_t num)
{
    while (batch) {
        l1_event *next = batch->next;
        for (size_t i = 0; i < num; i++)
            listeners[i].fn(listeners[i].user, batch->kind, batch->keys, batch->n);
        lmc_keys_drop(batch->keys, batch->n);
        free(batch);
        batch = next;
    }
}

static bool queue_is_empty(lmc_l1_manager *m)
{
    pthread_mutex_lock(&m->mutex);
    bool empty = m->queue_head == NULL;
    pthread_mutex_unlock(&m->mutex);
    return empty;
}

/* Called with the mutex released.  Whoever holds dispatch_mutex delivers
 * everything queued; after letting go it re-checks the queue, so events
 * queued by a thread whose trylock failed are never stranded. */
static void dispatch_events(lmc_l1_manager *m)
{
    l1_listener snapshot[LMC_L1_MAX_LISTENERS];
    size_t num;
    while (pthread_mutex_trylock(&m->dispatch_mutex) == 0) {
        l1_event *batch;
        while ((batch = detach_queue(m, snapshot, &num)) != NULL)
            deliver(batch, snapshot, num);
        pthread_mutex_unlock(&m->dispatch_mutex);
        if (queue_is_empty(m))
            return;
    }
}

void lmc_l1_unlock_and_dispatch(lmc_l1_manager *m)
{
    if (m->check_books && !lmc_l1_books_balance(m, true)) {
        LMC_ERROR("L1: the books do not balance after a call (docs/storage.md, "
                  "\"Invariants\"); aborting this debug run");
        abort();
    }
    pthread_mutex_unlock(&m->mutex);
    dispatch_events(m);
}

int lmc_l1_manager_add_listener(lmc_l1_manager *m, lmc_l1_listener_fn fn, void *user)
{
    int rc = -1;
    pthread_mutex_lock(&m->mutex);
    if (fn && m->num_listeners < LMC_L1_MAX_LISTENERS) {
        m->listeners[m->num_listeners++] = (l1_listener){fn, user};
        rc = 0;
    }
    pthread_mutex_unlock(&m->mutex);
    return rc;
}

void lmc_l1_manager_remove_listener(lmc_l1_manager *m, lmc_l1_listener_fn fn, void *user)
{
    pthread_mutex_lock(&m->mutex);
    for (size_t i = 0; i < m->num_listeners; i++) {
        if (m->listeners[i].fn == fn && m->listeners[i].user == user) {
            memmove(&m->listeners[i], &m->listeners[i + 1],
                    (m->num_listeners - i - 1) * sizeof(m->listeners[0]));
            m->num_listeners--;
            break;
        }
    }
    pthread_mutex_unlock(&m->mutex);
}
