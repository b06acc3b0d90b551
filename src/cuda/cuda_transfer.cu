/* liblmcached_cuda.so: the CUDA side of the server-driven transfer
 * (cuda_transfer.h is the contract; docs/protocol.md, "Server-driven copies
 * over CUDA IPC").  CUDA runtime API only, linked statically, so that the
 * library needs nothing but the driver (libcuda.so) at run time.
 *
 * - IPC memory handles are opened once per (device, handle) and reference
 *   counted: vLLM carves every layer of a KV cache out of one allocation,
 *   and one cudaIpcCloseMemHandle unmaps it for everyone.
 * - A stream is one engine worker's copy machinery: a non-blocking CUDA
 *   stream, a device staging buffer of one chunk object and the ring of
 *   interprocess events it exported.
 * - copy_object enqueues, per member kernel group, a gather kernel (paged
 *   blocks -> staging) then one D2H memcpy of the whole object (STORE), or
 *   one H2D memcpy then a scatter kernel per member (RETRIEVE).  Block ids
 *   and tensor addresses travel in the kernel's by-value parameters
 *   (cuda_launch.h), so nothing is staged from pageable memory and the
 *   caller's arrays may go as soon as the call returns.
 *
 * Every CUDA error comes back as -1 with cudaGetErrorString in err. */
#include <cuda.h>
#include <cuda_runtime.h>

#include <ctype.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "cuda/cuda_blend.h"
#include "cuda/cuda_err.h"
#include "cuda/cuda_launch.h"
#include "kv/cuda_transfer.h"

#define LMC_CUDA_EXPORT extern "C" __attribute__((visibility("default")))

/* Exported events live at least this long after completing, or until this
 * many newer ones were exported: a client may import a handle late. */
#define EVENT_GRACE_S 1.0
#define EVENT_GRACE_COUNT 4096u

static_assert(sizeof(cudaIpcMemHandle_t) == 64, "cudaIpcMemHandle_t is 64 bytes");
static_assert(sizeof(cudaIpcEventHandle_t) == LMC_CUDA_EVENT_HANDLE_BYTES,
              "cudaIpcEventHandle_t is 64 bytes");

#define CK(call, what)                                          \
    do {                                                        \
        if (check((call), (what), err, errlen) != 0)            \
            return -1;                                          \
    } while (0)

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- the kernel --------------------------------------------------------- */

/* Copies the rows of one (kv plane, kept block, layer): blockIdx (x, y, z);
 * threads over (unit of a row, head, slot), looping over what exceeds the
 * block's dims.  U is the copy unit (cuda_launch.h's lmc_cuda_copy_unit
 * chose it so that every access is aligned). */
template <typename U>
__global__ void __launch_bounds__(LMC_CUDA_THREADS)
    lmc_cuda_copy_kernel(const __grid_constant__ lmc_cuda_copy_params p)
{
    const uint32_t kv = blockIdx.x, j = p.first_block + blockIdx.y,
                   layer = p.first_layer + blockIdx.z;
    const uint32_t bs = p.geo.bs, nh = p.geo.nh, upr = p.units_per_row;
    for (uint32_t s = threadIdx.z; s < bs; s += blockDim.z) {
        for (uint32_t h = threadIdx.y; h < nh; h += blockDim.y) {
            U *engine = (U *)lmc_cuda_engine_row(&p, kv, layer, j, s, h);
            U *staging = (U *)lmc_cuda_staging_row(&p, kv, layer, j, s, h);
            /* Global loads and stores (the addresses are plain integers, so
             * the compiler would otherwise emit generic ones), cached in L2
             * only: every byte is touched once. */
            if (p.to_staging) {
                for (uint32_t u = threadIdx.x; u < upr; u += blockDim.x)
                    __stcg(staging + u, __ldcg(engine + u));
            } else {
                for (uint32_t u = threadIdx.x; u < upr; u += blockDim.x)
                    __stcg(engine + u, __ldcg(staging + u));
            }
        }
    }
}

