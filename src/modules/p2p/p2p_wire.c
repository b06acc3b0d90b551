/* Decoding the P2P serving ops' arguments (p2p_wire.h).  Everything comes
 * from a peer that may be hostile: every count and size is bounded and
 * overflow-checked before use (docs/p2p.md, "Bounds"). */
#include "modules/p2p/p2p_wire.h"

#include <stdio.h>
#include <string.h>

#include "modules/services/layout_registry.h"
#include "rpc/wire.h"

#define MAX_TENSORS 64
#define MAX_DIMS 8

static bool get_u32(const msgpack_object *o, uint32_t *out)
{
    uint64_t v;
    if (!o || o->type == MSGPACK_OBJECT_BOOLEAN || !lmc_mp_get_uint(o, &v) || v > UINT32_MAX)
        return false;
    *out = (uint32_t)v;
    return true;
}

/* Fills the strings: interned ones this server already knows, or NULL. */
static void find_strings(lmc_key_interner *in, const char *model, size_t model_len,
                         const char *salt, size_t salt_len, lmc_object_key *out)
{
    const char *m = lmc_intern_find(in, model, model_len);
    const char *s = m ? lmc_intern_find(in, salt, salt_len) : NULL;
    if (!m || !s) {
        lmc_intern_release(m);
        out->model_name = NULL;
        out->cache_salt = NULL;
        return;
    }
    lmc_object_key_set_strings(out, m, s);
}

int lmc_p2p_serve_decode_key(const msgpack_object *o, lmc_key_interner *in,
                             lmc_object_key *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    if (!o || o->type != MSGPACK_OBJECT_MAP) {
        snprintf(err, errlen, "an ObjectKey must be a map");
        return -1;
    }
    const uint8_t *hash;
    size_t hash_len;
    const msgpack_object *h = lmc_mp_map_get(o, "chunk_hash");
    if (!h || !lmc_mp_get_bin(h, &hash, &hash_len) || hash_len == 0 ||
        hash_len > LMC_CHUNK_HASH_MAX) {
        snprintf(err, errlen, "chunk_hash must be bytes of 1..%d", LMC_CHUNK_HASH_MAX);
        return -1;
    }
    const char *model, *salt = "";
    size_t model_len, salt_len = 0;
    const msgpack_object *mo = lmc_mp_map_get(o, "model_name");
    if (!mo || !lmc_mp_get_str(mo, &model, &model_len) || !lmc_model_name_valid(model, model_len)) {
        snprintf(err, errlen, "%s", LMC_MODEL_NAME_RULE);
        return -1;
    }
    const msgpack_object *so = lmc_mp_map_get(o, "cache_salt");
    if (so && (!lmc_mp_get_str(so, &salt, &salt_len) || !lmc_cache_salt_valid(salt, salt_len))) {
        snprintf(err, errlen, "%s", LMC_CACHE_SALT_RULE);
        return -1;
    }
    const msgpack_object *go = lmc_mp_map_get(o, "object_group_id");
    if (!get_u32(lmc_mp_map_get(o, "kv_rank"), &out->kv_rank) ||
        (go && !get_u32(go, &out->object_group_id))) {
        snprintf(err, errlen, "kv_rank and object_group_id must be ints in 0..2^32-1");
        return -1;
    }
    memcpy(out->chunk_hash, hash, hash_len);
    out->chunk_hash_len = (uint8_t)hash_len;
    find_strings(in, model, model_len, salt, salt_len, out);
    return 0;
}

/* Elements of one shape, or false when malformed or over 2^64. */
static bool shape_elems(const msgpack_object *shape, uint64_t *out)
{
    if (shape->type != MSGPACK_OBJECT_ARRAY || shape->via.array.size > MAX_DIMS)
        return false;
    uint64_t n = 1;
    for (uint32_t d = 0; d < shape->via.array.size; d++) {
        uint64_t dim;
        const msgpack_object *e = &shape->via.array.ptr[d];
        if (e->type == MSGPACK_OBJECT_BOOLEAN || !lmc_mp_get_uint(e, &dim) ||
            __builtin_mul_overflow(n, dim, &n))
            return false;
    }
    *out = n;
    return true;
}

static uint32_t itemsize_of(const msgpack_object *dt)
{
    const char *s;
    size_t len;
    if (!lmc_mp_get_str(dt, &s, &len))
        return 0;
    if (len > 6 && memcmp(s, "torch.", 6) == 0) {
        s += 6;
        len -= 6;
    }
    return lmc_dtype_itemsize(s, len);
}

/* One MemoryLayoutDesc's object size. */
static int desc_size(const msgpack_object *d, uint64_t *out, char *err, size_t errlen)
{
    const msgpack_object *shapes = d->type == MSGPACK_OBJECT_MAP ? lmc_mp_map_get(d, "shapes") : NULL;
    const msgpack_object *dtypes = d->type == MSGPACK_OBJECT_MAP ? lmc_mp_map_get(d, "dtypes") : NULL;
    if (!shapes || !dtypes || shapes->type != MSGPACK_OBJECT_ARRAY ||
        dtypes->type != MSGPACK_OBJECT_ARRAY || shapes->via.array.size != dtypes->via.array.size ||
        shapes->via.array.size > MAX_TENSORS) {
        snprintf(err, errlen, "a MemoryLayoutDesc must be {shapes: [[int]], dtypes: [str]} of the "
                 "same length, at most %d", MAX_TENSORS);
        return -1;
    }
    uint64_t total = 0;
    for (uint32_t t = 0; t < shapes->via.array.size; t++) {
        uint64_t elems, bytes;
        uint32_t item = itemsize_of(&dtypes->via.array.ptr[t]);
        if (item == 0 || !shape_elems(&shapes->via.array.ptr[t], &elems) ||
            __builtin_mul_overflow(elems, (uint64_t)item, &bytes) ||
            __builtin_add_overflow(total, bytes, &total)) {
            snprintf(err, errlen, "MemoryLayoutDesc tensor %u: a supported dtype and a shape of "
                     "at most %d non-negative dims whose size fits 64 bits", t, MAX_DIMS);
            return -1;
        }
    }
    *out = total;
    return 0;
}

int lmc_p2p_serve_decode_layouts(const msgpack_object *o, lmc_p2p_serve_group_size *out,
                                 size_t cap, size_t *n, char *err, size_t errlen)
{
    *n = 0;
    if (!o || lmc_mp_is_nil(o))
        return 0;
    if (o->type != MSGPACK_OBJECT_MAP || o->via.map.size > cap) {
        snprintf(err, errlen, "group_layout_descs must be a map int -> MemoryLayoutDesc of at "
                 "most %zu entries, or None", cap);
        return -1;
    }
    for (uint32_t i = 0; i < o->via.map.size; i++) {
        const msgpack_object_kv *kv = &o->via.map.ptr[i];
        if (!get_u32(&kv->key, &out[i].group)) {
            snprintf(err, errlen, "group_layout_descs keys must be ints in 0..2^32-1");
            return -1;
        }
        if (desc_size(&kv->val, &out[i].size, err, errlen) != 0)
            return -1;
    }
    *n = o->via.map.size;
    return 0;
}
