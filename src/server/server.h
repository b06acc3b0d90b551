/* The cache server: composes the RPC core, the shared services (storage,
 * event bus, liveness) and the enabled modules, and owns their lifetimes. */
#ifndef LMC_SERVER_SERVER_H
#define LMC_SERVER_SERVER_H

#include <jansson.h>
#include <stddef.h>

#include "config/config.h"

typedef struct lmc_server lmc_server;

/* Binds the ZMQ socket, creates storage and modules.  `cfg` must outlive
 * the server.  On failure writes one line to err. */
int lmc_server_new(const lmc_config *cfg, lmc_server **out, char *err, size_t errlen);
/* Serves until `stop_fd` (e.g. a signalfd) is readable or lmc_server_stop(). */
int lmc_server_run(lmc_server *s, int stop_fd);
void lmc_server_stop(lmc_server *s);
/* Aggregated status of every module and service; caller owns the object. */
json_t *lmc_server_report_status(lmc_server *s);
/* Drains workers, closes modules (reverse creation order), then storage,
 * the event bus and the socket. */
void lmc_server_free(lmc_server *s);

#endif
