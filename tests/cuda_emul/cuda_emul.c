/* A CPU stand-in for liblmcached_cuda.so (src/kv/cuda_transfer.h), so
 * that the server-driven module's CUDA path (cuda_plugin.c: loading,
 * registration, copies enqueued on a stream, events, completions
 * published from host callbacks) runs in tests on machines without a GPU
 * (docs/testing.md, "The CUDA path without a GPU").  Loaded through
 * LMCACHED_CUDA_LIB.  It keeps the contract's asynchrony: every stream is
 * a thread working through a FIFO of copies and callbacks, so replies
 * really do come back before the copies end.
 *
 * What stands in for what: a "memory handle" is the NUL-padded name of a
 * POSIX shared-memory segment, opened and mapped like an IPC allocation
 * (deduplicated, refcounted); device addresses are the mapping's host
 * addresses; the one device has the UUID "emul-0"; event handles are 64
 * bytes carrying a counter.  The copies are lmcached's own CPU gather and
 * scatter (kv_copy.h), not a re-implementation. */
#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kv/cuda_transfer.h"
#include "kv/kv_copy.h"

typedef struct mapping {
    char name[65];
    uint8_t *addr;
    size_t len;
    int refs;
    struct mapping *next;
} mapping;

static pthread_mutex_t maps_lock = PTHREAD_MUTEX_INITIALIZER;
static mapping *maps;

typedef struct task {
    enum { T_COPY, T_CALLBACK } kind;
    /* T_COPY: one member group's copy, parameters copied. */
    lmc_kv_kernel_group g;
    uint8_t **bases;
    int64_t *blocks;
    uint8_t *entry;
    uint32_t skip;
    bool to_host;
    uint32_t from, to;         /* layers scattered (copy_layers; else all) */
    /* T_CALLBACK */
    void (*fn)(void *);
    void *arg;
    struct task *next;
} task;

struct lmc_cuda_stream {
    pthread_mutex_t lock;
    pthread_cond_t wake, idle;
    task *head, **tail;
    bool stop, busy;
    pthread_t thread;
    uint64_t events;
    uint32_t pool_n;           /* the event pool's size, once made */
};

static int fail(char *err, size_t errlen, const char *why)
{
    snprintf(err, errlen, "cuda_emul: %s", why);
    return -1;
}

static int emul_init(int *devices, char *err, size_t errlen)
{
    (void)err, (void)errlen;
    *devices = 1;
    return 0;
}

static int emul_device_by_uuid(const char *uuid, int *device, char *err, size_t errlen)
{
    if (strcmp(uuid, "emul-0") != 0 && strcmp(uuid, "GPU-emul-0") != 0)
        return fail(err, errlen, "no device with that UUID");
    *device = 0;
    return 0;
}

/* The "allocation" is the segment the handle names; its size, what
 * cuMemGetAddressRange reports on a GPU, is the segment's. */
static int emul_open_mem(int device, const uint8_t handle[64], uint64_t *base, uint64_t *size,
                         char *err, size_t errlen)
{
    (void)device;
    char name[65];
    memcpy(name, handle, 64);
    name[64] = '\0';
    pthread_mutex_lock(&maps_lock);
    mapping *m = maps;
    while (m && strcmp(m->name, name) != 0)
        m = m->next;
    if (!m) {
        int fd = shm_open(name, O_RDWR, 0);
        struct stat st;
        void *addr = MAP_FAILED;
        if (fd >= 0 && fstat(fd, &st) == 0 && st.st_size > 0)
            addr = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (fd >= 0)
            close(fd);
        if (addr != MAP_FAILED && (m = calloc(1, sizeof *m))) {
            snprintf(m->name, sizeof m->name, "%s", name);
            m->addr = addr;
            m->len = (size_t)st.st_size;
            m->next = maps;
            maps = m;
        }
    }
    if (m)
        m->refs++;
    pthread_mutex_unlock(&maps_lock);
    if (!m)
        return fail(err, errlen, "cannot open the memory handle");
    *base = (uint64_t)(uintptr_t)m->addr;
    *size = m->len;
    return 0;
}

