/* The ucx engine's reading side (p2p_ucx.h, docs/p2p.md): the bootstrap
 * over TCP, then one ucp_get_nbx per item, progressed until every item
 * completes or the read's deadline, when the endpoint is closed by force
 * so that nothing can still land in a destination after the call. */
#include "p2p/p2p_ucx.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "obs/log.h"
#include "p2p/p2p_auth.h"
#include "p2p/p2p_io.h"
#include "p2p/p2p_ucx_api.h"
#include "p2p/p2p_ucx_wire.h"

struct lmc_p2p_ucx_client {
    lmc_p2p_ucx_api api;
    lmc_p2p_chan_client_opts o;
    uint8_t holder[LMC_P2P_AUTH_MAX_HOLDER];   /* o.holder's copy */
    char host[256], port[8];
    pthread_mutex_t mu;
    ucp_context_h ctx;
    ucp_worker_h worker;
    ucp_ep_h ep;             /* NULL: not connected */
    ucp_rkey_h rkey;
    uint64_t base, size;     /* the peer's arena */
    bool failed;             /* the endpoint reported an error */
};

static void ep_error(void *arg, ucp_ep_h ep, ucs_status_t status)
{
    (void)ep;
    (void)status;
    ((lmc_p2p_ucx_client *)arg)->failed = true;
}

/* Waits for a request of the client's worker, at most until the deadline (-1:
 * until done); its final status, or UCS_ERR_TIMED_OUT. */
static ucs_status_t wait_req(lmc_p2p_ucx_client *c, void *req, int64_t deadline)
{
    if (!UCS_PTR_IS_PTR(req))
        return UCS_PTR_STATUS(req);
    ucs_status_t st;
    while ((st = c->api.ucp_request_check_status(req)) == UCS_INPROGRESS) {
        if (deadline >= 0 && lmc_p2p_io_now_ms() > deadline)
            return UCS_ERR_TIMED_OUT;
        c->api.ucp_worker_progress(c->worker);
    }
    c->api.ucp_request_free(req);
    return st;
}

/* A fresh worker in place of one whose requests cannot complete (a peer
 * dead under a transport without failure detection, shared memory among
 * them): destroying it releases them, and nothing can land afterwards.
 * Without a worker the client fails every read until it is closed. */
static void renew_worker(lmc_p2p_ucx_client *c)
{
    ucp_worker_params_t wp = {.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
                              .thread_mode = UCS_THREAD_MODE_SINGLE};
    c->api.ucp_worker_destroy(c->worker);
    if (c->api.ucp_worker_create(c->ctx, &wp, &c->worker) != UCS_OK)
        c->worker = NULL;
}

static void disconnect(lmc_p2p_ucx_client *c)
{
    if (c->rkey)
        c->api.ucp_rkey_destroy(c->rkey);
    c->rkey = NULL;
    if (c->ep) {
        ucp_request_param_t p = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
                                 .flags = UCP_EP_CLOSE_FLAG_FORCE};
        if (wait_req(c, c->api.ucp_ep_close_nbx(c->ep, &p), lmc_p2p_io_now_ms() + 1000) ==
            UCS_ERR_TIMED_OUT)
            renew_worker(c);
    }
    c->ep = NULL;
    c->failed = false;
}

/* The bootstrap answer, read whole by the deadline into *blob. */
static int fetch_blob(lmc_p2p_ucx_client *c, int64_t deadline, lmc_p2p_ucx_hdr *h,
                      uint8_t **blob)
{
    int64_t cd = lmc_p2p_io_now_ms() + c->o.connect_timeout_ms;
    int fd = lmc_p2p_io_dial(c->host, c->port, cd < deadline ? cd : deadline);
    if (fd < 0)
        return -1;
    uint8_t hdr[LMC_P2P_UCX_HDR];
    *blob = NULL;
    if ((!c->o.auth_token || lmc_p2p_auth_client(fd, c->o.auth_token, c->holder, c->o.holder_len, deadline) == 0) &&
        lmc_p2p_io_full(fd, hdr, sizeof hdr, false, -1, deadline, -1) == 0 &&
        lmc_p2p_ucx_wire_hdr(hdr, h) == 0 &&
        (*blob = malloc((size_t)h->addr_len + h->rkey_len)) != NULL &&
        lmc_p2p_io_full(fd, *blob, (size_t)h->addr_len + h->rkey_len, false, -1, deadline,
                        -1) == 0) {
        close(fd);
        return 0;
    }
    free(*blob);
    close(fd);
    return -1;
}

