#include "rpc/wire.h"

#include <string.h>

static const char *const op_names[LMC_OP_FROZEN_MAX + 1] = {
    [LMC_OP_REGISTER_KV_CACHE] = "register_kv_cache",
    [LMC_OP_UNREGISTER_KV_CACHE] = "unregister_kv_cache",
    [LMC_OP_REGISTER_Q_CACHE] = "register_q_cache",
    [LMC_OP_UNREGISTER_Q_CACHE] = "unregister_q_cache",
    [LMC_OP_STORE_Q] = "store_q",
    [LMC_OP_STORE] = "store",
    [LMC_OP_RETRIEVE] = "retrieve",
    [LMC_OP_LOOKUP] = "lookup",
    [LMC_OP_QUERY_PREFETCH_STATUS] = "query_prefetch_status",
    [LMC_OP_WAIT_PREFETCH_STATUS] = "wait_prefetch_status",
    [LMC_OP_QUERY_PREFETCH_LOOKUP_HITS] = "query_prefetch_lookup_hits",
    [LMC_OP_FREE_LOOKUP_LOCKS] = "free_lookup_locks",
    [LMC_OP_END_SESSION] = "end_session",
    [LMC_OP_REGISTER_KV_CACHE_ENGINE_DRIVEN_CONTEXT] = "register_kv_cache_engine_driven_context",
    [LMC_OP_UNREGISTER_KV_CACHE_ENGINE_DRIVEN_CONTEXT] = "unregister_kv_cache_engine_driven_context",
    [LMC_OP_PREPARE_STORE] = "prepare_store",
    [LMC_OP_COMMIT_STORE] = "commit_store",
    [LMC_OP_PREPARE_RETRIEVE] = "prepare_retrieve",
    [LMC_OP_COMMIT_RETRIEVE] = "commit_retrieve",
    [LMC_OP_CLEAR] = "clear",
    [LMC_OP_GET_CHUNK_SIZE] = "get_chunk_size",
    [LMC_OP_PING] = "ping",
    [LMC_OP_REPORT_BLOCK_ALLOCATION] = "report_block_allocation",
    [LMC_OP_NOOP] = "noop",
    [LMC_OP_CB_REGISTER_ROPE] = "cb_register_rope",
    [LMC_OP_CB_UNREGISTER_ROPE] = "cb_unregister_rope",
    [LMC_OP_CB_RETRIEVE_PRE_COMPUTED] = "cb_retrieve_pre_computed",
    [LMC_OP_CB_UNIFIED_LOOKUP] = "cb_unified_lookup",
    [LMC_OP_P2P_LOOKUP_AND_LOCK] = "p2p_lookup_and_lock",
    [LMC_OP_P2P_QUERY_LOOKUP_RESULTS] = "p2p_query_lookup_results",
    [LMC_OP_P2P_UNLOCK_OBJECTS] = "p2p_unlock_objects",
    [LMC_OP_GET_EXPERIMENTAL] = "get_experimental",
    [LMC_OP_CB_PROTOCOL_HANDSHAKE] = "cb_protocol_handshake",
    [LMC_OP_POLL_KV_EVENTS] = "poll_kv_events",
};

const char *lmc_op_name(int op_id)
{
    if (op_id < 1 || op_id > LMC_OP_FROZEN_MAX)
        return NULL;
    return op_names[op_id];
}

int lmc_op_id_from_name(const char *name, size_t len)
{
    for (int id = 1; id <= LMC_OP_FROZEN_MAX; id++) {
        if (strlen(op_names[id]) == len && memcmp(op_names[id], name, len) == 0)
            return id;
    }
    return 0;
}

/* ---- validation --------------------------------------------------------- */

typedef struct {
    const uint8_t *p;
    const uint8_t *end;
} mp_cursor;

static bool take(mp_cursor *c, size_t n)
{
    if ((size_t)(c->end - c->p) < n)
        return false;
    c->p += n;
    return true;
}

