/* l2_lookup_bench: LOOKUP + WAIT_PREFETCH_STATUS over RPC with every chunk
 * of a prompt in an fs L2 tier only (issue 18), against the disk and
 * against a memcpy.
 *
 *   l2_lookup_bench [--dir DIR] [--reps R]
 *
 * lmcached runs in a child process (bench/common/server_child.h) with an
 * fs adapter on DIR (default ./l2_lookup_bench.dir, emptied at the start
 * and removed at the end).  A worker stores a 32,768-token prompt through
 * the engine-driven path (128 chunks of 2 MiB: 8 layers x 256 tokens x 256
 * hidden x K/V x fp16, 256 MiB); once write-behind has put every chunk in
 * DIR, each repetition runs, in alternating order within each pair:
 *
 *   cold  CLEAR (force) + the files dropped from the page cache (fdatasync
 *         + POSIX_FADV_DONTNEED on each .data file), then the scheduler's
 *         LOOKUP and WAIT_PREFETCH_STATUS until all 128 chunks hit, timed
 *         from sending LOOKUP to the hit count; vs an O_DIRECT read loop
 *         of the same files (goal: lmcached <= 1.2x its time);
 *   warm  the same with the files in the page cache; vs a memcpy of 256
 *         MiB between pre-faulted buffers (goal: <= 2x its time).
 *
 * After each timed LOOKUP the scheduler frees the locks and ends the
 * request, and the next CLEAR drops the loaded copies (docs/protocol.md,
 * "Lookup and prefetch ops"). */
#include <dirent.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/server_child.h"
#include "config/config.h"
#include "rpc/client.h"
#include "rpc/wire.h"

#define CS 256
#define LAYERS 8
#define HIDDEN 256
#define OBJ ((size_t)2 * LAYERS * CS * HIDDEN * 2)   /* 2 MiB */
#define CHUNKS 128
#define TOKENS (CHUNKS * CS)
#define BATCH 16                                     /* chunks per PREPARE_STORE */
#define INSTANCE 4343

typedef struct {
    const char *dir;
    lmc_client *c;
    uint8_t *pool;
    size_t pool_size;
    uint64_t toks[TOKENS];
} bench;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void die(const char *what)
{
    fprintf(stderr, "l2_lookup_bench: %s\n", what);
    exit(1);
}

static void sb_start(msgpack_sbuffer *sb, msgpack_packer *pk)
{
    msgpack_sbuffer_init(sb);
    msgpack_packer_init(pk, sb, msgpack_sbuffer_write);
}

/* An IPCCacheServerKey (docs/protocol.md, "Keys"); worker -1: the scheduler. */
static void pack_key(msgpack_sbuffer *sb, const uint64_t *toks, size_t start, size_t end,
                     const char *rid, int worker)
{
    msgpack_packer pk;
    sb_start(sb, &pk);
    msgpack_pack_map(&pk, 8);
    lmc_mp_pack_cstr(&pk, "model_name"), lmc_mp_pack_cstr(&pk, "bench-model");
    lmc_mp_pack_cstr(&pk, "world_size"), msgpack_pack_int(&pk, 1);
    lmc_mp_pack_cstr(&pk, "worker_id");
    worker < 0 ? msgpack_pack_nil(&pk) : msgpack_pack_int(&pk, worker);
    lmc_mp_pack_cstr(&pk, "token_ids"), msgpack_pack_array(&pk, (uint32_t)end);
    for (size_t i = 0; i < end; i++)
        msgpack_pack_uint64(&pk, toks[i]);
    lmc_mp_pack_cstr(&pk, "start"), msgpack_pack_uint64(&pk, start);
    lmc_mp_pack_cstr(&pk, "end"), msgpack_pack_uint64(&pk, end);
    lmc_mp_pack_cstr(&pk, "request_id"), lmc_mp_pack_cstr(&pk, rid);
    lmc_mp_pack_cstr(&pk, "cache_salt"), lmc_mp_pack_cstr(&pk, "");
}

