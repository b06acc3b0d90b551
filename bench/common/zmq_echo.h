/* A bare ZMQ ROUTER echo server, the floor that ZMQ and lmcached's client
 * reach on a machine: it answers every [identity, uid, op, ...] with
 * [identity, uid, op, a2 4f 4b] ("OK") without decoding anything. */
#ifndef LMC_BENCH_ZMQ_ECHO_H
#define LMC_BENCH_ZMQ_ECHO_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <zmq.h>

extern const uint8_t echo_ok_reply[3];   /* msgpack "OK" */

typedef struct {
    void *zctx;
    void *socket;
    pthread_t thread;
    bool running;
    char endpoint[256];
} echo_server;

/* Binds a ROUTER on bind_url (NULL: an ephemeral loopback port) and serves
 * it in a thread; e->endpoint is its URL.  0, or -1 (nothing left running). */
int echo_start(echo_server *e, const char *bind_url);
void echo_stop(echo_server *e);

#endif
