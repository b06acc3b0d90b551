/* Server-driven transfer over CUDA IPC (docs/protocol.md, "Server-driven
 * copies over CUDA IPC").  The CUDA runtime lives in liblmcached_cuda.so
 * (src/kv/cuda_transfer.h), loaded here on the first CUDA registration;
 * without it, or without a GPU, a CUDA registration is refused with the
 * reason and nothing else changes.
 *
 * A STORE or RETRIEVE enqueues its copies on the context's stream, records
 * an interprocess event and replies with its handle at once.  When the
 * stream has passed the copies, a host callback hands the leases to the
 * completion thread, which publishes them (a STORE: objects become visible
 * only once their bytes are in place) or gives them back (a RETRIEVE's read
 * shares, a failed STORE's reservations). */
#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/checked.h"
#include "kv/kv_copy.h"
#include "modules/transfer/server/server_internal.h"
#include "obs/events.h"
#include "obs/log.h"
#include "modules/transfer/transfer.h"
#include "storage/storage_manager.h"

struct sd_completion {
    sd_mod *m;
    lmc_object_key *keys;          /* owned */
    lmc_lease *leases;             /* owned */
    size_t n;
    bool publish;
    const char *event;             /* STORE_END / RETRIEVE_END, or NULL */
    json_t *meta;                  /* its metadata (owned) */
    char sid[256];
    sd_completion *next;
};

/* ---- completion thread -------------------------------------------------- */

static void complete(sd_mod *m, sd_completion *w)
{
    lmc_storage_manager *sm = m->ctx->storage;
    if (w->publish && lmc_storage_manager_publish_writes(sm, w->keys, w->leases, w->n, 0, NULL) == 0)
        atomic_fetch_add(&m->chunks_stored, w->n);
    else
        lmc_storage_manager_give_back(sm, w->keys, w->leases, w->n);
    if (w->event && m->ctx->events)
        lmc_event_bus_publish(m->ctx->events, w->event, w->sid, w->meta);
    else
        json_decref(w->meta);
    lmc_keys_drop(w->keys, w->n);
    free(w->keys);
    free(w->leases);
    free(w);
}

static void *completion_thread(void *arg)
{
    sd_mod *m = arg;
    sd_cuda *c = &m->cuda;
    pthread_mutex_lock(&c->lock);
    for (;;) {
        while (!c->head && !c->stopping)
            pthread_cond_wait(&c->wake, &c->lock);
        sd_completion *w = c->head;
        if (!w)
            break;
        c->head = w->next;
        if (!c->head)
            c->tail = &c->head;
        pthread_mutex_unlock(&c->lock);
        complete(m, w);
        pthread_mutex_lock(&c->lock);
    }
    pthread_mutex_unlock(&c->lock);
    return NULL;
}

/* The stream's host callback: hand on, no storage work on a CUDA thread. */
static void on_stream_done(void *arg)
{
    sd_completion *w = arg;
    sd_cuda *c = &w->m->cuda;
    pthread_mutex_lock(&c->lock);
    w->next = NULL;
    *c->tail = w;
    c->tail = &w->next;
    pthread_cond_signal(&c->wake);
    pthread_mutex_unlock(&c->lock);
}

void lmc_server_driven_cuda_init(sd_cuda *c)
{
    memset(c, 0, sizeof *c);
    pthread_mutex_init(&c->lock, NULL);
    pthread_cond_init(&c->wake, NULL);
    c->tail = &c->head;
}

void lmc_server_driven_cuda_close(sd_mod *m)
{
    sd_cuda *c = &m->cuda;
    pthread_mutex_lock(&c->lock);
    c->stopping = true;
    pthread_cond_signal(&c->wake);
    pthread_mutex_unlock(&c->lock);
    if (c->thread_started)
        pthread_join(c->thread, NULL);
    while (c->head) {   /* no thread: nothing can still push */
        sd_completion *w = c->head;
        c->head = w->next;
        complete(m, w);
    }
    if (c->pinner_started)
        pthread_join(c->pinner, NULL);
    if (c->pinned)
        c->ops->unpin(lmc_storage_manager_l1_arena(m->ctx->storage)->base);
    if (c->dl)
        dlclose(c->dl);
    pthread_cond_destroy(&c->wake);
    pthread_mutex_destroy(&c->lock);
}

