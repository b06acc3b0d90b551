/* POST /cache/checksums (docs/http.md): MD5 digests of a registered
 * engine's KV blocks, chunk by chunk, to compare what two engines (or an
 * engine before and after a retrieve) hold without moving the bytes. */
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "modules/transfer/server/fault_guard.h"
#include "core/hex.h"
#include "modules/transfer/server/checksums.h"
#include "modules/transfer/server/server_internal.h"

#define MAX_IDS (1u << 20)

typedef struct {
    const int64_t *ids;
    size_t n, per_chunk;
    bool layerwise;
    int64_t instance;
} cks_request;

static json_t *fail(unsigned *status, unsigned code, char *err, size_t errlen, const char *why)
{
    *status = code;
    snprintf(err, errlen, "%s", why);
    return NULL;
}

/* Which axis of the layer's tensor indexes blocks: 1 for the K/V-first
 * formats, 0 for the blocks-first ones; -1 where blocks are not an axis of
 * their own (SGLang's folded pages, cross-layer tensors). */
static int block_axis(lmc_kv_format f)
{
    switch (f) {
    case LMC_KV_NL_X_TWO_NB_BS_NH_HS:
    case LMC_KV_NL_X_TWO_NB_NH_BS_HS:
        return 1;
    case LMC_KV_NL_X_NB_TWO_BS_NH_HS:
    case LMC_KV_NL_X_NB_TWO_NH_BS_HS:
    case LMC_KV_NL_X_NB_BS_HS:
    case LMC_KV_NL_X_NB_BS_NH_TWO_HS:
    case LMC_KV_NL_X_NB_BS_NH_HS:
    case LMC_KV_NL_X_NB_NH_BS_TWO_HS:
        return 0;
    default:
        return -1;
    }
}

/* Hashes `n` elements, bfloat16 widened to float32 as upstream hashes it. */
static void digest_elems(EVP_MD_CTX *md, const uint8_t *p, uint64_t n, uint32_t es, bool bf16)
{
    if (!bf16) {
        EVP_DigestUpdate(md, p, n * es);
        return;
    }
    uint8_t buf[4096];
    for (uint64_t i = 0; i < n;) {
        size_t k = 0;
        for (; k < sizeof buf / 4 && i < n; k++, i++) {
            buf[4 * k] = buf[4 * k + 1] = 0;
            buf[4 * k + 2] = p[2 * i];
            buf[4 * k + 3] = p[2 * i + 1];
        }
        EVP_DigestUpdate(md, buf, 4 * k);
    }
}

/* Where digest_layer gets a block's bytes: copied into `scratch` first, a
 * run of adjoining blocks at a time (one cudaMemcpy per block would make a
 * long id list take minutes): from the device for CUDA tensors, from the
 * mapped segment under the SIGBUS guard otherwise, since an engine may
 * shrink its segment under the read as under a STORE. */
typedef struct {
    const sd_mod *m;
    const sd_ctx *c;
    uint8_t *scratch;
    uint64_t scratch_bytes;      /* a run read at once fits in it */
    char *err;
    size_t errlen;
} block_reader;

#define READ_BYTES (1u << 20)   /* ~0.1 ms a read over PCIe */

/* memcpy from an engine's segment; false when its pages went away. */
static bool guarded_copy(uint8_t *dst, const uint8_t *src, uint64_t bytes)
{
    sigjmp_buf jb;
    if (sigsetjmp(jb, 1) != 0) {
        lmc_fault_guard_leave();
        return false;
    }
    lmc_fault_guard_enter(&jb);
    memcpy(dst, src, bytes);
    lmc_fault_guard_leave();
    return true;
}

static const uint8_t *read_piece(const block_reader *r, uint32_t kg, uint32_t pos,
                                 uint64_t byte_offset, uint64_t bytes)
{
    if (!r->c->cuda) {
        if (guarded_copy(r->scratch, r->c->bases[kg][pos] + byte_offset, bytes))
            return r->scratch;
        snprintf(r->err, r->errlen, "instance %lld's memory went away under the read (a "
                                    "segment shrank)", (long long)r->c->instance_id);
        return NULL;
    }
    const lmc_cuda_ops *ops = r->m->cuda.ops;
    return ops->read(r->c->cu.device, r->c->cu.tensors[kg][pos] + byte_offset, r->scratch, bytes,
                     r->err, r->errlen) == 0
               ? r->scratch
               : NULL;
}

/* Digests, for plane kv of tensor pos, blocks ids[from, to): `elems`
 * elements from each block's start, runs of consecutive ids whose pieces
 * adjoin in memory read as one. */
