/* The CacheBlend RPCs on the wire (docs/cacheblend.md, "Blend RPCs on the
 * wire").  Each frame is validated before msgpack-c sees it, so that no
 * declared length turns into an allocation larger than the frame; every
 * count is then bounded again by the limits in blend_wire.h before any
 * array is sized from it. */
#include "modules/blend/blend_wire.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/checked.h"
#include "rpc/wire.h"

static int fail(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    if (errlen)
        vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
    return -1;
}

/* Frame i of n as one msgpack object in zone z.  -1 (reason) or -2. */
static int unpack(const lmc_blend_frame *f, size_t i, const char *what, msgpack_zone *z,
                  msgpack_object *o, char *err, size_t errlen)
{
    if (!f[i].data || !lmc_mp_validate(f[i].data, f[i].len, LMC_BLEND_MAX_FRAME_DEPTH))
        return fail(err, errlen, "frame %zu (%s): not one well-formed msgpack value", i + 1,
                    what);
    size_t off = 0;
    msgpack_unpack_return r = msgpack_unpack((const char *)f[i].data, f[i].len, &off, z, o);
    if (r == MSGPACK_UNPACK_NOMEM_ERROR)
        return -2;
    if (r != MSGPACK_UNPACK_SUCCESS)
        return fail(err, errlen, "frame %zu (%s): undecodable msgpack", i + 1, what);
    return 0;
}

static int count(size_t n, size_t lo, size_t hi, const char *rpc, char *err, size_t errlen)
{
    if (n < lo || n > hi)
        return fail(err, errlen, "%s: %zu payload frames, expected %zu..%zu", rpc, n, lo, hi);
    return 0;
}

/* An int in [lo, hi]. */
static int get_ranged(const msgpack_object *o, int64_t lo, int64_t hi, const char *what,
                      int64_t *out, char *err, size_t errlen)
{
    int64_t v;
    if (o && o->type == MSGPACK_OBJECT_POSITIVE_INTEGER && o->via.u64 > INT64_MAX)
        return fail(err, errlen, "%s: %llu outside %lld..%lld", what,
                    (unsigned long long)o->via.u64, (long long)lo, (long long)hi);
    if (!o || o->type == MSGPACK_OBJECT_BOOLEAN || !lmc_mp_get_int(o, &v))
        return fail(err, errlen, "%s: not an int", what);
    if (v < lo || v > hi)
        return fail(err, errlen, "%s: %lld outside %lld..%lld", what, (long long)v,
                    (long long)lo, (long long)hi);
    *out = v;
    return 0;
}

/* A one-int frame (handshake, unregister). */
static int one_int(const lmc_blend_frame *f, size_t n, const char *rpc, const char *what,
                   int64_t lo, int64_t hi, int64_t *out, char *err, size_t errlen)
{
    if (count(n, 1, 1, rpc, err, errlen))
        return -1;
    msgpack_zone z;
    if (!msgpack_zone_init(&z, 256))
        return -2;
    msgpack_object o;
    int rc = unpack(f, 0, what, &z, &o, err, errlen);
    if (rc == 0)
        rc = get_ranged(&o, lo, hi, what, out, err, errlen);
    msgpack_zone_destroy(&z);
    return rc;
}

/* ---- CB_PROTOCOL_HANDSHAKE ------------------------------------------- */

int lmc_blend_decode_handshake(const lmc_blend_frame *f, size_t n, int64_t *client_version,
                               char *err, size_t errlen)
{
    return one_int(f, n, "cb_protocol_handshake", "client_version", INT64_MIN, INT64_MAX,
                   client_version, err, errlen);
}

bool lmc_blend_handshake_compatible(int64_t client_version, char *err, size_t errlen)
{
    if (client_version == LMC_BLEND_PROTOCOL_VERSION)
        return true;
    fail(err, errlen,
         "cb_protocol_handshake: client blend protocol version %lld, this server speaks only %d",
         (long long)client_version, LMC_BLEND_PROTOCOL_VERSION);
    return false;
}

int lmc_blend_encode_handshake_reply(msgpack_packer *pk, int64_t client_version)
{
    bool ok = client_version == LMC_BLEND_PROTOCOL_VERSION;
    if (msgpack_pack_array(pk, 2) || msgpack_pack_int64(pk, LMC_BLEND_PROTOCOL_VERSION))
        return -1;
    return ok ? msgpack_pack_true(pk) : msgpack_pack_false(pk);
}

