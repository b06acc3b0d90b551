/* lmcached: the LMCache multiprocess KV-cache server. */
#include <curl/curl.h>
#include <malloc.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include "config/config.h"
#include "obs/log.h"
#include "server/server.h"

#ifndef LMC_VERSION_STRING
#define LMC_VERSION_STRING "0.0.0"
#endif
#ifndef LMC_COMMIT_STRING
#define LMC_COMMIT_STRING "NA"
#endif

extern char **environ;

/* SIGINT/SIGTERM are blocked in every thread and read through a signalfd by
 * the socket thread: shutdown runs as ordinary code, no handler state. */
static int open_stop_signalfd(void)
{
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    if (pthread_sigmask(SIG_BLOCK, &set, NULL) != 0)
        return -1;
    signal(SIGPIPE, SIG_IGN);
    return signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK);
}

int main(int argc, char **argv)
{
    lmc_config cfg;
    char err[512];
    switch (lmc_config_parse(&cfg, argc, argv, environ, stdout, err, sizeof err)) {
    case LMC_CONFIG_OK:
        break;
    case LMC_CONFIG_EXIT_OK:
        return 0;
    default:
        fprintf(stderr, "lmcached: error: %s\n", err);
        return 2;
    }
    if (lmc_config_check_built(&cfg, err, sizeof err) != 0) {
        fprintf(stderr, "lmcached: error: %s\n", err);
        lmc_config_free(&cfg);
        return 2;
    }
    lmc_log_level level = LMC_LOG_INFO;
    lmc_log_level_parse(cfg.mp.log_level, &level);
    lmc_log_set_level(level);
    lmc_log_format format = LMC_LOG_TEXT;
    lmc_log_format_parse(cfg.mp.log_format, &format);
    lmc_log_set_format(format);
    /* First, so that every log an operator sends names what produced it. */
    LMC_INFO("lmcached %s (commit %s), instance %s", LMC_VERSION_STRING, LMC_COMMIT_STRING,
             cfg.mp.instance_id);
    if (cfg.http.auth_token_file && (cfg.http.auth_token_file_mode & 0077))
        LMC_WARN("--http-auth-token-file %s has mode %04o: other users of this machine can read "
                 "the token; chmod 600 it (docs/http.md, \"Authentication\")",
                 cfg.http.auth_token_file, cfg.http.auth_token_file_mode);

    /* A long prompt's per-request buffers (token ids, decoded frames) are a
     * few hundred KiB: glibc would mmap and unmap each one, paying page
     * faults on every LOOKUP.  Keep them in the reusable heap instead. */
    mallopt(M_MMAP_THRESHOLD, 64 << 20);
    mallopt(M_TRIM_THRESHOLD, 256 << 20);

    /* libcurl's global set-up is not thread-safe: do it before any thread
     * (the S3 adapter, OTLP export) could trigger it lazily. */
    curl_global_init(CURL_GLOBAL_DEFAULT);

    int stop_fd = open_stop_signalfd(); /* before any thread starts */
    if (stop_fd < 0) {
        perror("lmcached: signalfd");
        lmc_config_free(&cfg);
        return 1;
    }
    lmc_server *server;
    if (lmc_server_new(&cfg, &server, err, sizeof err) != 0) {
        fprintf(stderr, "lmcached: cannot start: %s\n", err);
        close(stop_fd);
        lmc_config_free(&cfg);
        return 1;
    }
    int rc = lmc_server_run(server, stop_fd);
    LMC_INFO("shutting down");
    lmc_server_free(server);
    close(stop_fd);
    lmc_config_free(&cfg);
    curl_global_cleanup();
    LMC_INFO("bye");
    return rc == 0 ? 0 : 1;
}
