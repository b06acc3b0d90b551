/* Lookup module: LOOKUP, QUERY_PREFETCH_STATUS, WAIT_PREFETCH_STATUS,
 * QUERY_PREFETCH_LOOKUP_HITS, FREE_LOOKUP_LOCKS, END_SESSION
 * (docs/protocol.md, "Lookup and prefetch ops").  LOOKUP,
 * FREE_LOOKUP_LOCKS and END_SESSION are NORMAL-pool and quick (they never
 * wait);
 * WAIT_PREFETCH_STATUS is NORMAL; the two status polls are answered on the
 * socket thread.
 *
 * LOOKUP hashes the prompt through the session's cached chain, read-locks
 * the leading run of whole hit chunks (num_kv_readers shares per object)
 * and registers a prefetch job.  With L1 only the job completes inside the
 * LOOKUP handler.  With an L2 tier the keys after the L1 run go to the
 * storage manager's L2 prefetch: the job completes from the prefetch
 * thread (waking WAIT_PREFETCH_STATUS), the loaded chunks are appended to
 * the session's lock record, and QUERY_PREFETCH_LOOKUP_HITS answers as soon
 * as the L2 lookup phase is over (docs/l2.md). */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "modules/lookup/lookup.h"
#include "modules/services/ipc_key.h"
#include "modules/module.h"
#include "modules/services/prefetch_jobs.h"
#include "obs/events.h"
#include "obs/log.h"
#include "rpc/wire.h"
#include "storage/l2/l2_service.h"
#include "storage/storage_manager.h"

typedef struct {
    lmc_module_ctx *ctx;
    lmc_jobs *jobs;
    uint32_t chunk_size;
    atomic_uint_fast64_t lookups, requested_chunks, hit_chunks, freed_keys, waits_parked,
        l2_prefetches, l2_hit_chunks;
} lookup_mod;

/* One LOOKUP's L2 prefetch in flight; owned by the prefetch callbacks. */
typedef struct {
    lookup_mod *m;
    char *rid;
    size_t rid_len;
    uint64_t job_id;
    int64_t l1_chunks;
    const lmc_object_key *session_keys;   /* identity of the lock record extended */
    size_t l1_keys;                       /* its length before the extension */
    lmc_object_key *keys;                 /* copy of the prefetched keys */
    size_t n_keys;                        /* of keys, each holding its string references */
    lmc_lease *leases;                    /* the READ leases the prefetch took */
    uint32_t per, readers;
    uint64_t *unit_sizes;                 /* per key of a chunk, or NULL (all one size) */
    lmc_lookup_event_info *event;         /* LOOKUP_END, published when done; may be NULL */
} l2_lookup;

static int decode_key(lookup_mod *m, lmc_rpc_call *call, lmc_ipc_key *k, char *err,
                      size_t errlen)
{
    size_t len;
    const uint8_t *frame = lmc_rpc_call_arg_raw(call, 0, &len);
    if (!frame) {
        snprintf(err, errlen, "missing key frame");
        return -1;
    }
    return lmc_ipc_key_decode_frame(frame, len, m->chunk_size, k, err, errlen);
}

/* The error a failed decode_key() answers with: -2 is the server's memory,
 * not the client's key. */
static const char *decode_error(int rc)
{
    return rc == -2 ? "MemoryError" : "ValidationError";
}

/* Gives back every lease not yet freed (an undelivered or abandoned lookup
 * result: no retrieve can be based on it). */
static void release_unfreed(lookup_mod *m, lmc_lookup_locks *l)
{
    size_t j = 0;
    for (size_t i = 0; i < l->n; i++) {
        if (lmc_lease_held(&l->leases[i])) {
            l->keys[j] = l->keys[i];   /* compact in place: the record is dropped next */
            l->leases[j++] = l->leases[i];
        }
    }
    lmc_storage_manager_give_back(m->ctx->storage, l->keys, l->leases, j);
    lmc_lookup_locks_clear(l);
}

/* The sizes the layout's objects have, for keys laid out chunk -> object
 * group -> rank: an object of another size (another layout's, under the
 * same key) is no hit (docs/storage.md, "Objects of another size"). */
static lmc_object_sizes layout_sizes(const lmc_layout *l, uint32_t per)
{
    return (lmc_object_sizes){l->group_sizes, l->num_groups, per / l->num_groups};
}

/* The leading run of chunks with every key present, read-locked; a partly
 * present chunk is no hit.  Returns the keys locked (a multiple of per). */
