/* The ucx engine's serving side (p2p_ucx.h, docs/p2p.md): one thread that
 * answers bootstrap connections with the arena's description and keeps
 * the UCX worker progressing (transports without hardware RMA, tcp among
 * them, serve a peer's GET from the target's progress). */
#include "p2p/p2p_ucx.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "p2p/p2p_auth.h"
#include "p2p/p2p_io.h"
#include "p2p/p2p_ucx_api.h"
#include "p2p/p2p_ucx_wire.h"

struct lmc_p2p_ucx_server {
    lmc_p2p_ucx_api api;
    int listen_fd, port, io_timeout_ms;
    int stop_pipe[2];
    pthread_t th, boot_th;   /* the worker's progress; the bootstraps */
    bool boot_started;
    char *token;             /* non-NULL: bootstraps prove it first (p2p_auth.h) */
    _Atomic uint64_t auth_failures;
    ucp_context_h ctx;
    ucp_worker_h worker;
    ucp_mem_h memh;
    uint8_t *blob;           /* the bootstrap answer, the same for every peer */
    size_t blob_len;
};

/* A client that proves no token within this long is dropped: bootstraps
 * are served one at a time, so a silent one must not hold the next back. */
#define AUTH_TIMEOUT_MS 2000

static void answer_bootstrap(lmc_p2p_ucx_server *s)
{
    int fd = accept4(s->listen_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0)
        return;
    int auth_ms = s->io_timeout_ms < AUTH_TIMEOUT_MS ? s->io_timeout_ms : AUTH_TIMEOUT_MS;
    uint8_t holder[LMC_P2P_AUTH_MAX_HOLDER];   /* one-sided reads pass no lease check */
    size_t holder_len;
    if (s->token && lmc_p2p_auth_server(fd, s->token, s->stop_pipe[0],
                                        lmc_p2p_io_now_ms() + auth_ms, holder, &holder_len)) {
        atomic_fetch_add(&s->auth_failures, 1);
        close(fd);
        return;
    }
    /* Bounded: a peer that does not take 64 KiB in io_timeout_ms is dropped. */
    lmc_p2p_io_full(fd, s->blob, s->blob_len, true, s->stop_pipe[0], -1, s->io_timeout_ms);
    close(fd);
}

/* Bootstraps on their own thread, so that a slow or hostile one never
 * stalls the worker's progress, which serves the peers' reads. */
static void *boot_main(void *arg)
{
    lmc_p2p_ucx_server *s = arg;
    for (;;) {
        struct pollfd pf[2] = {{.fd = s->stop_pipe[0], .events = POLLIN},
                               {.fd = s->listen_fd, .events = POLLIN}};
        if (poll(pf, 2, -1) < 0 && errno != EINTR)
            break;
        if (pf[0].revents)
            break;
        if (pf[1].revents & POLLIN)
            answer_bootstrap(s);
    }
    return NULL;
}

static void *server_main(void *arg)
{
    lmc_p2p_ucx_server *s = arg;
    int efd = -1;
    s->api.ucp_worker_get_efd(s->worker, &efd);
    for (;;) {
        while (s->api.ucp_worker_progress(s->worker)) {
        }
        if (s->api.ucp_worker_arm(s->worker) == UCS_ERR_BUSY)
            continue;
        struct pollfd pf[2] = {{.fd = s->stop_pipe[0], .events = POLLIN},
                               {.fd = efd, .events = POLLIN}};
        if (poll(pf, 2, -1) < 0 && errno != EINTR)
            break;
        if (pf[0].revents)
            break;
    }
    return NULL;
}

static int ucx_setup(lmc_p2p_ucx_server *s, const lmc_p2p_chan_server_opts *o, char *err,
                     size_t errlen)
{
    ucp_params_t p = {.field_mask = UCP_PARAM_FIELD_FEATURES,
                      .features = UCP_FEATURE_RMA | UCP_FEATURE_WAKEUP};
    ucp_worker_params_t wp = {.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
                              .thread_mode = UCS_THREAD_MODE_SINGLE};
    ucp_mem_map_params_t mp = {.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS |
                                             UCP_MEM_MAP_PARAM_FIELD_LENGTH,
                               .address = (void *)o->arena, .length = o->arena_size};
    void *rkey = NULL;
    size_t rkey_len = 0;
    ucp_address_t *addr = NULL;
    size_t addr_len = 0;
    ucs_status_t st = s->api.ucp_init_version(UCP_API_MAJOR, UCP_API_MINOR, &p, NULL, &s->ctx);
    if (st == UCS_OK && (st = s->api.ucp_worker_create(s->ctx, &wp, &s->worker)) == UCS_OK &&
        (st = s->api.ucp_mem_map(s->ctx, &mp, &s->memh)) == UCS_OK &&
        (st = s->api.ucp_rkey_pack(s->ctx, s->memh, &rkey, &rkey_len)) == UCS_OK &&
        (st = s->api.ucp_worker_get_address(s->worker, &addr, &addr_len)) == UCS_OK) {
        s->blob = lmc_p2p_ucx_wire_blob((uintptr_t)o->arena, o->arena_size, addr, addr_len,
                                        rkey, rkey_len, &s->blob_len);
        if (!s->blob)
            st = UCS_ERR_NO_MEMORY;
    }
    if (rkey)
        s->api.ucp_rkey_buffer_release(rkey);
    if (addr)
        s->api.ucp_worker_release_address(s->worker, addr);
    if (st != UCS_OK)
        snprintf(err, errlen, "p2p channel (ucx): %s (UCX_TLS and the other UCX_ variables "
                 "choose the transports)", s->api.ucs_status_string(st));
    return st == UCS_OK ? 0 : -1;
}

