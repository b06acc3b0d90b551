/* CB_UNIFIED_LOOKUP (docs/cacheblend.md, "Unified lookup"): a state
 * machine per request id, advanced by the client's re-issued calls, each
 * answered None (no frame) until the result is ready.
 *
 *   first call   the prefix leg (a LOOKUP through the lookup module) and
 *                the fingerprint match of the whole prompt;
 *   prefix done  the leading hit chunks are known: candidates inside them
 *                are dropped, the rest (and with --enable-segmented-prefix
 *                the prefix chunks after the gap) are read-locked in L1,
 *                and those L1 lacks are loaded from L2, one load per chunk;
 *   loads done   found chunks' locks go to the session's stash, stale
 *                candidates are struck, overlapping ones dropped, and the
 *                result is sent.
 * No call ever waits: a pool thread only does what is ready. */
#include <stdlib.h>
#include <string.h>

#include "modules/blend/serve/blend_serve.h"
#include "modules/lookup/lookup.h"
#include "obs/log.h"
#include "storage/l2/l2_service.h"
#include "storage/storage_manager.h"

#define MAX_JOBS 4096
#define JOB_MAX_AGE_MS 60000

enum { U_PENDING, U_FOUND, U_MISSING };

/* One chunk hash the sparse leg reads, on every rank. */
typedef struct {
    uint8_t hash[LMC_BLEND_HASH_BYTES];
    bool tail;                /* a prefix chunk after the gap, at its own position */
    lmc_object_key *keys;     /* ranks; hold references */
    lmc_lease *leases;
    int state;
} cb_unit;

/* An L2 load of one unit; owns a job reference. */
typedef struct {
    cb_job *job;
    size_t unit;
} cb_load;

struct cb_job {
    cb_job *next;
    cb_mod *m;
    char *rid;
    size_t rid_len;
    int64_t created_ms;
    atomic_int refs;          /* the table's, each load's */
    atomic_size_t loading;
    bool busy;                /* a pool thread advances it (m->lock) */
    bool prefix_done, sparse_started;
    bool asked_fleet;         /* the coordinator has the match to answer */
    int64_t leading;
    uint32_t ranks, readers;
    lmc_blend_candidate *cands;
    size_t n_cands;
    cb_unit *units;
    size_t n_units;
    cb_load *loads;
};

static int64_t now_ms(void)
{
    return lmc_monotonic_ms(NULL);
}

static void job_free(cb_job *j)
{
    for (size_t u = 0; u < j->n_units; u++) {
        cb_unit *x = &j->units[u];
        if (x->keys) {
            lmc_storage_manager_give_back(j->m->ctx->storage, x->keys, x->leases, j->ranks);
            lmc_keys_drop(x->keys, j->ranks);
        }
        free(x->keys);
        free(x->leases);
    }
    free(j->units);
    free(j->loads);
    free(j->cands);
    if (j->asked_fleet)
        lmc_blend_coord_take(j->m->coord, j->rid);
    free(j->rid);
    free(j);
}

static void job_put(cb_job *j)
{
    if (j && atomic_fetch_sub(&j->refs, 1) == 1)
        job_free(j);
}

/* Unlinks j (m->lock held); the caller puts the table's reference. */
static void unlink_locked(cb_mod *m, cb_job *j)
{
    for (cb_job **p = &m->jobs; *p; p = &(*p)->next) {
        if (*p == j) {
            *p = j->next;
            m->n_jobs--;
            return;
        }
    }
}

/* Drops jobs never polled again: past the age, or the oldest past the
 * bound (the list is newest first).  Returns them for job_put. */
static cb_job *prune_locked(cb_mod *m, int64_t now)
{
    cb_job *dead = NULL, **p = &m->jobs;
    size_t kept = 0;
    while (*p) {
        cb_job *j = *p;
        if (!j->busy && (now - j->created_ms > JOB_MAX_AGE_MS || kept >= MAX_JOBS - 1)) {
            *p = j->next;
            m->n_jobs--;
            j->next = dead;
            dead = j;
            atomic_fetch_add(&m->jobs_dropped, 1);
        } else {
            kept++;
            p = &j->next;
        }
    }
    return dead;
}