static void emul_close_mem(int device, uint64_t base)
{
    (void)device;
    pthread_mutex_lock(&maps_lock);
    for (mapping **p = &maps; *p; p = &(*p)->next) {
        mapping *m = *p;
        if ((uint64_t)(uintptr_t)m->addr == base && --m->refs == 0) {
            *p = m->next;
            munmap(m->addr, m->len);
            free(m);
            break;
        }
    }
    pthread_mutex_unlock(&maps_lock);
}

static int emul_pin(void *host, uint64_t bytes, char *err, size_t errlen)
{
    (void)host, (void)bytes, (void)err, (void)errlen;
    return 0;
}

static void emul_unpin(void *host)
{
    (void)host;
}

static void run(task *t)
{
    if (t->kind == T_CALLBACK) {
        t->fn(t->arg);
        return;
    }
    lmc_kv_chunk_copy cc = {.g = &t->g, .bases = t->bases, .blocks = t->blocks,
                            .entry = t->entry, .skip_blocks = t->skip,
                            .method = LMC_COPY_MEMCPY};
    if (t->to_host)
        lmc_kv_gather_chunk(&cc);
    else
        lmc_kv_scatter_layers(&cc, t->from, t->to);
}

static void task_free(task *t)
{
    free(t->bases);
    free(t->blocks);
    free(t);
}

static void *stream_thread(void *arg)
{
    lmc_cuda_stream *s = arg;
    pthread_mutex_lock(&s->lock);
    for (;;) {
        while (!s->head && !s->stop)
            pthread_cond_wait(&s->wake, &s->lock);
        task *t = s->head;
        if (!t)
            break;
        s->head = t->next;
        if (!s->head)
            s->tail = &s->head;
        s->busy = true;
        pthread_mutex_unlock(&s->lock);
        usleep(1000);   /* a device that takes its time: the reply comes first */
        run(t);
        task_free(t);
        pthread_mutex_lock(&s->lock);
        s->busy = false;
        if (!s->head)
            pthread_cond_broadcast(&s->idle);
    }
    pthread_mutex_unlock(&s->lock);
    return NULL;
}

static void push(lmc_cuda_stream *s, task *t)
{
    pthread_mutex_lock(&s->lock);
    t->next = NULL;
    *s->tail = t;
    s->tail = &t->next;
    pthread_cond_signal(&s->wake);
    pthread_mutex_unlock(&s->lock);
}

static lmc_cuda_stream *emul_stream_new(int device, uint64_t staging_bytes, char *err,
                                        size_t errlen)
{
    (void)device, (void)staging_bytes;
    lmc_cuda_stream *s = calloc(1, sizeof *s);
    if (!s)
        return fail(err, errlen, "out of memory"), NULL;
    pthread_mutex_init(&s->lock, NULL);
    pthread_cond_init(&s->wake, NULL);
    pthread_cond_init(&s->idle, NULL);
    s->tail = &s->head;
    if (pthread_create(&s->thread, NULL, stream_thread, s) != 0) {
        free(s);
        return fail(err, errlen, "cannot start the stream thread"), NULL;
    }
    return s;
}

static int emul_sync(lmc_cuda_stream *s, char *err, size_t errlen)
{
    (void)err, (void)errlen;
    pthread_mutex_lock(&s->lock);
    while (s->head || s->busy)
        pthread_cond_wait(&s->idle, &s->lock);
    pthread_mutex_unlock(&s->lock);
    return 0;
}

static void emul_stream_free(lmc_cuda_stream *s)
{
    char err[8];
    emul_sync(s, err, sizeof err);
    pthread_mutex_lock(&s->lock);
    s->stop = true;
    pthread_cond_signal(&s->wake);
    pthread_mutex_unlock(&s->lock);
    pthread_join(s->thread, NULL);
    pthread_cond_destroy(&s->idle);
    pthread_cond_destroy(&s->wake);
    pthread_mutex_destroy(&s->lock);
    free(s);
}

static int emul_wait_event(lmc_cuda_stream *s, const uint8_t *handle, size_t len, char *err,
                           size_t errlen)
{
    (void)s, (void)handle;
    return len == 0 || len == 64 ? 0 : fail(err, errlen, "an event handle is 0 or 64 bytes");
}