static int connect_peer(lmc_p2p_ucx_client *c, int64_t deadline)
{
    lmc_p2p_ucx_hdr h;
    uint8_t *blob;
    if (fetch_blob(c, deadline, &h, &blob))
        return -1;
    ucp_ep_params_t ep = {.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS |
                                        UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                                        UCP_EP_PARAM_FIELD_ERR_HANDLER,
                          .address = (const ucp_address_t *)blob,
                          .err_mode = UCP_ERR_HANDLING_MODE_PEER,
                          .err_handler = {.cb = ep_error, .arg = c}};
    ucs_status_t st = c->api.ucp_ep_create(c->worker, &ep, &c->ep);
    if (st != UCS_OK) {
        /* UCX's shared-memory transports have no peer failure detection;
         * there the read's deadline alone bounds a dead peer. */
        ep.err_mode = UCP_ERR_HANDLING_MODE_NONE;
        st = c->api.ucp_ep_create(c->worker, &ep, &c->ep);
    }
    if (st == UCS_OK)
        st = c->api.ucp_ep_rkey_unpack(c->ep, blob + h.addr_len, &c->rkey);
    free(blob);
    if (st != UCS_OK) {
        LMC_WARN_LIMITED("p2p channel (ucx): cannot reach %s:%s: %s", c->host, c->port,
                         c->api.ucs_status_string(st));
        disconnect(c);
        return -1;
    }
    c->base = h.base;
    c->size = h.size;
    return 0;
}

/* Issues the GET of one item; *req is the request to wait for, or NULL
 * when it completed at once (*done says how). */
static void issue(lmc_p2p_ucx_client *c, const lmc_p2p_chan_item *it, void **req, bool *done)
{
    *req = NULL;
    *done = false;
    if (!it->dst || it->len == 0 || it->remote_off > c->size ||
        it->len > c->size - it->remote_off)
        return;   /* outside the peer's arena: fails here */
    ucp_request_param_t p = {.op_attr_mask = 0};
    void *r = c->api.ucp_get_nbx(c->ep, it->dst, it->len, c->base + it->remote_off, c->rkey, &p);
    if (UCS_PTR_IS_PTR(r))
        *req = r;
    else
        *done = UCS_PTR_STATUS(r) == UCS_OK;
}

/* Progresses until every request completes, the deadline passes or the
 * endpoint fails; returns how many are still pending. */
static size_t progress_all(lmc_p2p_ucx_client *c, void **reqs, size_t n, int64_t deadline,
                           bool *ok)
{
    size_t pending = 0;
    for (size_t i = 0; i < n; i++)
        pending += reqs[i] != NULL;
    while (pending && !c->failed && lmc_p2p_io_now_ms() <= deadline) {
        c->api.ucp_worker_progress(c->worker);
        for (size_t i = 0; i < n; i++) {
            if (!reqs[i])
                continue;
            ucs_status_t st = c->api.ucp_request_check_status(reqs[i]);
            if (st == UCS_INPROGRESS)
                continue;
            ok[i] = st == UCS_OK;
            c->api.ucp_request_free(reqs[i]);
            reqs[i] = NULL;
            pending--;
        }
    }
    return pending;
}

