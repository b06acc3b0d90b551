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
#include <stddef.h>
#include <stdint.h>

#include "storage/l2/l2_adapter.h"

typedef struct lmc_l2_resp_options {
    const char *host;          /* required (LMCACHE_RESP_HOST overrides) */
    int port;                  /* required (LMCACHE_RESP_PORT overrides) */
    const char *username;      /* "" = none (LMCACHE_RESP_USERNAME) */
    const char *password;      /* "" = no AUTH (LMCACHE_RESP_PASSWORD) */
    size_t num_connections;    /* per node: one per adapter worker */
    uint64_t capacity_bytes;   /* 0 = unknown */
    int timeout_ms;            /* connect / send / receive; 0 = 2000 */
} lmc_l2_resp_options;

/* Environment overrides are applied here (and kept out of logs).  The
 * server is not contacted yet: a Redis that is down at start-up only makes
 * the first operations fail, and the backend reconnects when it is back. */
lmc_l2_backend *lmc_l2_resp_new(const lmc_l2_resp_options *o, char *err, size_t errlen);

/* Redis Cluster hash slot of a key (CRC16/XMODEM of the key or of its
 * {hash tag}, mod 16384). */
uint16_t lmc_resp_key_slot(const char *key, size_t len);

#endif
