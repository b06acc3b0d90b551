/* The cache-event batcher of the coordinator stream (docs/fleet.md,
 * "Cache-event stream"), without any network: producers add placement
 * facts into a bounded ring, one sender takes them as the body of the next
 * `POST {url}/events` and settles it as delivered or lost.
 *
 * A post that failed for a reason that may pass (no answer, a 5xx such as
 * the coordinator's 503 "not saved") is held and handed out again,
 * unchanged, by the next take, so that the coordinator applies it once
 * (its gate drops a copy it did apply as a duplicate); a post it refused
 * (4xx) or one held past the retry window is dropped.
 *
 * Thread-safety: add, declare, redeclare and stats from any thread; take
 * and settle from one sender thread, alternately (take, settle, take ...). */
#ifndef LMC_FLEET_EVENT_BATCHER_H
#define LMC_FLEET_EVENT_BATCHER_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "storage/object_key.h"

typedef enum lmc_fleet_event_type { LMC_CEV_STORE, LMC_CEV_DELETE, LMC_CEV_ACCESS } lmc_fleet_event_type;
typedef enum lmc_fleet_event_tier { LMC_CEV_L1, LMC_CEV_L2 } lmc_fleet_event_tier;

/* A size the sender resolves at take time (an L1 store: the listener that
 * sees it runs on the request path and has no size at hand). */
#define LMC_CEV_SIZE_UNKNOWN UINT64_MAX

/* One storage compartment of a capacity declaration. */
#define LMC_CEV_BACKEND_MAX 64
typedef struct lmc_fleet_event_compartment {
    lmc_fleet_event_tier tier;
    char backend[LMC_CEV_BACKEND_MAX];
    bool shared;
    uint64_t capacity_bytes;   /* 0 = unlimited */
} lmc_fleet_event_compartment;

typedef struct lmc_fleet_event_stats {
    uint64_t seq;                /* last seq handed out (0: none yet) */
    uint64_t batches_sent;       /* in posts the coordinator accepted */
    uint64_t batches_dropped;    /* placement batches of dropped posts (seq gaps) */
    uint64_t entries_sent;
    uint64_t entries_dropped;    /* of dropped posts, plus overflowed and unencodable */
    uint64_t entries_overflowed; /* oldest entries pushed out of a full ring */
    uint64_t entries_unencodable; /* entries JSON could not carry (a name not UTF-8) */
    uint64_t posts_ok, posts_failed;
    uint64_t posts_retried;      /* failed posts handed out again */
    bool retry_pending;          /* a failed post is held for the next take */
    size_t queued;
    uint64_t capacity_revision;  /* of the latest declaration (0: none) */
    bool capacity_pending;       /* that declaration is not delivered yet */
} lmc_fleet_event_stats;

/* What became of a post (lmc_fleet_event_batcher_settle). */
typedef enum lmc_fleet_event_outcome {
    LMC_CEV_DELIVERED, /* 2xx */
    LMC_CEV_RETRY,     /* no answer or a 5xx: held, sent again by the next take */
    LMC_CEV_REFUSED,   /* a 4xx: the coordinator will never take it; dropped */
} lmc_fleet_event_outcome;

/* How long a failed post is held and sent again before it is dropped,
 * unless lmc_fleet_event_batcher_set_retry_window says otherwise. */
#define LMC_CEV_RETRY_WINDOW_S 300.0

/* sizes[i] for keys[i]; called by take() without the batcher's lock. */
typedef void (*lmc_fleet_event_size_fn)(void *user, const lmc_object_key *keys, size_t n,
                                uint64_t *sizes);

/* The content of a stored chunk (docs/fleet.md, "Cache-event stream"):
 * fills tokens[cap] and *position (of its first token in the prompt) and
 * returns the count, or 0 when it is not known. */
typedef size_t (*lmc_fleet_event_tokens_fn)(void *user, const lmc_object_key *key,
                                            uint32_t *tokens, size_t cap, uint64_t *position);

/* What one take() put into its post, for settle(). */
typedef struct lmc_fleet_event_take {
    size_t placement_batches, placement_entries, config_batches;
    uint64_t revision;           /* of the declaration included; 0: none */
    uint64_t generation;         /* of its pending state (a redeclare bumps it) */
    bool retried;                /* the held post of an earlier failure, sent again */
} lmc_fleet_event_take;