/* ---- loading ------------------------------------------------------------ */

/* LMCACHED_CUDA_LIB, else liblmcached_cuda.so beside the executable. */
static void *open_library(char *why, size_t whylen)
{
    char path[512];
    const char *env = getenv("LMCACHED_CUDA_LIB");
    if (env && *env) {
        snprintf(path, sizeof path, "%s", env);
    } else {
        ssize_t n = readlink("/proc/self/exe", path, sizeof path - 1);
        path[n > 0 ? n : 0] = '\0';
        char *slash = strrchr(path, '/');
        size_t dir = slash ? (size_t)(slash - path) + 1 : 0;
        snprintf(path + dir, sizeof path - dir, "%s", LMC_CUDA_LIB_NAME);
    }
    void *dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!dl)   /* dlerror() names the path */
        snprintf(why, whylen, "%s", dlerror());
    return dl;
}

/* Loads and initialises the CUDA part once; the ops, or NULL with the
 * reason in c->why (kept for every later registration). */
static const lmc_cuda_ops *load(sd_mod *m)
{
    sd_cuda *c = &m->cuda;
    pthread_mutex_lock(&c->lock);
    if (!c->tried) {
        c->tried = true;
        int devices = 0;
        c->dl = open_library(c->why, sizeof c->why);
        const lmc_cuda_ops *(*entry)(void) =
            c->dl ? (const lmc_cuda_ops *(*)(void))dlsym(c->dl, LMC_CUDA_ENTRY) : NULL;
        const lmc_cuda_ops *ops = entry ? entry() : NULL;
        if (c->dl && (!ops || ops->abi_version != LMC_CUDA_ABI_VERSION))
            snprintf(c->why, sizeof c->why, "%s is not of this lmcached (ABI %d, want %d)",
                     LMC_CUDA_LIB_NAME, ops ? ops->abi_version : -1, LMC_CUDA_ABI_VERSION);
        else if (ops && ops->init(&devices, c->why, sizeof c->why) == 0 &&
                 pthread_create(&c->thread, NULL, completion_thread, m) == 0)
            c->ops = ops, c->thread_started = true;
        if (c->ops)
            LMC_INFO("CUDA transfer loaded: %d device(s)", devices);
        else
            LMC_WARN("CUDA transfer unavailable: %s", c->why);
    }
    const lmc_cuda_ops *ops = c->ops;
    pthread_mutex_unlock(&c->lock);
    return ops;
}

/* Page-locks the arena on a thread of its own: pinning tens of GiB takes
 * seconds, and registration runs on the socket thread.  Copies before it
 * is done still work, staged by the driver. */
static void *pin_thread(void *arg)
{
    sd_mod *m = arg;
    sd_cuda *c = &m->cuda;
    const lmc_l1_arena_desc *a = lmc_storage_manager_l1_arena(m->ctx->storage);
    char why[256];
    bool ok = c->ops->pin(a->base, a->size, why, sizeof why) == 0;
    if (!ok)
        LMC_WARN("L1 arena not pinned (copies will be slower): %s", why);
    pthread_mutex_lock(&c->lock);
    c->pinned = ok;
    pthread_mutex_unlock(&c->lock);
    return NULL;
}

/* Pins the L1 arena for DMA, once, when all of it is committed: pinning
 * touches every page, which for a lazily committed arena would commit all
 * of it at once (and fault where /dev/shm is short).  Unpinned, copies
 * still work, staged by the driver, slower. */
