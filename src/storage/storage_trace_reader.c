/* Reading a storage trace back (storage_trace_reader.h, docs/trace.md,
 * "Reading a trace").
 *
 * Every frame is decoded whole by msgpack-c into a zone that is cleared
 * before the next one, and every size taken from the file is checked
 * against its bound before anything is allocated for it.  Unlike
 * upstream's reader, which skips a record that does not decode, a bad
 * frame ends the read: a what-if curve or a replay computed from a trace
 * with holes would be silently wrong (docs/trace.md). */
#include "storage/storage_trace_reader.h"

#include <errno.h>
#include <msgpack.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define QUALNAME_PREFIX "lmcache.v1.distributed.storage_manager.StorageManager."
#define READ_BUFFER (1u << 20)

struct lmc_trace_scratch {
    lmc_key_interner *in;
    msgpack_zone zone;
    lmc_object_key *keys;
    size_t cap_keys;
    size_t n_held;               /* keys[0, n_held) hold references on their strings */
    char qualname[256];
};

struct lmc_trace_reader {
    FILE *f;
    char *path;
    uint64_t offset;             /* of the next frame */
    lmc_trace_header header;
    uint8_t *body;
    size_t cap_body;
    lmc_key_interner *in;
    lmc_trace_scratch *scratch;
};

static int failf(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
    return -1;
}

/* ---- msgpack helpers ------------------------------------------------------ */

static bool str_is(const msgpack_object *o, const char *s)
{
    size_t n = strlen(s);
    return o->type == MSGPACK_OBJECT_STR && o->via.str.size == n &&
           memcmp(o->via.str.ptr, s, n) == 0;
}

static const msgpack_object *map_get(const msgpack_object *map, const char *key)
{
    if (map->type != MSGPACK_OBJECT_MAP)
        return NULL;
    for (uint32_t i = 0; i < map->via.map.size; i++) {
        if (str_is(&map->via.map.ptr[i].key, key))
            return &map->via.map.ptr[i].val;
    }
    return NULL;
}

static bool as_double(const msgpack_object *o, double *out)
{
    if (!o)
        return false;
    switch (o->type) {
    case MSGPACK_OBJECT_FLOAT32:
    case MSGPACK_OBJECT_FLOAT64: *out = o->via.f64; return true;
    case MSGPACK_OBJECT_POSITIVE_INTEGER: *out = (double)o->via.u64; return true;
    case MSGPACK_OBJECT_NEGATIVE_INTEGER: *out = (double)o->via.i64; return true;
    default: return false;
    }
}

static bool as_u32(const msgpack_object *o, uint32_t *out)
{
    if (!o || o->type != MSGPACK_OBJECT_POSITIVE_INTEGER || o->via.u64 > UINT32_MAX)
        return false;
    *out = (uint32_t)o->via.u64;
    return true;
}

/* The payload of {"__t__": tag, "v": payload}, or NULL. */
static const msgpack_object *tagged(const msgpack_object *o, const char *tag)
{
    const msgpack_object *t = map_get(o, "__t__");
    return t && str_is(t, tag) ? map_get(o, "v") : NULL;
}

static uint64_t be(const uint8_t *p, int n)
{
    uint64_t v = 0;
    for (int i = 0; i < n; i++)
        v = v << 8 | p[i];
    return v;
}

/* What follows a type byte: the bytes of its length field, fixed payload
 * and type byte (ext), and how many of its bytes are a length. */
typedef struct {
    uint8_t fixed;       /* payload bytes that follow (after any length) */
    uint8_t len_bytes;   /* str/bin/ext/array/map length field */
    uint8_t kind;        /* 0 scalar, 1 bytes of `len`, 2 array of len, 3 map of len */
} mp_shape;

