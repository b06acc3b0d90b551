/* lmcached in a child process, as it runs beside a real engine (separate
 * address space, allocator and page tables), for the benchmarks. */
#ifndef LMC_BENCH_SERVER_CHILD_H
#define LMC_BENCH_SERVER_CHILD_H

#include <sys/types.h>

#include "config/config.h"

/* Forks a child that serves `cfg` until SIGTERM.  Call it before this
 * process starts any thread.  The child's pid, or -1. */
pid_t bench_server_fork(lmc_config *cfg);
/* SIGTERM, then waits for the child (pid <= 0: nothing). */
void bench_server_kill(pid_t pid);

#endif