/* ---- CB_REGISTER_ROPE / CB_UNREGISTER_ROPE --------------------------- */

int lmc_blend_decode_unregister_rope(const lmc_blend_frame *f, size_t n, int64_t *instance_id,
                                     char *err, size_t errlen)
{
    return one_int(f, n, "cb_unregister_rope", "instance_id", 0, INT64_MAX, instance_id, err,
                   errlen);
}

static int rope_cache(const msgpack_object *o, uint32_t i, lmc_shared_tensor *t, char *err,
                      size_t errlen)
{
    if (o->type != MSGPACK_OBJECT_EXT || o->via.ext.type != 1)
        return fail(err, errlen, "cos_sin_caches_ipc[%u]: not a tensor handle (msgpack ext 1)",
                    i);
    char why[200];
    int rc = lmc_shared_tensor_decode((const uint8_t *)o->via.ext.ptr, o->via.ext.size, t, why,
                                      sizeof why);
    if (rc == -2)
        return -2;
    if (rc)
        return fail(err, errlen, "cos_sin_caches_ipc[%u]: %s", i, why);
    if (t->ndim != 2 || t->shape[0] < 1 || t->shape[1] < 2 || t->shape[1] % 2)
        return fail(err, errlen,
                    "cos_sin_caches_ipc[%u]: shape must be [max_position >= 1, rot_dim even >= 2]",
                    i);
    return 0;
}

/* Frame 2: a list of handles; an older client's single handle is a list
 * of one (docs/cacheblend.md, "Blend RPCs on the wire"). */
static int rope_caches(const msgpack_object *o, lmc_blend_register_rope *r, char *err,
                       size_t errlen)
{
    const msgpack_object *items = o;
    uint32_t n = 1;
    if (o->type == MSGPACK_OBJECT_ARRAY) {
        items = o->via.array.ptr;
        n = o->via.array.size;
    } else if (o->type != MSGPACK_OBJECT_EXT) {
        return fail(err, errlen, "cos_sin_caches_ipc: not a list of tensor handles");
    }
    if (n > LMC_BLEND_MAX_ROPE_CACHES)
        return fail(err, errlen, "cos_sin_caches_ipc: %u caches, at most %u", n,
                    LMC_BLEND_MAX_ROPE_CACHES);
    if (n == 0)
        return 0;
    r->caches = calloc(n, sizeof *r->caches);
    if (!r->caches)
        return -2;
    for (uint32_t i = 0; i < n; i++) {
        int rc = rope_cache(&items[i], i, &r->caches[i], err, errlen);
        if (rc)
            return rc;
    }
    r->n_caches = n;
    return 0;
}

/* An array of at most LMC_BLEND_MAX_GROUPS items; *n = 0 for absent. */
static int group_array(const msgpack_object *o, const char *what, uint32_t *n, char *err,
                       size_t errlen)
{
    *n = 0;
    if (!o)
        return 0;
    if (o->type != MSGPACK_OBJECT_ARRAY)
        return fail(err, errlen, "%s: not a list", what);
    if (o->via.array.size > LMC_BLEND_MAX_GROUPS)
        return fail(err, errlen, "%s: %u groups, at most %u", what, o->via.array.size,
                    LMC_BLEND_MAX_GROUPS);
    *n = o->via.array.size;
    return 0;
}

/* group_array, then *n zeroed items of `size` bytes (NULL for none). */
static int group_items(const msgpack_object *o, const char *what, size_t size, void **items,
                       uint32_t *n, char *err, size_t errlen)
{
    if (group_array(o, what, n, err, errlen))
        return -1;
    if (*n == 0)
        return 0;
    *items = calloc(*n, size);
    return *items ? 0 : -2;
}

static int group_to_cache(const msgpack_object *o, lmc_blend_register_rope *r, char *err,
                          size_t errlen)
{
    void *items = NULL;
    uint32_t n;
    int rc = group_items(o, "group_to_cache", sizeof *r->group_to_cache, &items, &n, err,
                         errlen);
    if (rc)
        return rc;
    r->group_to_cache = items;
    r->n_group_to_cache = n;
    for (uint32_t g = 0; g < n; g++) {
        int64_t v;
        char what[48];
        snprintf(what, sizeof what, "group_to_cache[%u]", g);
        if (r->n_caches == 0)
            return fail(err, errlen, "%s: no cos_sin cache was sent to refer to", what);
        if (get_ranged(&o->via.array.ptr[g], -1, (int64_t)r->n_caches - 1, what, &v, err,
                       errlen))
            return -1;
        r->group_to_cache[g] = v < 0 ? LMC_BLEND_NO_CACHE : (uint32_t)v;
    }
    return 0;
}