static bool read_be(mp_cursor *c, size_t n, uint64_t *out)
{
    if ((size_t)(c->end - c->p) < n)
        return false;
    uint64_t v = 0;
    for (size_t i = 0; i < n; i++)
        v = (v << 8) | c->p[i];
    c->p += n;
    *out = v;
    return true;
}

/* Classifies the header at the cursor: returns false on truncation or the
 * never-used byte 0xc1.  `payload` is raw bytes to skip, `children` the
 * number of nested objects that follow (maps count keys and values). */
static bool read_header(mp_cursor *c, uint64_t *payload, uint64_t *children)
{
    if (c->p >= c->end)
        return false;
    uint8_t b = *c->p++;
    uint64_t n = 0;
    *payload = 0;
    *children = 0;
    if (b <= 0x7f || b >= 0xe0 || b == 0xc0 || b == 0xc2 || b == 0xc3)
        return true;
    if (b >= 0xa0 && b <= 0xbf) { *payload = b & 0x1f; return true; }
    if (b >= 0x90 && b <= 0x9f) { *children = b & 0x0f; return true; }
    if (b >= 0x80 && b <= 0x8f) { *children = 2u * (b & 0x0f); return true; }
    switch (b) {
    case 0xc4: case 0xd9: if (!read_be(c, 1, &n)) return false; *payload = n; return true;
    case 0xc5: case 0xda: if (!read_be(c, 2, &n)) return false; *payload = n; return true;
    case 0xc6: case 0xdb: if (!read_be(c, 4, &n)) return false; *payload = n; return true;
    case 0xc7: if (!read_be(c, 1, &n)) return false; *payload = n + 1; return true;
    case 0xc8: if (!read_be(c, 2, &n)) return false; *payload = n + 1; return true;
    case 0xc9: if (!read_be(c, 4, &n)) return false; *payload = n + 1; return true;
    case 0xca: *payload = 4; return true;
    case 0xcb: *payload = 8; return true;
    case 0xcc: case 0xd0: *payload = 1; return true;
    case 0xcd: case 0xd1: *payload = 2; return true;
    case 0xce: case 0xd2: *payload = 4; return true;
    case 0xcf: case 0xd3: *payload = 8; return true;
    case 0xd4: *payload = 2; return true;
    case 0xd5: *payload = 3; return true;
    case 0xd6: *payload = 5; return true;
    case 0xd7: *payload = 9; return true;
    case 0xd8: *payload = 17; return true;
    case 0xdc: if (!read_be(c, 2, &n)) return false; *children = n; return true;
    case 0xdd: if (!read_be(c, 4, &n)) return false; *children = n; return true;
    case 0xde: if (!read_be(c, 2, &n)) return false; *children = 2 * n; return true;
    case 0xdf: if (!read_be(c, 4, &n)) return false; *children = 2 * n; return true;
    default: return false; /* 0xc1 */
    }
}

/* Fast path for the bulk of every big payload: runs of non-negative ints
 * (token ids, block ids) inside an array. */
static void skip_int_run(mp_cursor *c, uint64_t *pending)
{
    while (*pending > 0 && c->p < c->end) {
        uint8_t b = *c->p;
        size_t width = b <= 0x7f ? 1 : b == 0xcd ? 3 : b == 0xcc ? 2 : b == 0xce ? 5 : 0;
        if (width == 0 || (size_t)(c->end - c->p) < width)
            return;
        c->p += width;
        (*pending)--;
    }
}

