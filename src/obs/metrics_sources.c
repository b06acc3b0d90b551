/* Collectors that feed the registry at scrape time: the process (/proc),
 * the event bus, the RPC core and the server status. */
#include <dirent.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/time.h>
#include <unistd.h>

#include "obs/metrics.h"
#include "obs/metrics_internal.h"

/* ---- process ------------------------------------------------------------ */

typedef struct {
    lmc_metric *cpu, *rss, *vsize, *open_fds, *max_fds, *start_time;
} process_metrics;

typedef struct {
    double utime_ticks, stime_ticks, start_ticks, vsize, rss_pages;
    bool ok;
} proc_stat;

/* Fields after the ")" that ends the command name: field 3 is the state,
 * 14/15 utime/stime, 22 starttime, 23 vsize, 24 rss (proc(5)). */
static proc_stat read_proc_stat(void)
{
    proc_stat ps = {0};
    char buf[2048];
    FILE *f = fopen("/proc/self/stat", "r");
    if (!f)
        return ps;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    char *p = strrchr(buf, ')');
    if (!p)
        return ps;
    p++;
    for (int field = 3; field <= 24 && *p; field++) {
        char *end;
        while (*p == ' ')
            p++;
        double v = strtod(p, &end);
        switch (field) {
        case 14: ps.utime_ticks = v; break;
        case 15: ps.stime_ticks = v; break;
        case 22: ps.start_ticks = v; break;
        case 23: ps.vsize = v; break;
        case 24: ps.rss_pages = v; ps.ok = true; break;
        default: break;
        }
        p = strchr(end, ' ');
        if (!p)
            break;
    }
    return ps;
}

static double boot_time_seconds(void)
{
    FILE *f = fopen("/proc/stat", "r");
    char line[256];
    double btime = 0;
    while (f && fgets(line, sizeof line, f)) {
        if (sscanf(line, "btime %lf", &btime) == 1)
            break;
    }
    if (f)
        fclose(f);
    return btime;
}

static double count_open_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    if (!d)
        return -1;
    double n = 0;
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] != '.')
            n++;
    }
    closedir(d);
    return n - 1; /* the directory stream's own descriptor */
}

static void collect_process(lmc_metrics *r, void *user)
{
    (void)r;
    process_metrics *pm = user;
    proc_stat ps = read_proc_stat();
    double tick = (double)sysconf(_SC_CLK_TCK);
    if (ps.ok && tick > 0) {
        lmc_metric_set(pm->cpu, NULL, (ps.utime_ticks + ps.stime_ticks) / tick);
        lmc_metric_set(pm->rss, NULL, ps.rss_pages * (double)sysconf(_SC_PAGESIZE));
        lmc_metric_set(pm->vsize, NULL, ps.vsize);
        lmc_metric_set(pm->start_time, NULL, boot_time_seconds() + ps.start_ticks / tick);
    }
    double fds = count_open_fds();
    if (fds >= 0)
        lmc_metric_set(pm->open_fds, NULL, fds);
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0)
        lmc_metric_set(pm->max_fds, NULL, (double)rl.rlim_cur);
}

int lmc_metrics_add_process_collector(lmc_metrics *r)
{
    process_metrics *pm = calloc(1, sizeof *pm);
    if (!pm)
        return -1;
    pm->cpu = lmc_metrics_counter(r, "process_cpu_seconds_total",
                                  "Total user and system CPU time spent in seconds", NULL);
    pm->rss = lmc_metrics_gauge(r, "process_resident_memory_bytes",
                                "Resident memory size in bytes", NULL);
    pm->vsize = lmc_metrics_gauge(r, "process_virtual_memory_bytes",
                                  "Virtual memory size in bytes", NULL);
    pm->open_fds = lmc_metrics_gauge(r, "process_open_fds", "Number of open file descriptors",
                                     NULL);
    pm->max_fds = lmc_metrics_gauge(r, "process_max_fds",
                                    "Maximum number of open file descriptors", NULL);
    pm->start_time = lmc_metrics_gauge(r, "process_start_time_seconds",
                                       "Start time of the process since unix epoch in seconds",
                                       NULL);
    if (!pm->cpu || !pm->rss || !pm->vsize || !pm->open_fds || !pm->max_fds ||
        !pm->start_time) {
        free(pm);
        return -1;
    }
    return lmc_metrics_add_owned_collector(r, collect_process, pm);
}

