/* transfer_bench: the engine-driven transfer path and LOOKUP latency, with
 * lmcached embedded in this process (src/server/server.h) and a client that
 * behaves like upstream's worker and scheduler adapters over TCP.
 *
 *   1. store N chunks of 2 MiB through PREPARE_STORE / copy into the mapped
 *      pool / COMMIT_STORE, then retrieve them through LOOKUP, then
 *      PREPARE_RETRIEVE / copy out / COMMIT_RETRIEVE; effective bandwidth
 *      beside a single-thread memcpy of the same bytes (goal >= 0.8x).
 *      Twice: one request at a time, each reply waited for; and pipelined
 *      (the next request's PREPARE in flight during a copy, COMMIT replies
 *      collected as they come), as an engine with several requests in a
 *      step drives the server.  One request at a time is also run against a
 *      bare ZMQ echo (bench/common/zmq_echo.h): a round trip, the same
 *      copies, a round trip: what any ZMQ server can reach with that
 *      pattern on this machine;
 *   2. LOOKUP + QUERY_PREFETCH_STATUS of a 32,768-token prompt (chunk 256)
 *      fully in L1: p50/p99 beside the NOOP round trip (goal p50 <= 3x), and
 *      the p50 of each of the two round trips alone,
 *      with the key packed once and, as a scheduler does, afresh per cycle;
 *      plus the transport floor: a NOOP carrying the same key, then a QUERY,
 *      and a paired phase timing a NOOP after each cycle (a ratio of samples
 *      taken side by side, immune to the machine's drift between phases);
 *   3. server CPU per chunk op = process CPU - client thread CPU (this
 *      includes the client's ZMQ I/O thread).
 *
 * With --server-process the server runs in a child process instead, as it
 * does beside a real engine (separate address spaces, allocators and page
 * tables); server CPU is then the child's CPU clock.
 *
 * --kv-event-log-size N passes that flag on (docs/kv_events.md; 0 for the
 * log's A/B).  --trace-output FILE runs the server with --trace-level
 * storage writing FILE (docs/trace.md; the trace's A/B).  --kv-events-publish
 * URL also publishes the log there (docs/kv_events.md, "Publishing to
 * routers"; the publisher's A/B); with --kv-events-block-size N it
 * publishes vLLM's block hashes over N-token blocks, seed "0" (docs/kv_events.md,
 * "vLLM block hashes"; their A/B).
 *
 *   transfer_bench [--chunks N] [--iters M] [--batch B] [--server-process]
 *                  [--kv-event-log-size N] [--trace-output FILE]
 *                  [--kv-events-publish URL [--kv-events-block-size N]]
 *                                   (defaults 256, 2000, 16 chunks per request) */
#include <fcntl.h>
#include <malloc.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/server_child.h"
#include "common/zmq_echo.h"
#include "config/config.h"
#include "rpc/client.h"
#include "rpc/wire.h"
#include "server/server.h"

#define CS 256
#define LAYERS 8
#define HIDDEN 256                                  /* 2*8*256*256*2 B = 2 MiB */
#define OBJ ((size_t)2 * LAYERS * CS * HIDDEN * 2)
#define BATCH 16          /* chunks per request, default (--batch) and in the lookup phase */
#define MAX_BATCH 512
#define INSTANCE 4242
#define LOOKUP_TOKENS 32768

