#include "kv/shared_tensor.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "rpc/pickle.h"
#include "rpc/wire.h"

/* Upstream has moved the wrappers between modules over its revisions; any
 * of these carries them (docs/protocol.md, "Shared tensor handles"). */
static const char *const wrapper_modules[] = {
    "lmcache.v1.multiprocess.custom_types",
    "lmcache.v1.platform.cuda.ipc_wrapper",
    "lmcache.v1.platform.devices.cuda.ipc_wrapper",
    "lmcache.v1.platform.backends.cuda.ipc_wrapper",
    "lmcache.v1.platform.cpu.shm",
    "lmcache.v1.platform.devices.cpu.shm",
    "lmcache.v1.platform.backends.cpu.shm",
};

/* VmmCudaIPCWrapper is let through the reader only to be refused by name. */
static const char *const wrapper_classes[] = {
    "CudaIPCWrapper", "RawCudaIPCWrapper", "CpuShmTensorWrapper", "VmmCudaIPCWrapper",
};

static const struct {
    const char *name;
    uint32_t itemsize;
} torch_dtypes[] = {
    {"float16", 2},       {"bfloat16", 2},        {"float32", 4},          {"float64", 8},
    {"uint8", 1},         {"int8", 1},            {"float8_e4m3fn", 1},    {"float8_e5m2", 1},
    {"float8_e4m3fnuz", 1}, {"float8_e5m2fnuz", 1}, {"int32", 4},         {"int64", 8},
};

#define COUNT(a) (sizeof(a) / sizeof((a)[0]))

static bool span_eq(const uint8_t *s, size_t len, const char *z)
{
    return strlen(z) == len && memcmp(s, z, len) == 0;
}

uint32_t lmc_torch_dtype_itemsize(const char *name, size_t len)
{
    for (size_t i = 0; i < COUNT(torch_dtypes); i++)
        if (span_eq((const uint8_t *)name, len, torch_dtypes[i].name))
            return torch_dtypes[i].itemsize;
    return 0;
}

const char *lmc_tensor_wrapper_name(lmc_tensor_wrapper w)
{
    static const char *const names[] = {"CudaIPCWrapper", "RawCudaIPCWrapper",
                                        "CpuShmTensorWrapper"};
    return (unsigned)w < COUNT(names) ? names[w] : "unknown";
}

static bool allow_global(const uint8_t *mod, size_t mod_len, const uint8_t *name, size_t name_len,
                         bool *instantiable)
{
    *instantiable = false;
    if (span_eq(mod, mod_len, "torch"))
        return lmc_torch_dtype_itemsize((const char *)name, name_len) > 0;
    for (size_t i = 0; i < COUNT(wrapper_modules); i++) {
        if (!span_eq(mod, mod_len, wrapper_modules[i]))
            continue;
        for (size_t k = 0; k < COUNT(wrapper_classes); k++)
            if (span_eq(name, name_len, wrapper_classes[k]))
                return *instantiable = true;
    }
    return false;
}

/* ---- fields ------------------------------------------------------------- */

typedef struct {
    const lmc_pv *state;
    char *err;
    size_t errlen;
} fields;

