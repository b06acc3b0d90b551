/* The tcp transfer channel's client (p2p_chan.h, docs/p2p.md "Transfer
 * channel"): one request per read, the reply received straight into the
 * caller's buffers.  No length from the wire sizes anything: the reply must
 * echo the request's id and item count exactly, and every item's bytes are
 * the length this side asked for, which its destination holds. */
#include "p2p/p2p_chan.h"

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "obs/log.h"
#include "p2p/p2p_auth.h"
#include "p2p/p2p_io.h"
#include "p2p/p2p_wire.h"

struct lmc_p2p_chan_client {
    lmc_p2p_chan_client_opts o;
    char host[256], port[8];
    pthread_mutex_t mu;
    int fd;                  /* -1: not connected */
    bool handshaken;
    uint32_t next_id;
    uint8_t holder[LMC_P2P_AUTH_MAX_HOLDER];   /* o.holder's copy */
};

static void client_defaults(lmc_p2p_chan_client_opts *o)
{
    if (o->connect_timeout_ms <= 0)
        o->connect_timeout_ms = 3000;
    if (!o->max_items)
        o->max_items = 65536;
    if (!o->max_request_bytes)
        o->max_request_bytes = 1ull << 30;
}

static lmc_p2p_chan_client *client_new(const lmc_p2p_chan_client_opts *o)
{
    lmc_p2p_chan_client *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    c->o = *o;
    c->o.url = NULL;   /* not kept: the caller's string */
    c->o.auth_token = lmc_p2p_auth_wanted(o->auth_token) ? strdup(o->auth_token) : NULL;
    if (lmc_p2p_auth_wanted(o->auth_token) && !c->o.auth_token) {
        free(c);
        return NULL;
    }
    client_defaults(&c->o);
    if (c->o.holder_len > LMC_P2P_AUTH_MAX_HOLDER)
        c->o.holder_len = LMC_P2P_AUTH_MAX_HOLDER;
    if (c->o.holder_len)
        memcpy(c->holder, o->holder, c->o.holder_len);
    c->o.holder = NULL;   /* not kept: the caller's bytes */
    c->fd = -1;
    pthread_mutex_init(&c->mu, NULL);
    return c;
}

lmc_p2p_chan_client *lmc_p2p_chan_client_open(const lmc_p2p_chan_client_opts *o, char *err,
                                              size_t errlen)
{
    char host[256], port[8];
    if (!lmc_p2p_io_split_url(o->url, host, sizeof host, port, sizeof port) || !host[0]) {
        snprintf(err, errlen, "p2p channel: peer URL '%s' is not host:port", o->url ? o->url : "");
        return NULL;
    }
    lmc_p2p_chan_client *c = client_new(o);
    if (!c) {
        snprintf(err, errlen, "p2p channel: out of memory");
        return NULL;
    }
    memcpy(c->host, host, sizeof host);
    memcpy(c->port, port, sizeof port);
    return c;
}

lmc_p2p_chan_client *lmc_p2p_chan_client_from_fd(int fd, const lmc_p2p_chan_client_opts *o)
{
    lmc_p2p_chan_client *c = client_new(o);
    if (!c) {
        close(fd);
        return NULL;
    }
    c->fd = fd;
    return c;
}

static void drop(lmc_p2p_chan_client *c)
{
    if (c->fd >= 0)
        close(c->fd);
    c->fd = -1;
    c->handshaken = false;
}

static int ensure_connected(lmc_p2p_chan_client *c, int64_t deadline)
{
    if (c->fd >= 0 && c->handshaken)
        return 0;
    if (c->fd < 0) {
        int64_t cd = lmc_p2p_io_now_ms() + c->o.connect_timeout_ms;
        c->fd = lmc_p2p_io_dial(c->host, c->port, cd < deadline ? cd : deadline);
        if (c->fd < 0)
            return -1;
    }
    char magic[LMC_P2P_MAGIC_LEN];
    if ((c->o.auth_token && lmc_p2p_auth_client(c->fd, c->o.auth_token, c->holder, c->o.holder_len, deadline) != 0) ||
        lmc_p2p_io_full(c->fd, (void *)LMC_P2P_MAGIC, LMC_P2P_MAGIC_LEN, true, -1, deadline, -1) ||
        lmc_p2p_io_full(c->fd, magic, sizeof magic, false, -1, deadline, -1) ||
        memcmp(magic, LMC_P2P_MAGIC, sizeof magic) != 0) {
        drop(c);
        return -1;
    }
    c->handshaken = true;
    return 0;
}