typedef struct {
    lmc_client *c;
    lmc_client *echo;       /* the bare ZMQ echo (bench/common/zmq_echo.h) */
    size_t batch;           /* chunks per transfer request */
    uint8_t *pool;
    size_t pool_size;
    double rpc_s, copy_s;   /* time in PREPARE/COMMIT round trips and in copies */
    pid_t server_pid;       /* --server-process: the child running the server */
    clockid_t server_clock; /* its CPU clock */
} bench;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static double cpu_s(clockid_t id)
{
    struct timespec ts;
    clock_gettime(id, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void pack_key(msgpack_sbuffer *sb, const uint64_t *toks, size_t n, size_t start,
                     size_t end, const char *rid, bool worker)
{
    msgpack_packer pk;
    msgpack_sbuffer_init(sb);
    msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 8);
    lmc_mp_pack_cstr(&pk, "model_name"), lmc_mp_pack_cstr(&pk, "bench-model");
    lmc_mp_pack_cstr(&pk, "world_size"), msgpack_pack_int(&pk, 1);
    lmc_mp_pack_cstr(&pk, "worker_id");
    worker ? msgpack_pack_int(&pk, 0) : msgpack_pack_nil(&pk);
    lmc_mp_pack_cstr(&pk, "token_ids"), msgpack_pack_array(&pk, (uint32_t)n);
    for (size_t i = 0; i < n; i++)
        msgpack_pack_uint64(&pk, toks[i]);
    lmc_mp_pack_cstr(&pk, "start"), msgpack_pack_uint64(&pk, start);
    lmc_mp_pack_cstr(&pk, "end"), msgpack_pack_uint64(&pk, end);
    lmc_mp_pack_cstr(&pk, "request_id"), lmc_mp_pack_cstr(&pk, rid);
    lmc_mp_pack_cstr(&pk, "cache_salt"), lmc_mp_pack_cstr(&pk, "");
}

static void pack_int(msgpack_sbuffer *sb, int64_t v)
{
    msgpack_packer pk;
    msgpack_sbuffer_init(sb);
    msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
    msgpack_pack_int64(&pk, v);
}

static void pack_str_arg(msgpack_sbuffer *sb, const char *s)
{
    msgpack_packer pk;
    msgpack_sbuffer_init(sb);
    msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
    lmc_mp_pack_cstr(&pk, s);
}

static bool map_uint(const msgpack_object *map, const char *k, uint64_t *out)
{
    const msgpack_object *o = lmc_mp_map_get(map, k);
    return o && lmc_mp_get_uint(o, out);
}

/* Calls op; unpacks the reply into `zone`/`out` (nil when None). */
static int call(bench *b, int op, msgpack_sbuffer *args, size_t n, msgpack_zone *zone,
                msgpack_object *out)
{
    lmc_client_reply r;
    if (lmc_client_call(b->c, op, args, n, 10000, &r) != LMC_CLIENT_OK)
        return -1;
    out->type = MSGPACK_OBJECT_NIL;
    size_t off = 0;
    /* Unpacked strings point into the buffer: keep a copy in the zone. */
    char *copy = r.has_response && zone ? msgpack_zone_malloc(zone, r.len + 1) : NULL;
    if (copy) {
        memcpy(copy, r.data, r.len);
        msgpack_unpack(copy, r.len, &off, zone, out);
    }
    lmc_client_reply_free(&r);
    return 0;
}

static int register_worker(bench *b)
{
    msgpack_sbuffer sb;
    msgpack_packer pk;
    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 8);
    lmc_mp_pack_cstr(&pk, "instance_id"), msgpack_pack_int(&pk, INSTANCE);
    lmc_mp_pack_cstr(&pk, "model_name"), lmc_mp_pack_cstr(&pk, "bench-model");
    lmc_mp_pack_cstr(&pk, "world_size"), msgpack_pack_int(&pk, 1);
    lmc_mp_pack_cstr(&pk, "block_size"), msgpack_pack_int(&pk, 16);
    lmc_mp_pack_cstr(&pk, "num_layers"), msgpack_pack_int(&pk, LAYERS);
    lmc_mp_pack_cstr(&pk, "hidden_dim_size"), msgpack_pack_int(&pk, HIDDEN);
    lmc_mp_pack_cstr(&pk, "dtype_str"), lmc_mp_pack_cstr(&pk, "float16");
    lmc_mp_pack_cstr(&pk, "use_mla"), msgpack_pack_false(&pk);
    msgpack_zone zone;
    msgpack_zone_init(&zone, 4096);
    msgpack_object rep;
    int rc = call(b, LMC_OP_REGISTER_KV_CACHE_ENGINE_DRIVEN_CONTEXT, &sb, 1, &zone, &rep);
    const char *name;
    size_t len;
    uint64_t size;
    char path[300];
    const msgpack_object *name_o = lmc_mp_map_get(&rep, "shm_name");
    if (rc == 0 && name_o && lmc_mp_get_str(name_o, &name, &len) && len &&
        map_uint(&rep, "pool_size", &size)) {
        snprintf(path, sizeof path, "/dev/shm/%.*s", (int)len, name);
        int fd = open(path, O_RDWR);
        b->pool = fd >= 0 ? mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : NULL;
        b->pool_size = size;
        if (fd >= 0)
            close(fd);
    }
    msgpack_zone_destroy(&zone);
    msgpack_sbuffer_destroy(&sb);
    if (!b->pool || b->pool == MAP_FAILED)
        fprintf(stderr, "transfer_bench: register failed (rc %d, reply type %d)\n", rc, rep.type);
    return b->pool && b->pool != MAP_FAILED ? 0 : -1;
}

/* Slots of a PREPARE_* reply ({"context": {"slots": [...]}}) -> offsets. */
static size_t slot_offsets(const msgpack_object *rep, uint64_t *offs, size_t cap)
{
    const msgpack_object *slots = lmc_mp_map_get(lmc_mp_map_get(rep, "context"), "slots");
    size_t n = 0;
    for (uint32_t i = 0; slots && i < slots->via.array.size && n < cap; i++)
        n += map_uint(&slots->via.array.ptr[i], "offset", &offs[n]);
    return n;
}

/* Request r's PREPARE_* / COMMIT_* arguments: key, instance id, and for
 * COMMIT_STORE the empty data frame. */
static void pack_transfer_args(const bench *b, msgpack_sbuffer args[3], const uint64_t *toks,
                               const char *rid)
{
    pack_key(&args[0], toks, b->batch * CS, 0, b->batch * CS, rid, true);
    pack_int(&args[1], INSTANCE);
    msgpack_sbuffer_init(&args[2]);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &args[2], msgpack_sbuffer_write);
    msgpack_pack_bin(&pk, 0);
}

/* One request of b->batch chunks: prepare, copy in (or out), commit. */
static int transfer(bench *b, const uint64_t *toks, const char *rid, uint8_t *data, bool store)
{
    msgpack_sbuffer args[3];
    pack_transfer_args(b, args, toks, rid);
    msgpack_zone zone;
    msgpack_zone_init(&zone, 8192);
    msgpack_object rep;
    uint64_t offs[MAX_BATCH];
    double t0 = now_s();
    int rc = call(b, store ? LMC_OP_PREPARE_STORE : LMC_OP_PREPARE_RETRIEVE, args, 2, &zone, &rep);
    size_t n = rc == 0 ? slot_offsets(&rep, offs, b->batch) : 0;
    double t1 = now_s();
    for (size_t i = 0; i < n; i++) {
        if (store)
            memcpy(b->pool + offs[i], data + i * OBJ, OBJ);
        else
            memcpy(data + i * OBJ, b->pool + offs[i], OBJ);
    }
    double t2 = now_s();
    if (rc == 0)
        rc = call(b, store ? LMC_OP_COMMIT_STORE : LMC_OP_COMMIT_RETRIEVE, args, store ? 3 : 2,
                  NULL, &rep);
    b->rpc_s += (t1 - t0) + (now_s() - t2);
    b->copy_s += t2 - t1;
    msgpack_zone_destroy(&zone);
    for (int i = 0; i < 3; i++)
        msgpack_sbuffer_destroy(&args[i]);
    return rc == 0 && n == b->batch ? 0 : -1;
}

