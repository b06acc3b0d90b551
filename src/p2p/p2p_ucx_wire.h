/* The ucx engine's bootstrap answer (docs/p2p.md, "ucx"): what a peer
 * needs for one-sided reads of the arena, sent once per TCP connection to
 * the listen URL, which the server then closes.  Little-endian:
 *
 *   "LMUCX001", u64 arena base address, u64 arena size,
 *   u32 worker address length A, u32 remote key length K, A bytes, K bytes
 *
 * Ours: upstream has no ucx channel to be compatible with. */
#ifndef LMC_P2P_UCX_WIRE_H
#define LMC_P2P_UCX_WIRE_H

#include <stddef.h>
#include <stdint.h>

#define LMC_P2P_UCX_MAGIC "LMUCX001"
#define LMC_P2P_UCX_HDR 32u
#define LMC_P2P_UCX_MAX_PART 65536u   /* bound on A and K from the wire */

typedef struct {
    uint64_t base, size;
    uint32_t addr_len, rkey_len;
} lmc_p2p_ucx_hdr;

/* A malloc'ed answer of *len bytes; NULL for no memory or parts over the bound. */
uint8_t *lmc_p2p_ucx_wire_blob(uint64_t base, uint64_t size, const void *addr, size_t addr_len,
                               const void *rkey, size_t rkey_len, size_t *len);
/* The header of an answer: 0, or -1 for another magic or parts over the bound. */
int lmc_p2p_ucx_wire_hdr(const uint8_t in[LMC_P2P_UCX_HDR], lmc_p2p_ucx_hdr *out);

#endif