static int digest_blocks(EVP_MD_CTX *md, const block_reader *r, uint32_t kg, uint32_t pos,
                         uint32_t kv, const int64_t *ids, size_t from, size_t to, uint64_t elems,
                         bool bf16)
{
    const lmc_kv_geometry *k = &r->c->plan.kg[kg].geo;
    uint64_t es = k->element_size;
    for (size_t i = from; i < to;) {
        uint64_t first = lmc_kv_paged_offset(k, kv, 0, (uint64_t)ids[i], 0, 0, 0);
        size_t n = 1;
        while (i + n < to && ids[i + n] == ids[i] + (int64_t)n &&
               (n + 1) * elems * es <= r->scratch_bytes &&
               lmc_kv_paged_offset(k, kv, 0, (uint64_t)ids[i + n], 0, 0, 0) ==
                   first + n * elems)
            n++;
        const uint8_t *p = read_piece(r, kg, pos, first * es, n * elems * es);
        if (!p)
            return -1;
        digest_elems(md, p, n * elems, (uint32_t)es, bf16);
        i += n;
    }
    return 0;
}

/* One layer's bytes of blocks ids[from, to), as the gathered tensor lays
 * them out row-major. */
static int digest_layer(EVP_MD_CTX *md, const block_reader *r, uint32_t kg, uint32_t pos,
                        const int64_t *ids, size_t from, size_t to, bool bf16)
{
    const lmc_kv_geometry *k = &r->c->plan.kg[kg].geo;
    uint64_t block = (uint64_t)k->bs * k->nh * k->hs;
    if (block_axis(k->format) == 1)   /* [2, NB, ...]: K blocks, then V blocks */
        return digest_blocks(md, r, kg, pos, 0, ids, from, to, block, bf16) != 0 ||
                       digest_blocks(md, r, kg, pos, 1, ids, from, to, block, bf16) != 0
                   ? -1
                   : 0;
    /* a blocks-first block holds K and V */
    return digest_blocks(md, r, kg, pos, 0, ids, from, to, block * k->kv_size, bf16);
}

static bool hex_digest(EVP_MD_CTX *md, char out[33])
{
    unsigned char d[EVP_MAX_MD_SIZE];
    unsigned len = 0;
    if (EVP_DigestFinal_ex(md, d, &len) != 1)
        return false;
    lmc_hex_encode(d, len < 16 ? len : 16, out);
    return true;
}

/* The kernel group and position of registered tensor t, or NULL. */
static const lmc_kv_kernel_group *group_of(const sd_ctx *c, uint32_t t, uint32_t *pos,
                                           uint32_t *kg)
{
    for (uint32_t g = 0; g < c->plan.n_kg; g++)
        for (uint32_t i = 0; i < c->plan.kg[g].n_tensors; i++)
            if (c->plan.kg[g].tensors[i] == t)
                return *pos = i, *kg = g, &c->plan.kg[g];
    return NULL;
}

/* Digests of chunk range [from, to) of the blocks: one for all layers, or
 * one per layer into `per_layer` (an array of arrays). */
static int digest_chunk(const block_reader *br, const cks_request *r, size_t from, size_t to,
                        json_t *flat, json_t *per_layer)
{
    const sd_ctx *c = br->c;
    EVP_MD_CTX *md = EVP_MD_CTX_new();
    int rc = md && EVP_DigestInit_ex(md, EVP_md5(), NULL) == 1 ? 0 : -1;
    char hex[33];
    for (uint32_t l = 0; rc == 0 && l < c->n_tensors; l++) {
        uint32_t pos = 0, kg = 0;   /* checksums() checked every layer has a group */
        const lmc_kv_kernel_group *g = group_of(c, l, &pos, &kg);
        bool bf16 = strcmp(c->plan.dtype, "bfloat16") == 0 && g->geo.element_size == 2;
        if (digest_layer(md, br, kg, pos, r->ids, from, to, bf16) != 0) {
            rc = -2;
            break;
        }
        if (r->layerwise) {
            rc = hex_digest(md, hex) && EVP_DigestInit_ex(md, EVP_md5(), NULL) == 1 &&
                         json_array_append_new(json_array_get(per_layer, l),
                                               json_string(hex)) == 0
                     ? 0
                     : -1;
        }
    }
    if (rc == 0 && !r->layerwise)
        rc = hex_digest(md, hex) && json_array_append_new(flat, json_string(hex)) == 0 ? 0 : -1;
    EVP_MD_CTX_free(md);
    return rc;
}

/* "0,[2,5],8": single ids, and runs of consecutive ids as [first,last]. */
static json_t *id_ranges(const int64_t *ids, size_t n)
{
    size_t cap = n * 48 + 1, len = 0;
    char *s = malloc(cap);
    if (!s)
        return NULL;
    s[0] = '\0';
    for (size_t i = 0; i < n;) {
        size_t j = i;
        while (j + 1 < n && ids[j + 1] == ids[j] + 1)
            j++;
        len += (size_t)snprintf(s + len, cap - len, j > i ? "%s[%lld,%lld]" : "%s%lld",
                                i ? "," : "", (long long)ids[i], (long long)ids[j]);
        i = j + 1;
    }
    json_t *out = json_string(s);
    free(s);
    return out;
}