/* Calls op and unpacks the reply into `zone` (nil when None or failed). */
static int call(bench *b, int op, const msgpack_sbuffer *args, size_t n, msgpack_zone *zone,
                msgpack_object *out, int timeout_ms)
{
    lmc_client_reply r;
    out->type = MSGPACK_OBJECT_NIL;
    if (lmc_client_call(b->c, op, args, n, timeout_ms, &r) != LMC_CLIENT_OK)
        return -1;
    char *copy = r.has_response ? msgpack_zone_malloc(zone, r.len + 1) : NULL;
    size_t off = 0;
    if (copy) {   /* unpacked strings point into the buffer */
        memcpy(copy, r.data, r.len);
        msgpack_unpack(copy, r.len, &off, zone, out);
    }
    lmc_client_reply_free(&r);
    return 0;
}

static void map_pool(bench *b, const msgpack_object *rep)
{
    const char *name;
    size_t len;
    uint64_t size;
    const msgpack_object *n = lmc_mp_map_get(rep, "shm_name");
    const msgpack_object *s = lmc_mp_map_get(rep, "pool_size");
    if (!n || !lmc_mp_get_str(n, &name, &len) || !len || !s || !lmc_mp_get_uint(s, &size))
        die("register: no pool in the reply");
    char path[300];
    snprintf(path, sizeof path, "/dev/shm/%.*s", (int)len, name);
    int fd = open(path, O_RDWR);
    b->pool = fd >= 0 ? mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : MAP_FAILED;
    if (fd >= 0)
        close(fd);
    if (b->pool == MAP_FAILED)
        die("cannot map the pool");
    b->pool_size = size;
}

static void register_worker(bench *b)
{
    msgpack_sbuffer sb;
    msgpack_packer pk;
    sb_start(&sb, &pk);
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
    if (call(b, LMC_OP_REGISTER_KV_CACHE_ENGINE_DRIVEN_CONTEXT, &sb, 1, &zone, &rep, 10000) != 0)
        die("register failed");
    map_pool(b, &rep);
    msgpack_zone_destroy(&zone);
    msgpack_sbuffer_destroy(&sb);
}

/* Chunks [c0, c0 + BATCH): PREPARE_STORE, fill the slots, COMMIT_STORE. */
static void store_batch(bench *b, size_t c0)
{
    msgpack_sbuffer args[3];
    msgpack_packer pk;
    pack_key(&args[0], b->toks, c0 * CS, (c0 + BATCH) * CS, "store", 0);
    sb_start(&args[1], &pk);
    msgpack_pack_int(&pk, INSTANCE);
    sb_start(&args[2], &pk);
    msgpack_pack_bin(&pk, 0);
    msgpack_zone zone;
    msgpack_zone_init(&zone, 8192);
    msgpack_object rep;
    if (call(b, LMC_OP_PREPARE_STORE, args, 2, &zone, &rep, 10000) != 0)
        die("PREPARE_STORE failed");
    const msgpack_object *slots = lmc_mp_map_get(lmc_mp_map_get(&rep, "context"), "slots");
    size_t n = 0;
    for (uint32_t i = 0; slots && slots->type == MSGPACK_OBJECT_ARRAY && i < slots->via.array.size; i++) {
        uint64_t off;
        const msgpack_object *o = lmc_mp_map_get(&slots->via.array.ptr[i], "offset");
        if (!o || !lmc_mp_get_uint(o, &off) || off + OBJ > b->pool_size)
            die("PREPARE_STORE: bad slot");
        memset(b->pool + off, (int)(c0 + i + 1), OBJ);
        n++;
    }
    if (n != BATCH || call(b, LMC_OP_COMMIT_STORE, args, 3, &zone, &rep, 10000) != 0 ||
        rep.type != MSGPACK_OBJECT_BOOLEAN || !rep.via.boolean)
        die("store failed");
    msgpack_zone_destroy(&zone);
    for (int i = 0; i < 3; i++)
        msgpack_sbuffer_destroy(&args[i]);
}