static size_t lock_prefix(lookup_mod *m, const lmc_ipc_key *k, const lmc_layout *l,
                          lmc_object_key *keys, lmc_lease *leases, size_t n, uint32_t per)
{
    lmc_object_sizes want = layout_sizes(l, per);
    size_t locked = lmc_storage_manager_lease_read(m->ctx->storage, keys, n, k->num_kv_readers,
                                                   true, &want, leases, NULL);
    size_t full = locked / per * per;
    lmc_storage_manager_give_back(m->ctx->storage, keys + full, leases + full, locked - full);
    return full;
}

static bool windowed(const lmc_layout *l)
{
    for (uint32_t g = 0; g < l->num_groups && g < LMC_LAYOUT_MAX_GROUPS; g++)
        if (l->chunks_in_sw[g] > 0)
            return true;
    return false;
}

/* Whether object group g needs chunk c for a hit of `hits` chunks: a
 * full-attention group every chunk, a sliding-window group its last
 * chunks_in_sw (docs/protocol.md, "Kernel groups and object groups"). */
static bool needed(const lmc_layout *l, uint32_t g, size_t c, size_t hits)
{
    int32_t w = l->chunks_in_sw[g];
    return c < hits && (w <= 0 || c + (size_t)w >= hits);
}

/* With sliding-window object groups: the longest prefix whose full groups
 * have every chunk and whose window groups have their last chunks; only
 * those keys stay locked (the others' leases are NONE, which a later
 * give-back skips).  Returns hits x per. */
static size_t lock_windowed(lookup_mod *m, const lmc_ipc_key *k, const lmc_layout *l,
                            lmc_object_key *keys, lmc_lease *leases, size_t n_chunks,
                            uint32_t per)
{
    lmc_l1_result *res = malloc(n_chunks * per * sizeof *res);
    if (!res)
        return 0;
    uint32_t ranks = per / l->num_groups;
    lmc_object_sizes want = layout_sizes(l, per);
    lmc_storage_manager_lease_read(m->ctx->storage, keys, n_chunks * per, k->num_kv_readers,
                                   false, &want, leases, res);
    size_t hits = n_chunks;
    for (; hits > 0; hits--) {
        bool ok = true;
        for (size_t i = 0; ok && i < hits * per; i++)
            ok = res[i] == LMC_L1_SUCCESS || !needed(l, (uint32_t)(i % per / ranks), i / per, hits);
        if (ok)
            break;
    }
    for (size_t i = 0; i < n_chunks * per; i++)
        if (!needed(l, (uint32_t)(i % per / ranks), i / per, hits))
            lmc_storage_manager_give_back(m->ctx->storage, &keys[i], &leases[i], 1);
    free(res);
    return hits * per;
}

/* Locks the hit run of whole chunks and records it on the session.
 * Returns the hit count in chunks. */
/* *hashes_out: the chunk hashes (valid while the session is held), or NULL
 * when nothing was hashed. */
static int64_t lock_hits(lookup_mod *m, lmc_session *se, const lmc_ipc_key *k,
                         const lmc_layout *layout, const uint8_t **hashes_out)
{
    size_t n_chunks = lmc_ipc_key_num_chunks(k, m->chunk_size);
    const uint8_t *hashes;
    *hashes_out = NULL;
    if (n_chunks == 0)
        return 0;
    int rc = lmc_session_hashes(se, k->tokens, k->n_tokens, k->start, k->end, &hashes);
    if (rc != LMC_HASH_OK) {
        LMC_WARN_LIMITED("LOOKUP %.*s: hashing failed: %s", (int)k->request_id_len, k->request_id,
                         lmc_hash_strerror(rc));
        return 0;
    }
    *hashes_out = hashes;
    uint32_t per = layout->num_groups * lmc_ipc_key_num_ranks(k);
    size_t n = n_chunks * per;
    lmc_object_key *keys = malloc(n * sizeof *keys);
    /* A LOOKUP only asks: a name never interned is a name no L1 object
     * has, so it is not interned now (issue 17).  An L2 tier may hold
     * objects of names this process never saw (a persistent store from an
     * earlier run), which its prefetch brings into L1 under these keys. */
    bool l2 = lmc_l2_attached(m->ctx->storage);
    if (!keys || (l2 ? lmc_ipc_key_object_keys(k, hashes, n_chunks, layout->num_groups,
                                               m->ctx->interner, keys)
                     : lmc_ipc_key_object_keys_find(k, hashes, n_chunks, layout->num_groups,
                                                    m->ctx->interner, keys)) != 0) {
        free(keys);
        return 0;
    }
    /* n: an L2 prefetch may extend the record */
    lmc_lease *leases = calloc(n, sizeof *leases);
    if (!leases) {
        lmc_keys_drop(keys, n);
        free(keys);
        return 0;
    }
    size_t full = windowed(layout) ? lock_windowed(m, k, layout, keys, leases, n_chunks, per)
                                   : lock_prefix(m, k, layout, keys, leases, n, per);
    se->locks = (lmc_lookup_locks){.keys = keys, .n_keys_held = n, .leases = leases, .n = full,
                                   .first_chunk = k->start / m->chunk_size,
                                   .keys_per_chunk = per, .readers = k->num_kv_readers};
    return (int64_t)(full / per);
}

