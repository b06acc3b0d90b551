/* The coordinator process: shared by the files of src/coordinator/. */
#ifndef LMC_COORDINATOR_COORD_INTERNAL_H
#define LMC_COORDINATOR_COORD_INTERNAL_H

#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>

#include "core/periodic.h"
#include "coordinator/coord_db.h"
#include "coordinator/coord_state.h"
#include "coordinator/coordinator.h"
#include "hash/token_hash.h"
#include "http/http_auth.h"
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
        eviction_requests, eviction_request_failures, resync_keys, resync_pages,
        requests_rejected, auth_rejected, bodies_too_large, bodies_over_budget;
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
    lmc_http_auth auth;
    struct MHD_Daemon *mhd;
    int port;
    atomic_size_t buffered;  /* bytes of request bodies held now, all connections */
    size_t buffer_budget;    /* MAX_BUFFERED_MB in bytes */
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

/* ---- HTTP ------------------------------------------------------------------ */
typedef struct {
    const char *method, *path;
    /* NUL-terminated, NULL when empty; the HTTP layer's buffer for this
     * request, which a handler may consume (the /events scanner unescapes
     * strings in place). */
    char *body;
    size_t body_len;
    struct MHD_Connection *conn;
} coordinator_request;

typedef struct {
    unsigned status;
    json_t *json;  /* owned; NULL = no body */
    char *text;    /* owned; a text body instead of json */
    const char *content_type;
} coordinator_reply;

const char *coordinator_query(const coordinator_request *rq, const char *name);
void coordinator_reply_json(coordinator_reply *out, unsigned status, json_t *body);
/* {"detail": "<reason>"} */
void coordinator_reply_detail(coordinator_reply *out, unsigned status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* The body as a JSON object, or NULL with a 422 already in out. */
json_t *coordinator_body_object(const coordinator_request *rq, coordinator_reply *out);

int coordinator_http_start(lmc_coord *co, char *err, size_t errlen);
void coordinator_http_stop(lmc_coord *co);
void coordinator_dispatch(lmc_coord *co, const coordinator_request *rq, coordinator_reply *out);
/* Whether the route needs the bearer token (docs/coordinator.md). */
bool coordinator_route_guarded(const char *method, const char *path);

/* Route handlers, one file per area. */
void coordinator_ep_register(lmc_coord *co, const coordinator_request *rq, coordinator_reply *out);
void coordinator_ep_heartbeat(lmc_coord *co, const coordinator_request *rq, coordinator_reply *out, const char *id);
void coordinator_ep_deregister(lmc_coord *co, const coordinator_request *rq, coordinator_reply *out, const char *id);
void coordinator_ep_instances(lmc_coord *co, const coordinator_request *rq, coordinator_reply *out);
void coordinator_ep_events(lmc_coord *co, const coordinator_request *rq, coordinator_reply *out);
void coordinator_ep_quota_config(lmc_coord *co, const coordinator_request *rq, coordinator_reply *out);
void coordinator_ep_quota_salt(lmc_coord *co, const coordinator_request *rq, coordinator_reply *out,
                         const char *salt);
void coordinator_ep_quota_all(lmc_coord *co, const coordinator_request *rq, coordinator_reply *out);
void coordinator_ep_pins(lmc_coord *co, const coordinator_request *rq, coordinator_reply *out);
void coordinator_ep_dir_lookup(lmc_coord *co, const coordinator_request *rq, coordinator_reply *out);
void coordinator_ep_dir_keys(lmc_coord *co, const coordinator_request *rq, coordinator_reply *out);
void coordinator_ep_dir_stats(lmc_coord *co, const coordinator_request *rq, coordinator_reply *out);
void coordinator_ep_prefetch(lmc_coord *co, const coordinator_request *rq, coordinator_reply *out);
void coordinator_ep_prefetch_status(lmc_coord *co, const coordinator_request *rq, coordinator_reply *out,
                              const char *rest);
/* The /metrics registry (coord_metrics.c): 0, or -1 out of memory. */
int coordinator_metrics_new(lmc_coord *co);
void coordinator_metrics_free(coordinator_metrics *m);
void coordinator_ep_metrics(lmc_coord *co, const coordinator_request *rq, coordinator_reply *out);

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