static int bad(fields *f, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int bad(fields *f, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(f->err, f->errlen, fmt, ap);
    va_end(ap);
    return -1;
}

static const lmc_pv *field(fields *f, const char *key, lmc_pv_kind kind)
{
    const lmc_pv *v = lmc_pv_dict_get(f->state, key);
    if (!v || v->kind != kind) {
        bad(f, "field '%s' is %s", key, v ? "of the wrong type" : "missing");
        return NULL;
    }
    return v;
}

static int int_field(fields *f, const char *key, int64_t min, int64_t *out)
{
    const lmc_pv *v = field(f, key, LMC_PV_INT);
    if (!v)
        return -1;
    if (v->i < min)
        return bad(f, "field '%s' is %lld, below %lld", key, (long long)v->i, (long long)min);
    *out = v->i;
    return 0;
}

static int text_field(fields *f, const lmc_pv *v, const char *what, char *out, size_t cap)
{
    if (v->len >= cap || memchr(v->data, '\0', v->len))
        return bad(f, "%s is longer than %zu bytes or holds a NUL", what, cap - 1);
    memcpy(out, v->data, v->len);
    out[v->len] = '\0';
    return 0;
}

static int dims(fields *f, const char *key, int64_t *out, uint32_t *ndim)
{
    const lmc_pv *t = field(f, key, LMC_PV_TUPLE);
    if (!t)
        return -1;
    if (t->n == 0 || t->n > LMC_TENSOR_MAX_DIMS)
        return bad(f, "'%s' has %u dimensions, not 1..%d", key, t->n, LMC_TENSOR_MAX_DIMS);
    for (uint32_t d = 0; d < t->n; d++) {
        if (t->items[d]->kind != LMC_PV_INT || t->items[d]->i < 0)
            return bad(f, "'%s'[%u] is not a non-negative int", key, d);
        out[d] = t->items[d]->i;
    }
    *ndim = t->n;
    return 0;
}

/* dtype, shape, stride, storage_offset, device_uuid. */
static int common_fields(fields *f, lmc_shared_tensor *t)
{
    const lmc_pv *dt = field(f, "dtype", LMC_PV_GLOBAL);
    if (!dt)
        return -1;
    if (!span_eq(dt->data, dt->len, "torch"))
        return bad(f, "dtype is not a torch dtype");
    t->itemsize = lmc_torch_dtype_itemsize((const char *)dt->name, dt->name_len);
    memcpy(t->dtype, dt->name, dt->name_len);   /* allowed names are short */
    t->dtype[dt->name_len] = '\0';
    uint32_t nstride;
    if (dims(f, "shape", t->shape, &t->ndim) != 0 || dims(f, "stride", t->stride, &nstride) != 0)
        return -1;
    if (nstride != t->ndim)
        return bad(f, "shape has %u dimensions and stride %u", t->ndim, nstride);
    if (int_field(f, "storage_offset", 0, &t->storage_offset) != 0)
        return -1;
    const lmc_pv *uuid = field(f, "device_uuid", LMC_PV_STR);
    return uuid ? text_field(f, uuid, "device_uuid", t->device_uuid, sizeof t->device_uuid) : -1;
}

/* The tensor's last byte must lie inside the memory the handle names:
 * (storage_offset + sum((shape-1) * stride) + 1) * itemsize <= bytes. */
static int fits(fields *f, const lmc_shared_tensor *t, uint64_t bytes)
{
    uint64_t last = (uint64_t)t->storage_offset, term;
    for (uint32_t d = 0; d < t->ndim; d++) {
        if (t->shape[d] == 0)
            return bad(f, "an empty tensor (shape[%u] is 0)", d);
        if (__builtin_mul_overflow((uint64_t)(t->shape[d] - 1), (uint64_t)t->stride[d], &term) ||
            __builtin_add_overflow(last, term, &last))
            return bad(f, "shape and stride overflow");
    }
    uint64_t end;
    if (__builtin_add_overflow(last, 1, &end) ||
        __builtin_mul_overflow(end, (uint64_t)t->itemsize, &end) || end > bytes)
        return bad(f, "the tensor reaches past the %llu bytes its handle shares",
                   (unsigned long long)bytes);
    return 0;
}

/* ---- the wrappers ------------------------------------------------------- */

/* The memory handle of torch's _share_cuda_(): 64 raw bytes (older torch),
 * or version 2/3, type 'c', then the 64 bytes.  Type 'e' (expandable
 * segments) needs file descriptors passed and cannot be opened here. */
static int cuda_mem_handle(fields *f, const lmc_pv *h, uint8_t *out)
{
    if (h->len == LMC_CUDA_IPC_HANDLE_BYTES) {
        memcpy(out, h->data, LMC_CUDA_IPC_HANDLE_BYTES);
        return 0;
    }
    if (h->len >= 2 && (h->data[0] == 2 || h->data[0] == 3) && h->data[1] == 'e')
        return bad(f, "an expandable-segment CUDA handle (PYTORCH_CUDA_ALLOC_CONF="
                      "expandable_segments:True) cannot be opened by another process");
    if (h->len != 2 + LMC_CUDA_IPC_HANDLE_BYTES || (h->data[0] != 2 && h->data[0] != 3) ||
        h->data[1] != 'c')
        return bad(f, "an unknown CUDA memory handle format (%zu bytes)", h->len);
    memcpy(out, h->data + 2, LMC_CUDA_IPC_HANDLE_BYTES);
    return 0;
}

static int cuda_ipc(fields *f, lmc_shared_tensor *t)
{
    const lmc_pv *h = field(f, "handle", LMC_PV_TUPLE);
    if (!h)
        return -1;
    static const lmc_pv_kind want[8] = {LMC_PV_INT,   LMC_PV_BYTES, LMC_PV_INT, LMC_PV_INT,
                                        LMC_PV_BYTES, LMC_PV_INT,   LMC_PV_BYTES, LMC_PV_BOOL};
    if (h->n != 8)
        return bad(f, "'handle' has %u items, not the 8 of _share_cuda_()", h->n);
    for (int k = 0; k < 8; k++)
        if (h->items[k]->kind != want[k])
            return bad(f, h->items[k]->kind == LMC_PV_NONE
                              ? "'handle' shares an empty storage"
                              : "'handle'[%d] is of the wrong type", k);
    const lmc_pv *const *it = (const lmc_pv *const *)h->items;
    if (it[2]->i < 0 || it[3]->i < 0 || it[6]->len != LMC_CUDA_IPC_HANDLE_BYTES)
        return bad(f, "'handle' has a negative size or offset, or an event handle of %zu bytes",
                   it[6]->len);
    if (cuda_mem_handle(f, it[1], t->mem_handle) != 0 ||
        text_field(f, it[4], "the ref-counter file name", t->ref_counter_file,
                   sizeof t->ref_counter_file) != 0)
        return -1;
    t->storage_bytes = (uint64_t)it[2]->i;
    t->base_offset_bytes = (uint64_t)it[3]->i;
    t->ref_counter_slot = it[5]->i;
    memcpy(t->event_handle, it[6]->data, LMC_CUDA_IPC_HANDLE_BYTES);
    t->event_sync_required = it[7]->i != 0;
    return fits(f, t, t->storage_bytes);
}

static int raw_cuda_ipc(fields *f, lmc_shared_tensor *t)
{
    const lmc_pv *h = field(f, "_ipc_handle_reserved", LMC_PV_BYTES);
    int64_t offset, nbytes;
    if (!h || int_field(f, "_alloc_offset", 0, &offset) != 0 ||
        int_field(f, "_nbytes", 1, &nbytes) != 0)
        return -1;
    if (h->len != LMC_CUDA_IPC_HANDLE_BYTES)
        return bad(f, "'_ipc_handle_reserved' is %zu bytes, not %d", h->len,
                   LMC_CUDA_IPC_HANDLE_BYTES);
    memcpy(t->mem_handle, h->data, LMC_CUDA_IPC_HANDLE_BYTES);
    t->base_offset_bytes = (uint64_t)offset;
    t->storage_bytes = (uint64_t)nbytes;
    return fits(f, t, t->storage_bytes);
}

static int cpu_shm(fields *f, lmc_shared_tensor *t)
{
    const lmc_pv *name = field(f, "shm_name", LMC_PV_STR);
    int64_t nbytes;
    if (!name || int_field(f, "nbytes", 1, &nbytes) != 0 ||
        text_field(f, name, "shm_name", t->shm_name, sizeof t->shm_name) != 0)
        return -1;
    if (t->shm_name[0] != '/' || strchr(t->shm_name + 1, '/') || !t->shm_name[1])
        return bad(f, "shm_name '%s' is not a POSIX shared memory name (\"/name\")",
                   t->shm_name);
    t->storage_bytes = (uint64_t)nbytes;
    return fits(f, t, t->storage_bytes);
}

/* ---- data-only descriptors ---------------------------------------------
 * lmcache 0.5.6 and later send each handle as a msgpack map instead of a
 * pickle (docs/protocol.md, "Shared tensor handles"): a "type" tag, a
 * "version", the view's "metadata" and the fields of the tag.  The same
 * facts as the pickle's, so they fill the same description. */

typedef struct {
    const msgpack_object *map;
    char *err;
    size_t errlen;
} desc;

static const msgpack_object *desc_get(desc *d, const msgpack_object *map, const char *key,
                                      msgpack_object_type type)
{
    const msgpack_object *v = lmc_mp_map_get(map, key);
    /* msgpack-c types a non-negative int as POSITIVE_INTEGER; callers that
     * ask for an int accept both kinds and check the sign themselves. */
    bool ok = v && (v->type == type || (type == MSGPACK_OBJECT_POSITIVE_INTEGER &&
                                        v->type == MSGPACK_OBJECT_NEGATIVE_INTEGER));
    if (!ok) {
        fields f = {NULL, d->err, d->errlen};
        bad(&f, "field '%s' is %s", key, v ? "of the wrong type" : "missing");
        return NULL;
    }
    return v;
}

static int desc_uint(desc *d, const msgpack_object *map, const char *key, int64_t min,
                     int64_t *out)
{
    const msgpack_object *v = desc_get(d, map, key, MSGPACK_OBJECT_POSITIVE_INTEGER);
    fields f = {NULL, d->err, d->errlen};
    if (!v)
        return -1;
    if (v->type != MSGPACK_OBJECT_POSITIVE_INTEGER || v->via.u64 > INT64_MAX ||
        (int64_t)v->via.u64 < min)
        return bad(&f, "field '%s' is below %lld or above 2^63", key, (long long)min);
    *out = (int64_t)v->via.u64;
    return 0;
}

static int desc_text(desc *d, const msgpack_object *v, const char *what, char *out, size_t cap)
{
    fields f = {NULL, d->err, d->errlen};
    size_t len = 0;
    const char *s = NULL;
    if (!lmc_mp_get_str(v, &s, &len) && !lmc_mp_get_bin(v, (const uint8_t **)&s, &len))
        return bad(&f, "%s is not a string", what);
    if (len >= cap || memchr(s, '\0', len))
        return bad(&f, "%s is longer than %zu bytes or holds a NUL", what, cap - 1);
    memcpy(out, s, len);
    out[len] = '\0';
    return 0;
}

static int desc_dims(desc *d, const msgpack_object *meta, const char *key, int64_t *out,
                     uint32_t *ndim)
{
    fields f = {NULL, d->err, d->errlen};
    const msgpack_object *a = desc_get(d, meta, key, MSGPACK_OBJECT_ARRAY);
    if (!a)
        return -1;
    if (a->via.array.size == 0 || a->via.array.size > LMC_TENSOR_MAX_DIMS)
        return bad(&f, "'%s' has %u dimensions, not 1..%d", key, a->via.array.size,
                   LMC_TENSOR_MAX_DIMS);
    for (uint32_t i = 0; i < a->via.array.size; i++) {
        const msgpack_object *e = &a->via.array.ptr[i];
        if (e->type != MSGPACK_OBJECT_POSITIVE_INTEGER || e->via.u64 > INT64_MAX)
            return bad(&f, "'%s'[%u] is not a non-negative int", key, i);
        out[i] = (int64_t)e->via.u64;
    }
    *ndim = a->via.array.size;
    return 0;
}

/* "metadata": dtype (a torch name without "torch."), shape, stride,
 * storage_offset, device_uuid. */
static int desc_metadata(desc *d, lmc_shared_tensor *t)
{
    fields f = {NULL, d->err, d->errlen};
    const msgpack_object *meta = desc_get(d, d->map, "metadata", MSGPACK_OBJECT_MAP);
    const msgpack_object *dt = meta ? desc_get(d, meta, "dtype", MSGPACK_OBJECT_STR) : NULL;
    if (!dt)
        return -1;
    t->itemsize = lmc_torch_dtype_itemsize(dt->via.str.ptr, dt->via.str.size);
    if (t->itemsize == 0)
        return bad(&f, "dtype '%.*s' is not supported", (int)(dt->via.str.size > 32 ? 32 :
                   dt->via.str.size), dt->via.str.ptr);
    memcpy(t->dtype, dt->via.str.ptr, dt->via.str.size);   /* supported names are short */
    t->dtype[dt->via.str.size] = '\0';
    uint32_t nstride;
    if (desc_dims(d, meta, "shape", t->shape, &t->ndim) != 0 ||
        desc_dims(d, meta, "stride", t->stride, &nstride) != 0)
        return -1;
    if (nstride != t->ndim)
        return bad(&f, "shape has %u dimensions and stride %u", t->ndim, nstride);
    if (desc_uint(d, meta, "storage_offset", 0, &t->storage_offset) != 0)
        return -1;
    const msgpack_object *uuid = desc_get(d, meta, "device_uuid", MSGPACK_OBJECT_STR);
    return uuid ? desc_text(d, uuid, "device_uuid", t->device_uuid, sizeof t->device_uuid) : -1;
}

/* "cuda": torch's _share_cuda_() tuple, as the pickle's 'handle'. */
static int desc_cuda(desc *d, lmc_shared_tensor *t)
{
    fields f = {NULL, d->err, d->errlen};
    const msgpack_object *h = desc_get(d, d->map, "handle", MSGPACK_OBJECT_ARRAY);
    if (!h)
        return -1;
    if (h->via.array.size != 8)
        return bad(&f, "'handle' has %u items, not the 8 of _share_cuda_()", h->via.array.size);
    const msgpack_object *it = h->via.array.ptr;
    static const int bytes_items[] = {1, 4, 6}, size_items[] = {2, 3, 5};
    for (size_t k = 0; k < COUNT(bytes_items); k++)
        if (it[bytes_items[k]].type != MSGPACK_OBJECT_BIN)
            return bad(&f, it[bytes_items[k]].type == MSGPACK_OBJECT_NIL
                               ? "'handle' shares an empty storage"
                               : "'handle'[%d] is of the wrong type", bytes_items[k]);
    for (size_t k = 0; k < COUNT(size_items); k++)
        if (it[size_items[k]].type != MSGPACK_OBJECT_POSITIVE_INTEGER ||
            it[size_items[k]].via.u64 > INT64_MAX)
            return bad(&f, "'handle'[%d] is not a non-negative int", size_items[k]);
    if (it[7].type != MSGPACK_OBJECT_BOOLEAN || it[6].via.bin.size != LMC_CUDA_IPC_HANDLE_BYTES)
        return bad(&f, "'handle'[7] is not a bool, or its event handle is %u bytes, not %d",
                   it[6].via.bin.size, LMC_CUDA_IPC_HANDLE_BYTES);
    lmc_pv mem = {.kind = LMC_PV_BYTES, .data = (const uint8_t *)it[1].via.bin.ptr,
                  .len = it[1].via.bin.size};
    if (cuda_mem_handle(&f, &mem, t->mem_handle) != 0 ||
        desc_text(d, &it[4], "the ref-counter file name", t->ref_counter_file,
                  sizeof t->ref_counter_file) != 0)
        return -1;
    t->storage_bytes = it[2].via.u64;
    t->base_offset_bytes = it[3].via.u64;
    t->ref_counter_slot = (int64_t)it[5].via.u64;
    memcpy(t->event_handle, it[6].via.bin.ptr, LMC_CUDA_IPC_HANDLE_BYTES);
    t->event_sync_required = it[7].via.boolean;
    return fits(&f, t, t->storage_bytes);
}

/* "cuda_raw": one cudaIpcMemHandle of the allocation and a byte range. */
static int desc_cuda_raw(desc *d, lmc_shared_tensor *t)
{
    fields f = {NULL, d->err, d->errlen};
    const msgpack_object *h = desc_get(d, d->map, "ipc_handle", MSGPACK_OBJECT_BIN);
    int64_t offset, nbytes;
    if (!h || desc_uint(d, d->map, "alloc_offset", 0, &offset) != 0 ||
        desc_uint(d, d->map, "nbytes", 1, &nbytes) != 0)
        return -1;
    if (h->via.bin.size != LMC_CUDA_IPC_HANDLE_BYTES)
        return bad(&f, "'ipc_handle' is %u bytes, not %d", h->via.bin.size,
                   LMC_CUDA_IPC_HANDLE_BYTES);
    memcpy(t->mem_handle, h->via.bin.ptr, LMC_CUDA_IPC_HANDLE_BYTES);
    t->base_offset_bytes = (uint64_t)offset;
    t->storage_bytes = (uint64_t)nbytes;
    return fits(&f, t, t->storage_bytes);
}

/* "cpu_shm": a POSIX shared memory segment by name. */
static int desc_cpu_shm(desc *d, lmc_shared_tensor *t)
{
    const msgpack_object *name = desc_get(d, d->map, "shm_name", MSGPACK_OBJECT_STR);
    int64_t nbytes;
    if (!name || desc_uint(d, d->map, "nbytes", 1, &nbytes) != 0 ||
        desc_text(d, name, "shm_name", t->shm_name, sizeof t->shm_name) != 0)
        return -1;
    fields f = {NULL, d->err, d->errlen};
    if (t->shm_name[0] != '/' || strchr(t->shm_name + 1, '/') || !t->shm_name[1])
        return bad(&f, "shm_name '%s' is not a POSIX shared memory name (\"/name\")",
                   t->shm_name);
    t->storage_bytes = (uint64_t)nbytes;
    return fits(&f, t, t->storage_bytes);
}

static int decode_descriptor(const uint8_t *data, size_t len, lmc_shared_tensor *out, char *err,
                             size_t errlen)
{
    fields f = {NULL, err, errlen};
    if (!lmc_mp_validate(data, len, 4))
        return bad(&f, "the descriptor is not one well-formed msgpack map");
    msgpack_zone zone;
    if (!msgpack_zone_init(&zone, 1024))
        return -2;
    msgpack_object root;
    size_t off = 0;
    int rc = -1;
    if (msgpack_unpack((const char *)data, len, &off, &zone, &root) != MSGPACK_UNPACK_SUCCESS) {
        rc = bad(&f, "the descriptor does not decode");
        goto out;
    }
    desc d = {&root, err, errlen};
    const msgpack_object *tag = desc_get(&d, &root, "type", MSGPACK_OBJECT_STR);
    int64_t version;
    if (!tag || desc_uint(&d, &root, "version", 0, &version) != 0)
        goto out;
    if (version != 1) {
        rc = bad(&f, "descriptor version %lld is not 1", (long long)version);
        goto out;
    }
    if (lmc_mp_str_eq(tag, "cuda_vmm")) {
        rc = bad(&f, "a cuda_vmm descriptor (cuMemCreate memory shared by file descriptor) "
                     "is not supported; register with the default CUDA allocator");
        goto out;
    }
    if (desc_metadata(&d, out) != 0)
        goto out;
    if (lmc_mp_str_eq(tag, "cuda")) {
        out->wrapper = LMC_WRAPPER_CUDA_IPC;
        rc = desc_cuda(&d, out);
    } else if (lmc_mp_str_eq(tag, "cuda_raw")) {
        out->wrapper = LMC_WRAPPER_RAW_CUDA_IPC;
        rc = desc_cuda_raw(&d, out);
    } else if (lmc_mp_str_eq(tag, "cpu_shm")) {
        out->wrapper = LMC_WRAPPER_CPU_SHM;
        rc = desc_cpu_shm(&d, out);
    } else {
        rc = bad(&f, "descriptor type '%.*s' is not supported", (int)(tag->via.str.size > 32 ?
                 32 : tag->via.str.size), tag->via.str.ptr);
    }
out:
    msgpack_zone_destroy(&zone);
    return rc;
}

/* A pickle starts with PROTO (0x80) and its protocol, 2 to 5; a descriptor
 * is a msgpack map of at least its tag, version and metadata. */
static bool is_descriptor(const uint8_t *data, size_t len)
{
    if (len == 0)
        return false;
    if (data[0] == 0xde || data[0] == 0xdf)
        return true;
    return data[0] > 0x80 && data[0] <= 0x8f;
}

static int decode_pickle(const uint8_t *pickle, size_t len, lmc_shared_tensor *out, char *err,
                         size_t errlen)
{
    bool oom;
    lmc_pickle *p = lmc_pickle_read(pickle, len, allow_global, err, errlen, &oom);
    if (!p)
        return oom ? -2 : -1;
    const lmc_pv *obj = lmc_pickle_root(p);
    fields f = {obj->state, err, errlen};
    int rc = -1;
    if (obj->kind != LMC_PV_OBJECT || !obj->state) {
        bad(&f, "the pickle is not a tensor wrapper object");
    } else if (span_eq(obj->cls->name, obj->cls->name_len, "VmmCudaIPCWrapper")) {
        bad(&f, "VmmCudaIPCWrapper (cuMemCreate memory shared by file descriptor) is not "
                "supported; register with the default CUDA allocator");
    } else if (common_fields(&f, out) == 0) {
        if (span_eq(obj->cls->name, obj->cls->name_len, "CudaIPCWrapper")) {
            out->wrapper = LMC_WRAPPER_CUDA_IPC;
            rc = cuda_ipc(&f, out);
        } else if (span_eq(obj->cls->name, obj->cls->name_len, "RawCudaIPCWrapper")) {
            out->wrapper = LMC_WRAPPER_RAW_CUDA_IPC;
            rc = raw_cuda_ipc(&f, out);
        } else {
            out->wrapper = LMC_WRAPPER_CPU_SHM;
            rc = cpu_shm(&f, out);
        }
    }
    lmc_pickle_free(p);
    return rc;
}

int lmc_shared_tensor_decode(const uint8_t *data, size_t len, lmc_shared_tensor *out, char *err,
                             size_t errlen)
{
    memset(out, 0, sizeof *out);
    if (is_descriptor(data, len))
        return decode_descriptor(data, len, out, err, errlen);
    return decode_pickle(data, len, out, err, errlen);
}