typedef struct lmc_fleet_event_batcher lmc_fleet_event_batcher;

/* `capacity`: entries the ring holds (> 0).  `instance_id` is copied;
 * `incarnation` is the server's start time (Unix seconds).  NULL on
 * allocation failure. */
lmc_fleet_event_batcher *lmc_fleet_event_batcher_new(const char *instance_id, int64_t incarnation,
                                     size_t capacity);
void lmc_fleet_event_batcher_free(lmc_fleet_event_batcher *b);
/* Seconds from a post's first failure after which it is no longer sent
 * again but dropped (take's `now` measures it). */
void lmc_fleet_event_batcher_set_retry_window(lmc_fleet_event_batcher *b, double seconds);

/* Where take() finds the tokens of STORE entries: a chunk of exactly
 * chunk_size known tokens is sent with them and its position; the others
 * (and every entry while fn is NULL) with "token_ids": [] and
 * "token_offset": -1. */
void lmc_fleet_event_batcher_set_tokens(lmc_fleet_event_batcher *b, lmc_fleet_event_tokens_fn fn,
                                        void *user, size_t chunk_size);

/* Appends n entries of one kind.  `backend` must outlive the batcher (a
 * literal or an adapter's type name); sizes NULL gives every key
 * `size` (0 for delete and access; LMC_CEV_SIZE_UNKNOWN: resolve at take).
 * A full ring drops its oldest entries (counted), never blocks. */
void lmc_fleet_event_batcher_add(lmc_fleet_event_batcher *b, lmc_fleet_event_type type, lmc_fleet_event_tier tier,
                         const char *backend, bool shared, const lmc_object_key *keys,
                         const uint64_t *sizes, uint64_t size, size_t n);

/* A new capacity declaration (one config batch per compartment, all with
 * one new capacity_revision) replaces any undelivered one.  0, or -1 on
 * allocation failure (the previous declaration stays). */
int lmc_fleet_event_batcher_declare(lmc_fleet_event_batcher *b, const lmc_fleet_event_compartment *c, size_t n);
/* Marks the latest declaration undelivered again (the coordinator keeps it
 * in memory only: after a (re-)registration it is sent again). */
void lmc_fleet_event_batcher_redeclare(lmc_fleet_event_batcher *b);

/* The next post body {"batches":[...]}: a held post (a failure to retry)
 * as it was, taken->retried set, unless it is past the retry window (then
 * it is dropped); else the pending declaration's config batches first,
 * then the queued entries, consecutive entries of the same (type, tier,
 * backend, shared) coalesced into one batch; every batch gets the next
 * seq.  An entry JSON cannot carry (a model name or salt that is not
 * UTF-8) is left out of its batch and counted in entries_unencodable; the
 * others go.  `resolve` (may be NULL) fills LMC_CEV_SIZE_UNKNOWN sizes.
 * NULL when there is nothing to send (or on allocation failure: the
 * entries are then counted as dropped).  `now` is the batches' ts. */
json_t *lmc_fleet_event_batcher_take(lmc_fleet_event_batcher *b, double now, lmc_fleet_event_size_fn resolve,
                             void *user, lmc_fleet_event_take *taken);
/* The post's fate: delivered marks its declaration delivered (unless a
 * newer one replaced it); retry holds the body for the next take; refused
 * drops its placement batches (a seq gap the coordinator sees) and keeps
 * the declaration for the next take. */
void lmc_fleet_event_batcher_settle(lmc_fleet_event_batcher *b, const lmc_fleet_event_take *taken,
                            lmc_fleet_event_outcome outcome);

lmc_fleet_event_stats lmc_fleet_event_batcher_stats(lmc_fleet_event_batcher *b);

/* A copy of `src` that may be kept past the call that handed it over: an
 * interned key holds its names' references (docs/storage.md, "Interned
 * strings"); a key naming strings the server never interned (those of a
 * DELETE /cache/objects body) gets its own copy of both in *names.  false
 * when memory ran out (nothing to release then). */
bool lmc_fleet_event_key_keep(const lmc_object_key *src, lmc_object_key *dst, char **names);
/* Undoes lmc_fleet_event_key_keep. */
void lmc_fleet_event_key_release(const lmc_object_key *k, char *names);

const char *lmc_fleet_event_type_name(lmc_fleet_event_type type);

#endif
