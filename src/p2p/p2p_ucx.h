/* The ucx engine of the transfer channel (docs/p2p.md, "Transfer channel",
 * "ucx"): the arena registered once with UCX, its remote key handed to a
 * peer over a TCP bootstrap on the listen URL, reads as one-sided
 * ucp_get_nbx into the caller's buffers.  Transports come from UCX's own
 * environment (UCX_TLS, UCX_NET_DEVICES, ...).  Same options and the same
 * per-item contract as the tcp engine (p2p_chan.h), but for the lease
 * check: a one-sided read passes no code of the server, so may_read is not
 * consulted (docs/p2p.md, "Trust model"). */
#ifndef LMC_P2P_UCX_H
#define LMC_P2P_UCX_H

#include "p2p/p2p_chan.h"

typedef struct lmc_p2p_ucx_server lmc_p2p_ucx_server;
typedef struct lmc_p2p_ucx_client lmc_p2p_ucx_client;

lmc_p2p_ucx_server *lmc_p2p_ucx_server_start(const lmc_p2p_chan_server_opts *o, char *err,
                                             size_t errlen);
int lmc_p2p_ucx_server_port(const lmc_p2p_ucx_server *s);
/* Bootstrap connections that did not prove the token (opts.auth_token). */
uint64_t lmc_p2p_ucx_server_auth_failures(const lmc_p2p_ucx_server *s);
void lmc_p2p_ucx_server_stop(lmc_p2p_ucx_server *s);

/* Connects lazily, on the first read, as the tcp client. */
lmc_p2p_ucx_client *lmc_p2p_ucx_client_open(const lmc_p2p_chan_client_opts *o, char *err,
                                            size_t errlen);
size_t lmc_p2p_ucx_client_read(lmc_p2p_ucx_client *c, const lmc_p2p_chan_item *items, size_t n,
                               int timeout_ms, bool *ok);
void lmc_p2p_ucx_client_close(lmc_p2p_ucx_client *c);

#endif