/* Launches the copy of one packed member group.  cudaLaunchKernel reads
 * the parameter block where it lies (no by-value copy on this stack) and
 * has copied it when it returns, so the caller may refill it at once. */
static int launch(const lmc_cuda_copy_params *p, cudaStream_t st, char *err, size_t errlen)
{
    lmc_cuda_dims d = lmc_cuda_launch_dims(p);
    if (d.grid[0] == 0 || d.grid[1] == 0 || d.grid[2] == 0)
        return 0;
    dim3 grid(d.grid[0], d.grid[1], d.grid[2]), block(d.block[0], d.block[1], d.block[2]);
    const void *fn;
    switch (p->unit) {
    case 16:
        fn = (const void *)lmc_cuda_copy_kernel<uint4>;
        break;
    case 8:
        fn = (const void *)lmc_cuda_copy_kernel<uint2>;
        break;
    case 4:
        fn = (const void *)lmc_cuda_copy_kernel<uint32_t>;
        break;
    case 2:
        fn = (const void *)lmc_cuda_copy_kernel<uint16_t>;
        break;
    case 1:
        fn = (const void *)lmc_cuda_copy_kernel<uint8_t>;
        break;
    default:
        return fail(err, errlen, "copy unit of %u bytes", p->unit);
    }
    void *args[1] = {(void *)p};
    CK(cudaLaunchKernel(fn, grid, block, args, 0, st), "block copy kernel launch");
    return 0;
}

/* ---- devices ------------------------------------------------------------ */

static int cu_init(int *devices, char *err, size_t errlen)
{
    int n = 0;
    CK(cudaGetDeviceCount(&n), "cudaGetDeviceCount");
    if (n <= 0)
        return fail(err, errlen, "no CUDA device");
    *devices = n;
    return 0;
}

static void uuid_string(const cudaUUID_t *u, char out[37])
{
    const unsigned char *b = (const unsigned char *)u->bytes;
    snprintf(out, 37,
             "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0],
             b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13],
             b[14], b[15]);
}

static int cu_device_by_uuid(const char *uuid, int *device, char *err, size_t errlen)
{
    if (!uuid)
        return fail(err, errlen, "no device UUID");
    if (strncasecmp(uuid, "GPU-", 4) == 0)
        uuid += 4;
    int n = 0;
    CK(cudaGetDeviceCount(&n), "cudaGetDeviceCount");
    for (int d = 0; d < n; d++) {
        cudaDeviceProp prop;
        CK(cudaGetDeviceProperties(&prop, d), "cudaGetDeviceProperties");
        char s[37];
        uuid_string(&prop.uuid, s);
        if (strcasecmp(s, uuid) == 0) {
            *device = d;
            return 0;
        }
    }
    return fail(err, errlen, "Device UUID %s not found among %d CUDA device(s)", uuid, n);
}

/* ---- IPC memory, deduplicated ------------------------------------------- */

typedef struct mapping {
    int device;
    uint8_t handle[64];
    uint64_t base;
    uint64_t size;   /* the allocation's size, as the driver knows it */
    uint64_t refs;
} mapping;

/* cuMemGetAddressRange, found through the runtime so that this library
 * needs no link against libcuda (the driver provides it at run time). */
typedef CUresult (*address_range_fn)(CUdeviceptr *base, size_t *size, CUdeviceptr ptr);
static pthread_once_t g_range_once = PTHREAD_ONCE_INIT;
static address_range_fn g_range;

static void find_address_range(void)
{
    void *fn = NULL;
    cudaDriverEntryPointQueryResult found;
    if (cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &fn, 12000, cudaEnableDefault,
                                         &found) == cudaSuccess &&
        found == cudaDriverEntryPointSuccess)
        g_range = (address_range_fn)fn;
    (void)cudaGetLastError();
}

/* The real extent of the allocation an IPC handle opened at p: a client
 * may claim any storage size, the driver knows the true one. */
