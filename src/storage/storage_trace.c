/* The storage trace recorder (storage_trace.h, docs/trace.md). */
#include "storage/storage_trace.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <msgpack.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/write_all.h"
#include "storage/object_key_msgpack.h"

#define QUALNAME_PREFIX "lmcache.v1.distributed.storage_manager.StorageManager"
#define STACK_FRAME 4096
#define WRITER_POLL_MS 100
#define WAKE_FRACTION 4   /* a ring a quarter full wakes the writer */

struct lmc_storage_trace {
    int fd;
    char *path;
    char *level;
    json_t *level_meta;       /* the header's level_meta, NULL: left out */
    double t_mono_start;
    pthread_t writer;
    pthread_mutex_t mu;       /* guards everything below */
    pthread_cond_t wake;
    uint8_t *ring;
    size_t cap, head, used;   /* bytes [head - used, head) mod cap are queued */
    uint64_t queued_records;  /* records in the queued bytes */
    bool stop;
    lmc_storage_trace_stats stats;
};

/* ---- encoding ------------------------------------------------------------ */

/* Writes what fits, counts everything: the count is the size to retry with. */
typedef struct {
    uint8_t *buf;
    size_t cap, len;
} frame_buf;

static int frame_write(void *data, const char *bytes, size_t n)
{
    frame_buf *f = data;
    if (f->len + n <= f->cap)
        memcpy(f->buf + f->len, bytes, n);
    f->len += n;
    return 0;
}

static void pack_cstr(msgpack_packer *pk, const char *s)
{
    size_t n = strlen(s);
    msgpack_pack_str(pk, n);
    msgpack_pack_str_body(pk, s, n);
}

/* {"__t__": tag, "v": ...}: upstream's wrapper of a non-native value;
 * the caller packs the payload next. */
static void pack_tagged(msgpack_packer *pk, const char *tag)
{
    msgpack_pack_map(pk, 2);
    pack_cstr(pk, "__t__");
    pack_cstr(pk, tag);
    pack_cstr(pk, "v");
}

static void pack_object_key(msgpack_packer *pk, const lmc_object_key *k)
{
    pack_tagged(pk, "ObjectKey");
    lmc_object_key_pack_msgpack(pk, k);
}

/* lmcached stores raw bytes: the layout of one object is one uint8
 * tensor of its size (docs/trace.md, "What is recorded"). */
static void pack_layout(msgpack_packer *pk, uint64_t object_size)
{
    pack_tagged(pk, "MemoryLayoutDesc");
    msgpack_pack_map(pk, 2);
    pack_cstr(pk, "shapes");
    msgpack_pack_array(pk, 1);
    msgpack_pack_array(pk, 1);
    msgpack_pack_uint64(pk, object_size);
    pack_cstr(pk, "dtypes");
    msgpack_pack_array(pk, 1);
    pack_cstr(pk, "torch.uint8");
}

static void put_be32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

/* Starts a frame after its 4-byte prefix; finish_frame fills the prefix. */
static void start_frame(frame_buf *f, msgpack_packer *pk, uint8_t *buf, size_t cap)
{
    *f = (frame_buf){.buf = buf, .cap = cap, .len = 4};
    msgpack_packer_init(pk, f, frame_write);
}

static size_t finish_frame(frame_buf *f)
{
    if (f->len <= f->cap && f->cap >= 4)
        put_be32(f->buf, (uint32_t)(f->len - 4));
    return f->len;
}

static void sha256_hex(const char *s, char out[65])
{
    unsigned char md[32];
    unsigned int len = 0;
    if (!EVP_Digest(s, strlen(s), md, &len, EVP_sha256(), NULL))
        len = 0;
    for (unsigned i = 0; i < 32; i++)
        snprintf(out + 2 * i, 3, "%02x", i < len ? md[i] : 0);
}

/* JSON as msgpack, type for type (an events batch is recorded in the wire
 * form the coordinator is posted, docs/trace.md "The events level").
 * Deeper than JSON_PACK_DEPTH packs nil: our own batches are 4 deep. */
#define JSON_PACK_DEPTH 32