static int one_rot(const msgpack_object *o, uint32_t g, lmc_blend_rot *out, char *err,
                   size_t errlen)
{
    char what[48];
    snprintf(what, sizeof what, "group_rot[%u]", g);
    if (o->type != MSGPACK_OBJECT_ARRAY || (o->via.array.size != 0 && o->via.array.size != 2))
        return fail(err, errlen, "%s: not [] or [offset, width]", what);
    if (o->via.array.size == 0)
        return 0;
    int64_t off, width;
    uint64_t end;
    char w[64];
    snprintf(w, sizeof w, "%s offset", what);
    if (get_ranged(&o->via.array.ptr[0], 0, LMC_BLEND_MAX_ROW_ELEMS, w, &off, err, errlen))
        return -1;
    snprintf(w, sizeof w, "%s width", what);
    if (get_ranged(&o->via.array.ptr[1], 1, LMC_BLEND_MAX_ROW_ELEMS, w, &width, err, errlen))
        return -1;
    if (!lmc_add_u64((uint64_t)off, (uint64_t)width, &end) || end > LMC_BLEND_MAX_ROW_ELEMS)
        return fail(err, errlen, "%s: offset + width past %u elements", what,
                    LMC_BLEND_MAX_ROW_ELEMS);
    *out = (lmc_blend_rot){.rotate = true, .offset = (uint32_t)off, .width = (uint32_t)width};
    return 0;
}

static int group_rot(const msgpack_object *o, lmc_blend_register_rope *r, char *err,
                     size_t errlen)
{
    void *items = NULL;
    uint32_t n;
    int rc = group_items(o, "group_rot", sizeof *r->group_rot, &items, &n, err, errlen);
    if (rc)
        return rc;
    r->group_rot = items;
    r->n_group_rot = n;
    for (uint32_t g = 0; g < n; g++)
        if (one_rot(&o->via.array.ptr[g], g, &r->group_rot[g], err, errlen))
            return -1;
    return 0;
}

static int register_rope_fields(const msgpack_object *a, size_t n, lmc_blend_register_rope *r,
                                char *err, size_t errlen)
{
    int64_t v;
    if (get_ranged(&a[0], 0, INT64_MAX, "instance_id", &r->instance_id, err, errlen))
        return -1;
    int rc = rope_caches(&a[1], r, err, errlen);
    if (rc)
        return rc;
    if (get_ranged(&a[2], 1, LMC_BLEND_MAX_HEAD_SIZE, "head_size", &v, err, errlen))
        return -1;
    r->head_size = (uint32_t)v;
    if (a[3].type != MSGPACK_OBJECT_BOOLEAN)
        return fail(err, errlen, "is_neox_style: not a bool");
    r->is_neox = a[3].via.boolean;
    rc = group_to_cache(n > 4 ? &a[4] : NULL, r, err, errlen);
    if (rc)
        return rc;
    return group_rot(n > 5 ? &a[5] : NULL, r, err, errlen);
}

int lmc_blend_decode_register_rope(const lmc_blend_frame *f, size_t n,
                                   lmc_blend_register_rope *out, char *err, size_t errlen)
{
    static const char *const names[] = {"instance_id", "cos_sin_caches_ipc", "head_size",
                                        "is_neox_style", "group_to_cache", "group_rot"};
    memset(out, 0, sizeof *out);
    if (count(n, 4, 6, "cb_register_rope", err, errlen))
        return -1;
    msgpack_zone z;
    if (!msgpack_zone_init(&z, 1024))
        return -2;
    msgpack_object a[6];
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0; i++)
        rc = unpack(f, i, names[i], &z, &a[i], err, errlen);
    if (rc == 0)
        rc = register_rope_fields(a, n, out, err, errlen);
    msgpack_zone_destroy(&z);
    if (rc)
        lmc_blend_register_rope_free(out);
    else
        out->n_frames = (uint32_t)n;
    return rc;
}

void lmc_blend_register_rope_free(lmc_blend_register_rope *r)
{
    free(r->caches);
    free(r->group_to_cache);
    free(r->group_rot);
    memset(r, 0, sizeof *r);
}

