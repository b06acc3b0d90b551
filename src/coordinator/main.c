/* lmcached-coordinator: configuration from the environment only
 * (docs/coordinator.md). */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coordinator/coordinator.h"
#include "obs/log.h"

#ifndef LMC_VERSION_STRING
#define LMC_VERSION_STRING "0.0.0"
#endif

static const char USAGE[] =
    "usage: lmcached-coordinator [--help | --version]\n"
    "\n"
    "The fleet coordinator of lmcached servers (docs/coordinator.md).  It is\n"
    "configured from the environment only:\n"
    "  LMCACHE_MP_COORDINATOR_HOST / _PORT            bind (0.0.0.0 / 9300)\n"
    "  LMCACHE_MP_COORDINATOR_INSTANCE_TIMEOUT        s without heartbeat (30)\n"
    "  LMCACHE_MP_COORDINATOR_HEALTH_CHECK_INTERVAL   sweep period, 0 = off (10)\n"
    "  LMCACHE_MP_COORDINATOR_EVICTION_CHECK_INTERVAL eviction period, 0 = off (5)\n"
    "  LMCACHE_MP_COORDINATOR_EVICTION_RATIO          share of LRU keys per pass (0.2)\n"
    "  LMCACHE_MP_COORDINATOR_TRIGGER_WATERMARK       evict at usage >= x * quota (1.0)\n"
    "  LMCACHE_MP_COORDINATOR_CHUNK_SIZE / _HASH_ALGORITHM  as the servers (256 / blake3)\n"
    "  LMCACHE_MP_COORDINATOR_ENABLE_STARTUP_RESYNC   backfill from a server (true)\n"
    "  LMCACHE_MP_COORDINATOR_RESYNC_POLL_INTERVAL / _MAX_WAIT / _PAGE_SIZE (1 / 60 / 1000)\n"
    "  LMCACHE_MP_COORDINATOR_TIMEOUT_KEEP_ALIVE      idle connection timeout, s (10)\n"
    "  LMCACHE_MP_COORDINATOR_METRICS_ENABLED         GET /metrics (true)\n"
    "  LMCACHE_MP_COORDINATOR_DB_PATH                 SQLite file (./lmcached-coordinator.db)\n"
    "  LMCACHE_MP_COORDINATOR_AUTH_TOKEN              bearer token for writes (none)\n"
    "  LMCACHE_MP_COORDINATOR_SERVER_AUTH_TOKEN       token sent to the servers (none)\n"
    "  LMCACHE_MP_COORDINATOR_MAX_KEYS                keys the directory holds (10000000)\n"
    "  LMCACHE_MP_COORDINATOR_MAX_BUFFERED_MB         request bodies held at once, MiB (256)\n"
    "  LMCACHE_LOG_LEVEL                              DEBUG, INFO, WARNING, ERROR (INFO)\n";

int main(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h"))
            return fputs(USAGE, stdout), 0;
        if (!strcmp(argv[i], "--version"))
            return printf("lmcached-coordinator %s\n", LMC_VERSION_STRING), 0;
        fprintf(stderr, "lmcached-coordinator: unknown argument %s (configuration comes from "
                        "LMCACHE_MP_COORDINATOR_* variables; see --help)\n", argv[i]);
        return 2;
    }
    lmc_log_level level = LMC_LOG_INFO;
    const char *lv = getenv("LMCACHE_LOG_LEVEL");
    if (lv && !lmc_log_level_parse(lv, &level))
        fprintf(stderr, "lmcached-coordinator: LMCACHE_LOG_LEVEL=%s is not a level; INFO\n", lv);
    lmc_log_set_level(level);
    /* Signals are taken by sigwait below, so every thread must block them. */
    sigset_t stop;
    sigemptyset(&stop);
    sigaddset(&stop, SIGINT);
    sigaddset(&stop, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &stop, NULL);
    signal(SIGPIPE, SIG_IGN);
    /* A file-size limit (ulimit -f) reached by a database write must be a
     * failed write, answered 503 and retried by the sender, not a kill. */
    signal(SIGXFSZ, SIG_IGN);
    coordinator_config cfg;
    char err[512];
    lmc_coord *co = NULL;
    if (coordinator_config_from_env(&cfg, err, sizeof err) != 0 ||
        coordinator_start(&cfg, &co, err, sizeof err) != 0) {
        fprintf(stderr, "lmcached-coordinator: %s\n", err);
        return 1;
    }
    LMC_INFO("lmcached-coordinator %s listening on http://%s:%d", LMC_VERSION_STRING, cfg.host,
             coordinator_port(co));
    int sig = 0;
    sigwait(&stop, &sig);
    LMC_INFO("lmcached-coordinator: %s, stopping", sig == SIGINT ? "SIGINT" : "SIGTERM");
    coordinator_stop(co);
    return 0;
}