/* ---- event bus -------------------------------------------------------- */

typedef struct {
    lmc_event_bus *bus;
    lmc_metric *events, *published, *delivered, *dropped, *queued, *lag;
} bus_metrics;

static void on_event(const lmc_event *ev, void *user)
{
    bus_metrics *bm = user;
    const char *values[] = {ev->type ? ev->type : ""};
    lmc_metric_add(bm->events, values, 1);
}

static void collect_bus(lmc_metrics *r, void *user)
{
    (void)r;
    bus_metrics *bm = user;
    lmc_event_bus_stats st = lmc_event_bus_get_stats(bm->bus);
    lmc_metric_set(bm->published, NULL, (double)st.published);
    lmc_metric_set(bm->delivered, NULL, (double)st.delivered);
    lmc_metric_set(bm->dropped, NULL, (double)st.dropped);
    lmc_metric_set(bm->queued, NULL, (double)st.queued);
    double lag = 0;
    if (st.queued) {
        struct timeval tv;
        gettimeofday(&tv, NULL);
        lag = (double)tv.tv_sec + (double)tv.tv_usec / 1e6 - st.oldest_timestamp;
    }
    lmc_metric_set(bm->lag, NULL, lag > 0 ? lag : 0);
}

static bool register_bus_metrics(lmc_metrics *r, bus_metrics *bm)
{
    static const char *const type_label[] = {"event_type", NULL};
    bm->events = lmc_metrics_counter(r, "lmcache_mp_events_total",
                                     "Events delivered by the event bus, by type", type_label);
    bm->published = lmc_metrics_counter(r, "lmcache_mp_event_bus_published_events_total",
                                        "Events accepted by the event bus", NULL);
    bm->delivered = lmc_metrics_counter(r, "lmcache_mp_event_bus_delivered_events_total",
                                        "Events handed to the subscribers", NULL);
    bm->dropped = lmc_metrics_counter(r, "lmcache_mp_event_bus_dropped_events_total",
                                      "Events dropped because the queue was full", NULL);
    bm->queued = lmc_metrics_gauge(r, "lmcache_mp_event_bus_queue_depth",
                                   "Events waiting in the event bus queue", NULL);
    bm->lag = lmc_metrics_gauge(r, "lmcache_mp_event_bus_drain_lag_seconds",
                                "Age of the oldest queued event (0 when the queue is empty)",
                                NULL);
    return bm->events && bm->published && bm->delivered && bm->dropped && bm->queued &&
           bm->lag;
}

int lmc_metrics_attach_event_bus(lmc_metrics *r, lmc_event_bus *bus)
{
    bus_metrics *bm = calloc(1, sizeof *bm);
    if (!r || !bus || !bm) {
        free(bm);
        return -1;
    }
    bm->bus = bus;
    if (!register_bus_metrics(r, bm)) {
        free(bm);
        return -1;
    }
    /* The registry owns bm from here on, so the subscription (which has no
     * unsubscribe) stays valid until the registry is freed. */
    if (lmc_metrics_add_owned_collector(r, collect_bus, bm) != 0)
        return -1;
    return lmc_event_bus_subscribe(bus, NULL, on_event, bm);
}

/* ---- RPC core --------------------------------------------------------- */

typedef struct {
    lmc_metrics_rpc_fn fn;
    void *user;
    lmc_metric *received, *replied, *dropped, *error_frames, *inlined, *overloaded;
} rpc_metrics;

static void collect_rpc(lmc_metrics *r, void *user)
{
    (void)r;
    rpc_metrics *rm = user;
    lmc_metrics_rpc_counts c = rm->fn(rm->user);
    lmc_metric_set(rm->received, NULL, (double)c.received);
    lmc_metric_set(rm->replied, NULL, (double)c.replied);
    lmc_metric_set(rm->dropped, NULL, (double)c.dropped);
    lmc_metric_set(rm->error_frames, NULL, (double)c.error_frames);
    lmc_metric_set(rm->inlined, NULL, (double)c.inlined);
    lmc_metric_set(rm->overloaded, NULL, (double)c.overloaded);
}