/* The .data files of the directory (full paths, at most CHUNKS). */
static size_t data_files(const char *dir, char paths[][4096])
{
    DIR *d = opendir(dir);
    struct dirent *e;
    size_t n = 0;
    while (d && (e = readdir(d)) != NULL) {
        size_t len = strlen(e->d_name);
        if (len > 5 && strcmp(e->d_name + len - 5, ".data") == 0 && n < CHUNKS)
            snprintf(paths[n++], 4096, "%s/%s", dir, e->d_name);
    }
    if (d)
        closedir(d);
    return n;
}

/* Stores the prompt and waits until write-behind put every chunk in DIR. */
static void store_prompt(bench *b, char paths[][4096])
{
    double t0 = now_s();
    for (size_t c = 0; c < CHUNKS; c += BATCH)
        store_batch(b, c);
    while (data_files(b->dir, paths) < CHUNKS) {
        if (now_s() - t0 > 300)
            die("write-behind did not finish in 300 s");
        usleep(20000);
    }
    printf("stored %d chunks of %zu MiB; write-behind done after %.2f s\n", CHUNKS, OBJ >> 20,
           now_s() - t0);
}

static void simple_call(bench *b, int op, const msgpack_sbuffer *args, size_t n)
{
    msgpack_zone zone;
    msgpack_zone_init(&zone, 256);
    msgpack_object rep;
    if (call(b, op, args, n, &zone, &rep, 30000) != 0)
        die("a request failed");
    msgpack_zone_destroy(&zone);
}

static void clear_l1(bench *b)
{
    msgpack_sbuffer sb;
    msgpack_packer pk;
    sb_start(&sb, &pk);
    msgpack_pack_true(&pk);   /* force */
    simple_call(b, LMC_OP_CLEAR, &sb, 1);
    msgpack_sbuffer_destroy(&sb);
}

/* Seconds from sending LOOKUP to WAIT_PREFETCH_STATUS's hit count (which
 * must be every chunk); then frees the locks and ends the request. */
static double lookup_all(bench *b, const msgpack_sbuffer *key, const char *rid)
{
    msgpack_sbuffer args[2], q[2];
    msgpack_packer pk;
    args[0] = *key;
    sb_start(&args[1], &pk);
    msgpack_pack_int(&pk, 1);
    sb_start(&q[0], &pk);
    lmc_mp_pack_cstr(&pk, rid);
    sb_start(&q[1], &pk);
    msgpack_pack_double(&pk, 60.0);
    msgpack_zone zone;
    msgpack_zone_init(&zone, 256);
    msgpack_object rep;
    int64_t hits = -1;
    double t0 = now_s();
    if (call(b, LMC_OP_LOOKUP, args, 2, &zone, &rep, 10000) != 0 ||
        call(b, LMC_OP_WAIT_PREFETCH_STATUS, q, 2, &zone, &rep, 70000) != 0 ||
        !lmc_mp_get_int(&rep, &hits))
        die("LOOKUP / WAIT_PREFETCH_STATUS failed");
    double t = now_s() - t0;
    if (hits != CHUNKS) {
        fprintf(stderr, "l2_lookup_bench: %lld of %d chunks hit\n", (long long)hits, CHUNKS);
        exit(1);
    }
    simple_call(b, LMC_OP_FREE_LOOKUP_LOCKS, args, 2);
    simple_call(b, LMC_OP_END_SESSION, q, 1);
    msgpack_zone_destroy(&zone);
    for (int i = 0; i < 2; i++)
        msgpack_sbuffer_destroy(&q[i]);
    msgpack_sbuffer_destroy(&args[1]);
    return t;
}

/* fdatasync + POSIX_FADV_DONTNEED on each file (not the global drop_caches). */
static void drop_cache(char paths[][4096])
{
    for (size_t i = 0; i < CHUNKS; i++) {
        int fd = open(paths[i], O_RDONLY | O_CLOEXEC);
        if (fd < 0)
            die("cannot open a .data file");
        fdatasync(fd);
        posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
        close(fd);
    }
}

