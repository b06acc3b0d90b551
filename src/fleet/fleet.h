/* The fleet side of lmcached (docs/fleet.md): registration with the
 * coordinator (register, heartbeat, deregister), the cache-event stream
 * (POST /events) and the older L2 usage stream (POST /l2/events).
 *
 * Everything runs on the subsystem's own threads; nothing here blocks or
 * fails the server, and the request path only copies keys into a bounded
 * buffer (with event reporting on). */
#ifndef LMC_FLEET_FLEET_H
#define LMC_FLEET_FLEET_H

#include <jansson.h>

#include "config/config.h"
#include "fleet/event_batcher.h"
#include "obs/metrics.h"
#include "storage/storage_manager.h"

typedef struct lmc_fleet lmc_fleet;

/* A copy of the cache-event stream for the events trace (docs/trace.md,
 * "The events level"): `fn` gets each batch once, in the wire form of
 * `POST /events` (on the reporter thread, before the post), and the
 * start and stop marks of the stream (on the thread that starts or stops
 * the fleet).  `args` is borrowed for the call. */
typedef enum { LMC_FLEET_TAP_BATCH, LMC_FLEET_TAP_LIFECYCLE } lmc_fleet_tap_kind;
typedef struct lmc_fleet_tap {
    void (*fn)(void *user, lmc_fleet_tap_kind kind, const json_t *args);
    void *user;
} lmc_fleet_tap;

/* Starts the registrar (and the event streams the configuration asks
 * for) for a server whose HTTP frontend listens on `http_port`.  `sm` may
 * be NULL (no events then).  With a tap (NULL: none) the cache-event
 * stream is built whatever --coordinator-event-reporting says, and
 * without a coordinator URL it is only tapped: nothing registers or
 * posts.  NULL when there is neither a URL nor a tap, or on allocation
 * failure (logged; the server runs without). */
lmc_fleet *lmc_fleet_start(const lmc_config *cfg, int http_port, lmc_storage_manager *sm,
                           const lmc_fleet_tap *tap);
/* Stops the threads (a last event flush, then DELETE of the
 * registration, each bounded by a short timeout) and unsubscribes from the
 * storage manager, which must still be open.  NULL is a no-op. */
void lmc_fleet_stop(lmc_fleet *c);
/* After the storage manager is closed: a listener call that began before
 * the stop may land until then.  Stops first if stop was not called (the
 * storage manager must then still be open). */
void lmc_fleet_free(lmc_fleet *c);

/* The "coordinator" object of /status.  New reference. */
json_t *lmc_fleet_status(lmc_fleet *c);
/* {p2p_enabled, p2p_state, p2p_peer_count, p2p_peers, p2p_discovery} for
 * /status (docs/p2p.md, "Discovery"); c may be NULL (P2P off). */
json_t *lmc_fleet_p2p_status(lmc_fleet *c);
/* Told of every P2P peer discovery adds or replaces (present) and drops
 * (!present), from the discovery thread; the peers known when it is set
 * are told at once.  Not called after lmc_fleet_stop returned. */
typedef void (*lmc_fleet_peer_fn)(void *user, const char *instance_id, const char *ip,
                                  int mq_port, const char *url, bool present);
void lmc_fleet_set_peer_listener(lmc_fleet *c, lmc_fleet_peer_fn fn, void *user);
/* Where the cache-event stream finds the tokens and position of a stored
 * chunk of chunk_size tokens (docs/fleet.md, "Cache-event stream"): the
 * server's KV event log.  NULL c or no event stream: nothing. */
void lmc_fleet_set_token_source(lmc_fleet *c, lmc_fleet_event_tokens_fn fn, void *user,
                                size_t chunk_size);
/* lmc_metrics_collect_fn: the lmcache_mp_coordinator_* families
 * (docs/metrics.md); `user` is the lmc_fleet. */
void lmc_fleet_collect_metrics(lmc_metrics *r, void *user);

#endif
