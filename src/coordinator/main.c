/* lmcached-coordinator: configuration from the environment over an
 * optional JSON file (docs/coordinator.md, "Configuration"). */
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
#ifndef LMC_COMMIT_STRING
#define LMC_COMMIT_STRING "NA"
#endif

static const char USAGE[] =
    "usage: lmcached-coordinator [--config FILE] [--print-config] [--help | --version]\n"
    "\n"
    "The fleet coordinator of lmcached servers (docs/coordinator.md).  It is\n"
    "configured from the environment, over the JSON object of FILE whose keys\n"
    "are these names after LMCACHE_MP_COORDINATOR_ in lower case (\"port\": 9300).\n"
    "--print-config prints the settings in effect as JSON and exits.\n"
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
    "  LMCACHE_MP_COORDINATOR_DB_PATH                 SQLite file ($STATE_DIRECTORY/coordinator.db,\n"
    "                                                 else $XDG_STATE_HOME or ~/.local/state\n"
    "                                                 /lmcached/coordinator.db)\n"
    "  LMCACHE_MP_COORDINATOR_AUTH_TOKEN              bearer token for writes (none)\n"
    "  LMCACHE_MP_COORDINATOR_SERVER_AUTH_TOKEN       token sent to the servers (none)\n"
    "  LMCACHE_MP_COORDINATOR_MAX_KEYS                keys the directory holds (10000000)\n"
    "  LMCACHE_MP_COORDINATOR_MAX_BUFFERED_MB         request bodies held at once, MiB (256)\n"
    "  LMCACHE_LOG_LEVEL                              DEBUG, INFO, WARNING, ERROR (INFO)\n"
    "  LMCACHE_LOG_FORMAT                             text or json, one object a line (text)\n";

typedef struct {
    const char *config_file;
    bool print_config;
} options;

/* -1: go on; else the exit status. */
static int parse_args(int argc, char **argv, options *o)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h"))
            return fputs(USAGE, stdout), 0;
        if (!strcmp(a, "--version"))
            return printf("lmcached-coordinator %s (commit %s)\n", LMC_VERSION_STRING,
                          LMC_COMMIT_STRING), 0;
        if (!strcmp(a, "--print-config")) {
            o->print_config = true;
        } else if (!strncmp(a, "--config=", 9) && a[9]) {
            o->config_file = a + 9;
        } else if (!strcmp(a, "--config") && i + 1 < argc) {
            o->config_file = argv[++i];
        } else {
            fprintf(stderr, "lmcached-coordinator: %s%s (the arguments are --config FILE, "
                            "--print-config, --help, --version; the settings are "
                            "LMCACHE_MP_COORDINATOR_* variables, see --help)\n",
                    !strcmp(a, "--config") ? "--config needs a FILE" : "unknown argument ",
                    !strcmp(a, "--config") ? "" : a);
            return 2;
        }
    }
    return -1;
}

static int print_config(const coordinator_config *cfg)
{
    char *text = coordinator_config_print(cfg);
    if (!text)
        return fputs("lmcached-coordinator: out of memory\n", stderr), 1;
    puts(text);
    free(text);
    return 0;
}

/* The two logging variables lmcached reads too (docs/coordinator.md,
 * "Logs"); like every other setting, a bad value refuses the start. */
static int set_up_logging(void)
{
    lmc_log_level level = LMC_LOG_INFO;
    lmc_log_format format = LMC_LOG_TEXT;
    const char *lv = getenv("LMCACHE_LOG_LEVEL"), *lf = getenv("LMCACHE_LOG_FORMAT");
    if (lv && !lmc_log_level_parse(lv, &level))
        return fprintf(stderr, "lmcached-coordinator: LMCACHE_LOG_LEVEL=%.64s is not DEBUG, "
                               "INFO, WARNING or ERROR\n", lv), -1;
    if (lf && !lmc_log_format_parse(lf, &format))
        return fprintf(stderr, "lmcached-coordinator: LMCACHE_LOG_FORMAT=%.64s is not text or "
                               "json\n", lf), -1;
    lmc_log_set_level(level);
    lmc_log_set_format(format);
    return 0;
}

int main(int argc, char **argv)
{
    options o = {0};
    int rc = parse_args(argc, argv, &o);
    if (rc >= 0)
        return rc;
    if (set_up_logging() != 0)
        return 2;
    coordinator_config cfg;
    char err[8192];
    if (coordinator_config_load(&cfg, o.config_file, err, sizeof err) != 0)
        return fprintf(stderr, "lmcached-coordinator: %s\n", err), 1;
    if (o.print_config)
        return print_config(&cfg);
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
    LMC_INFO("lmcached-coordinator %s (commit %s), database %s (from %s)%s%s",
             LMC_VERSION_STRING, LMC_COMMIT_STRING, cfg.db_path, cfg.db_path_origin,
             o.config_file ? ", settings from --config " : "", o.config_file ? o.config_file : "");
    lmc_coord *co = NULL;
    if (coordinator_start(&cfg, &co, err, sizeof err) != 0)
        return fprintf(stderr, "lmcached-coordinator: %s\n", err), 1;
    LMC_INFO("coordinator: listening on http://%s:%d", cfg.host, coordinator_port(co));
    int sig = 0;
    sigwait(&stop, &sig);
    LMC_INFO("lmcached-coordinator: %s, stopping", sig == SIGINT ? "SIGINT" : "SIGTERM");
    coordinator_stop(co);
    return 0;
}
