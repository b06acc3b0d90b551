/* Copies out of and into an engine's shared memory must survive the engine
 * shrinking its segment under them (ftruncate after registering): the
 * kernel then sends SIGBUS on the next access of a page past the end.  A
 * copy runs guarded; a SIGBUS in a guarded copy returns to its guard, which
 * fails that one request (docs/protocol.md, "Server-driven transfer ops").
 * A SIGBUS anywhere else is left to its default action.
 *
 * The handler is process-wide state by nature; it is installed once and
 * finds the guard of the faulting thread in thread-local storage. */
#ifndef LMC_MODULES_TRANSFER_SERVER_FAULT_GUARD_H
#define LMC_MODULES_TRANSFER_SERVER_FAULT_GUARD_H

#include <setjmp.h>
#include <stdbool.h>

/* Installs the SIGBUS handler once; 0, or -1 (errno) when it cannot. */
int lmc_fault_guard_install(void);

/*   sigjmp_buf jb;
 *   if (sigsetjmp(jb, 1) == 0) {
 *       lmc_fault_guard_enter(&jb);
 *       ... copies ...
 *       lmc_fault_guard_leave();
 *   } else {
 *       lmc_fault_guard_leave();   ... the memory went away ...
 *   }
 * (the mask is saved so that SIGBUS is unblocked again after a jump) */
void lmc_fault_guard_enter(sigjmp_buf *jb);
void lmc_fault_guard_leave(void);

#endif