static void pin_arena(sd_mod *m)
{
    sd_cuda *c = &m->cuda;
    const lmc_l1_arena_desc *a = lmc_storage_manager_l1_arena(m->ctx->storage);
    uint64_t used, committed;
    lmc_storage_manager_usage(m->ctx->storage, &used, &committed);
    pthread_mutex_lock(&c->lock);
    if (!c->pin_started && a) {
        c->pin_started = true;
        if (committed < a->size)
            LMC_INFO("L1 arena not pinned: it is committed lazily (%llu of %llu bytes so "
                     "far); --no-l1-use-lazy commits and pins it whole",
                     (unsigned long long)committed, (unsigned long long)a->size);
        else if (pthread_create(&c->pinner, NULL, pin_thread, m) == 0)
            c->pinner_started = true;
    }
    pthread_mutex_unlock(&c->lock);
}

/* ---- registration ------------------------------------------------------- */

/* The tensor's bytes must lie inside the storage its handle claims and,
 * since a client can claim anything, inside the allocation the driver
 * actually opened (docs/security.md). */
static int map_tensor(const lmc_cuda_ops *ops, int device, const lmc_shared_tensor *t,
                      uint64_t span, uint64_t *addr, uint64_t *opened, size_t *n_opened,
                      char *err, size_t errlen)
{
    uint64_t base, alloc;
    if (ops->open_mem(device, t->mem_handle, &base, &alloc, err, errlen) != 0)
        return -1;
    opened[(*n_opened)++] = base;
    uint64_t off, start, end;
    if (!lmc_u64_of_i64(t->storage_offset, &off) || !lmc_mul_u64(off, t->itemsize, &off) ||
        off > t->storage_bytes || span > t->storage_bytes - off)
        return snprintf(err, errlen, "a tensor reaches past its %llu-byte storage",
                        (unsigned long long)t->storage_bytes), -1;
    if (!lmc_add_u64(t->base_offset_bytes, off, &start) || !lmc_add_u64(start, span, &end) ||
        end > alloc)
        return snprintf(err, errlen, "a tensor reaches past the %llu bytes of its allocation "
                                     "(the driver's size; the handle claims a %llu-byte "
                                     "storage at offset %llu)", (unsigned long long)alloc,
                        (unsigned long long)t->storage_bytes,
                        (unsigned long long)t->base_offset_bytes), -1;
    *addr = base + start;
    return 0;
}

static uint64_t max_object(const lmc_kv_plan *p)
{
    uint64_t most = 0;
    for (uint32_t g = 0; g < p->n_og; g++)
        most = p->og[g].object_size > most ? p->og[g].object_size : most;
    return most;
}

int lmc_server_driven_cuda_register(sd_mod *m, sd_ctx *c, const lmc_shared_tensor *t, size_t n, char *err,
                         size_t errlen)
{
    const lmc_cuda_ops *ops = load(m);
    if (!ops)
        return snprintf(err, errlen, "CUDA tensors need the CUDA transfer: %s", m->cuda.why), -1;
    sd_cuda_ctx *cu = &c->cu;
    for (size_t i = 1; i < n; i++)
        if (strcmp(t[i].device_uuid, t[0].device_uuid) != 0)
            return snprintf(err, errlen, "the tensors are on different devices"), -1;
    if (ops->device_by_uuid(t[0].device_uuid, &cu->device, err, errlen) != 0)
        return -1;
    c->cuda = true;
    cu->opened = calloc(n, sizeof *cu->opened);
    cu->tensors = calloc(c->plan.n_kg, sizeof *cu->tensors);
    if (!cu->opened || !cu->tensors)
        return snprintf(err, errlen, "out of memory"), -2;
    for (uint32_t k = 0; k < c->plan.n_kg; k++) {
        const lmc_kv_kernel_group *g = &c->plan.kg[k];
        if (!(cu->tensors[k] = calloc(g->n_tensors, sizeof *cu->tensors[k])))
            return snprintf(err, errlen, "out of memory"), -2;
        for (uint32_t i = 0; i < g->n_tensors; i++)
            if (map_tensor(ops, cu->device, &t[g->tensors[i]], g->span_bytes,
                           &cu->tensors[k][i], cu->opened, &cu->n_opened, err, errlen) != 0)
                return -1;
    }
    if (!(cu->stream = ops->stream_new(cu->device, max_object(&c->plan), err, errlen)))
        return -1;
    /* The exporter's share-time event: its writes before sharing. */
    for (size_t i = 0; i < n; i++)
        if (t[i].event_sync_required &&
            ops->wait_event(cu->stream, t[i].event_handle, LMC_CUDA_EVENT_HANDLE_BYTES, err,
                            errlen) != 0)
            return -1;
    pin_arena(m);
    return 0;
}