static int allocation_size(void *p, uint64_t *size, char *err, size_t errlen)
{
    pthread_once(&g_range_once, find_address_range);
    if (!g_range)
        return fail(err, errlen, "the CUDA driver does not provide cuMemGetAddressRange");
    CUdeviceptr base = 0;
    size_t bytes = 0;
    CUresult r = g_range(&base, &bytes, (CUdeviceptr)(uintptr_t)p);
    if (r != CUDA_SUCCESS)
        return fail(err, errlen, "cuMemGetAddressRange failed (CUresult %d)", (int)r);
    uint64_t into = (uint64_t)(uintptr_t)p - (uint64_t)base;
    *size = bytes > into ? bytes - into : 0;
    return 0;
}

static pthread_mutex_t g_maps_lock = PTHREAD_MUTEX_INITIALIZER;
static mapping *g_maps;
static size_t g_n_maps, g_cap_maps;

static int cu_open_mem(int device, const uint8_t handle[64], uint64_t *base, uint64_t *size,
                       char *err, size_t errlen)
{
    int rc = 0;
    pthread_mutex_lock(&g_maps_lock);
    for (size_t i = 0; i < g_n_maps; i++) {
        if (g_maps[i].device == device && memcmp(g_maps[i].handle, handle, 64) == 0) {
            g_maps[i].refs++;
            *base = g_maps[i].base;
            *size = g_maps[i].size;
            pthread_mutex_unlock(&g_maps_lock);
            return 0;
        }
    }
    if (g_n_maps == g_cap_maps) {
        size_t cap = g_cap_maps ? g_cap_maps * 2 : 16;
        mapping *m = (mapping *)realloc(g_maps, cap * sizeof *m);
        if (!m) {
            pthread_mutex_unlock(&g_maps_lock);
            return fail(err, errlen, "out of memory");
        }
        g_maps = m;
        g_cap_maps = cap;
    }
    cudaIpcMemHandle_t h;
    memcpy(&h, handle, sizeof h);
    void *p = NULL;
    rc = check(cudaSetDevice(device), "cudaSetDevice", err, errlen);
    if (rc == 0)
        rc = check(cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess),
                   "cudaIpcOpenMemHandle", err, errlen);
    uint64_t bytes = 0;
    if (rc == 0 && (rc = allocation_size(p, &bytes, err, errlen)) != 0) {
        (void)cudaIpcCloseMemHandle(p);
        (void)cudaGetLastError();
    }
    if (rc == 0) {
        mapping *m = &g_maps[g_n_maps++];
        m->device = device;
        memcpy(m->handle, handle, 64);
        m->base = (uint64_t)(uintptr_t)p;
        m->size = bytes;
        m->refs = 1;
        *base = m->base;
        *size = m->size;
    }
    pthread_mutex_unlock(&g_maps_lock);
    return rc;
}

static void cu_close_mem(int device, uint64_t base)
{
    pthread_mutex_lock(&g_maps_lock);
    for (size_t i = 0; i < g_n_maps; i++) {
        mapping *m = &g_maps[i];
        if (m->device != device || m->base != base)
            continue;
        if (--m->refs == 0) {
            if (cudaSetDevice(device) == cudaSuccess)
                (void)cudaIpcCloseMemHandle((void *)(uintptr_t)base);
            (void)cudaGetLastError();
            g_maps[i] = g_maps[--g_n_maps];
        }
        break;
    }
    pthread_mutex_unlock(&g_maps_lock);
}

/* ---- host memory -------------------------------------------------------- */

static int cu_pin(void *host, uint64_t bytes, char *err, size_t errlen)
{
    CK(cudaHostRegister(host, (size_t)bytes, cudaHostRegisterPortable), "cudaHostRegister");
    return 0;
}

static void cu_unpin(void *host)
{
    if (cudaHostUnregister(host) != cudaSuccess)
        (void)cudaGetLastError();
}

/* ---- streams ------------------------------------------------------------ */

