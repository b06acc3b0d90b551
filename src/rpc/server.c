#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "core/fnv.h"
#include "obs/log.h"
#include "rpc/call.h"
#include "rpc/wire.h"

#define MAX_FRAMES 64          /* more frames than any op takes: over-long message */
#define RECV_BATCH 256         /* messages per wake-up before servicing completions */
#define NAMED_OPS_MAX 64
#define ERROR_MARKER "LMCACHE_RPC_ERROR_V1"

struct handler_entry {
    lmc_rpc_handler_spec spec;
    void *ctx;
    bool used;
};

/* A streaming reply on its way to the socket thread: copies of the call's
 * prefix frames and the document. */
typedef struct rpc_partial {
    struct rpc_partial *next;
    zmq_msg_t frames[4];       /* identity, uid, op, body */
} rpc_partial;

typedef struct {
    char name[64];
    int pseudo_id;             /* > LMC_OP_FROZEN_MAX */
    handler_entry entry;
} named_handler;

struct lmc_rpc_server {
    lmc_rpc_options opts;
    void *zctx;
    void *socket;
    int done_fd;               /* eventfd: completions waiting */
    int stop_fd;               /* eventfd: lmc_rpc_server_stop() */
    lmc_pool *normal_pool;
    lmc_pool *affinity_pool;
    handler_entry frozen[LMC_OP_FROZEN_MAX + 1];
    named_handler named[NAMED_OPS_MAX];
    size_t n_named;
    pthread_mutex_t done_lock;
    lmc_rpc_call *done_head;   /* LIFO; reversed when drained */
    rpc_partial *partial_head; /* LIFO, under done_lock; sent before done_head's calls */
    atomic_bool done_pending;  /* done_head != NULL, readable without the lock */
    size_t in_flight;          /* socket thread only */
    /* drop-log rate limit (socket thread only) */
    time_t drop_log_second;
    unsigned drop_logs_this_second;
    uint64_t drops_suppressed;
    _Atomic uint64_t n_received, n_replied, n_dropped, n_error_frames, n_inlined, n_overloaded,
        n_partials;
    _Atomic uint64_t op_replied[LMC_OP_FROZEN_MAX + 1], op_failed[LMC_OP_FROZEN_MAX + 1];
};

/* ---- helpers ------------------------------------------------------------ */

static void bump(_Atomic uint64_t *counter)
{
    atomic_fetch_add_explicit(counter, 1, memory_order_relaxed);
}

/* At most 10 lines a second about dropped or refused requests, plus a
 * count of the lines suppressed: a flood cannot flood the log. */
static void log_limited(lmc_rpc_server *s, const char *what, const char *why)
{
    time_t now = time(NULL);
    if (now != s->drop_log_second) {
        if (s->drops_suppressed)
            LMC_WARN("rpc: %llu more lines about dropped or refused requests suppressed",
                     (unsigned long long)s->drops_suppressed);
        s->drop_log_second = now;
        s->drop_logs_this_second = 0;
        s->drops_suppressed = 0;
    }
    if (s->drop_logs_this_second++ < 10)
        LMC_WARN("rpc: %s: %s", what, why);
    else
        s->drops_suppressed++;
}

static void log_drop(lmc_rpc_server *s, const char *why)
{
    bump(&s->n_dropped);
    log_limited(s, "dropping request", why);
}

static uint64_t identity_hash(const uint8_t *p, size_t n)
{
    return lmc_fnv1a64(LMC_FNV1A64_SHORT_BASIS, p, n);
}

/* ---- construction ------------------------------------------------------- */

static void run_pooled_call(lmc_pool_task *task, void *user);

