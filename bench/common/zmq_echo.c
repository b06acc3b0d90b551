/* A bare ZMQ ROUTER echo for the benchmarks' same-run baselines. */
#include "common/zmq_echo.h"

#include <errno.h>
#include <stdint.h>

const uint8_t echo_ok_reply[3] = {0xa2, 'O', 'K'};

/* Drains the rest of a multipart message. */
static void drain_more(void *socket, bool more)
{
    while (more) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, socket, 0) < 0) {
            zmq_msg_close(&m);
            return;
        }
        more = zmq_msg_more(&m);
        zmq_msg_close(&m);
    }
}

/* Receives [identity, uid, op, ...] into f[0..2]; returns false to stop. */
static bool echo_recv(void *socket, zmq_msg_t f[3], int *nframes)
{
    *nframes = 0;
    bool more = true;
    while (more && *nframes < 3) {
        if (zmq_msg_recv(&f[*nframes], socket, 0) < 0)
            return false;
        more = zmq_msg_more(&f[(*nframes)++]);
    }
    drain_more(socket, more);
    return true;
}

static void *echo_main(void *arg)
{
    echo_server *e = arg;
    zmq_msg_t f[3];
    for (;;) {
        for (int i = 0; i < 3; i++)
            zmq_msg_init(&f[i]);
        int n;
        bool alive = echo_recv(e->socket, f, &n);
        if (alive && n == 3) {
            zmq_msg_send(&f[0], e->socket, ZMQ_SNDMORE);
            zmq_msg_send(&f[1], e->socket, ZMQ_SNDMORE);
            zmq_msg_send(&f[2], e->socket, ZMQ_SNDMORE);
            zmq_send(e->socket, echo_ok_reply, sizeof echo_ok_reply, 0);
        }
        for (int i = 0; i < 3; i++)
            zmq_msg_close(&f[i]);
        if (!alive && zmq_errno() == ETERM)
            break;
    }
    zmq_close(e->socket);
    return NULL;
}

void echo_stop(echo_server *e)
{
    if (!e->zctx)
        return;
    zmq_ctx_shutdown(e->zctx); /* the blocked recv returns ETERM */
    if (e->running)
        pthread_join(e->thread, NULL);
    else if (e->socket)
        zmq_close(e->socket);
    zmq_ctx_term(e->zctx);
    *e = (echo_server){0};
}

int echo_start(echo_server *e, const char *bind_url)
{
    *e = (echo_server){0};
    size_t len = sizeof e->endpoint;
    int linger = 0;
    e->zctx = zmq_ctx_new();
    e->socket = e->zctx ? zmq_socket(e->zctx, ZMQ_ROUTER) : NULL;
    if (!e->socket || zmq_setsockopt(e->socket, ZMQ_LINGER, &linger, sizeof linger) != 0 ||
        zmq_bind(e->socket, bind_url ? bind_url : "tcp://127.0.0.1:*") != 0 ||
        zmq_getsockopt(e->socket, ZMQ_LAST_ENDPOINT, e->endpoint, &len) != 0 ||
        pthread_create(&e->thread, NULL, echo_main, e) != 0) {
        echo_stop(e);
        return -1;
    }
    e->running = true;
    return 0;
}

