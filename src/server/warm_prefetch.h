/* Warm prefetch (HTTP POST /cache/prefetches, GET /cache/prefetches/{id}):
 * load a prompt's chunks from L2 into L1 ahead of use, resident and
 * unlocked.  The server hashes the tokens and expands every rank of the
 * registered layout, like LOOKUP, but takes no read locks for the caller. */
#ifndef LMC_SERVER_WARM_PREFETCH_H
#define LMC_SERVER_WARM_PREFETCH_H

#include <jansson.h>
#include <stddef.h>

#include "modules/context.h"

typedef struct lmc_warm_prefetch lmc_warm_prefetch;

lmc_warm_prefetch *lmc_warm_prefetch_new(lmc_module_ctx *ctx);
/* Finishes (waits for) running prefetches, then frees everything. */
void lmc_warm_prefetch_free(lmc_warm_prefetch *w);

/* Both return the reply body, or NULL with *status and err. */
json_t *lmc_warm_prefetch_submit(lmc_warm_prefetch *w, const json_t *body, unsigned *status,
                                 char *err, size_t errlen);
/* The first poll that sees completion removes the job (later ones: 404). */
json_t *lmc_warm_prefetch_query(lmc_warm_prefetch *w, const char *request_id, unsigned *status,
                                char *err, size_t errlen);

#endif