/* LOOKUP + QUERY_PREFETCH_STATUS; returns the hit chunks or -1.  When
 * `lookup_s` is set, it receives the LOOKUP round trip alone. */
static int64_t lookup(bench *b, msgpack_sbuffer *key, const char *rid, double *lookup_s)
{
    msgpack_sbuffer args[2];
    args[0] = *key;
    pack_int(&args[1], 1);
    msgpack_zone zone;
    msgpack_zone_init(&zone, 256);
    msgpack_object rep;
    int64_t hits = -1;
    msgpack_sbuffer q;
    pack_str_arg(&q, rid);
    double t0 = now_s();
    int rc = call(b, LMC_OP_LOOKUP, args, 2, NULL, &rep);
    if (lookup_s)
        *lookup_s = now_s() - t0;
    if (rc == 0 && call(b, LMC_OP_QUERY_PREFETCH_STATUS, &q, 1, &zone, &rep) == 0)
        lmc_mp_get_int(&rep, &hits);
    msgpack_sbuffer_destroy(&args[1]);
    msgpack_sbuffer_destroy(&q);
    msgpack_zone_destroy(&zone);
    return hits;
}

static void fill_tokens(uint64_t *t, size_t n, uint64_t seed)
{
    for (size_t i = 0; i < n; i++)
        t[i] = (seed * 2654435761u + i * 40503u) % 128000;
}

static double process_cpu(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 + ru.ru_stime.tv_sec +
           ru.ru_stime.tv_usec / 1e6;
}

/* The server's CPU time so far: the child's clock, or (embedded) this
 * process's less the client thread's. */
static double server_cpu(const bench *b)
{
    if (b->server_pid)
        return cpu_s(b->server_clock);
    return process_cpu() - cpu_s(CLOCK_THREAD_CPUTIME_ID);
}

typedef struct {
    double wall, server_cpu;
    double p50;    /* one request, PREPARE + copy + COMMIT */
    long faults;   /* minor page faults of the whole process (client copies included) */
} phase;

static int cmp_double(const void *a, const void *b);

static long minor_faults(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_minflt;
}

/* Runs all requests of one direction; returns wall time and server CPU. */
static int run_phase(bench *b, uint64_t *toks, size_t reqs, uint8_t *data, bool store, phase *ph)
{
    double *lat = malloc((reqs ? reqs : 1) * sizeof *lat);
    if (!lat)
        return -1;
    double p0 = server_cpu(b), t0 = now_s();
    long f0 = minor_faults();
    char rid[32];
    for (size_t r = 0; r < reqs; r++) {
        snprintf(rid, sizeof rid, "req-%zu", r);
        double r0 = now_s();
        if (transfer(b, toks + r * b->batch * CS, rid, data + r * b->batch * OBJ, store) != 0) {
            free(lat);
            return -1;
        }
        lat[r] = now_s() - r0;
    }
    ph->wall = now_s() - t0;
    qsort(lat, reqs, sizeof *lat, cmp_double);
    ph->p50 = reqs ? lat[(reqs - 1) / 2] : 0;
    free(lat);
    ph->faults = minor_faults() - f0;
    ph->server_cpu = server_cpu(b) - p0;
    return 0;
}

typedef struct {
    size_t seen, ok;   /* COMMIT replies received, and those that were `true` */
} commit_count;

static void count_commit(commit_count *cc, const lmc_client_reply *r)
{
    cc->seen++;
    cc->ok += r->has_response && r->len == 1 && r->data[0] == 0xc3;
}

/* Waits for the reply to `uid`; replies to other uids are earlier COMMITs
 * (the only other requests in flight) and are counted. */
static int wait_reply(bench *b, uint64_t uid, msgpack_zone *zone, msgpack_object *out,
                      commit_count *cc)
{
    for (;;) {
        lmc_client_reply r;
        uint64_t got;
        if (lmc_client_receive(b->c, 10000, &got, &r) != LMC_CLIENT_OK)
            return -1;
        if (got != uid) {
            count_commit(cc, &r);
            lmc_client_reply_free(&r);
            continue;
        }
        out->type = MSGPACK_OBJECT_NIL;
        char *copy = r.has_response ? msgpack_zone_malloc(zone, r.len + 1) : NULL;
        size_t off = 0;
        if (copy) {
            memcpy(copy, r.data, r.len);
            msgpack_unpack(copy, r.len, &off, zone, out);
        }
        lmc_client_reply_free(&r);
        return 0;
    }
}

/* Like run_phase, but pipelined the way an engine with several requests
 * in a step drives the server: the PREPARE of request r+1 is in flight
 * while request r is copied, and COMMIT replies are collected as they
 * come instead of being waited for one by one. */
