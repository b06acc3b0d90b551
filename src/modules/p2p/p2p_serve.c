/* The serving side of P2P between cache servers (docs/p2p.md, "Serving
 * side"): a peer looks up keys in this server's L1 only, gets the leading
 * run of hits leased to it as {offset, size} in the L1 arena, reads them
 * over the transfer channel and unlocks them.
 *
 * The lookup is synchronous, so its task is complete when its id is
 * answered; the results wait in a bounded table (tasks.h) until queried
 * once or until the lease TTL passes.  The leases are COPY leases taking one read
 * share each: eviction cannot take the objects and a forced clear cannot
 * free their bytes while a peer may be reading them (docs/storage.md,
 * "Leases").  They go back on P2P_UNLOCK_OBJECTS, or after the TTL when
 * the module next runs (any of its ops, /status). */
#include "modules/p2p/p2p_serve.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "modules/p2p/lease_registry.h"
#include "modules/p2p/p2p_wire.h"
#include "modules/p2p/tasks.h"
#include "rpc/wire.h"
#include "storage/storage_manager.h"

typedef lmc_p2p_serve_addr p2p_addr;

typedef struct {
    lmc_module_ctx *ctx;
    lmc_p2p_serve_reg *reg;
    lmc_p2p_serve_tasks *tasks;
    pthread_mutex_t lock;   /* one lookup at a time leases (the registry's room) */
    int64_t result_life_ms; /* an unqueried result's life: min(result bound, lease TTL) */
    atomic_uint_fast64_t lookups, lookup_keys, hits, results, unlocks, expirations, abandoned;
} p2p_mod;

/* ---- leases ------------------------------------------------------------ */

static void give_back_held(p2p_mod *m, lmc_p2p_serve_held *h, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        lmc_storage_manager_give_back(m->ctx->storage, &h[i].key, &h[i].lease, 1);
        lmc_keys_drop(&h[i].key, 1);
    }
}

/* A result dropped unqueried: the peer never learnt where its leases are,
 * so it will not unlock them; they go back now rather than at their TTL
 * (docs/p2p.md, "Bounds"). */
static void give_back_abandoned(void *user, const lmc_p2p_serve_owner *owner,
                                const lmc_p2p_serve_addr *addrs, size_t n)
{
    p2p_mod *m = user;
    for (size_t i = 0; i < n && addrs[i].offset >= 0; i++) {
        lmc_p2p_serve_held h;
        if (lmc_p2p_serve_reg_take_at(m->reg, (uint64_t)addrs[i].offset, owner, &h)) {
            give_back_held(m, &h, 1);
            atomic_fetch_add(&m->abandoned, 1);
        }
    }
}

/* Gives back the leases whose TTL passed, drops the results nobody
 * queried within their life and gives back those results' leases. */
static void sweep(p2p_mod *m)
{
    lmc_p2p_serve_held out[64];
    size_t got;
    while ((got = lmc_p2p_serve_reg_take_expired(m->reg, out, 64)) > 0) {
        give_back_held(m, out, got);
        atomic_fetch_add(&m->expirations, got);
    }
    lmc_p2p_serve_tasks_sweep(m->tasks);
    lmc_p2p_serve_tasks_reap(m->tasks, give_back_abandoned, m);
}

/* ---- decoding ---------------------------------------------------------- */

static void drop_keys(lmc_object_key *keys, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (keys[i].model_name)
            lmc_keys_drop(&keys[i], 1);
    free(keys);
}

/* keys[0..*n) from a list of ObjectKeys; NULL with the reason in err. */
static lmc_object_key *decode_keys(p2p_mod *m, const msgpack_object *o, size_t *n, char *err,
                                   size_t errlen)
{
    if (!o || o->type != MSGPACK_OBJECT_ARRAY || o->via.array.size > LMC_P2P_SERVE_MAX_KEYS) {
        snprintf(err, errlen, "keys must be a list of at most %d ObjectKeys",
                 LMC_P2P_SERVE_MAX_KEYS);
        return NULL;
    }
    size_t count = o->via.array.size;
    lmc_object_key *keys = calloc(count ? count : 1, sizeof *keys);
    if (!keys) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    for (size_t i = 0; i < count; i++) {
        char why[160];
        if (lmc_p2p_serve_decode_key(&o->via.array.ptr[i], m->ctx->interner, &keys[i], why,
                                     sizeof why) != 0) {
            snprintf(err, errlen, "keys[%zu]: %s", i, why);
            drop_keys(keys, i);
            return NULL;
        }
    }
    *n = count;
    return keys;
}