static void put_all(cb_job *j)
{
    while (j) {
        cb_job *next = j->next;
        job_put(j);
        j = next;
    }
}

/* The job of rid, claimed (busy) for the caller; *fresh when created now.
 * NULL when another thread holds it (answer None) or out of memory. */
static cb_job *claim(cb_mod *m, const lmc_ipc_key *k, bool *fresh, bool *oom)
{
    *fresh = *oom = false;
    int64_t now = now_ms();
    pthread_mutex_lock(&m->lock);
    cb_job *dead = prune_locked(m, now), *j = m->jobs;
    while (j && !(j->rid_len == k->request_id_len &&
                  memcmp(j->rid, k->request_id, k->request_id_len) == 0))
        j = j->next;
    if (j && j->busy) {
        j = NULL;
    } else if (!j) {
        j = calloc(1, sizeof *j);
        if (j && (j->rid = malloc(k->request_id_len + 1))) {
            memcpy(j->rid, k->request_id, k->request_id_len);
            j->rid[k->request_id_len] = '\0';
            j->rid_len = k->request_id_len;
            j->m = m;
            j->created_ms = now;
            atomic_init(&j->refs, 1);
            j->next = m->jobs;
            m->jobs = j;
            m->n_jobs++;
            *fresh = true;
        } else {
            free(j);
            j = NULL;
            *oom = true;
        }
    }
    if (j)
        j->busy = true;
    pthread_mutex_unlock(&m->lock);
    put_all(dead);
    return j;
}

static void unclaim(cb_mod *m, cb_job *j)
{
    pthread_mutex_lock(&m->lock);
    j->busy = false;
    pthread_mutex_unlock(&m->lock);
}

/* ---- first call: the prefix leg and the match ------------------------------ */

static int begin(cb_mod *m, cb_job *j, const lmc_ipc_key *k, bool have_layout)
{
    j->ranks = k->world_size;
    j->readers = k->num_kv_readers;
    if (have_layout && lmc_ipc_key_num_chunks(k, m->cs) > 0) {
        if (lmc_lookup_prefix_begin(m->ctx->lookup, k) != 0)
            return -1;
    } else {
        j->prefix_done = true;
    }
    cb_key_ns kn;
    if (!lmc_blend_serve_key_ns_init(&kn, k))
        return 0;
    if (m->coord) { /* the fleet's index is the match source (docs/cacheblend.md) */
        if (k->n_tokens >= m->cs)
            j->asked_fleet = lmc_blend_coord_submit(m->coord, j->rid, k->tokens, k->n_tokens,
                                                    kn.model, k->world_size, kn.salt) == 0;
        if (!j->asked_fleet && k->n_tokens >= m->cs)
            atomic_fetch_add(&m->coordinator_failures, 1);
        return 0;
    }
    lmc_blend_ns ns = {kn.model, kn.salt, k->world_size};
    if (lmc_blend_matcher_match(m->matcher, &ns, k->tokens, k->n_tokens, &j->cands,
                                &j->n_cands) != LMC_BLEND_OK)
        j->n_cands = 0;
    return 0;
}

/* ---- the sparse leg ---------------------------------------------------------- */

static bool has_unit(const cb_job *j, const uint8_t *hash)
{
    for (size_t u = 0; u < j->n_units; u++)
        if (memcmp(j->units[u].hash, hash, LMC_BLEND_HASH_BYTES) == 0)
            return true;
    return false;
}

static void add_unit(cb_job *j, const uint8_t *hash, bool tail)
{
    if (has_unit(j, hash))
        return;
    cb_unit *u = &j->units[j->n_units++];
    memcpy(u->hash, hash, LMC_BLEND_HASH_BYTES);
    u->tail = tail;
}

/* The units: each candidate past the prefix, then (segmented) each prefix
 * chunk after the gap.  0, or -1 out of memory. */