typedef struct exported {
    cudaEvent_t ev;
    double done_t;             /* when it was first seen complete; 0: not yet */
    uint64_t seq;              /* how many the stream exported before it */
} exported;

struct lmc_cuda_stream {
    int device;
    cudaStream_t stream;
    void *staging;
    uint64_t staging_bytes;
    pthread_mutex_t lock;      /* params and the ring */
    lmc_cuda_copy_params *params;
    exported *ring;            /* circular: head, count, cap */
    size_t head, count, cap;
    uint64_t exported_total;
    cudaEvent_t *pool;         /* layerwise RETRIEVE's events, pool_n of them */
    uint8_t *pool_handles;
    uint32_t pool_n;
};

static lmc_cuda_stream *cu_stream_new(int device, uint64_t staging_bytes, char *err,
                                      size_t errlen)
{
    lmc_cuda_stream *s = (lmc_cuda_stream *)calloc(1, sizeof *s);
    lmc_cuda_copy_params *params = (lmc_cuda_copy_params *)malloc(sizeof *params);
    if (!s || !params) {
        free(s);
        free(params);
        fail(err, errlen, "out of memory");
        return NULL;
    }
    s->device = device;
    s->params = params;
    s->staging_bytes = staging_bytes;
    pthread_mutex_init(&s->lock, NULL);
    int rc = check(cudaSetDevice(device), "cudaSetDevice", err, errlen);
    if (rc == 0)
        rc = check(cudaStreamCreateWithFlags(&s->stream, cudaStreamNonBlocking),
                   "cudaStreamCreateWithFlags", err, errlen);
    if (rc == 0 && staging_bytes > 0)
        rc = check(cudaMalloc(&s->staging, (size_t)staging_bytes), "cudaMalloc (staging)", err,
                   errlen);
    if (rc != 0) {
        if (s->stream)
            (void)cudaStreamDestroy(s->stream);
        (void)cudaGetLastError();
        pthread_mutex_destroy(&s->lock);
        free(params);
        free(s);
        return NULL;
    }
    return s;
}

/* Destroys exported events from the oldest on while each has completed and
 * is past its grace (time or count); `all` after the stream was synced. */
static void reap_events(lmc_cuda_stream *s, bool all)
{
    double now = now_s();
    while (s->count > 0) {
        exported *e = &s->ring[s->head];
        if (!all) {
            if (e->done_t == 0) {
                cudaError_t q = cudaEventQuery(e->ev);
                if (q != cudaSuccess) {
                    if (q != cudaErrorNotReady)
                        (void)cudaGetLastError();
                    break;
                }
                e->done_t = now;   /* the grace runs from completion */
            }
            uint64_t newer = s->exported_total - e->seq - 1;
            if (now - e->done_t < EVENT_GRACE_S && newer < EVENT_GRACE_COUNT)
                break;
        }
        (void)cudaEventDestroy(e->ev);
        s->head = (s->head + 1) % s->cap;
        s->count--;
    }
    if (s->count == 0)
        s->head = 0;
}

static void cu_stream_free(lmc_cuda_stream *s)
{
    if (!s)
        return;
    if (cudaSetDevice(s->device) == cudaSuccess) {
        (void)cudaStreamSynchronize(s->stream);
        reap_events(s, true);
        (void)cudaStreamDestroy(s->stream);
        if (s->staging)
            (void)cudaFree(s->staging);
    }
    for (uint32_t i = 0; i < s->pool_n; i++)
        (void)cudaEventDestroy(s->pool[i]);
    (void)cudaGetLastError();
    pthread_mutex_destroy(&s->lock);
    free(s->pool);
    free(s->pool_handles);
    free(s->ring);
    free(s->params);
    free(s);
}