size_t lmc_p2p_ucx_client_read(lmc_p2p_ucx_client *c, const lmc_p2p_chan_item *items, size_t n,
                               int timeout_ms, bool *ok)
{
    for (size_t i = 0; i < n; i++)
        ok[i] = false;
    void **reqs = n ? calloc(n, sizeof *reqs) : NULL;
    if (!reqs)
        return 0;
    pthread_mutex_lock(&c->mu);
    int64_t deadline = lmc_p2p_io_now_ms() + (timeout_ms > 0 ? timeout_ms : 0);
    if (c->ep && c->failed)
        disconnect(c);
    size_t m = n < c->o.max_items ? n : c->o.max_items;
    uint64_t bytes = 0;
    if (c->worker && (c->ep || connect_peer(c, deadline) == 0)) {
        for (size_t i = 0; i < m; i++) {
            if (items[i].len > c->o.max_request_bytes - bytes)
                continue;
            bytes += items[i].len;
            issue(c, &items[i], &reqs[i], &ok[i]);
        }
        if (progress_all(c, reqs, m, deadline, ok) > 0 || c->failed) {
            /* Closing by force completes what is left, with an error, so
             * that no byte lands after this call returns. */
            disconnect(c);
            if (progress_all(c, reqs, m, lmc_p2p_io_now_ms() + 200, ok) > 0)
                renew_worker(c);   /* requests a dead peer will never answer */
            for (size_t i = 0; i < m; i++)
                ok[i] = ok[i] && !reqs[i];
        }
    }
    pthread_mutex_unlock(&c->mu);
    free(reqs);
    size_t got = 0;
    for (size_t i = 0; i < n; i++)
        got += ok[i];
    return got;
}

lmc_p2p_ucx_client *lmc_p2p_ucx_client_open(const lmc_p2p_chan_client_opts *o, char *err,
                                            size_t errlen)
{
    lmc_p2p_ucx_client *c = calloc(1, sizeof *c);
    if (!c) {
        snprintf(err, errlen, "p2p channel (ucx): out of memory");
        return NULL;
    }
    if (!lmc_p2p_io_split_url(o->url, c->host, sizeof c->host, c->port, sizeof c->port) ||
        !c->host[0]) {
        snprintf(err, errlen, "p2p channel: peer URL '%s' is not host:port", o->url ? o->url : "");
        free(c);
        return NULL;
    }
    c->o = *o;
    c->o.url = NULL;
    c->o.auth_token = lmc_p2p_auth_wanted(o->auth_token) ? strdup(o->auth_token) : NULL;
    if (lmc_p2p_auth_wanted(o->auth_token) && !c->o.auth_token) {
        snprintf(err, errlen, "p2p channel (ucx): out of memory");
        free(c);
        return NULL;
    }
    if (c->o.holder_len > LMC_P2P_AUTH_MAX_HOLDER)
        c->o.holder_len = LMC_P2P_AUTH_MAX_HOLDER;
    if (c->o.holder_len)
        memcpy(c->holder, o->holder, c->o.holder_len);
    c->o.holder = NULL;
    if (c->o.connect_timeout_ms <= 0)
        c->o.connect_timeout_ms = 3000;
    if (!c->o.max_items)
        c->o.max_items = 65536;
    if (!c->o.max_request_bytes)
        c->o.max_request_bytes = 1ull << 30;
    if (lmc_p2p_ucx_api_load(&c->api, err, errlen)) {
        free((char *)c->o.auth_token);
        free(c);
        return NULL;
    }
    ucp_params_t p = {.field_mask = UCP_PARAM_FIELD_FEATURES, .features = UCP_FEATURE_RMA};
    ucp_worker_params_t wp = {.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
                              .thread_mode = UCS_THREAD_MODE_SINGLE};
    ucs_status_t st = c->api.ucp_init_version(UCP_API_MAJOR, UCP_API_MINOR, &p, NULL, &c->ctx);
    if (st == UCS_OK && (st = c->api.ucp_worker_create(c->ctx, &wp, &c->worker)) != UCS_OK)
        c->api.ucp_cleanup(c->ctx);
    if (st != UCS_OK) {
        snprintf(err, errlen, "p2p channel (ucx): %s", c->api.ucs_status_string(st));
        lmc_p2p_ucx_api_unload(&c->api);
        free((char *)c->o.auth_token);
        free(c);
        return NULL;
    }
    pthread_mutex_init(&c->mu, NULL);
    return c;
}

void lmc_p2p_ucx_client_close(lmc_p2p_ucx_client *c)
{
    if (!c)
        return;
    disconnect(c);
    if (c->worker)
        c->api.ucp_worker_destroy(c->worker);
    c->api.ucp_cleanup(c->ctx);
    lmc_p2p_ucx_api_unload(&c->api);
    pthread_mutex_destroy(&c->mu);
    free((char *)c->o.auth_token);
    free(c);
}