static int plan_units(cb_mod *m, cb_job *j, const uint8_t *chain, size_t n_chunks)
{
    size_t tail = chain && (size_t)j->leading + 1 < n_chunks ? n_chunks - j->leading - 1 : 0;
    if (!(j->units = calloc(j->n_cands + tail + 1, sizeof *j->units)))
        return -1;
    uint64_t prefix = (uint64_t)j->leading * m->cs;
    /* The tail first: a candidate of the same chained hash is that very
     * chunk at its own position, delivered as tail (docs/cacheblend.md). */
    for (size_t c = (size_t)j->leading + 1; tail && c < n_chunks; c++)
        add_unit(j, chain + c * LMC_BLEND_HASH_BYTES, true);
    for (size_t i = 0; i < j->n_cands; i++)
        if (j->cands[i].cur_st >= prefix)
            add_unit(j, j->cands[i].hash, false);
    return 0;
}

/* Prefetch thread: unit's keys loaded (units == 1) or not. */
static void load_done(void *user, size_t units)
{
    cb_load *l = user;
    cb_job *j = l->job;
    j->units[l->unit].state = units == 1 ? U_FOUND : U_MISSING;
    atomic_fetch_sub(&j->loading, 1);
    job_put(j);
}

/* Read-locks every unit in L1 and sends those L1 lacks to L2. */
static int start_sparse(cb_mod *m, cb_job *j, const lmc_ipc_key *k, const lmc_layout *layout)
{
    lmc_ipc_key all = *k;
    all.has_worker = false;
    size_t n = j->n_units * j->ranks;
    uint8_t *hashes = malloc(j->n_units * LMC_BLEND_HASH_BYTES + 1);
    lmc_object_key *keys = malloc((n + 1) * sizeof *keys);
    lmc_l1_result *res = malloc((n + 1) * sizeof *res);
    j->loads = calloc(j->n_units + 1, sizeof *j->loads);
    int rc = -1;
    if (!hashes || !keys || !res || !j->loads)
        goto out;
    for (size_t u = 0; u < j->n_units; u++)
        memcpy(hashes + u * LMC_BLEND_HASH_BYTES, j->units[u].hash, LMC_BLEND_HASH_BYTES);
    rc = lmc_ipc_key_object_keys_find(&all, hashes, j->n_units, 1, m->ctx->interner, keys);
    if (rc != 0) { /* names never interned: nothing stored under them */
        for (size_t u = 0; u < j->n_units; u++)
            j->units[u].state = U_MISSING;
        rc = 0;
        goto out;
    }
    for (size_t u = 0; u < j->n_units; u++) {
        cb_unit *x = &j->units[u];
        x->keys = malloc(j->ranks * sizeof *x->keys);
        x->leases = calloc(j->ranks, sizeof *x->leases);
        if (!x->keys || !x->leases) {
            lmc_keys_drop(keys + u * j->ranks, (size_t)(j->n_units - u) * j->ranks);
            free(x->keys);
            x->keys = NULL;
            goto out;
        }
        memcpy(x->keys, keys + u * j->ranks, j->ranks * sizeof *x->keys);
    }
    lmc_object_sizes want = {&layout->object_size, 1, 1};
    bool l2 = lmc_l2_attached(m->ctx->storage);
    for (size_t u = 0; u < j->n_units; u++) {
        cb_unit *x = &j->units[u];
        lmc_storage_manager_lease_read(m->ctx->storage, x->keys, j->ranks, j->readers, false,
                                       &want, x->leases, res);
        bool all_hit = true;
        for (uint32_t r = 0; r < j->ranks; r++)
            all_hit &= res[r] == LMC_L1_SUCCESS;
        if (all_hit) {
            x->state = U_FOUND;
            continue;
        }
        lmc_storage_manager_give_back(m->ctx->storage, x->keys, x->leases, j->ranks);
        memset(x->leases, 0, j->ranks * sizeof *x->leases);
        x->state = U_MISSING;
        if (!l2)
            continue;
        j->loads[u] = (cb_load){j, u};
        x->state = U_PENDING;
        atomic_fetch_add(&j->refs, 1);
        atomic_fetch_add(&j->loading, 1);
        lmc_l2_prefetch_request req = {
            .keys = x->keys, .leases = x->leases, .n = j->ranks, .keys_per_unit = j->ranks,
            .object_size = layout->object_size, .readers = j->readers,
            .on_done = load_done, .user = &j->loads[u]};
        if (lmc_l2_prefetch(m->ctx->storage, &req) != 0) {
            x->state = U_MISSING;
            atomic_fetch_sub(&j->loading, 1);
            atomic_fetch_sub(&j->refs, 1);
        } else {
            atomic_fetch_add(&m->l2_loads, 1);
        }
    }
    rc = 0;
out:
    free(hashes);
    free(keys);
    free(res);
    return rc;
}