bool lmc_mp_validate(const uint8_t *data, size_t len, unsigned max_depth)
{
    enum { MAX_DEPTH_CAP = 64 };
    uint64_t pending[MAX_DEPTH_CAP + 1]; /* objects still owed at each level */
    if (max_depth > MAX_DEPTH_CAP)
        max_depth = MAX_DEPTH_CAP;
    mp_cursor c = {data, data + len};
    unsigned depth = 0;
    pending[0] = 1;
    while (depth > 0 || pending[0] > 0) {
        skip_int_run(&c, &pending[depth]);
        if (pending[depth] == 0) {
            if (depth == 0)
                break;
            depth--;
            continue;
        }
        pending[depth]--;
        uint64_t payload, children;
        if (!read_header(&c, &payload, &children) || !take(&c, payload))
            return false;
        if (children == 0)
            continue;
        /* Every child needs at least one byte: reject impossible counts early. */
        if (children > (uint64_t)(c.end - c.p) || depth + 1 > max_depth)
            return false;
        pending[++depth] = children;
    }
    return c.p == c.end;
}

/* ---- accessors ---------------------------------------------------------- */

bool lmc_mp_get_int(const msgpack_object *o, int64_t *out)
{
    switch (o->type) {
    case MSGPACK_OBJECT_POSITIVE_INTEGER:
        if (o->via.u64 > (uint64_t)INT64_MAX)
            return false;
        *out = (int64_t)o->via.u64;
        return true;
    case MSGPACK_OBJECT_NEGATIVE_INTEGER:
        *out = o->via.i64;
        return true;
    case MSGPACK_OBJECT_BOOLEAN:
        *out = o->via.boolean ? 1 : 0;
        return true;
    default:
        return false;
    }
}

bool lmc_mp_get_uint(const msgpack_object *o, uint64_t *out)
{
    if (o->type != MSGPACK_OBJECT_POSITIVE_INTEGER)
        return false;
    *out = o->via.u64;
    return true;
}

bool lmc_mp_get_double(const msgpack_object *o, double *out)
{
    int64_t i;
    if (o->type == MSGPACK_OBJECT_FLOAT32 || o->type == MSGPACK_OBJECT_FLOAT64) {
        *out = o->via.f64;
        return true;
    }
    if (o->type != MSGPACK_OBJECT_BOOLEAN && lmc_mp_get_int(o, &i)) {
        *out = (double)i;
        return true;
    }
    return false;
}

bool lmc_mp_get_bool(const msgpack_object *o, bool *out)
{
    if (o->type == MSGPACK_OBJECT_BOOLEAN) {
        *out = o->via.boolean;
        return true;
    }
    if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER && o->via.u64 <= 1) {
        *out = o->via.u64 == 1;
        return true;
    }
    return false;
}

bool lmc_mp_get_str(const msgpack_object *o, const char **ptr, size_t *len)
{
    if (o->type != MSGPACK_OBJECT_STR)
        return false;
    *ptr = o->via.str.ptr;
    *len = o->via.str.size;
    return true;
}

bool lmc_mp_get_bin(const msgpack_object *o, const uint8_t **ptr, size_t *len)
{
    if (o->type != MSGPACK_OBJECT_BIN)
        return false;
    *ptr = (const uint8_t *)o->via.bin.ptr;
    *len = o->via.bin.size;
    return true;
}

bool lmc_mp_is_nil(const msgpack_object *o)
{
    return o->type == MSGPACK_OBJECT_NIL;
}

bool lmc_mp_str_eq(const msgpack_object *o, const char *s)
{
    size_t n = strlen(s);
    return o->type == MSGPACK_OBJECT_STR && o->via.str.size == n &&
           memcmp(o->via.str.ptr, s, n) == 0;
}

const msgpack_object *lmc_mp_map_get(const msgpack_object *map, const char *key)
{
    if (map->type != MSGPACK_OBJECT_MAP)
        return NULL;
    for (uint32_t i = 0; i < map->via.map.size; i++) {
        if (lmc_mp_str_eq(&map->via.map.ptr[i].key, key))
            return &map->via.map.ptr[i].val;
    }
    return NULL;
}

int lmc_mp_pack_cstr(msgpack_packer *pk, const char *s)
{
    size_t n = strlen(s);
    if (msgpack_pack_str(pk, n) != 0)
        return -1;
    return msgpack_pack_str_body(pk, s, n);
}