static bool shape_of(uint8_t b, mp_shape *s)
{
    *s = (mp_shape){0};
    if (b <= 0x7f || b >= 0xe0 || b == 0xc0 || b == 0xc2 || b == 0xc3)
        return true;
    if (b <= 0x8f || (b >= 0x90 && b <= 0x9f))
        return true;   /* fixmap, fixarray: counted by the caller */
    if (b <= 0xbf)
        return true;   /* fixstr */
    static const mp_shape table[0x20] = {
        [0x04] = {0, 1, 1}, [0x05] = {0, 2, 1}, [0x06] = {0, 4, 1},   /* bin */
        [0x07] = {1, 1, 1}, [0x08] = {1, 2, 1}, [0x09] = {1, 4, 1},   /* ext */
        [0x0a] = {4, 0, 0}, [0x0b] = {8, 0, 0},                       /* float */
        [0x0c] = {1, 0, 0}, [0x0d] = {2, 0, 0}, [0x0e] = {4, 0, 0}, [0x0f] = {8, 0, 0},
        [0x10] = {1, 0, 0}, [0x11] = {2, 0, 0}, [0x12] = {4, 0, 0}, [0x13] = {8, 0, 0},
        [0x14] = {2, 0, 0}, [0x15] = {3, 0, 0}, [0x16] = {5, 0, 0}, [0x17] = {9, 0, 0},
        [0x18] = {17, 0, 0},                                          /* fixext */
        [0x19] = {0, 1, 1}, [0x1a] = {0, 2, 1}, [0x1b] = {0, 4, 1},   /* str */
        [0x1c] = {0, 2, 2}, [0x1d] = {0, 4, 2}, [0x1e] = {0, 2, 3}, [0x1f] = {0, 4, 3},
    };
    if (b == 0xc1)
        return false;
    *s = table[b - 0xc0];
    return true;
}

/* msgpack-c allocates an array's or map's elements as its header claims,
 * before it reads them: a 10-byte frame could ask for gigabytes.  So the
 * frame is first walked without allocating: every value must lie inside
 * it, every claimed element must have at least its one byte left, and the
 * values are at most LMC_TRACE_OBJECTS_MAX in all. */
static int prescan(const uint8_t *p, size_t len, char *err, size_t errlen)
{
    uint64_t pending = 1, objects = 0;
    size_t at = 0;
    while (pending > 0) {
        mp_shape s;
        if (at >= len || !shape_of(p[at], &s))
            return failf(err, errlen, "not one msgpack value");
        if (++objects > LMC_TRACE_OBJECTS_MAX)
            return failf(err, errlen, "more than %u msgpack values", LMC_TRACE_OBJECTS_MAX);
        uint8_t b = p[at++];
        uint64_t n = 0;
        pending--;
        if (s.len_bytes) {
            if (len - at < s.len_bytes)
                return failf(err, errlen, "not one msgpack value");
            n = be(p + at, s.len_bytes);
            at += s.len_bytes;
        } else if ((b >= 0x80 && b <= 0x8f) || (b >= 0x90 && b <= 0x9f)) {
            n = b & 0x0f;
            s.kind = b <= 0x8f ? 3 : 2;
        } else if (b >= 0xa0 && b <= 0xbf) {
            n = b & 0x1f;
            s.kind = 1;
        }
        uint64_t skip = s.fixed + (s.kind == 1 ? n : 0);
        pending += s.kind == 2 ? n : s.kind == 3 ? 2 * n : 0;
        if (skip > len - at || pending > len - at - skip)
            return failf(err, errlen, "not one msgpack value");
        at += skip;
    }
    return at == len ? 0 : failf(err, errlen, "bytes after the msgpack value");
}

/* Unpacks exactly `len` bytes into one object of the zone. */
static int unpack_whole(msgpack_zone *zone, const uint8_t *body, size_t len, msgpack_object *obj,
                        char *err, size_t errlen)
{
    size_t off = 0;
    if (prescan(body, len, err, errlen) != 0)
        return -1;
    msgpack_unpack_return rc = msgpack_unpack((const char *)body, len, &off, zone, obj);
    if (rc != MSGPACK_UNPACK_SUCCESS || off != len)
        return failf(err, errlen, "not one msgpack value");
    if (obj->type != MSGPACK_OBJECT_MAP)
        return failf(err, errlen, "not a msgpack map");
    return 0;
}