/* ---- classification and the result ------------------------------------------ */

static cb_unit *unit_of(cb_job *j, const uint8_t *hash)
{
    for (size_t u = 0; u < j->n_units; u++)
        if (memcmp(j->units[u].hash, hash, LMC_BLEND_HASH_BYTES) == 0)
            return &j->units[u];
    return NULL;
}

/* Strikes the stale candidates, resets the found ones. */
static void classify(cb_mod *m, cb_job *j, const lmc_blend_ns *ns, uint64_t prefix)
{
    size_t stale = 0;
    for (size_t i = 0; i < j->n_cands; i++) {
        if (j->cands[i].cur_st < prefix)
            continue;
        cb_unit *u = unit_of(j, j->cands[i].hash);
        if (u && u->state == U_FOUND) {
            lmc_blend_matcher_found(m->matcher, ns, j->cands[i].hash);
        } else {
            stale++;
            if (lmc_blend_matcher_stale(m->matcher, ns, j->cands[i].hash))
                atomic_fetch_add(&m->matches_removed, 1);
        }
    }
    atomic_fetch_add(&m->matches_stale, stale);
}

/* Moves the found units' locks to a new stash on the session (replacing,
 * and releasing, an earlier lookup's).  False when no session could hold
 * them (they were given back). */
static bool stash_found(cb_mod *m, cb_job *j)
{
    size_t found = 0;
    for (size_t u = 0; u < j->n_units; u++)
        found += j->units[u].state == U_FOUND;
    lmc_session *se = lmc_sessions_acquire(m->ctx->sessions, j->rid, j->rid_len, true);
    cb_stash *s = se && found ? lmc_blend_serve_stash_new(m->ctx->storage, j->ranks, found) : NULL;
    lmc_session_ext *old = NULL;
    if (se) {
        old = se->ext;
        se->ext = s ? &s->ext : NULL;
    }
    for (size_t u = 0; s && u < j->n_units; u++) {
        cb_unit *x = &j->units[u];
        if (x->state != U_FOUND)
            continue;
        cb_stash_entry *e = &s->e[s->n++];
        memcpy(e->hash, x->hash, LMC_BLEND_HASH_BYTES);
        e->keys = x->keys;
        e->leases = x->leases;
        x->keys = NULL;
        x->leases = NULL;
    }
    if (se)
        lmc_sessions_release(m->ctx->sessions, se);
    if (old)
        old->release(old);
    return s != NULL || found == 0;
}

static bool overlaps(uint64_t a, uint64_t b, uint32_t cs)
{
    return a < b + cs && b < a + cs;
}

static lmc_blend_match wire_match(uint64_t old_st, uint64_t cur_st, const uint8_t *hash,
                                  uint32_t cs)
{
    lmc_blend_match w = {.old_st = old_st, .old_ed = old_st + cs, .cur_st = cur_st,
                         .cur_ed = cur_st + cs};
    memcpy(w.hash, hash, LMC_BLEND_HASH_BYTES);
    return w;
}

/* Packs CBUnifiedLookupResult: the tail first claims its positions, then
 * found candidates are kept greedily left to right where they overlap
 * neither a kept one nor the tail (docs/cacheblend.md). */