/* Reads every file through `buf` (OBJ + 4 KiB, 4 KiB aligned); returns
 * the seconds and adds the bytes to *bytes. */
static double read_files(char paths[][4096], bool direct, uint8_t *buf, size_t *bytes)
{
    double t0 = now_s();
    for (size_t i = 0; i < CHUNKS; i++) {
        int fd = open(paths[i], O_RDONLY | O_CLOEXEC | (direct ? O_DIRECT : 0));
        if (fd < 0)
            die("cannot open a .data file");
        ssize_t r;
        while ((r = read(fd, buf, OBJ + 4096)) > 0)
            *bytes += (size_t)r;
        close(fd);
        if (r < 0)
            die("read failed");
    }
    return now_s() - t0;
}

static double memcpy_time(uint8_t *dst, const uint8_t *src, size_t n)
{
    double t0 = now_s();
    memcpy(dst, src, n);
    double t = now_s() - t0;
    if (dst[n - 1] != src[n - 1])
        die("memcpy");
    return t;
}

typedef struct {
    msgpack_sbuffer key;
    char (*paths)[4096];
    uint8_t *buf, *src, *dst;
    double cold[64], warm[64];   /* ratios lmcached time / baseline time */
} round_state;

static void cold_round(bench *b, round_state *s, int r)
{
    size_t bytes = 0;
    double tl = 0, td = 0;
    char rid[32];
    snprintf(rid, sizeof rid, "cold-%d", r);
    for (int k = 0; k < 2; k++) {
        clear_l1(b);
        drop_cache(s->paths);
        if ((k == 0) == (r % 2 == 0))
            tl = lookup_all(b, &s->key, rid);
        else
            td = read_files(s->paths, true, s->buf, &bytes);
    }
    if (bytes != (size_t)CHUNKS * OBJ)
        die("the files do not hold the prompt's bytes");
    s->cold[r] = tl / td;
    printf("rep %d cold (%s first): LOOKUP+WAIT %7.1f ms (%5.0f MB/s)  O_DIRECT read %7.1f ms "
           "(%5.0f MB/s)  ratio %.2f (goal <= 1.2)\n", r + 1, r % 2 ? "O_DIRECT" : "lmcached",
           tl * 1e3, bytes / tl / 1e6, td * 1e3, bytes / td / 1e6, s->cold[r]);
}