static int cu_wait_event(lmc_cuda_stream *s, const uint8_t *handle, size_t len, char *err,
                         size_t errlen)
{
    if (len == 0)
        return 0;
    if (len != LMC_CUDA_EVENT_HANDLE_BYTES || !handle)
        return fail(err, errlen, "an event handle of %zu bytes: a CUDA client sends %d", len,
                    LMC_CUDA_EVENT_HANDLE_BYTES);
    cudaIpcEventHandle_t h;
    memcpy(&h, handle, sizeof h);
    cudaEvent_t ev;
    CK(cudaSetDevice(s->device), "cudaSetDevice");
    CK(cudaIpcOpenEventHandle(&ev, h), "cudaIpcOpenEventHandle");
    int rc = check(cudaStreamWaitEvent(s->stream, ev, 0), "cudaStreamWaitEvent", err, errlen);
    cudaError_t e = cudaEventDestroy(ev);
    if (rc == 0)
        rc = check(e, "cudaEventDestroy", err, errlen);
    return rc;
}

/* Checks the object and every member's launch parameters before anything
 * is enqueued, so that a refusal leaves the stream untouched.  Then packs
 * and launches member by member (the parameter block is copied at launch). */
static int copy_members(lmc_cuda_stream *s, const lmc_cuda_object *obj,
                        const int64_t *const *blocks, const uint32_t *skip_blocks,
                        bool to_staging, bool launch_them, char *err, size_t errlen)
{
    for (uint32_t i = 0; i < obj->n_groups; i++) {
        const lmc_kv_kernel_group *g = obj->groups[i];
        if (g->entry_offset > obj->object_size ||
            g->entry_bytes > obj->object_size - g->entry_offset)
            return fail(err, errlen, "member %u's entry [%llu, +%llu) is outside the object's "
                        "%llu bytes", i, (unsigned long long)g->entry_offset,
                        (unsigned long long)g->entry_bytes,
                        (unsigned long long)obj->object_size);
        uint32_t skip = !to_staging && skip_blocks ? skip_blocks[i] : 0;
        uint64_t entry = (uint64_t)(uintptr_t)s->staging + g->entry_offset;
        if (lmc_cuda_params_pack(s->params, g, obj->tensors[i], blocks[i], skip, entry,
                                 to_staging, err, errlen) != 0)
            return -1;
        if (launch_them && launch(s->params, s->stream, err, errlen) != 0)
            return -1;
    }
    return 0;
}

static int cu_copy_object(lmc_cuda_stream *s, const lmc_cuda_object *obj, void *host,
                          const int64_t *const *blocks, const uint32_t *skip_blocks,
                          bool to_host, char *err, size_t errlen)
{
    if (!obj || !host || (obj->n_groups > 0 && (!obj->groups || !obj->tensors || !blocks)))
        return fail(err, errlen, "copy_object: missing arguments");
    if (obj->object_size == 0 || obj->object_size > s->staging_bytes)
        return fail(err, errlen, "an object of %llu bytes does not fit the %llu-byte staging "
                    "buffer", (unsigned long long)obj->object_size,
                    (unsigned long long)s->staging_bytes);
    int rc = 0;
    pthread_mutex_lock(&s->lock);
    rc = check(cudaSetDevice(s->device), "cudaSetDevice", err, errlen);
    if (rc == 0)
        rc = copy_members(s, obj, blocks, skip_blocks, to_host, false, err, errlen);
    if (rc == 0 && to_host) {
        rc = copy_members(s, obj, blocks, skip_blocks, true, true, err, errlen);
        if (rc == 0)
            rc = check(cudaMemcpyAsync(host, s->staging, (size_t)obj->object_size,
                                       cudaMemcpyDeviceToHost, s->stream),
                       "cudaMemcpyAsync (staging to host)", err, errlen);
    } else if (rc == 0) {
        bool any = false;
        for (uint32_t i = 0; i < obj->n_groups; i++)
            if (!skip_blocks || skip_blocks[i] < obj->groups[i]->keep_blocks)
                any = true;
        if (any) {
            rc = check(cudaMemcpyAsync(s->staging, host, (size_t)obj->object_size,
                                       cudaMemcpyHostToDevice, s->stream),
                       "cudaMemcpyAsync (host to staging)", err, errlen);
            if (rc == 0)
                rc = copy_members(s, obj, blocks, skip_blocks, false, true, err, errlen);
        }
    }
    pthread_mutex_unlock(&s->lock);
    return rc;
}

