/* "resp" L2 backend: Redis / Valkey over RESP2 (docs/l2.md, "`resp`
 * (Redis / Valkey)").
 *
 * Key = the canonical object-key string, value = the raw object bytes.
 * SET values are written with writev straight from the L1 buffer and GET
 * payloads are read straight into it, so large objects are never copied.
 * Redis Cluster works unchanged: keys are routed by hash slot, and MOVED /
 * ASK redirects teach the backend the cluster's layout. */
#ifndef LMC_STORAGE_L2_RESP_H
#define LMC_STORAGE_L2_RESP_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "storage/l2/l2_adapter.h"

typedef struct lmc_l2_resp_options {
    const char *host;          /* required (LMCACHE_RESP_HOST overrides) */
    int port;                  /* required (LMCACHE_RESP_PORT overrides) */
    const char *username;      /* "" = none (LMCACHE_RESP_USERNAME) */
    const char *password;      /* "" = no AUTH (LMCACHE_RESP_PASSWORD) */
    size_t num_connections;    /* per node: one per adapter worker */
    uint64_t capacity_bytes;   /* max_capacity_gb in bytes; 0 = unlimited */
    int timeout_ms;            /* connect / send / receive; 0 = 2000 */
    bool keep_found;           /* keep the objects listed at start for for_each_recovered
                                * (the adapter has an "eviction" object) */
} lmc_l2_resp_options;

/* Environment overrides are applied here (and kept out of logs).  The
 * objects already in Redis are counted here (SCAN + STRLEN over every
 * master, docs/l2.md "Usage and capacity of resp and s3"); a Redis that is
 * down at start-up leaves them uncounted and only makes the first
 * operations fail, and the backend reconnects when it is back. */
lmc_l2_backend *lmc_l2_resp_new(const lmc_l2_resp_options *o, char *err, size_t errlen);

/* Redis Cluster hash slot of a key (CRC16/XMODEM of the key or of its
 * {hash tag}, mod 16384). */
uint16_t lmc_resp_key_slot(const char *key, size_t len);

#endif
