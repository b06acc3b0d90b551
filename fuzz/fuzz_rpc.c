/* Fuzz target: the whole RPC server, over its real protocol.  One lmcached
 * runs inside this process (src/server/server.h, loopback TCP, a small L1);
 * each input is a sequence of multipart messages sent from one DEALER, as a
 * hostile or confused client would.  Frames are taken as given, so uids,
 * op ids and payloads can all be malformed; the corpus starts from the real
 * flows (register, LOOKUP, PREPARE/COMMIT, queries) so mutations reach deep
 * into the handlers.
 *
 * Input: records [n_frames: 1 byte, 0..9][per frame: len: 2 bytes LE, bytes].
 * After each input a NOOP must still be answered within 5 s: a crash
 * aborts the process (ASan), a hang of the socket thread is a finding too. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

#include "check.h"
#include "embedded_server.h"

#define MAX_MESSAGES 16
#define MAX_FRAMES 9   /* uid, op and REGISTER_KV_CACHE's seven arguments */
#define SYNC_UID "\xcd\xfe\xed"   /* msgpack uint16 0xfeed: never a seed's uid */

static fuzz_server *server;
static void *zctx, *dealer;

static void close_dealer(void)
{
    zmq_close(dealer);
    zmq_ctx_term(zctx);
}

static void start(void)
{
    char url[64];
    server = fuzz_start_server(false);
    zctx = zmq_ctx_new();
    dealer = zmq_socket(zctx, ZMQ_DEALER);
    int linger = 0;
    zmq_setsockopt(dealer, ZMQ_LINGER, &linger, sizeof linger);
    snprintf(url, sizeof url, "tcp://127.0.0.1:%d", server->zmq_port);
    CHECK(zmq_connect(dealer, url) == 0);
    atexit(close_dealer);   /* runs before the server's stop (atexit is LIFO) */
}

/* Sends NOOP and drops every reply until its own comes back. */
static void sync_with_server(void)
{
    zmq_send(dealer, SYNC_UID, 3, ZMQ_SNDMORE);
    zmq_send(dealer, "\x18", 1, 0);   /* op 24 = NOOP */
    for (;;) {
        zmq_pollitem_t it = {dealer, 0, ZMQ_POLLIN, 0};
        if (zmq_poll(&it, 1, 5000) != 1) {
            fprintf(stderr, "fuzz_rpc: no NOOP reply within 5 s: the server hangs\n");
            abort();
        }
        char uid[16];
        int n = zmq_recv(dealer, uid, sizeof uid, 0);
        bool mine = n == 3 && memcmp(uid, SYNC_UID, 3) == 0;
        int more;
        size_t sz = sizeof more;
        zmq_getsockopt(dealer, ZMQ_RCVMORE, &more, &sz);
        while (more) {   /* the rest of this reply */
            zmq_msg_t m;
            zmq_msg_init(&m);
            zmq_msg_recv(&m, dealer, 0);
            zmq_msg_close(&m);
            zmq_getsockopt(dealer, ZMQ_RCVMORE, &more, &sz);
        }
        if (mine)
            return;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t len)
{
    if (!server)
        start();
    size_t p = 0;
    for (int msg = 0; msg < MAX_MESSAGES && p < len; msg++) {
        size_t n_frames = data[p++] % (MAX_FRAMES + 1);
        const uint8_t *frame[MAX_FRAMES];
        size_t flen[MAX_FRAMES], got = 0;
        while (got < n_frames && p + 2 <= len) {
            size_t l = data[p] | (size_t)data[p + 1] << 8;
            p += 2;
            if (l > len - p)
                l = len - p;
            frame[got] = data + p;
            flen[got++] = l;
            p += l;
        }
        for (size_t i = 0; i < got; i++)
            zmq_send(dealer, frame[i], flen[i], i + 1 < got ? ZMQ_SNDMORE : 0);
    }
    sync_with_server();
    /* Whatever the messages did, the server's own invariants still hold
     * (the L1 books, docs/storage.md "Invariants": allocator consistent,
     * every byte and every lease accounted for). */
    json_t *status = lmc_server_report_status(server->server);
    if (!json_is_true(json_object_get(status, "is_healthy"))) {
        char *dump = json_dumps(status, JSON_COMPACT);
        fprintf(stderr, "fuzz_rpc: server unhealthy after this input: %s\n", dump ? dump : "?");
        abort();
    }
    json_decref(status);
    return 0;
}