/* ---- layerwise RETRIEVE -------------------------------------------------- */

static int make_pool(lmc_cuda_stream *s, uint32_t n, char *err, size_t errlen)
{
    s->pool = (cudaEvent_t *)calloc(n, sizeof *s->pool);
    s->pool_handles = (uint8_t *)malloc((size_t)n * LMC_CUDA_EVENT_HANDLE_BYTES);
    if (!s->pool || !s->pool_handles)
        return fail(err, errlen, "out of memory");
    for (uint32_t i = 0; i < n; i++) {
        CK(cudaEventCreateWithFlags(&s->pool[i], cudaEventDisableTiming | cudaEventInterprocess),
           "cudaEventCreateWithFlags");
        s->pool_n = i + 1;   /* destroyed with the stream from here on */
        cudaIpcEventHandle_t h;
        CK(cudaIpcGetEventHandle(&h, s->pool[i]), "cudaIpcGetEventHandle");
        memcpy(s->pool_handles + (size_t)i * LMC_CUDA_EVENT_HANDLE_BYTES, &h, sizeof h);
    }
    return 0;
}

static int cu_event_pool(lmc_cuda_stream *s, uint32_t n, uint8_t *handles, char *err,
                         size_t errlen)
{
    if (n == 0 || !handles)
        return fail(err, errlen, "event_pool: an empty pool");
    pthread_mutex_lock(&s->lock);
    int rc = check(cudaSetDevice(s->device), "cudaSetDevice", err, errlen);
    if (rc == 0 && !s->pool_handles)
        rc = make_pool(s, n, err, errlen);
    else if (rc == 0 && s->pool_n != n)
        rc = fail(err, errlen, "the stream's event pool has %u events, not %u", s->pool_n, n);
    if (rc == 0)
        memcpy(handles, s->pool_handles, (size_t)n * LMC_CUDA_EVENT_HANDLE_BYTES);
    pthread_mutex_unlock(&s->lock);
    return rc;
}

static int cu_record_pool_event(lmc_cuda_stream *s, uint32_t i, char *err, size_t errlen)
{
    pthread_mutex_lock(&s->lock);
    int rc = i < s->pool_n ? check(cudaSetDevice(s->device), "cudaSetDevice", err, errlen)
                           : fail(err, errlen, "pool event %u of %u", i, s->pool_n);
    if (rc == 0)
        rc = check(cudaEventRecord(s->pool[i], s->stream), "cudaEventRecord", err, errlen);
    pthread_mutex_unlock(&s->lock);
    return rc;
}

/* Packs member i's launch for layers [from, to); false with the reason. */
static int pack_layers(lmc_cuda_stream *s, const lmc_cuda_object *obj, uint32_t i,
                       const int64_t *const *blocks, const uint32_t *skip_blocks, uint32_t from,
                       uint32_t to, char *err, size_t errlen)
{
    const lmc_kv_kernel_group *g = obj->groups[i];
    if (g->entry_offset > obj->object_size || g->entry_bytes > obj->object_size - g->entry_offset)
        return fail(err, errlen, "member %u's entry is outside the object", i);
    uint64_t entry = (uint64_t)(uintptr_t)s->staging + g->entry_offset;
    if (lmc_cuda_params_pack(s->params, g, obj->tensors[i], blocks[i],
                             skip_blocks ? skip_blocks[i] : 0, entry, false, err, errlen) != 0)
        return -1;
    return lmc_cuda_params_layers(s->params, from, to, err, errlen);
}

/* The K and V rows of member i's layers [from, to), host -> staging: one
 * run per plane in the object's [kv][layer][slot][head] entry. */