int lmc_server_driven_cuda_open(sd_mod *m, const sd_ctx *c, const lmc_shared_tensor *t,
                                uint64_t span, uint64_t *addr, uint64_t *opened, char *err,
                                size_t errlen)
{
    const lmc_cuda_ops *ops = m->cuda.ops;
    int device;
    size_t n = 0;
    *opened = 0;
    if (!c->cuda || !ops)
        return snprintf(err, errlen, "instance %lld registered no CUDA tensors",
                        (long long)c->instance_id), -1;
    if (t->wrapper == LMC_WRAPPER_CPU_SHM)
        return snprintf(err, errlen, "a CPU shared tensor for an instance of CUDA tensors"), -1;
    if (ops->device_by_uuid(t->device_uuid, &device, err, errlen) != 0)
        return -1;
    if (device != c->cu.device)
        return snprintf(err, errlen, "on device %s, not the instance's device %d",
                        t->device_uuid, c->cu.device), -1;
    return map_tensor(ops, device, t, span, addr, opened, &n, err, errlen);
}

void lmc_server_driven_cuda_close_mem(sd_mod *m, const sd_ctx *c, uint64_t opened)
{
    if (opened && m->cuda.ops)
        m->cuda.ops->close_mem(c->cu.device, opened);
}

int lmc_server_driven_cuda_read(sd_mod *m, const sd_ctx *c, uint64_t src, void *host,
                                uint64_t bytes, char *err, size_t errlen)
{
    return m->cuda.ops->read(c->cu.device, src, host, bytes, err, errlen);
}

int lmc_server_driven_cuda_upload(sd_mod *m, const sd_ctx *c, const void *host, uint64_t bytes,
                                  uint64_t *dev, char *err, size_t errlen)
{
    return m->cuda.ops->upload(c->cu.device, host, bytes, dev, err, errlen);
}

void lmc_server_driven_cuda_free_device(sd_mod *m, const sd_ctx *c, uint64_t dev)
{
    if (dev && m->cuda.ops)
        m->cuda.ops->free_device(c->cu.device, dev);
}

void lmc_server_driven_cuda_sync(sd_mod *m, const sd_ctx *c)
{
    char err[256];
    if (m->cuda.ops && c->cu.stream && m->cuda.ops->sync(c->cu.stream, err, sizeof err) != 0)
        LMC_WARN_LIMITED("CUDA instance %lld: %s", (long long)c->instance_id, err);
}

void lmc_server_driven_cuda_release(sd_mod *m, sd_ctx *c)
{
    const lmc_cuda_ops *ops = m->cuda.ops;
    sd_cuda_ctx *cu = &c->cu;
    if (ops && cu->stream)
        ops->stream_free(cu->stream);   /* waits: its host callbacks have run */
    for (size_t i = 0; ops && i < cu->n_opened; i++)
        ops->close_mem(cu->device, cu->opened[i]);
    for (uint32_t k = 0; cu->tensors && k < c->plan.n_kg; k++)
        free(cu->tensors[k]);
    free(cu->tensors);
    free(cu->opened);
}

/* ---- STORE and RETRIEVE ------------------------------------------------- */