int lmc_rpc_server_new(const lmc_rpc_options *opts, lmc_rpc_server **out,
                       char *err, size_t errlen)
{
    lmc_rpc_server *s = calloc(1, sizeof *s);
    if (!s) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    s->opts = *opts;
    s->done_fd = s->stop_fd = -1;
    pthread_mutex_init(&s->done_lock, NULL);
    s->zctx = zmq_ctx_new();
    s->socket = s->zctx ? zmq_socket(s->zctx, ZMQ_ROUTER) : NULL;
    if (!s->socket) {
        snprintf(err, errlen, "cannot create ZMQ socket: %s", zmq_strerror(zmq_errno()));
        goto fail;
    }
    /* Finite queues and frames: no peer can make ZMQ buffer without bound
     * (docs/protocol.md, "Bounds"). */
    int linger_ms = 1000, sndhwm = LMC_RPC_SNDHWM, rcvhwm = LMC_RPC_RCVHWM;
    int64_t max_frame = LMC_RPC_MAX_MESSAGE_BYTES;
    if (zmq_setsockopt(s->socket, ZMQ_LINGER, &linger_ms, sizeof linger_ms) != 0 ||
        zmq_setsockopt(s->socket, ZMQ_SNDHWM, &sndhwm, sizeof sndhwm) != 0 ||
        zmq_setsockopt(s->socket, ZMQ_RCVHWM, &rcvhwm, sizeof rcvhwm) != 0 ||
        zmq_setsockopt(s->socket, ZMQ_MAXMSGSIZE, &max_frame, sizeof max_frame) != 0) {
        snprintf(err, errlen, "cannot set ZMQ socket options: %s", zmq_strerror(zmq_errno()));
        goto fail;
    }
    if (zmq_bind(s->socket, opts->bind_url) != 0) {
        snprintf(err, errlen, "cannot bind %s: %s", opts->bind_url, zmq_strerror(zmq_errno()));
        goto fail;
    }
    s->done_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    s->stop_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (s->done_fd < 0 || s->stop_fd < 0) {
        snprintf(err, errlen, "eventfd: %s", strerror(errno));
        goto fail;
    }
    s->normal_pool = lmc_pool_new("cpu", opts->normal_workers, 1, opts->max_queued,
                                  LMC_RPC_QUEUE_MAX_BYTES, run_pooled_call, s);
    s->affinity_pool = lmc_pool_new("gpu", opts->affinity_workers, opts->affinity_workers,
                                    opts->max_queued, LMC_RPC_QUEUE_MAX_BYTES,
                                    run_pooled_call, s);
    if (!s->normal_pool || !s->affinity_pool) {
        snprintf(err, errlen, "cannot start worker pools (%d cpu, %d gpu workers)",
                 opts->normal_workers, opts->affinity_workers);
        goto fail;
    }
    *out = s;
    return 0;
fail:
    lmc_rpc_server_free(s);
    return -1;
}

int lmc_rpc_server_register(lmc_rpc_server *s, const lmc_rpc_handler_spec *spec, void *ctx)
{
    handler_entry *slot;
    if (spec->op_id >= 1 && spec->op_id <= LMC_OP_FROZEN_MAX) {
        slot = &s->frozen[spec->op_id];
    } else {
        if (spec->op_id != 0 || !spec->op_name || s->n_named == NAMED_OPS_MAX ||
            strlen(spec->op_name) >= sizeof s->named[0].name)
            return -1;
        for (size_t i = 0; i < s->n_named; i++) {
            if (strcmp(s->named[i].name, spec->op_name) == 0)
                return -1;
        }
        named_handler *nh = &s->named[s->n_named];
        snprintf(nh->name, sizeof nh->name, "%s", spec->op_name);
        nh->pseudo_id = LMC_OP_FROZEN_MAX + 1 + (int)s->n_named;
        s->n_named++;
        slot = &nh->entry;
    }
    if (slot->used)
        return -1;
    slot->spec = *spec;
    slot->ctx = ctx;
    slot->used = true;
    return 0;
}

/* ---- completion path ---------------------------------------------------- */

static int send_frame(lmc_rpc_server *s, zmq_msg_t *m, bool more);

static void wake_socket_thread(lmc_rpc_server *s)
{
    uint64_t one = 1;
    ssize_t w = write(s->done_fd, &one, sizeof one);
    (void)w; /* a full eventfd counter still leaves the fd readable */
}

void lmc_rpc_server_enqueue_done(lmc_rpc_server *s, lmc_rpc_call *call)
{
    pthread_mutex_lock(&s->done_lock);
    bool was_empty = s->done_head == NULL && s->partial_head == NULL;
    call->next_done = s->done_head;
    s->done_head = call;
    atomic_store_explicit(&s->done_pending, true, memory_order_release);
    pthread_mutex_unlock(&s->done_lock);
    if (was_empty)
        wake_socket_thread(s);
}

static void partial_free(rpc_partial *p)
{
    for (int i = 0; i < 4; i++)
        zmq_msg_close(&p->frames[i]);
    free(p);
}