static int stage_layers(lmc_cuda_stream *s, const lmc_kv_kernel_group *g, const uint8_t *host,
                        uint32_t from, uint32_t to, char *err, size_t errlen)
{
    const lmc_kv_geometry *geo = &g->geo;
    size_t run = (size_t)(to - from) * g->slots * geo->nh * geo->hs * geo->element_size;
    for (uint32_t kv = 0; kv < geo->kv_size; kv++) {
        size_t off = (size_t)(g->entry_offset +
                              lmc_kv_object_offset(geo, g->slots, kv, from, 0, 0, 0) *
                                  geo->element_size);
        CK(cudaMemcpyAsync((uint8_t *)s->staging + off, host + off, run, cudaMemcpyHostToDevice,
                           s->stream),
           "cudaMemcpyAsync (host to staging)");
    }
    return 0;
}

static int cu_copy_layers(lmc_cuda_stream *s, const lmc_cuda_object *obj, void *host,
                          const int64_t *const *blocks, const uint32_t *skip_blocks,
                          const uint32_t *from, const uint32_t *to, char *err, size_t errlen)
{
    if (!obj || !host || !from || !to ||
        (obj->n_groups > 0 && (!obj->groups || !obj->tensors || !blocks)))
        return fail(err, errlen, "copy_layers: missing arguments");
    if (obj->object_size == 0 || obj->object_size > s->staging_bytes)
        return fail(err, errlen, "an object of %llu bytes does not fit the staging buffer",
                    (unsigned long long)obj->object_size);
    pthread_mutex_lock(&s->lock);
    int rc = check(cudaSetDevice(s->device), "cudaSetDevice", err, errlen);
    /* Every member checked before anything is enqueued, then each staged
     * and scattered. */
    for (int pass = 0; pass < 2; pass++)
        for (uint32_t i = 0; rc == 0 && i < obj->n_groups; i++) {
            if (from[i] >= to[i])
                continue;
            rc = pack_layers(s, obj, i, blocks, skip_blocks, from[i], to[i], err, errlen);
            if (rc == 0 && pass == 1 && s->params->first_block < s->params->keep_blocks) {
                rc = stage_layers(s, obj->groups[i], (const uint8_t *)host, s->params->first_layer,
                                  s->params->first_layer + s->params->n_layers, err, errlen);
                if (rc == 0)
                    rc = launch(s->params, s->stream, err, errlen);
            }
        }
    pthread_mutex_unlock(&s->lock);
    return rc;
}

static int ring_push(lmc_cuda_stream *s, cudaEvent_t ev)
{
    if (s->count == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 64;
        exported *r = (exported *)malloc(cap * sizeof *r);
        if (!r)
            return -1;
        for (size_t i = 0; i < s->count; i++)
            r[i] = s->ring[(s->head + i) % s->cap];
        free(s->ring);
        s->ring = r;
        s->cap = cap;
        s->head = 0;
    }
    exported *e = &s->ring[(s->head + s->count) % s->cap];
    e->ev = ev;
    e->done_t = 0;
    e->seq = s->exported_total++;
    s->count++;
    return 0;
}

static int cu_record_event(lmc_cuda_stream *s, uint8_t handle[64], char *err, size_t errlen)
{
    cudaEvent_t ev;
    cudaIpcEventHandle_t h;
    int rc = 0;
    pthread_mutex_lock(&s->lock);
    rc = check(cudaSetDevice(s->device), "cudaSetDevice", err, errlen);
    if (rc == 0) {
        reap_events(s, false);
        rc = check(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming | cudaEventInterprocess),
                   "cudaEventCreateWithFlags", err, errlen);
    }
    if (rc == 0) {
        rc = check(cudaEventRecord(ev, s->stream), "cudaEventRecord", err, errlen);
        if (rc == 0)
            rc = check(cudaIpcGetEventHandle(&h, ev), "cudaIpcGetEventHandle", err, errlen);
        if (rc == 0 && ring_push(s, ev) != 0)
            rc = fail(err, errlen, "out of memory");
        if (rc != 0)
            (void)cudaEventDestroy(ev);
        else
            memcpy(handle, &h, sizeof h);
    }
    pthread_mutex_unlock(&s->lock);
    return rc;
}