int lmc_metrics_add_rpc_source(lmc_metrics *r, lmc_metrics_rpc_fn fn, void *user)
{
    rpc_metrics *rm = calloc(1, sizeof *rm);
    if (!r || !fn || !rm) {
        free(rm);
        return -1;
    }
    rm->fn = fn;
    rm->user = user;
    rm->received = lmc_metrics_counter(r, "lmcache_mp_rpc_received_total",
                                       "ZMQ messages read off the RPC socket", NULL);
    rm->replied = lmc_metrics_counter(r, "lmcache_mp_rpc_replied_total",
                                      "RPC replies sent", NULL);
    rm->dropped = lmc_metrics_counter(r, "lmcache_mp_rpc_dropped_total",
                                      "RPC requests dropped without a reply", NULL);
    rm->error_frames = lmc_metrics_counter(r, "lmcache_mp_rpc_error_frames_total",
                                           "RPC error frames sent", NULL);
    rm->inlined = lmc_metrics_counter(r, "lmcache_mp_rpc_inline_total",
                                      "Pooled RPC requests run on the socket thread because "
                                      "their pool was idle",
                                      NULL);
    rm->overloaded = lmc_metrics_counter(r, "lmcache_mp_rpc_overloaded_total",
                                         "RPC requests answered at once because their worker "
                                         "queue was full",
                                         NULL);
    if (!rm->received || !rm->replied || !rm->dropped || !rm->error_frames || !rm->inlined ||
        !rm->overloaded) {
        free(rm);
        return -1;
    }
    return lmc_metrics_add_owned_collector(r, collect_rpc, rm);
}

/* ---- server status ---------------------------------------------------- */

typedef struct {
    const char *section; /* object under status.storage_manager; NULL = top level */
    const char *key;
    lmc_metric_type type;
    const char *name, *help;
} status_field;

/* A section naming a module reads status.modules.<name>, others
 * status.storage_manager.<section>. */
#define MODULE_SECTION "modules/"
#define SD MODULE_SECTION "lmcache_driven_transfer"