static void l2_lookup_free(l2_lookup *p)
{
    free(p->unit_sizes);
    free(p->event);
    free(p->rid);
    if (p->keys)
        lmc_keys_drop(p->keys, p->n_keys); /* compaction moves keys of the same names */
    free(p->keys);
    free(p->leases);
    free(p);
}

/* Prefetch thread: the L2 lookup phase is over. */
static void l2_lookup_done(void *user, size_t units)
{
    l2_lookup *p = user;
    lmc_jobs_set_lookup_hits(p->m->jobs, p->rid, p->rid_len, p->job_id,
                             p->l1_chunks + (int64_t)units);
}

/* Appends the loaded leases p->leases[0..nk) to the record, except those
 * a FREE_LOOKUP_LOCKS covered while they loaded: those are moved to the
 * front of p's arrays.  Returns how many the caller gives back. */
static size_t attach_loaded(l2_lookup *p, lmc_lookup_locks *l, size_t nk)
{
    size_t back = 0;
    for (size_t i = 0; i < nk; i++) {
        lmc_lease *slot = &l->leases[l->n + i];
        if (slot->kind == LMC_LEASE_RETURNED) {
            p->keys[back] = p->keys[i];   /* back <= i: compacts in place */
            p->leases[back++] = p->leases[i];
        } else {
            *slot = p->leases[i];
        }
    }
    l->n += nk;
    return back;
}

/* Prefetch thread: keys[0..units*per) are loaded and read-locked.  They
 * join the session's lock record if that is still this LOOKUP's (same job,
 * same record) and no free covered them; otherwise nobody can retrieve
 * them and the locks go back. */
static void l2_done(void *user, size_t units)
{
    l2_lookup *p = user;
    lookup_mod *m = p->m;
    size_t nk = units * p->per;
    size_t back = nk;
    lmc_session *se = lmc_sessions_acquire(m->ctx->sessions, p->rid, p->rid_len, false);
    if (se) {
        if (se->locks.keys == p->session_keys && se->locks.n == p->l1_keys) {
            if (nk && lmc_jobs_is_current(m->jobs, p->rid, p->rid_len, p->job_id))
                back = attach_loaded(p, &se->locks, nk);
            se->locks.pending = 0;
        }
        lmc_sessions_release(m->ctx->sessions, se);
    }
    if (back)
        lmc_storage_manager_give_back(m->ctx->storage, p->keys, p->leases, back);
    int64_t hits = p->l1_chunks + (int64_t)units;
    if (p->event) { /* the final answer is known only now */
        int64_t cs = m->chunk_size;
        p->event->hit_chunks = hits;
        p->event->hit_tokens = hits * cs;
        p->event->hit_tokens_l2 = (int64_t)units * cs;
        lmc_event_bus_publish_deferred(m->ctx->events, LMC_EVENT_LOOKUP_END, p->rid,
                                       lmc_event_lookup_build, p->event);
        p->event = NULL;
    }
    lmc_jobs_complete(m->jobs, p->rid, p->rid_len, p->job_id, hits);
    atomic_fetch_add(&m->hit_chunks, (uint64_t)hits);
    atomic_fetch_add(&m->l2_hit_chunks, units);
    l2_lookup_free(p);
}

/* Sends the keys after the session's L1 run to the L2 tier.  True when the
 * prefetch took over completing job `id`. */
/* Object groups of different sizes: the size of each key of a chunk. */
static bool unit_sizes(l2_lookup *p, const lmc_layout *l)
{
    bool differ = false;
    for (uint32_t g = 1; g < l->num_groups && g < LMC_LAYOUT_MAX_GROUPS; g++)
        differ |= l->group_sizes[g] != l->group_sizes[0];
    if (!differ)
        return true;
    if (!(p->unit_sizes = malloc(p->per * sizeof *p->unit_sizes)))
        return false;
    for (uint32_t i = 0; i < p->per; i++)
        p->unit_sizes[i] = l->group_sizes[i / (p->per / l->num_groups)];
    return true;
}