/* ---- the header ------------------------------------------------------------ */

static int copy_str(const msgpack_object *o, char *out, size_t cap, const char *name, char *err,
                    size_t errlen)
{
    if (!o || o->type != MSGPACK_OBJECT_STR || o->via.str.size >= cap)
        return failf(err, errlen, "header: %s must be a str of at most %zu bytes", name, cap - 1);
    memcpy(out, o->via.str.ptr, o->via.str.size);
    out[o->via.str.size] = '\0';
    return 0;
}

static int header_schema(const msgpack_object *map, int *schema, char *err, size_t errlen)
{
    const msgpack_object *sv = map_get(map, "trace_schema_version");
    uint32_t v;
    if (sv) {
        if (!as_u32(sv, &v) || v < 1 || v > 2)
            return failf(err, errlen, "header: trace_schema_version must be 1 or 2");
        *schema = (int)v;
        return 0;
    }
    const msgpack_object *lv = map_get(map, "lmcache_version");
    if (!lv || lv->type != MSGPACK_OBJECT_STR)
        return failf(err, errlen, "header: neither trace_schema_version nor lmcache_version");
    *schema = 1;
    return 0;
}

static int header_fields(const msgpack_object *map, lmc_trace_header *out, char *err,
                         size_t errlen)
{
    const msgpack_object *magic = map_get(map, "magic"), *type = map_get(map, "type");
    uint32_t format;
    if (!type || !str_is(type, "header"))
        return failf(err, errlen, "header: type is not \"header\"");
    if (!magic || magic->type != MSGPACK_OBJECT_BIN || magic->via.bin.size != 4 ||
        memcmp(magic->via.bin.ptr, LMC_STORAGE_TRACE_MAGIC, 4) != 0)
        return failf(err, errlen, "header: bad magic (not an LMCT trace)");
    if (!as_u32(map_get(map, "format_version"), &format) || format != 1)
        return failf(err, errlen, "header: format_version must be 1");
    out->format_version = 1;
    if (header_schema(map, &out->schema_version, err, errlen) != 0 ||
        copy_str(map_get(map, "level"), out->level, sizeof out->level, "level", err, errlen))
        return -1;
    if (!as_double(map_get(map, "t_mono_start"), &out->t_mono_start) ||
        !as_double(map_get(map, "t_wall_start"), &out->t_wall_start))
        return failf(err, errlen, "header: t_mono_start and t_wall_start must be numbers");
    const msgpack_object *digest = map_get(map, "sm_config_digest");
    if (digest && copy_str(digest, out->sm_config_digest, sizeof out->sm_config_digest,
                           "sm_config_digest", err, errlen))
        return -1;
    const msgpack_object *json = map_get(map, "sm_config_json");
    if (json && json->type != MSGPACK_OBJECT_STR)
        return failf(err, errlen, "header: sm_config_json must be a str");
    size_t n = json ? json->via.str.size : 0;
    if (!(out->sm_config_json = malloc(n + 1)))
        return failf(err, errlen, "out of memory");
    if (n)
        memcpy(out->sm_config_json, json->via.str.ptr, n);
    out->sm_config_json[n] = '\0';
    return 0;
}

int lmc_trace_decode_header(const uint8_t *body, size_t len, lmc_trace_header *out, char *err,
                            size_t errlen)
{
    msgpack_zone zone;
    msgpack_object obj;
    memset(out, 0, sizeof *out);
    if (!msgpack_zone_init(&zone, 2048))
        return failf(err, errlen, "out of memory");
    int rc = unpack_whole(&zone, body, len, &obj, err, errlen);
    if (rc == 0)
        rc = header_fields(&obj, out, err, errlen);
    msgpack_zone_destroy(&zone);
    if (rc != 0)
        lmc_trace_header_clear(out);
    return rc;
}

void lmc_trace_header_clear(lmc_trace_header *h)
{
    free(h->sm_config_json);
    h->sm_config_json = NULL;
}

/* ---- records ------------------------------------------------------------------ */