static int run_phase_pipelined(bench *b, uint64_t *toks, size_t reqs, uint8_t *data, bool store,
                               phase *ph)
{
    int prepare = store ? LMC_OP_PREPARE_STORE : LMC_OP_PREPARE_RETRIEVE;
    int commit = store ? LMC_OP_COMMIT_STORE : LMC_OP_COMMIT_RETRIEVE;
    msgpack_sbuffer (*args)[3] = calloc(reqs, sizeof *args);
    uint64_t *prep_uid = calloc(reqs, sizeof *prep_uid);
    if (!args || !prep_uid)
        return -1;
    char rid[32];
    for (size_t r = 0; r < reqs; r++) {
        snprintf(rid, sizeof rid, "req-%zu", r);
        pack_transfer_args(b, args[r], toks + r * b->batch * CS, rid);
    }
    double p0 = server_cpu(b), t0 = now_s();
    long f0 = minor_faults();
    commit_count cc = {0, 0};
    size_t copied = 0;
    int rc = (prep_uid[0] = lmc_client_send(b->c, prepare, args[0], 2)) ? 0 : -1;
    for (size_t r = 0; rc == 0 && r < reqs; r++) {
        msgpack_zone zone;
        msgpack_zone_init(&zone, 8192);
        msgpack_object rep;
        uint64_t offs[MAX_BATCH];
        rc = wait_reply(b, prep_uid[r], &zone, &rep, &cc);
        size_t n = rc == 0 ? slot_offsets(&rep, offs, b->batch) : 0;
        if (rc == 0 && r + 1 < reqs && !(prep_uid[r + 1] = lmc_client_send(b->c, prepare, args[r + 1], 2)))
            rc = -1;
        uint8_t *req_data = data + r * b->batch * OBJ;
        for (size_t i = 0; i < n; i++) {
            if (store)
                memcpy(b->pool + offs[i], req_data + i * OBJ, OBJ);
            else
                memcpy(req_data + i * OBJ, b->pool + offs[i], OBJ);
        }
        copied += n;
        if (rc == 0 && !lmc_client_send(b->c, commit, args[r], store ? 3 : 2))
            rc = -1;
        msgpack_zone_destroy(&zone);
    }
    while (rc == 0 && cc.seen < reqs) { /* the last COMMIT replies */
        lmc_client_reply r;
        uint64_t got;
        rc = lmc_client_receive(b->c, 10000, &got, &r) == LMC_CLIENT_OK ? 0 : -1;
        if (rc == 0)
            count_commit(&cc, &r);
        lmc_client_reply_free(&r);
    }
    ph->wall = now_s() - t0;
    ph->faults = minor_faults() - f0;
    ph->server_cpu = server_cpu(b) - p0;
    for (size_t r = 0; r < reqs; r++)
        for (int i = 0; i < 3; i++)
            msgpack_sbuffer_destroy(&args[r][i]);
    free(args);
    free(prep_uid);
    return rc == 0 && copied == reqs * b->batch && cc.ok == reqs ? 0 : -1;
}

static int cmp_double(const void *a, const void *b);

/* PREPARE_STORE of chunks that are all cached already (an empty slot
 * list): the request's fixed cost with no copy and no reservation. */
static double prepare_cached_p50(bench *b, const uint64_t *toks, size_t iters)
{
    double lat[256];
    iters = iters > 256 ? 256 : iters;
    for (size_t i = 0; i < iters; i++) {
        msgpack_sbuffer args[2];
        pack_key(&args[0], toks, b->batch * CS, 0, b->batch * CS, "req-0", true);
        pack_int(&args[1], INSTANCE);
        msgpack_object rep;
        double t0 = now_s();
        call(b, LMC_OP_PREPARE_STORE, args, 2, NULL, &rep);
        lat[i] = now_s() - t0;
        for (int k = 0; k < 2; k++)
            msgpack_sbuffer_destroy(&args[k]);
    }
    qsort(lat, iters, sizeof *lat, cmp_double);
    return lat[iters / 2];
}