static bool start_l2(lookup_mod *m, lmc_session *se, const lmc_ipc_key *k, uint64_t id,
                     int64_t l1_chunks, size_t n_keys, const lmc_layout *layout,
                     lmc_lookup_event_info **event)
{
    lmc_lookup_locks *l = &se->locks;
    size_t rest = n_keys - l->n;
    if (!l->keys || rest < l->keys_per_chunk || !lmc_l2_attached(m->ctx->storage))
        return false;
    l2_lookup *p = calloc(1, sizeof *p);
    if (!p || !(p->rid = malloc(k->request_id_len + 1)) ||
        !(p->keys = malloc(rest * sizeof *p->keys)) ||
        !(p->leases = calloc(rest, sizeof *p->leases))) {
        if (p)
            l2_lookup_free(p);
        return false;
    }
    memcpy(p->rid, k->request_id, k->request_id_len);
    p->rid[k->request_id_len] = '\0';
    memcpy(p->keys, l->keys + l->n, rest * sizeof *p->keys);
    lmc_keys_hold(p->keys, rest); /* the prefetch may outlive the lock record */
    p->n_keys = rest;
    p->m = m;
    p->rid_len = k->request_id_len;
    p->job_id = id;
    p->l1_chunks = l1_chunks;
    p->session_keys = l->keys;
    p->l1_keys = l->n;
    p->per = l->keys_per_chunk;
    p->readers = l->readers;
    if (!unit_sizes(p, layout)) {
        l2_lookup_free(p);
        return false;
    }
    p->event = *event; /* before submitting: the callbacks may run at once */
    lmc_l2_prefetch_request req = {
        .keys = p->keys, .leases = p->leases, .n = rest, .keys_per_unit = p->per,
        .object_size = layout->object_size, .unit_sizes = p->unit_sizes,
        .readers = p->readers, .on_lookup_done = l2_lookup_done, .on_done = l2_done, .user = p,
    };
    if (lmc_l2_prefetch(m->ctx->storage, &req) != 0) {
        p->event = NULL; /* still the caller's */
        l2_lookup_free(p);
        return false;
    }
    *event = NULL;
    l->pending = rest; /* the session is held: on_done cannot run before this */
    atomic_fetch_add(&m->l2_prefetches, 1);
    return true;
}

/* LOOKUP_END facts (obs/events.h), copied for a deferred publish; NULL
 * without an event bus.  The JSON is built on the bus's thread. */
static lmc_lookup_event_info *lookup_event(lookup_mod *m, const lmc_ipc_key *k, const uint8_t *hashes,
                            int64_t hits, bool have_layout)
{
    if (!m->ctx->events)
        return NULL;
    size_t n_chunks = lmc_ipc_key_num_chunks(k, m->chunk_size);
    lmc_lookup_event_info ev = {
        .request_id = k->request_id, .request_id_len = k->request_id_len,
        .model_name = k->model_name, .model_len = k->model_len,
        .cache_salt = k->cache_salt, .salt_len = k->salt_len,
        .requested_tokens = (int64_t)(n_chunks * m->chunk_size),
        .hit_tokens = hits * (int64_t)m->chunk_size,
        .requested_chunks = (int64_t)n_chunks, .hit_chunks = hits,
        .hashes = hashes, .n_hashes = hashes ? n_chunks : 0, .hash_len = LMC_TOKEN_HASH_LEN,
        .early_exit = !have_layout ? "no_group_layout_descs"
                      : n_chunks == 0 ? "empty_chunk_hashes" : NULL,
    };
    return lmc_event_lookup_info_dup(&ev);
}

/* A LOOKUP whose job is registered and whose reply may already be out. */
typedef struct {
    lookup_mod *m;
    lmc_ipc_key k;   /* points into the call's frames, valid in the continuation */
    uint64_t id;
    bool replaced;
} lookup_work;

/* Hashes, locks the hit run, starts the L2 prefetch and completes job
 * `id` of k's request. */