lmc_trace_scratch *lmc_trace_scratch_new(lmc_key_interner *in)
{
    lmc_trace_scratch *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    s->in = in;
    if (!msgpack_zone_init(&s->zone, 8192)) {
        free(s);
        return NULL;
    }
    return s;
}

void lmc_trace_scratch_free(lmc_trace_scratch *s)
{
    if (!s)
        return;
    msgpack_zone_destroy(&s->zone);
    lmc_keys_drop(s->keys, s->n_held);
    free(s->keys);
    free(s);
}

static lmc_storage_trace_op op_of(const char *method)
{
    static const struct {
        const char *name;
        lmc_storage_trace_op op;
    } ops[] = {
        {"reserve_write", LMC_STORAGE_TRACE_RESERVE_WRITE},
        {"finish_write", LMC_STORAGE_TRACE_FINISH_WRITE},
        {"abort_write", LMC_STORAGE_TRACE_ABORT_WRITE},
        {"submit_prefetch_task", LMC_STORAGE_TRACE_SUBMIT_PREFETCH_TASK},
        {"finish_read_prefetched", LMC_STORAGE_TRACE_FINISH_READ_PREFETCHED},
        {"read_prefetched_results.__enter__", LMC_STORAGE_TRACE_READ_PREFETCHED_ENTER},
        {"read_prefetched_results.__exit__", LMC_STORAGE_TRACE_READ_PREFETCHED_EXIT},
    };
    for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++) {
        if (strcmp(method, ops[i].name) == 0)
            return ops[i].op;
    }
    return LMC_STORAGE_TRACE_UNKNOWN;
}

static const char *intern_str(lmc_trace_scratch *s, const msgpack_object *o)
{
    return lmc_intern(s->in, o->via.str.size ? o->via.str.ptr : "", o->via.str.size);
}

static bool same_str(const msgpack_object *o, const char *interned)
{
    return o->via.str.size == strlen(interned) &&
           (o->via.str.size == 0 || memcmp(o->via.str.ptr, interned, o->via.str.size) == 0);
}

/* The strings of key i: the previous key's when the bytes are the same
 * (the keys of one record nearly always share model and salt), else
 * validated and interned.  The key holds one reference on each until the
 * scratch's next decode, so a bounded interner keeps them meanwhile. */
static int key_strings(lmc_trace_scratch *s, const msgpack_object *model,
                       const msgpack_object *salt, size_t i, lmc_object_key *k, char *err,
                       size_t errlen)
{
    static const msgpack_object no_salt = {.type = MSGPACK_OBJECT_STR};
    if (!salt)
        salt = &no_salt;
    const lmc_object_key *prev = i > 0 ? &s->keys[i - 1] : NULL;
    if (prev && same_str(model, prev->model_name) && same_str(salt, prev->cache_salt)) {
        lmc_object_key_set_strings(k, prev->model_name, prev->cache_salt);
        lmc_keys_hold(k, 1);
        return 0;
    }
    if (!lmc_model_name_valid(model->via.str.ptr, model->via.str.size))
        return failf(err, errlen, "keys[%zu]: %s", i, LMC_MODEL_NAME_RULE);
    if (!lmc_cache_salt_valid(salt->via.str.size ? salt->via.str.ptr : "", salt->via.str.size))
        return failf(err, errlen, "keys[%zu]: %s", i, LMC_CACHE_SALT_RULE);
    const char *m = intern_str(s, model), *c = intern_str(s, salt);
    if (!m || !c) {
        lmc_intern_release(m);
        lmc_intern_release(c);
        return failf(err, errlen, "keys[%zu]: out of memory, or the interner is full", i);
    }
    lmc_object_key_set_strings(k, m, c);
    return 0;
}

