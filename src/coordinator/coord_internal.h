/* The coordinator process: shared by the files of src/coordinator/. */
#ifndef LMC_COORDINATOR_COORD_INTERNAL_H
#define LMC_COORDINATOR_COORD_INTERNAL_H

#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>

#include "core/periodic.h"
#include "coordinator/coord_db.h"
#include "coordinator/coord_events.h"
#include "coordinator/coord_state.h"
#include "coordinator/coordinator.h"
#include "hash/token_hash.h"
#include "http/http_server.h"
#include "obs/metrics.h"

#define COORD_MAX_MEMBERS 1024
#define COORD_MAX_BODY ((size_t)16 << 20)   /* bodies of the bulk routes (docs/coordinator.md) */
#define COORD_MAX_SMALL_BODY ((size_t)1 << 20) /* bodies of the other routes */
#define COORD_MAX_TOKENS ((size_t)1 << 20)  /* token ids in one token-form request */
#define COORD_MAX_DELETE_KEYS 10000         /* keys per DELETE /cache/objects */
#define COORD_MAX_PAGE 10000                /* GET /directory/keys limit */
#define COORD_OUTBOUND_TIMEOUT_S 30L

typedef struct {
    char id[COORD_INSTANCE_ID_MAX + 1];
    char ip[256];
    int http_port, mq_port;
    char *p2p_url;
    json_t *metadata;
    double registered_wall;  /* Unix time */
    double heartbeat_mono;   /* CLOCK_MONOTONIC seconds */
    bool resync_done;
} coordinator_member;

typedef struct {
    atomic_ullong sweeps, instances_expired, eviction_passes, eviction_keys_requested,
        eviction_requests, eviction_request_failures, resync_keys, resync_pages;
} coordinator_counters;

typedef struct coordinator_metrics coordinator_metrics;

struct coordinator {
    coordinator_config cfg;
    pthread_mutex_t mu;  /* guards st, members, db */
    pthread_cond_t wake; /* with mu: the loops' sleeps, ended early by stop */
    bool stopping;
    coordinator_state st;
    coordinator_member **members;
    size_t n_members;
    coordinator_db *db;
    lmc_token_hasher *hasher;
    struct coordinator_blend *blend; /* NULL unless ENABLE_BLEND_LOOKUP (own lock) */
    lmc_http_routes *routes; /* the coordinator's rows (coord_routes.c) */
    lmc_http_server *http;   /* mu: set once it serves; its counters feed /metrics */
    int port;
    lmc_core_periodic *sweep, *evict; /* NULL when their interval is 0 */
    pthread_t resync_thread;
    bool resync_running;
    coordinator_counters ctr;
    coordinator_metrics *metrics; /* GET /metrics; NULL when METRICS_ENABLED is false */
    uint64_t rng;
    double keys_full_warned; /* mu: monotonic time of the last "directory full" warning */
    double not_saved_warned; /* mu: the same for requests the database did not take */
    uint64_t not_saved;      /* mu: requests answered 503 for the database */
};

/* Logs that new keys were refused for the directory's bound, at most once
 * a minute (mu held). */
void coordinator_warn_keys_full(lmc_coord *co);
/* Monotonic and wall clocks in seconds. */
double coordinator_now_mono(void);
double coordinator_now_wall(void);
/* Sleeps up to seconds on co->wake (mu held); true when stopping. */
bool coordinator_wait(lmc_coord *co, double seconds);