static void run_lookup(lookup_mod *m, const lmc_ipc_key *k, uint64_t id, bool replaced)
{
    char sid[256] = ""; /* events only: without a bus nothing formats it */
    if (m->ctx->events) { /* opens the mp.lookup_prefetch span; LOOKUP_END closes it */
        snprintf(sid, sizeof sid, "%.*s", (int)k->request_id_len, k->request_id);
        lmc_event_bus_publish(m->ctx->events, LMC_EVENT_LOOKUP_START, sid,
                              json_pack("{s:s%, s:s%, s:s%}", "request_id", k->request_id,
                                        k->request_id_len, "model_name", k->model_name,
                                        k->model_len, "cache_salt", k->cache_salt,
                                        k->salt_len));
    }
    int64_t hits = 0;
    bool l2_pending = false;
    lmc_lookup_event_info *event = NULL;
    lmc_layout layout;
    bool have_layout = lmc_layout_registry_get(m->ctx->layouts, k->model_name, k->model_len,
                                               k->world_size, &layout);
    lmc_session *se = lmc_sessions_acquire(m->ctx->sessions, k->request_id, k->request_id_len,
                                           true);
    if (se) {
        if (replaced)
            release_unfreed(m, &se->locks);
        else
            lmc_lookup_locks_clear(&se->locks);  /* delivered: retrieves consume them */
        se->hit_chunks = -1;
        const uint8_t *hashes = NULL;
        if (have_layout)
            hits = lock_hits(m, se, k, &layout, &hashes);
        event = lookup_event(m, k, hashes, hits, have_layout);
        /* The session is held, so the prefetch's completion (which takes
         * it) cannot overtake this handler. */
        if (have_layout)
            l2_pending = start_l2(m, se, k, id, hits,
                                  lmc_ipc_key_num_chunks(k, m->chunk_size) *
                                      layout.num_groups * lmc_ipc_key_num_ranks(k),
                                  &layout, &event);
        lmc_sessions_release(m->ctx->sessions, se);
    }
    if (event) /* complete now (with an L2 prefetch, the prefetch publishes it) */
        lmc_event_bus_publish_deferred(m->ctx->events, LMC_EVENT_LOOKUP_END, sid,
                                       lmc_event_lookup_build, event);
    atomic_fetch_add(&m->lookups, 1);
    atomic_fetch_add(&m->requested_chunks, lmc_ipc_key_num_chunks(k, m->chunk_size));
    if (!l2_pending) {
        lmc_jobs_complete(m->jobs, k->request_id, k->request_id_len, id, hits);
        atomic_fetch_add(&m->hit_chunks, (uint64_t)hits);
    }
}

/* Runs after the void reply when LOOKUP ran on the socket thread: the
 * client's QUERY can only be read once this returned (lmc_rpc_call_then),
 * so it sees the final count, and the reply's trip overlaps this work. */
static void finish_lookup(void *arg)
{
    lookup_work *w = arg;
    run_lookup(w->m, &w->k, w->id, w->replaced);
    lmc_ipc_key_free(&w->k);
    free(w);
}

int lmc_lookup_prefix_begin(void *lookup, const lmc_ipc_key *k)
{
    lookup_mod *m = lookup;
    bool replaced;
    uint64_t id = lmc_jobs_submit(m->jobs, k->request_id, k->request_id_len, &replaced);
    if (!id)
        return -1;
    run_lookup(m, k, id, replaced);
    return 0;
}

/* LOOKUP(key, tp_size) -> void.  Validates the key and registers the job
 * before the reply (a QUERY must find it); finish_lookup does the rest. */
static lmc_handler_result lookup(void *state, lmc_rpc_call *call)
{
    lookup_mod *m = state;
    lookup_work *w = malloc(sizeof *w);
    char err[256];
    if (!w)
        return lmc_rpc_call_fail(call, "MemoryError", "LOOKUP: out of memory");
    int drc = decode_key(m, call, &w->k, err, sizeof err);
    if (drc != 0) {
        free(w);
        return lmc_rpc_call_fail(call, decode_error(drc), "LOOKUP: %s", err);
    }
    w->m = m;
    w->id = lmc_jobs_submit(m->jobs, w->k.request_id, w->k.request_id_len, &w->replaced);
    if (!w->id) {
        lmc_ipc_key_free(&w->k);
        free(w);
        return lmc_rpc_call_fail(call, "MemoryError", "LOOKUP: out of memory");
    }
    lmc_rpc_call_then(call, finish_lookup, w);
    return LMC_HANDLER_VOID;
}

static bool decode_rid(lmc_rpc_call *call, const char **rid, size_t *len)
{
    const msgpack_object *o = lmc_rpc_call_arg(call, 0);
    return o && lmc_mp_get_str(o, rid, len);
}