static const status_field status_fields[] = {
    {NULL, "is_healthy", LMC_METRIC_GAUGE, "lmcache_mp_healthy",
     "1 when every module and the storage report healthy"},
    {"l1_manager", "memory_used_bytes", LMC_METRIC_GAUGE, "lmcache_mp_l1_used_bytes",
     "L1 bytes allocated to objects and staging"},
    {"l1_manager", "memory_total_bytes", LMC_METRIC_GAUGE, "lmcache_mp_l1_committed_bytes",
     "L1 bytes committed to the allocator so far"},
    {"l1_manager", "memory_configured_bytes", LMC_METRIC_GAUGE, "lmcache_mp_l1_capacity_bytes",
     "Configured L1 size in bytes"},
    {"l1_manager", "memory_usage_ratio", LMC_METRIC_GAUGE, "lmcache_mp_l1_memory_usage_ratio",
     "L1 used bytes / committed bytes"},
    {"l1_manager", "num_objects", LMC_METRIC_GAUGE, "lmcache_mp_l1_objects",
     "Objects stored in L1"},
    {"l1_manager", "num_locked_objects", LMC_METRIC_GAUGE, "lmcache_mp_l1_locked_objects",
     "L1 objects currently read-locked"},
    {"l1_manager", "num_staging_objects", LMC_METRIC_GAUGE, "lmcache_mp_l1_staging_objects",
     "L1 objects reserved for writing and not yet committed"},
    {"l1_manager", "retired_bytes", LMC_METRIC_GAUGE, "lmcache_mp_l1_retired_bytes",
     "L1 bytes of deleted objects kept until the copies in flight end"},
    {"l1_manager", "invariant_violations", LMC_METRIC_COUNTER,
     "lmcache_mp_l1_invariant_violations_total",
     "Broken rules found in the L1 manager's books (docs/storage.md, Invariants)"},
    {"l1_manager", "events_lost", LMC_METRIC_COUNTER, "lmcache_mp_l1_events_lost_total",
     "L1 listener events a give-back could not allocate"},
    {"l1_manager", "leases.returned_twice", LMC_METRIC_COUNTER,
     "lmcache_mp_l1_lease_returned_twice_total", "L1 leases given back a second time (no-op)"},
    {"l1_manager", "leases.returned_stale", LMC_METRIC_COUNTER,
     "lmcache_mp_l1_lease_returned_stale_total",
     "L1 leases given back after their buffer was gone (forced clear, lapse; no-op)"},
    {"l1_manager", "leases.returned_expired", LMC_METRIC_COUNTER,
     "lmcache_mp_l1_lease_returned_expired_total",
     "L1 leases given back after their lock lapsed"},
    {"l1_manager", "leases.size_mismatches", LMC_METRIC_COUNTER,
     "lmcache_mp_l1_object_size_mismatches_total",
     "L1 reads refused because the object is not of the size its reader's layout expects"},
    {"l1_eviction_controller", "cycles", LMC_METRIC_COUNTER,
     "lmcache_mp_l1_eviction_loop_ticks_total", "L1 eviction loop iterations"},
    {"l1_eviction_controller", "triggered_cycles", LMC_METRIC_COUNTER,
     "lmcache_mp_l1_eviction_loop_triggered_total",
     "L1 eviction loop iterations that ran the eviction policy"},
    {"l1_eviction_controller", "evicted_keys", LMC_METRIC_COUNTER, "lmcache_mp_l1_evicted_total",
     "Keys evicted from L1"},
    {SD, "stores_ok", LMC_METRIC_COUNTER, "lmcache_mp_server_driven_stores_total",
     "Server-driven STOREs answered true"},
    {SD, "stores_failed", LMC_METRIC_COUNTER, "lmcache_mp_server_driven_store_failures_total",
     "Server-driven STOREs answered false"},
    {SD, "retrieves_ok", LMC_METRIC_COUNTER, "lmcache_mp_server_driven_retrieves_total",
     "Server-driven RETRIEVEs answered true"},
    {SD, "retrieves_failed", LMC_METRIC_COUNTER,
     "lmcache_mp_server_driven_retrieve_failures_total", "Server-driven RETRIEVEs answered false"},
    {SD, "bytes_stored", LMC_METRIC_COUNTER, "lmcache_mp_server_driven_stored_bytes_total",
     "Bytes server-driven STOREs copied into L1"},
    {SD, "bytes_retrieved", LMC_METRIC_COUNTER, "lmcache_mp_server_driven_retrieved_bytes_total",
     "Bytes server-driven RETRIEVEs copied into engine blocks"},
    {SD, "store_seconds", LMC_METRIC_COUNTER, "lmcache_mp_server_driven_store_seconds_total",
     "Seconds spent in server-driven STOREs"},
    {SD, "retrieve_seconds", LMC_METRIC_COUNTER,
     "lmcache_mp_server_driven_retrieve_seconds_total", "Seconds spent in server-driven RETRIEVEs"},
};
#define N_STATUS_FIELDS (sizeof status_fields / sizeof status_fields[0])

typedef struct {
    lmc_metrics_status_fn fn;
    void *user;
} status_source;

/* `key` may name one nested object first ("leases.returned_twice"). */
static const json_t *status_value(const json_t *status, const status_field *f)
{
    if (!f->section)
        return json_object_get(status, f->key);
    size_t mod = strlen(MODULE_SECTION);
    const json_t *obj =
        strncmp(f->section, MODULE_SECTION, mod) == 0
            ? json_object_get(json_object_get(status, "modules"), f->section + mod)
            : json_object_get(json_object_get(status, "storage_manager"), f->section);
    const char *dot = strchr(f->key, '.');
    if (!dot)
        return json_object_get(obj, f->key);
    char outer[64];
    snprintf(outer, sizeof outer, "%.*s", (int)(dot - f->key), f->key);
    return json_object_get(json_object_get(obj, outer), dot + 1);
}

/* Registers (or finds) the status families; false on failure. */
static bool status_families(lmc_metrics *r, lmc_metric **out)
{
    static const char *const info_labels[] = {"service_instance_id", NULL};
    for (size_t i = 0; i < N_STATUS_FIELDS; i++) {
        const status_field *f = &status_fields[i];
        out[i] = f->type == LMC_METRIC_COUNTER ? lmc_metrics_counter(r, f->name, f->help, NULL)
                                               : lmc_metrics_gauge(r, f->name, f->help, NULL);
        if (!out[i])
            return false;
    }
    out[N_STATUS_FIELDS] = lmc_metrics_gauge(
        r, "target_info", "Target metadata: the server's --instance-id", info_labels);
    return out[N_STATUS_FIELDS] != NULL;
}