/* Enqueues chunk c of object group og between its blocks and `host`. */
static int copy_object(sd_mod *m, const sd_op *op, uint32_t og, size_t c, void *host,
                       const uint32_t *skip, bool to_host, char *err, size_t errlen)
{
    const lmc_kv_plan *p = &op->c->plan;
    const lmc_kv_object_group *o = &p->og[og];
    const lmc_kv_kernel_group *groups[LMC_KV_MAX_KERNEL_GROUPS];
    const uint64_t *tensors[LMC_KV_MAX_KERNEL_GROUPS];
    const int64_t *blocks[LMC_KV_MAX_KERNEL_GROUPS];
    for (uint32_t k = 0; k < o->n_members; k++) {
        uint32_t gi = o->members[k];
        groups[k] = &p->kg[gi];
        tensors[k] = op->c->cu.tensors[gi];
        blocks[k] = lmc_server_driven_kept_ids(op, gi, c);
    }
    lmc_cuda_object obj = {.groups = groups, .tensors = tensors, .n_groups = o->n_members,
                           .object_size = o->object_size};
    return m->cuda.ops->copy_object(op->c->cu.stream, &obj, host, blocks, skip, to_host, err,
                                    errlen);
}

/* A completion of `n` leases (copied), with the END event to publish. */
static sd_completion *completion(sd_mod *m, const sd_op *op, const lmc_object_key *keys,
                                 const lmc_lease *leases, size_t n, bool publish,
                                 const char *event, size_t chunks, uint64_t bytes)
{
    sd_completion *w = calloc(1, sizeof *w);
    if (!w)
        return NULL;
    *w = (sd_completion){.m = m, .n = n, .publish = publish, .event = event,
                         .keys = malloc((n ? n : 1) * sizeof *keys),
                         .leases = malloc((n ? n : 1) * sizeof *leases)};
    if (!w->keys || !w->leases) {
        free(w->keys);
        free(w->leases);
        free(w);
        return NULL;
    }
    memcpy(w->keys, keys, n * sizeof *keys);
    lmc_keys_hold(w->keys, n); /* the completion outlives the request */
    memcpy(w->leases, leases, n * sizeof *leases);
    if (event && m->ctx->events)
        w->meta = lmc_transfer_meta(&op->key, op->c->instance_id, "cuda", chunks, bytes, w->sid,
                                    sizeof w->sid);
    return w;
}

/* Hands w to the stream: it completes once the stream has passed what is
 * enqueued.  If the stream cannot take it, the copies may still be in
 * flight: wait for them, then complete here. */
static void after_stream(sd_mod *m, const sd_op *op, sd_completion *w)
{
    char err[256];
    const lmc_cuda_ops *ops = m->cuda.ops;
    if (ops->then(op->c->cu.stream, on_stream_done, w, err, sizeof err) == 0)
        return;
    LMC_WARN_LIMITED("CUDA instance %lld: %s; waiting for its stream",
                     (long long)op->c->instance_id, err);
    ops->sync(op->c->cu.stream, err, sizeof err);
    w->publish = false;
    complete(m, w);
}

bool lmc_server_driven_cuda_failure_event(sd_mod *m, const sd_op *op,
                               uint8_t handle[LMC_CUDA_EVENT_HANDLE_BYTES])
{
    char err[256];
    return op->c && op->c->cuda && m->cuda.ops &&
           m->cuda.ops->record_event(op->c->cu.stream, handle, err, sizeof err) == 0;
}

bool lmc_server_driven_cuda_store(sd_mod *m, const sd_op *op, sd_store_plan *s, const uint8_t *client,
                       size_t client_len, uint8_t handle[LMC_CUDA_EVENT_HANDLE_BYTES],
                       uint64_t *bytes)
{
    const lmc_kv_plan *p = &op->c->plan;
    char err[256] = "";
    int rc = m->cuda.ops->wait_event(op->c->cu.stream, client, client_len, err, sizeof err);
    size_t w = 0;   /* the reserved leases, packed to the front */
    for (size_t i = 0; i < s->n; i++) {
        if (s->res[i] != LMC_L1_SUCCESS)
            continue;
        uint32_t og = (uint32_t)(s->slot[i] % p->n_og);
        if (rc == 0)
            rc = copy_object(m, op, og, s->slot[i] / p->n_og, op->arena + s->leases[i].offset,
                             NULL, true, err, sizeof err);
        *bytes += p->og[og].object_size;
        s->keys[w] = s->keys[i];
        s->leases[w++] = s->leases[i];
    }
    sd_completion *done = completion(m, op, s->keys, s->leases, w, rc == 0,
                                     LMC_EVENT_STORE_END, w, rc == 0 ? *bytes : 0);
    if (rc == 0 && m->cuda.ops->record_event(op->c->cu.stream, handle, err, sizeof err) != 0)
        rc = -1;
    if (!done) {   /* nothing may publish: wait for the copies, give back */
        m->cuda.ops->sync(op->c->cu.stream, err, sizeof err);
        lmc_storage_manager_give_back(m->ctx->storage, s->keys, s->leases, w);
        return false;
    }
    done->publish = rc == 0;
    after_stream(m, op, done);
    if (rc != 0)
        LMC_WARN_LIMITED("STORE on CUDA instance %lld: %s", (long long)op->c->instance_id, err);
    return rc == 0;
}