/* ---- HTTP (coord_http.c, coord_routes.c) ------------------------------------ */
/* {"detail": "<reason>"} */
void coordinator_reply_detail(lmc_http_reply *out, unsigned status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* 405 {"detail": "Method Not Allowed"} with allow as the Allow header. */
void coordinator_reply_not_allowed(lmc_http_reply *out, const char *allow);
/* The body as a JSON object, or NULL with a 422 already in out. */
json_t *coordinator_body_object(const lmc_http_request *rq, lmc_http_reply *out);

int coordinator_http_start(lmc_coord *co, char *err, size_t errlen);
void coordinator_http_stop(lmc_coord *co);
/* Adds the coordinator's rows (docs/coordinator.md, "HTTP API") to t,
 * each handler called with co: 0, or -1 when the table is full. */
int coordinator_routes_add(lmc_http_routes *t, lmc_coord *co);

/* Route handlers (lmc_http_handler; ctx is the lmc_coord), one file per
 * area.  A prefix row's arg is its prefix: the path's rest follows it. */
#define COORD_HANDLER(name) \
    void name(const lmc_http_request *rq, lmc_http_reply *out, void *ctx, const char *arg)
COORD_HANDLER(coordinator_ep_register);
COORD_HANDLER(coordinator_ep_heartbeat);
COORD_HANDLER(coordinator_ep_deregister);
COORD_HANDLER(coordinator_ep_instances);
COORD_HANDLER(coordinator_ep_events);
COORD_HANDLER(coordinator_ep_quota_config);
COORD_HANDLER(coordinator_ep_quota_salt);
COORD_HANDLER(coordinator_ep_quota_all);
COORD_HANDLER(coordinator_ep_pins);
COORD_HANDLER(coordinator_ep_dir_lookup);
COORD_HANDLER(coordinator_ep_dir_keys);
COORD_HANDLER(coordinator_ep_dir_stats);
COORD_HANDLER(coordinator_ep_prefetch);
COORD_HANDLER(coordinator_ep_prefetch_status);
COORD_HANDLER(coordinator_ep_metrics);
COORD_HANDLER(coordinator_ep_blend_lookup);
COORD_HANDLER(coordinator_ep_blend_legacy);
/* Feeds the admitted STORE/DELETE entries of an ingested request to the
 * fragment index (coord_blend_http.c); a no-op without one. */
void coordinator_blend_feed(lmc_coord *co, const coordinator_event_request *r);
/* The /metrics registry (coord_metrics.c): 0, or -1 out of memory. */
int coordinator_metrics_new(lmc_coord *co);
void coordinator_metrics_free(coordinator_metrics *m);

/* ---- membership (coord_members.c) ------------------------------------------ */
/* The member with id, or NULL (mu held). */
coordinator_member *coordinator_member_find(lmc_coord *co, const char *id);
/* Removes expired members and fences their streams (mu held); the number. */
size_t coordinator_members_sweep(lmc_coord *co, double now);
/* A copy of a random member's address; false when there is none (mu held). */
bool coordinator_member_pick(lmc_coord *co, char *ip, size_t iplen, int *port);
void coordinator_members_free(lmc_coord *co);

/* ---- token form (coord_pins.c) --------------------------------------------- */
typedef struct {
    const char *model, *salt;
    uint32_t world_size;
    uint64_t *tokens;
    size_t n_tokens;
} coordinator_token_query;

/* {"model_name","world_size","token_ids","cache_salt"}; 0 or -1 with why. */
int coordinator_token_query_parse(const json_t *body, coordinator_token_query *q, char *why, size_t whylen);
void coordinator_token_query_free(coordinator_token_query *q);
/* The chunk hashes of q's whole chunks: n_chunks x 32 bytes, malloc'd. */
int coordinator_token_query_hash(lmc_coord *co, const coordinator_token_query *q, uint8_t **hashes,
                           size_t *n_chunks, char *why, size_t whylen);
/* The key of chunk c, rank r of the query (ids interned or not). */
bool coordinator_token_key(coordinator_state *s, const coordinator_token_query *q, const uint8_t *hash,
                     uint32_t rank, bool intern, coordinator_key *out);

/* ---- outbound calls to lmcached servers (coord_client.c) ------------------- */
/* One HTTP call to http://ip:port<path>; body NULL = none.  Returns the
 * status (0 when the call failed; err then says why) and the reply body in
 * *reply (malloc'd, NUL-terminated) when reply is not NULL. */
long coordinator_call(lmc_coord *co, const char *method, const char *ip, int port, const char *path,
                const char *body, char **reply, char *err, size_t errlen);

/* ---- loops ------------------------------------------------------------------- */
/* One health sweep and one eviction pass: the bodies of the periodic
 * threads (co is the lmc_coord; tests call the pass directly). */
void coordinator_sweep_once(void *co);
void coordinator_evict_pass(lmc_coord *co);
void coordinator_evict_once(void *co);
void *coordinator_resync_loop(void *arg);

#endif
