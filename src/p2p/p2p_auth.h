/* The token handshake of the transfer channel (docs/p2p.md, "Trust
 * model"): with the fleet's coordinator token set, a connection to the
 * channel proves the token before the engine's own protocol starts, both
 * ways, without sending it.  Little-endian as the rest of the channel:
 *
 *   client -> "LMP2PA01" || 16-byte client nonce
 *   server -> "LMP2PA01" || 16-byte server nonce
 *             || HMAC-SHA256(token, "lmcached p2p server" || cn || sn)
 *   client -> u8 h || h bytes of holder
 *             || HMAC-SHA256(token, "lmcached p2p client" || cn || sn || h || holder)
 *
 * then "LMTCP001" (tcp) or the bootstrap (ucx) as without a token.  The
 * holder (h <= 64 bytes, 0: none) names whose leases the connection reads
 * under: the routing id of the reader's message-queue connection, which
 * took them (docs/p2p.md, "Trust model"). */
#ifndef LMC_P2P_AUTH_H
#define LMC_P2P_AUTH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define LMC_P2P_AUTH_MAGIC "LMP2PA01"
#define LMC_P2P_AUTH_MAX_HOLDER 64

/* A token that switches the handshake on: non-NULL and non-empty. */
bool lmc_p2p_auth_wanted(const char *token);

/* The client's side on a connected socket: 0 when the server proved the
 * token and ours was sent, -1 otherwise (the caller closes fd).  deadline
 * as lmc_p2p_io_full. */
int lmc_p2p_auth_client(int fd, const char *token, const uint8_t *holder, size_t holder_len,
                        int64_t deadline);

/* The server's side: 0 when the client proved the token (the holder it
 * named in holder[0..*holder_len)), -1 when it did not, stalled past the
 * deadline or stop_fd became readable. */
int lmc_p2p_auth_server(int fd, const char *token, int stop_fd, int64_t deadline,
                        uint8_t holder[LMC_P2P_AUTH_MAX_HOLDER], size_t *holder_len);

#endif
