/* --trace-level / --trace-output (docs/trace.md): the storage trace
 * recorder's start, its /status block and its metrics. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "fleet/fleet.h"
#include "obs/log.h"
#include "server/server_internal.h"
#include "storage/storage_events.h"
#include "storage/storage_trace.h"

#ifndef LMC_VERSION_STRING
#define LMC_VERSION_STRING "0.0.0"
#endif

/* Upstream's default: $TMPDIR/lmcache-trace-<pid>-<UTC stamp>.lct. */
static void default_path(char *out, size_t cap)
{
    const char *dir = getenv("TMPDIR");
    if (!dir || !*dir)
        dir = "/tmp";
    char stamp[32];
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", &tm);
    snprintf(out, cap, "%s/lmcache-trace-%ld-%s.lct", dir, (long)getpid(), stamp);
}

/* The header's sm_config_json: the storage_manager_config group of
 * --print-config, keys sorted and compact, so equal settings digest
 * equally (docs/trace.md, "Header"). */
static char *storage_config_json(const lmc_config *cfg)
{
    char *all = lmc_config_to_json(cfg);
    json_t *root = all ? json_loads(all, 0, NULL) : NULL;
    free(all);
    json_t *sm = json_object_get(root, "storage_manager_config");
    char *out = sm ? json_dumps(sm, JSON_SORT_KEYS | JSON_COMPACT) : NULL;
    json_decref(root);
    return out;
}

int lmc_server_start_trace(lmc_server *s, char *err, size_t errlen)
{
    const lmc_config *cfg = s->cfg;
    if (!cfg->obs.trace_level) {
        if (cfg->obs.trace_output)   /* records nothing, as upstream */
            LMC_WARN("--trace-output is ignored without --trace-level (docs/trace.md)");
        return 0;
    }
    char path[4096];
    if (cfg->obs.trace_output)
        snprintf(path, sizeof path, "%s", cfg->obs.trace_output);
    else
        default_path(path, sizeof path);
    bool events = strcmp(cfg->obs.trace_level, "events") == 0;
    char *json = storage_config_json(cfg);
    /* The events level names its emitter, as upstream's does; the cache
     * event schema's number is not written (docs/trace.md). */
    json_t *meta = events ? json_pack("{s:s, s:s}", "instance_id", cfg->mp.instance_id,
                                      "lmcache_version", LMC_VERSION_STRING)
                          : NULL;
    if (!json || (events && !meta)) {
        free(json);
        json_decref(meta);
        snprintf(err, errlen, "--trace-level: out of memory");
        return -1;
    }
    s->trace = lmc_storage_trace_open_meta(path, cfg->obs.trace_level, json, meta,
                                           LMC_STORAGE_TRACE_RING_BYTES, err, errlen);
    free(json);
    json_decref(meta);
    if (!s->trace)
        return -1;
    if (!events)   /* the events level records the cache-event stream instead */
        lmc_storage_manager_set_trace(s->ctx.storage, s->trace);
    return 0;
}

/* Upstream's record names for the events level (docs/trace.md). */
static void record_fleet_event(void *user, lmc_fleet_tap_kind kind, const json_t *args)
{
    lmc_storage_trace_record_json(user, kind == LMC_FLEET_TAP_BATCH ? "events.batch"
                                                                    : "events.lifecycle",
                                  args);
}

bool lmc_server_trace_fleet_tap(lmc_server *s, lmc_fleet_tap *out)
{
    if (!s->trace || strcmp(lmc_storage_trace_level(s->trace), "events") != 0)
        return false;
    *out = (lmc_fleet_tap){.fn = record_fleet_event, .user = s->trace};
    return true;
}

json_t *lmc_server_trace_status(lmc_server *s)
{
    if (!s->trace)
        return json_pack("{s:n, s:n, s:i, s:i, s:i}", "level", "output", "records_written", 0,
                         "records_dropped", 0, "bytes_written", 0);
    lmc_storage_trace_stats st;
    lmc_storage_trace_get_stats(s->trace, &st);
    return json_pack("{s:s, s:s, s:I, s:I, s:I}", "level", lmc_storage_trace_level(s->trace),
                     "output", lmc_storage_trace_path(s->trace), "records_written",
                     (json_int_t)st.records_written, "records_dropped",
                     (json_int_t)st.records_dropped, "bytes_written",
                     (json_int_t)st.bytes_written);
}

/* ---- metrics (docs/metrics.md, "Trace") ---------------------------------- */

typedef struct {
    lmc_server *s;
    lmc_metric *written, *dropped, *bytes;
} trace_metrics;

static void collect_trace(lmc_metrics *r, void *user)
{
    (void)r;
    trace_metrics *tm = user;
    lmc_storage_trace_stats st = {0};
    if (tm->s->trace)
        lmc_storage_trace_get_stats(tm->s->trace, &st);
    lmc_metric_set(tm->written, NULL, (double)st.records_written);
    lmc_metric_set(tm->dropped, NULL, (double)st.records_dropped);
    lmc_metric_set(tm->bytes, NULL, (double)st.bytes_written);
}

int lmc_server_register_trace_metrics(lmc_server *s)
{
    trace_metrics *tm = calloc(1, sizeof *tm);
    if (!tm)
        return -1;
    tm->s = s;
    tm->written = lmc_metrics_counter(s->metrics, "lmcache_mp_trace_records_written_total",
                                      "Trace records written to --trace-output", NULL);
    tm->dropped = lmc_metrics_counter(s->metrics, "lmcache_mp_trace_records_dropped_total",
                                      "Trace records dropped: the trace ring was full or the "
                                      "file refused a write", NULL);
    tm->bytes = lmc_metrics_counter(s->metrics, "lmcache_mp_trace_bytes_written_total",
                                    "Bytes written to --trace-output, the header included",
                                    NULL);
    if (!tm->written || !tm->dropped || !tm->bytes) {
        free(tm);
        return -1;
    }
    return lmc_metrics_add_owned_collector(s->metrics, collect_trace, tm);
}
