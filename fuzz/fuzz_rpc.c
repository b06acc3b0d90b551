/* Fuzz target: the whole RPC server, over its real protocol.  One lmcached
 * runs inside this process (src/server/server.h, loopback TCP, a small L1);
 * each input is a sequence of multipart messages sent from one DEALER, as a
 * hostile or confused client would.  Frames are taken as given, so uids,
 * op ids and payloads can all be malformed; the corpus starts from the real
 * flows (register, LOOKUP, PREPARE/COMMIT, queries) so mutations reach deep
 * into the handlers.
 *
 * Input: records [n_frames: 1 byte, 0..7][per frame: len: 2 bytes LE, bytes].
 * After each input a NOOP must still be answered within 5 s: a crash
 * aborts the process (ASan), a hang of the socket thread is a finding too. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>
#include <zmq.h>

#include "check.h"
#include "config/config.h"
#include "obs/log.h"
#include "server/server.h"
#include "storage/l1_arena.h"

#define MAX_MESSAGES 16
#define MAX_FRAMES 7
#define SYNC_UID "\xcd\xfe\xed"   /* msgpack uint16 0xfeed: never a seed's uid */

static lmc_server *server;
static lmc_config cfg;
static pthread_t server_thread;
static void *zctx, *dealer;

static void *serve(void *arg)
{
    lmc_server_run(arg, -1);
    return NULL;
}

/* At a normal exit: stop the server cleanly (its threads, its modules). */
static void stop_server(void)
{
    zmq_close(dealer);
    zmq_ctx_term(zctx);
    lmc_server_stop(server);
    pthread_join(server_thread, NULL);
    lmc_server_free(server);
    lmc_config_free(&cfg);
}

/* A port the kernel says is free now (the corpus replay runs beside other
 * tests under ctest -j). */
static int free_port(void)
{
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    CHECK(s >= 0 && bind(s, (struct sockaddr *)&a, sizeof a) == 0 &&
          getsockname(s, (struct sockaddr *)&a, &len) == 0);
    close(s);
    return ntohs(a.sin_port);
}

static void start_server(void)
{
    char port[16], metrics_port[16], err[256], url[64];
    snprintf(port, sizeof port, "%d", free_port());
    snprintf(metrics_port, sizeof metrics_port, "%d", free_port());
    char *args[] = {"lmcached", "--host", "127.0.0.1", "--port", port, "--chunk-size", "16",
                    "--l1-size-gb", "0.0625", "--eviction-policy", "LRU", "--log-level",
                    "ERROR", "--no-http", "--http-host", "127.0.0.1", "--prometheus-port",
                    metrics_port, "--max-workers", "2", NULL};
    lmc_log_set_level(LMC_LOG_ERROR);   /* main() does this for lmcached */
    if (lmc_config_parse(&cfg, (int)(sizeof args / sizeof args[0]) - 1, args, NULL, stdout, err,
                         sizeof err) != LMC_CONFIG_OK ||
        lmc_server_new(&cfg, &server, err, sizeof err) != 0) {
        fprintf(stderr, "fuzz_rpc: %s\n", err);
        abort();
    }
    /* No client maps the pool here, so its name can go now: libFuzzer ends
     * a campaign (or a crash) without running atexit handlers, and the
     * segment must not outlive the process. */
    char shm[64];
    snprintf(shm, sizeof shm, "/%s%ld", LMC_L1_SHM_PREFIX, (long)getpid());
    shm_unlink(shm);
    CHECK(pthread_create(&server_thread, NULL, serve, server) == 0);
    zctx = zmq_ctx_new();
    dealer = zmq_socket(zctx, ZMQ_DEALER);
    int linger = 0;
    zmq_setsockopt(dealer, ZMQ_LINGER, &linger, sizeof linger);
    snprintf(url, sizeof url, "tcp://127.0.0.1:%s", port);
    CHECK(zmq_connect(dealer, url) == 0);
    atexit(stop_server);
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
        start_server();
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
    return 0;
}
