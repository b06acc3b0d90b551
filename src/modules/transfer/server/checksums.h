/* POST /cache/checksums for the server-driven transfer module's
 * registered engines (docs/http.md, "KV checksums"). */
#ifndef LMC_MODULES_TRANSFER_SERVER_CHECKSUMS_H
#define LMC_MODULES_TRANSFER_SERVER_CHECKSUMS_H

#include <jansson.h>

#include "http/http_routes.h"

/* `module_state`: the lmcache_driven_transfer module's state.  `body`:
 * {"block_ids": [int], "chunk_size": int (blocks per chunk), "instance_id":
 * int (0), "layerwise": bool (false)}.  The reply body (new reference), or
 * NULL with *status (400, 404, 501, 500) and err set. */
json_t *lmc_server_driven_checksums(void *module_state, const json_t *body, unsigned *status,
                                    char *err, size_t errlen);

/* The module's register_http hook (modules/module.h): POST /cache/checksums
 * and GET /kvcache/check, answering 501 when `module_state` is NULL (the
 * module is not loaded). */
int lmc_server_driven_register_http(void *module_state, lmc_http_routes *routes);

#endif
