/* The tcp transfer channel's framing (p2p_wire.h, docs/p2p.md). */
#include "p2p/p2p_wire.h"
#include "p2p/p2p_ucx_wire.h"

#include <stdlib.h>
#include <string.h>


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

uint8_t *lmc_p2p_ucx_wire_blob(uint64_t base, uint64_t size, const void *addr, size_t addr_len,
                               const void *rkey, size_t rkey_len, size_t *len)
{
    if (addr_len > LMC_P2P_UCX_MAX_PART || rkey_len > LMC_P2P_UCX_MAX_PART)
        return NULL;
    *len = LMC_P2P_UCX_HDR + addr_len + rkey_len;
    uint8_t *b = malloc(*len);
    if (!b)
        return NULL;
    memcpy(b, LMC_P2P_UCX_MAGIC, 8);
    put64(b + 8, base);
    put64(b + 16, size);
    put32(b + 24, (uint32_t)addr_len);
    put32(b + 28, (uint32_t)rkey_len);
    memcpy(b + LMC_P2P_UCX_HDR, addr, addr_len);
    memcpy(b + LMC_P2P_UCX_HDR + addr_len, rkey, rkey_len);
    return b;
}

int lmc_p2p_ucx_wire_hdr(const uint8_t in[LMC_P2P_UCX_HDR], lmc_p2p_ucx_hdr *out)
{
    if (memcmp(in, LMC_P2P_UCX_MAGIC, 8) != 0)
        return -1;
    out->base = get64(in + 8);
    out->size = get64(in + 16);
    out->addr_len = get32(in + 24);
    out->rkey_len = get32(in + 28);
    if (out->addr_len == 0 || out->addr_len > LMC_P2P_UCX_MAX_PART ||
        out->rkey_len == 0 || out->rkey_len > LMC_P2P_UCX_MAX_PART)
        return -1;
    return 0;
}
