#include "common/server_child.h"

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

#include "server/server.h"

static void *serve(void *srv)
{
    pthread_setname_np(pthread_self(), "lmc-socket");   /* tells it from the client in perf */
    lmc_server_run(srv, -1);
    return NULL;
}

/* SIGTERM is blocked before any thread starts (threads inherit the mask),
 * so that only sigwait() receives the parent's SIGTERM. */
static int server_child(lmc_config *cfg)
{
    sigset_t term;
    sigemptyset(&term);
    sigaddset(&term, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &term, NULL);
    char err[256];
    lmc_server *srv;
    if (lmc_server_new(cfg, &srv, err, sizeof err) != 0) {
        fprintf(stderr, "bench: %s\n", err);
        return 1;
    }
    pthread_t th;
    pthread_create(&th, NULL, serve, srv);
    int sig;
    sigwait(&term, &sig);
    lmc_server_stop(srv);
    pthread_join(th, NULL);
    lmc_server_free(srv);
    return 0;
}

pid_t bench_server_fork(lmc_config *cfg)
{
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0)
        _exit(server_child(cfg));
    return pid;
}

void bench_server_kill(pid_t pid)
{
    if (pid > 0) {
        kill(pid, SIGTERM);
        waitpid(pid, NULL, 0);
    }
}
