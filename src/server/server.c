#include "server/server.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "modules/kv_events.h"
#include "modules/module.h"
#include "modules/blend/serve/blend_serve.h"
#include "modules/p2p/p2p_serve.h"
#include "obs/log.h"
#include "rpc/rpc.h"
#include "fleet/fleet.h"
#include "server/server_internal.h"
#include "storage/l2/l2_service.h"
#include "storage/storage_config.h"
#include "storage/storage_events.h"
#include "storage/storage_manager.h"
#include "storage/storage_trace.h"

#define DRAIN_MS 5000

/* Every module the server knows, in creation order.  A module returns
 * "disabled" from module_enabled() when the configuration leaves it out. */
static const lmc_module_def *const all_modules[] = {
    &lmc_management_module,
    &lmc_kv_events_module,   /* POLL_KV_EVENTS answers "disabled" without a log */
    &lmc_lookup_module,
    &lmc_engine_driven_module,
    &lmc_server_driven_module,
    &lmc_p2p_serve_module,   /* always served, bounded (docs/p2p.md) */
    &lmc_blend_serve_module, /* --engine-type blend, over the server-driven transfer */
};
#define N_MODULES (sizeof all_modules / sizeof all_modules[0])

_Static_assert(N_MODULES <= LMC_SERVER_MAX_MODULES, "raise LMC_SERVER_MAX_MODULES");

/* --supported-transfer-mode picks the transfer modules: engine_driven and
 * auto load the engine-driven one, lmcache_driven and auto the server-driven
 * one; the ops of a module left out have no handler and are dropped, as
 * upstream. */
static bool module_enabled(const lmc_module_def *def, const lmc_config *cfg)
{
    if (def == &lmc_engine_driven_module)
        return strcmp(cfg->mp.supported_transfer_mode, "lmcache_driven") != 0;
    if (def == &lmc_server_driven_module)
        return strcmp(cfg->mp.supported_transfer_mode, "engine_driven") != 0;
    /* blend_legacy's ops have no wire ids (docs/compatibility.md): it
     * serves as the default engine, which main() says at start. */
    if (def == &lmc_blend_serve_module)
        return strcmp(cfg->mp.engine_type, "blend") == 0;
    return true;
}

/* The KV event log hears the storage from its first write; its
 * incarnation is this start's wall-clock time (docs/kv_events.md). */