static int reply_result(cb_mod *m, cb_job *j, lmc_rpc_call *call, bool stashed)
{
    uint32_t cs = m->cs;
    uint64_t prefix = (uint64_t)j->leading * cs;
    lmc_blend_match *tail = calloc(j->n_units + 1, sizeof *tail);
    lmc_blend_match *kept = calloc(j->n_cands + 1, sizeof *kept);
    size_t n_tail = 0, n_kept = 0;
    if (!tail || !kept) {
        free(tail);
        free(kept);
        return -1;
    }
    /* Tail units were added in chunk order, after the leading run and the gap. */
    size_t c = (size_t)j->leading + 1;
    for (size_t u = 0; stashed && u < j->n_units; u++) {
        if (!j->units[u].tail)
            continue;
        uint64_t at = (uint64_t)c++ * cs;
        if (j->units[u].state == U_FOUND)
            tail[n_tail++] = wire_match(at, at, j->units[u].hash, cs);
    }
    uint64_t end = prefix;
    for (size_t i = 0; stashed && i < j->n_cands; i++) {
        const lmc_blend_candidate *x = &j->cands[i];
        cb_unit *u = unit_of(j, x->hash);
        if (x->cur_st < end || !u || u->state != U_FOUND)
            continue;
        bool clash = false;
        for (size_t t = 0; !clash && t < n_tail; t++)
            clash = overlaps(x->cur_st, tail[t].cur_st, cs);
        if (clash)
            continue;
        kept[n_kept++] = wire_match(x->old_st, x->cur_st, x->hash, cs);
        end = x->cur_st + cs;
    }
    int rc = lmc_blend_encode_lookup_result(lmc_rpc_call_reply(call), prefix, kept, n_kept, tail,
                                            n_tail);
    atomic_fetch_add(&m->matches_found, n_kept);
    atomic_fetch_add(&m->segmented_chunks, n_tail);
    atomic_fetch_add(&m->prefix_tokens, prefix);
    free(tail);
    free(kept);
    return rc;
}

/* ---- the handler ---------------------------------------------------------------- */

/* Polls the coordinator's answer; false while it is pending.  Its matches
 * become the candidates (one per chunk hash, ascending cur_st). */
static bool fleet_ready(cb_mod *m, cb_job *j)
{
    if (!j->asked_fleet)
        return true;
    lmc_blend_coord_match *got = NULL;
    size_t n = 0;
    lmc_blend_coord_state st = lmc_blend_coord_poll(m->coord, j->rid, &got, &n);
    if (st == LMC_BLEND_COORD_PENDING)
        return false;
    lmc_blend_coord_take(m->coord, j->rid);
    j->asked_fleet = false;
    j->cands = n ? calloc(n, sizeof *j->cands) : NULL;
    j->n_cands = 0;
    for (size_t i = 0; j->cands && i < n; i++) {
        if (got[i].hash_len != LMC_BLEND_HASH_BYTES)
            continue;
        lmc_blend_candidate *c = &j->cands[j->n_cands++];
        c->old_st = got[i].old_st;
        c->cur_st = got[i].cur_st;
        memcpy(c->hash, got[i].hash, LMC_BLEND_HASH_BYTES);
    }
    atomic_fetch_add(&m->coordinator_matches, j->n_cands);
    free(got);
    return true;
}

/* Polls the prefix leg; false while it runs. */
static bool prefix_ready(cb_mod *m, cb_job *j)
{
    if (j->prefix_done)
        return true;
    int64_t hits = 0;
    lmc_job_status st = lmc_lookup_prefix_poll(m->ctx->lookup, j->rid, j->rid_len, &hits);
    if (st == LMC_JOB_RUNNING)
        return false;
    j->leading = st == LMC_JOB_DONE ? hits : 0;
    j->prefix_done = true;
    return true;
}

/* The chained hashes of every whole chunk of the prompt, from the
 * session's chain (copied: the session is released). */
static uint8_t *prompt_chain(cb_mod *m, const lmc_ipc_key *k, size_t n_chunks)
{
    uint8_t *out = n_chunks ? malloc(n_chunks * LMC_BLEND_HASH_BYTES) : NULL;
    if (out && lmc_sessions_hash_range(m->ctx->sessions, k->request_id, k->request_id_len,
                                       k->tokens, k->n_tokens, 0, n_chunks * m->cs, out) !=
                   LMC_HASH_OK) {
        free(out);
        out = NULL;
    }
    return out;
}

