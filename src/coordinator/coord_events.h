/* The cache-event stream: parsing POST /events bodies, the per-instance
 * gate, and applying admitted batches to the state (docs/coordinator.md,
 * "Cache events"). */
#ifndef LMC_COORDINATOR_COORD_EVENTS_H
#define LMC_COORDINATOR_COORD_EVENTS_H

#include <jansson.h>

#include "coordinator/coord_json_scan.h"
#include "coordinator/coord_state.h"

#define COORD_MAX_BATCHES 4096          /* per request */
#define COORD_MAX_ENTRIES 200000        /* per request, all batches together */
#define COORD_MAX_TOKENS_PER_ENTRY 65536

/* An EncodedObjectKey as received: strings point into the JSON. */
typedef struct {
    uint8_t hash[COORD_HASH_MAX];
    uint8_t hash_len;
    uint32_t kv_rank, group;
    const char *model, *salt;
    uint16_t model_len, salt_len; /* set by the /events scanner only */
} coordinator_wire_key;

/* 0, or -1 with the reason in why. */
int coordinator_wire_key_parse(const json_t *o, coordinator_wire_key *out, char *why, size_t whylen);
/* The key with interned ids; `intern` adds unknown names.  False when a
 * name is unknown (not interning) or the table is full. */
bool coordinator_wire_key_resolve(coordinator_state *s, const coordinator_wire_key *w, bool intern, coordinator_key *out);
/* EncodedObjectKey of an entry (new reference, NULL on out of memory). */
json_t *coordinator_entry_json(const coordinator_state *s, const coordinator_entry *e);

typedef enum { COORD_EV_STORE, COORD_EV_DELETE, COORD_EV_ACCESS, COORD_EV_CONFIG } coordinator_event_type;

typedef struct {
    coordinator_wire_key key;
    uint64_t size;
    uint32_t num_tokens;
    size_t tokens_at;     /* the token_ids in the request's token pool */
    int64_t token_offset; /* -1: unknown */
    bool has_size;
    uint32_t model, salt; /* name ids once resolved (coordinator_events_apply) */
    uint32_t table_hash;  /* coordinator_keys_hash of the resolved key */
} coordinator_event_entry;

typedef struct {
    const char *instance_id;
    int64_t incarnation, seq;
    coordinator_event_type type;
    bool l2, shared;
    const char *backend;
    uint64_t capacity_bytes, capacity_revision;
    size_t n;
    coordinator_event_entry *entries; /* into the request's pool */
    size_t first;               /* index of entries[0] in the pool */
    bool admitted;              /* the gate let it through (set by apply) */
} coordinator_event_batch;

typedef struct {
    coordinator_event_batch *batches;
    size_t n, cap;
    coordinator_event_entry *pool;
    size_t pool_n, pool_cap;
    uint32_t *tokens; /* every entry's token_ids, one after the other */
    size_t tokens_n, tokens_cap;
    char *arena; /* coordinator_events_parse's copy of the text (what keys point to), or NULL */
    bool out_of_memory; /* set while parsing: why a parse failed */
    /* The older L2 usage stream (POST /l2/events): no incarnation, so no
     * gate and no cursor; every batch is applied (docs/coordinator.md,
     * "L2 usage events"). */
    bool ungated;
} coordinator_event_request;

/* Reads a POST /events body (JSON text) and checks every field of every
 * batch (docs/coordinator.md lists the invariants); 0, or -1 with
 * "batches[i]...: why" (the body's fault: 422), or -2 with "out of memory"
 * (the coordinator's: 503, the sender tries again); nothing kept. */
int coordinator_events_parse(const char *text, size_t len, coordinator_event_request *out, char *why,
                       size_t whylen);
/* The same on a writable text, which is consumed: strings are unescaped in
 * it and the request points into it, so it must outlive out.  Saves the
 * copy of a body the caller owns. */
int coordinator_events_parse_in_place(char *text, size_t len, coordinator_event_request *out, char *why,
                                size_t whylen);
void coordinator_events_request_free(coordinator_event_request *r);

/* An EncodedObjectKey object at the scanner's position, checked as the
 * /events reader checks it; 0, or -1 with why (the scanner's err set when
 * the JSON itself is malformed). */
int coordinator_events_scan_key(coordinator_json_scanner *s, coordinator_wire_key *k, char *why,
                                size_t whylen);

/* A body reader over the scanner: 0, or -1 with why (or the scanner's
 * err, or r->out_of_memory set). */
typedef int (*coordinator_body_reader)(coordinator_json_scanner *s, coordinator_event_request *r,
                                       char *why, size_t whylen);
/* Runs read over the text in place (consumed, as for
 * coordinator_events_parse_in_place) into a request marked ungated or
 * not: 0; -1 with the reason; -2 "out of memory"; nothing kept on failure. */
int coordinator_events_read(char *text, size_t len, coordinator_body_reader read, bool ungated,
                            coordinator_event_request *out, char *why, size_t whylen);

#define COORD_MAX_L2_USAGE_EVENTS COORD_MAX_ENTRIES /* per POST /l2/events */

/* Reads a POST /l2/events body, the older L2 usage stream:
 * {"instance_id": str, "seq": int >= 0, "events": [{"type": "store" |
 * "lookup", "key": EncodedObjectKey, "bytes": int >= 0}], "tier": "l2"}.
 * Each run of events of one type becomes one ungated L2 batch (store, or
 * access for a lookup).  The text is consumed as by
 * coordinator_events_parse_in_place.  0; -1 with why (the body's fault);
 * -2 "out of memory". */
int coordinator_l2_usage_parse_in_place(char *text, size_t len, coordinator_event_request *out,
                                        char *why, size_t whylen);

typedef struct {
    uint64_t applied, duplicates, stale;
} coordinator_ingest_result;

struct coordinator_db;
/* Resolves the names of r (kept in its entries), runs the gate and applies
 * the admitted batches in order; writes go to
 * db (NULL: memory only) inside the caller's transaction.  0; -1 with why
 * when a name table is full, memory ran out or a write failed: the batches
 * before the failing entry stay applied and the gate is not put back
 * (coordinator_events_ingest puts it back). */
int coordinator_events_apply(coordinator_state *s, struct coordinator_db *db, coordinator_event_request *r,
                       coordinator_ingest_result *res, char *why, size_t whylen);

/* One POST /events request as one transaction of db: names resolved, the
 * gate run, the admitted batches applied and committed.  0; -2 with why
 * when the transaction could not begin or commit, -1 with why when a name
 * table is full, memory ran out or an entry's write failed (the caller
 * answers 503 to both): the transaction is rolled back and the
 * gate is then as before the request, so that the sender's retry of the
 * same batches is admitted and applied once. */
int coordinator_events_ingest(coordinator_state *s, struct coordinator_db *db, coordinator_event_request *r,
                        coordinator_ingest_result *res, char *why, size_t whylen);

/* Forgets what inst's L1 held (fencing).  The number of placements voided. */
size_t coordinator_events_fence(coordinator_state *s, uint32_t inst);

#endif