/* Queued under the same lock as completions, so a call's final reply,
 * enqueued after its partials, is never drained before them. */
int lmc_rpc_server_enqueue_partial(lmc_rpc_server *s, lmc_rpc_call *call, const void *doc,
                                   size_t len)
{
    rpc_partial *p = calloc(1, sizeof *p);
    if (!p)
        return -1;
    for (int i = 0; i < 4; i++)
        zmq_msg_init(&p->frames[i]);
    bool ok = zmq_msg_init_size(&p->frames[3], len) == 0;
    for (int i = 0; ok && i < 3; i++)
        ok = zmq_msg_copy(&p->frames[i], &call->frames[i]) == 0;
    if (!ok) {
        partial_free(p);
        return -1;
    }
    memcpy(zmq_msg_data(&p->frames[3]), doc, len);
    pthread_mutex_lock(&s->done_lock);
    bool was_empty = s->done_head == NULL && s->partial_head == NULL;
    p->next = s->partial_head;
    s->partial_head = p;
    atomic_store_explicit(&s->done_pending, true, memory_order_release);
    pthread_mutex_unlock(&s->done_lock);
    if (was_empty)
        wake_socket_thread(s);
    /* The engine waits on this reply while the handler goes on copying: on
     * a busy machine the woken socket thread may wait for this one's CPU
     * until its time slice ends (a millisecond and more), so offer it. */
    sched_yield();
    return 0;
}

/* ROUTER never blocks a send: past the peer's SNDHWM, or for a peer that
 * is gone, ZMQ drops the message (docs/protocol.md, "Streaming replies"). */
static void send_partials(lmc_rpc_server *s, rpc_partial *list)
{
    rpc_partial *ordered = NULL;
    while (list) {
        rpc_partial *next = list->next;
        list->next = ordered;
        ordered = list;
        list = next;
    }
    while (ordered) {
        rpc_partial *next = ordered->next;
        for (int i = 0; i < 4; i++)
            send_frame(s, &ordered->frames[i], i < 3);
        bump(&s->n_partials);
        partial_free(ordered);
        ordered = next;
    }
}

static int send_frame(lmc_rpc_server *s, zmq_msg_t *m, bool more)
{
    return zmq_msg_send(m, s->socket, more ? ZMQ_SNDMORE : 0) < 0 ? -1 : 0;
}

/* Sends identity, uid and op exactly as received, then `extra` frames. */
static void send_prefix(lmc_rpc_server *s, lmc_rpc_call *c, bool more_follows)
{
    send_frame(s, &c->frames[CALL_IDENTITY], true);
    send_frame(s, &c->frames[CALL_UID], true);
    send_frame(s, &c->frames[CALL_OP], more_follows);
}

static void send_error_frames(lmc_rpc_server *s, lmc_rpc_call *c)
{
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    size_t len;
    const char *body = lmc_call_error_body(c, &sb, &len);

    send_prefix(s, c, true);
    zmq_send(s->socket, ERROR_MARKER, strlen(ERROR_MARKER), ZMQ_SNDMORE);
    zmq_send(s->socket, body, len, 0);
    msgpack_sbuffer_destroy(&sb);
    bump(&s->n_error_frames);
}

static void count_op(lmc_rpc_server *s, const lmc_rpc_call *c)
{
    if (c->op_id < 1 || c->op_id > LMC_OP_FROZEN_MAX)
        return;
    bool ok = !c->overloaded && (c->result == LMC_HANDLER_REPLY || c->result == LMC_HANDLER_VOID);
    bump(ok ? &s->op_replied[c->op_id] : &s->op_failed[c->op_id]);
}

