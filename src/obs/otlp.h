/* OTLP/HTTP JSON exporter (--otlp-endpoint): a thread that POSTs the
 * metric registry to ENDPOINT/v1/metrics and, with a span recorder
 * (--enable-tracing), the finished spans to ENDPOINT/v1/traces, every
 * interval_s seconds and once more from lmc_otlp_stop().  Resource
 * attributes: service.name "lmcached", service.instance.id.
 *
 * OTLP names: a family "lmcache_mp_<x>" is exported as "lmcache_mp.<x>"
 * (upstream's instrument name), counters without their "_total" suffix;
 * counters are cumulative monotonic sums, gauges gauges, histograms
 * explicit-bucket histograms.  Export results are counted in
 * lmcache_mp_otlp_exports_total{signal, result} of the same registry.
 *
 * Ownership: the exporter borrows the registry and the recorder; stop it
 * before freeing either. */
#ifndef LMC_OBS_OTLP_H
#define LMC_OBS_OTLP_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "obs/metrics.h"
#include "obs/spans.h"

typedef struct {
    const char *endpoint;       /* e.g. http://127.0.0.1:4318 (a trailing / is fine) */
    const char *instance_id;
    const char *version;        /* scope version */
    double interval_s;          /* > 0; 10 by default upstream */
    double timeout_s;           /* per POST; 0 = 5 s */
    lmc_metrics *metrics;       /* NULL: no metric export */
    lmc_span_recorder *spans;   /* NULL: no trace export */
} lmc_otlp_options;

typedef struct lmc_otlp lmc_otlp;

lmc_otlp *lmc_otlp_start(const lmc_otlp_options *o, char *err, size_t errlen);
/* Joins the thread, exports one last time, frees. */
void lmc_otlp_stop(lmc_otlp *x);

/* Request bodies (new references), exposed for tests.  `snapshot` is
 * lmc_metrics_snapshot()'s array, `spans` lmc_span_recorder_take()'s. */
json_t *lmc_otlp_metrics_body(const json_t *snapshot, const char *instance_id,
                              const char *version, uint64_t start_ns, uint64_t now_ns);
json_t *lmc_otlp_traces_body(json_t *spans, const char *instance_id, const char *version);
/* The exported name of a registry family (into buf). */
void lmc_otlp_metric_name(const char *family, const char *type, char *buf, size_t len);

#endif