static int create_kv_events(lmc_server *s, char *err, size_t errlen)
{
    if (s->cfg->mp.kv_event_log_size <= 0)
        return 0;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    s->ctx.kv_events = lmc_kv_events_new((size_t)s->cfg->mp.kv_event_log_size,
                                         LMC_KV_EVENTS_MAX_BINDINGS,
                                         (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec);
    if (!s->ctx.kv_events || lmc_kv_events_attach(s->ctx.kv_events, s->ctx.storage) != 0) {
        snprintf(err, errlen, "--kv-event-log-size: cannot create the KV event log");
        return -1;
    }
    return 0;
}

static int create_services(lmc_server *s, char *err, size_t errlen)
{
    const lmc_config *cfg = s->cfg;
    s->ctx.config = cfg;
    s->ctx.liveness = lmc_liveness_new();
    if (!s->ctx.liveness) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    if (!cfg->obs.disable_observability) {
        s->ctx.events = lmc_event_bus_new((size_t)cfg->obs.event_bus_queue_size);
        if (!s->ctx.events) {
            snprintf(err, errlen, "cannot start the event bus");
            return -1;
        }
    }
    /* sha256_cbor seeds its chain like vLLM: from PYTHONHASHSEED when set. */
    lmc_token_hasher *hasher;
    if (lmc_token_hasher_new(cfg->mp.hash_algorithm, (uint32_t)cfg->mp.chunk_size,
                             getenv("PYTHONHASHSEED"), &hasher, err, errlen) != 0)
        return -1;
    s->ctx.hasher = hasher;
    if (lmc_token_hasher_enable_memo(hasher, (size_t)cfg->mp.hash_memo_mb << 20) != 0)
        LMC_WARN("hash memo of %d MiB unavailable: hashing without it", cfg->mp.hash_memo_mb);
    s->ctx.interner = lmc_key_interner_new_bounded((size_t)cfg->mp.max_interned_strings);
    if (!s->ctx.interner) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    s->ctx.layouts = lmc_layout_registry_new();
    /* Abandoned sessions go after twice the read TTL: their locks are gone. */
    lmc_sessions_options so = {.max_sessions = 65536,
                               .max_idle_ms = 2000LL * cfg->storage.l1_read_ttl_seconds,
                               .hasher = hasher};
    s->ctx.sessions = lmc_sessions_new(&so);
    if (!s->ctx.layouts || !s->ctx.sessions) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    lmc_storage_options storage_opts;
    if (lmc_storage_options_from_config(cfg, &storage_opts, err, errlen) != 0)
        return -1;
    s->ctx.storage = lmc_storage_manager_create(&storage_opts, err, errlen);
    if (!s->ctx.storage)
        return -1;
    if (s->ctx.events)
        lmc_storage_manager_set_event_bus(s->ctx.storage, s->ctx.events,
                                          cfg->obs.metrics_sample_rate);
    if (create_kv_events(s, err, errlen) != 0 || lmc_server_start_trace(s, err, errlen) != 0 ||
        lmc_server_start_trace_replay(s, err, errlen) != 0)
        return -1;
    /* The storage manager owns the L2 tier from here (closed with it). */
    return lmc_l2_attach(s->ctx.storage, cfg, err, errlen);
}

static int create_modules(lmc_server *s, char *err, size_t errlen)
{
    if (strcmp(s->cfg->mp.engine_type, "blend_legacy") == 0)
        LMC_WARN("--engine-type blend_legacy: the legacy CacheBlend ops have no wire ids, so no "
                 "current client can reach them; serving as --engine-type default (prefix "
                 "caching only; docs/cacheblend.md, \"blend_legacy\")");
    for (size_t i = 0; i < N_MODULES; i++) {
        const lmc_module_def *def = all_modules[i];
        if (!module_enabled(def, s->cfg))
            continue;
        module_instance *mi = &s->modules[s->n_modules];
        if (def->create(&s->ctx, &mi->state, err, errlen) != 0)
            return -1;
        mi->def = def;
        s->n_modules++;
        for (size_t h = 0; h < def->n_handlers; h++) {
            if (lmc_rpc_server_register(s->rpc, &def->handlers[h], mi->state) != 0) {
                snprintf(err, errlen, "module %s: op %d registered twice", def->name,
                         def->handlers[h].op_id);
                return -1;
            }
        }
        LMC_DEBUG("module %s loaded (%zu handlers)", def->name, def->n_handlers);
    }
    return 0;
}

void *lmc_server_module_state(const lmc_server *s, const lmc_module_def *def)
{
    for (size_t i = 0; i < s->n_modules; i++)
        if (s->modules[i].def == def)
            return s->modules[i].state;
    return NULL;
}

void lmc_server_add_module_routes(lmc_server *s)
{
    for (size_t i = 0; i < N_MODULES; i++) {
        const lmc_module_def *def = all_modules[i];
        if (def->register_http && def->register_http(lmc_server_module_state(s, def), s->routes) != 0)
            LMC_WARN("module %s: HTTP routes not added (the route table is full)", def->name);
    }
}

int lmc_server_add_module_metrics(lmc_server *s)
{
    for (size_t i = 0; i < N_MODULES; i++) {
        const lmc_module_def *def = all_modules[i];
        if (def->register_metrics && def->register_metrics(lmc_server_module_state(s, def), s->metrics) != 0)
            return -1;
    }
    return 0;
}

/* ZMQ's bind accepts interface names and numeric addresses only, while
 * upstream's default host is "localhost": resolve names here. */
static int resolve_bind_url(const char *host, int port, char *url, size_t cap, char *err,
                            size_t errlen)
{
    unsigned char probe[sizeof(struct in6_addr)];
    if (strcmp(host, "*") == 0 || inet_pton(AF_INET, host, probe) == 1) {
        snprintf(url, cap, "tcp://%s:%d", host, port);
        return 0;
    }
    if (inet_pton(AF_INET6, host, probe) == 1) {
        snprintf(url, cap, "tcp://[%s]:%d", host, port);
        return 0;
    }
    struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *res = NULL;
    int rc = getaddrinfo(host, NULL, &hints, &res);
    if (rc != 0 || !res) {
        snprintf(err, errlen, "--host: cannot resolve '%s': %s", host, gai_strerror(rc));
        return -1;
    }
    char ip[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, &((struct sockaddr_in *)res->ai_addr)->sin_addr, ip, sizeof ip);
    freeaddrinfo(res);
    snprintf(url, cap, "tcp://%s:%d", ip, port);
    return 0;
}

int lmc_server_new(const lmc_config *cfg, lmc_server **out, char *err, size_t errlen)
{
    lmc_server *s = calloc(1, sizeof *s);
    if (!s) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    s->cfg = cfg;
    char url[512];
    if (lmc_server_check_p2p(cfg, err, errlen) != 0 ||
        resolve_bind_url(cfg->mp.host, cfg->mp.port, url, sizeof url, err, errlen) != 0) {
        free(s);
        return -1;
    }
    lmc_rpc_options ro = {
        .bind_url = url,
        .normal_workers = cfg->mp.max_cpu_workers,
        .affinity_workers = cfg->mp.max_gpu_workers,
        .error_frames = cfg->mp.rpc_error_frames,
        .max_queued = (size_t)cfg->mp.max_queued_requests,
    };
    /* Bind first: a busy port fails before any memory is committed. */
    if (lmc_rpc_server_new(&ro, &s->rpc, err, errlen) != 0 ||
        lmc_server_start_frontends(s, err, errlen) != 0 ||
        create_services(s, err, errlen) != 0 || create_modules(s, err, errlen) != 0 ||
        lmc_server_start_p2p(s, err, errlen) != 0) {
        lmc_server_free(s);
        return -1;
    }
    lmc_server_frontends_ready(s);
    LMC_INFO("lmcached listening on %s (chunk size %d, hash %s, %d cpu / %d gpu workers)", url,
             cfg->mp.chunk_size, cfg->mp.hash_algorithm, cfg->mp.max_cpu_workers,
             cfg->mp.max_gpu_workers);
    *out = s;
    return 0;
}

int lmc_server_run(lmc_server *s, int stop_fd)
{
    return lmc_rpc_server_run(s->rpc, stop_fd, DRAIN_MS);
}

void lmc_server_stop(lmc_server *s)
{
    lmc_rpc_server_stop(s->rpc);
}

json_t *lmc_server_report_status(lmc_server *s)
{
    const lmc_config *cfg = s->cfg;
    /* HTTP threads may ask while start-up is still creating services and
     * modules; `ready` (release-stored after the last one) orders them. */
    bool up = atomic_load_explicit(&s->ready, memory_order_acquire);
    bool healthy = up;
    json_t *mods = json_object();
    for (size_t i = 0; up && i < s->n_modules; i++) {
        const module_instance *mi = &s->modules[i];
        if (!mi->def->report_status)
            continue;
        json_t *st = mi->def->report_status(mi->state);
        json_t *h = json_object_get(st, "is_healthy");
        if (json_is_false(h))
            healthy = false;
        json_object_set_new(mods, mi->def->name, st);
    }
    json_t *status = json_pack("{s:s, s:i, s:s, s:s, s:o}", "engine_type", cfg->mp.engine_type,
                               "chunk_size", cfg->mp.chunk_size, "hash_algorithm",
                               cfg->mp.hash_algorithm, "instance_id", cfg->mp.instance_id,
                               "modules", mods);
    if (up && s->ctx.storage) {
        json_t *sm = lmc_storage_manager_report_status(s->ctx.storage);
        if (json_is_false(json_object_get(sm, "is_healthy")))
            healthy = false;
        json_object_set_new(status, "storage_manager", sm);
    }
    json_object_set_new(status, "interner",
                        json_pack("{s:I, s:I, s:I, s:I}", "strings",
                                  (json_int_t)lmc_key_interner_count(s->ctx.interner), "max",
                                  (json_int_t)cfg->mp.max_interned_strings, "refused",
                                  (json_int_t)lmc_key_interner_refused(s->ctx.interner),
                                  "evicted",
                                  (json_int_t)lmc_key_interner_evicted(s->ctx.interner)));
    if (s->fleet)
        json_object_set_new(status, "coordinator", lmc_fleet_status(s->fleet));
    json_object_update_new(status, lmc_fleet_p2p_status(s->fleet));
    if (up && s->fleet && json_is_true(json_object_get(status, "p2p_enabled")))
        json_object_set_new(status, "active_p2p_lookup_jobs",
                            json_integer((json_int_t)lmc_l2_p2p_active_lookups(s->ctx.storage)));
    json_object_set_new(status, "trace", lmc_server_trace_status(s));
    json_object_set_new(status, "is_healthy", json_boolean(healthy));
    return status;
}

void lmc_server_free(lmc_server *s)
{
    if (!s)
        return;
    lmc_server_stop_frontends(s); /* no HTTP callback runs after this */
    lmc_server_stop_trace_replay(s);
    if (s->rpc)
        lmc_rpc_server_join_workers(s->rpc);
    lmc_server_stop_p2p(s); /* its may_read reads the p2p_serve module's state */
    for (size_t i = s->n_modules; i-- > 0;)
        s->modules[i].def->close(s->modules[i].state);
    lmc_rpc_server_free(s->rpc);
    /* Before the storage: a session's module state may give leases back
     * (CacheBlend's stash, docs/cacheblend.md). */
    lmc_sessions_free(s->ctx.sessions);
    s->ctx.sessions = NULL;
    if (s->ctx.storage)
        lmc_storage_manager_close(s->ctx.storage);
    lmc_fleet_free(s->fleet); /* its listeners heard the storage until it closed */
    lmc_kv_events_free(s->ctx.kv_events); /* so did the KV event log */
    lmc_storage_trace_close(s->trace);    /* and the trace recorder: flushed here */
    lmc_event_bus_free(s->ctx.events);
    lmc_server_free_metrics(s); /* after the bus: its subscriber points here */
    lmc_layout_registry_free(s->ctx.layouts);
    lmc_token_hasher_free((lmc_token_hasher *)s->ctx.hasher);
    lmc_key_interner_free(s->ctx.interner);
    lmc_liveness_free(s->ctx.liveness);
    free(s);
}