/* ---- CB_UNIFIED_LOOKUP ----------------------------------------------- */

static int key_frame(const lmc_blend_frame *f, uint32_t cs, lmc_ipc_key *k, char *err,
                     size_t errlen)
{
    char why[200];
    if (!f->data)
        return fail(err, errlen, "key: no frame");
    int rc = lmc_ipc_key_decode_frame(f->data, f->len, cs, k, why, sizeof why);
    if (rc == -2)
        return -2;
    if (rc)
        return fail(err, errlen, "key: %s", why);
    return 0;
}

int lmc_blend_decode_unified_lookup(const lmc_blend_frame *f, size_t n, uint32_t cs,
                                    lmc_blend_unified_lookup *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    if (count(n, 1, 2, "cb_unified_lookup", err, errlen))
        return -1;
    if (n == 2) {
        msgpack_zone z;
        if (!msgpack_zone_init(&z, 256))
            return -2;
        msgpack_object o;
        int rc = unpack(f, 1, "tp_size", &z, &o, err, errlen);
        if (rc == 0)
            rc = get_ranged(&o, 0, INT32_MAX, "tp_size", &out->tp_size, err, errlen);
        msgpack_zone_destroy(&z);
        if (rc)
            return rc;
    }
    return key_frame(&f[0], cs, &out->key, err, errlen);
}

void lmc_blend_unified_lookup_free(lmc_blend_unified_lookup *r)
{
    lmc_ipc_key_free(&r->key);
    memset(r, 0, sizeof *r);
}

/* ---- CB_RETRIEVE_PRE_COMPUTED ---------------------------------------- */

static int hash_field(const msgpack_object *o, const char *what, uint8_t *out, char *err,
                      size_t errlen)
{
    const uint8_t *p;
    size_t len;
    if (!o)
        return fail(err, errlen, "%s: missing", what);
    if (!lmc_mp_get_bin(o, &p, &len))
        return fail(err, errlen, "%s: not bytes", what);
    if (len != LMC_BLEND_HASH_BYTES)
        return fail(err, errlen, "%s: %zu bytes, a chunk hash has %d", what, len,
                    LMC_BLEND_HASH_BYTES);
    memcpy(out, p, len);
    return 0;
}

static int position(const msgpack_object *m, const char *field, size_t i, uint64_t *out,
                    char *err, size_t errlen)
{
    char what[64];
    int64_t v;
    snprintf(what, sizeof what, "cb_match_result[%zu].%s", i, field);
    const msgpack_object *o = lmc_mp_map_get(m, field);
    if (!o)
        return fail(err, errlen, "%s: missing", what);
    if (get_ranged(o, 0, (int64_t)LMC_BLEND_MAX_POSITION, what, &v, err, errlen))
        return -1;
    *out = (uint64_t)v;
    return 0;
}

static int one_match(const msgpack_object *m, size_t i, uint32_t cs, lmc_blend_match *out,
                     char *err, size_t errlen)
{
    if (m->type != MSGPACK_OBJECT_MAP)
        return fail(err, errlen, "cb_match_result[%zu]: not a map", i);
    if (position(m, "old_st", i, &out->old_st, err, errlen) ||
        position(m, "old_ed", i, &out->old_ed, err, errlen) ||
        position(m, "cur_st", i, &out->cur_st, err, errlen) ||
        position(m, "cur_ed", i, &out->cur_ed, err, errlen))
        return -1;
    uint64_t oe, ce;
    if (!lmc_add_u64(out->old_st, cs, &oe) || oe != out->old_ed ||
        !lmc_add_u64(out->cur_st, cs, &ce) || ce != out->cur_ed)
        return fail(err, errlen,
                    "cb_match_result[%zu]: [%llu, %llu) -> [%llu, %llu) is not one chunk of %u "
                    "tokens", i, (unsigned long long)out->old_st, (unsigned long long)out->old_ed,
                    (unsigned long long)out->cur_st, (unsigned long long)out->cur_ed, cs);
    char what[64];
    snprintf(what, sizeof what, "cb_match_result[%zu].hash", i);
    if (hash_field(lmc_mp_map_get(m, "hash"), what, out->hash, err, errlen))
        return -1;
    const msgpack_object *p = lmc_mp_map_get(m, "predecessor_hash");
    if (!p || lmc_mp_is_nil(p))
        return 0;
    snprintf(what, sizeof what, "cb_match_result[%zu].predecessor_hash", i);
    if (hash_field(p, what, out->predecessor, err, errlen))
        return -1;
    out->has_predecessor = true;
    return 0;
}

