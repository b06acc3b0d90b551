#include "rpc/call.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rpc/wire.h"

/* Deepest nesting any protocol payload uses is ~4; allow headroom. */
#define ARG_MAX_DEPTH 32

static int reply_write(void *data, const char *buf, size_t len)
{
    call_reply_buffer *r = data;
    /* Handlers pack without checking every call; after a lost write the
     * bytes that follow would make a well-formed-looking wrong document. */
    if (r->failed)
        return -1;
    if (len > r->cap - r->size) {
        size_t cap = r->cap * 2 > r->size + len ? r->cap * 2 : r->size + len;
        char *grown = r->data == r->inline_buf ? malloc(cap) : realloc(r->data, cap);
        if (!grown) {
            r->failed = true;
            return -1;
        }
        if (r->data == r->inline_buf)
            memcpy(grown, r->inline_buf, r->size);
        r->data = grown;
        r->cap = cap;
    }
    memcpy(r->data + r->size, buf, len);
    r->size += len;
    return 0;
}

lmc_rpc_call *lmc_call_new(lmc_rpc_server *server, zmq_msg_t *frames, size_t nframes)
{
    size_t nargs = nframes > CALL_FIRST_ARG ? nframes - CALL_FIRST_ARG : 0;
    /* One allocation per request: frames, decoded args, arg states. */
    size_t frames_bytes = nframes * sizeof(zmq_msg_t);
    size_t args_bytes = nargs * sizeof(msgpack_object);
    lmc_rpc_call *c = calloc(1, sizeof *c + frames_bytes + args_bytes + nargs);
    if (!c)
        return NULL;
    c->frames = (zmq_msg_t *)c->tail;
    c->args = (msgpack_object *)(c->tail + frames_bytes);
    c->arg_state = c->tail + frames_bytes + args_bytes;
    for (size_t i = 0; i < nframes; i++) {
        zmq_msg_init(&c->frames[i]);
        zmq_msg_move(&c->frames[i], &frames[i]);
    }
    c->nframes = nframes;
    c->server = server;
    c->reply.data = c->reply.inline_buf;
    c->reply.cap = sizeof c->reply.inline_buf;
    msgpack_packer_init(&c->packer, &c->reply, reply_write);
    return c;
}

void lmc_call_free(lmc_rpc_call *c)
{
    if (!c)
        return;
    for (size_t i = 0; i < c->nframes; i++)
        zmq_msg_close(&c->frames[i]);
    if (c->zone_ready)
        msgpack_zone_destroy(&c->zone);
    if (c->reply.data != c->reply.inline_buf)
        free(c->reply.data);
    free(c);
}

int lmc_rpc_call_op(const lmc_rpc_call *call)
{
    return call->op_id;
}

size_t lmc_rpc_call_nargs(const lmc_rpc_call *call)
{
    return call->nframes > CALL_FIRST_ARG ? call->nframes - CALL_FIRST_ARG : 0;
}

const uint8_t *lmc_rpc_call_arg_raw(const lmc_rpc_call *call, size_t i, size_t *len)
{
    if (i >= lmc_rpc_call_nargs(call))
        return NULL;
    zmq_msg_t *m = &((lmc_rpc_call *)call)->frames[CALL_FIRST_ARG + i];
    *len = zmq_msg_size(m);
    return zmq_msg_data(m);
}

const msgpack_object *lmc_rpc_call_arg(lmc_rpc_call *call, size_t i)
{
    if (i >= lmc_rpc_call_nargs(call))
        return NULL;
    if (call->arg_state[i] == 1)
        return &call->args[i];
    if (call->arg_state[i] == 2)
        return NULL;
    size_t len;
    const uint8_t *data = lmc_rpc_call_arg_raw(call, i, &len);
    call->arg_state[i] = 2;
    if (!lmc_mp_validate(data, len, ARG_MAX_DEPTH))
        return NULL;
    if (!call->zone_ready) {
        if (!msgpack_zone_init(&call->zone, 4096))
            return NULL;
        call->zone_ready = true;
    }
    size_t off = 0;
    if (msgpack_unpack((const char *)data, len, &off, &call->zone, &call->args[i]) !=
        MSGPACK_UNPACK_SUCCESS)
        return NULL;
    call->arg_state[i] = 1;
    return &call->args[i];
}

const uint8_t *lmc_rpc_call_identity(const lmc_rpc_call *call, size_t *len)
{
    zmq_msg_t *m = &((lmc_rpc_call *)call)->frames[CALL_IDENTITY];
    *len = zmq_msg_size(m);
    return zmq_msg_data(m);
}

msgpack_packer *lmc_rpc_call_reply(lmc_rpc_call *call)
{
    return &call->packer;
}

lmc_handler_result lmc_rpc_call_fail(lmc_rpc_call *call, const char *error_type,
                                     const char *fmt, ...)
{
    snprintf(call->error_type, sizeof call->error_type, "%s", error_type);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(call->error_message, sizeof call->error_message, fmt, ap);
    va_end(ap);
    return LMC_HANDLER_ERROR;
}

lmc_handler_result lmc_call_settle(lmc_rpc_call *call, lmc_handler_result result)
{
    if (result != LMC_HANDLER_REPLY || !call->reply.failed)
        return result;
    return lmc_rpc_call_fail(call, "MemoryError", "out of memory packing the reply (%zu bytes)",
                             call->reply.size);
}

const char *lmc_call_error_body(const lmc_rpc_call *call, msgpack_sbuffer *sb, size_t *len)
{
    /* {"error_type": "MemoryError", "message": "out of memory"} */
    static const char oom_body[] = "\x82\xaa" "error_type" "\xab" "MemoryError"
                                   "\xa7" "message" "\xad" "out of memory";
    msgpack_packer pk;
    msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
    /* Clients decode the message as str: vsnprintf may have cut its last
     * character, and it may quote a client's bytes that are not UTF-8. */
    char msg[sizeof call->error_message];
    size_t n = lmc_utf8_sanitize(msg, sizeof msg, call->error_message,
                                 strlen(call->error_message));
    const char *type = call->error_type[0] ? call->error_type : "RuntimeError";
    if (msgpack_pack_map(&pk, 2) == 0 && lmc_mp_pack_cstr(&pk, "error_type") == 0 &&
        lmc_mp_pack_cstr(&pk, type) == 0 && lmc_mp_pack_cstr(&pk, "message") == 0 &&
        msgpack_pack_str(&pk, n) == 0 && msgpack_pack_str_body(&pk, msg, n) == 0) {
        *len = sb->size;
        return sb->data;
    }
    *len = sizeof oom_body - 1;
    return oom_body;
}

void lmc_rpc_call_then(lmc_rpc_call *call, void (*fn)(void *arg), void *arg)
{
    call->then_fn = fn;
    call->then_arg = arg;
}

void lmc_call_run_then(lmc_rpc_call *call)
{
    void (*fn)(void *) = call->then_fn;
    call->then_fn = NULL;
    if (fn)
        fn(call->then_arg);
}

void lmc_rpc_call_complete(lmc_rpc_call *call, lmc_handler_result result)
{
    call->result = result;
    lmc_rpc_server_enqueue_done(call->server, call);
}

int lmc_rpc_call_send_partial(lmc_rpc_call *call, const void *doc, size_t len)
{
    if (!call->pooled)
        return -1;   /* the socket thread would send the final reply first */
    return lmc_rpc_server_enqueue_partial(call->server, call, doc, len);
}
