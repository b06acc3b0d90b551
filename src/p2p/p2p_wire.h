/* The tcp transfer channel's wire format (docs/p2p.md, "Transfer channel";
 * docs/compatibility.md, "P2P transfer channel"): byte for byte what
 * upstream LMCache's tcp channel sends, all integers little-endian.
 *
 *   handshake  client -> "LMTCP001", server echoes the same 8 bytes
 *   request    u32 type=1, u32 request id, u32 n, then n x (i64 offset, i64 length)
 *   reply      u32 type=2, u32 request id, u32 n, u32 mask bytes = ceil(n/8),
 *              the mask (bit i%8 of byte i/8: item i is served), then the
 *              bytes of every served item, in order, each its requested length
 *
 * Pure functions over buffers, so that the fuzz target drives exactly the
 * code the sockets use. */
#ifndef LMC_P2P_WIRE_H
#define LMC_P2P_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define LMC_P2P_MAGIC "LMTCP001"
#define LMC_P2P_MAGIC_LEN 8u
#define LMC_P2P_REQ_HDR 12u
#define LMC_P2P_REQ_ITEM 16u
#define LMC_P2P_RESP_HDR 16u
#define LMC_P2P_TYPE_REQ 1u
#define LMC_P2P_TYPE_RESP 2u

typedef enum {
    LMC_P2P_WIRE_OK = 0,
    LMC_P2P_WIRE_BAD_TYPE,     /* not the message type this side expects */
    LMC_P2P_WIRE_TOO_MANY,     /* more items than this side's bound */
    LMC_P2P_WIRE_MISMATCH,     /* a reply to another request, or of another size */
} lmc_p2p_wire_status;

static inline size_t lmc_p2p_wire_mask_len(uint32_t n) { return ((size_t)n + 7u) / 8u; }
static inline bool lmc_p2p_wire_mask_get(const uint8_t *mask, uint32_t i)
{
    return (mask[i / 8u] >> (i % 8u)) & 1u;
}

void lmc_p2p_wire_put_req_header(uint8_t out[LMC_P2P_REQ_HDR], uint32_t req_id, uint32_t n);
void lmc_p2p_wire_put_req_item(uint8_t out[LMC_P2P_REQ_ITEM], uint64_t off, uint64_t len);
void lmc_p2p_wire_put_resp_header(uint8_t out[LMC_P2P_RESP_HDR], uint32_t req_id, uint32_t n);

/* A request's header: its id and item count, at most max_items. */
lmc_p2p_wire_status lmc_p2p_wire_req_header(const uint8_t in[LMC_P2P_REQ_HDR], uint32_t max_items,
                                            uint32_t *req_id, uint32_t *n);
/* One item as sent: the raw two's-complement offset and length. */
void lmc_p2p_wire_req_item(const uint8_t in[LMC_P2P_REQ_ITEM], uint64_t *off, uint64_t *len);
/* Whether [off, off+len) is a non-empty range inside an arena of
 * arena_size bytes; the lengths are the signed i64s of the wire, so an
 * offset or length with the top bit set (negative upstream) is refused,
 * and off+len is never computed where it could wrap. */
bool lmc_p2p_wire_range_ok(uint64_t off, uint64_t len, uint64_t arena_size);
/* A reply's header, held against the request it must answer. */
lmc_p2p_wire_status lmc_p2p_wire_resp_header(const uint8_t in[LMC_P2P_RESP_HDR], uint32_t req_id,
                                             uint32_t n);

#endif
