/* The tcp transfer channel's server (p2p_chan.h, docs/p2p.md "Transfer
 * channel"): one thread per connection, at most max_conns of them; every
 * range is checked against the arena and the lease callback before a byte
 * of it is sent. */
#include "p2p/p2p_chan.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "obs/log.h"
#include "p2p/p2p_auth.h"
#include "p2p/p2p_io.h"
#include "p2p/p2p_wire.h"

typedef struct {
    _Atomic uint64_t bytes_served, items_served, items_refused, conns_accepted, conns_rejected,
        conns_active, protocol_errors, auth_failures;
} atomic_stats;

typedef struct conn_slot {
    struct lmc_p2p_chan_server *srv;
    pthread_t th;
    int fd;
    bool joinable;           /* a thread was started and not yet joined */
    _Atomic bool busy;       /* the thread is still serving */
} conn_slot;

struct lmc_p2p_chan_server {
    lmc_p2p_chan_server_opts o;
    int listen_fd, port;
    int stop_pipe[2];        /* readable once stop begins: wakes every poll */
    pthread_t acceptor;
    conn_slot *slots;
    atomic_stats st;
};

static void defaults(lmc_p2p_chan_server_opts *o)
{
    if (!o->max_conns)
        o->max_conns = 16;
    if (!o->max_items)
        o->max_items = 65536;
    if (o->io_timeout_ms <= 0)
        o->io_timeout_ms = 30000;
}

static void add(_Atomic uint64_t *counter, uint64_t v)
{
    atomic_fetch_add_explicit(counter, v, memory_order_relaxed);
}

/* Who reads on a connection: the lease holder it named in the token
 * handshake, if any (p2p_chan.h, lmc_p2p_may_read_fn). */
typedef struct reader_id {
    uint8_t id[LMC_P2P_AUTH_MAX_HOLDER];
    size_t len;
    bool named;
} reader_id;

/* Answers one request whose n items are in `raw`: the mask, then the
 * bytes of every range the arena holds and the lease allows. */
static int answer(const lmc_p2p_chan_server_opts *o, int fd, int stop_fd, const reader_id *who,
                  uint32_t req_id, uint32_t n, const uint8_t *raw, uint8_t *mask,
                  atomic_stats *st)
{
    size_t mlen = lmc_p2p_wire_mask_len(n);
    if (mlen)   /* an empty request is answered too, with no mask (and no buffer yet) */
        memset(mask, 0, mlen);
    for (uint32_t i = 0; i < n; i++) {
        uint64_t off, len;
        lmc_p2p_wire_req_item(raw + (size_t)i * LMC_P2P_REQ_ITEM, &off, &len);
        bool ok = lmc_p2p_wire_range_ok(off, len, o->arena_size) &&
                  (!o->may_read || o->may_read(o->may_read_user, who->named ? who->id : NULL,
                                               who->len, off, len));
        if (ok)
            mask[i / 8] |= (uint8_t)(1u << (i % 8));
        else
            add(&st->items_refused, 1);
    }
    uint8_t hdr[LMC_P2P_RESP_HDR];
    lmc_p2p_wire_put_resp_header(hdr, req_id, n);
    if (lmc_p2p_io_full(fd, hdr, sizeof hdr, true, stop_fd, -1, o->io_timeout_ms) ||
        lmc_p2p_io_full(fd, mask, mlen, true, stop_fd, -1, o->io_timeout_ms))
        return -1;
    for (uint32_t i = 0; i < n; i++) {
        if (!lmc_p2p_wire_mask_get(mask, i))
            continue;
        uint64_t off, len;
        lmc_p2p_wire_req_item(raw + (size_t)i * LMC_P2P_REQ_ITEM, &off, &len);
        if (lmc_p2p_io_full(fd, (char *)o->arena + off, len, true, stop_fd, -1, o->io_timeout_ms))
            return -1;
        add(&st->bytes_served, len);
        add(&st->items_served, 1);
    }
    return 0;
}

/* One request: its header (waited for without bound: an idle connection is
 * a peer's persistent channel), its items within the stall bound, the
 * answer.  1: served, 0: the peer closed or stop, -1: a protocol error. */