/* ---- P2P_LOOKUP_AND_LOCK ----------------------------------------------- */

/* Whether an object of `size` bytes fits group `group`'s layout (any size
 * when the request named no layouts). */
static bool size_fits(const lmc_p2p_serve_group_size *gs, size_t n_gs, uint32_t group,
                      uint64_t size)
{
    if (n_gs == 0)
        return true;
    for (size_t i = 0; i < n_gs; i++)
        if (gs[i].group == group)
            return gs[i].size == size;
    return false;
}

/* Leases the leading run of keys[0..n) (at most the registry's room) and
 * records it as owner's; fills addrs for all n.  Returns the hits.  Caller
 * locks. */
static size_t lease_prefix(p2p_mod *m, const lmc_object_key *keys, size_t n,
                           const lmc_p2p_serve_group_size *gs, size_t n_gs,
                           const lmc_p2p_serve_owner *owner, p2p_addr *addrs)
{
    size_t k = 0, room = lmc_p2p_serve_reg_room(m->reg);
    while (k < n && k < room && keys[k].model_name)
        k++;   /* a key of a model or salt never stored here cannot be a hit */
    lmc_p2p_serve_held *held = calloc(k ? k : 1, sizeof *held);
    lmc_lease *leases = calloc(k ? k : 1, sizeof *leases);
    size_t hits = 0;
    if (held && leases && k > 0) {
        lmc_storage_manager_lease_copy(m->ctx->storage, keys, k, LMC_COPY_TAKES_SHARE, false,
                                       NULL, leases, NULL);
        while (hits < k && lmc_lease_held(&leases[hits]) &&
               size_fits(gs, n_gs, keys[hits].object_group_id, leases[hits].object_size))
            hits++;
        for (size_t i = 0; i < hits; i++)
            held[i] = (lmc_p2p_serve_held){.key = keys[i], .lease = leases[i], .owner = *owner};
        if (!lmc_p2p_serve_reg_add(m->reg, held, hits))
            hits = 0;
        lmc_storage_manager_give_back(m->ctx->storage, keys + hits, leases + hits, k - hits);
    }
    for (size_t i = 0; i < n; i++)
        addrs[i] = i < hits ? (p2p_addr){(int64_t)leases[i].offset, leases[i].object_size}
                            : (p2p_addr){-1, 0};
    free(held);
    free(leases);
    return hits;
}

/* The requesting connection: its unlock gives back only what it leased,
 * so one peer cannot cut another's read short (docs/p2p.md, "Leases"). */
static void caller_of(lmc_rpc_call *call, lmc_p2p_serve_owner *owner)
{
    size_t len = 0;
    const uint8_t *id = lmc_rpc_call_identity(call, &len);
    lmc_p2p_serve_owner_set(owner, id, id ? len : 0);
}

static lmc_handler_result lookup_and_lock(void *state, lmc_rpc_call *call)
{
    p2p_mod *m = state;
    char err[256];
    lmc_p2p_serve_group_size gs[LMC_P2P_SERVE_MAX_GROUPS];
    size_t n = 0, n_gs = 0;
    const msgpack_object *layouts = lmc_rpc_call_arg(call, 1);
    if (lmc_rpc_call_nargs(call) >= 2 && !layouts)
        return lmc_rpc_call_fail(call, "DecodeError", "P2P_LOOKUP_AND_LOCK: undecodable frame");
    if (lmc_p2p_serve_decode_layouts(layouts, gs, LMC_P2P_SERVE_MAX_GROUPS, &n_gs, err,
                                     sizeof err) != 0)
        return lmc_rpc_call_fail(call, "ValidationError", "P2P_LOOKUP_AND_LOCK: %s", err);
    lmc_object_key *keys = decode_keys(m, lmc_rpc_call_arg(call, 0), &n, err, sizeof err);
    if (!keys)
        return lmc_rpc_call_fail(call, "ValidationError", "P2P_LOOKUP_AND_LOCK: %s", err);
    sweep(m);
    p2p_addr *addrs = calloc(n ? n : 1, sizeof *addrs);
    if (!addrs) {
        drop_keys(keys, n);
        return lmc_rpc_call_fail(call, "MemoryError", "P2P_LOOKUP_AND_LOCK: out of memory");
    }
    lmc_p2p_serve_owner owner;
    caller_of(call, &owner);
    pthread_mutex_lock(&m->lock);
    size_t hits = lease_prefix(m, keys, n, gs, n_gs, &owner, addrs);
    pthread_mutex_unlock(&m->lock);
    drop_keys(keys, n);
    /* n <= LMC_P2P_SERVE_MAX_KEYS, under the table's bound: 0 only when out
     * of memory, and the peer then unlocks what it never learnt of by TTL. */
    uint64_t id = lmc_p2p_serve_tasks_add(m->tasks, &owner, addrs, n);
    lmc_p2p_serve_tasks_reap(m->tasks, give_back_abandoned, m);   /* any dropped for room */
    if (!id)
        return lmc_rpc_call_fail(call, "MemoryError", "P2P_LOOKUP_AND_LOCK: out of memory");
    atomic_fetch_add(&m->lookups, 1);
    atomic_fetch_add(&m->lookup_keys, n);
    atomic_fetch_add(&m->hits, hits);
    msgpack_pack_uint64(lmc_rpc_call_reply(call), id);
    return LMC_HANDLER_REPLY;
}