static int decode_key(lmc_trace_scratch *s, const msgpack_object *o, size_t i,
                      lmc_object_key *k, char *err, size_t errlen)
{
    const msgpack_object *v = tagged(o, "ObjectKey");
    if (!v)
        return failf(err, errlen, "keys[%zu] is not an ObjectKey", i);
    const msgpack_object *hash = map_get(v, "chunk_hash"), *model = map_get(v, "model_name");
    const msgpack_object *salt = map_get(v, "cache_salt");
    memset(k, 0, sizeof *k);
    if (!hash || hash->type != MSGPACK_OBJECT_BIN || hash->via.bin.size == 0 ||
        hash->via.bin.size > LMC_CHUNK_HASH_MAX)
        return failf(err, errlen, "keys[%zu]: chunk_hash must be bin of 1 to %d bytes", i,
                     LMC_CHUNK_HASH_MAX);
    if (!model || model->type != MSGPACK_OBJECT_STR)
        return failf(err, errlen, "keys[%zu]: %s", i, LMC_MODEL_NAME_RULE);
    if (salt && salt->type != MSGPACK_OBJECT_STR)
        return failf(err, errlen, "keys[%zu]: %s", i, LMC_CACHE_SALT_RULE);
    if (!as_u32(map_get(v, "kv_rank"), &k->kv_rank) ||
        !as_u32(map_get(v, "object_group_id"), &k->object_group_id))
        return failf(err, errlen, "keys[%zu]: kv_rank and object_group_id must be uint32", i);
    memcpy(k->chunk_hash, hash->via.bin.ptr, hash->via.bin.size);
    k->chunk_hash_len = (uint8_t)hash->via.bin.size;
    return key_strings(s, model, salt, i, k, err, errlen);
}

static int decode_keys(lmc_trace_scratch *s, const msgpack_object *args, lmc_trace_record *rec,
                       char *err, size_t errlen)
{
    const msgpack_object *keys = map_get(args, "keys");
    if (!keys || keys->type != MSGPACK_OBJECT_ARRAY)
        return failf(err, errlen, "args.keys must be an array");
    size_t n = keys->via.array.size;
    if (n > LMC_TRACE_KEYS_MAX)
        return failf(err, errlen, "args.keys has %zu keys, more than %u", n, LMC_TRACE_KEYS_MAX);
    if (n > s->cap_keys) {
        lmc_object_key *grown = realloc(s->keys, n * sizeof *grown);
        if (!grown)
            return failf(err, errlen, "out of memory");
        s->keys = grown;
        s->cap_keys = n;
    }
    for (size_t i = 0; i < n; i++, s->n_held++) {
        if (decode_key(s, &keys->via.array.ptr[i], i, &s->keys[i], err, errlen) != 0)
            return -1;
    }
    rec->keys = s->keys;
    rec->n_keys = n;
    return 0;
}

/* Bytes per element of the dtypes a layout may name (docs/trace.md). */
static uint64_t dtype_size(const msgpack_object *o)
{
    static const struct {
        const char *name;
        uint64_t size;
    } dtypes[] = {
        {"torch.uint8", 1},   {"torch.int8", 1},    {"torch.float16", 2}, {"torch.bfloat16", 2},
        {"torch.float32", 4}, {"torch.float64", 8}, {"torch.int32", 4},   {"torch.int64", 8},
    };
    for (size_t i = 0; i < sizeof dtypes / sizeof dtypes[0]; i++) {
        if (str_is(o, dtypes[i].name))
            return dtypes[i].size;
    }
    return 0;
}

static bool mul_ok(uint64_t a, uint64_t b, uint64_t *out)
{
    return !__builtin_mul_overflow(a, b, out);
}

