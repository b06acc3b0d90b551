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

/* fixmap, fixarray, array16/32, map16/32. */
static bool is_container(uint8_t b)
{
    return (b >= 0x80 && b <= 0x9f) || (b >= 0xdc && b <= 0xdf);
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

/* Consumes exactly one document at the cursor, checking every length
 * against the remaining bytes and nesting against max_depth. */
static bool skip_value(mp_cursor *c, unsigned max_depth)
{
    enum { MAX_DEPTH_CAP = 64 };
    uint64_t pending[MAX_DEPTH_CAP + 1]; /* objects still owed at each level */
    if (max_depth > MAX_DEPTH_CAP)
        max_depth = MAX_DEPTH_CAP;
    unsigned depth = 0;
    pending[0] = 1;
    for (;;) {
        skip_int_run(c, &pending[depth]);
        if (pending[depth] == 0) {
            if (depth == 0)
                return true;
            depth--;
            continue;
        }
        pending[depth]--;
        uint64_t payload, children;
        bool container = c->p < c->end && is_container(*c->p);
        if (!read_header(c, &payload, &children) || !take(c, payload))
            return false;
        /* msgpack-c takes a stack slot for every container it opens, even an
         * empty one, so an empty container counts toward the depth too (else
         * a frame passes here and then fails to unpack: found by fuzzing). */
        if (container && depth + 1 > max_depth)
            return false;
        if (children == 0)
            continue;
        /* Every child needs at least one byte: reject impossible counts early. */
        if (children > (uint64_t)(c->end - c->p))
            return false;
        pending[++depth] = children;
    }
}

bool lmc_mp_validate(const uint8_t *data, size_t len, unsigned max_depth)
{
    mp_cursor c = {data, data + len};
    return skip_value(&c, max_depth) && c.p == c.end;
}

/* ---- pull reader -------------------------------------------------------- */

bool lmc_mpr_skip(lmc_mp_reader *r, unsigned max_depth)
{
    mp_cursor c = {r->p, r->end};
    if (!skip_value(&c, max_depth))
        return false;
    r->p = c.p;
    return true;
}

/* Reads a container header of the given family; false leaves r as it was. */
static bool read_container(lmc_mp_reader *r, bool map, uint32_t *count)
{
    mp_cursor c = {r->p, r->end};
    if (c.p >= c.end)
        return false;
    uint8_t b = *c.p;
    uint64_t n;
    if ((!map && b >= 0x90 && b <= 0x9f) || (map && b >= 0x80 && b <= 0x8f)) {
        c.p++;
        n = b & 0x0f;
    } else if (b == (map ? 0xde : 0xdc) || b == (map ? 0xdf : 0xdd)) {
        c.p++;
        if (!read_be(&c, b == 0xde || b == 0xdc ? 2 : 4, &n))
            return false;
    } else {
        return false;
    }
    /* Every element needs at least one byte (two for a map entry). */
    if (n * (map ? 2u : 1u) > (uint64_t)(c.end - c.p))
        return false;
    *count = (uint32_t)n;
    r->p = c.p;
    return true;
}

bool lmc_mpr_map(lmc_mp_reader *r, uint32_t *count)
{
    return read_container(r, true, count);
}

bool lmc_mpr_array(lmc_mp_reader *r, uint32_t *count)
{
    return read_container(r, false, count);
}

bool lmc_mpr_str(lmc_mp_reader *r, const char **ptr, size_t *len)
{
    mp_cursor c = {r->p, r->end};
    if (c.p >= c.end)
        return false;
    uint8_t b = *c.p++;
    uint64_t n;
    if (b >= 0xa0 && b <= 0xbf)
        n = b & 0x1f;
    else if (b < 0xd9 || b > 0xdb || !read_be(&c, (size_t)1 << (b - 0xd9), &n))
        return false;
    if (n > (uint64_t)(c.end - c.p))
        return false;
    *ptr = (const char *)c.p;
    *len = (size_t)n;
    r->p = c.p + n;
    return true;
}

/* Reads any msgpack int: *neg tells a negative value (then in *bits as int64). */
static bool read_any_int(lmc_mp_reader *r, uint64_t *bits, bool *neg)
{
    mp_cursor c = {r->p, r->end};
    if (c.p >= c.end)
        return false;
    uint8_t b = *c.p++;
    uint64_t v;
    *neg = false;
    if (b <= 0x7f) {
        v = b;
    } else if (b >= 0xe0) {
        v = (uint64_t)(int64_t)(int8_t)b;
        *neg = true;
    } else if (b >= 0xcc && b <= 0xcf) {
        if (!read_be(&c, (size_t)1 << (b - 0xcc), &v))
            return false;
    } else if (b >= 0xd0 && b <= 0xd3) {
        size_t w = (size_t)1 << (b - 0xd0);
        if (!read_be(&c, w, &v))
            return false;
        unsigned shift = (unsigned)(64 - 8 * w);
        v = (uint64_t)(((int64_t)(v << shift)) >> shift); /* sign-extend */
        *neg = (int64_t)v < 0;
    } else {
        return false;
    }
    *bits = v;
    r->p = c.p;
    return true;
}

bool lmc_mpr_uint(lmc_mp_reader *r, uint64_t *out)
{
    const uint8_t *save = r->p;
    uint64_t v;
    bool neg;
    if (!read_any_int(r, &v, &neg))
        return false;
    if (neg) {
        r->p = save;
        return false;
    }
    *out = v;
    return true;
}

bool lmc_mpr_int(lmc_mp_reader *r, int64_t *out)
{
    const uint8_t *save = r->p;
    uint64_t v;
    bool neg;
    if (!read_any_int(r, &v, &neg))
        return false;
    if (!neg && v > (uint64_t)INT64_MAX) {
        r->p = save;
        return false;
    }
    *out = (int64_t)v;
    return true;
}

/* Blocks of 8 ids of at most 32 bits with one bounds check per block (8
 * elements take at most 40 bytes) and no range check (max >= 2^32 - 1):
 * about 30% faster than the checked loop on a 32k-token prompt, whether
 * the widths are predictable or not (BENCHMARKS.md).  Stops at the first
 * other width; returns how many it read. */
static size_t uint32_blocks(const uint8_t **pp, const uint8_t *end, size_t n, uint64_t *out)
{
    const uint8_t *p = *pp;
    size_t i = 0;
    while (n - i >= 8 && end - p >= 40) {
        for (size_t stop = i + 8; i < stop; i++) {
            uint8_t b = *p;
            if (b == 0xcd) {
                out[i] = (uint64_t)p[1] << 8 | p[2], p += 3;
            } else if (b == 0xce) {
                out[i] = (uint64_t)p[1] << 24 | (uint64_t)p[2] << 16 | (uint64_t)p[3] << 8 | p[4];
                p += 5;
            } else if (b <= 0x7f) {
                out[i] = b, p += 1;
            } else if (b == 0xcc) {
                out[i] = p[1], p += 2;
            } else {
                goto done;
            }
        }
    }
done:
    *pp = p;
    return i;
}

size_t lmc_mpr_uints(lmc_mp_reader *r, size_t n, uint64_t max, uint64_t *out)
{
    const uint8_t *p = r->p, *end = r->end;
    size_t i = max >= UINT32_MAX ? uint32_blocks(&p, end, n, out) : 0;
    for (; i < n && p < end; i++) {
        const uint8_t *elem = p;
        uint8_t b = *p;
        uint64_t v;
        if (b <= 0x7f) {
            v = b, p += 1;
        } else if (b == 0xcd && end - p >= 3) {
            v = (uint64_t)p[1] << 8 | p[2], p += 3;
        } else if (b == 0xce && end - p >= 5) {
            v = (uint64_t)p[1] << 24 | (uint64_t)p[2] << 16 | (uint64_t)p[3] << 8 | p[4], p += 5;
        } else if (b == 0xcc && end - p >= 2) {
            v = p[1], p += 2;
        } else {
            r->p = p; /* other widths (and bad bytes) take the general path */
            if (!lmc_mpr_uint(r, &v))
                return i;
            p = r->p;
        }
        if (v > max) {
            p = elem; /* leave the offending element unread */
            break;
        }
        out[i] = v;
    }
    r->p = p;
    return i;
}

bool lmc_mpr_nil(lmc_mp_reader *r)
{
    if (r->p < r->end && *r->p == 0xc0) {
        r->p++;
        return true;
    }
    return false;
}

/* ---- accessors ---------------------------------------------------------- */

bool lmc_mp_get_int(const msgpack_object *o, int64_t *out)
{
    if (!o)
        return false;
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
    if (!o || o->type != MSGPACK_OBJECT_POSITIVE_INTEGER)
        return false;
    *out = o->via.u64;
    return true;
}

bool lmc_mp_get_double(const msgpack_object *o, double *out)
{
    int64_t i;
    if (!o)
        return false;
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
    if (!o)
        return false;
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
    if (!o || o->type != MSGPACK_OBJECT_STR)
        return false;
    /* msgpack-c leaves ptr NULL for "": callers may memcmp/memcpy it. */
    *ptr = o->via.str.size ? o->via.str.ptr : "";
    *len = o->via.str.size;
    return true;
}

bool lmc_mp_get_bin(const msgpack_object *o, const uint8_t **ptr, size_t *len)
{
    if (!o || o->type != MSGPACK_OBJECT_BIN)
        return false;
    *ptr = o->via.bin.size ? (const uint8_t *)o->via.bin.ptr : (const uint8_t *)"";
    *len = o->via.bin.size;
    return true;
}

bool lmc_mp_is_nil(const msgpack_object *o)
{
    return o && o->type == MSGPACK_OBJECT_NIL;
}

bool lmc_mp_str_eq(const msgpack_object *o, const char *s)
{
    size_t n = strlen(s);
    return o && o->type == MSGPACK_OBJECT_STR && o->via.str.size == n &&
           memcmp(o->via.str.ptr, s, n) == 0;
}

const msgpack_object *lmc_mp_map_get(const msgpack_object *map, const char *key)
{
    if (!map || map->type != MSGPACK_OBJECT_MAP) /* NULL: an absent argument */
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

/* ---- UTF-8 -------------------------------------------------------------- */

/* Bytes of the sequence lead byte b starts, or 0 for a byte that starts
 * none (a continuation byte, C0/C1, F5..FF). */
static size_t utf8_need(unsigned char b)
{
    return b < 0x80 ? 1 : b >= 0xC2 && b <= 0xDF ? 2 : b >= 0xE0 && b <= 0xEF ? 3
           : b >= 0xF0 && b <= 0xF4 ? 4 : 0;
}

/* Length of the well-formed UTF-8 sequence at p (no overlong forms, no
 * surrogates, nothing above U+10FFFF: what strict decoders accept), or 0
 * when the bytes there are not one, or not all of one (n too short). */
static size_t utf8_seq_len(const unsigned char *p, size_t n)
{
    unsigned char b = p[0];
    size_t need = utf8_need(b);
    /* The second byte's range excludes overlong forms, surrogates and
     * code points above U+10FFFF. */
    unsigned char lo = b == 0xE0 ? 0xA0 : b == 0xF0 ? 0x90 : 0x80;
    unsigned char hi = b == 0xED ? 0x9F : b == 0xF4 ? 0x8F : 0xBF;
    if (need <= 1 || n < need)
        return need == 1 ? 1 : 0;
    if (p[1] < lo || p[1] > hi)
        return 0;
    for (size_t i = 2; i < need; i++)
        if ((p[i] & 0xC0) != 0x80)
            return 0;
    return need;
}

/* True when p[0..n) is the start of a sequence that needs more than n
 * bytes: what a byte limit (vsnprintf, a length cap) leaves at the end. */
static bool utf8_cut_short(const unsigned char *p, size_t n)
{
    if (utf8_need(p[0]) <= n)
        return false;
    for (size_t i = 1; i < n; i++)
        if ((p[i] & 0xC0) != 0x80)
            return false;
    return true;
}

size_t lmc_utf8_sanitize(char *dst, size_t cap, const char *src, size_t len)
{
    const unsigned char *s = (const unsigned char *)src;
    size_t in = 0, out = 0;
    if (cap == 0)
        return 0;
    while (in < len) {
        size_t n = utf8_seq_len(s + in, len - in);
        if (n == 0 && utf8_cut_short(s + in, len - in))
            break;                 /* dropped: cut, not invalid */
        size_t w = n ? n : 1;      /* an invalid byte becomes one '?' */
        if (out + w >= cap)
            break;                 /* never split a character */
        if (n)
            memcpy(dst + out, s + in, n);
        else
            dst[out] = '?';
        out += w;
        in += w;
    }
    dst[out] = '\0';
    return out;
}