static void pack_json(msgpack_packer *pk, const json_t *v, int depth)
{
    if (depth > JSON_PACK_DEPTH) {
        msgpack_pack_nil(pk);
        return;
    }
    switch (json_typeof(v)) {
    case JSON_OBJECT: {
        msgpack_pack_map(pk, json_object_size(v));
        const char *k;
        json_t *e;
        json_object_foreach((json_t *)v, k, e) {
            pack_cstr(pk, k);
            pack_json(pk, e, depth + 1);
        }
        break;
    }
    case JSON_ARRAY: {
        msgpack_pack_array(pk, json_array_size(v));
        size_t i;
        json_t *e;
        json_array_foreach(v, i, e)
            pack_json(pk, e, depth + 1);
        break;
    }
    case JSON_STRING:
        msgpack_pack_str(pk, json_string_length(v));
        msgpack_pack_str_body(pk, json_string_value(v), json_string_length(v));
        break;
    case JSON_INTEGER: msgpack_pack_int64(pk, json_integer_value(v)); break;
    case JSON_REAL: msgpack_pack_double(pk, json_real_value(v)); break;
    case JSON_TRUE: msgpack_pack_true(pk); break;
    case JSON_FALSE: msgpack_pack_false(pk); break;
    default: msgpack_pack_nil(pk); break;
    }
}

size_t lmc_storage_trace_encode_header(uint8_t *buf, size_t cap, const char *level,
                                       double t_mono_start, double t_wall_start,
                                       const char *sm_config_json)
{
    return lmc_storage_trace_encode_header_meta(buf, cap, level, t_mono_start, t_wall_start,
                                                sm_config_json, NULL);
}

size_t lmc_storage_trace_encode_header_meta(uint8_t *buf, size_t cap, const char *level,
                                            double t_mono_start, double t_wall_start,
                                            const char *sm_config_json,
                                            const json_t *level_meta)
{
    frame_buf f;
    msgpack_packer pk;
    char digest[65];
    sha256_hex(sm_config_json, digest);
    start_frame(&f, &pk, buf, cap);
    bool meta = level_meta && json_object_size(level_meta) > 0;
    msgpack_pack_map(&pk, meta ? 10 : 9);
    pack_cstr(&pk, "type");
    pack_cstr(&pk, "header");
    pack_cstr(&pk, "magic");
    msgpack_pack_bin(&pk, 4);
    msgpack_pack_bin_body(&pk, LMC_STORAGE_TRACE_MAGIC, 4);
    pack_cstr(&pk, "format_version");
    msgpack_pack_int(&pk, LMC_STORAGE_TRACE_FORMAT_VERSION);
    pack_cstr(&pk, "level");
    pack_cstr(&pk, level);
    pack_cstr(&pk, "trace_schema_version");
    msgpack_pack_int(&pk, LMC_STORAGE_TRACE_SCHEMA_VERSION);
    pack_cstr(&pk, "t_mono_start");
    msgpack_pack_double(&pk, t_mono_start);
    pack_cstr(&pk, "t_wall_start");
    msgpack_pack_double(&pk, t_wall_start);
    pack_cstr(&pk, "sm_config_json");
    pack_cstr(&pk, sm_config_json);
    pack_cstr(&pk, "sm_config_digest");
    pack_cstr(&pk, digest);
    if (meta) {
        pack_cstr(&pk, "level_meta");
        pack_json(&pk, level_meta, 0);
    }
    return finish_frame(&f);
}

static const char *op_method(lmc_storage_trace_op op)
{
    switch (op) {
    case LMC_STORAGE_TRACE_RESERVE_WRITE: return QUALNAME_PREFIX ".reserve_write";
    case LMC_STORAGE_TRACE_FINISH_WRITE: return QUALNAME_PREFIX ".finish_write";
    case LMC_STORAGE_TRACE_SUBMIT_PREFETCH_TASK: return QUALNAME_PREFIX ".submit_prefetch_task";
    case LMC_STORAGE_TRACE_FINISH_READ_PREFETCHED:
        return QUALNAME_PREFIX ".finish_read_prefetched";
    case LMC_STORAGE_TRACE_READ_PREFETCHED_ENTER:
        return QUALNAME_PREFIX ".read_prefetched_results.__enter__";
    case LMC_STORAGE_TRACE_READ_PREFETCHED_EXIT:
        return QUALNAME_PREFIX ".read_prefetched_results.__exit__";
    default: return QUALNAME_PREFIX ".abort_write";
    }
}