/* Object group og's window: COPY leases (the LOOKUP's shares), the copies
 * into the blocks, and a completion that gives the leases back (the last
 * group's also publishes RETRIEVE_END with every group's bytes). */
static int retrieve_group(sd_mod *m, const sd_op *op, uint32_t og, uint64_t skip,
                          uint64_t *bytes, char *err, size_t errlen)
{
    const lmc_kv_plan *p = &op->c->plan;
    size_t first = lmc_server_driven_window_start(op, og), n = op->n - first;
    lmc_object_key *keys = malloc((n + 1) * sizeof *keys);
    lmc_lease *leases = calloc(n + 1, sizeof *leases);
    int rc = keys && leases ? 0 : (snprintf(err, errlen, "out of memory"), -1);
    for (size_t c = first; rc == 0 && c < op->n; c++) {
        for (uint32_t k = 0; rc == 0 && k < p->og[og].n_members; k++)
            if (!lmc_server_driven_ids_in_range(op, p->og[og].members[k], c))
                rc = (snprintf(err, errlen, "chunk %zu names a block outside its tensor", c), -1);
        keys[c - first] = op->keys[c * p->n_og + og];
    }
    lmc_object_sizes want = {&p->og[og].object_size, 1, 1};
    if (rc == 0 && lmc_storage_manager_lease_copy(m->ctx->storage, keys, n,
                                                  LMC_COPY_CARRIES_SHARE, true, &want, leases,
                                                  NULL) != n)
        rc = (snprintf(err, errlen, "chunks not locked by a LOOKUP"), -1);
    uint32_t skips[LMC_KV_MAX_KERNEL_GROUPS];
    for (size_t c = first; rc == 0 && c < op->n; c++) {
        if (!lmc_server_driven_chunk_skip(op, m->cs, og, c, skip, skips))
            continue;
        rc = copy_object(m, op, og, c, op->arena + leases[c - first].offset, skips, false, err,
                         errlen);
        *bytes += p->og[og].object_size;
    }
    bool granted = rc == 0 || leases[0].kind == LMC_LEASE_COPY;
    bool last = rc == 0 && og + 1 == p->n_og;
    sd_completion *done = granted ? completion(m, op, keys, leases, n, false,
                                               last ? LMC_EVENT_RETRIEVE_END : NULL, op->n,
                                               *bytes)
                                  : NULL;
    if (done)
        after_stream(m, op, done);
    else if (granted) {
        m->cuda.ops->sync(op->c->cu.stream, err, errlen);
        lmc_storage_manager_give_back(m->ctx->storage, keys, leases, n);
    }
    free(keys);
    free(leases);
    return rc;
}

bool lmc_server_driven_cuda_retrieve(sd_mod *m, const sd_op *op, uint64_t skip, const uint8_t *client,
                          size_t client_len, uint8_t handle[LMC_CUDA_EVENT_HANDLE_BYTES],
                          uint64_t *bytes)
{
    char err[256] = "";
    const lmc_cuda_ops *ops = m->cuda.ops;
    int rc = ops->wait_event(op->c->cu.stream, client, client_len, err, sizeof err);
    for (uint32_t og = 0; rc == 0 && og < op->c->plan.n_og; og++)
        rc = retrieve_group(m, op, og, skip, bytes, err, sizeof err);
    if (ops->record_event(op->c->cu.stream, handle, err, sizeof err) != 0)
        rc = -1;
    if (rc != 0)
        LMC_WARN_LIMITED("RETRIEVE on CUDA instance %lld: %s", (long long)op->c->instance_id, err);
    return rc == 0;
}

