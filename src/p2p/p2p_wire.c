/* The tcp transfer channel's framing (p2p_wire.h, docs/p2p.md). */
#include "p2p/p2p_wire.h"


static void put32(uint8_t *p, uint32_t v)
{
    for (unsigned i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void put64(uint8_t *p, uint64_t v)
{
    for (unsigned i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t get32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t get64(const uint8_t *p)
{
    return (uint64_t)get32(p) | (uint64_t)get32(p + 4) << 32;
}

void lmc_p2p_wire_put_req_header(uint8_t out[LMC_P2P_REQ_HDR], uint32_t req_id, uint32_t n)
{
    put32(out, LMC_P2P_TYPE_REQ);
    put32(out + 4, req_id);
    put32(out + 8, n);
}

void lmc_p2p_wire_put_req_item(uint8_t out[LMC_P2P_REQ_ITEM], uint64_t off, uint64_t len)
{
    put64(out, off);
    put64(out + 8, len);
}

void lmc_p2p_wire_put_resp_header(uint8_t out[LMC_P2P_RESP_HDR], uint32_t req_id, uint32_t n)
{
    put32(out, LMC_P2P_TYPE_RESP);
    put32(out + 4, req_id);
    put32(out + 8, n);
    put32(out + 12, (uint32_t)lmc_p2p_wire_mask_len(n));
}

lmc_p2p_wire_status lmc_p2p_wire_req_header(const uint8_t in[LMC_P2P_REQ_HDR], uint32_t max_items,
                                            uint32_t *req_id, uint32_t *n)
{
    if (get32(in) != LMC_P2P_TYPE_REQ)
        return LMC_P2P_WIRE_BAD_TYPE;
    *req_id = get32(in + 4);
    *n = get32(in + 8);
    return *n > max_items ? LMC_P2P_WIRE_TOO_MANY : LMC_P2P_WIRE_OK;
}

void lmc_p2p_wire_req_item(const uint8_t in[LMC_P2P_REQ_ITEM], uint64_t *off, uint64_t *len)
{
    *off = get64(in);
    *len = get64(in + 8);
}

bool lmc_p2p_wire_range_ok(uint64_t off, uint64_t len, uint64_t arena_size)
{
    if (off > INT64_MAX || len > INT64_MAX || len == 0)
        return false;
    return off <= arena_size && len <= arena_size - off;
}

lmc_p2p_wire_status lmc_p2p_wire_resp_header(const uint8_t in[LMC_P2P_RESP_HDR], uint32_t req_id,
                                             uint32_t n)
{
    if (get32(in) != LMC_P2P_TYPE_RESP)
        return LMC_P2P_WIRE_BAD_TYPE;
    if (get32(in + 4) != req_id || get32(in + 8) != n ||
        get32(in + 12) != (uint32_t)lmc_p2p_wire_mask_len(n))
        return LMC_P2P_WIRE_MISMATCH;
    return LMC_P2P_WIRE_OK;
}
