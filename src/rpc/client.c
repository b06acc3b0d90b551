#include "rpc/client.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zmq.h>

struct lmc_client {
    void *zctx;
    void *socket;
    uint64_t next_uid;
};

lmc_client *lmc_client_connect(const char *url)
{
    return lmc_client_connect_as(url, NULL, 0);
}

lmc_client *lmc_client_connect_as(const char *url, const uint8_t *id, size_t id_len)
{
    lmc_client *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    c->next_uid = 1; /* 0 is lmc_client_send's failure value */
    c->zctx = zmq_ctx_new();
    c->socket = c->zctx ? zmq_socket(c->zctx, ZMQ_DEALER) : NULL;
    if (!c->socket)
        goto fail;
    int linger = 0, connect_timeout = 5000, reconnect_max = 1000;
    zmq_setsockopt(c->socket, ZMQ_LINGER, &linger, sizeof linger);
    zmq_setsockopt(c->socket, ZMQ_CONNECT_TIMEOUT, &connect_timeout, sizeof connect_timeout);
    zmq_setsockopt(c->socket, ZMQ_RECONNECT_IVL_MAX, &reconnect_max, sizeof reconnect_max);
    if (id_len && zmq_setsockopt(c->socket, ZMQ_ROUTING_ID, id, id_len) != 0)
        goto fail;
    if (zmq_connect(c->socket, url) != 0)
        goto fail;
    return c;
fail:
    lmc_client_close(c);
    return NULL;
}

void lmc_client_close(lmc_client *c)
{
    if (!c)
        return;
    if (c->socket)
        zmq_close(c->socket);
    if (c->zctx)
        zmq_ctx_term(c->zctx);
    free(c);
}

void *lmc_client_socket(lmc_client *c)
{
    return c->socket;
}

static long long now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int send_request(lmc_client *c, uint64_t uid, int op_id, const msgpack_sbuffer *args,
                        size_t nargs)
{
    char head[2][16];
    msgpack_sbuffer sb[2];
    msgpack_packer pk;
    for (int i = 0; i < 2; i++) {
        msgpack_sbuffer_init(&sb[i]);
        msgpack_packer_init(&pk, &sb[i], msgpack_sbuffer_write);
        if (i == 0)
            msgpack_pack_uint64(&pk, uid);
        else
            msgpack_pack_int(&pk, op_id);
        memcpy(head[i], sb[i].data, sb[i].size);
    }
    int rc = 0;
    rc |= zmq_send(c->socket, head[0], sb[0].size, ZMQ_SNDMORE) < 0;
    rc |= zmq_send(c->socket, head[1], sb[1].size, nargs ? ZMQ_SNDMORE : 0) < 0;
    for (size_t i = 0; i < nargs; i++)
        rc |= zmq_send(c->socket, args[i].data, args[i].size, i + 1 < nargs ? ZMQ_SNDMORE : 0) < 0;
    msgpack_sbuffer_destroy(&sb[0]);
    msgpack_sbuffer_destroy(&sb[1]);
    return rc ? -1 : 0;
}

/* Reads one whole reply; returns its uid, or -1 on a malformed reply. */
static int64_t read_reply(lmc_client *c, lmc_client_reply *reply, bool *remote_error)
{
    zmq_msg_t frames[4];
    size_t n = 0;
    int more = 1;
    while (more) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, c->socket, 0) < 0) {
            zmq_msg_close(&m);
            break;
        }
        more = zmq_msg_more(&m);
        if (n < 4) {
            zmq_msg_init(&frames[n]);
            zmq_msg_move(&frames[n++], &m);
        }
        zmq_msg_close(&m);
    }
    int64_t uid = -1;
    if (n >= 2) {
        msgpack_unpacked up;
        msgpack_unpacked_init(&up);
        size_t off = 0;
        if (msgpack_unpack_next(&up, zmq_msg_data(&frames[0]), zmq_msg_size(&frames[0]), &off) ==
                MSGPACK_UNPACK_SUCCESS &&
            up.data.type == MSGPACK_OBJECT_POSITIVE_INTEGER)
            uid = (int64_t)up.data.via.u64;
        msgpack_unpacked_destroy(&up);
    }
    *remote_error = n >= 4 && zmq_msg_size(&frames[2]) == 20 &&
                    memcmp(zmq_msg_data(&frames[2]), "LMCACHE_RPC_ERROR_V1", 20) == 0;
    reply->has_response = n >= 3;
    if (n >= 3) {
        zmq_msg_t *body = &frames[*remote_error ? 3 : 2];
        reply->len = zmq_msg_size(body);
        reply->data = malloc(reply->len ? reply->len : 1);
        if (reply->data)
            memcpy(reply->data, zmq_msg_data(body), reply->len);
    }
    for (size_t i = 0; i < n; i++)
        zmq_msg_close(&frames[i]);
    return uid;
}

uint64_t lmc_client_send(lmc_client *c, int op_id, const msgpack_sbuffer *args, size_t nargs)
{
    uint64_t uid = c->next_uid++;
    return send_request(c, uid, op_id, args, nargs) == 0 ? uid : 0;
}

lmc_client_status lmc_client_receive(lmc_client *c, int timeout_ms, uint64_t *uid,
                                     lmc_client_reply *reply)
{
    memset(reply, 0, sizeof *reply);
    long long deadline = now_ms() + timeout_ms;
    for (;;) {
        long long left = deadline - now_ms();
        if (left <= 0)
            return LMC_CLIENT_TIMEOUT;
        zmq_pollitem_t item = {.socket = c->socket, .events = ZMQ_POLLIN};
        if (zmq_poll(&item, 1, (long)left) <= 0)
            continue;
        bool remote_error = false;
        int64_t got = read_reply(c, reply, &remote_error);
        if (got < 0) {
            lmc_client_reply_free(reply); /* malformed: not an answer to anything */
            continue;
        }
        *uid = (uint64_t)got;
        return remote_error ? LMC_CLIENT_REMOTE_ERROR : LMC_CLIENT_OK;
    }
}

lmc_client_status lmc_client_call(lmc_client *c, int op_id, const msgpack_sbuffer *args,
                                  size_t nargs, int timeout_ms, lmc_client_reply *reply)
{
    uint64_t uid = lmc_client_send(c, op_id, args, nargs);
    if (!uid)
        return LMC_CLIENT_IO_ERROR;
    long long deadline = now_ms() + timeout_ms;
    for (;;) {
        long long left = deadline - now_ms();
        uint64_t got;
        lmc_client_status st = lmc_client_receive(c, left > 0 ? (int)left : 0, &got, reply);
        if (st == LMC_CLIENT_TIMEOUT || got == uid)
            return st;
        lmc_client_reply_free(reply); /* a stale reply to an earlier, timed-out request */
    }
}

void lmc_client_reply_free(lmc_client_reply *reply)
{
    free(reply->data);
    memset(reply, 0, sizeof *reply);
}