static int cu_then(lmc_cuda_stream *s, void (*fn)(void *arg), void *arg, char *err,
                   size_t errlen)
{
    CK(cudaSetDevice(s->device), "cudaSetDevice");
    CK(cudaLaunchHostFunc(s->stream, fn, arg), "cudaLaunchHostFunc");
    return 0;
}

static int cu_sync(lmc_cuda_stream *s, char *err, size_t errlen)
{
    CK(cudaSetDevice(s->device), "cudaSetDevice");
    CK(cudaStreamSynchronize(s->stream), "cudaStreamSynchronize");
    return 0;
}

static int cu_read(int device, uint64_t src, void *host, uint64_t bytes, char *err,
                   size_t errlen)
{
    int rc = check(cudaSetDevice(device), "cudaSetDevice", err, errlen);
    if (rc == 0)
        rc = check(cudaMemcpy(host, (const void *)(uintptr_t)src, bytes, cudaMemcpyDeviceToHost),
                   "cudaMemcpy", err, errlen);
    return rc;
}

/* CacheBlend's plan (cuda_blend.cu), under the stream's lock like every
 * other enqueue. */
static int cu_blend_execute(lmc_cuda_stream *s, const lmc_cuda_blend *b, char *err,
                            size_t errlen)
{
    if (!s)
        return fail(err, errlen, "blend_execute: no stream");
    pthread_mutex_lock(&s->lock);
    int rc = check(cudaSetDevice(s->device), "cudaSetDevice", err, errlen);
    if (rc == 0)
        rc = lmc_cuda_blend_run(s->stream, b, err, errlen);
    pthread_mutex_unlock(&s->lock);
    return rc;
}

/* ---- device memory the server owns -------------------------------------- */

/* A pageable cudaMemcpy may return before its DMA lands: the device sync
 * makes the bytes visible to every stream (once per CB_REGISTER_ROPE). */
static int cu_upload(int device, const void *host, uint64_t bytes, uint64_t *dev, char *err,
                     size_t errlen)
{
    void *p = NULL;
    *dev = 0;
    int rc = check(cudaSetDevice(device), "cudaSetDevice", err, errlen);
    if (rc == 0)
        rc = check(cudaMalloc(&p, (size_t)(bytes ? bytes : 1)), "cudaMalloc", err, errlen);
    if (rc == 0)
        rc = check(cudaMemcpy(p, host, (size_t)bytes, cudaMemcpyHostToDevice), "cudaMemcpy",
                   err, errlen);
    if (rc == 0)
        rc = check(cudaDeviceSynchronize(), "cudaDeviceSynchronize", err, errlen);
    if (rc != 0 && p && cudaFree(p) != cudaSuccess)
        (void)cudaGetLastError();
    if (rc == 0)
        *dev = (uint64_t)(uintptr_t)p;
    return rc;
}

static void cu_free_device(int device, uint64_t dev)
{
    if (cudaSetDevice(device) != cudaSuccess || cudaFree((void *)(uintptr_t)dev) != cudaSuccess)
        (void)cudaGetLastError();
}

static const lmc_cuda_ops g_ops = {
    LMC_CUDA_ABI_VERSION,
    cu_init,
    cu_device_by_uuid,
    cu_open_mem,
    cu_close_mem,
    cu_pin,
    cu_unpin,
    cu_stream_new,
    cu_stream_free,
    cu_wait_event,
    cu_copy_object,
    cu_record_event,
    cu_then,
    cu_sync,
    cu_read,
    cu_event_pool,
    cu_record_pool_event,
    cu_copy_layers,
    cu_blend_execute,
    cu_upload,
    cu_free_device,
};

LMC_CUDA_EXPORT const lmc_cuda_ops *lmc_cuda_transfer_ops(void)
{
    return &g_ops;
}
