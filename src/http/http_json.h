/* JSON bodies of the HTTP frontend that do not need a connection: error
 * shapes, the memory-pressure snapshot, the /config view, the
 * /cache/clear body, the /threads listing.  All return new references. */
#ifndef LMC_HTTP_HTTP_JSON_H
#define LMC_HTTP_HTTP_JSON_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* {"detail": "<message>"} (HTTPException style).  Messages often echo
 * request bytes, so any invalid UTF-8 in them (or left by truncating the
 * message at 511 bytes) becomes '?': JSON strings must be UTF-8. */
json_t *lmc_http_detail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* {"error": "<message>"} (hand-rolled style of the older endpoints), the
 * message scrubbed the same way. */
json_t *lmc_http_error(const char *message);

/* Length of the longest valid UTF-8 prefix of s[0..n). */
size_t lmc_http_utf8_prefix(const char *s, size_t n);
/* Replaces every byte of s that is not part of a valid UTF-8 sequence with
 * '?', in place (the length is kept). */
void lmc_http_utf8_scrub(char *s);
/* 422 body: {"detail":[{"type","loc","msg","input"}]}.  Steals loc and
 * input (input NULL = {}). */
json_t *lmc_http_validation_error(const char *type, json_t *loc, const char *msg, json_t *input);

/* Memory-pressure level of one tier (docs/http.md, "Memory pressure"):
 * "unknown" without a ratio,
 * "critical" at >= 1, "high" at >= watermark (when given), else "normal". */
const char *lmc_http_pressure_level(bool has_ratio, double ratio, bool has_watermark,
                                    double watermark);
/* GET /status/memory-pressure body from a server status object: the L1
 * tier from status.storage_manager.{l1_manager,l1_eviction_controller},
 * then one entry per status.storage_manager.l2_adapters[i]. */
json_t *lmc_http_memory_pressure(const json_t *status, int64_t now_ms);

/* GET /config body: {"mp_config":..., "storage_manager_config":...,
 * "obs_config":..., "http_config":..., ...} renamed to upstream's keys
 * {"mp", "storage_manager", "observability", "http", "coordinator", ...}. */
json_t *lmc_http_config_view(const json_t *grouped);

/* Validates a POST /cache/clear body (empty = defaults).  Returns 0 and
 * sets *force, or the HTTP status (400/422) with *error_body set. */
unsigned lmc_http_parse_clear_body(const char *body, size_t len, bool *force,
                                   json_t **error_body);

/* GET /threads body: the process's threads from /proc/self/task,
 * filtered by a case-insensitive name substring (NULL = any) and a
 * thread id (has_tid).  Never empty: without a match, one MainThread
 * entry. */
json_t *lmc_http_threads(const char *name_filter, bool has_tid, long long tid);

#endif