static void finish_call(lmc_rpc_server *s, lmc_rpc_call *c)
{
    c->result = lmc_call_settle(c, c->result);
    count_op(s, c);
    switch (c->result) {
    case LMC_HANDLER_REPLY: {
        /* Copied into a ZMQ-owned frame: replies are small, and this keeps
         * every free of our buffers on our own threads. */
        zmq_msg_t body;
        if (zmq_msg_init_size(&body, c->reply.size) != 0) {
            log_drop(s, "cannot allocate reply");
            break;
        }
        memcpy(zmq_msg_data(&body), c->reply.data, c->reply.size);
        send_prefix(s, c, true);
        send_frame(s, &body, false);
        bump(&s->n_replied);
        break;
    }
    case LMC_HANDLER_VOID:
        send_prefix(s, c, false);
        bump(&s->n_replied);
        break;
    case LMC_HANDLER_ERROR:
    default: {
        char why[640];
        const char *msg = c->error_message[0] ? c->error_message : "handler error";
        if (c->handler) /* an op that has a handler failed; else msg says why */
            snprintf(why, sizeof why, "%s failed: %s",
                     lmc_op_name(c->op_id) ? lmc_op_name(c->op_id) : "op", msg);
        else
            snprintf(why, sizeof why, "%s", msg);
        log_drop(s, why);
        if (s->opts.error_frames)
            send_error_frames(s, c);
        break;
    }
    }
    lmc_call_run_then(c); /* the reply is on its way (pooled calls ran it already) */
    lmc_call_free(c);
}

/* Sends every finished call.  `clear_fd` also resets the eventfd; the busy
 * path skips that syscall and lets the next poll see a stale wake-up. */
static void drain_completions(lmc_rpc_server *s, bool clear_fd)
{
    if (clear_fd) {
        uint64_t counter;
        ssize_t r = read(s->done_fd, &counter, sizeof counter);
        (void)r;
    }
    pthread_mutex_lock(&s->done_lock);
    lmc_rpc_call *list = s->done_head;
    rpc_partial *partials = s->partial_head;
    s->done_head = NULL;
    s->partial_head = NULL;
    atomic_store_explicit(&s->done_pending, false, memory_order_relaxed);
    pthread_mutex_unlock(&s->done_lock);
    send_partials(s, partials);
    lmc_rpc_call *ordered = NULL; /* reverse the LIFO into completion order */
    while (list) {
        lmc_rpc_call *next = list->next_done;
        list->next_done = ordered;
        ordered = list;
        list = next;
    }
    while (ordered) {
        lmc_rpc_call *next = ordered->next_done;
        finish_call(s, ordered);
        s->in_flight--;
        ordered = next;
    }
}

static void run_pooled_call(lmc_pool_task *task, void *user)
{
    (void)user;
    lmc_rpc_call *c = (lmc_rpc_call *)task;
    c->pooled = true;
    lmc_handler_result r = c->handler->spec.fn(c->handler->ctx, c);
    if (r != LMC_HANDLER_DEFERRED) { /* a deferred call may be gone already */
        lmc_call_run_then(c);         /* off the socket thread: before the reply */
        lmc_rpc_call_complete(c, r);
    }
}

/* ---- request path ------------------------------------------------------- */

/* Resolves the op frame (msgpack int id or str name) to a handler. */
static const handler_entry *resolve_op(lmc_rpc_server *s, zmq_msg_t *op_frame, int *op_id,
                                       char *why, size_t whylen)
{
    const uint8_t *data = zmq_msg_data(op_frame);
    size_t len = zmq_msg_size(op_frame);
    msgpack_unpacked up;
    const handler_entry *found = NULL;
    *op_id = 0;
    if (!lmc_mp_validate(data, len, 1)) {
        snprintf(why, whylen, "undecodable op frame (%zu bytes)", len);
        return NULL;
    }
    msgpack_unpacked_init(&up);
    size_t off = 0;
    msgpack_unpack_next(&up, (const char *)data, len, &off);
    const msgpack_object *o = &up.data;
    int64_t id;
    if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER && lmc_mp_get_int(o, &id)) {
        if (id >= 1 && id <= LMC_OP_FROZEN_MAX)
            *op_id = (int)id; /* counted even without a handler */
        if (*op_id && s->frozen[id].used) {
            found = &s->frozen[id];
        } else {
            snprintf(why, whylen, "no handler registered for request type %lld", (long long)id);
        }
    } else if (o->type == MSGPACK_OBJECT_STR) {
        int fid = lmc_op_id_from_name(o->via.str.ptr, o->via.str.size);
        if (fid && s->frozen[fid].used) {
            *op_id = fid;
            found = &s->frozen[fid];
        }
        for (size_t i = 0; !found && i < s->n_named; i++) {
            if (strlen(s->named[i].name) == o->via.str.size &&
                memcmp(s->named[i].name, o->via.str.ptr, o->via.str.size) == 0) {
                *op_id = s->named[i].pseudo_id;
                found = &s->named[i].entry;
            }
        }
        if (!found) {
            /* At most 64 bytes of the name, cut between characters and
             * valid UTF-8 whatever the client sent: it goes back to the
             * client in an error frame. */
            char name[65];
            lmc_utf8_sanitize(name, sizeof name, o->via.str.ptr, o->via.str.size);
            snprintf(why, whylen, "no handler registered for request type '%s'", name);
        }
    } else {
        snprintf(why, whylen, "op frame is neither an int nor a str");
    }
    msgpack_unpacked_destroy(&up);
    return found;
}

