/* The lmcached that fuzz_rpc and fuzz_http run inside their own process:
 * loopback only, chunk size 16, a 64 MiB L1 with LRU eviction, logging at
 * ERROR, every port chosen free by the kernel.  Started once, on the first
 * input; stopped at a normal exit. */
#ifndef LMC_FUZZ_EMBEDDED_SERVER_H
#define LMC_FUZZ_EMBEDDED_SERVER_H

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "check.h"
#include "config/config.h"
#include "obs/log.h"
#include "server/server.h"
#include "storage/l1/l1_arena.h"

typedef struct {
    lmc_server *server;
    lmc_config cfg;
    pthread_t thread;
    int zmq_port, http_port;   /* http_port 0 without the HTTP frontend */
} fuzz_server;

static fuzz_server fuzz_embedded;

/* A port the kernel says is free now (the corpus replays run beside other
 * tests under ctest -j). */
static inline int fuzz_free_port(void)
{
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    CHECK(s >= 0 && bind(s, (struct sockaddr *)&a, sizeof a) == 0 &&
          getsockname(s, (struct sockaddr *)&a, &len) == 0);
    close(s);
    return ntohs(a.sin_port);
}

static inline void *fuzz_serve(void *arg)
{
    lmc_server_run(arg, -1);
    return NULL;
}

/* At a normal exit: stop the server cleanly (its threads, its modules). */
static inline void fuzz_stop_server(void)
{
    lmc_server_stop(fuzz_embedded.server);
    pthread_join(fuzz_embedded.thread, NULL);
    lmc_server_free(fuzz_embedded.server);
    lmc_config_free(&fuzz_embedded.cfg);
}

/* One attempt on fresh ports: 0, or -1 with the reason in err. */
static inline int fuzz_try_start(fuzz_server *f, bool http, char *err, size_t errlen)
{
    char port[16], hport[16], mport[16];
    f->zmq_port = fuzz_free_port();
    f->http_port = http ? fuzz_free_port() : 0;
    snprintf(port, sizeof port, "%d", f->zmq_port);
    snprintf(hport, sizeof hport, "%d", f->http_port);
    snprintf(mport, sizeof mport, "%d", fuzz_free_port());
    char *args[] = {"lmcached", "--host", "127.0.0.1", "--port", port, "--chunk-size", "16",
                    "--l1-size-gb", "0.0625", "--eviction-policy", "LRU", "--log-level",
                    "ERROR", "--http-host", "127.0.0.1", "--prometheus-port", mport,
                    "--max-workers", "2", "--no-http", NULL, NULL};
    int argc = (int)(sizeof args / sizeof args[0]) - 2;
    if (http) {   /* the last two slots: --http-port N instead of --no-http */
        args[argc - 1] = "--http-port";
        args[argc++] = hport;
    }
    if (lmc_config_parse(&f->cfg, argc, args, NULL, stdout, err, errlen) != LMC_CONFIG_OK)
        return -1;
    if (lmc_server_new(&f->cfg, &f->server, err, errlen) != 0) {
        lmc_config_free(&f->cfg);
        return -1;
    }
    return 0;
}

static inline fuzz_server *fuzz_start_server(bool http)
{
    fuzz_server *f = &fuzz_embedded;
    char err[256] = "";
    lmc_log_set_level(LMC_LOG_ERROR);   /* main() does this for lmcached */
    /* The replays run beside other tests under ctest -j: a port seen free
     * can be taken before the server binds it, so try fresh ones. */
    int attempt = 0;
    while (fuzz_try_start(f, http, err, sizeof err) != 0) {
        if (++attempt == 3 || !strstr(err, "in use")) {
            fprintf(stderr, "fuzz: cannot start lmcached: %s\n", err);
            abort();
        }
    }
    /* No client maps the pool here, so its name can go now: libFuzzer ends
     * a campaign (or a crash) without running atexit handlers, and the
     * segment must not outlive the process. */
    char shm[64];
    snprintf(shm, sizeof shm, "/%s%ld", LMC_L1_SHM_PREFIX, (long)getpid());
    shm_unlink(shm);
    CHECK(pthread_create(&f->thread, NULL, fuzz_serve, f->server) == 0);
    atexit(fuzz_stop_server);
    return f;
}

#endif