/* sum over tensors of prod(shape) x dtype size, every step overflow-checked. */
static int layout_size(const msgpack_object *args, uint64_t *out, char *err, size_t errlen)
{
    const msgpack_object *desc = map_get(args, "layout_desc");
    const msgpack_object *v = desc ? tagged(desc, "MemoryLayoutDesc") : NULL;
    const msgpack_object *shapes = v ? map_get(v, "shapes") : NULL;
    const msgpack_object *dtypes = v ? map_get(v, "dtypes") : NULL;
    if (!shapes || !dtypes || shapes->type != MSGPACK_OBJECT_ARRAY ||
        dtypes->type != MSGPACK_OBJECT_ARRAY || shapes->via.array.size != dtypes->via.array.size)
        return failf(err, errlen, "args.layout_desc must be a MemoryLayoutDesc with as many "
                                  "shapes as dtypes");
    uint64_t total = 0;
    for (uint32_t t = 0; t < shapes->via.array.size; t++) {
        const msgpack_object *shape = &shapes->via.array.ptr[t];
        uint64_t size = dtype_size(&dtypes->via.array.ptr[t]);
        if (size == 0)
            return failf(err, errlen, "args.layout_desc: dtypes[%u] is not one of torch.uint8, "
                                      "int8, float16, bfloat16, float32, float64, int32, int64", t);
        if (shape->type != MSGPACK_OBJECT_ARRAY)
            return failf(err, errlen, "args.layout_desc: shapes[%u] is not an array", t);
        for (uint32_t d = 0; d < shape->via.array.size; d++) {
            const msgpack_object *dim = &shape->via.array.ptr[d];
            if (dim->type != MSGPACK_OBJECT_POSITIVE_INTEGER || !mul_ok(size, dim->via.u64, &size))
                return failf(err, errlen, "args.layout_desc: shapes[%u] is not a shape of "
                                          "non-negative sizes whose product fits 64 bits", t);
        }
        if (__builtin_add_overflow(total, size, &total))
            return failf(err, errlen, "args.layout_desc: the size does not fit 64 bits");
    }
    *out = total;
    return 0;
}

static int record_fields(lmc_trace_scratch *s, const msgpack_object *map, lmc_trace_record *rec,
                         char *err, size_t errlen)
{
    const msgpack_object *type = map_get(map, "type"), *qual = map_get(map, "qualname");
    const msgpack_object *args = map_get(map, "args");
    if (!type || !str_is(type, "record"))
        return failf(err, errlen, "type is not \"record\"");
    if (!as_double(map_get(map, "t_mono"), &rec->t_mono) ||
        !as_double(map_get(map, "t_wall"), &rec->t_wall))
        return failf(err, errlen, "t_mono and t_wall must be numbers");
    if (!qual || qual->type != MSGPACK_OBJECT_STR || qual->via.str.size >= sizeof s->qualname)
        return failf(err, errlen, "qualname must be a str of at most %zu bytes",
                     sizeof s->qualname - 1);
    memcpy(s->qualname, qual->via.str.ptr, qual->via.str.size);
    s->qualname[qual->via.str.size] = '\0';
    rec->qualname = s->qualname;
    size_t plen = strlen(QUALNAME_PREFIX);
    rec->op = strncmp(s->qualname, QUALNAME_PREFIX, plen) == 0 ? op_of(s->qualname + plen)
                                                               : LMC_STORAGE_TRACE_UNKNOWN;
    if (rec->op == LMC_STORAGE_TRACE_UNKNOWN)
        return 0;   /* another method's arguments are not ours to judge */
    if (!args || args->type != MSGPACK_OBJECT_MAP)
        return failf(err, errlen, "args must be a map");
    if (decode_keys(s, args, rec, err, errlen) != 0)
        return -1;
    if (rec->op == LMC_STORAGE_TRACE_RESERVE_WRITE)
        return layout_size(args, &rec->object_size, err, errlen);
    return 0;
}

int lmc_trace_decode_record(lmc_trace_scratch *s, const uint8_t *body, size_t len,
                            lmc_trace_record *rec, char *err, size_t errlen)
{
    msgpack_object obj;
    uint64_t offset = rec->offset;
    memset(rec, 0, sizeof *rec);
    rec->offset = offset;
    rec->op = LMC_STORAGE_TRACE_UNKNOWN;
    rec->qualname = "";
    rec->keys = s->keys;
    rec->frame = body;
    rec->frame_len = len;
    lmc_keys_drop(s->keys, s->n_held);
    s->n_held = 0;
    msgpack_zone_clear(&s->zone);
    if (unpack_whole(&s->zone, body, len, &obj, err, errlen) != 0 ||
        record_fields(s, &obj, rec, err, errlen) != 0) {
        rec->n_keys = 0;
        return -1;
    }
    return 0;
}

