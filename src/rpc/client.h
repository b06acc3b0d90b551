/* A minimal DEALER client for the MP protocol: one request at a time (or
 * pipelined with send/receive), replies matched by uid.  Used by
 * lmcache-cli and the benchmarks. */
#ifndef LMC_RPC_CLIENT_H
#define LMC_RPC_CLIENT_H

#include <msgpack.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct lmc_client lmc_client;

typedef enum {
    LMC_CLIENT_OK = 0,
    LMC_CLIENT_TIMEOUT = -1,
    LMC_CLIENT_REMOTE_ERROR = -2,  /* LMCACHE_RPC_ERROR_V1 frame */
    LMC_CLIENT_IO_ERROR = -3,
} lmc_client_status;

typedef struct {
    bool has_response;     /* false: the op returned None */
    uint8_t *data;         /* response frame (msgpack), malloc'd */
    size_t len;
} lmc_client_reply;

/* `url` like "tcp://localhost:5555".  NULL on failure. */
lmc_client *lmc_client_connect(const char *url);
/* The same with the socket's routing id set (1..255 bytes, the first not
 * 0, as ZMQ wants), so that the server knows this connection by a name
 * the caller chose (docs/p2p.md: the lease holder). */
lmc_client *lmc_client_connect_as(const char *url, const uint8_t *id, size_t id_len);
void lmc_client_close(lmc_client *c);

/* Sends op `op_id` with `nargs` pre-encoded msgpack payload frames and waits
 * up to timeout_ms for the reply to this request. */
lmc_client_status lmc_client_call(lmc_client *c, int op_id, const msgpack_sbuffer *args,
                                  size_t nargs, int timeout_ms, lmc_client_reply *reply);
void lmc_client_reply_free(lmc_client_reply *reply);

/* Pipelining, as the engine adapters do: send several requests, then
 * collect each reply by the uid lmc_client_send returned (0 on failure).
 * Replies to other uids that arrive first are dropped, so collect every
 * pipelined reply with lmc_client_receive before the next lmc_client_call. */
uint64_t lmc_client_send(lmc_client *c, int op_id, const msgpack_sbuffer *args, size_t nargs);
/* Waits up to timeout_ms for the next reply, whatever its uid (*uid). */
lmc_client_status lmc_client_receive(lmc_client *c, int timeout_ms, uint64_t *uid,
                                     lmc_client_reply *reply);

/* Raw access for load generators: send a request without waiting; receive
 * the next reply (any uid).  The socket is a plain ZMQ DEALER. */
void *lmc_client_socket(lmc_client *c);

#endif