/* ---- P2P_QUERY_LOOKUP_RESULTS ------------------------------------------ */

static void pack_addrs(msgpack_packer *pk, const p2p_addr *addrs, size_t n)
{
    msgpack_pack_array(pk, (uint32_t)n);
    for (size_t i = 0; i < n; i++) {
        msgpack_pack_map(pk, 2);
        lmc_mp_pack_cstr(pk, "offset");
        msgpack_pack_int64(pk, addrs[i].offset);
        lmc_mp_pack_cstr(pk, "size");
        msgpack_pack_uint64(pk, addrs[i].size);
    }
}

static lmc_handler_result query_results(void *state, lmc_rpc_call *call)
{
    p2p_mod *m = state;
    const msgpack_object *a = lmc_rpc_call_arg(call, 0);
    int64_t id;
    uint64_t big;
    if (!a || a->type == MSGPACK_OBJECT_BOOLEAN)
        return lmc_rpc_call_fail(call, "ValidationError",
                                 "P2P_QUERY_LOOKUP_RESULTS: task_id must be an int");
    if (!lmc_mp_get_int(a, &id)) {
        if (!lmc_mp_get_uint(a, &big))
            return lmc_rpc_call_fail(call, "ValidationError",
                                     "P2P_QUERY_LOOKUP_RESULTS: task_id must be an int");
        id = -1;   /* over 2^63: no task of ours */
    }
    sweep(m);
    p2p_addr *addrs;
    size_t n;
    if (id <= 0 || !lmc_p2p_serve_tasks_take(m->tasks, (uint64_t)id, &addrs, &n))
        return LMC_HANDLER_VOID;   /* pending, unknown, consumed or lapsed: None */
    pack_addrs(lmc_rpc_call_reply(call), addrs, n);
    free(addrs);
    atomic_fetch_add(&m->results, 1);
    return LMC_HANDLER_REPLY;
}

/* ---- P2P_UNLOCK_OBJECTS ------------------------------------------------ */

static lmc_handler_result unlock_objects(void *state, lmc_rpc_call *call)
{
    p2p_mod *m = state;
    char err[256];
    size_t n = 0;
    lmc_object_key *keys = decode_keys(m, lmc_rpc_call_arg(call, 0), &n, err, sizeof err);
    if (!keys)
        return lmc_rpc_call_fail(call, "ValidationError", "P2P_UNLOCK_OBJECTS: %s", err);
    sweep(m);   /* a lease that lapsed counts as expired, not unlocked */
    lmc_p2p_serve_owner owner;
    caller_of(call, &owner);
    size_t released = 0;
    for (size_t i = 0; i < n; i++) {
        lmc_p2p_serve_held h;
        if (keys[i].model_name && lmc_p2p_serve_reg_take(m->reg, &keys[i], &owner, &h)) {
            give_back_held(m, &h, 1);
            released++;
        }
    }
    drop_keys(keys, n);
    atomic_fetch_add(&m->unlocks, released);
    return LMC_HANDLER_VOID;
}

/* ---- the transfer channel's check -------------------------------------- */

