/* The serving side of P2P between cache servers (docs/p2p.md, "Serving
 * side"): ops 29-31 on the message-queue server, and the check the
 * transfer channel makes before it reads this server's L1 arena for a
 * peer. */
#ifndef LMC_MODULES_P2P_P2P_SERVE_H
#define LMC_MODULES_P2P_P2P_SERVE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "modules/module.h"

/* P2P_LOOKUP_AND_LOCK, P2P_QUERY_LOOKUP_RESULTS, P2P_UNLOCK_OBJECTS. */
extern const lmc_module_def lmc_p2p_serve_module;

/* Per-server bounds (docs/p2p.md, "Bounds"). */
#define LMC_P2P_SERVE_MAX_KEYS 16384         /* keys in one request */
#define LMC_P2P_SERVE_MAX_LEASES 65536       /* objects leased to peers at once */
#define LMC_P2P_SERVE_MAX_TASKS 1024         /* lookup results not yet queried */
#define LMC_P2P_SERVE_MAX_RESULTS (1u << 20) /* their addresses, all together (16 MiB) */
#define LMC_P2P_SERVE_MAX_GROUPS 256         /* entries of group_layout_descs */
#define LMC_P2P_SERVE_RESULT_LIFE_MS 60000   /* an unqueried result (or the lease TTL) */

/* The transfer channel's read check, to hand to it with the module's state
 * as `user`: true when every byte of [offset, offset + len) of the L1 arena
 * lies inside objects that P2P_LOOKUP_AND_LOCK leased to peers and that
 * were neither unlocked nor outlived their lease (the L1 read-lock TTL).
 * With a holder (the routing id a peer's message-queue connection uses,
 * named by that peer on the channel: docs/p2p.md, "Trust model"), only the
 * leases that connection took count; NULL: anyone's.  Thread-safe, never
 * blocks for long; false for a NULL user (the module is not loaded), len 0
 * or a range that wraps around. */
bool lmc_p2p_serve_may_read(void *user, const uint8_t *holder, size_t holder_len,
                            uint64_t offset, uint64_t len);

#endif