/* Advances j as far as it can: 1 result packed, 0 not ready, -1 failed. */
static int advance(cb_mod *m, cb_job *j, const lmc_ipc_key *k, lmc_rpc_call *call)
{
    lmc_layout layout;
    bool have_layout = lmc_layout_registry_get(m->ctx->layouts, k->model_name, k->model_len,
                                               k->world_size, &layout);
    if (!prefix_ready(m, j) || !fleet_ready(m, j))
        return 0;
    if (!j->sparse_started) {
        j->sparse_started = true;
        size_t n_chunks = k->n_tokens / m->cs;
        uint8_t *chain = m->segmented && have_layout ? prompt_chain(m, k, n_chunks) : NULL;
        int rc = plan_units(m, j, chain, n_chunks);
        free(chain);
        if (rc != 0)
            return -1;
        if (have_layout && j->n_units && start_sparse(m, j, k, &layout) != 0)
            return -1;
    }
    if (atomic_load(&j->loading) > 0)
        return 0;
    uint64_t prefix = (uint64_t)j->leading * m->cs;
    cb_key_ns kn;
    if (have_layout && lmc_blend_serve_key_ns_init(&kn, k)) {
        lmc_blend_ns ns = {kn.model, kn.salt, k->world_size};
        classify(m, j, &ns, prefix);
    }
    bool stashed = stash_found(m, j);
    return reply_result(m, j, call, stashed) == 0 ? 1 : -1;
}

/* CB_UNIFIED_LOOKUP(key, tp_size) -> None until ready, then
 * CBUnifiedLookupResult. */
lmc_handler_result lmc_blend_serve_unified_lookup(void *state, lmc_rpc_call *call)
{
    cb_mod *m = state;
    lmc_blend_frame f[2];
    size_t n = lmc_blend_serve_frames(call, f, 2);
    lmc_blend_unified_lookup q;
    char err[256];
    int rc = lmc_blend_decode_unified_lookup(f, n, m->cs, &q, err, sizeof err);
    if (rc != 0)
        return lmc_rpc_call_fail(call, rc == -2 ? "MemoryError" : "ValidationError",
                                 "CB_UNIFIED_LOOKUP: %s", err);
    bool fresh, oom;
    cb_job *j = claim(m, &q.key, &fresh, &oom);
    if (!j) {
        lmc_blend_unified_lookup_free(&q);
        return oom ? lmc_rpc_call_fail(call, "MemoryError", "CB_UNIFIED_LOOKUP: out of memory")
                   : LMC_HANDLER_VOID;
    }
    if (fresh) {
        atomic_fetch_add(&m->lookups, 1);
        lmc_layout layout;
        bool have = lmc_layout_registry_get(m->ctx->layouts, q.key.model_name, q.key.model_len,
                                            q.key.world_size, &layout);
        rc = begin(m, j, &q.key, have);
    }
    int st = rc == 0 ? advance(m, j, &q.key, call) : -1;
    lmc_blend_unified_lookup_free(&q);
    if (st == 0) {
        unclaim(m, j);
        return LMC_HANDLER_VOID;
    }
    pthread_mutex_lock(&m->lock);
    unlink_locked(m, j);
    pthread_mutex_unlock(&m->lock);
    job_put(j);
    if (st < 0)
        return lmc_rpc_call_fail(call, "MemoryError", "CB_UNIFIED_LOOKUP: out of memory");
    atomic_fetch_add(&m->lookups_done, 1);
    return LMC_HANDLER_REPLY;
}

void lmc_blend_serve_jobs_close(cb_mod *m)
{
    pthread_mutex_lock(&m->lock);
    cb_job *j = m->jobs;
    m->jobs = NULL;
    m->n_jobs = 0;
    pthread_mutex_unlock(&m->lock);
    put_all(j);
}