static int serve_one(const lmc_p2p_chan_server_opts *o, int fd, int stop_fd,
                     const reader_id *who, uint8_t **raw,
                     uint8_t **mask, uint32_t *cap, atomic_stats *st)
{
    uint8_t hdr[LMC_P2P_REQ_HDR];
    if (lmc_p2p_io_full(fd, hdr, 1, false, stop_fd, -1, -1))
        return 0;
    if (lmc_p2p_io_full(fd, hdr + 1, sizeof hdr - 1, false, stop_fd, -1, o->io_timeout_ms))
        return -1;
    uint32_t req_id, n;
    lmc_p2p_wire_status ws = lmc_p2p_wire_req_header(hdr, o->max_items, &req_id, &n);
    if (ws != LMC_P2P_WIRE_OK) {
        LMC_WARN_LIMITED("p2p channel: a request with %s; closing the connection",
                         ws == LMC_P2P_WIRE_BAD_TYPE ? "an unknown message type"
                                                     : "more items than the bound");
        return -1;
    }
    if (n > *cap) {   /* n <= max_items, so n * 16 cannot overflow */
        uint8_t *r = realloc(*raw, (size_t)n * LMC_P2P_REQ_ITEM);
        uint8_t *m = r ? realloc(*mask, lmc_p2p_wire_mask_len(n)) : NULL;
        if (r)
            *raw = r;
        if (!m)
            return -1;
        *mask = m;
        *cap = n;
    }
    if (lmc_p2p_io_full(fd, *raw, (size_t)n * LMC_P2P_REQ_ITEM, false, stop_fd, -1,
                        o->io_timeout_ms))
        return -1;
    return answer(o, fd, stop_fd, who, req_id, n, *raw, *mask, st) ? -1 : 1;
}

static void serve_conn(const lmc_p2p_chan_server_opts *opts, int fd, int stop_fd,
                       atomic_stats *st)
{
    lmc_p2p_chan_server_opts o = *opts;
    defaults(&o);
    reader_id who = {.named = false};
    if (lmc_p2p_auth_wanted(o.auth_token)) {
        if (lmc_p2p_auth_server(fd, o.auth_token, stop_fd, lmc_p2p_io_now_ms() + o.io_timeout_ms,
                                who.id, &who.len)) {
            add(&st->auth_failures, 1);
            return;
        }
        who.named = true;   /* an empty holder owns nothing: it reads nothing */
    }
    char magic[LMC_P2P_MAGIC_LEN];
    if (lmc_p2p_io_full(fd, magic, sizeof magic, false, stop_fd, -1, o.io_timeout_ms) ||
        memcmp(magic, LMC_P2P_MAGIC, sizeof magic) != 0 ||
        lmc_p2p_io_full(fd, (void *)LMC_P2P_MAGIC, LMC_P2P_MAGIC_LEN, true, stop_fd, -1,
                        o.io_timeout_ms)) {
        add(&st->protocol_errors, 1);
        return;
    }
    uint8_t *raw = NULL, *mask = NULL;
    uint32_t cap = 0;
    int r;
    while ((r = serve_one(&o, fd, stop_fd, &who, &raw, &mask, &cap, st)) == 1) {
    }
    if (r < 0)
        add(&st->protocol_errors, 1);
    free(raw);
    free(mask);
}

static void stats_copy(const atomic_stats *a, lmc_p2p_chan_server_stats *out)
{
    out->bytes_served = atomic_load(&a->bytes_served);
    out->items_served = atomic_load(&a->items_served);
    out->items_refused = atomic_load(&a->items_refused);
    out->conns_accepted = atomic_load(&a->conns_accepted);
    out->conns_rejected = atomic_load(&a->conns_rejected);
    out->conns_active = atomic_load(&a->conns_active);
    out->protocol_errors = atomic_load(&a->protocol_errors);
    out->auth_failures = atomic_load(&a->auth_failures);
}

void lmc_p2p_chan_serve_fd(const lmc_p2p_chan_server_opts *o, int fd, int stop_fd,
                           lmc_p2p_chan_server_stats *out)
{
    atomic_stats st = {0};
    serve_conn(o, fd, stop_fd, &st);
    if (out)
        stats_copy(&st, out);
}

static void *conn_main(void *arg)
{
    conn_slot *slot = arg;
    lmc_p2p_chan_server *s = slot->srv;
    serve_conn(&s->o, slot->fd, s->stop_pipe[0], &s->st);
    shutdown(slot->fd, SHUT_RDWR);   /* the peer sees the end now; the fd is closed at retire */
    atomic_fetch_sub(&s->st.conns_active, 1);
    atomic_store_explicit(&slot->busy, false, memory_order_release);
    return NULL;
}

/* The slot's finished thread is joined and its socket closed here, by the
 * one thread that reuses or retires slots, so that no fd is closed while
 * another thread may still use its number. */
static void slot_retire(conn_slot *slot)
{
    if (!slot->joinable)
        return;
    pthread_join(slot->th, NULL);
    close(slot->fd);
    slot->joinable = false;
}

