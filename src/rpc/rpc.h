/* The ZMQ RPC server: one ROUTER socket owned by one thread, a handler
 * registry, and two worker pools (docs/architecture.md, "The RPC core").
 *
 *   SYNC      runs inline on the socket thread; replies in request order.
 *   AFFINITY  runs on one of N threads chosen by the client's routing
 *             identity: all affinity requests of one client run on one
 *             thread, in arrival order.
 *   NORMAL    runs on a shared pool of M threads.
 *
 * Replies are only ever sent by the socket thread: workers hand finished
 * calls back through a completion queue and an eventfd. */
#ifndef LMC_RPC_RPC_H
#define LMC_RPC_RPC_H

#include <msgpack.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum {
    LMC_POOL_SYNC,
    LMC_POOL_AFFINITY,
    LMC_POOL_NORMAL,
} lmc_pool_kind;

typedef enum {
    LMC_HANDLER_REPLY,    /* send the msgpack document written to the reply packer */
    LMC_HANDLER_VOID,     /* send [uid, op] only: the client reads None */
    LMC_HANDLER_ERROR,    /* log; drop (default) or send an error frame */
    LMC_HANDLER_DEFERRED, /* the handler kept the call; lmc_rpc_call_complete() later */
} lmc_handler_result;

typedef struct lmc_rpc_call lmc_rpc_call;
typedef lmc_handler_result (*lmc_rpc_handler_fn)(void *ctx, lmc_rpc_call *call);

/* What a module contributes for one op (upstream's HandlerSpec). */
typedef struct {
    int op_id;            /* frozen wire id, or 0 for an op known only by name */
    const char *op_name;  /* snake_case name; NULL means lmc_op_name(op_id) */
    lmc_pool_kind pool;
    lmc_rpc_handler_fn fn;
    /* Bounded CPU work that never waits (no I/O, no condition waits): the
     * socket thread may run it itself, skipping two thread hand-offs, when
     * its pool queue is idle, no other request or reply is waiting and the
     * payload is at most LMC_RPC_INLINE_MAX_BYTES.  Ordering is unchanged:
     * an idle queue has nothing the call could overtake. */
    bool quick;
    /* Optional, for ops whose cost depends on the request, not its size: a
     * call the module judges bounded and small (it reads the call's frames,
     * never replies or keeps it) may run inline like a quick one. */
    bool (*inline_ok)(void *ctx, lmc_rpc_call *call);
    /* The op's answer when its pool queue is full (docs/protocol.md,
     * "Overload"): packs the op's documented failure reply and returns
     * REPLY or VOID, on the socket thread, without doing the op's work or
     * decoding more than it must.  NULL: the op has no failure reply, and
     * the call fails with a ServerBusyError (an error frame with
     * --rpc-error-frames, else dropped). */
    lmc_handler_result (*busy)(void *ctx, lmc_rpc_call *call);
    /* The op gives back what earlier requests took (read locks, pins,
     * write reservations).  Refusing it under overload would keep those
     * held until they lapse, which deepens the overload, so it may queue
     * past --max-queued-requests, up to twice that count (docs/protocol.md,
     * "Overload"). */
    bool releases;
} lmc_rpc_handler_spec;

/* Payload bound for running a quick handler inline (a 64k-token key). */
#define LMC_RPC_INLINE_MAX_BYTES (320u * 1024u)

/* Bounds on what a client can send (docs/protocol.md, "Bounds").  The
 * largest legal frame is a key of LMC_KEY_MAX_TOKENS token ids of up to 5
 * bytes each (80 MiB, src/modules/services/ipc_key.h) plus its other fields, the
 * largest legal message that key plus a STORE's block ids (at most 2^20
 * of up to 9 bytes): both stay under 128 MiB.  ZMQ disconnects a peer
 * that sends a larger frame (ZMQ_MAXMSGSIZE); a message of smaller frames
 * that add up to more is answered as a failed request and freed. */
#define LMC_RPC_MAX_MESSAGE_BYTES (128u << 20)
/* Whole messages ZMQ queues per peer: inbound before the socket thread
 * reads them (past it ZMQ stops reading that peer's connection), and
 * replies a peer has not read yet (past it ZMQ drops that peer's replies). */
#define LMC_RPC_RCVHWM 1000
#define LMC_RPC_SNDHWM 10000
/* Bytes of the requests waiting in one worker queue (an empty queue takes
 * any request); the count is lmc_rpc_options.max_queued. */
#define LMC_RPC_QUEUE_MAX_BYTES (256u << 20)

/* ---- inside a handler --------------------------------------------------- */
int lmc_rpc_call_op(const lmc_rpc_call *call);       /* resolved op id (names map too) */
size_t lmc_rpc_call_nargs(const lmc_rpc_call *call); /* payload frame count */
/* Decoded payload frame i, or NULL if absent or not exactly one valid msgpack
 * document.  Objects live until the call is completed. */
const msgpack_object *lmc_rpc_call_arg(lmc_rpc_call *call, size_t i);
/* Raw bytes of payload frame i (for zero-copy access to large bins). */
const uint8_t *lmc_rpc_call_arg_raw(const lmc_rpc_call *call, size_t i, size_t *len);
const uint8_t *lmc_rpc_call_identity(const lmc_rpc_call *call, size_t *len);
/* Packer for the single response document of a LMC_HANDLER_REPLY. */
msgpack_packer *lmc_rpc_call_reply(lmc_rpc_call *call);
/* Records why the call failed; always returns LMC_HANDLER_ERROR so handlers
 * can `return lmc_rpc_call_fail(...)`. */