/* A Record's frame up to its "args" key; the caller packs the args. */
static void start_record(frame_buf *f, msgpack_packer *pk, uint8_t *buf, size_t cap,
                         double t_mono, double t_wall, const char *qualname)
{
    start_frame(f, pk, buf, cap);
    msgpack_pack_map(pk, 5);
    pack_cstr(pk, "type");
    pack_cstr(pk, "record");
    pack_cstr(pk, "t_mono");
    msgpack_pack_double(pk, t_mono);
    pack_cstr(pk, "t_wall");
    msgpack_pack_double(pk, t_wall);
    pack_cstr(pk, "qualname");
    pack_cstr(pk, qualname);
    pack_cstr(pk, "args");
}

static bool same_but_hash(const lmc_object_key *a, const lmc_object_key *b)
{
    return a->model_name == b->model_name && a->cache_salt == b->cache_salt &&
           a->kv_rank == b->kv_rank && a->object_group_id == b->object_group_id &&
           a->chunk_hash_len == b->chunk_hash_len;
}

/* The keys of one call differ, mostly, in their hash alone (one request's
 * chunks): such a key's bytes are the previous key's with its own hash,
 * copied rather than packed field by field, which kept a LOOKUP of 128
 * chunks within its budget (BENCHMARKS.md, "Storage trace").  Interned
 * strings: equal names share a pointer (storage/object_key.h). */
static void pack_keys(msgpack_packer *pk, const lmc_object_key *keys, size_t n)
{
    frame_buf *f = pk->data;
    size_t start = 0, len = 0, hash_at = 0;
    for (size_t i = 0; i < n; i++) {
        const lmc_object_key *k = &keys[i];
        if (i == 0 || !same_but_hash(k, &keys[i - 1])) {
            start = f->len;
            pack_object_key(pk, k);
            len = f->len - start;
            /* the tag's map, "__t__", "ObjectKey", "v", the key's map,
             * "chunk_hash" and the bin's header come before the hash */
            uint32_t h = k->chunk_hash_len;
            hash_at = 1 + 6 + 10 + 2 + 1 + 11 + (h < 256 ? 2 : h < 65536 ? 3 : 5);
            continue;
        }
        if (start + len <= f->cap && f->len + len <= f->cap) {
            memcpy(f->buf + f->len, f->buf + start, len);
            memcpy(f->buf + f->len + hash_at, k->chunk_hash, k->chunk_hash_len);
            start = f->len;
        }
        f->len += len;
    }
}

/* The args each method is recorded with: upstream's parameter names with
 * their defaults applied (docs/trace.md, "What is recorded").  keys come
 * first in every one. */
static void pack_args(msgpack_packer *pk, lmc_storage_trace_op op, const lmc_object_key *keys,
                      size_t n, uint64_t object_size)
{
    bool submit = op == LMC_STORAGE_TRACE_SUBMIT_PREFETCH_TASK;
    bool layout = submit || op == LMC_STORAGE_TRACE_RESERVE_WRITE;
    bool extra = submit || op == LMC_STORAGE_TRACE_FINISH_READ_PREFETCHED;
    msgpack_pack_map(pk, 1 + layout + extra + 2 * submit);
    pack_cstr(pk, "keys");
    msgpack_pack_array(pk, n);
    pack_keys(pk, keys, n);
    if (layout) {
        pack_cstr(pk, "layout_desc");
        pack_layout(pk, object_size);
    }
    if (extra) {
        pack_cstr(pk, "extra_count");
        msgpack_pack_int(pk, 0);
    }
    if (submit) {
        pack_cstr(pk, "external_request_id");
        pack_cstr(pk, "");
        pack_cstr(pk, "policy");
        pack_tagged(pk, "TrimPolicy");
        pack_cstr(pk, "PREFIX");
    }
}

size_t lmc_storage_trace_encode_record(uint8_t *buf, size_t cap, double t_mono, double t_wall,
                                       lmc_storage_trace_op op, const lmc_object_key *keys,
                                       size_t n, uint64_t object_size)
{
    frame_buf f;
    msgpack_packer pk;
    start_record(&f, &pk, buf, cap, t_mono, t_wall, op_method(op));
    pack_args(&pk, op, keys, n, object_size);
    return finish_frame(&f);
}

size_t lmc_storage_trace_encode_json_record(uint8_t *buf, size_t cap, double t_mono,
                                            double t_wall, const char *qualname,
                                            const json_t *args)
{
    frame_buf f;
    msgpack_packer pk;
    start_record(&f, &pk, buf, cap, t_mono, t_wall, qualname);
    pack_json(&pk, args, 0);
    return finish_frame(&f);
}

