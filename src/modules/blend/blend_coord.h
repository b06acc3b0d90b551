/* The client of the coordinator's fleet fragment index (docs/cacheblend.md,
 * "Coordinator directory"): asks POST {url}/directory/blend-lookup where
 * the chunks of a prompt are stored anywhere in the fleet, in the
 * background, so that a lookup polls for the answer instead of waiting.
 *
 * A request is known by its request id: submit is idempotent per id and
 * never blocks (worker threads do the HTTP); poll says PENDING until the
 * answer came or the request's deadline (timeout_s after submit) passed;
 * then DONE with the matches, an empty list for any failure (no answer,
 * an error status, a reply that does not parse, the deadline).  A late
 * answer is dropped.  take forgets a request; one never taken is
 * forgotten LMC_BLEND_COORD_FORGET_S after its deadline.  At most
 * max_outstanding requests are known at once: a submit past that is
 * refused and the caller goes on without the fleet's matches.
 *
 * Thread safety: every function from any thread. */
#ifndef LMC_MODULES_BLEND_BLEND_COORD_H
#define LMC_MODULES_BLEND_BLEND_COORD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "modules/blend/blend_matcher.h"

#define LMC_BLEND_COORD_DEFAULT_TIMEOUT_S 1.0
#define LMC_BLEND_COORD_DEFAULT_CONCURRENCY 8u
#define LMC_BLEND_COORD_MAX_CONCURRENCY 64u
#define LMC_BLEND_COORD_DEFAULT_OUTSTANDING 1024u
#define LMC_BLEND_COORD_FORGET_S 30.0
#define LMC_BLEND_COORD_RID_MAX 256     /* bytes of a request id */
#define LMC_BLEND_COORD_MAX_TOKENS (1u << 20) /* the coordinator's bound */

typedef struct lmc_blend_coord lmc_blend_coord;

typedef struct {
    const char *url;          /* the coordinator's base URL (--coordinator-url) */
    const char *auth_token;   /* NULL or "": no Authorization header */
    double timeout_s;         /* per request: HTTP timeout and deadline, > 0 */
    unsigned concurrency;     /* worker threads, 1..LMC_BLEND_COORD_MAX_CONCURRENCY */
    size_t max_outstanding;   /* requests known at once, >= 1 */
} lmc_blend_coord_opts;

/* One match: the stored chunk (hash_len bytes of hash), where it was
 * stored and where it is in the prompt; both ranges are chunk_size long. */
typedef struct {
    uint8_t hash[LMC_BLEND_HASH_MAX];
    size_t hash_len;
    uint64_t old_st, cur_st;
} lmc_blend_coord_match;

typedef enum {
    LMC_BLEND_COORD_UNKNOWN = -1, /* never submitted, or taken/forgotten */
    LMC_BLEND_COORD_PENDING = 0,
    LMC_BLEND_COORD_DONE = 1,
} lmc_blend_coord_state;

/* timeout_s and concurrency from LMCACHE_COORDINATOR_BLEND_TIMEOUT and
 * LMCACHE_COORDINATOR_BLEND_MATCH_CONCURRENCY (defaults when unset); -1
 * with the refusal naming the variable. */
int lmc_blend_coord_env(double *timeout_s, unsigned *concurrency, char *err, size_t errlen);

/* NULL with the reason (naming the option) in err. */
lmc_blend_coord *lmc_blend_coord_new(const lmc_blend_coord_opts *o, char *err, size_t errlen);
/* Abandons what is in flight, joins the workers. */
void lmc_blend_coord_free(lmc_blend_coord *c);

/* Asks for the matches of tokens[0..n) in namespace (model, world_size,
 * salt; NULL salt = ""), unless rid is known already.  0 queued (or
 * known); -1 refused (bad argument, too many outstanding, no memory). */
int lmc_blend_coord_submit(lmc_blend_coord *c, const char *rid, const uint64_t *tokens, size_t n,
                           const char *model, uint32_t world_size, const char *salt);
/* DONE: *matches (malloc'ed, ascending cur_st, NULL when *n == 0) is the
 * caller's; the request stays known until take. */
lmc_blend_coord_state lmc_blend_coord_poll(lmc_blend_coord *c, const char *rid,
                                           lmc_blend_coord_match **matches, size_t *n);
/* Forgets rid (an answer still to come is dropped). */
void lmc_blend_coord_take(lmc_blend_coord *c, const char *rid);

#endif