/* ---- the file ----------------------------------------------------------------- */

/* 1: a frame's body in r->body; 0: end of file on a frame boundary; -1. */
static int read_frame(lmc_trace_reader *r, size_t *len, char *err, size_t errlen)
{
    uint8_t prefix[4];
    size_t got = fread(prefix, 1, 4, r->f);
    if (got == 0 && feof(r->f))
        return 0;
    if (got < 4)
        return failf(err, errlen, "%s: cut short at byte %llu: %zu of a frame's 4 length bytes",
                     r->path, (unsigned long long)r->offset, got);
    uint32_t n = (uint32_t)prefix[0] << 24 | (uint32_t)prefix[1] << 16 |
                 (uint32_t)prefix[2] << 8 | prefix[3];
    if (n > LMC_TRACE_FRAME_MAX)
        return failf(err, errlen, "%s: frame at byte %llu claims %u bytes, more than %u",
                     r->path, (unsigned long long)r->offset, n, LMC_TRACE_FRAME_MAX);
    if (n > r->cap_body) {
        uint8_t *grown = realloc(r->body, n);
        if (!grown)
            return failf(err, errlen, "%s: out of memory", r->path);
        r->body = grown;
        r->cap_body = n;
    }
    got = fread(r->body, 1, n, r->f);
    if (got < n)
        return failf(err, errlen, "%s: cut short at byte %llu: %zu of the frame's %u bytes",
                     r->path, (unsigned long long)r->offset, got, n);
    *len = n;
    return 1;
}

lmc_trace_reader *lmc_trace_reader_open(const char *path, char *err, size_t errlen)
{
    lmc_trace_reader *r = calloc(1, sizeof *r);
    size_t len = 0;
    char why[256];
    if (!r || !(r->path = strdup(path)) || !(r->in = lmc_key_interner_new()) ||
        !(r->scratch = lmc_trace_scratch_new(r->in))) {
        failf(err, errlen, "%s: out of memory", path);
        goto fail;
    }
    if (!(r->f = fopen(path, "rb"))) {
        failf(err, errlen, "%s: cannot open: %s", path, strerror(errno));
        goto fail;
    }
    setvbuf(r->f, NULL, _IOFBF, READ_BUFFER);
    int rc = read_frame(r, &len, err, errlen);
    if (rc == 0)
        failf(err, errlen, "%s: bad header at byte 0: the file is empty", path);
    if (rc != 1)
        goto fail;
    if (lmc_trace_decode_header(r->body, len, &r->header, why, sizeof why) != 0) {
        failf(err, errlen, "%s: bad header at byte 0: %s", path, why);
        goto fail;
    }
    r->offset = 4 + (uint64_t)len;
    return r;
fail:
    lmc_trace_reader_close(r);
    return NULL;
}

const lmc_trace_header *lmc_trace_reader_header(const lmc_trace_reader *r)
{
    return &r->header;
}

int lmc_trace_reader_next(lmc_trace_reader *r, lmc_trace_record *rec, char *err, size_t errlen)
{
    size_t len = 0;
    char why[256];
    rec->offset = r->offset;
    int rc = read_frame(r, &len, err, errlen);
    if (rc != 1)
        return rc;
    if (lmc_trace_decode_record(r->scratch, r->body, len, rec, why, sizeof why) != 0)
        return failf(err, errlen, "%s: frame at byte %llu does not decode: %s", r->path,
                     (unsigned long long)rec->offset, why);
    r->offset += 4 + (uint64_t)len;
    return 1;
}

void lmc_trace_reader_close(lmc_trace_reader *r)
{
    if (!r)
        return;
    if (r->f)
        fclose(r->f);
    lmc_trace_header_clear(&r->header);
    lmc_trace_scratch_free(r->scratch);
    lmc_key_interner_free(r->in);
    free(r->body);
    free(r->path);
    free(r);
}
