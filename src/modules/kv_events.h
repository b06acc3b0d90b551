/* The KV event log (docs/kv_events.md): a bounded, sequenced record of the
 * chunks stored into and removed from L1 ("CPU") and L2 ("STORAGE"), which
 * routers read with POLL_KV_EVENTS to learn what this server holds.
 *
 * Records are numbered from 1 without gaps and kept in a ring of
 * `capacity`; the oldest goes first.  A stored record needs the chunk's
 * tokens and parent hash, which the store paths hand over beforehand
 * (lmc_kv_events_bind) when they hash a request's tokens; a store whose
 * tokens were never bound is counted and not logged.  Records that could
 * not be logged (memory ran out) leave a loss marker, so that a reader
 * whose range crosses it learns it missed something.
 *
 * Thread-safety: every function may be called from any thread.  One mutex
 * guards the ring and the bindings; readers take references to the records
 * they page out and encode them after letting go of it. */
#ifndef LMC_MODULES_KV_EVENTS_H
#define LMC_MODULES_KV_EVENTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "storage/object_key.h"

#define LMC_KV_EVENTS_DEFAULT_LOG_SIZE 32768
/* Records one poll returns at most (a larger max_events is capped). */
#define LMC_KV_EVENTS_MAX_POLL 1024
/* Chunks whose tokens are remembered for the stores that follow. */
#define LMC_KV_EVENTS_MAX_BINDINGS 16384

typedef enum {
    LMC_KV_EVENT_STORED,
    LMC_KV_EVENT_REMOVED,
} lmc_kv_event_kind;

typedef enum {
    LMC_KV_MEDIUM_CPU,     /* L1 */
    LMC_KV_MEDIUM_STORAGE, /* L2 */
} lmc_kv_event_medium;

/* One record; immutable once logged.  Its seq is its place in the log
 * (lmc_kv_events_entry). */
typedef struct lmc_kv_event {
    lmc_kv_event_kind kind;
    lmc_kv_event_medium medium;
    const char *model;          /* NUL-terminated */
    size_t model_len;
    const uint8_t *hashes;      /* n_hashes x hash_len bytes */
    uint32_t n_hashes;
    uint32_t hash_len;
    bool has_parent;            /* stored, not the prompt's first chunk */
    uint8_t parent[LMC_CHUNK_HASH_MAX];
    const uint32_t *tokens;     /* stored: the chunk's tokens (hashed ones fit 32 bits) */
    uint32_t n_tokens;
} lmc_kv_event;

typedef struct lmc_kv_events lmc_kv_events;

/* capacity >= 1 records; max_bindings >= 1.  `incarnation` names this
 * log (the server's start time in ns).  NULL when out of memory. */
lmc_kv_events *lmc_kv_events_new(size_t capacity, size_t max_bindings, uint64_t incarnation);
void lmc_kv_events_free(lmc_kv_events *ev);
uint64_t lmc_kv_events_incarnation(const lmc_kv_events *ev);

/* Remembers the tokens of n_chunks consecutive chunks of chunk_size tokens
 * (tokens[i*chunk_size ..], each below 2^32 as docs/hashing.md requires of
 * hashed tokens) under their hashes (n_chunks x hash_len bytes):
 * chunk i's parent is chunk i-1, chunk 0's is `parent` (NULL: it starts the
 * prompt); chunk 0 starts at token `position` of the prompt.  Least
 * recently bound chunks are forgotten first. */
void lmc_kv_events_bind(lmc_kv_events *ev, const uint8_t *hashes, size_t n_chunks,
                        size_t hash_len, const uint64_t *tokens, size_t chunk_size,
                        const uint8_t *parent, uint64_t position);
/* A bound chunk's tokens into tokens[cap] and its position: the token
 * count, 0 when the chunk is not bound (or holds more than cap).  What the
 * fleet's cache-event stream reports of a stored chunk (docs/fleet.md). */
size_t lmc_kv_events_tokens_of(lmc_kv_events *ev, const uint8_t *hash, size_t hash_len,
                               uint32_t *tokens, size_t cap, uint64_t *position);

/* One stored record per distinct (model, chunk hash) of keys (ranks, object
 * groups and salts collapse), each carrying its binding; keys without one
 * count as unbound stores and are skipped. */
void lmc_kv_events_stored(lmc_kv_events *ev, lmc_kv_event_medium medium,
                          const lmc_object_key *keys, size_t n);
/* One removed record per model of keys, holding its distinct hashes. */
void lmc_kv_events_removed(lmc_kv_events *ev, lmc_kv_event_medium medium,
                           const lmc_object_key *keys, size_t n);
/* Appends a loss marker: readers across it get lost = true. */
void lmc_kv_events_mark_lost(lmc_kv_events *ev);

typedef struct {
    uint64_t seq;
    const lmc_kv_event *event;  /* referenced: given back by page_free() */
} lmc_kv_events_entry;

/* A page of model's records after `cursor` (docs/kv_events.md, "Cursor"). */
typedef struct {
    uint64_t next_cursor;
    bool lost;
    size_t n;
    lmc_kv_events_entry *entries;
} lmc_kv_events_page;

/* model NULL: every model's records (the publisher's follower).
 * max_events >= 1 (capped at LMC_KV_EVENTS_MAX_POLL).  0, or -1 when
 * memory ran out (nothing to free). */
int lmc_kv_events_read(lmc_kv_events *ev, const char *model, size_t model_len, uint64_t cursor,
                       size_t max_events, lmc_kv_events_page *page);
void lmc_kv_events_page_free(lmc_kv_events_page *page);

typedef struct {
    uint64_t log_depth;         /* records (markers included) in the ring */
    uint64_t log_capacity;
    uint64_t next_seq;
    uint64_t lost_markers;      /* markers ever appended */
    uint64_t unbound_stores;    /* stored keys skipped for want of tokens */
    uint64_t bindings;
} lmc_kv_events_stats;

void lmc_kv_events_get_stats(lmc_kv_events *ev, lmc_kv_events_stats *out);

/* Makes the log hear sm's L1 writes and deletions ("CPU") and its L2
 * stores and deletions ("STORAGE").  Once, before concurrent use; the log
 * must outlive sm's threads (free it after closing sm).  0 or -1. */
typedef struct lmc_storage_manager lmc_storage_manager;
int lmc_kv_events_attach(lmc_kv_events *ev, lmc_storage_manager *sm);

#endif
