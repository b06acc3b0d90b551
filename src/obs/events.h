/* Event types published on the event bus (event_bus.h) and the metadata
 * each one carries.  Producers call
 *     lmc_event_bus_publish(bus, LMC_EVENT_X, session_id, metadata)
 * with `metadata` a JSON object of the fields listed here (the bus steals
 * it).  Fields marked optional may be absent; consumers treat a missing
 * number as 0 and a missing string as "".  Names follow upstream's where it
 * has them (the *_START / *_END span pairs); docs/observability.md,
 * "Events", lists which subscriber reads which field.
 *
 * session_id: the request id for lookup/store/retrieve events (it pairs a
 * *_START with its *_END), empty otherwise. */
#ifndef LMC_OBS_EVENTS_H
#define LMC_OBS_EVENTS_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* LOOKUP_START (optional, opens the mp.lookup_prefetch span):
 *   {request_id, model_name, cache_salt}
 * LOOKUP_END: one completed LOOKUP
 *   {request_id: str, model_name: str, cache_salt: str,
 *    requested_tokens: int   chunk-aligned tokens submitted,
 *    hit_tokens: int         contiguous prefix found (L1 + L2),
 *    hit_tokens_l2: int      optional, part of hit_tokens found in L2 (0),
 *    requested_chunks: int, hit_chunks: int,
 *    chunk_hashes: [hex str] optional, one per requested chunk,
 *    early_exit: str         optional: no_gpu_context | empty_chunk_hashes |
 *                            no_group_layout_descs} */
#define LMC_EVENT_LOOKUP_START "LOOKUP_START"
#define LMC_EVENT_LOOKUP_END "LOOKUP_END"

/* STORE_START / STORE_END: a GPU -> CPU (L0 -> L1) transfer of one request
 *   {model_name, engine_id, device: str|int, worker_id: int,
 *    cache_salt, num_chunks: int, bytes: int (END)}
 * RETRIEVE_START / RETRIEVE_END: CPU -> GPU, same fields.  A START and an
 * END pair by (session_id, device). */
#define LMC_EVENT_STORE_START "STORE_START"
#define LMC_EVENT_STORE_END "STORE_END"
#define LMC_EVENT_RETRIEVE_START "RETRIEVE_START"
#define LMC_EVENT_RETRIEVE_END "RETRIEVE_END"

/* REPORT_BLOCK_ALLOCATION: published by the management module
 *   {instance_id: int, model_name: str, records: [...]} */
#define LMC_EVENT_REPORT_BLOCK_ALLOCATION "REPORT_BLOCK_ALLOCATION"

/* L1 storage events (the storage manager publishes them):
 * L1_READ            {num_keys}   keys whose L1 read finished
 * L1_WRITE           {num_keys}   keys written to L1
 * L1_KEYS_EVICTED    {keys: [{hash: hex str, lifetime_s: num, idle_s: num}]}
 *                    sampled keys only (the producer applies
 *                    lmc_obs_sampled(hash, --metrics-sample-rate) when the
 *                    object becomes resident); lifetime: admission ->
 *                    eviction, idle: last read lock or touch -> eviction
 * L1_USAGE           {usage_ratio}  every eviction cycle (~1 Hz)
 * L1_REUSE_GAPS      {reuse_gaps_s: [num], evict_reuse_gaps_s: [num]}
 *                    sampled keys, every eviction cycle with gaps to report:
 *                    touch -> next touch; eviction -> next write (capped
 *                    at 300 s, reported as 300 when the cap passes)
 * L1_ALLOCATION_FAILURE {during: l1_store|l2_prefetch, model_name, num_keys}
 * L1_READ_FAILURE    {during: l2_store|l1_retrieve,
 *                     reason: not_found|write_locked, model_name, num_keys}
 * SM_WRITE           {by_salt: {salt: {ok, failed}}}  one reserve-write
 * SM_READ            {by_salt: {salt: {ok, failed}}}  one prefix read lock
 *                    (a lookup): ok = keys locked, failed = the rest */