static void take_conn(lmc_p2p_chan_server *s, int fd)
{
    conn_slot *free_slot = NULL;
    for (unsigned i = 0; i < s->o.max_conns && !free_slot; i++)
        if (!atomic_load_explicit(&s->slots[i].busy, memory_order_acquire))
            free_slot = &s->slots[i];
    if (!free_slot) {
        atomic_fetch_add(&s->st.conns_rejected, 1);
        LMC_WARN_LIMITED("p2p channel: %u connections already; refusing one more",
                         s->o.max_conns);
        close(fd);
        return;
    }
    slot_retire(free_slot);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    free_slot->fd = fd;
    atomic_store(&free_slot->busy, true);
    atomic_fetch_add(&s->st.conns_accepted, 1);
    atomic_fetch_add(&s->st.conns_active, 1);
    if (pthread_create(&free_slot->th, NULL, conn_main, free_slot) != 0) {
        atomic_store(&free_slot->busy, false);
        atomic_fetch_sub(&s->st.conns_active, 1);
        close(fd);
        return;
    }
    free_slot->joinable = true;
}

static void *accept_main(void *arg)
{
    lmc_p2p_chan_server *s = arg;
    for (;;) {
        struct pollfd pf[2] = {{.fd = s->listen_fd, .events = POLLIN},
                               {.fd = s->stop_pipe[0], .events = POLLIN}};
        if (poll(pf, 2, -1) < 0 && errno != EINTR)
            break;
        if (pf[1].revents)
            break;
        if (!(pf[0].revents & POLLIN))
            continue;
        int fd = accept4(s->listen_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd >= 0)
            take_conn(s, fd);
        else if (errno == EMFILE || errno == ENFILE)
            poll(NULL, 0, 100);   /* out of fds: let connections finish first */
    }
    return NULL;
}

lmc_p2p_chan_server *lmc_p2p_chan_server_start(const lmc_p2p_chan_server_opts *o, char *err,
                                               size_t errlen)
{
    if (!o->arena && o->arena_size) {
        snprintf(err, errlen, "p2p channel: an arena of %llu bytes at NULL",
                 (unsigned long long)o->arena_size);
        return NULL;
    }
    lmc_p2p_chan_server *s = calloc(1, sizeof *s);
    if (!s) {
        snprintf(err, errlen, "p2p channel: out of memory");
        return NULL;
    }
    s->o = *o;
    defaults(&s->o);
    s->o.auth_token = lmc_p2p_auth_wanted(o->auth_token) ? strdup(o->auth_token) : NULL;
    s->stop_pipe[0] = s->stop_pipe[1] = -1;
    s->slots = calloc(s->o.max_conns, sizeof *s->slots);
    if (!s->slots || pipe2(s->stop_pipe, O_CLOEXEC) ||
        (lmc_p2p_auth_wanted(o->auth_token) && !s->o.auth_token)) {
        snprintf(err, errlen, "p2p channel: out of memory or file descriptors");
        goto fail;
    }
    for (unsigned i = 0; i < s->o.max_conns; i++)
        s->slots[i].srv = s;
    s->listen_fd = lmc_p2p_io_listen(o->listen_url, &s->port, err, errlen);
    if (s->listen_fd < 0)
        goto fail;
    if (pthread_create(&s->acceptor, NULL, accept_main, s) != 0) {
        snprintf(err, errlen, "p2p channel: cannot start the accept thread");
        close(s->listen_fd);
        goto fail;
    }
    return s;
fail:
    if (s->stop_pipe[0] >= 0) {
        close(s->stop_pipe[0]);
        close(s->stop_pipe[1]);
    }
    free(s->slots);
    free((char *)s->o.auth_token);
    free(s);
    return NULL;
}

int lmc_p2p_chan_server_port(const lmc_p2p_chan_server *s) { return s->port; }

void lmc_p2p_chan_server_stats_get(const lmc_p2p_chan_server *s, lmc_p2p_chan_server_stats *out)
{
    stats_copy(&s->st, out);
}

void lmc_p2p_chan_server_stop(lmc_p2p_chan_server *s)
{
    if (!s)
        return;
    /* A byte that is never read: the pipe stays readable for every poll. */
    while (write(s->stop_pipe[1], "x", 1) < 0 && errno == EINTR) {
    }
    pthread_join(s->acceptor, NULL);
    close(s->listen_fd);
    for (unsigned i = 0; i < s->o.max_conns; i++)
        slot_retire(&s->slots[i]);
    close(s->stop_pipe[0]);
    close(s->stop_pipe[1]);
    free(s->slots);
    free((char *)s->o.auth_token);
    free(s);
}