/* The items worth asking for, by index: those the wire can carry (a length
 * and an offset below 2^63, the i64s upstream sends; no empty range) within
 * this side's per-request bounds.  The rest fail here. */
static uint32_t pick(const lmc_p2p_chan_client *c, const lmc_p2p_chan_item *items, size_t n,
                     uint32_t *sent)
{
    uint32_t k = 0;
    uint64_t bytes = 0;
    for (size_t i = 0; i < n && k < c->o.max_items; i++) {
        const lmc_p2p_chan_item *it = &items[i];
        if (!it->dst || it->len == 0 || it->len > INT64_MAX || it->remote_off > INT64_MAX ||
            it->len > c->o.max_request_bytes - bytes)
            continue;
        bytes += it->len;
        sent[k++] = (uint32_t)i;
    }
    return k;
}

static int send_request(lmc_p2p_chan_client *c, const lmc_p2p_chan_item *items,
                        const uint32_t *sent, uint32_t k, uint32_t req_id, int64_t deadline)
{
    size_t len = LMC_P2P_REQ_HDR + (size_t)k * LMC_P2P_REQ_ITEM;
    uint8_t *buf = malloc(len);
    if (!buf)
        return -1;
    lmc_p2p_wire_put_req_header(buf, req_id, k);
    for (uint32_t j = 0; j < k; j++)
        lmc_p2p_wire_put_req_item(buf + LMC_P2P_REQ_HDR + (size_t)j * LMC_P2P_REQ_ITEM,
                                  items[sent[j]].remote_off, items[sent[j]].len);
    int r = lmc_p2p_io_full(c->fd, buf, len, true, -1, deadline, -1);
    free(buf);
    return r;
}

/* The reply, straight into the destinations; ok[] set per item received
 * whole.  -1 when the stream can no longer be trusted (the connection is
 * then dropped by the caller). */
static int recv_reply(lmc_p2p_chan_client *c, const lmc_p2p_chan_item *items,
                      const uint32_t *sent, uint32_t k, uint32_t req_id, int64_t deadline,
                      bool *ok, size_t *got)
{
    uint8_t hdr[LMC_P2P_RESP_HDR];
    if (lmc_p2p_io_full(c->fd, hdr, sizeof hdr, false, -1, deadline, -1))
        return -1;
    if (lmc_p2p_wire_resp_header(hdr, req_id, k) != LMC_P2P_WIRE_OK) {
        LMC_WARN_LIMITED("p2p channel: a reply that does not answer the request; "
                         "dropping the connection");
        return -1;
    }
    size_t mlen = lmc_p2p_wire_mask_len(k);
    uint8_t *mask = malloc(mlen);
    if (!mask || lmc_p2p_io_full(c->fd, mask, mlen, false, -1, deadline, -1)) {
        free(mask);
        return -1;
    }
    int r = 0;
    for (uint32_t j = 0; j < k && r == 0; j++) {
        if (!lmc_p2p_wire_mask_get(mask, j))
            continue;
        const lmc_p2p_chan_item *it = &items[sent[j]];
        r = lmc_p2p_io_full(c->fd, it->dst, it->len, false, -1, deadline, -1);
        if (r == 0) {
            ok[sent[j]] = true;
            (*got)++;
        }
    }
    free(mask);
    return r;
}

size_t lmc_p2p_chan_client_read(lmc_p2p_chan_client *c, const lmc_p2p_chan_item *items, size_t n,
                                int timeout_ms, bool *ok)
{
    for (size_t i = 0; i < n; i++)
        ok[i] = false;
    size_t want = n < c->o.max_items ? n : c->o.max_items;
    uint32_t *sent = want ? malloc(want * sizeof *sent) : NULL;
    if (!sent)
        return 0;
    size_t got = 0;
    pthread_mutex_lock(&c->mu);
    int64_t deadline = lmc_p2p_io_now_ms() + (timeout_ms > 0 ? timeout_ms : 0);
    uint32_t k = pick(c, items, n, sent);
    uint32_t req_id = c->next_id++;
    if (k > 0 && (ensure_connected(c, deadline) ||
                  send_request(c, items, sent, k, req_id, deadline) ||
                  recv_reply(c, items, sent, k, req_id, deadline, ok, &got)))
        drop(c);
    pthread_mutex_unlock(&c->mu);
    free(sent);
    return got;
}

void lmc_p2p_chan_client_close(lmc_p2p_chan_client *c)
{
    if (!c)
        return;
    drop(c);
    pthread_mutex_destroy(&c->mu);
    free((char *)c->o.auth_token);
    free(c);
}