static void record_delivered(lookup_mod *m, const char *rid, size_t len, int64_t hits)
{
    lmc_session *se = lmc_sessions_acquire(m->ctx->sessions, rid, len, false);
    if (se) {
        se->hit_chunks = hits;
        lmc_sessions_release(m->ctx->sessions, se);
    }
}

/* Writes the answer for a job status; returns the handler result. */
static lmc_handler_result answer(lookup_mod *m, lmc_rpc_call *call, const char *rid, size_t len,
                                 lmc_job_status st, int64_t hits)
{
    if (st == LMC_JOB_RUNNING)
        return LMC_HANDLER_VOID;   /* no frame: None */
    if (st == LMC_JOB_DONE)
        record_delivered(m, rid, len, hits);
    msgpack_pack_int64(lmc_rpc_call_reply(call), st == LMC_JOB_DONE ? hits : 0);
    return LMC_HANDLER_REPLY;
}

lmc_job_status lmc_lookup_prefix_poll(void *lookup, const char *rid, size_t len, int64_t *hits)
{
    lookup_mod *m = lookup;
    lmc_job_status st = lmc_jobs_query(m->jobs, rid, len, hits);
    if (st == LMC_JOB_DONE)
        record_delivered(m, rid, len, *hits);
    return st;
}

/* QUERY_PREFETCH_STATUS(request_id) -> int | None */
static lmc_handler_result query_status(void *state, lmc_rpc_call *call)
{
    lookup_mod *m = state;
    const char *rid;
    size_t len;
    int64_t hits;
    if (!decode_rid(call, &rid, &len))
        return lmc_rpc_call_fail(call, "ValidationError", "request_id must be a str");
    lmc_job_status st = lmc_jobs_query(m->jobs, rid, len, &hits);
    return answer(m, call, rid, len, st, hits);
}

typedef struct {
    lookup_mod *m;
    lmc_rpc_call *call;
} parked_wait;

/* Payload of a WAIT that may park: a request id (at most 1 KiB for a job
 * to exist) and a float, with room to spare. */
#define PARKED_WAIT_MAX_BYTES 4096

/* Runs on whichever thread finishes the wait (completion, timer, close). */
static void wait_done(void *user, lmc_job_status st, int64_t hits)
{
    parked_wait *pw = user;
    const char *rid;
    size_t len;
    decode_rid(pw->call, &rid, &len);   /* decoded before parking: cannot fail */
    lmc_rpc_call_complete(pw->call, answer(pw->m, pw->call, rid, len, st, hits));
    free(pw);
}

/* WAIT_PREFETCH_STATUS(request_id, timeout_seconds) -> int | None */
static lmc_handler_result wait_status(void *state, lmc_rpc_call *call)
{
    lookup_mod *m = state;
    const char *rid;
    size_t len;
    double timeout = 0;
    const msgpack_object *t = lmc_rpc_call_arg(call, 1);
    if (!decode_rid(call, &rid, &len) || !t || !lmc_mp_get_double(t, &timeout))
        return lmc_rpc_call_fail(call, "ValidationError",
                                 "WAIT_PREFETCH_STATUS: expected (str, float)");
    if (!(timeout > 0))
        timeout = 0;                   /* NaN or negative: poll once */
    if (timeout > 86400)
        timeout = 86400;
    /* A parked call keeps its frames: a WAIT carrying more than a request
     * id and a timeout (trailing frames are allowed) is answered as a
     * poll instead, so that parked waits stay small (issue 17). */
    size_t bytes = 0, flen;
    for (size_t i = 0; i < lmc_rpc_call_nargs(call); i++)
        bytes += lmc_rpc_call_arg_raw(call, i, &flen) ? flen : 0;
    if (bytes > PARKED_WAIT_MAX_BYTES) {
        int64_t hits;
        lmc_job_status st = lmc_jobs_query(m->jobs, rid, len, &hits);
        return answer(m, call, rid, len, st, hits);
    }
    parked_wait *pw = malloc(sizeof *pw);
    if (!pw)
        return lmc_rpc_call_fail(call, "MemoryError", "out of memory");
    *pw = (parked_wait){m, call};
    int64_t hits;
    lmc_job_status st = lmc_jobs_wait(m->jobs, rid, len, (int64_t)(timeout * 1000), wait_done,
                                      pw, &hits);
    if (st == LMC_JOB_WAITING) {
        atomic_fetch_add(&m->waits_parked, 1);
        return LMC_HANDLER_DEFERRED;
    }
    free(pw);
    return answer(m, call, rid, len, st, hits);
}

