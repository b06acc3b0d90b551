/* Fuzz target: the CacheBlend request decoders (src/modules/blend/blend_wire.c,
 * docs/cacheblend.md "Blend RPCs on the wire") on arbitrary frames.  The
 * first byte picks the RPC (% 5: handshake, register_rope, unregister_rope,
 * unified_lookup, retrieve_pre_computed); the rest is cut into payload
 * frames, one msgpack value each, the last frame taking whatever does not
 * parse.  An accepted request must satisfy the invariants the handlers rely
 * on, and a retrieve's matches must re-encode into a well-formed reply; a
 * refused one has a reason and nothing left to free. */
#include "check.h"
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "modules/blend/blend_wire.h"
#include "rpc/wire.h"

#define CHUNK 16
#define MAX_FRAMES 7

static size_t split(const uint8_t *data, size_t len, lmc_blend_frame *f)
{
    lmc_mp_reader r;
    lmc_mpr_init(&r, data, len);
    size_t n = 0;
    while (n < MAX_FRAMES && !lmc_mpr_at_end(&r)) {
        const uint8_t *start = r.p;
        if (n + 1 == MAX_FRAMES || !lmc_mpr_skip(&r, 16))
            r.p = r.end;
        f[n++] = (lmc_blend_frame){start, (size_t)(r.p - start)};
    }
    return n;
}

static int rope(const lmc_blend_frame *f, size_t n, char *err, size_t errlen)
{
    lmc_blend_register_rope r;
    int rc = lmc_blend_decode_register_rope(f, n, &r, err, errlen);
    if (rc != 0) {
        CHECK(!r.caches && !r.group_to_cache && !r.group_rot);
        return rc;
    }
    CHECK(r.n_caches <= LMC_BLEND_MAX_ROPE_CACHES && r.head_size >= 1);
    for (uint32_t i = 0; i < r.n_caches; i++)
        CHECK(r.caches[i].ndim == 2 && r.caches[i].shape[1] % 2 == 0);
    for (uint32_t g = 0; g < r.n_group_to_cache; g++)
        CHECK(r.group_to_cache[g] < r.n_caches || r.group_to_cache[g] == LMC_BLEND_NO_CACHE);
    for (uint32_t g = 0; g < r.n_group_rot; g++)
        CHECK(!r.group_rot[g].rotate ||
              (r.group_rot[g].width > 0 &&
               (uint64_t)r.group_rot[g].offset + r.group_rot[g].width <= LMC_BLEND_MAX_ROW_ELEMS));
    lmc_blend_register_rope_free(&r);
    return 0;
}

static int retrieve(const lmc_blend_frame *f, size_t n, char *err, size_t errlen)
{
    lmc_blend_retrieve r;
    int rc = lmc_blend_decode_retrieve(f, n, CHUNK, &r, err, errlen);
    if (rc != 0) {
        CHECK(!r.matches && !r.blocks && !r.key.tokens);
        return rc;
    }
    CHECK(r.key.has_worker && r.n_matches <= LMC_BLEND_MAX_MATCHES);
    CHECK(r.event_len == 0 || r.event_len == LMC_BLEND_EVENT_BYTES);
    uint64_t total = 0;
    for (uint32_t g = 0; g < r.n_groups; g++)
        for (uint32_t i = 0; i < r.group_len[g]; i++, total++)
            CHECK(r.blocks[g][i] <= INT32_MAX);
    CHECK(total <= LMC_BLEND_MAX_BLOCKS);
    for (size_t i = 0; i < r.n_matches; i++) {
        const lmc_blend_match *m = &r.matches[i];
        CHECK(m->old_ed == m->old_st + CHUNK && m->cur_ed == m->cur_st + CHUNK);
        CHECK(m->old_st <= LMC_BLEND_MAX_POSITION && m->cur_st <= LMC_BLEND_MAX_POSITION);
    }
    msgpack_sbuffer sb;
    msgpack_packer pk;
    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    CHECK(lmc_blend_encode_lookup_result(&pk, 0, r.matches, r.n_matches, NULL, 0) == 0);
    CHECK(lmc_mp_validate((const uint8_t *)sb.data, sb.size, 4));
    msgpack_sbuffer_destroy(&sb);
    lmc_blend_retrieve_free(&r);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t len)
{
    if (len < 1)
        return 0;
    lmc_blend_frame f[MAX_FRAMES];
    size_t n = split(data + 1, len - 1, f);
    char err[256] = "";
    int64_t v;
    int rc = 0;
    switch (data[0] % 5) {
    case 0:
        rc = lmc_blend_decode_handshake(f, n, &v, err, sizeof err);
        if (rc == 0 && !lmc_blend_handshake_compatible(v, err, sizeof err))
            CHECK(v != LMC_BLEND_PROTOCOL_VERSION && err[0]);
        break;
    case 1:
        rc = rope(f, n, err, sizeof err);
        break;
    case 2:
        rc = lmc_blend_decode_unregister_rope(f, n, &v, err, sizeof err);
        CHECK(rc != 0 || v >= 0);
        break;
    case 3: {
        lmc_blend_unified_lookup u;
        rc = lmc_blend_decode_unified_lookup(f, n, CHUNK, &u, err, sizeof err);
        if (rc == 0) {
            CHECK(u.key.end <= u.key.n_tokens && u.key.end % CHUNK == 0 && u.tp_size >= 0);
            lmc_blend_unified_lookup_free(&u);
        } else {
            CHECK(!u.key.tokens);
        }
        break;
    }
    default:
        rc = retrieve(f, n, err, sizeof err);
    }
    /* A refusal always says why (-2, memory, need not). */
    CHECK(memchr(err, '\0', sizeof err) && (rc != -1 || err[0]));
    CHECK(rc == 0 || rc == -1 || rc == -2);
    return 0;
}
