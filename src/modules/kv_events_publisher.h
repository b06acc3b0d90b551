/* The KV event publisher (docs/kv_events.md, "Publishing to routers"): a
 * thread that follows the KV event log and publishes its records on a ZMQ
 * PUB socket in vLLM's KV event format, keeping the last batches for a
 * replay ROUTER socket. */
#ifndef LMC_MODULES_KV_EVENTS_PUBLISHER_H
#define LMC_MODULES_KV_EVENTS_PUBLISHER_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "modules/kv_events.h"

typedef struct lmc_kv_events_publisher lmc_kv_events_publisher;

typedef struct {
    const char *endpoint;        /* bound PUB endpoint, non-empty */
    const char *replay_endpoint; /* bound ROUTER endpoint, "" = none */
    const char *topic;
    size_t buffer_steps;         /* >= 1 batches kept for replay */
    uint32_t block_size;         /* the chunk size, every BlockStored's block_size */
    uint32_t vllm_block_size;    /* 0: LMCache chunk hashes; else vLLM's block hashes
                                  * over blocks of this many tokens (kv_events_vllm.h) */
    const char *hash_seed;       /* with vllm_block_size: vLLM's PYTHONHASHSEED */
} lmc_kv_events_publisher_opts;

/* Binds both sockets and starts following `log` from its first record.
 * NULL with err naming the flag on a bind failure.  `log` must outlive
 * lmc_kv_events_publisher_stop(). */
lmc_kv_events_publisher *lmc_kv_events_publisher_start(lmc_kv_events *log,
                                                       const lmc_kv_events_publisher_opts *o,
                                                       char *err, size_t errlen);
/* Joins the thread and closes the sockets; NULL is fine. */
void lmc_kv_events_publisher_stop(lmc_kv_events_publisher *p);
/* {endpoint, batches_published, events_published, replay_requests, next_seq,
 *  vllm_hashes: null | {block_size, chunks_remembered, unchained_skipped,
 *  unknown_removed}} */
json_t *lmc_kv_events_publisher_status(lmc_kv_events_publisher *p);

#endif
