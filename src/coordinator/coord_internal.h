/* The coordinator process: shared by the files of src/coordinator/. */
#ifndef LMC_COORDINATOR_COORD_INTERNAL_H
#define LMC_COORDINATOR_COORD_INTERNAL_H

#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>

#include "coordinator/coord_db.h"
#include "coordinator/coord_state.h"
#include "coordinator/coordinator.h"
#include "hash/token_hash.h"
#include "http/http_auth.h"

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
} coord_member;

typedef struct {
    atomic_ullong sweeps, instances_expired, eviction_passes, eviction_keys_requested,
        eviction_requests, eviction_request_failures, resync_keys, resync_pages,
        requests_rejected, auth_rejected, bodies_too_large, bodies_over_budget;
} coord_counters;

struct lmc_coord {
    lmc_coord_config cfg;
    pthread_mutex_t mu;  /* guards st, members, db */
    pthread_cond_t wake; /* with mu: the loops' sleeps, ended early by stop */
    bool stopping;
    coord_state st;
    coord_member **members;
    size_t n_members;
    coord_db *db;
    lmc_token_hasher *hasher;
    lmc_http_auth auth;
    struct MHD_Daemon *mhd;
    int port;
    atomic_size_t buffered;  /* bytes of request bodies held now, all connections */
    size_t buffer_budget;    /* MAX_BUFFERED_MB in bytes */
    pthread_t sweep_thread, evict_thread, resync_thread;
    bool sweep_running, evict_running, resync_running;
    coord_counters ctr;
    uint64_t rng;
    double keys_full_warned; /* mu: monotonic time of the last "directory full" warning */
    double not_saved_warned; /* mu: the same for requests the database did not take */
    uint64_t not_saved;      /* mu: requests answered 503 for the database */
};

/* Logs that new keys were refused for the directory's bound, at most once
 * a minute (mu held). */
void coord_warn_keys_full(lmc_coord *co);
/* Monotonic and wall clocks in seconds. */
double coord_now_mono(void);
double coord_now_wall(void);
/* Sleeps up to seconds on co->wake (mu held); true when stopping. */
bool coord_wait(lmc_coord *co, double seconds);

/* ---- HTTP ------------------------------------------------------------------ */
typedef struct {
    const char *method, *path;
    /* NUL-terminated, NULL when empty; the HTTP layer's buffer for this
     * request, which a handler may consume (the /events scanner unescapes
     * strings in place). */
    char *body;
    size_t body_len;
    struct MHD_Connection *conn;
} coord_request;

typedef struct {
    unsigned status;
    json_t *json;  /* owned; NULL = no body */
    char *text;    /* owned; a text body instead of json */
    const char *content_type;
} coord_reply;

const char *coord_query(const coord_request *rq, const char *name);
void coord_reply_json(coord_reply *out, unsigned status, json_t *body);
/* {"detail": "<reason>"} */
void coord_reply_detail(coord_reply *out, unsigned status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* The body as a JSON object, or NULL with a 422 already in out. */
json_t *coord_body_object(const coord_request *rq, coord_reply *out);

int coord_http_start(lmc_coord *co, char *err, size_t errlen);
void coord_http_stop(lmc_coord *co);
void coord_dispatch(lmc_coord *co, const coord_request *rq, coord_reply *out);
/* Whether the route needs the bearer token (docs/coordinator.md). */
bool coord_route_guarded(const char *method, const char *path);

/* Route handlers, one file per area. */
void coord_ep_register(lmc_coord *co, const coord_request *rq, coord_reply *out);
void coord_ep_heartbeat(lmc_coord *co, const coord_request *rq, coord_reply *out, const char *id);
void coord_ep_deregister(lmc_coord *co, const coord_request *rq, coord_reply *out, const char *id);
void coord_ep_instances(lmc_coord *co, const coord_request *rq, coord_reply *out);
void coord_ep_events(lmc_coord *co, const coord_request *rq, coord_reply *out);
void coord_ep_quota_config(lmc_coord *co, const coord_request *rq, coord_reply *out);
void coord_ep_quota_salt(lmc_coord *co, const coord_request *rq, coord_reply *out,
                         const char *salt);
void coord_ep_quota_all(lmc_coord *co, const coord_request *rq, coord_reply *out);
void coord_ep_pins(lmc_coord *co, const coord_request *rq, coord_reply *out);
void coord_ep_dir_lookup(lmc_coord *co, const coord_request *rq, coord_reply *out);
void coord_ep_dir_keys(lmc_coord *co, const coord_request *rq, coord_reply *out);
void coord_ep_dir_stats(lmc_coord *co, const coord_request *rq, coord_reply *out);
void coord_ep_prefetch(lmc_coord *co, const coord_request *rq, coord_reply *out);
void coord_ep_prefetch_status(lmc_coord *co, const coord_request *rq, coord_reply *out,
                              const char *rest);
void coord_ep_metrics(lmc_coord *co, const coord_request *rq, coord_reply *out);

/* ---- membership (coord_members.c) ------------------------------------------ */
/* The member with id, or NULL (mu held). */
coord_member *coord_member_find(lmc_coord *co, const char *id);
/* Removes expired members and fences their streams (mu held); the number. */
size_t coord_members_sweep(lmc_coord *co, double now);
/* A copy of a random member's address; false when there is none (mu held). */
bool coord_member_pick(lmc_coord *co, char *ip, size_t iplen, int *port);
void coord_members_free(lmc_coord *co);

/* ---- token form (coord_pins.c) --------------------------------------------- */
typedef struct {
    const char *model, *salt;
    uint32_t world_size;
    uint64_t *tokens;
    size_t n_tokens;
} coord_token_query;

/* {"model_name","world_size","token_ids","cache_salt"}; 0 or -1 with why. */
int coord_token_query_parse(const json_t *body, coord_token_query *q, char *why, size_t whylen);
void coord_token_query_free(coord_token_query *q);
/* The chunk hashes of q's whole chunks: n_chunks x 32 bytes, malloc'd. */
int coord_token_query_hash(lmc_coord *co, const coord_token_query *q, uint8_t **hashes,
                           size_t *n_chunks, char *why, size_t whylen);
/* The key of chunk c, rank r of the query (ids interned or not). */
bool coord_token_key(coord_state *s, const coord_token_query *q, const uint8_t *hash,
                     uint32_t rank, bool intern, coord_key *out);

/* ---- outbound calls to lmcached servers (coord_client.c) ------------------- */
/* One HTTP call to http://ip:port<path>; body NULL = none.  Returns the
 * status (0 when the call failed; err then says why) and the reply body in
 * *reply (malloc'd, NUL-terminated) when reply is not NULL. */
long coord_call(lmc_coord *co, const char *method, const char *ip, int port, const char *path,
                const char *body, char **reply, char *err, size_t errlen);

/* ---- loops ------------------------------------------------------------------- */
void *coord_sweep_loop(void *arg);
void *coord_evict_loop(void *arg);
void *coord_resync_loop(void *arg);
/* One eviction pass (the loop's body; tests call it). */
void coord_evict_pass(lmc_coord *co);

#endif