static void run_here(lmc_rpc_server *s, const handler_entry *h, lmc_rpc_call *c)
{
    c->result = h->spec.fn(h->ctx, c);
    if (c->result != LMC_HANDLER_DEFERRED)
        finish_call(s, c);
    else
        s->in_flight++;
}

/* A quick handler runs on the socket thread when that delays nobody: its
 * pool queue is idle, no reply waits to be sent, no other request is
 * readable, and the payload bounds the work.  It saves the hand-off to a
 * worker and back (two thread wake-ups) on a lightly loaded server; under
 * load every call still goes to the pools. */
static bool run_inline(lmc_rpc_server *s, const handler_entry *h, lmc_rpc_call *c,
                       lmc_pool *pool, size_t queue)
{
    if ((!h->spec.quick && !h->spec.inline_ok) ||
        atomic_load_explicit(&s->done_pending, memory_order_acquire))
        return false;
    size_t bytes = 0, len;
    for (size_t i = 0; i < lmc_rpc_call_nargs(c); i++) {
        lmc_rpc_call_arg_raw(c, i, &len);
        bytes += len;
    }
    int events = 0;
    size_t events_len = sizeof events;
    if (bytes > LMC_RPC_INLINE_MAX_BYTES || !lmc_pool_queue_idle(pool, queue) ||
        zmq_getsockopt(s->socket, ZMQ_EVENTS, &events, &events_len) != 0 ||
        (events & ZMQ_POLLIN) || (!h->spec.quick && !h->spec.inline_ok(h->ctx, c)))
        return false;
    bump(&s->n_inlined);
    run_here(s, h, c);
    return true;
}

/* A full pool queue: the call is answered now with its op's failure reply,
 * or fails as ServerBusyError (docs/protocol.md, "Overload"), and the
 * socket thread goes on reading. */
static void answer_overload(lmc_rpc_server *s, const handler_entry *h, lmc_rpc_call *c,
                            const char *queue)
{
    char why[160];
    const char *op = lmc_op_name(c->op_id) ? lmc_op_name(c->op_id) : h->spec.op_name;
    bump(&s->n_overloaded);
    c->overloaded = true;
    snprintf(why, sizeof why, "the %s worker queue is full (--max-queued-requests %zu)", queue,
             s->opts.max_queued);
    if (h->spec.busy) {
        char what[96];
        snprintf(what, sizeof what, "%s answered with its overload reply", op ? op : "request");
        c->result = h->spec.busy(h->ctx, c);
        log_limited(s, what, why);
    } else {
        c->result = lmc_rpc_call_fail(c, "ServerBusyError", "%s; try again later", why);
    }
    finish_call(s, c);
}

/* Queues c on its pool, or answers it at once when the queue is full. */
static void submit(lmc_rpc_server *s, const handler_entry *h, lmc_rpc_call *c, lmc_pool *pool,
                   size_t queue, size_t bytes)
{
    s->in_flight++;
    if (lmc_pool_submit(pool, queue, &c->task, bytes, h->spec.releases))
        return;
    s->in_flight--;
    answer_overload(s, h, c, pool == s->normal_pool ? "CPU" : "GPU");
}