/* QUERY_PREFETCH_LOOKUP_HITS(request_id) -> int | None, not consuming */
static lmc_handler_result query_lookup_hits(void *state, lmc_rpc_call *call)
{
    lookup_mod *m = state;
    const char *rid;
    size_t len;
    int64_t hits;
    if (!decode_rid(call, &rid, &len))
        return lmc_rpc_call_fail(call, "ValidationError", "request_id must be a str");
    lmc_job_status st = lmc_jobs_lookup_hits(m->jobs, rid, len, &hits);
    if (st == LMC_JOB_RUNNING)
        return LMC_HANDLER_VOID;
    msgpack_pack_int64(lmc_rpc_call_reply(call), st == LMC_JOB_DONE ? hits : 0);
    return LMC_HANDLER_REPLY;
}

/* Whether record entry i is a key of chunk c in [c0, c1) whose hash
 * matches the request's chain (`hashes` = chunk c0 on) and model. */
static bool in_free_range(const lmc_lookup_locks *l, size_t i, size_t c0, size_t c1,
                          const uint8_t *hashes, const lmc_ipc_key *k)
{
    size_t c = l->first_chunk + i / l->keys_per_chunk;
    const lmc_object_key *key = &l->keys[i];
    return c >= c0 && c < c1 &&
           memcmp(key->chunk_hash, hashes + (c - c0) * LMC_TOKEN_HASH_LEN,
                  LMC_TOKEN_HASH_LEN) == 0 &&
           strlen(key->model_name) == k->model_len &&
           memcmp(key->model_name, k->model_name, k->model_len) == 0;
}

/* Releases the recorded locks of chunks in [c0, c1) whose hash matches the
 * request's chain, and marks the matching keys an L2 prefetch has still to
 * append so that their leases go back when they arrive. */
static void free_range(lookup_mod *m, lmc_lookup_locks *l, size_t c0, size_t c1,
                       const uint8_t *hashes, const lmc_ipc_key *k)
{
    size_t nb = 0, run = 0;   /* leases [run, i) match: given back together, in place */
    for (size_t i = 0; i <= l->n; i++) {
        if (i < l->n && lmc_lease_held(&l->leases[i]) && in_free_range(l, i, c0, c1, hashes, k))
            continue;
        if (i > run) {
            lmc_storage_manager_give_back(m->ctx->storage, l->keys + run, l->leases + run,
                                          i - run);
            nb += i - run;
        }
        run = i + 1;
    }
    for (size_t i = l->n; i < l->n + l->pending; i++) {
        if (l->leases[i].kind != LMC_LEASE_RETURNED && in_free_range(l, i, c0, c1, hashes, k)) {
            l->leases[i].kind = LMC_LEASE_RETURNED;
            nb++;
        }
    }
    atomic_fetch_add(&m->freed_keys, nb);
}

/* FREE_LOOKUP_LOCKS(key, tp_size) -> void */
static lmc_handler_result free_lookup_locks(void *state, lmc_rpc_call *call)
{
    lookup_mod *m = state;
    lmc_ipc_key k;
    char err[256];
    int drc = decode_key(m, call, &k, err, sizeof err);
    if (drc != 0)
        return lmc_rpc_call_fail(call, decode_error(drc), "FREE_LOOKUP_LOCKS: %s", err);
    lmc_session *se = k.start < k.end
                          ? lmc_sessions_acquire(m->ctx->sessions, k.request_id,
                                                 k.request_id_len, false)
                          : NULL;
    if (se) {
        const uint8_t *hashes;
        if (se->locks.n + se->locks.pending &&
            lmc_session_hashes(se, k.tokens, k.n_tokens, k.start, k.end, &hashes) == LMC_HASH_OK)
            free_range(m, &se->locks, k.start / m->chunk_size, k.end / m->chunk_size, hashes, &k);
        lmc_sessions_release(m->ctx->sessions, se);
    }
    lmc_ipc_key_free(&k);
    return LMC_HANDLER_VOID;
}

/* END_SESSION(request_id[, end_info]) -> void */
static lmc_handler_result end_session(void *state, lmc_rpc_call *call)
{
    lookup_mod *m = state;
    const char *rid;
    size_t len;
    if (!decode_rid(call, &rid, &len))
        return lmc_rpc_call_fail(call, "ValidationError", "request_id must be a str");
    bool undelivered = lmc_jobs_drop(m->jobs, rid, len);
    lmc_session *se = lmc_sessions_remove(m->ctx->sessions, rid, len);
    if (se) {
        /* Refresh the request's chunks in LRU: they were just used. */
        if (se->locks.n)
            lmc_storage_manager_touch(m->ctx->storage, se->locks.keys, se->locks.n);
        if (undelivered)
            release_unfreed(m, &se->locks);
        lmc_sessions_release(m->ctx->sessions, se);
    }
    return LMC_HANDLER_VOID;
}