static void ucx_teardown(lmc_p2p_ucx_server *s)
{
    if (s->memh)
        s->api.ucp_mem_unmap(s->ctx, s->memh);
    if (s->worker)
        s->api.ucp_worker_destroy(s->worker);
    if (s->ctx)
        s->api.ucp_cleanup(s->ctx);
    free(s->blob);
    lmc_p2p_ucx_api_unload(&s->api);
}

lmc_p2p_ucx_server *lmc_p2p_ucx_server_start(const lmc_p2p_chan_server_opts *o, char *err,
                                             size_t errlen)
{
    if (!o->arena || !o->arena_size) {
        snprintf(err, errlen, "p2p channel (ucx): an empty arena cannot be registered");
        return NULL;
    }
    lmc_p2p_ucx_server *s = calloc(1, sizeof *s);
    if (!s) {
        snprintf(err, errlen, "p2p channel (ucx): out of memory");
        return NULL;
    }
    s->listen_fd = s->stop_pipe[0] = s->stop_pipe[1] = -1;
    s->io_timeout_ms = o->io_timeout_ms > 0 ? o->io_timeout_ms : 30000;
    s->token = lmc_p2p_auth_wanted(o->auth_token) ? strdup(o->auth_token) : NULL;
    if (lmc_p2p_auth_wanted(o->auth_token) && !s->token)
        snprintf(err, errlen, "p2p channel (ucx): out of memory");
    if ((lmc_p2p_auth_wanted(o->auth_token) && !s->token) ||
        lmc_p2p_ucx_api_load(&s->api, err, errlen)) {
        free(s->token);
        free(s);
        return NULL;
    }
    if (ucx_setup(s, o, err, errlen))
        goto fail;
    if (pipe2(s->stop_pipe, O_CLOEXEC)) {
        snprintf(err, errlen, "p2p channel (ucx): out of file descriptors");
        goto fail;
    }
    s->listen_fd = lmc_p2p_io_listen(o->listen_url, &s->port, err, errlen);
    if (s->listen_fd < 0 || pthread_create(&s->th, NULL, server_main, s) != 0) {
        if (s->listen_fd >= 0)
            snprintf(err, errlen, "p2p channel (ucx): cannot start its thread");
        goto fail;
    }
    s->boot_started = pthread_create(&s->boot_th, NULL, boot_main, s) == 0;
    if (!s->boot_started) {
        snprintf(err, errlen, "p2p channel (ucx): cannot start its thread");
        lmc_p2p_ucx_server_stop(s);
        return NULL;
    }
    return s;
fail:
    if (s->listen_fd >= 0)
        close(s->listen_fd);
    if (s->stop_pipe[0] >= 0) {
        close(s->stop_pipe[0]);
        close(s->stop_pipe[1]);
    }
    ucx_teardown(s);
    free(s->token);
    free(s);
    return NULL;
}

int lmc_p2p_ucx_server_port(const lmc_p2p_ucx_server *s) { return s->port; }

void lmc_p2p_ucx_server_stop(lmc_p2p_ucx_server *s)
{
    if (!s)
        return;
    while (write(s->stop_pipe[1], "x", 1) < 0 && errno == EINTR) {
    }
    pthread_join(s->th, NULL);
    if (s->boot_started)
        pthread_join(s->boot_th, NULL);
    close(s->listen_fd);
    close(s->stop_pipe[0]);
    close(s->stop_pipe[1]);
    ucx_teardown(s);
    free(s->token);
    free(s);
}

uint64_t lmc_p2p_ucx_server_auth_failures(const lmc_p2p_ucx_server *s)
{
    return atomic_load(&s->auth_failures);
}