static json_t *checksums(const sd_mod *m, const sd_ctx *c, const cks_request *r,
                         unsigned *status, char *err, size_t errlen)
{
    uint64_t piece = 0;   /* the largest one-block piece digest_layer reads */
    for (uint32_t l = 0; l < c->n_tensors; l++) {
        uint32_t pos, kg;
        const lmc_kv_kernel_group *g = group_of(c, l, &pos, &kg);
        if (!g || block_axis(g->geo.format) < 0)
            return fail(status, 501, err, errlen,
                        g ? "checksums of this KV format are not supported"
                          : "a layer shares another layer's KV cache");
        for (size_t i = 0; i < r->n; i++)
            if (r->ids[i] < 0 || (uint64_t)r->ids[i] >= g->geo.nb)
                return fail(status, 400, err, errlen, "a block id is outside the KV cache");
        const lmc_kv_geometry *k = &g->geo;
        uint64_t bytes = (uint64_t)k->bs * k->nh * k->hs * k->kv_size * k->element_size;
        piece = bytes > piece ? bytes : piece;
    }
    block_reader br = {.m = m, .c = c, .err = err, .errlen = errlen,
                       .scratch_bytes = piece > READ_BYTES ? piece : READ_BYTES};
    if (!(br.scratch = malloc(br.scratch_bytes)))
        return fail(status, 500, err, errlen, "out of memory");
    size_t chunks = (r->n + r->per_chunk - 1) / r->per_chunk;
    json_t *flat = json_array(), *layers = json_array(), *by_name = json_object();
    for (uint32_t l = 0; l < c->n_tensors; l++)
        json_array_append_new(layers, json_array());
    int rc = flat && layers && by_name ? 0 : -1;
    for (size_t ch = 0; rc == 0 && ch < chunks; ch++) {
        size_t to = (ch + 1) * r->per_chunk;
        rc = digest_chunk(&br, r, ch * r->per_chunk, to < r->n ? to : r->n, flat, layers);
    }
    free(br.scratch);
    for (uint32_t l = 0; rc == 0 && r->layerwise && l < c->n_tensors; l++) {
        char name[24];
        snprintf(name, sizeof name, "layer_%u", l);
        rc = json_object_set(by_name, name, json_array_get(layers, l));
    }
    json_t *out = rc == 0 ? json_pack("{s:s, s:I, s:I, s:O, s:b, s:o?}", "status", "success",
                                      "chunk_size", (json_int_t)r->per_chunk, "num_chunks",
                                      (json_int_t)chunks, "chunk_checksums",
                                      r->layerwise ? by_name : flat, "layerwise", r->layerwise,
                                      "block_id_ranges", id_ranges(r->ids, r->n))
                          : NULL;
    json_decref(flat);
    json_decref(layers);
    json_decref(by_name);
    if (rc == -2)   /* the read failed: err says why */
        return *status = 500, NULL;
    return out ? out : fail(status, 500, err, errlen, "out of memory");
}

static int decode(const json_t *body, cks_request *r, int64_t **ids, char *err, size_t errlen)
{
    const json_t *list = json_object_get(body, "block_ids"), *cs = json_object_get(body, "chunk_size");
    const json_t *inst = json_object_get(body, "instance_id"), *lw = json_object_get(body, "layerwise");
    if (!json_is_array(list) || json_array_size(list) == 0 || json_array_size(list) > MAX_IDS)
        return snprintf(err, errlen, "block_ids must be a list of 1..%u ints", MAX_IDS), -1;
    if (!json_is_integer(cs) || json_integer_value(cs) <= 0)
        return snprintf(err, errlen, "chunk_size must be a positive int (blocks per chunk)"), -1;
    if ((inst && !json_is_integer(inst)) || (lw && !json_is_boolean(lw)))
        return snprintf(err, errlen, "instance_id must be an int and layerwise a bool"), -1;
    *r = (cks_request){.n = json_array_size(list), .per_chunk = (size_t)json_integer_value(cs),
                       .layerwise = json_is_true(lw),
                       .instance = inst ? json_integer_value(inst) : 0};
    if (!(*ids = malloc(r->n * sizeof **ids)))
        return snprintf(err, errlen, "out of memory"), -2;
    for (size_t i = 0; i < r->n; i++) {
        const json_t *v = json_array_get(list, i);
        if (!json_is_integer(v))
            return snprintf(err, errlen, "block_ids must hold ints"), -1;
        (*ids)[i] = json_integer_value(v);
    }
    r->ids = *ids;
    return 0;
}

json_t *lmc_server_driven_checksums(void *module_state, const json_t *body, unsigned *status, char *err,
                         size_t errlen)
{
    sd_mod *m = module_state;
    cks_request r;
    int64_t *ids = NULL;
    int rc = decode(body, &r, &ids, err, errlen);
    json_t *out = NULL;
    if (rc != 0) {
        *status = rc == -2 ? 500 : 400;
    } else {
        sd_ctx *c = lmc_server_driven_get(m, r.instance);
        if (!c) {
            *status = 404;
            snprintf(err, errlen, "instance_id %lld is not registered", (long long)r.instance);
        } else {
            out = checksums(m, c, &r, status, err, errlen);
            lmc_server_driven_put(m, c);
        }
    }
    free(ids);
    return out;
}