/* ---- the ring and its writer ------------------------------------------- */

static double clock_seconds(clockid_t id)
{
    struct timespec ts;
    clock_gettime(id, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Writes the queued bytes without the lock: producers only append after
 * them, and their room is given back only once they are on disk. */
static void drain(lmc_storage_trace *t)
{
    size_t used = t->used, start = (t->head + t->cap - used) % t->cap;
    uint64_t records = t->queued_records;
    t->queued_records = 0;
    pthread_mutex_unlock(&t->mu);
    size_t first = used < t->cap - start ? used : t->cap - start;
    int rc = lmc_core_write_all(t->fd, t->ring + start, first);
    if (rc == 0 && used > first)
        rc = lmc_core_write_all(t->fd, t->ring, used - first);
    pthread_mutex_lock(&t->mu);
    t->used -= used;
    if (rc == 0) {
        t->stats.records_written += records;
        t->stats.bytes_written += used;
    } else {
        t->stats.records_dropped += records;
    }
}

static void *writer_main(void *arg)
{
    lmc_storage_trace *t = arg;
    pthread_mutex_lock(&t->mu);
    for (;;) {
        if (t->used > 0) {
            drain(t);
            continue;
        }
        if (t->stop)
            break;
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_nsec += WRITER_POLL_MS * 1000000L;
        if (until.tv_nsec >= 1000000000L) {
            until.tv_sec++;
            until.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&t->wake, &t->mu, &until);
    }
    pthread_mutex_unlock(&t->mu);
    return NULL;
}

/* Queues the frame, or drops and counts it (ring full, or no frame). */
static void enqueue(lmc_storage_trace *t, const uint8_t *frame, size_t len)
{
    pthread_mutex_lock(&t->mu);
    if (!frame || t->stop || len > t->cap - t->used) {
        t->stats.records_dropped++;
        pthread_mutex_unlock(&t->mu);
        return;
    }
    size_t first = len < t->cap - t->head ? len : t->cap - t->head;
    memcpy(t->ring + t->head, frame, first);
    memcpy(t->ring, frame + first, len - first);
    t->head = (t->head + len) % t->cap;
    /* The writer wakes every WRITER_POLL_MS anyway; a wake-up (and a
     * write) per record would cost each STORE a context switch, so only
     * a ring filling up wakes it early (docs/trace.md, "Bounds"). */
    bool filling = t->used < t->cap / WAKE_FRACTION && t->used + len >= t->cap / WAKE_FRACTION;
    t->used += len;
    t->queued_records++;
    pthread_mutex_unlock(&t->mu);
    if (filling)
        pthread_cond_signal(&t->wake);
}

/* buf NULL: its allocation failed.  A frame over 4 GiB has no prefix. */
static void enqueue_or_drop(lmc_storage_trace *t, const uint8_t *buf, size_t len)
{
    enqueue(t, buf && len - 4 <= UINT32_MAX ? buf : NULL, len);
}

void lmc_storage_trace_record(lmc_storage_trace *t, lmc_storage_trace_op op,
                              const lmc_object_key *keys, size_t n, uint64_t object_size)
{
    if (!t)
        return;
    uint8_t stack[STACK_FRAME], *buf = stack;
    double mono = clock_seconds(CLOCK_MONOTONIC) - t->t_mono_start;
    double wall = clock_seconds(CLOCK_REALTIME);
    size_t len = lmc_storage_trace_encode_record(buf, sizeof stack, mono, wall, op, keys, n,
                                                 object_size);
    if (len > sizeof stack) {
        buf = malloc(len);
        if (buf)
            lmc_storage_trace_encode_record(buf, len, mono, wall, op, keys, n, object_size);
    }
    enqueue_or_drop(t, buf, len);
    if (buf != stack)
        free(buf);
}

void lmc_storage_trace_record_json(lmc_storage_trace *t, const char *qualname,
                                   const json_t *args)
{
    if (!t || !json_is_object(args))
        return;
    uint8_t stack[STACK_FRAME], *buf = stack;
    double mono = clock_seconds(CLOCK_MONOTONIC) - t->t_mono_start;
    double wall = clock_seconds(CLOCK_REALTIME);
    size_t len = lmc_storage_trace_encode_json_record(buf, sizeof stack, mono, wall, qualname,
                                                      args);
    if (len > sizeof stack) {
        buf = malloc(len);
        if (buf)
            lmc_storage_trace_encode_json_record(buf, len, mono, wall, qualname, args);
    }
    enqueue_or_drop(t, buf, len);
    if (buf != stack)
        free(buf);
}

/* ---- lifecycle ------------------------------------------------------------ */

static int write_header(lmc_storage_trace *t, const char *json)
{
    double wall = clock_seconds(CLOCK_REALTIME);
    size_t len = lmc_storage_trace_encode_header_meta(NULL, 0, t->level, t->t_mono_start, wall,
                                                      json, t->level_meta);
    uint8_t *buf = malloc(len);
    if (!buf)
        return -1;
    lmc_storage_trace_encode_header_meta(buf, len, t->level, t->t_mono_start, wall, json,
                                         t->level_meta);
    int rc = lmc_core_write_all(t->fd, buf, len);
    free(buf);
    if (rc == 0)
        t->stats.bytes_written = len;
    return rc;
}

lmc_storage_trace *lmc_storage_trace_open(const char *path, const char *level,
                                          const char *sm_config_json, size_t ring_bytes,
                                          char *err, size_t errlen)
{
    return lmc_storage_trace_open_meta(path, level, sm_config_json, NULL, ring_bytes, err,
                                       errlen);
}

lmc_storage_trace *lmc_storage_trace_open_meta(const char *path, const char *level,
                                               const char *sm_config_json,
                                               json_t *level_meta, size_t ring_bytes,
                                               char *err, size_t errlen)
{
    lmc_storage_trace *t = calloc(1, sizeof *t);
    if (!t || !(t->path = strdup(path)) || !(t->level = strdup(level)) ||
        !(t->ring = malloc(t->cap = ring_bytes ? ring_bytes : 1))) {
        snprintf(err, errlen, "--trace-output: out of memory");
        goto fail_alloc;
    }
    t->level_meta = json_incref(level_meta);
    /* Touched now, a byte per page (a memset of zeros after malloc may
     * become a calloc that touches nothing): the start pays the page
     * faults of the ring's first fill, 8 per LOOKUP of 128 chunks,
     * instead of the requests (BENCHMARKS.md, "Storage trace"). */
    for (size_t i = 0; i < t->cap; i += 4096)
        ((volatile uint8_t *)t->ring)[i] = 0;
    t->t_mono_start = clock_seconds(CLOCK_MONOTONIC);
    /* 0600: model names and chunk hashes are the operator's (docs/trace.md). */
    t->fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (t->fd < 0 || write_header(t, sm_config_json) != 0) {
        snprintf(err, errlen, "--trace-output: cannot write '%s': %s", path, strerror(errno));
        goto fail_file;
    }
    pthread_mutex_init(&t->mu, NULL);
    pthread_cond_init(&t->wake, NULL);
    if (pthread_create(&t->writer, NULL, writer_main, t) != 0) {
        snprintf(err, errlen, "--trace-output: cannot start the trace writer");
        pthread_cond_destroy(&t->wake);
        pthread_mutex_destroy(&t->mu);
        goto fail_file;
    }
    return t;
fail_file:
    if (t->fd >= 0)
        close(t->fd);
fail_alloc:
    if (t) {
        json_decref(t->level_meta);
        free(t->ring);
        free(t->level);
        free(t->path);
        free(t);
    }
    return NULL;
}

void lmc_storage_trace_close(lmc_storage_trace *t)
{
    if (!t)
        return;
    pthread_mutex_lock(&t->mu);
    t->stop = true;
    pthread_mutex_unlock(&t->mu);
    pthread_cond_signal(&t->wake);
    pthread_join(t->writer, NULL);   /* it drains the ring before it stops */
    fsync(t->fd);
    close(t->fd);
    pthread_cond_destroy(&t->wake);
    pthread_mutex_destroy(&t->mu);
    json_decref(t->level_meta);
    free(t->ring);
    free(t->level);
    free(t->path);
    free(t);
}

void lmc_storage_trace_get_stats(lmc_storage_trace *t, lmc_storage_trace_stats *out)
{
    pthread_mutex_lock(&t->mu);
    *out = t->stats;
    pthread_mutex_unlock(&t->mu);
}

const char *lmc_storage_trace_path(const lmc_storage_trace *t)
{
    return t->path;
}

const char *lmc_storage_trace_level(const lmc_storage_trace *t)
{
    return t->level;
}
