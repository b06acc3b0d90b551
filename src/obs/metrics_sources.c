/* Collectors that feed the registry at scrape time: the process (/proc),
 * the event bus and the RPC core.  The storage, the modules and the server
 * register their own (docs/metrics.md, "Who exports what"). */
#include <dirent.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/time.h>
#include <unistd.h>

#include "obs/metrics.h"

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