/* ---- layerwise RETRIEVE (layerwise.c) ----------------------------------- */

int lmc_server_driven_cuda_event_pool(sd_mod *m, sd_ctx *c, uint32_t n, uint8_t *handles,
                                      char *err, size_t errlen)
{
    return m->cuda.ops->event_pool(c->cu.stream, n, handles, err, errlen);
}

int lmc_server_driven_cuda_wait(sd_mod *m, const sd_op *op, const uint8_t *client,
                                size_t client_len, char *err, size_t errlen)
{
    return m->cuda.ops->wait_event(op->c->cu.stream, client, client_len, err, errlen);
}

/* Enqueues the batch refs[0..n) of chunks [first, op->n) of object group og
 * from their leased objects, then records pool event `pool` after them. */
int lmc_server_driven_cuda_layers(sd_mod *m, const sd_op *op, uint32_t og, size_t first,
                                  uint64_t skip, const lmc_lease *leases,
                                  const lmc_kv_layer_ref *refs, size_t n, uint32_t pool,
                                  char *err, size_t errlen)
{
    const lmc_kv_plan *p = &op->c->plan;
    const lmc_kv_object_group *o = &p->og[og];
    const lmc_kv_kernel_group *groups[LMC_KV_MAX_KERNEL_GROUPS];
    const uint64_t *tensors[LMC_KV_MAX_KERNEL_GROUPS];
    const int64_t *blocks[LMC_KV_MAX_KERNEL_GROUPS];
    uint32_t from[LMC_KV_MAX_KERNEL_GROUPS], to[LMC_KV_MAX_KERNEL_GROUPS];
    for (uint32_t k = 0; k < o->n_members; k++) {
        /* A batch is consecutive layers of each member (refs ascend). */
        from[k] = to[k] = 0;
        for (size_t i = 0; i < n; i++) {
            if (refs[i].kg != o->members[k])
                continue;
            if (from[k] == to[k])
                from[k] = refs[i].layer;
            to[k] = refs[i].layer + 1;
        }
        groups[k] = &p->kg[o->members[k]];
        tensors[k] = op->c->cu.tensors[o->members[k]];
    }
    lmc_cuda_object obj = {.groups = groups, .tensors = tensors, .n_groups = o->n_members,
                           .object_size = o->object_size};
    const lmc_cuda_ops *ops = m->cuda.ops;
    int rc = 0;
    uint32_t skips[LMC_KV_MAX_KERNEL_GROUPS];
    for (size_t c = first; rc == 0 && c < op->n; c++) {
        if (!lmc_server_driven_chunk_skip(op, m->cs, og, c, skip, skips))
            continue;
        for (uint32_t k = 0; k < o->n_members; k++)
            blocks[k] = lmc_server_driven_kept_ids(op, o->members[k], c);
        rc = ops->copy_layers(op->c->cu.stream, &obj, op->arena + leases[c - first].offset,
                              blocks, skips, from, to, err, errlen);
    }
    return rc == 0 ? ops->record_pool_event(op->c->cu.stream, pool, err, errlen) : rc;
}

/* The leases go back once the stream has passed every copy enqueued. */
void lmc_server_driven_cuda_give_back_after(sd_mod *m, const sd_op *op, lmc_object_key *keys,
                                            lmc_lease *leases, size_t n)
{
    char err[256];
    sd_completion *done = completion(m, op, keys, leases, n, false, NULL, 0, 0);
    if (done) {
        after_stream(m, op, done);
        return;
    }
    m->cuda.ops->sync(op->c->cu.stream, err, sizeof err);
    lmc_storage_manager_give_back(m->ctx->storage, keys, leases, n);
}
