/* Request sessions (shared service): per request id, the cached hash chain
 * of the prompt and the read locks its last LOOKUP took.
 *
 * Sessions are created by LOOKUP and dropped by END_SESSION.  Clients that
 * never send END_SESSION cannot leak them: the table is bounded in number
 * (the least recently used session goes first) and sessions idle for longer
 * than max_idle_ms are dropped.  The read locks of a dropped session are not
 * released (a retrieve may still consume them); they expire with the L1
 * read TTL, which is why max_idle_ms defaults to twice that TTL.
 *
 * Locking: the table mutex guards the index and reference counts; each
 * session has its own mutex, held between acquire() and release().  The
 * table mutex is never taken while waiting for a session mutex. */
#ifndef LMC_MODULES_SERVICES_SESSIONS_H
#define LMC_MODULES_SERVICES_SESSIONS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "hash/token_hash.h"
#include "storage/lease.h"
#include "storage/object_key.h"
#include "storage/ttl_lock.h"

/* The READ leases one LOOKUP took: keys[0..n) is the chunk-major leading
 * run of whole hit chunks, leases[i] `readers` shares on its copy; a lease
 * FREE_LOOKUP_LOCKS gave back already is RETURNED.  While an L2 prefetch
 * runs, keys[n..n+pending) are the keys it may still append; a free that
 * covers one of them before it arrives marks its lease slot RETURNED, and
 * the load gives that key's lease back on arrival (docs/l2.md). */
typedef struct {
    lmc_object_key *keys;
    size_t n_keys_held;        /* keys[0..n_keys_held) hold string references */
    lmc_lease *leases;
    size_t n;
    size_t pending;
    size_t first_chunk;        /* chunk index of keys[0] */
    uint32_t keys_per_chunk;   /* groups * ranks */
    uint32_t readers;
} lmc_lookup_locks;

/* State a module keeps on a request's session beyond the lookup locks
 * (CacheBlend's read locks no retrieve consumed yet: docs/cacheblend.md).
 * The session owns it: release() runs once, when the session goes
 * (END_SESSION, the count bound or the idle age), outside every session
 * and table mutex. */
typedef struct lmc_session_ext {
    void (*release)(struct lmc_session_ext *ext);
} lmc_session_ext;

typedef struct lmc_session {
    lmc_lookup_locks locks;    /* guarded by the session mutex */
    int64_t hit_chunks;        /* last result delivered to the scheduler, -1 none */
    lmc_session_ext *ext;      /* guarded by the session mutex; NULL none */
    /* private */
    struct lmc_session_priv *priv;
} lmc_session;

typedef struct {
    size_t max_sessions;       /* 0: 65536 */
    int64_t max_idle_ms;       /* 0: never by age */
    const lmc_token_hasher *hasher;
    lmc_clock_ms_fn clock;     /* NULL: CLOCK_MONOTONIC */
    void *clock_user;
} lmc_sessions_options;

typedef struct lmc_sessions lmc_sessions;

lmc_sessions *lmc_sessions_new(const lmc_sessions_options *o);
void lmc_sessions_free(lmc_sessions *s);

/* The session of rid, locked and referenced; created when `create` is set.
 * NULL when absent (or out of memory).  Pair with release(). */
lmc_session *lmc_sessions_acquire(lmc_sessions *s, const char *rid, size_t len, bool create);
void lmc_sessions_release(lmc_sessions *s, lmc_session *se);
/* Unlinks rid and returns it locked and referenced (END_SESSION cleans its
 * locks up before release()), or NULL. */
lmc_session *lmc_sessions_remove(lmc_sessions *s, const char *rid, size_t len);
size_t lmc_sessions_count(lmc_sessions *s);

/* Hashes of chunks [start/cs, end/cs) of `tokens` from the session's cached
 * chain (extended or recomputed as needed).  *out points into the chain,
 * valid while the session is held.  LMC_HASH_* code. */
int lmc_session_hashes(lmc_session *se, const uint64_t *tokens, size_t n_tokens, size_t start,
                       size_t end, const uint8_t **out);
/* Hashes of chunks [start/cs, end/cs) copied to `out`, from rid's session
 * chain.  The session is created when absent: a worker storing a growing
 * prompt chunk range by chunk range (each request carries every token from
 * position 0) then hashes each chunk once instead of the whole prefix every
 * time.  Such sessions are bounded like all others (count, idle age).
 * LMC_HASH_* code. */
int lmc_sessions_hash_range(lmc_sessions *s, const char *rid, size_t len, const uint64_t *tokens,
                            size_t n_tokens, size_t start, size_t end, uint8_t *out);
/* Replaces the lock record (the caller has dealt with the old one). */
void lmc_lookup_locks_clear(lmc_lookup_locks *l);

#endif