/* `bytes`: the message's size, frames past the first MAX_FRAMES included. */
static void dispatch(lmc_rpc_server *s, zmq_msg_t *frames, size_t n, size_t bytes)
{
    char why[160];
    int op_id;
    if (n < 3) {
        snprintf(why, sizeof why, "message has %zu frames, need identity, uid and op", n);
        log_drop(s, why);
        return;
    }
    const handler_entry *h = resolve_op(s, &frames[CALL_OP], &op_id, why, sizeof why);
    if (bytes > LMC_RPC_MAX_MESSAGE_BYTES) {
        /* Every frame passed ZMQ_MAXMSGSIZE; together they are more than a
         * legal request: answered as a failure, freed now, never queued. */
        snprintf(why, sizeof why, "message of %zu bytes is over the limit of %u bytes (128 MiB)",
                 bytes, LMC_RPC_MAX_MESSAGE_BYTES);
        h = NULL;
    }
    lmc_rpc_call *c = lmc_call_new(s, frames, n);
    if (!c) {
        log_drop(s, "out of memory");
        return;
    }
    c->op_id = op_id;
    c->handler = h;
    if (!h) {
        lmc_rpc_call_fail(c, "ValueError", "%s", why);
        c->result = LMC_HANDLER_ERROR;
        finish_call(s, c);
        return;
    }
    switch (h->spec.pool) {
    case LMC_POOL_SYNC:
        run_here(s, h, c);
        return;
    case LMC_POOL_AFFINITY: {
        size_t idlen;
        const uint8_t *id = lmc_rpc_call_identity(c, &idlen);
        size_t queue = identity_hash(id, idlen) % lmc_pool_queue_count(s->affinity_pool);
        if (run_inline(s, h, c, s->affinity_pool, queue))
            return;
        submit(s, h, c, s->affinity_pool, queue, bytes);
        return;
    }
    case LMC_POOL_NORMAL:
    default:
        if (run_inline(s, h, c, s->normal_pool, 0))
            return;
        submit(s, h, c, s->normal_pool, 0, bytes);
        return;
    }
}

/* Reads one whole multipart message.  Returns 0, or -1 when none is ready. */
static int receive_message(lmc_rpc_server *s)
{
    zmq_msg_t frames[MAX_FRAMES];
    size_t n = 0, total = 0, bytes = 0;
    int more = 1;
    while (more) {
        /* Frames past the limit are read into a scratch slot and discarded. */
        zmq_msg_t *slot = &frames[n < MAX_FRAMES ? n : MAX_FRAMES - 1];
        if (n == MAX_FRAMES)
            zmq_msg_close(slot);
        zmq_msg_init(slot);
        if (zmq_msg_recv(slot, s->socket, total == 0 ? ZMQ_DONTWAIT : 0) < 0) {
            zmq_msg_close(slot);
            if (total == 0)
                return -1;
            break; /* multipart delivery is atomic; only on shutdown */
        }
        more = zmq_msg_more(slot);
        bytes += zmq_msg_size(slot);
        if (n < MAX_FRAMES)
            n++;
        total++;
    }
    bump(&s->n_received);
    if (total > MAX_FRAMES) {
        char why[96];
        snprintf(why, sizeof why, "message has %zu frames (limit %d)", total, MAX_FRAMES);
        log_drop(s, why);
    } else {
        dispatch(s, frames, n, bytes);
    }
    for (size_t i = 0; i < n; i++)
        zmq_msg_close(&frames[i]); /* moved-from frames are empty: closing is a no-op */
    return 0;
}

/* ---- main loop ---------------------------------------------------------- */

static void drain_in_flight(lmc_rpc_server *s, int drain_ms)
{
    struct timespec start, now;
    clock_gettime(CLOCK_MONOTONIC, &start);
    while (s->in_flight > 0) {
        clock_gettime(CLOCK_MONOTONIC, &now);
        long elapsed = (now.tv_sec - start.tv_sec) * 1000 + (now.tv_nsec - start.tv_nsec) / 1000000;
        if (elapsed >= drain_ms) {
            LMC_WARN("rpc: %zu request(s) still running after %d ms drain", s->in_flight, drain_ms);
            return;
        }
        struct pollfd p = {.fd = s->done_fd, .events = POLLIN};
        if (poll(&p, 1, (int)(drain_ms - elapsed)) > 0)
            drain_completions(s, true);
    }
}

/* Handles whatever is ready without blocking; true if there was work. */
static bool serve_ready_work(lmc_rpc_server *s)
{
    bool worked = false;
    if (atomic_load_explicit(&s->done_pending, memory_order_acquire)) {
        drain_completions(s, false);
        worked = true;
    }
    for (int i = 0; i < RECV_BATCH && receive_message(s) == 0; i++)
        worked = true;
    return worked;
}