static int matches(const msgpack_object *o, uint32_t cs, lmc_blend_retrieve *r, char *err,
                   size_t errlen)
{
    if (o->type != MSGPACK_OBJECT_ARRAY)
        return fail(err, errlen, "cb_match_result: not a list");
    size_t n = o->via.array.size;
    if (n > LMC_BLEND_MAX_MATCHES)
        return fail(err, errlen, "cb_match_result: %zu matches, at most %u", n,
                    LMC_BLEND_MAX_MATCHES);
    if (n == 0)
        return 0;
    r->matches = calloc(n, sizeof *r->matches);
    if (!r->matches)
        return -2;
    r->n_matches = n;
    for (size_t i = 0; i < n; i++)
        if (one_match(&o->via.array.ptr[i], i, cs, &r->matches[i], err, errlen))
            return -1;
    return 0;
}

static int one_table(const msgpack_object *t, uint32_t g, uint32_t *out, char *err,
                     size_t errlen)
{
    for (uint32_t i = 0; i < t->via.array.size; i++) {
        int64_t v;
        char what[64];
        snprintf(what, sizeof what, "gpu_block_ids[%u][%u]", g, i);
        if (get_ranged(&t->via.array.ptr[i], 0, INT32_MAX, what, &v, err, errlen))
            return -1;
        out[i] = (uint32_t)v;
    }
    return 0;
}

/* Checks the shape and the total before anything is allocated. */
static int tables_shape(const msgpack_object *o, char *err, size_t errlen)
{
    uint32_t n;
    if (group_array(o, "gpu_block_ids", &n, err, errlen))
        return -1;
    uint64_t total = 0;
    for (uint32_t g = 0; g < n; g++) {
        const msgpack_object *t = &o->via.array.ptr[g];
        if (t->type != MSGPACK_OBJECT_ARRAY)
            return fail(err, errlen, "gpu_block_ids[%u]: not a list (one block table per engine "
                        "group)", g);
        if (!lmc_add_u64(total, t->via.array.size, &total) || total > LMC_BLEND_MAX_BLOCKS)
            return fail(err, errlen, "gpu_block_ids: more than %u block ids",
                        LMC_BLEND_MAX_BLOCKS);
    }
    return 0;
}

static int block_tables(const msgpack_object *o, lmc_blend_retrieve *r, char *err,
                        size_t errlen)
{
    if (tables_shape(o, err, errlen))
        return -1;
    uint32_t n = o->via.array.size;
    if (n == 0)
        return 0;
    r->group_len = calloc(n, sizeof *r->group_len);
    r->blocks = calloc(n, sizeof *r->blocks);
    if (!r->group_len || !r->blocks)
        return -2;
    r->n_groups = n;
    for (uint32_t g = 0; g < n; g++) {
        const msgpack_object *t = &o->via.array.ptr[g];
        if (t->via.array.size == 0)
            continue;
        r->blocks[g] = calloc(t->via.array.size, sizeof *r->blocks[g]);
        if (!r->blocks[g])
            return -2;
        r->group_len[g] = t->via.array.size;
        if (one_table(t, g, r->blocks[g], err, errlen))
            return -1;
    }
    return 0;
}

static int retrieve_fields(const msgpack_object *a, uint32_t cs, lmc_blend_retrieve *r,
                           char *err, size_t errlen)
{
    int rc = matches(&a[0], cs, r, err, errlen);
    if (rc == 0)
        rc = block_tables(&a[1], r, err, errlen);
    if (rc == 0)
        rc = get_ranged(&a[2], 0, INT64_MAX, "instance_id", &r->instance_id, err, errlen);
    if (rc)
        return rc;
    const uint8_t *p;
    size_t len;
    if (!lmc_mp_get_bin(&a[3], &p, &len))
        return fail(err, errlen, "event_ipc_handle: not bytes");
    if (len != 0 && len != LMC_BLEND_EVENT_BYTES)
        return fail(err, errlen, "event_ipc_handle: %zu bytes, expected 0 or %d", len,
                    LMC_BLEND_EVENT_BYTES);
    memcpy(r->event, p, len);
    r->event_len = len;
    return 0;
}

