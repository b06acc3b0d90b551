/* Internal: the in-flight request object shared by server.c and call.c. */
#ifndef LMC_RPC_CALL_H
#define LMC_RPC_CALL_H

#include <stdbool.h>
#include <stddef.h>
#include <zmq.h>

#include "rpc/pool.h"
#include "rpc/rpc.h"

enum { CALL_IDENTITY = 0, CALL_UID = 1, CALL_OP = 2, CALL_FIRST_ARG = 3 };

typedef struct handler_entry handler_entry;

/* Reply bytes: small replies (the common case) stay in the call object; a
 * larger one spills to the heap. */
typedef struct {
    char *data;                    /* inline_buf or heap */
    size_t size, cap;
    /* A write found no memory: the document is cut short, so every later
     * write fails too and the call must not send it (lmc_call_settle). */
    bool failed;
    char inline_buf[192];
} call_reply_buffer;

struct lmc_rpc_call {
    lmc_pool_task task;            /* first: the pool links calls through it */
    lmc_rpc_server *server;
    const handler_entry *handler;
    int op_id;
    size_t nframes;
    zmq_msg_t *frames;             /* identity, uid, op, payload... */
    msgpack_zone zone;             /* decoded args live here */
    bool zone_ready;
    msgpack_object *args;
    unsigned char *arg_state;      /* 0 = not decoded, 1 = ok, 2 = invalid */
    call_reply_buffer reply;
    msgpack_packer packer;
    lmc_handler_result result;
    bool overloaded;               /* answered at once: its pool queue was full */
    bool pooled;                   /* running on a pool thread: may stream replies */
    char error_type[64];
    char error_message[512];
    void (*then_fn)(void *arg);    /* lmc_rpc_call_then; cleared once run */
    void *then_arg;
    struct lmc_rpc_call *next_done; /* completion queue link */
    /* frames, args and arg_state point into this tail: one allocation. */
    _Alignas(max_align_t) unsigned char tail[];
};

lmc_rpc_call *lmc_call_new(lmc_rpc_server *server, zmq_msg_t *frames, size_t nframes);
void lmc_call_free(lmc_rpc_call *call);
/* The result to act on for a handler's `result`: a REPLY whose document
 * ran out of memory while being packed becomes an error (MemoryError). */
lmc_handler_result lmc_call_settle(lmc_rpc_call *call, lmc_handler_result result);
/* The msgpack body of the error frame of a failed call, {"error_type",
 * "message"}, packed into `sb` (initialised by the caller, destroyed by the
 * caller); when that runs out of memory, a static MemoryError body. */
const char *lmc_call_error_body(const lmc_rpc_call *call, msgpack_sbuffer *sb, size_t *len);
/* Runs and clears the call's lmc_rpc_call_then work, if any. */
void lmc_call_run_then(lmc_rpc_call *call);
/* Hands a streaming reply of a pooled call to the socket thread (server.c). */
int lmc_rpc_server_enqueue_partial(lmc_rpc_server *server, lmc_rpc_call *call, const void *doc,
                                   size_t len);
/* Hands a finished call to the socket thread (server.c). */
void lmc_rpc_server_enqueue_done(lmc_rpc_server *server, lmc_rpc_call *call);

#endif
