/* Metrics: a small Prometheus registry (counters, gauges, histograms with
 * labels) rendered in the text exposition format 0.0.4, plus collectors
 * that refresh values from live sources at scrape time (process metrics,
 * the event bus, RPC counters here; the storage, the modules and the
 * server register their own, reading their typed counters).  docs/metrics.md lists
 * every metric lmcached exports.
 *
 * Ownership: the registry owns its families and series; a family handle
 * (lmc_metric *) stays valid until lmc_metrics_free().  Names, help texts
 * and label names are copied.
 *
 * Threads: every function is thread-safe (one mutex per registry).
 * Collectors run inside lmc_metrics_render() on the caller's thread,
 * without the registry lock held, so they may update metrics. */
#ifndef LMC_OBS_METRICS_H
#define LMC_OBS_METRICS_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "obs/event_bus.h"

#define LMC_METRICS_MAX_LABELS 4
/* Distinct label-value sets kept per family; later ones are not recorded
 * (counted in lmcache_mp_metrics_series_dropped_total). */
#define LMC_METRICS_MAX_SERIES 1024

typedef enum {
    LMC_METRIC_COUNTER,
    LMC_METRIC_GAUGE,
    LMC_METRIC_HISTOGRAM,
} lmc_metric_type;

typedef struct lmc_metrics lmc_metrics;
typedef struct lmc_metric lmc_metric;

lmc_metrics *lmc_metrics_new(void);
/* Frees the registry.  Free the event bus first when
 * lmc_metrics_attach_event_bus() was used (its subscriber points here). */
void lmc_metrics_free(lmc_metrics *r);

/* Registers a family.  `labels` is a NULL-terminated list of at most
 * LMC_METRICS_MAX_LABELS label names (NULL for none).  Counter names must
 * end in "_total".  Registering an existing name with the same type and
 * labels returns the existing family; anything else invalid returns NULL. */
lmc_metric *lmc_metrics_counter(lmc_metrics *r, const char *name, const char *help,
                                const char *const *labels);
lmc_metric *lmc_metrics_gauge(lmc_metrics *r, const char *name, const char *help,
                              const char *const *labels);
/* `bounds`: n strictly increasing finite upper bounds (+Inf is implicit). */
lmc_metric *lmc_metrics_histogram(lmc_metrics *r, const char *name, const char *help,
                                  const char *const *labels, const double *bounds, size_t n);

/* `values` has one entry per label name of the family (NULL if none).
 * add: counters (v >= 0) and gauges.  set: gauges, and counters that
 * mirror an external monotonic total (collectors).  observe: histograms.
 * Calls of the wrong kind are ignored. */
void lmc_metric_add(lmc_metric *m, const char *const *values, double v);
void lmc_metric_set(lmc_metric *m, const char *const *values, double v);
void lmc_metric_observe(lmc_metric *m, const char *const *values, double v);
/* Drops every series of the family: a collector that mirrors a set which
 * shrinks (one series per live tenant) clears it, then sets what is there. */
void lmc_metric_clear(lmc_metric *m);
/* Current value of a counter/gauge series, or the observation count of a
 * histogram series; 0 when the series does not exist. */
double lmc_metric_value(lmc_metric *m, const char *const *values);

/* Called at the start of every render, in registration order. */
typedef void (*lmc_metrics_collect_fn)(lmc_metrics *r, void *user);
int lmc_metrics_add_collector(lmc_metrics *r, lmc_metrics_collect_fn fn, void *user);
/* Like lmc_metrics_add_collector(), but the registry owns `user` (a
 * malloc'd block, freed with the registry, or at once when this fails). */
int lmc_metrics_add_owned_collector(lmc_metrics *r, lmc_metrics_collect_fn fn, void *user);

/* Runs the collectors and returns the exposition text (families in
 * registration order, series in creation order); malloc'd, caller frees.
 * NULL on allocation failure. */
char *lmc_metrics_render(lmc_metrics *r);
/* Runs the collectors and returns every family as JSON (new reference):
 * [{"name", "help", "type": "counter"|"gauge"|"histogram", "bounds": [..],
 *   "series": [{"labels": {name: value}, "value"} or
 *              {"labels", "buckets": [non-cumulative counts, +Inf last],
 *               "sum", "count"}]}].  Used by the OTLP exporter. */
json_t *lmc_metrics_snapshot(lmc_metrics *r);
#define LMC_METRICS_CONTENT_TYPE "text/plain; version=0.0.4; charset=utf-8"

/* ---- collectors ----------------------------------------------------- */

/* process_cpu_seconds_total, process_resident_memory_bytes,
 * process_virtual_memory_bytes, process_open_fds, process_max_fds,
 * process_start_time_seconds, read from /proc at scrape time. */
int lmc_metrics_add_process_collector(lmc_metrics *r);

/* Subscribes to every event (lmcache_mp_events_total{event_type}) and
 * exports the bus's own counters (published/delivered/dropped, queue
 * depth, drain lag).  The event-driven families are in event_metrics.h.  The bus must be freed before the registry. */
int lmc_metrics_attach_event_bus(lmc_metrics *r, lmc_event_bus *bus);

/* RPC core totals, mirrored as lmcache_mp_rpc_*_total counters. */
typedef struct {
    uint64_t received, replied, dropped, error_frames, inlined, overloaded;
} lmc_metrics_rpc_counts;
typedef lmc_metrics_rpc_counts (*lmc_metrics_rpc_fn)(void *user);
int lmc_metrics_add_rpc_source(lmc_metrics *r, lmc_metrics_rpc_fn fn, void *user);

/* Formats v as the exposition format writes sample values and `le`
 * bounds: shortest round-trip decimal, "+Inf", "-Inf", "NaN". */
void lmc_metrics_format_value(double v, char *buf, size_t len);

#endif
