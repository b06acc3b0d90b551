#include "modules/transfer/server/fault_guard.h"

#include <pthread.h>
#include <signal.h>
#include <string.h>

static _Thread_local sigjmp_buf *guard;
static pthread_once_t once = PTHREAD_ONCE_INIT;
static int install_rc;

static void on_sigbus(int sig, siginfo_t *info, void *uctx)
{
    (void)info, (void)uctx;
    sigjmp_buf *jb = guard;
    if (jb) {
        guard = NULL;
        siglongjmp(*jb, 1);
    }
    /* Not ours: the default action, as if no handler were installed. */
    signal(sig, SIG_DFL);
    raise(sig);
}

static void install(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_sigbus;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    install_rc = sigaction(SIGBUS, &sa, NULL);
}

int lmc_fault_guard_install(void)
{
    pthread_once(&once, install);
    return install_rc;
}

void lmc_fault_guard_enter(sigjmp_buf *jb)
{
    guard = jb;
}

void lmc_fault_guard_leave(void)
{
    guard = NULL;
}
