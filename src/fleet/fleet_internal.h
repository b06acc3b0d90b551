/* Private to src/coord: the state the registrar (registrar.c), the
 * reporter (reporter.c) and the facade (coord.c) share. */
#ifndef LMC_FLEET_FLEET_INTERNAL_H
#define LMC_FLEET_FLEET_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "fleet/fleet.h"
#include "fleet/http_client.h"
#include "fleet/event_batcher.h"
#include "storage/storage_events.h"

#define COORD_URL_MAX 1024
#define COORD_ID_MAX 256
#define COORD_ERROR_MAX 200
#define COORD_REQUEST_TIMEOUT_S 10.0   /* registration and heartbeat */
#define COORD_EVENTS_TIMEOUT_S 2.0     /* POST /events and /l2/events */
#define COORD_DELETE_TIMEOUT_S 2.0     /* deregistration at shutdown */
#define COORD_EVENT_RING 65536         /* cache-event entries held at most */
#define COORD_L2_USAGE_MAX 65536       /* L2 usage events held at most */
#define COORD_WARN_EVERY_S 60.0        /* repeated failures: one warning a minute */
#define COORD_P2P_PEERS_MAX 256        /* P2P peers held at most (docs/p2p.md, "Discovery") */
#define COORD_P2P_MISS_LIMIT 3         /* polls a peer may be missing before it is dropped */

enum { COORD_P2P_DISCONNECTED, COORD_P2P_UNREGISTERED, COORD_P2P_REGISTERED };

/* A P2P peer as GET /instances lists it. */
typedef struct lmc_fleet_p2p_peer {
    char instance_id[COORD_ID_MAX];
    char ip[256];
    char url[1025];                /* its p2p_advertised_url */
    int mq_port;
    unsigned misses;               /* polls in a row that did not list it */
    bool seen;                     /* listed by the poll under way */
} lmc_fleet_p2p_peer;

/* The older L2 usage stream's buffer (docs/fleet.md, "L2 usage stream"). */
typedef struct l2_usage_event {
    lmc_object_key key;            /* kept by lmc_fleet_event_key_keep */
    char *names;                   /* its own copy of the names, or NULL */
    uint64_t bytes;
    bool is_store;                 /* else a lookup */
} l2_usage_event;

/* Gives back the key references of n buffered L2 usage events. */
static inline void fleet_drop_l2_events(const l2_usage_event *ev, size_t n)
{
    for (size_t i = 0; i < n; i++)
        lmc_fleet_event_key_release(&ev[i].key, ev[i].names);
}

/* A rate-limited warning: the first failure, then one a minute. */
typedef struct warn_limiter {
    uint64_t streak;               /* failures in a row */
    double last_warn;              /* monotonic seconds */
} warn_limiter;

struct lmc_fleet {
    /* Set at start, read-only after. */
    char url[COORD_URL_MAX];       /* base URL, no trailing '/' */
    char shown_url[COORD_URL_MAX]; /* url without user:password, for status and logs */
    char configured_id[COORD_ID_MAX];
    char advertise_ip_opt[64];     /* --coordinator-advertise-ip, "" = outbound */
    char *auth_token;              /* owned copy; NULL = none */
    int http_port;
    double heartbeat_interval, event_interval, l2_interval;
    int64_t incarnation;
    lmc_storage_manager *sm;
    bool posting;                  /* a coordinator URL: register and post */
    lmc_fleet_tap tap;             /* fn NULL: none */
    char l1_backend[LMC_CEV_BACKEND_MAX];

    atomic_bool stop;
    pthread_mutex_t mu;            /* guards the registration state and wakes sleepers */
    pthread_cond_t wake;
    pthread_t registrar, reporter, discovery;
    bool registrar_running, reporter_running, discovery_running, stopped;

    /* Registration state (mu). */
    char advertise_ip[64];
    char held_id[COORD_ID_MAX];    /* "" = not registered */
    char last_error[COORD_ERROR_MAX];
    double last_heartbeat;         /* wall clock of the last 2xx heartbeat or registration */
    uint64_t registrations, heartbeats_ok, request_failures, deregistrations;
    warn_limiter reg_warn;

    /* Cache-event stream (NULL when off). */
    lmc_fleet_event_batcher *events;
    lmc_storage_listener l1_listener;
    bool l1_listening;
    lmc_l2_placement_sink sink;
    bool sink_set;
    warn_limiter event_warn;       /* reporter thread only */
    warn_limiter unencodable_warn; /* reporter thread only */

    /* L2 usage stream (l2_mu). */
    bool l2_usage_on;
    pthread_mutex_t l2_mu;
    l2_usage_event *l2_buf;
    size_t l2_n;
    uint64_t l2_seq, l2_batches_sent, l2_batches_dropped, l2_events_dropped;
    warn_limiter l2_warn;          /* reporter thread only */

    /* P2P (p2p_url "" = off); registration sends p2p_url and mq_port. */
    char p2p_url[1025];
    int mq_port;
    pthread_mutex_t p2p_mu;        /* guards what follows */
    int p2p_state;
    lmc_fleet_p2p_peer *peers;     /* COORD_P2P_PEERS_MAX of them */
    size_t n_peers;
    uint64_t p2p_polls, peers_added, peers_replaced, peers_removed, peers_refused;
    lmc_fleet_peer_fn peer_fn;
    void *peer_user;
};

double lmc_fleet_wall_now(void);
double lmc_fleet_mono_now(void);
/* Sleeps up to `seconds` or until stop; false once stopping. */
bool lmc_fleet_sleep(lmc_fleet *c, double seconds);
/* true when this failure should be logged (and counts it). */
bool lmc_fleet_warn_due(warn_limiter *w);
/* The failure streak that just ended (0 when there was none). */
uint64_t lmc_fleet_warn_reset(warn_limiter *w);
/* "METHOD url-path: why" of a failed exchange, into buf. */
void lmc_fleet_describe_failure(const char *what, const lmc_fleet_reply *r, char *buf, size_t len);

void *lmc_fleet_registrar_main(void *arg);
void lmc_fleet_deregister(lmc_fleet *c);
void *lmc_fleet_reporter_main(void *arg);
void *lmc_fleet_discovery_main(void *arg);
/* Subscribes to L1 and L2 placements (reporter.c); 0 or -1. */
int lmc_fleet_attach_sources(lmc_fleet *c);
void lmc_fleet_detach_sources(lmc_fleet *c);
/* The capacity declaration of every compartment from the storage status. */
void lmc_fleet_declare_capacity(lmc_fleet *c);

#endif