int lmc_blend_decode_retrieve(const lmc_blend_frame *f, size_t n, uint32_t cs,
                              lmc_blend_retrieve *out, char *err, size_t errlen)
{
    static const char *const names[] = {"key", "cb_match_result", "gpu_block_ids",
                                        "instance_id", "event_ipc_handle"};
    memset(out, 0, sizeof *out);
    if (count(n, 5, 5, "cb_retrieve_pre_computed", err, errlen))
        return -1;
    msgpack_zone z;
    if (!msgpack_zone_init(&z, 4096))
        return -2;
    msgpack_object a[4];
    int rc = 0;
    for (size_t i = 1; i < n && rc == 0; i++)
        rc = unpack(f, i, names[i], &z, &a[i - 1], err, errlen);
    if (rc == 0)
        rc = retrieve_fields(a, cs, out, err, errlen);
    msgpack_zone_destroy(&z);
    if (rc == 0)
        rc = key_frame(&f[0], cs, &out->key, err, errlen);
    if (rc == 0 && !out->key.has_worker)
        rc = fail(err, errlen, "key: worker_id is None, a retrieve names the caller's rank");
    if (rc)
        lmc_blend_retrieve_free(out);
    return rc;
}

void lmc_blend_retrieve_free(lmc_blend_retrieve *r)
{
    for (uint32_t g = 0; r->blocks && g < r->n_groups; g++)
        free(r->blocks[g]);
    free(r->blocks);
    free(r->group_len);
    free(r->matches);
    lmc_ipc_key_free(&r->key);
    memset(r, 0, sizeof *r);
}

/* ---- replies --------------------------------------------------------- */

static int pack_key(msgpack_packer *pk, const char *k)
{
    return lmc_mp_pack_cstr(pk, k);
}

static int pack_uint_field(msgpack_packer *pk, const char *k, uint64_t v)
{
    return pack_key(pk, k) || msgpack_pack_uint64(pk, v) ? -1 : 0;
}

int lmc_blend_encode_match(msgpack_packer *pk, const lmc_blend_match *m)
{
    if (msgpack_pack_map(pk, m->has_predecessor ? 6 : 5) ||
        pack_uint_field(pk, "old_st", m->old_st) || pack_uint_field(pk, "old_ed", m->old_ed) ||
        pack_uint_field(pk, "cur_st", m->cur_st) || pack_uint_field(pk, "cur_ed", m->cur_ed) ||
        pack_key(pk, "hash") || msgpack_pack_bin_with_body(pk, m->hash, LMC_BLEND_HASH_BYTES))
        return -1;
    if (!m->has_predecessor)
        return 0;
    return pack_key(pk, "predecessor_hash") ||
                   msgpack_pack_bin_with_body(pk, m->predecessor, LMC_BLEND_HASH_BYTES)
               ? -1
               : 0;
}

static int pack_matches(msgpack_packer *pk, const char *k, const lmc_blend_match *m, size_t n)
{
    if (pack_key(pk, k) || msgpack_pack_array(pk, n))
        return -1;
    for (size_t i = 0; i < n; i++)
        if (lmc_blend_encode_match(pk, &m[i]))
            return -1;
    return 0;
}

int lmc_blend_encode_lookup_result(msgpack_packer *pk, uint64_t prefix_coverage_tokens,
                                   const lmc_blend_match *non_prefix, size_t n_non_prefix,
                                   const lmc_blend_match *segmented, size_t n_segmented)
{
    if (msgpack_pack_map(pk, 3) ||
        pack_uint_field(pk, "prefix_coverage_tokens", prefix_coverage_tokens) ||
        pack_matches(pk, "non_prefix_segments", non_prefix, n_non_prefix) ||
        pack_matches(pk, "segmented_prefix_segments", segmented, n_segmented))
        return -1;
    return 0;
}

int lmc_blend_encode_retrieve_reply(msgpack_packer *pk, const uint8_t *event, size_t event_len,
                                    bool scatter_ran)
{
    /* No body for b"": event may be NULL then, and a packer's writer must
     * not see a NULL source. */
    if (msgpack_pack_array(pk, 2) || msgpack_pack_bin(pk, event_len) ||
        (event_len && msgpack_pack_bin_body(pk, event, event_len)))
        return -1;
    return scatter_ran ? msgpack_pack_true(pk) : msgpack_pack_false(pk);
}