bool lmc_p2p_serve_may_read(void *user, const uint8_t *holder, size_t holder_len,
                            uint64_t offset, uint64_t len)
{
    p2p_mod *m = user;
    if (!m)
        return false;
    if (!holder)
        return lmc_p2p_serve_reg_covers(m->reg, offset, len);
    lmc_p2p_serve_owner owner;
    lmc_p2p_serve_owner_set(&owner, holder, holder_len);
    return lmc_p2p_serve_reg_covers_for(m->reg, &owner, offset, len);
}

/* ---- module ------------------------------------------------------------ */

static const lmc_rpc_handler_spec p2p_handlers[] = {
    {LMC_OP_P2P_LOOKUP_AND_LOCK, NULL, LMC_POOL_NORMAL, lookup_and_lock, false, NULL, NULL, false},
    {LMC_OP_P2P_QUERY_LOOKUP_RESULTS, NULL, LMC_POOL_NORMAL, query_results, false, NULL, NULL,
     false},
    {LMC_OP_P2P_UNLOCK_OBJECTS, NULL, LMC_POOL_NORMAL, unlock_objects, .releases = true},
};

static int p2p_create(lmc_module_ctx *ctx, void **state, char *err, size_t errlen)
{
    /* A requester queries its result at once (it polls until its lookup
     * timeout); one left longer is abandoned and its leases go back
     * (docs/p2p.md, "Bounds").  Never longer than the leases themselves. */
    int ttl = ctx->config->storage.l1_read_ttl_seconds;
    int64_t lease_ms = 1000LL * (ttl > 0 ? ttl : 1);
    int64_t life_ms = lease_ms < LMC_P2P_SERVE_RESULT_LIFE_MS ? lease_ms
                                                              : LMC_P2P_SERVE_RESULT_LIFE_MS;
    p2p_mod *m = calloc(1, sizeof *m);
    if (m) {
        m->result_life_ms = life_ms;
        m->reg = lmc_p2p_serve_reg_new(LMC_P2P_SERVE_MAX_LEASES, NULL, NULL);
        m->tasks = lmc_p2p_serve_tasks_new(LMC_P2P_SERVE_MAX_TASKS, LMC_P2P_SERVE_MAX_RESULTS,
                                           life_ms, NULL, NULL);
    }
    if (!m || !m->reg || !m->tasks) {
        if (m) {
            lmc_p2p_serve_reg_free(m->reg);
            lmc_p2p_serve_tasks_free(m->tasks);
        }
        free(m);
        snprintf(err, errlen, "p2p_serve: out of memory");
        return -1;
    }
    m->ctx = ctx;
    pthread_mutex_init(&m->lock, NULL);
    *state = m;
    return 0;
}

static json_t *p2p_status(void *state)
{
    p2p_mod *m = state;
    sweep(m);
    size_t leases;
    uint64_t bytes;
    lmc_p2p_serve_task_counts tc;
    lmc_p2p_serve_reg_counts(m->reg, &leases, &bytes);
    lmc_p2p_serve_tasks_counts(m->tasks, &tc);
    return json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, "
                     "s:I, s:I}",
                     "leases_held", (json_int_t)leases, "leased_bytes", (json_int_t)bytes,
                     "tasks_pending", (json_int_t)tc.pending,
                     "lookups", (json_int_t)atomic_load(&m->lookups),
                     "lookup_keys", (json_int_t)atomic_load(&m->lookup_keys),
                     "hits", (json_int_t)atomic_load(&m->hits),
                     "results_handed_out", (json_int_t)atomic_load(&m->results),
                     "unlocks", (json_int_t)atomic_load(&m->unlocks),
                     "lease_expirations", (json_int_t)atomic_load(&m->expirations),
                     "tasks_expired", (json_int_t)tc.expired,
                     "tasks_dropped", (json_int_t)tc.dropped,
                     "abandoned_leases_returned", (json_int_t)atomic_load(&m->abandoned),
                     "result_life_ms", (json_int_t)m->result_life_ms,
                     "max_leases", (json_int_t)LMC_P2P_SERVE_MAX_LEASES,
                     "max_tasks", (json_int_t)LMC_P2P_SERVE_MAX_TASKS,
                     "max_result_addresses", (json_int_t)LMC_P2P_SERVE_MAX_RESULTS,
                     "max_keys_per_request", (json_int_t)LMC_P2P_SERVE_MAX_KEYS);
}