static task *copy_task(const lmc_cuda_object *obj, uint32_t i, void *host,
                       const int64_t *const *blocks, const uint32_t *skip, bool to_host)
{
    const lmc_kv_kernel_group *g = obj->groups[i];
    task *t = calloc(1, sizeof *t);
    if (!t)
        return NULL;
    t->kind = T_COPY;
    t->g = *g;
    t->g.tensors = NULL;   /* not ours to keep */
    t->bases = calloc(g->n_tensors, sizeof *t->bases);
    t->blocks = calloc(g->keep_blocks ? g->keep_blocks : 1, sizeof *t->blocks);
    if (!t->bases || !t->blocks) {
        task_free(t);
        return NULL;
    }
    for (uint32_t k = 0; k < g->n_tensors; k++)
        t->bases[k] = (uint8_t *)(uintptr_t)obj->tensors[i][k];
    memcpy(t->blocks, blocks[i], g->keep_blocks * sizeof *t->blocks);
    t->entry = (uint8_t *)host + g->entry_offset;
    t->skip = skip ? skip[i] : 0;
    t->to_host = to_host;
    t->from = 0;
    t->to = g->geo.nl;
    return t;
}

static int emul_copy_object(lmc_cuda_stream *s, const lmc_cuda_object *obj, void *host,
                            const int64_t *const *blocks, const uint32_t *skip, bool to_host,
                            char *err, size_t errlen)
{
    for (uint32_t i = 0; i < obj->n_groups; i++) {
        task *t = copy_task(obj, i, host, blocks, skip, to_host);
        if (!t)
            return fail(err, errlen, "out of memory");
        push(s, t);
    }
    return 0;
}

static int emul_copy_layers(lmc_cuda_stream *s, const lmc_cuda_object *obj, void *host,
                            const int64_t *const *blocks, const uint32_t *skip,
                            const uint32_t *from, const uint32_t *to, char *err, size_t errlen)
{
    for (uint32_t i = 0; i < obj->n_groups; i++) {
        if (from[i] >= to[i])
            continue;
        task *t = copy_task(obj, i, host, blocks, skip, false);
        if (!t)
            return fail(err, errlen, "out of memory");
        t->from = from[i];
        t->to = to[i];
        push(s, t);
    }
    return 0;
}

/* Pool handle i: "emulpool", then i. */
static int emul_event_pool(lmc_cuda_stream *s, uint32_t n, uint8_t *handles, char *err,
                           size_t errlen)
{
    pthread_mutex_lock(&s->lock);
    bool ok = n > 0 && (s->pool_n == 0 || s->pool_n == n);
    if (ok)
        s->pool_n = n;
    pthread_mutex_unlock(&s->lock);
    if (!ok)
        return fail(err, errlen, "an event pool of another size");
    memset(handles, 0, (size_t)n * 64);
    for (uint32_t i = 0; i < n; i++) {
        memcpy(handles + (size_t)i * 64, "emulpool", 8);
        memcpy(handles + (size_t)i * 64 + 8, &i, sizeof i);
    }
    return 0;
}

static int emul_record_pool_event(lmc_cuda_stream *s, uint32_t i, char *err, size_t errlen)
{
    return i < s->pool_n ? 0 : fail(err, errlen, "no such pool event");
}

static int emul_record_event(lmc_cuda_stream *s, uint8_t handle[64], char *err, size_t errlen)
{
    (void)err, (void)errlen;
    memset(handle, 0, 64);
    pthread_mutex_lock(&s->lock);
    uint64_t n = ++s->events;
    pthread_mutex_unlock(&s->lock);
    memcpy(handle, "emul", 4);
    memcpy(handle + 8, &n, sizeof n);
    return 0;
}

static int emul_then(lmc_cuda_stream *s, void (*fn)(void *), void *arg, char *err,
                     size_t errlen)
{
    task *t = calloc(1, sizeof *t);
    if (!t)
        return fail(err, errlen, "out of memory");
    t->kind = T_CALLBACK;
    t->fn = fn;
    t->arg = arg;
    push(s, t);
    return 0;
}

