/* One bounded HTTP request to the coordinator (libcurl).  Private to
 * src/coord. */
#ifndef LMC_FLEET_HTTP_CLIENT_H
#define LMC_FLEET_HTTP_CLIENT_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>

/* Replies larger than this are cut off and treated as bad (docs/fleet.md,
 * "Failures"): a garbage or huge reply never grows memory. */
#define LMC_FLEET_MAX_REPLY (64u * 1024u)

typedef struct lmc_fleet_request {
    const char *method;          /* "POST", "PUT", "DELETE" */
    const char *url;
    const char *body;            /* JSON text, or NULL for no body */
    size_t body_len;
    const char *auth_token;      /* NULL: no Authorization header */
    double timeout_s;            /* whole transfer */
    const atomic_bool *cancel;   /* when it turns true the transfer is abandoned; may be NULL */
} lmc_fleet_request;

typedef struct lmc_fleet_reply {
    long status;                 /* HTTP status; 0 when none arrived */
    char body[LMC_FLEET_MAX_REPLY + 1];   /* NUL-terminated */
    size_t len;
    bool too_large;
    bool timed_out;              /* no reply within timeout_s */
    char error[160];             /* why there is no status (never holds the token) */
} lmc_fleet_reply;

/* 0 when a reply with a status arrived (any status, whole body), -1
 * otherwise (network error, timeout, cancelled, reply too large), with
 * reply->error set. */
int lmc_fleet_http(const lmc_fleet_request *rq, lmc_fleet_reply *reply);

#endif