static void p2p_close(void *state)
{
    p2p_mod *m = state;
    lmc_p2p_serve_held out[64];
    size_t got;
    while ((got = lmc_p2p_serve_reg_take_all(m->reg, out, 64)) > 0)
        give_back_held(m, out, got);
    lmc_p2p_serve_reg_free(m->reg);
    lmc_p2p_serve_tasks_free(m->tasks);
    pthread_mutex_destroy(&m->lock);
    free(m);
}

/* ---- metrics (docs/metrics.md, "P2P serving side") --------------------- */

enum { M_LOOKUPS, M_HITS, M_RESULTS, M_UNLOCKS, M_EXPIRED, M_DROPPED, M_LEASES, M_TASKS, N_M };

static const struct {
    const char *name, *help;
    bool gauge;
} p2p_metric_specs[N_M] = {
    [M_LOOKUPS] = {"lmcache_mp_p2p_serve_lookups_total", "P2P_LOOKUP_AND_LOCK requests answered",
                   false},
    [M_HITS] = {"lmcache_mp_p2p_serve_leased_objects_total",
                "L1 objects leased to peers by P2P_LOOKUP_AND_LOCK", false},
    [M_RESULTS] = {"lmcache_mp_p2p_serve_results_total",
                   "Lookup results handed out by P2P_QUERY_LOOKUP_RESULTS", false},
    [M_UNLOCKS] = {"lmcache_mp_p2p_serve_unlocked_objects_total",
                   "Leases given back by P2P_UNLOCK_OBJECTS", false},
    [M_EXPIRED] = {"lmcache_mp_p2p_serve_expired_leases_total",
                   "Leases given back because their TTL passed before an unlock", false},
    [M_DROPPED] = {"lmcache_mp_p2p_serve_dropped_tasks_total",
                   "Lookup results dropped unqueried (TTL passed, or the table was full)", false},
    [M_LEASES] = {"lmcache_mp_p2p_serve_leases", "L1 objects leased to peers now", true},
    [M_TASKS] = {"lmcache_mp_p2p_serve_pending_tasks", "Lookup results waiting to be queried",
                 true},
};

typedef struct {
    p2p_mod *m;
    lmc_metric *family[N_M];
} p2p_metrics;

static void p2p_collect(lmc_metrics *r, void *user)
{
    (void)r;
    p2p_metrics *pm = user;
    p2p_mod *m = pm->m;
    size_t leases;
    uint64_t bytes;
    lmc_p2p_serve_task_counts tc;
    lmc_p2p_serve_reg_counts(m->reg, &leases, &bytes);
    lmc_p2p_serve_tasks_counts(m->tasks, &tc);
    const double values[N_M] = {
        [M_LOOKUPS] = (double)atomic_load(&m->lookups),
        [M_HITS] = (double)atomic_load(&m->hits),
        [M_RESULTS] = (double)atomic_load(&m->results),
        [M_UNLOCKS] = (double)atomic_load(&m->unlocks),
        [M_EXPIRED] = (double)atomic_load(&m->expirations),
        [M_DROPPED] = (double)(tc.expired + tc.dropped),
        [M_LEASES] = (double)leases,
        [M_TASKS] = (double)tc.pending,
    };
    for (size_t i = 0; i < N_M; i++)
        lmc_metric_set(pm->family[i], NULL, values[i]);
}

static int p2p_register_metrics(void *state, lmc_metrics *r)
{
    p2p_metrics *pm = calloc(1, sizeof *pm);
    if (!pm)
        return -1;
    pm->m = state;
    for (size_t i = 0; i < N_M; i++) {
        pm->family[i] = p2p_metric_specs[i].gauge
                            ? lmc_metrics_gauge(r, p2p_metric_specs[i].name,
                                                p2p_metric_specs[i].help, NULL)
                            : lmc_metrics_counter(r, p2p_metric_specs[i].name,
                                                  p2p_metric_specs[i].help, NULL);
        if (!pm->family[i]) {
            free(pm);
            return -1;
        }
    }
    if (!state) {
        free(pm);
        return 0;
    }
    return lmc_metrics_add_owned_collector(r, p2p_collect, pm);
}

const lmc_module_def lmc_p2p_serve_module = {
    .name = "p2p_serve",
    .create = p2p_create,
    .handlers = p2p_handlers,
    .n_handlers = sizeof p2p_handlers / sizeof p2p_handlers[0],
    .report_status = p2p_status,
    .register_metrics = p2p_register_metrics,
    .close = p2p_close,
};