void lmc_metrics_update_from_status(lmc_metrics *r, const json_t *status)
{
    lmc_metric *m[N_STATUS_FIELDS + 1];
    if (!json_is_object(status) || !status_families(r, m))
        return;
    for (size_t i = 0; i < N_STATUS_FIELDS; i++) {
        const json_t *v = status_value(status, &status_fields[i]);
        if (json_is_number(v))
            lmc_metric_set(m[i], NULL, json_number_value(v));
        else if (json_is_boolean(v))
            lmc_metric_set(m[i], NULL, json_is_true(v) ? 1 : 0);
    }
    const char *id = json_string_value(json_object_get(status, "instance_id"));
    if (id) {
        const char *values[] = {id};
        lmc_metric_set(m[N_STATUS_FIELDS], values, 1);
    }
}

/* Per L2 adapter (label l2_name = its type, as upstream): the
 * l2_store_completed / l2_load_completed counters and usage gauges of
 * docs/metrics.md, "Exported now", read from storage_manager.l2_adapters[]. */
static void update_l2_from_status(lmc_metrics *r, const json_t *status)
{
    static const char *const labels[] = {"l2_name", NULL};
    lmc_metric *stores = lmc_metrics_counter(r, "lmcache_mp_l2_store_completed_total",
                                             "L2 store requests completed", labels);
    lmc_metric *loads = lmc_metrics_counter(r, "lmcache_mp_l2_load_completed_total",
                                            "L2 load tasks completed", labels);
    lmc_metric *used = lmc_metrics_gauge(r, "lmcache_mp_l2_used_bytes",
                                         "Bytes held by an L2 adapter", labels);
    lmc_metric *cap = lmc_metrics_gauge(r, "lmcache_mp_l2_capacity_bytes",
                                        "Capacity of an L2 adapter (0 = unknown)", labels);
    const json_t *list = json_object_get(json_object_get(status, "storage_manager"), "l2_adapters");
    if (!stores || !loads || !used || !cap || !json_is_array(list))
        return;
    /* Several adapters of one type share the label: sum them per name. */
    json_t *sums = json_object();
    size_t i;
    const json_t *a;
    json_array_foreach(list, i, a) {
        const char *name = json_string_value(json_object_get(a, "type_name"));
        const json_t *c = json_object_get(a, "counters");
        if (!name)
            continue;
        const double add[4] = {json_number_value(json_object_get(c, "stores_ok")) +
                                   json_number_value(json_object_get(c, "stores_failed")),
                               json_number_value(json_object_get(c, "loads")),
                               json_number_value(json_object_get(a, "used_bytes")),
                               json_number_value(json_object_get(a, "capacity_bytes"))};
        json_t *acc = json_object_get(sums, name);
        if (!acc) {
            acc = json_pack("[f, f, f, f]", 0.0, 0.0, 0.0, 0.0);
            json_object_set_new(sums, name, acc);
        }
        for (size_t k = 0; k < 4; k++)
            json_array_set_new(acc, k, json_real(json_number_value(json_array_get(acc, k)) + add[k]));
    }
    const char *name;
    json_t *acc;
    lmc_metric *families[4] = {stores, loads, used, cap};
    json_object_foreach(sums, name, acc) {
        const char *values[] = {name};
        for (size_t k = 0; k < 4; k++)
            lmc_metric_set(families[k], values, json_number_value(json_array_get(acc, k)));
    }
    json_decref(sums);
}

static void collect_status(lmc_metrics *r, void *user)
{
    status_source *ss = user;
    json_t *status = ss->fn(ss->user);
    lmc_metrics_update_from_status(r, status);
    update_l2_from_status(r, status);
    json_decref(status);
}

int lmc_metrics_add_status_source(lmc_metrics *r, lmc_metrics_status_fn fn, void *user)
{
    lmc_metric *m[N_STATUS_FIELDS + 1];
    status_source *ss = calloc(1, sizeof *ss);
    if (!r || !fn || !ss || !status_families(r, m)) {
        free(ss);
        return -1;
    }
    ss->fn = fn;
    ss->user = user;
    return lmc_metrics_add_owned_collector(r, collect_status, ss);
}