static int lookup_all(bench *b, uint64_t *toks, size_t reqs)
{
    char rid[32];
    for (size_t r = 0; r < reqs; r++) {
        msgpack_sbuffer key;
        snprintf(rid, sizeof rid, "req-%zu", r);
        pack_key(&key, toks + r * b->batch * CS, b->batch * CS, 0, b->batch * CS, rid, false);
        int64_t h = lookup(b, &key, rid, NULL);
        msgpack_sbuffer_destroy(&key);
        if (h != (int64_t)b->batch)
            return -1;
    }
    return 0;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* An engine stores from and retrieves into KV buffers it uses every step, so
 * each phase starts with its client buffer freshly touched, as the memcpy
 * baseline finds it.  Untouched since the start of the run, dst had gone
 * cold on the paravirtualized VM this was measured on: the first write to
 * each of its pages cost 0.2-0.8 us with no guest page fault counted, which
 * halved the one-request-at-a-time retrieve (BENCHMARKS.md). */
static void touch_pages(uint8_t *buf, size_t bytes, bool write)
{
    volatile uint8_t sink = 0;
    for (size_t i = 0; i < bytes; i += 4096) {
        if (write)
            buf[i] = (uint8_t)i;
        else
            sink += buf[i];
    }
    (void)sink;
}

/* One request's pattern with the bare echo in lmcached's place: a round
 * trip, the request's copies (src -> dst), a round trip.  What one request
 * at a time can reach on this machine with any ZMQ server.  Returns the
 * wall time, or -1 if the echo did not answer. */
static double echo_pattern(bench *b, size_t reqs, const uint8_t *src, uint8_t *dst,
                           double *rpc_s, double *copy_s)
{
    lmc_client_reply rep;   /* a first round trip connects, unmeasured */
    if (lmc_client_call(b->echo, LMC_OP_NOOP, NULL, 0, 10000, &rep) != LMC_CLIENT_OK)
        return -1;
    lmc_client_reply_free(&rep);
    double t0 = now_s();
    *rpc_s = *copy_s = 0;
    for (size_t r = 0; r < reqs; r++) {
        double t[4];
        for (int trip = 0; trip < 2; trip++) {
            t[2 * trip] = now_s();
            if (lmc_client_call(b->echo, LMC_OP_NOOP, NULL, 0, 10000, &rep) != LMC_CLIENT_OK)
                return -1;
            lmc_client_reply_free(&rep);
            t[2 * trip + 1] = now_s();
            for (size_t i = 0; trip == 0 && i < b->batch; i++) {
                size_t at = (r * b->batch + i) * OBJ;
                memcpy(dst + at, src + at, OBJ);
            }
        }
        *rpc_s += (t[1] - t[0]) + (t[3] - t[2]);
        *copy_s += t[2] - t[1];
    }
    return now_s() - t0;
}

static int bandwidth(bench *b, size_t chunks)
{
    size_t reqs = chunks / b->batch, bytes = reqs * b->batch * OBJ;
    uint64_t *toks = malloc(reqs * b->batch * CS * sizeof *toks);
    uint8_t *src = malloc(bytes), *dst = malloc(bytes);
    if (!toks || !src || !dst)
        return -1;
    fill_tokens(toks, reqs * b->batch * CS, 1);
    memset(dst, 0xa5, bytes);   /* non-zero: malloc+memset(0) may become calloc (untouched pages) */
    for (size_t i = 0; i < bytes; i++)
        src[i] = (uint8_t)(i * 131 + (i >> 12));
    phase st, rt, pst, prt;
    double st_rpc = 0, st_copy = 0;
    /* Warm-up store: this process maps the pool pages on first touch. */
    if (run_phase(b, toks, reqs, src, true, &st) != 0)
        return -1;
    msgpack_sbuffer clr;
    msgpack_packer pk;
    msgpack_sbuffer_init(&clr);
    msgpack_packer_init(&pk, &clr, msgpack_sbuffer_write);
    msgpack_pack_true(&pk);
    msgpack_object rep;
    call(b, LMC_OP_CLEAR, &clr, 1, NULL, &rep);
    b->rpc_s = b->copy_s = 0;
    touch_pages(src, bytes, false);
    if (run_phase(b, toks, reqs, src, true, &st) != 0)
        return -1;
    st_rpc = b->rpc_s, st_copy = b->copy_s;
    b->rpc_s = b->copy_s = 0;
    if (lookup_all(b, toks, reqs) != 0)
        return -1;
    touch_pages(dst, bytes, true);
    if (run_phase(b, toks, reqs, dst, false, &rt) != 0)
        return -1;
    double cached_p50 = prepare_cached_p50(b, toks, 200);
    int same = memcmp(src, dst, bytes) == 0;
    double echo_rpc, echo_copy;
    touch_pages(dst, bytes, true);
    double echo_wall = echo_pattern(b, reqs, src, dst, &echo_rpc, &echo_copy);
    if (echo_wall < 0)
        return -1;
    /* Again, pipelined, from an empty cache. */
    memset(dst, 0x5a, bytes);
    call(b, LMC_OP_CLEAR, &clr, 1, NULL, &rep);
    msgpack_sbuffer_destroy(&clr);
    touch_pages(src, bytes, false);
    if (run_phase_pipelined(b, toks, reqs, src, true, &pst) != 0 || lookup_all(b, toks, reqs) != 0)
        return -1;
    touch_pages(dst, bytes, true);
    if (run_phase_pipelined(b, toks, reqs, dst, false, &prt) != 0)
        return -1;
    same = same && memcmp(src, dst, bytes) == 0;
    double t0 = now_s();
    memcpy(dst, src, bytes);
    double mc = now_s() - t0;
    double gib = bytes / (double)(1u << 30);
    printf("chunks: %zu x %zu B in requests of %zu (%.2f GiB), retrieved bytes %s\n",
           reqs * b->batch, OBJ, b->batch, gib, same ? "identical" : "DIFFER");
    printf("memcpy (1 thread)   : %7.2f GiB/s\n", gib / mc);
    printf("one request at a time (PREPARE, copy, COMMIT, wait):\n");
    printf("store  (prep+copy+commit): %7.2f GiB/s = %.2fx memcpy (goal >= 0.8x)\n",
           gib / st.wall, (gib / st.wall) / (gib / mc));
    printf("retrieve (prep+copy+commit): %7.2f GiB/s = %.2fx memcpy (goal >= 0.8x)\n",
           gib / rt.wall, (gib / rt.wall) / (gib / mc));
    printf("same pattern, bare ZMQ echo instead: %7.2f GiB/s = %.2fx memcpy "
           "(echo rpc %.0f us + copy %.0f us per request)\n",
           gib / echo_wall, (gib / echo_wall) / (gib / mc), echo_rpc * 1e6 / reqs,
           echo_copy * 1e6 / reqs);
    printf("pipelined store     : %7.2f GiB/s = %.2fx memcpy (goal >= 0.8x)\n",
           gib / pst.wall, (gib / pst.wall) / (gib / mc));
    printf("pipelined retrieve  : %7.2f GiB/s = %.2fx memcpy (goal >= 0.8x)\n",
           gib / prt.wall, (gib / prt.wall) / (gib / mc));
    printf("per request of %zu chunks: store rpc %.0f us + copy %.0f us, "
           "retrieve rpc %.0f us + copy %.0f us\n", b->batch, st_rpc * 1e6 / reqs,
           st_copy * 1e6 / reqs, b->rpc_s * 1e6 / reqs, b->copy_s * 1e6 / reqs);
    printf("PREPARE_STORE of %zu cached chunks (no slots): p50 %.0f us\n", b->batch,
           cached_p50 * 1e6);
    printf("STORE request p50 (PREPARE + copy + COMMIT of %zu chunks): %.0f us; "
           "RETRIEVE: %.0f us\n", b->batch, st.p50 * 1e6, rt.p50 * 1e6);
    printf("page faults per chunk: store %.1f, retrieve %.1f\n",
           (double)st.faults / (reqs * b->batch), (double)rt.faults / (reqs * b->batch));
    printf("server CPU per chunk: store %.2f us, retrieve %.2f us (pipelined: %.2f, %.2f)\n",
           st.server_cpu * 1e6 / (reqs * b->batch), rt.server_cpu * 1e6 / (reqs * b->batch),
           pst.server_cpu * 1e6 / (reqs * b->batch), prt.server_cpu * 1e6 / (reqs * b->batch));
    free(toks);
    free(src);
    free(dst);
    return same ? 0 : -1;
}

static double pct(double *v, size_t n, double p)
{
    return v[(size_t)(p * (n - 1))];
}

/* Stores the 32k-token prompt the lookup phase looks for. */
static void store_prompt(bench *b, const uint64_t *toks)
{
    for (size_t c = 0; c < LOOKUP_TOKENS / CS; c += BATCH) {
        msgpack_sbuffer args[3];
        pack_key(&args[0], toks, LOOKUP_TOKENS, c * CS, (c + BATCH) * CS, "L", true);
        pack_int(&args[1], INSTANCE);
        msgpack_sbuffer_init(&args[2]);
        msgpack_packer pk;
        msgpack_packer_init(&pk, &args[2], msgpack_sbuffer_write);
        msgpack_pack_bin(&pk, 0);
        msgpack_object rep;
        call(b, LMC_OP_PREPARE_STORE, args, 2, NULL, &rep);
        call(b, LMC_OP_COMMIT_STORE, args, 3, NULL, &rep);
        for (int i = 0; i < 3; i++)
            msgpack_sbuffer_destroy(&args[i]);
    }
}

typedef struct {
    double server_cpu, faults;   /* per cycle */
} cycle_cost;

/* `iters` scheduler cycles: LOOKUP + QUERY (timed into lat[]), then
 * FREE_LOOKUP_LOCKS and END_SESSION.  `fresh`: pack a new key (request id
 * lat-i) before each cycle, as a scheduler does; otherwise pack one key
 * (request id "lat") once: END_SESSION ends its session every cycle, so
 * each LOOKUP still starts a new one, and the timing leaves out the
 * client's own packing and its cache traffic. */
/* Times `iters` LOOKUP + QUERY cycles into lat[] (sorted on return); the
 * LOOKUP and QUERY round trips alone go to split[] (p50 of each). */
static int lookup_cycles(bench *b, const uint64_t *toks, size_t iters, bool fresh, double *lat,
                         double split[2], cycle_cost *cost, double *between)
{
    double *lk = malloc(iters * sizeof *lk), *qy = malloc(iters * sizeof *qy);
    if (!lk || !qy) {
        free(lk);
        free(qy);
        return -1;
    }
    char rid[32] = "lat";
    msgpack_sbuffer key, end, readers;
    pack_key(&key, toks, LOOKUP_TOKENS, 0, LOOKUP_TOKENS, rid, false);
    pack_int(&readers, 1);
    double p0 = server_cpu(b);
    long f0 = minor_faults();
    int rc = 0;
    for (size_t i = 0; rc == 0 && i < iters; i++) {
        if (fresh) {
            msgpack_sbuffer_destroy(&key);
            snprintf(rid, sizeof rid, "lat-%zu", i);
            pack_key(&key, toks, LOOKUP_TOKENS, 0, LOOKUP_TOKENS, rid, false);
        }
        double t0 = now_s();
        int64_t h = lookup(b, &key, rid, &lk[i]);
        lat[i] = now_s() - t0;
        qy[i] = lat[i] - lk[i];
        if (h != LOOKUP_TOKENS / CS)
            rc = -1;
        msgpack_object rep;
        msgpack_sbuffer args[2] = {key, readers};
        call(b, LMC_OP_FREE_LOOKUP_LOCKS, args, 2, NULL, &rep);
        pack_str_arg(&end, rid);
        call(b, LMC_OP_END_SESSION, &end, 1, NULL, &rep);
        msgpack_sbuffer_destroy(&end);
        if (between) {   /* a NOOP in the same stretch of time as this cycle */
            double n0 = now_s();
            call(b, LMC_OP_NOOP, NULL, 0, NULL, &rep);
            between[i] = now_s() - n0;
        }
    }
    cost->server_cpu = (server_cpu(b) - p0) / iters;
    cost->faults = (double)(minor_faults() - f0) / iters;
    msgpack_sbuffer_destroy(&key);
    msgpack_sbuffer_destroy(&readers);
    qsort(lat, iters, sizeof *lat, cmp_double);
    qsort(lk, iters, sizeof *lk, cmp_double);
    qsort(qy, iters, sizeof *qy, cmp_double);
    split[0] = pct(lk, iters, 0.5);
    split[1] = pct(qy, iters, 0.5);
    free(lk);
    free(qy);
    return rc;
}

/* A NOOP carrying the LOOKUP's key frame (carry[]), then a QUERY (bare[]
 * from the NOOP's start): LOOKUP+QUERY if the LOOKUP handler took no time. */
static void transport_floor(bench *b, const uint64_t *toks, size_t iters, double *carry,
                            double *bare, size_t *key_bytes)
{
    msgpack_sbuffer key, q;
    pack_key(&key, toks, LOOKUP_TOKENS, 0, LOOKUP_TOKENS, "lat", false);
    pack_str_arg(&q, "no-such-request");
    *key_bytes = key.size;
    for (size_t i = 0; i < iters; i++) {
        msgpack_object rep;
        double t0 = now_s();
        call(b, LMC_OP_NOOP, &key, 1, NULL, &rep);
        carry[i] = now_s() - t0;
        call(b, LMC_OP_QUERY_PREFETCH_STATUS, &q, 1, NULL, &rep);
        bare[i] = now_s() - t0;
    }
    qsort(carry, iters, sizeof *carry, cmp_double);
    qsort(bare, iters, sizeof *bare, cmp_double);
    msgpack_sbuffer_destroy(&key);
    msgpack_sbuffer_destroy(&q);
}

/* Stores a 32k-token prompt, then times LOOKUP+QUERY against NOOP. */
static int lookup_latency(bench *b, size_t iters)
{
    uint64_t *toks = malloc(LOOKUP_TOKENS * sizeof *toks);
    double *lat = malloc(iters * sizeof *lat), *fresh = malloc(iters * sizeof *fresh),
           *noop = malloc(iters * sizeof *noop), *carry = malloc(iters * sizeof *carry),
           *bare = malloc(iters * sizeof *bare), *paired = malloc(iters * sizeof *paired),
           *between = malloc(iters * sizeof *between);
    int rc = -1;
    cycle_cost cost, fresh_cost, paired_cost;
    double split[2], fresh_split[2], paired_split[2];
    size_t key_bytes;
    if (!toks || !lat || !fresh || !noop || !carry || !bare || !paired || !between)
        goto out;
    fill_tokens(toks, LOOKUP_TOKENS, 7);
    store_prompt(b, toks);
    if (lookup_cycles(b, toks, iters, false, lat, split, &cost, NULL) != 0 ||
        lookup_cycles(b, toks, iters, true, fresh, fresh_split, &fresh_cost, NULL) != 0 ||
        lookup_cycles(b, toks, iters, false, paired, paired_split, &paired_cost, between) != 0)
        goto out;
    qsort(between, iters, sizeof *between, cmp_double);
    for (size_t i = 0; i < iters; i++) {
        msgpack_object rep;
        double t0 = now_s();
        call(b, LMC_OP_NOOP, NULL, 0, NULL, &rep);
        noop[i] = now_s() - t0;
    }
    qsort(noop, iters, sizeof *noop, cmp_double);
    transport_floor(b, toks, iters, carry, bare, &key_bytes);
    printf("LOOKUP+QUERY (32768 tokens, 128 chunks hit): p50 %.1f us, p99 %.1f us\n",
           pct(lat, iters, 0.5) * 1e6, pct(lat, iters, 0.99) * 1e6);
    printf("  LOOKUP alone p50 %.1f us, then QUERY p50 %.1f us\n", split[0] * 1e6,
           split[1] * 1e6);
    printf("  same, key packed afresh before each cycle : p50 %.1f us, p99 %.1f us "
           "(LOOKUP %.1f, QUERY %.1f)\n", pct(fresh, iters, 0.5) * 1e6,
           pct(fresh, iters, 0.99) * 1e6, fresh_split[0] * 1e6, fresh_split[1] * 1e6);
    printf("NOOP round trip                            : p50 %.1f us, p99 %.1f us\n",
           pct(noop, iters, 0.5) * 1e6, pct(noop, iters, 0.99) * 1e6);
    printf("NOOP carrying the key (%zu B): p50 %.1f us; it + QUERY: p50 %.1f us\n", key_bytes,
           pct(carry, iters, 0.5) * 1e6, pct(bare, iters, 0.5) * 1e6);
    printf("ratio p50 = %.2fx NOOP (goal <= 3x); key packed afresh: %.2fx; transport floor: "
           "%.2fx\n", pct(lat, iters, 0.5) / pct(noop, iters, 0.5),
           pct(fresh, iters, 0.5) / pct(noop, iters, 0.5),
           pct(bare, iters, 0.5) / pct(noop, iters, 0.5));
    printf("paired: a NOOP after each cycle, p50 %.1f us; that run's LOOKUP+QUERY p50 %.1f us "
           "= %.2fx\n", pct(between, iters, 0.5) * 1e6, pct(paired, iters, 0.5) * 1e6,
           pct(paired, iters, 0.5) / pct(between, iters, 0.5));
    printf("server CPU per lookup cycle (LOOKUP+QUERY+FREE+END): %.1f us, %.1f page faults\n",
           cost.server_cpu * 1e6, cost.faults);
    rc = 0;
out:
    free(paired);
    free(between);
    free(toks);
    free(lat);
    free(fresh);
    free(noop);
    free(carry);
    free(bare);
    return rc;
}

static void *serve(void *arg)
{
    pthread_setname_np(pthread_self(), "lmc-socket");   /* tells it from the client in perf */
    lmc_server_run(arg, -1);
    return NULL;
}

/* ---- the server and the echo baseline: threads here, or child processes */

/* A child blocks SIGTERM before it starts any thread (threads inherit the
 * mask), so that only its sigwait() receives the parent's SIGTERM. */
static void block_term(sigset_t *term)
{
    sigemptyset(term);
    sigaddset(term, SIGTERM);
    pthread_sigmask(SIG_BLOCK, term, NULL);
}

static int echo_child(const char *url)
{
    sigset_t term;
    block_term(&term);
    echo_server e;
    if (echo_start(&e, url) != 0)
        return 1;
    int sig;
    sigwait(&term, &sig);
    echo_stop(&e);
    return 0;
}

typedef struct {
    bool child;              /* --server-process: both run in child processes */
    lmc_server *srv;         /* embedded */
    pthread_t srv_thread;
    echo_server echo;        /* embedded */
    pid_t echo_pid;
} servers;

/* Starts lmcached (cfg) and the bare echo (echo_url), before any thread of
 * this process exists when they are children.  0 or -1. */
static int start_servers(servers *sv, lmc_config *cfg, const char *echo_url, bench *b)
{
    if (sv->child) {
        b->server_pid = bench_server_fork(cfg);
        if (b->server_pid > 0 && (sv->echo_pid = fork()) == 0)
            _exit(echo_child(echo_url));
        return b->server_pid > 0 && sv->echo_pid > 0 &&
                       clock_getcpuclockid(b->server_pid, &b->server_clock) == 0
                   ? 0
                   : -1;
    }
    char err[256];
    if (lmc_server_new(cfg, &sv->srv, err, sizeof err) != 0) {
        fprintf(stderr, "transfer_bench: %s\n", err);
        return -1;
    }
    if (pthread_create(&sv->srv_thread, NULL, serve, sv->srv) != 0) {
        lmc_server_free(sv->srv);
        sv->srv = NULL;
        return -1;
    }
    return echo_start(&sv->echo, echo_url);
}

static void stop_servers(servers *sv, bench *b)
{
    if (sv->child) {
        bench_server_kill(b->server_pid);
        bench_server_kill(sv->echo_pid);
        return;
    }
    echo_stop(&sv->echo);
    if (sv->srv) {
        lmc_server_stop(sv->srv);
        pthread_join(sv->srv_thread, NULL);
        lmc_server_free(sv->srv);
    }
}

int main(int argc, char **argv)
{
    /* Same malloc policy as lmcached's main(): request buffers stay in the
     * reusable heap instead of fresh mmaps. */
    mallopt(M_MMAP_THRESHOLD, 64 << 20);
    mallopt(M_TRIM_THRESHOLD, 256 << 20);
    size_t chunks = 256, iters = 2000, batch = BATCH;
    bool server_process = false;
    const char *kv_log = "32768";
    const char *trace_output = NULL, *publish = NULL, *vllm_block = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--server-process") == 0)
            server_process = true;
        else if (i + 1 < argc && strcmp(argv[i], "--chunks") == 0)
            chunks = strtoul(argv[++i], NULL, 10);
        else if (i + 1 < argc && strcmp(argv[i], "--iters") == 0)
            iters = strtoul(argv[++i], NULL, 10);
        else if (i + 1 < argc && strcmp(argv[i], "--batch") == 0)
            batch = strtoul(argv[++i], NULL, 10);
        else if (i + 1 < argc && strcmp(argv[i], "--kv-event-log-size") == 0)
            kv_log = argv[++i];
        else if (i + 1 < argc && strcmp(argv[i], "--trace-output") == 0)
            trace_output = argv[++i];
        else if (i + 1 < argc && strcmp(argv[i], "--kv-events-publish") == 0)
            publish = argv[++i];
        else if (i + 1 < argc && strcmp(argv[i], "--kv-events-block-size") == 0)
            vllm_block = argv[++i];
        else
            batch = 0;   /* unknown argument: usage */
    }
    if (batch < 1 || batch > MAX_BATCH || chunks < batch || iters < 2 ||
        (vllm_block && !publish)) {
        fprintf(stderr, "usage: transfer_bench [--chunks N>=batch] [--iters M>=2] "
                        "[--batch 1..%d] [--server-process] [--kv-event-log-size N] "
                        "[--trace-output FILE] "
                        "[--kv-events-publish URL [--kv-events-block-size N]]\n",
                MAX_BATCH);
        return 1;
    }
    chunks = chunks / batch * batch;
    char port[16], http_port[16], l1[32], echo_url[64];
    snprintf(port, sizeof port, "%d", 20000 + getpid() % 20000);
    snprintf(echo_url, sizeof echo_url, "tcp://127.0.0.1:%d", 20001 + getpid() % 20000);
    snprintf(http_port, sizeof http_port, "%d", 40001 + getpid() % 20000);
    snprintf(l1, sizeof l1, "%.3f", (chunks * OBJ + 160.0 * OBJ) / (1u << 30) + 0.25);
    char *args[] = {"lmcached", "--host", "127.0.0.1", "--port", port, "--chunk-size", "256",
                    "--l1-size-gb", l1, "--eviction-policy", "LRU", "--log-level", "WARNING",
                    "--max-workers", "2", "--http-host", "127.0.0.1", "--http-port", http_port,
                    "--kv-event-log-size", (char *)kv_log, NULL, NULL, NULL, NULL, NULL,
                    NULL, NULL, NULL, NULL, NULL, NULL, NULL};
    int nargs = 21;
    if (trace_output) {
        args[nargs++] = "--trace-level";
        args[nargs++] = "storage";
        args[nargs++] = "--trace-output";
        args[nargs++] = (char *)trace_output;
    }
    if (publish) {
        args[nargs++] = "--kv-events-publish-endpoint";
        args[nargs++] = (char *)publish;
    }
    if (vllm_block) {
        args[nargs++] = "--kv-events-block-size";
        args[nargs++] = (char *)vllm_block;
        args[nargs++] = "--kv-events-hash-seed";
        args[nargs++] = "0";
    }
    lmc_config cfg;
    char err[256];
    servers sv = {.child = server_process};
    bench b = {.batch = batch};
    if (lmc_config_parse(&cfg, nargs, args, NULL, stdout, err,
                         sizeof err) != LMC_CONFIG_OK) {
        fprintf(stderr, "transfer_bench: %s\n", err);
        return 1;
    }
    if (start_servers(&sv, &cfg, echo_url, &b) != 0) {
        fprintf(stderr, "transfer_bench: cannot start the server or the echo\n");
        stop_servers(&sv, &b);
        lmc_config_free(&cfg);
        return 1;
    }
    printf("server and echo: %s\n",
           server_process ? "child processes" : "embedded (threads of this process)");
    char url[64];
    snprintf(url, sizeof url, "tcp://127.0.0.1:%s", port);
    b.c = lmc_client_connect(url);
    b.echo = lmc_client_connect(echo_url);
    int rc = !b.c || !b.echo || register_worker(&b) != 0 || bandwidth(&b, chunks) != 0 ||
             lookup_latency(&b, iters) != 0;
    if (rc)
        fprintf(stderr, "transfer_bench: a request failed\n");
    if (b.pool)
        munmap(b.pool, b.pool_size);
    lmc_client_close(b.c);
    lmc_client_close(b.echo);
    stop_servers(&sv, &b);
    lmc_config_free(&cfg);
    return rc;
}