/* The answers of a full queue (docs/protocol.md, "Overload").  LOOKUP:
 * the void reply, with no job registered, so the status polls answer 0
 * hits (a job an earlier LOOKUP of the same id registered is left as it
 * is).  WAIT_PREFETCH_STATUS: no frame, as when its timeout passes. */
static lmc_handler_result busy_void(void *state, lmc_rpc_call *call)
{
    (void)state;
    (void)call;
    return LMC_HANDLER_VOID;
}

static const lmc_rpc_handler_spec lookup_handlers[] = {
    {LMC_OP_LOOKUP, NULL, LMC_POOL_NORMAL, lookup, .quick = true, .busy = busy_void},
    /* The two status polls are a table lookup: answered on the socket
     * thread, they skip two thread hand-offs per scheduler poll.  The job
     * they read was registered before the LOOKUP's reply went out. */
    {LMC_OP_QUERY_PREFETCH_STATUS, NULL, LMC_POOL_SYNC, query_status, false, NULL, NULL, false},
    {LMC_OP_WAIT_PREFETCH_STATUS, NULL, LMC_POOL_NORMAL, wait_status, false, NULL, busy_void, false},
    {LMC_OP_QUERY_PREFETCH_LOOKUP_HITS, NULL, LMC_POOL_SYNC, query_lookup_hits, false, NULL, NULL, false},
    {LMC_OP_FREE_LOOKUP_LOCKS, NULL, LMC_POOL_NORMAL, free_lookup_locks, .quick = true,
     .releases = true},
    {LMC_OP_END_SESSION, NULL, LMC_POOL_NORMAL, end_session, .quick = true,
     .releases = true},
};

static int lookup_create(lmc_module_ctx *ctx, void **state, char *err, size_t errlen)
{
    lookup_mod *m = calloc(1, sizeof *m);
    if (!m || !ctx->sessions || !ctx->layouts) {
        free(m);
        snprintf(err, errlen, "lookup: out of memory");
        return -1;
    }
    m->ctx = ctx;
    m->chunk_size = (uint32_t)ctx->config->mp.chunk_size;
    lmc_jobs_options jo = {
        .max_jobs = 65536,
        .max_age_ms = 2000LL * ctx->config->storage.l1_read_ttl_seconds,
        .timer_thread = true,
    };
    m->jobs = lmc_jobs_new(&jo);
    if (!m->jobs) {
        free(m);
        snprintf(err, errlen, "lookup: cannot create the job registry");
        return -1;
    }
    ctx->lookup = m;
    *state = m;
    return 0;
}

static json_t *lookup_status(void *state)
{
    lookup_mod *m = state;
    return json_pack("{s:b, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I}", "is_healthy", 1,
                     "l2_prefetches", (json_int_t)atomic_load(&m->l2_prefetches),
                     "l2_hit_chunks", (json_int_t)atomic_load(&m->l2_hit_chunks), "sessions",
                     (json_int_t)lmc_sessions_count(m->ctx->sessions), "jobs",
                     (json_int_t)lmc_jobs_count(m->jobs), "parked_waits",
                     (json_int_t)lmc_jobs_waiter_count(m->jobs), "lookups",
                     (json_int_t)atomic_load(&m->lookups), "requested_chunks",
                     (json_int_t)atomic_load(&m->requested_chunks), "hit_chunks",
                     (json_int_t)atomic_load(&m->hit_chunks), "freed_lock_keys",
                     (json_int_t)atomic_load(&m->freed_keys), "layouts",
                     (json_int_t)lmc_layout_registry_count(m->ctx->layouts));
}

static void lookup_close(void *state)
{
    lookup_mod *m = state;
    /* Answers every L2 prefetch in flight now: their callbacks use m. */
    if (m->ctx->storage)
        lmc_l2_stop_prefetch(m->ctx->storage);
    lmc_jobs_free(m->jobs);   /* parked WAITs are answered None */
    free(m);
}

const lmc_module_def lmc_lookup_module = {
    .name = "lookup",
    .create = lookup_create,
    .handlers = lookup_handlers,
    .n_handlers = sizeof lookup_handlers / sizeof lookup_handlers[0],
    .report_status = lookup_status,
    .close = lookup_close,
};