static int emul_read(int device, uint64_t src, void *host, uint64_t bytes, char *err,
                     size_t errlen)
{
    (void)device, (void)err, (void)errlen;
    memcpy(host, (const void *)(uintptr_t)src, bytes);
    return 0;
}

/* CacheBlend's device executor: cuda_blend.cu built for the host
 * (tests/gpu/host_shim/, libblend_host_plugin.so), loaded from the path
 * in LMCACHED_CUDA_EMUL_BLEND.  "Device" addresses here are host ones, so
 * its kernels run on the emulated memory as they are.  It runs in stream
 * order but synchronously: the stream is drained first, and one plan runs
 * at a time (the stand-in's kernel indices are process globals). */
static pthread_mutex_t blend_lock = PTHREAD_MUTEX_INITIALIZER;

static const lmc_cuda_ops *blend_plugin(char *err, size_t errlen)
{
    static const lmc_cuda_ops *ops;
    static char why[256];
    if (!ops && !why[0]) {
        const char *path = getenv("LMCACHED_CUDA_EMUL_BLEND");
        void *dl = path && *path ? dlopen(path, RTLD_NOW | RTLD_LOCAL) : NULL;
        const lmc_cuda_ops *(*entry)(void) =
            dl ? (const lmc_cuda_ops *(*)(void))dlsym(dl, LMC_CUDA_ENTRY) : NULL;
        ops = entry ? entry() : NULL;
        if (!path || !*path)
            snprintf(why, sizeof why, "LMCACHED_CUDA_EMUL_BLEND (libblend_host_plugin.so) "
                                      "is not set");
        else if (!ops || ops->abi_version != LMC_CUDA_ABI_VERSION || !ops->blend_execute)
            snprintf(why, sizeof why, "LMCACHED_CUDA_EMUL_BLEND: %s",
                     dl ? "not a host build of the blend kernels" : dlerror());
        if (why[0])
            ops = NULL;
    }
    if (!ops)
        snprintf(err, errlen, "cuda_emul: blend_execute: %s", why);
    return ops;
}

static int emul_blend_execute(lmc_cuda_stream *s, const lmc_cuda_blend *b, char *err,
                              size_t errlen)
{
    pthread_mutex_lock(&blend_lock);
    const lmc_cuda_ops *ops = blend_plugin(err, errlen);
    int rc = -1;
    if (ops && emul_sync(s, err, errlen) == 0)
        rc = ops->blend_execute(NULL, b, err, errlen);
    pthread_mutex_unlock(&blend_lock);
    return rc;
}

/* "Device" memory the server owns: host memory. */
static int emul_upload(int device, const void *host, uint64_t bytes, uint64_t *dev, char *err,
                       size_t errlen)
{
    (void)device;
    void *p = malloc(bytes ? bytes : 1);
    if (!p)
        return fail(err, errlen, "out of memory");
    memcpy(p, host, bytes);
    *dev = (uint64_t)(uintptr_t)p;
    return 0;
}

static void emul_free_device(int device, uint64_t dev)
{
    (void)device;
    free((void *)(uintptr_t)dev);
}

static const lmc_cuda_ops emul_ops = {
    .abi_version = LMC_CUDA_ABI_VERSION,
    .init = emul_init,
    .device_by_uuid = emul_device_by_uuid,
    .open_mem = emul_open_mem,
    .close_mem = emul_close_mem,
    .pin = emul_pin,
    .unpin = emul_unpin,
    .stream_new = emul_stream_new,
    .stream_free = emul_stream_free,
    .wait_event = emul_wait_event,
    .copy_object = emul_copy_object,
    .record_event = emul_record_event,
    .then = emul_then,
    .sync = emul_sync,
    .read = emul_read,
    .event_pool = emul_event_pool,
    .record_pool_event = emul_record_pool_event,
    .copy_layers = emul_copy_layers,
    .blend_execute = emul_blend_execute,
    .upload = emul_upload,
    .free_device = emul_free_device,
};

const lmc_cuda_ops *lmc_cuda_transfer_ops(void);

__attribute__((visibility("default"))) const lmc_cuda_ops *lmc_cuda_transfer_ops(void)
{
    return &emul_ops;
}