int lmc_rpc_server_run(lmc_rpc_server *s, int extra_stop_fd, int drain_ms)
{
    zmq_pollitem_t items[4] = {
        {.socket = s->socket, .events = ZMQ_POLLIN},
        {.fd = s->done_fd, .events = ZMQ_POLLIN},
        {.fd = s->stop_fd, .events = ZMQ_POLLIN},
        {.fd = extra_stop_fd, .events = ZMQ_POLLIN},
    };
    int nitems = extra_stop_fd >= 0 ? 4 : 3;
    unsigned busy_rounds = 0;
    for (;;) {
        /* While requests keep coming, skip the poll() syscall: receiving
         * with ZMQ_DONTWAIT costs none.  Look at the stop fds every 64
         * busy rounds so a loaded server still shuts down promptly. */
        bool worked = serve_ready_work(s);
        if (worked && ++busy_rounds % 64 != 0)
            continue;
        if (zmq_poll(items, nitems, worked ? 0 : -1) < 0) {
            if (zmq_errno() == EINTR)
                continue;
            LMC_ERROR("rpc: poll failed: %s", zmq_strerror(zmq_errno()));
            return -1;
        }
        if (items[2].revents || (nitems == 4 && items[3].revents))
            break;
        if (items[1].revents)
            drain_completions(s, true);
    }
    LMC_INFO("rpc: stopping: no new requests; draining %zu in flight", s->in_flight);
    drain_in_flight(s, drain_ms);
    return 0;
}

void lmc_rpc_server_stop(lmc_rpc_server *s)
{
    uint64_t one = 1;
    ssize_t w = write(s->stop_fd, &one, sizeof one);
    (void)w;
}

/* The pool a pooled call runs on; NULL on the socket thread. */
static lmc_pool *call_pool(const lmc_rpc_call *call)
{
    if (!call->pooled)
        return NULL;
    return call->handler->spec.pool == LMC_POOL_AFFINITY ? call->server->affinity_pool
                                                         : call->server->normal_pool;
}

bool lmc_rpc_call_share(lmc_rpc_call *call, size_t n_pieces, lmc_rpc_piece_fn fn, void *arg)
{
    lmc_pool *pool = call_pool(call);
    if (pool)
        return lmc_pool_share(pool, n_pieces, fn, arg);
    bool ok = true;
    for (size_t i = 0; i < n_pieces; i++)
        ok = fn(arg, i) && ok;
    return ok;
}

size_t lmc_rpc_call_share_width(const lmc_rpc_call *call)
{
    lmc_pool *pool = call_pool(call);
    return pool ? lmc_pool_thread_count(pool) : 1;
}

lmc_rpc_stats lmc_rpc_server_stats(lmc_rpc_server *s)
{
    lmc_rpc_stats st = {
        .received = atomic_load(&s->n_received),
        .replied = atomic_load(&s->n_replied),
        .dropped = atomic_load(&s->n_dropped),
        .error_frames = atomic_load(&s->n_error_frames),
        .inlined = atomic_load(&s->n_inlined),
        .overloaded = atomic_load(&s->n_overloaded),
        .partials = atomic_load(&s->n_partials),
    };
    return st;
}

bool lmc_rpc_server_op_counts(lmc_rpc_server *s, int op_id, uint64_t *replied,
                              uint64_t *failed)
{
    if (op_id < 1 || op_id > LMC_OP_FROZEN_MAX)
        return false;
    *replied = atomic_load(&s->op_replied[op_id]);
    *failed = atomic_load(&s->op_failed[op_id]);
    return true;
}

void lmc_rpc_server_join_workers(lmc_rpc_server *s)
{
    lmc_pool_free(s->normal_pool);
    lmc_pool_free(s->affinity_pool);
    s->normal_pool = s->affinity_pool = NULL;
}

void lmc_rpc_server_free(lmc_rpc_server *s)
{
    if (!s)
        return;
    lmc_rpc_server_join_workers(s);
    if (s->done_fd >= 0 && s->socket)
        drain_completions(s, true); /* replies of calls finished while closing */
    if (s->socket)
        zmq_close(s->socket);
    if (s->zctx)
        zmq_ctx_term(s->zctx);
    if (s->done_fd >= 0)
        close(s->done_fd);
    if (s->stop_fd >= 0)
        close(s->stop_fd);
    pthread_mutex_destroy(&s->done_lock);
    free(s);
}
