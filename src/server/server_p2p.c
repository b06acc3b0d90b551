/* The P2P transfer channel of this server (docs/p2p.md, "Running the
 * channel"): with --p2p-advertise-url set, the channel server lends the L1
 * arena to peers at --p2p-listen-url, reads approved by the p2p_serve
 * module's lease check. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "modules/p2p/p2p_serve.h"
#include "obs/log.h"
#include "p2p/p2p_chan.h"
#include "p2p/p2p_ucx.h"
#include "server/server_internal.h"
#include "storage/storage_manager.h"

static bool p2p_enabled(const lmc_config *cfg)
{
    return cfg->p2p.advertise_url && cfg->p2p.advertise_url[0];
}

/* UCX chooses queue depths, GIDs and handshakes itself: a value it cannot
 * be given would be accepted and ignored (docs/configuration.md, "P2P"). */
static int refuse_unmapped_rdma(const lmc_p2p_config *p, char *err, size_t errlen)
{
    const char *flag = p->rdma_gid_index != -1                       ? "--p2p-rdma-gid-index"
                       : p->rdma_gid_indices && p->rdma_gid_indices[0] ? "--p2p-rdma-gid-indices"
                       : p->rdma_queue_depth != 4096                  ? "--p2p-rdma-queue-depth"
                       : p->rdma_handshake_timeout_ms != 10000
                           ? "--p2p-rdma-handshake-timeout-ms"
                           : NULL;
    if (!flag)
        return 0;
    snprintf(err, errlen, "%s: the verbs engine is served by UCX, which picks this itself; "
                          "leave the default", flag);
    return -1;
}

/* --p2p-rdma-device and --p2p-rdma-port become UCX_NET_DEVICES ("dev:port,...").
 * Runs before any thread starts, so that setenv races no getenv. */
static int map_rdma_devices(const lmc_p2p_config *p, char *err, size_t errlen)
{
    char want[1024] = "";
    size_t used = 0;
    const char *d = p->rdma_device ? p->rdma_device : "";
    while (*d) {
        size_t n = strcspn(d, ",");
        int w = snprintf(want + used, sizeof want - used, "%s%.*s:%d", used ? "," : "", (int)n,
                         d, p->rdma_port);
        if (w < 0 || (size_t)w >= sizeof want - used) {
            snprintf(err, errlen, "--p2p-rdma-device: the device list is too long");
            return -1;
        }
        used += (size_t)w;
        d += n + (d[n] == ',');
    }
    const char *have = getenv("UCX_NET_DEVICES");
    if (have && strcmp(have, want) != 0) {
        snprintf(err, errlen, "--p2p-rdma-device: gives UCX_NET_DEVICES '%s', but the "
                              "environment sets '%s'", want, have);
        return -1;
    }
    if (!have && setenv("UCX_NET_DEVICES", want, 1) != 0) {
        snprintf(err, errlen, "--p2p-rdma-device: cannot set UCX_NET_DEVICES");
        return -1;
    }
    return 0;
}

int lmc_server_check_p2p(const lmc_config *cfg, char *err, size_t errlen)
{
    if (!p2p_enabled(cfg))
        return 0;
    const char *e = cfg->p2p.transfer_engine;
    if (strcmp(e, "tcp") == 0 || strcmp(e, "ucx") == 0 || strcmp(e, "nixl") == 0)
        return 0;
    if (strcmp(e, "verbs") == 0)
        return refuse_unmapped_rdma(&cfg->p2p, err, errlen) != 0
                   ? -1
                   : map_rdma_devices(&cfg->p2p, err, errlen);
    snprintf(err, errlen, "--p2p-transfer-engine: '%s' is not built; use tcp or ucx (nixl "
                          "and verbs are served by ucx)", e);
    return -1;
}

int lmc_server_start_p2p(lmc_server *s, char *err, size_t errlen)
{
    const lmc_config *cfg = s->cfg;
    if (!p2p_enabled(cfg))
        return 0;
    const lmc_l1_arena_desc *a = lmc_storage_manager_l1_arena(s->ctx.storage);
    void *lease_state = lmc_server_module_state(s, &lmc_p2p_serve_module);
    if (!a || !a->base || !lease_state) {
        snprintf(err, errlen, "--p2p-advertise-url: no L1 arena or lease state to serve");
        return -1;
    }
    const char *engine = cfg->p2p.transfer_engine;
    lmc_p2p_chan_server_opts o = {
        .listen_url = cfg->p2p.listen_url && cfg->p2p.listen_url[0] ? cfg->p2p.listen_url
                                                                    : cfg->p2p.advertise_url,
        .arena = a->base,
        .arena_size = a->size,
        .may_read = lmc_p2p_serve_may_read,
        .may_read_user = lease_state,
        .auth_token = cfg->coordinator.auth_token,
    };
    char why[256] = "";
    if (strcmp(engine, "tcp") == 0) {
        s->p2p_tcp = lmc_p2p_chan_server_start(&o, why, sizeof why);
    } else {
        if (strcmp(engine, "ucx") != 0)
            LMC_INFO("--p2p-transfer-engine %s: served by the ucx engine (docs/p2p.md)", engine);
        s->p2p_ucx = lmc_p2p_ucx_server_start(&o, why, sizeof why);
    }
    if (!s->p2p_tcp && !s->p2p_ucx) {
        snprintf(err, errlen, "--p2p-listen-url: %s", why);
        return -1;
    }
    int port = s->p2p_tcp ? lmc_p2p_chan_server_port(s->p2p_tcp)
                          : lmc_p2p_ucx_server_port(s->p2p_ucx);
    LMC_INFO("P2P transfer channel (%s) on %s (port %d), advertised as %s, lending %llu "
             "bytes; %s", s->p2p_tcp ? "tcp" : "ucx", o.listen_url, port, cfg->p2p.advertise_url,
             (unsigned long long)a->size,
             o.auth_token && o.auth_token[0]
                 ? "requires the token of --coordinator-auth-token (docs/p2p.md)"
                 : "open to anyone who reaches it (no --coordinator-auth-token)");
    return 0;
}

void lmc_server_stop_p2p(lmc_server *s)
{
    if (s->p2p_tcp)
        lmc_p2p_chan_server_stop(s->p2p_tcp);
    if (s->p2p_ucx)
        lmc_p2p_ucx_server_stop(s->p2p_ucx);
    s->p2p_tcp = NULL;
    s->p2p_ucx = NULL;
}