lmc_handler_result lmc_rpc_call_fail(lmc_rpc_call *call, const char *error_type,
                                     const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Work a handler leaves for after its reply.  `fn(arg)` runs exactly once,
 * on the handler's thread: right after the reply is handed to ZMQ when the
 * call ran on the socket thread (SYNC, or a quick handler run inline), and
 * right after the handler returns otherwise (before the reply).  The
 * socket thread reads no other request until `fn` returns, so a client
 * that waits for this reply before its next request sees everything `fn`
 * did; it only gets the reply sooner.  The call's frames (and so anything
 * decoded from them) are still valid in `fn`.  At most once per call.  For
 * a LMC_HANDLER_DEFERRED call, `fn` runs on the socket thread once the
 * deferred reply has been sent. */
void lmc_rpc_call_then(lmc_rpc_call *call, void (*fn)(void *arg), void *arg);
/* A streaming reply (docs/protocol.md, "Streaming replies"): sends the
 * `len` bytes of one msgpack document as an extra reply to this call now,
 * [identity, uid, op, doc] like any reply, ahead of its final one.  Only
 * from a handler running on a pool thread (so never for a SYNC op or one
 * that may run inline), before the call completes.  The socket thread hands
 * it to ZMQ in order and never waits for the client: a client that stops
 * reading costs at most LMC_RPC_SNDHWM queued messages, and no thread.
 * 0, or -1 (out of memory, or not a pooled call): nothing sent. */
int lmc_rpc_call_send_partial(lmc_rpc_call *call, const void *doc, size_t len);
/* One piece of a handler's work split across its pool (lmc_rpc_call_share):
 * true when it went well.  Pieces run concurrently: each touches only its
 * own bytes. */
typedef bool (*lmc_rpc_piece_fn)(void *arg, size_t piece);
/* Runs fn(arg, i) for every i < n_pieces, on this thread and on the idle
 * threads of the pool the call runs on (docs/architecture.md, "One request
 * across the copy workers"); on the socket thread, all on it.  Returns
 * once all have run: true when each returned true. */
bool lmc_rpc_call_share(lmc_rpc_call *call, size_t n_pieces, lmc_rpc_piece_fn fn, void *arg);
/* How many threads may run pieces of this call's share: its pool's size,
 * or 1 on the socket thread. */
size_t lmc_rpc_call_share_width(const lmc_rpc_call *call);
/* Finishes a call a handler returned LMC_HANDLER_DEFERRED for.  Any thread. */
void lmc_rpc_call_complete(lmc_rpc_call *call, lmc_handler_result result);

/* ---- the server --------------------------------------------------------- */
typedef struct lmc_rpc_server lmc_rpc_server;

typedef struct {
    const char *bind_url;   /* e.g. "tcp://localhost:5555" */
    int normal_workers;     /* --max-cpu-workers */
    int affinity_workers;   /* --max-gpu-workers */
    bool error_frames;      /* reply LMCACHE_RPC_ERROR_V1 instead of dropping */
    size_t max_queued;      /* --max-queued-requests, per worker queue; 0: no bound */
} lmc_rpc_options;

typedef struct {
    uint64_t received;        /* messages read off the socket */
    uint64_t replied;         /* replies sent */
    uint64_t dropped;         /* malformed / unknown / failed, no reply */
    uint64_t error_frames;    /* error frames sent */
    uint64_t inlined;         /* pooled (quick) requests run on the socket thread */
    uint64_t overloaded;      /* answered at once because their pool queue was full */
    uint64_t partials;        /* streaming replies sent ahead of a final one */
} lmc_rpc_stats;

/* Binds the socket (failure: port in use, bad host) and starts the pools. */
int lmc_rpc_server_new(const lmc_rpc_options *opts, lmc_rpc_server **out,
                       char *err, size_t errlen);
/* Registers `spec` with handler context `ctx`.  Call before run(). Returns
 * -1 if the op already has a handler. */
int lmc_rpc_server_register(lmc_rpc_server *s, const lmc_rpc_handler_spec *spec, void *ctx);
/* Serves until lmc_rpc_server_stop() or `extra_stop_fd` (e.g. a signalfd;
 * -1 for none) becomes readable.  Then stops receiving and drains in-flight
 * calls (sending their replies) for at most `drain_ms`. */
int lmc_rpc_server_run(lmc_rpc_server *s, int extra_stop_fd, int drain_ms);
void lmc_rpc_server_stop(lmc_rpc_server *s);  /* thread-safe */
lmc_rpc_stats lmc_rpc_server_stats(lmc_rpc_server *s);
/* Per-op totals since start: requests answered (a reply or a void reply)
 * and requests dropped (handler failure, or an op without a handler).
 * Ops are frozen ids 1..LMC_OP_FROZEN_MAX; false for any other id. */
bool lmc_rpc_server_op_counts(lmc_rpc_server *s, int op_id, uint64_t *replied,
                              uint64_t *failed);
/* Runs what is still queued, then joins the worker threads.  After run()
 * returned and before the handler contexts (modules) are closed. */
void lmc_rpc_server_join_workers(lmc_rpc_server *s);
/* Joins the workers if still running, sends replies of calls completed since
 * (e.g. deferred calls finished by module close), closes the socket. */
void lmc_rpc_server_free(lmc_rpc_server *s);

#endif