#define LMC_EVENT_L1_READ "L1_READ"
#define LMC_EVENT_L1_WRITE "L1_WRITE"
#define LMC_EVENT_L1_KEYS_EVICTED "L1_KEYS_EVICTED"
#define LMC_EVENT_L1_USAGE "L1_USAGE"
#define LMC_EVENT_L1_REUSE_GAPS "L1_REUSE_GAPS"
#define LMC_EVENT_L1_ALLOCATION_FAILURE "L1_ALLOCATION_FAILURE"
#define LMC_EVENT_L1_READ_FAILURE "L1_READ_FAILURE"
#define LMC_EVENT_SM_WRITE "SM_WRITE"
#define LMC_EVENT_SM_READ "SM_READ"

/* L2 tier events (src/storage/l2 publishes them); by_salt is
 * {cache_salt: number of keys}:
 * L2_STORE_SUBMITTED        {by_salt}  one write-behind batch submitted
 * L2_STORE_COMPLETED        {by_salt}  a batch every adapter stored
 * L2_STORE_TASK / L2_LOAD_TASK {l2_name, bytes, seconds}  one adapter task
 *                           that succeeded, submit -> completion
 * L2_PREFETCH_LOOKUP        {by_salt}  one L2 prefetch lookup
 * L2_PREFETCH_LOAD_SUBMITTED {adapters: int, by_salt}  keys to load
 * L2_PREFETCH_LOAD_COMPLETED {by_salt} keys that landed in L1
 * L2_PREFETCH_FAILURE       {reason: l1_oom|not_found, model_name, num_keys}
 * L2_EVICTED                {by_salt}  keys the L2 eviction removed */
#define LMC_EVENT_L2_STORE_SUBMITTED "L2_STORE_SUBMITTED"
#define LMC_EVENT_L2_STORE_COMPLETED "L2_STORE_COMPLETED"
#define LMC_EVENT_L2_STORE_TASK "L2_STORE_TASK"
#define LMC_EVENT_L2_LOAD_TASK "L2_LOAD_TASK"
#define LMC_EVENT_L2_PREFETCH_LOOKUP "L2_PREFETCH_LOOKUP"
#define LMC_EVENT_L2_PREFETCH_LOAD_SUBMITTED "L2_PREFETCH_LOAD_SUBMITTED"
#define LMC_EVENT_L2_PREFETCH_LOAD_COMPLETED "L2_PREFETCH_LOAD_COMPLETED"
#define LMC_EVENT_L2_PREFETCH_FAILURE "L2_PREFETCH_FAILURE"
#define LMC_EVENT_L2_EVICTED "L2_EVICTED"

/* What a LOOKUP_END carries; strings are (pointer, length), not
 * NUL-terminated.  `hashes` are n_hashes digests of hash_len bytes each,
 * contiguous (NULL/0 to leave chunk_hashes out). */
typedef struct {
    const char *request_id;
    size_t request_id_len;
    const char *model_name;
    size_t model_len;
    const char *cache_salt;
    size_t salt_len;
    int64_t requested_tokens, hit_tokens, hit_tokens_l2;
    int64_t requested_chunks, hit_chunks;
    const uint8_t *hashes;
    size_t n_hashes, hash_len;
    const char *early_exit;  /* NULL when the lookup probed */
} lmc_lookup_event_info;

/* Builds the LOOKUP_END metadata (new reference; NULL on allocation
 * failure, which lmc_event_bus_publish accepts). */
json_t *lmc_event_lookup_metadata(const lmc_lookup_event_info *info);
/* A heap copy of `info` that owns its strings and hashes, in one block
 * (free() releases it; NULL on allocation failure).  For
 * lmc_event_bus_publish_deferred with lmc_event_lookup_build. */
lmc_lookup_event_info *lmc_event_lookup_info_dup(const lmc_lookup_event_info *info);
/* lmc_event_build_fn: metadata from a lmc_event_lookup_info_dup copy,
 * which it frees. */
json_t *lmc_event_lookup_build(void *info_copy);

/* Deterministic sampling for lifecycle histograms: true for about a
 * fraction `rate` of all keys, always the same answer for the same key.
 * rate >= 1 samples everything, rate <= 0 nothing. */
bool lmc_obs_sampled(const char *key, double rate);

/* Metadata accessors that never fail: "" / 0 when missing or mistyped.
 * lmc_event_label also formats integers (device, worker_id) into buf. */
const char *lmc_event_str(const json_t *meta, const char *key);
double lmc_event_num(const json_t *meta, const char *key);
const char *lmc_event_label(const json_t *meta, const char *key, char *buf, size_t len);

#endif