static void warm_round(bench *b, round_state *s, int r)
{
    size_t bytes = 0, n = (size_t)CHUNKS * OBJ;
    double tl = 0, tm = 0;
    char rid[32];
    snprintf(rid, sizeof rid, "warm-%d", r);
    read_files(s->paths, false, s->buf, &bytes);   /* into the page cache */
    for (int k = 0; k < 2; k++) {
        if ((k == 0) == (r % 2 == 0)) {
            clear_l1(b);
            tl = lookup_all(b, &s->key, rid);
        } else {
            tm = memcpy_time(s->dst, s->src, n);
        }
    }
    s->warm[r] = tl / tm;
    printf("rep %d warm (%s first): LOOKUP+WAIT %7.1f ms (%5.0f MB/s)  memcpy %7.1f ms "
           "(%5.0f MB/s)  ratio %.2f (goal <= 2)\n", r + 1, r % 2 ? "memcpy" : "lmcached",
           tl * 1e3, n / tl / 1e6, tm * 1e3, n / tm / 1e6, s->warm[r]);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static void run_reps(bench *b, int reps)
{
    round_state s = {.paths = calloc(CHUNKS, sizeof *s.paths)};
    size_t n = (size_t)CHUNKS * OBJ;
    if (!s.paths || posix_memalign((void **)&s.buf, 4096, OBJ + 4096) != 0 ||
        !(s.src = malloc(n)) || !(s.dst = malloc(n)))
        die("out of memory");
    memset(s.src, 1, n);   /* pre-faulted: the memcpy measures copying only */
    memset(s.dst, 2, n);
    store_prompt(b, s.paths);
    for (int r = 0; r < reps; r++) {
        char rid[32];   /* a request id of its own per LOOKUP */
        snprintf(rid, sizeof rid, "cold-%d", r);
        pack_key(&s.key, b->toks, 0, TOKENS, rid, -1);
        cold_round(b, &s, r);
        msgpack_sbuffer_destroy(&s.key);
        snprintf(rid, sizeof rid, "warm-%d", r);
        pack_key(&s.key, b->toks, 0, TOKENS, rid, -1);
        warm_round(b, &s, r);
        msgpack_sbuffer_destroy(&s.key);
    }
    printf("median of %d: cold %.2fx the O_DIRECT read time (goal <= 1.2), warm %.2fx the "
           "memcpy time (goal <= 2)\n", reps, median(s.cold, reps), median(s.warm, reps));
    free(s.paths);
    free(s.buf);
    free(s.src);
    free(s.dst);
}

static void parse_config(lmc_config *cfg, const char *dir)
{
    char port[16], http_port[16], spec[4200], err[256];
    snprintf(port, sizeof port, "%d", 20000 + getpid() % 20000);
    snprintf(http_port, sizeof http_port, "%d", 40001 + getpid() % 20000);
    snprintf(spec, sizeof spec, "{\"type\":\"fs\",\"base_path\":\"%s\"}", dir);
    /* the stored prompt, the prefetch's staging of it, and slack */
    char *args[] = {"lmcached", "--host", "127.0.0.1", "--port", port, "--chunk-size", "256",
                    "--l1-size-gb", "0.75", "--eviction-policy", "LRU", "--log-level", "WARNING",
                    "--http-host", "127.0.0.1", "--http-port", http_port, "--l2-adapter", spec,
                    NULL};
    if (lmc_config_parse(cfg, (int)(sizeof args / sizeof args[0]) - 1, args, NULL, stdout, err,
                         sizeof err) != LMC_CONFIG_OK)
        die(err);
}

static int remove_dir(const char *dir)
{
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    return system(cmd);
}

int main(int argc, char **argv)
{
    static bench b = {.dir = "l2_lookup_bench.dir"};
    int reps = 3;
    for (int i = 1; i < argc; i++) {
        if (i + 1 < argc && !strcmp(argv[i], "--dir"))
            b.dir = argv[++i];
        else if (i + 1 < argc && !strcmp(argv[i], "--reps"))
            reps = atoi(argv[++i]);
        else
            reps = 0;
    }
    if (reps < 1 || reps > 64 || strchr(b.dir, '\'') || strchr(b.dir, '"'))
        die("usage: l2_lookup_bench [--dir DIR (no quotes)] [--reps 1..64]");
    if (remove_dir(b.dir) != 0 || mkdir(b.dir, 0755) != 0)   /* fresh: only our files */
        die("cannot create the directory");
    for (size_t i = 0; i < TOKENS; i++)
        b.toks[i] = (7 * 2654435761u + i * 40503u) % 128000;
    lmc_config cfg;
    parse_config(&cfg, b.dir);
    pid_t srv = bench_server_fork(&cfg);   /* before this process starts a thread */
    if (srv < 0)
        die("cannot start the server");
    char url[64];
    snprintf(url, sizeof url, "tcp://127.0.0.1:%d", 20000 + getpid() % 20000);
    if (!(b.c = lmc_client_connect(url)))
        die("cannot connect");
    printf("l2_lookup_bench: lmcached in a child process, fs L2 on %s, %d chunks of %zu MiB\n",
           b.dir, CHUNKS, OBJ >> 20);
    register_worker(&b);
    run_reps(&b, reps);
    munmap(b.pool, b.pool_size);
    lmc_client_close(b.c);
    bench_server_kill(srv);
    lmc_config_free(&cfg);
    return remove_dir(b.dir) == 0 ? 0 : 1;
}
