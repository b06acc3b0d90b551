/* sd_transfer_bench: the server-driven (lmcache_driven) transfer over CPU
 * shared tensors, with lmcached in a child process and a client that acts
 * like an engine's workers: paged KV tensors in POSIX shared memory
 * (block size 16, one segment per layer), REGISTER_KV_CACHE, then
 *
 *   1. STORE of N chunks of 2 MiB ([2, 8 layers, 256 tokens, 256]) from the
 *      blocks, in requests of one 4096-token prompt (16 chunks) each;
 *      LOOKUP of each prompt; RETRIEVE into other blocks.
 *      Effective bandwidth beside the best single-thread copy of the same
 *      bytes in the same run, chunk by chunk: glibc memcpy and streaming
 *      stores (lmc_bulk_copy), each measured, the faster named.  For NHD
 *      and HND tensors (--cpu-kv-layout hint).  Goal >= 0.9x.
 *   2. The same with two copy workers (--max-gpu-workers 2): one rank,
 *      whose every request the server splits across both workers (NHD and
 *      HND), then two ranks storing / retrieving their own halves at once.
 *      Goal >= 1.6x the single-thread copy where the machine has the cores.
 *   3. Request overhead: STORE of one small new chunk and RETRIEVE of one
 *      (after its LOOKUP) p50 beside NOOP p50 in the same run.  Goal <= 2x.
 *   4. Layerwise retrieve (--layerwise-batch 1): RETRIEVE_LAYERWISE of 16
 *      chunks (32 MiB, 8 layers), time to its first layer's reply beside
 *      the whole retrieve and a NOOP, p50s.  Goal: first <= whole / 8 +
 *      NOOP.  `--layerwise-only` runs this phase alone.
 *
 *   sd_transfer_bench [--chunks N] [--iters M] [--layerwise-only]
 *                     [--copy-split-bytes B]   (defaults 256, 2000, 1048576;
 *                                               0 turns the split off) */
#include <fcntl.h>
#include <pthread.h>
#include <stddef.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/sd_worker.h"
#include "common/server_child.h"
#include "config/config.h"
#include "kv/bulk_copy.h"
#include "rpc/client.h"
#include "rpc/wire.h"
#include "server/server.h"

#include <zmq.h>

#define CS 256
#define BS SDW_BS
#define LAYERS SDW_MAX_LAYERS
#define NH SDW_NH
#define HS 128
#define ROW (NH * HS)                                   /* 256 elements */
#define OBJ ((size_t)2 * LAYERS * CS * ROW * 2)         /* 2 MiB */
#define BATCH 16
#define SMALL_LAYERS 1                                  /* overhead phase: 16 KiB objects */
#define SMALL_HS 8

typedef sd_worker worker;


/* ---- the copy baseline ------------------------------------------------ */

/* GB/s of the best of `reps` single-thread copies of `chunks` 2 MiB pieces. */
static double copy_gbps(lmc_copy_method m, uint8_t *dst, const uint8_t *src, size_t chunks,
                        int reps)
{
    double best = 0;
    for (int r = 0; r < reps; r++) {
        double t0 = sdw_now_s();
        for (size_t c = 0; c < chunks; c++)
            lmc_bulk_copy(m, dst + c * OBJ, src + c * OBJ, OBJ);
        lmc_bulk_copy_fence(m);
        double gbps = chunks * OBJ / (sdw_now_s() - t0) / 1e9;
        best = gbps > best ? gbps : best;
    }
    return best;
}

/* A buffer in POSIX shared memory, as the engine's tensors and the L1 pool
 * are (4 KiB pages: no transparent huge pages for shmem by default). */
static uint8_t *shm_buffer(size_t bytes, int tag)
{
    char name[64];
    snprintf(name, sizeof name, "/lmcache_bench_base_%d_%d", getpid(), tag);
    int fd = shm_open(name, O_CREAT | O_RDWR | O_TRUNC, 0600);
    shm_unlink(name);
    if (fd < 0 || ftruncate(fd, (off_t)bytes) != 0)
        return fd >= 0 ? close(fd), NULL : NULL;
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    return p == MAP_FAILED ? NULL : p;
}

/* The best single-thread copy of the bytes, memcpy or streaming stores,
 * between private buffers (which may get huge pages) and between shared
 * memory ones.  Returns the best of all; *shm_best the best in shm. */
static double baseline(size_t chunks, const char **name, double *shm_best)
{
    size_t bytes = chunks * OBJ;
    uint8_t *src = malloc(bytes), *dst = malloc(bytes);
    uint8_t *ssrc = shm_buffer(bytes, 0), *sdst = shm_buffer(bytes, 1);
    double best = 0;
    if (src && dst && ssrc && sdst) {
        memset(src, 7, bytes), memset(dst, 1, bytes);
        memset(ssrc, 7, bytes), memset(sdst, 1, bytes);
        double mc = copy_gbps(LMC_COPY_MEMCPY, dst, src, chunks, 3);
        double st = copy_gbps(LMC_COPY_STREAM, dst, src, chunks, 3);
        double smc = copy_gbps(LMC_COPY_MEMCPY, sdst, ssrc, chunks, 3);
        double sst = copy_gbps(LMC_COPY_STREAM, sdst, ssrc, chunks, 3);
        printf("  single-thread copy of %zu x 2 MiB, private memory: memcpy %.2f GB/s, "
               "streaming stores %.2f GB/s\n", chunks, mc, st);
        printf("  the same in shared memory: memcpy %.2f GB/s, streaming stores %.2f GB/s\n",
               smc, sst);
        best = st > mc ? st : mc;
        *name = st > mc ? "streaming stores, private memory" : "memcpy, private memory";
        *shm_best = sst > smc ? sst : smc;
    }
    free(src);
    free(dst);
    if (ssrc)
        munmap(ssrc, bytes);
    if (sdst)
        munmap(sdst, bytes);
    return best;
}

/* ---- phases ------------------------------------------------------------- */

typedef struct {
    worker *w;
    const uint64_t *toks;
    size_t c0, chunks;
    bool store;
    size_t depth;            /* requests in flight: 1, or more when pipelined */
    const char *rid;
    int rc;
} job;

static void *run_job(void *arg)
{
    job *j = arg;
    j->rc = 0;
    /* One request a prompt of BATCH chunks, as an engine stores a 4k-token
     * prompt; from blocks 1.., retrieved into the blocks after them. */
    size_t in_flight = 0, depth = j->depth ? j->depth : 1;
    for (size_t c = 0; c < j->chunks && j->rc == 0; c += BATCH) {
        char rid[96];
        snprintf(rid, sizeof rid, "%s-%zu", j->rid, c / BATCH);
        size_t first = 1 + (j->store ? 0 : j->chunks * CS / BS) + c * CS / BS;
        if (in_flight == depth)
            j->rc |= sdw_transfer_wait(j->w), in_flight--;
        if (sdw_transfer_send(j->w, j->toks + c * CS, 0, BATCH, first, rid, j->store))
            in_flight++;
        else
            j->rc = -1;
    }
    while (in_flight--)
        j->rc |= sdw_transfer_wait(j->w);
    return NULL;
}

/* Runs one job per worker at once; GB/s of all their bytes. */
static double timed(job *jobs, size_t n)
{
    pthread_t th[2];
    double t0 = sdw_now_s();
    for (size_t i = 0; i < n; i++)
        pthread_create(&th[i], NULL, run_job, &jobs[i]);
    size_t chunks = 0;
    for (size_t i = 0; i < n; i++) {
        pthread_join(th[i], NULL);
        chunks += jobs[i].chunks;
        if (jobs[i].rc != 0)
            return -1;
    }
    return chunks * OBJ / (sdw_now_s() - t0) / 1e9;
}

/* After a round: every retrieved block holds the bytes of the block it was
 * stored from (same format on both sides), in every layer and plane. */
static int verify(const worker *w, size_t per)
{
    size_t block = (size_t)BS * NH * w->hs * 2, blocks = per * CS / BS;
    for (size_t l = 0; l < w->layers; l++)
        for (size_t kv = 0; kv < 2; kv++) {
            const uint8_t *plane = w->layer[l] + kv * w->nb * block;
            if (memcmp(plane + (1 + blocks) * block, plane + block, blocks * block) != 0) {
                fprintf(stderr, "sd_transfer_bench: wrong bytes in layer %zu\n", l);
                return -1;
            }
        }
    return 0;
}

/* STORE then RETRIEVE of every worker's `per` chunks of prompt `seed`;
 * GB/s of each. */
static int store_retrieve(worker *ws, size_t n_workers, size_t per, size_t depth,
                          uint64_t seed, uint64_t *toks, double *st, double *rt)
{
    char rid[32];
    snprintf(rid, sizeof rid, "bw%llu", (unsigned long long)seed);
    sdw_fill_tokens(toks, per * CS, seed);
    job jobs[2];
    for (size_t i = 0; i < n_workers; i++)
        jobs[i] = (job){.w = &ws[i], .toks = toks, .c0 = 0, .chunks = per, .store = true,
                        .depth = depth, .rid = rid};
    *st = timed(jobs, n_workers);
    int rc = *st < 0;
    for (size_t c = 0; c < per && rc == 0; c += BATCH) {
        char prid[96];
        snprintf(prid, sizeof prid, "%s-%zu", rid, c / BATCH);
        rc = sdw_lookup(&ws[0], toks + c * CS, BATCH, prid) != 0;
    }
    for (size_t i = 0; i < n_workers; i++)
        jobs[i].store = false;
    *rt = rc ? -1 : timed(jobs, n_workers);
    for (size_t i = 0; i < n_workers && rc == 0 && *rt >= 0; i++)
        rc = verify(&ws[i], per);
    return rc || *rt < 0 ? -1 : 0;
}

/* CLEAR: the arena's pages stay touched, so the measured round finds them
 * as a server that has been running does. */
static int clear(worker *w)
{
    return sdw_call(w->c, LMC_OP_CLEAR, NULL, 0, NULL);
}

/* The copy baseline beside each measurement: private buffers of the same
 * bytes, copied right before and right after the measured round (the VM's
 * bandwidth drifts by tens of percent between phases). */
typedef struct {
    uint8_t *src, *dst;
    size_t chunks;
} copy_pair;

static double best_copy(const copy_pair *cp)
{
    double mc = copy_gbps(LMC_COPY_MEMCPY, cp->dst, cp->src, cp->chunks, 2);
    double st = copy_gbps(LMC_COPY_STREAM, cp->dst, cp->src, cp->chunks, 2);
    return st > mc ? st : mc;
}

typedef struct {
    const copy_pair *cp;
    lmc_copy_method m;
    size_t from, to;
    pthread_barrier_t *start;
} half_copy;

static void *run_half(void *arg)
{
    half_copy *h = arg;
    pthread_barrier_wait(h->start);
    for (size_t c = h->from; c < h->to; c++)
        lmc_bulk_copy(h->m, h->cp->dst + c * OBJ, h->cp->src + c * OBJ, OBJ);
    lmc_bulk_copy_fence(h->m);
    return NULL;
}

/* The machine's own ceiling for two copy workers: two threads at once,
 * each copying half of the same bytes, the better of the two methods and
 * of two repetitions.  Where it is far under 2x the single-thread copy,
 * memory, not cores, bounds what two workers can do. */
static double two_thread_copy(const copy_pair *cp)
{
    double best = 0;
    lmc_copy_method methods[] = {LMC_COPY_MEMCPY, LMC_COPY_STREAM};
    for (int r = 0; r < 4; r++) {
        pthread_barrier_t start;
        pthread_barrier_init(&start, NULL, 3);
        half_copy h[2];
        pthread_t th[2];
        for (int i = 0; i < 2; i++) {
            h[i] = (half_copy){.cp = cp, .m = methods[r % 2], .from = i * cp->chunks / 2,
                               .to = (i + 1) * cp->chunks / 2, .start = &start};
            pthread_create(&th[i], NULL, run_half, &h[i]);
        }
        pthread_barrier_wait(&start);
        double t0 = sdw_now_s();
        for (int i = 0; i < 2; i++)
            pthread_join(th[i], NULL);
        double gbps = cp->chunks * OBJ / (sdw_now_s() - t0) / 1e9;
        best = gbps > best ? gbps : best;
        pthread_barrier_destroy(&start);
    }
    return best;
}

/* The L1 pool, mapped as an engine-driven worker maps it: a probe
 * registration's reply names it (docs/protocol.md). */
static uint8_t *map_pool(lmc_client *c, size_t *size)
{
    msgpack_sbuffer a[1];
    msgpack_packer pk;
    sdw_sb_packer(&a[0], &pk);
    msgpack_pack_map(&pk, 8);
    lmc_mp_pack_cstr(&pk, "instance_id"), msgpack_pack_int(&pk, 999);
    lmc_mp_pack_cstr(&pk, "model_name"), lmc_mp_pack_cstr(&pk, "pool-probe");
    lmc_mp_pack_cstr(&pk, "world_size"), msgpack_pack_int(&pk, 1);
    lmc_mp_pack_cstr(&pk, "block_size"), msgpack_pack_int(&pk, BS);
    lmc_mp_pack_cstr(&pk, "num_layers"), msgpack_pack_int(&pk, 1);
    lmc_mp_pack_cstr(&pk, "hidden_dim_size"), msgpack_pack_int(&pk, 8);
    lmc_mp_pack_cstr(&pk, "dtype_str"), lmc_mp_pack_cstr(&pk, "float16");
    lmc_mp_pack_cstr(&pk, "use_mla"), msgpack_pack_false(&pk);
    lmc_client_reply r;
    int crc = lmc_client_call(c, LMC_OP_REGISTER_KV_CACHE_ENGINE_DRIVEN_CONTEXT, a, 1, 60000, &r);
    msgpack_sbuffer_destroy(&a[0]);
    if (crc != LMC_CLIENT_OK)
        return NULL;
    char name[128] = "/";
    uint64_t bytes = 0;
    msgpack_zone z;
    msgpack_object o;
    size_t off = 0;
    msgpack_zone_init(&z, 256);
    if (r.has_response &&
        msgpack_unpack((const char *)r.data, r.len, &off, &z, &o) == MSGPACK_UNPACK_SUCCESS) {
        const msgpack_object *n = lmc_mp_map_get(&o, "shm_name");
        const msgpack_object *sz = lmc_mp_map_get(&o, "pool_size");
        const char *str;
        size_t len;
        if (n && sz && lmc_mp_get_str(n, &str, &len) && len < sizeof name - 1 &&
            lmc_mp_get_uint(sz, &bytes))
            memcpy(name + 1, str, len), name[len + 1] = '\0';
    }
    msgpack_zone_destroy(&z);
    lmc_client_reply_free(&r);
    sdw_sb_packer(&a[0], &pk), msgpack_pack_int(&pk, 999);
    sdw_call(c, LMC_OP_UNREGISTER_KV_CACHE_ENGINE_DRIVEN_CONTEXT, a, 1, NULL);
    int fd = bytes ? shm_open(name, O_RDWR, 0) : -1;
    void *p = fd >= 0 ? mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : MAP_FAILED;
    if (fd >= 0)
        close(fd);
    *size = bytes;
    return p == MAP_FAILED ? NULL : p;
}

/* The best single-thread copy of the round's bytes between the very
 * memories the server copies between: 2 MiB pieces of the engine's layer
 * segments into the L1 pool (free space: called right after a CLEAR). */
static double pool_copy(const worker *w, uint8_t *pool, size_t pool_size, size_t chunks)
{
    double best = 0;
    if (!pool || chunks * OBJ > pool_size)
        return 0;
    for (int m = 0; m < 2; m++)
        for (int rep = 0; rep < 2; rep++) {
            lmc_copy_method how = m ? LMC_COPY_STREAM : LMC_COPY_MEMCPY;
            double t0 = sdw_now_s();
            for (size_t c = 0; c < chunks; c++)
                lmc_bulk_copy(how, pool + c * OBJ, w->layer[c % LAYERS] + c / LAYERS * OBJ,
                              OBJ);
            lmc_bulk_copy_fence(how);
            double gbps = chunks * OBJ / (sdw_now_s() - t0) / 1e9;
            best = gbps > best ? gbps : best;
        }
    return best;
}

/* Minor page faults of process `pid` so far (/proc/<pid>/stat field 10). */
static unsigned long long minor_faults(pid_t pid)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
    if (f)
        fclose(f);
    buf[n] = '\0';
    const char *p = strrchr(buf, ')');   /* the command name may hold spaces */
    unsigned long long v = 0;
    for (int field = 2; p && *p; p++)
        if (*p == ' ' && ++field == 10) {
            v = strtoull(p + 1, NULL, 10);
            break;
        }
    return v;
}

/* The machine's CPU time so far, and the part of it a hypervisor gave
 * other guests ("steal", /proc/stat): on a shared VM it is the noise
 * behind a slow sitting, printed so that a reader can tell. */
typedef struct {
    unsigned long long steal, total;
} cpu_ticks;

static cpu_ticks machine_ticks(void)
{
    cpu_ticks t = {0, 0};
    FILE *f = fopen("/proc/stat", "r");
    unsigned long long v[8] = {0};
    if (f && fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2],
                    &v[3], &v[4], &v[5], &v[6], &v[7]) == 8) {
        for (int i = 0; i < 8; i++)
            t.total += v[i];
        t.steal = v[7];
    }
    if (f)
        fclose(f);
    return t;
}

/* The server's HTTP port (start_server) and one of its server-driven
 * counters from /metrics (docs/metrics.md), read with curl; -1 if absent. */
static int http_port(void)
{
    return 40001 + getpid() % 20000;
}

typedef struct {
    double store_s, retrieve_s, stored, retrieved;
} sd_counters;

static sd_counters server_counters(void)
{
    sd_counters c = {-1, -1, -1, -1};
    char cmd[128], line[512];
    snprintf(cmd, sizeof cmd, "curl -s --max-time 5 http://127.0.0.1:%d/metrics", http_port());
    FILE *f = popen(cmd, "r");
    static const struct { const char *name; size_t off; } want[] = {
        {"lmcache_mp_server_driven_store_seconds_total ", offsetof(sd_counters, store_s)},
        {"lmcache_mp_server_driven_retrieve_seconds_total ", offsetof(sd_counters, retrieve_s)},
        {"lmcache_mp_server_driven_stored_bytes_total ", offsetof(sd_counters, stored)},
        {"lmcache_mp_server_driven_retrieved_bytes_total ", offsetof(sd_counters, retrieved)},
    };
    while (f && fgets(line, sizeof line, f))
        for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
            if (strncmp(line, want[i].name, strlen(want[i].name)) == 0)
                *(double *)((char *)&c + want[i].off) = strtod(line + strlen(want[i].name), NULL);
    if (f)
        pclose(f);
    return c;
}

#define ROUNDS 3


/* ROUNDS measured rounds (each after a CLEAR) with `depth` requests in
 * flight per worker; sorted GB/s in st[] and rt[]. */
static int rounds(worker *ws, size_t n_workers, size_t per, size_t depth, uint64_t seed,
                  uint64_t *toks, double *st, double *rt)
{
    int rc = 0;
    for (int r = 0; r < ROUNDS && rc == 0; r++)
        rc = clear(&ws[0]) != 0 ||
             store_retrieve(ws, n_workers, per, depth, seed + 100 * (r + 1), toks, &st[r],
                            &rt[r]) != 0;
    qsort(st, ROUNDS, sizeof *st, sdw_cmp_double);
    qsort(rt, ROUNDS, sizeof *rt, sdw_cmp_double);
    return rc;
}

static void print_rounds(const char *what, const double *st, const double *rt, double base)
{
    printf("  %s, best (median) of %d rounds: STORE %.2f GB/s (%.2fx, median %.2fx), RETRIEVE "
           "%.2f GB/s (%.2fx, median %.2fx) beside a %.2f GB/s copy\n", what, ROUNDS,
           st[ROUNDS - 1], st[ROUNDS - 1] / base, st[ROUNDS / 2] / base, rt[ROUNDS - 1],
           rt[ROUNDS - 1] / base, rt[ROUNDS / 2] / base, base);
}

static void wait_engine_mapped(void);

/* The copy baseline is the best of its repetitions, so the server's side
 * is too: the best of ROUNDS measured rounds (each after a CLEAR), with
 * the median beside it; one request at a time per worker, then (one
 * worker) two in flight, as an engine whose STOREs overlap sends them. */
static int bandwidth(worker *ws, size_t n_workers, int copy_workers, size_t chunks,
                     const copy_pair *cp, bool hnd, pid_t server)
{
    uint64_t *toks = malloc(chunks * CS * sizeof *toks);
    size_t pool_size = 0;
    uint8_t *pool = map_pool(ws[0].c, &pool_size);
    if (!toks)
        return -1;
    size_t per = chunks / n_workers;
    double st[ROUNDS], rt[ROUNDS], pst[ROUNDS], prt[ROUNDS];
    char what[96];
    wait_engine_mapped();
    unsigned long long warm_faults = minor_faults(server);
    int rc = store_retrieve(ws, n_workers, per, 1, 77, toks, &st[0], &rt[0]) != 0;
    printf("  (warm-up round on a fresh server: STORE %.2f GB/s, RETRIEVE %.2f GB/s; the "
           "server's minor page faults in it: %llu)\n", st[0], rt[0],
           minor_faults(server) - warm_faults);
    rc = rc || clear(&ws[0]) != 0;
    double before = best_copy(cp), pool_before = pool_copy(&ws[0], pool, pool_size, chunks);
    unsigned long long faults = minor_faults(server);
    cpu_ticks t0 = machine_ticks();
    sd_counters c0 = server_counters();
    uint64_t seed = hnd * 2 + n_workers;
    rc = rc || rounds(ws, n_workers, per, 1, seed, toks, st, rt) != 0;
    faults = minor_faults(server) - faults;
    cpu_ticks t1 = machine_ticks();
    sd_counters c1 = server_counters();
    rc = rc || clear(&ws[0]) != 0;
    double mid = best_copy(cp), base = (before + mid) / 2;
    double pool_base = (pool_before + pool_copy(&ws[0], pool, pool_size, chunks)) / 2;
    bool piped = rc == 0;
    if (piped)
        rc = rounds(ws, n_workers, per, 2, seed + 1000, toks, pst, prt) != 0;
    double piped_base = piped ? (mid + best_copy(cp)) / 2 : 0;
    if (rc == 0) {
        snprintf(what, sizeof what, "%s, %zu rank(s), %d copy worker(s), %zu chunks",
                 hnd ? "HND" : "NHD", n_workers, copy_workers, per * n_workers);
        print_rounds(what, st, rt, base);
        printf("    the server's minor page faults in the measured rounds: %llu (%.1f per "
               "chunk)\n", faults, (double)faults / (ROUNDS * 2.0 * per * n_workers));
        if (t1.total > t0.total)
            printf("    steal time in the measured rounds: %.1f %% of the machine's CPU time "
                   "(the hypervisor running other guests)\n",
                   100.0 * (double)(t1.steal - t0.steal) / (double)(t1.total - t0.total));
        if (c0.store_s >= 0 && c1.store_s > c0.store_s && c1.retrieve_s > c0.retrieve_s)
            printf("    inside the server (handler time, all rounds, /metrics): STORE %.2f GB/s "
                   "(%.2fx), RETRIEVE %.2f GB/s (%.2fx)\n",
                   (c1.stored - c0.stored) / (c1.store_s - c0.store_s) / 1e9,
                   (c1.stored - c0.stored) / (c1.store_s - c0.store_s) / 1e9 / base,
                   (c1.retrieved - c0.retrieved) / (c1.retrieve_s - c0.retrieve_s) / 1e9,
                   (c1.retrieved - c0.retrieved) / (c1.retrieve_s - c0.retrieve_s) / 1e9 / base);
        if (pool_base > 0)
            printf("    the same bytes from the engine's segments into the L1 pool: %.2f GB/s "
                   "(%.2fx the copy); STORE %.2fx, RETRIEVE %.2fx of it (best)\n", pool_base,
                   pool_base / base, st[ROUNDS - 1] / pool_base, rt[ROUNDS - 1] / pool_base);
        if (piped) {
            snprintf(what, sizeof what, "%s, %zu rank(s), %d copy worker(s), two requests in "
                     "flight each", hnd ? "HND" : "NHD", n_workers, copy_workers);
            print_rounds(what, pst, prt, piped_base);
        }
        double two = copy_workers > 1 ? two_thread_copy(cp) : 0;
        if (two > 0)
            printf("    two threads copying the same bytes at once: %.2f GB/s (%.2fx the "
                   "single-thread copy); one request at a time STORE %.2fx, RETRIEVE %.2fx of "
                   "it, two in flight %.2fx, %.2fx (best)\n", two, two / base,
                   st[ROUNDS - 1] / two, rt[ROUNDS - 1] / two, pst[ROUNDS - 1] / two,
                   prt[ROUNDS - 1] / two);
    }
    if (pool)
        munmap(pool, pool_size);
    free(toks);
    return rc;
}



static int overhead(worker *w, size_t iters)
{
    double *noop = malloc(iters * sizeof *noop), *st = malloc(iters * sizeof *st),
           *rt = malloc(iters * sizeof *rt);
    uint64_t toks[CS];
    int rc = noop && st && rt ? 0 : -1;
    for (size_t i = 0; i < iters && rc == 0; i++) {
        char rid[32];
        snprintf(rid, sizeof rid, "o%zu", i);
        sdw_fill_tokens(toks, CS, 1000 + i);
        double t0 = sdw_now_s();
        rc |= sdw_call(w->c, LMC_OP_NOOP, NULL, 0, NULL);
        double t1 = sdw_now_s();
        rc |= sdw_transfer(w, toks, 0, 1, 1, rid, true);
        double t2 = sdw_now_s();
        rc |= sdw_lookup(w, toks, 1, rid);
        double t3 = sdw_now_s();
        rc |= sdw_transfer(w, toks, 0, 1, 17, rid, false);
        noop[i] = t1 - t0, st[i] = t2 - t1, rt[i] = sdw_now_s() - t3;
        rc |= sdw_end_session(w, rid);   /* as the engine does when the request ends */
    }
    if (rc == 0) {
        qsort(noop, iters, sizeof *noop, sdw_cmp_double);
        qsort(st, iters, sizeof *st, sdw_cmp_double);
        qsort(rt, iters, sizeof *rt, sdw_cmp_double);
        double n50 = noop[iters / 2], s50 = st[iters / 2], r50 = rt[iters / 2];
        printf("  one %zu KiB chunk, %zu requests: NOOP p50 %.1f us; STORE p50 %.1f us "
               "(%.2fx); RETRIEVE p50 %.1f us (%.2fx)\n",
               (size_t)2 * SMALL_LAYERS * CS * NH * SMALL_HS * 2 / 1024, iters, n50 * 1e6,
               s50 * 1e6, s50 / n50, r50 * 1e6, r50 / n50);
    }
    free(noop);
    free(st);
    free(rt);
    return rc;
}

/* ---- layerwise retrieve ------------------------------------------------- */

static pid_t start_server(size_t chunks, int workers, const char *layerwise, char *url,
                          size_t url_len);

/* Whether a RETRIEVE_LAYERWISE reply ([payload, is_final, ok]) is the final
 * one; *ok its success. */
static bool final_frame(const uint8_t *data, size_t len, bool *ok)
{
    msgpack_zone z;
    msgpack_object o;
    size_t off = 0;
    msgpack_zone_init(&z, 256);
    bool fin = msgpack_unpack((const char *)data, len, &off, &z, &o) == MSGPACK_UNPACK_SUCCESS &&
               o.type == MSGPACK_OBJECT_ARRAY && o.via.array.size == 3 &&
               o.via.array.ptr[1].type == MSGPACK_OBJECT_BOOLEAN && o.via.array.ptr[1].via.boolean;
    *ok = fin && o.via.array.ptr[2].type == MSGPACK_OBJECT_BOOLEAN &&
          o.via.array.ptr[2].via.boolean;
    msgpack_zone_destroy(&z);
    return fin;
}

/* RETRIEVE_LAYERWISE of chunks [0, n) of toks into blocks from `first`,
 * over the client's raw DEALER (the op travels by name): seconds to the
 * first batch's reply and to the final one; 0 when that says success. */
static int layerwise_retrieve(worker *w, const uint64_t *toks, size_t n, size_t first,
                              const char *rid, double *t_first, double *t_whole)
{
    msgpack_sbuffer a[7];
    msgpack_packer pk;
    static uint64_t uid = 1ull << 40;    /* apart from lmc_client's own uids */
    sdw_sb_packer(&a[0], &pk), msgpack_pack_uint64(&pk, ++uid);
    sdw_sb_packer(&a[1], &pk), lmc_mp_pack_cstr(&pk, "retrieve_layerwise");
    sdw_pack_transfer(a + 2, w, toks, 0, n, first, rid);
    void *sock = lmc_client_socket(w->c);
    double t0 = sdw_now_s();
    for (int i = 0; i < 7; i++)
        zmq_send(sock, a[i].data, a[i].size, i < 6 ? ZMQ_SNDMORE : 0);
    for (int i = 0; i < 7; i++)
        msgpack_sbuffer_destroy(&a[i]);
    bool fin = false, ok = false;
    *t_first = -1;
    while (!fin) {
        zmq_msg_t f[3];
        int nf = 0, more = 1;
        for (; more && nf < 3; nf++) {
            zmq_msg_init(&f[nf]);
            if (zmq_msg_recv(&f[nf], sock, 0) < 0)
                return -1;
            more = zmq_msg_more(&f[nf]);
        }
        if (nf == 3)
            fin = final_frame(zmq_msg_data(&f[2]), zmq_msg_size(&f[2]), &ok);
        for (int i = 0; i < nf; i++)
            zmq_msg_close(&f[i]);
        if (!fin && *t_first < 0)
            *t_first = sdw_now_s() - t0;
    }
    *t_whole = sdw_now_s() - t0;
    return ok && *t_first >= 0 ? 0 : -1;
}

/* Phase 4: BATCH chunks (32 MiB) stored, looked up and retrieved layer by
 * layer, `iters` times; p50s beside NOOP's. */
static int layerwise_phase(size_t iters)
{
    char url[64];
    pid_t pid = start_server(4 * BATCH, 1, "1", url, sizeof url);
    if (pid < 0)
        return -1;
    worker w = {.c = lmc_client_connect(url), .instance = 300, .world = 1, .model = "lw",
                .nb = 1 + 2 * BATCH * CS / BS, .layers = LAYERS, .hs = HS, .cs = CS};
    int rc = !w.c || sdw_register_worker(&w, false) != 0;
    double *first = malloc(iters * sizeof *first), *whole = malloc(iters * sizeof *whole),
           *noop = malloc(iters * sizeof *noop);
    uint64_t *toks = malloc(BATCH * CS * sizeof *toks);
    rc |= !first || !whole || !noop || !toks;
    for (size_t i = 0; i < iters && rc == 0; i++) {
        char rid[32];
        snprintf(rid, sizeof rid, "lw%zu", i);
        sdw_fill_tokens(toks, BATCH * CS, 5000 + i);
        double t0 = sdw_now_s();
        rc |= sdw_call(w.c, LMC_OP_NOOP, NULL, 0, NULL);
        noop[i] = sdw_now_s() - t0;
        rc |= sdw_transfer(&w, toks, 0, BATCH, 1, rid, true) != 0 ||
              sdw_lookup(&w, toks, BATCH, rid) != 0;
        rc |= layerwise_retrieve(&w, toks, BATCH, 1 + BATCH * CS / BS, rid, &first[i],
                                 &whole[i]);
        rc |= sdw_end_session(&w, rid) != 0;
    }
    if (rc == 0) {
        qsort(first, iters, sizeof *first, sdw_cmp_double);
        qsort(whole, iters, sizeof *whole, sdw_cmp_double);
        qsort(noop, iters, sizeof *noop, sdw_cmp_double);
        double f50 = first[iters / 2], w50 = whole[iters / 2], n50 = noop[iters / 2];
        printf("layerwise retrieve, %d MiB in %d chunks, %d layers, batch 1, %zu requests:\n"
               "  first layer's reply p50 %.1f us; whole p50 %.1f us; NOOP p50 %.1f us; "
               "goal first <= whole/%d + NOOP = %.1f us: %s\n",
               (int)(BATCH * OBJ >> 20), BATCH, LAYERS, iters, f50 * 1e6, w50 * 1e6, n50 * 1e6,
               LAYERS, (w50 / LAYERS + n50) * 1e6, f50 <= w50 / LAYERS + n50 ? "met" : "NOT met");
    }
    free(first);
    free(whole);
    free(noop);
    free(toks);
    sdw_free_tensors(&w);
    lmc_client_close(w.c);
    bench_server_kill(pid);
    return rc;
}

/* ---- the server --------------------------------------------------------- */

/* The first round is measured on a fresh server once its page tables are
 * filled: the L1 pool's by the pre-fault after start (docs/storage.md,
 * "Pre-fault"), the engine segments' by the thread each registration starts
 * (docs/protocol.md).  The "first round" is that round. */
static void wait_prefault(void)
{
    printf("  (L1 pre-fault over %.2f s after the first poll)\n",
           sdw_wait_status(http_port(), sdw_l1_prefaulted));
}

static void wait_engine_mapped(void)
{
    printf("  (engine segments faulted in %.2f s after the registration)\n",
           sdw_wait_status(http_port(), sdw_engine_mapped));
}

/* --copy-split-bytes for the server, for A/Bs of the
 * split (docs/protocol.md, "One request across the copy workers"). */
static const char *split_bytes = "1048576";

static pid_t start_server(size_t chunks, int workers, const char *layerwise, char *url,
                          size_t url_len)
{
    char port[16], http_port[16], l1[32], gpu_workers[8];
    snprintf(port, sizeof port, "%d", 20000 + getpid() % 20000);
    snprintf(http_port, sizeof http_port, "%d", 40001 + getpid() % 20000);
    snprintf(l1, sizeof l1, "%.3f", (4.0 * chunks * OBJ) / (1u << 30) + 0.25);
    snprintf(gpu_workers, sizeof gpu_workers, "%d", workers);
    snprintf(url, url_len, "tcp://127.0.0.1:%s", port);
    char *args[] = {"lmcached", "--host", "127.0.0.1", "--port", port, "--chunk-size", "256",
                    "--l1-size-gb", l1, "--eviction-policy", "LRU", "--log-level", "WARNING",
                    "--max-workers", "2", "--max-gpu-workers", gpu_workers, "--http-host",
                    "127.0.0.1", "--http-port", http_port, "--cpu-kv-layout", "hint",
                    "--layerwise-batch", (char *)layerwise, "--copy-split-bytes",
                    (char *)split_bytes, NULL};
    lmc_config cfg;
    char err[256];
    if (lmc_config_parse(&cfg, (int)(sizeof args / sizeof args[0]) - 1, args, NULL, stdout, err,
                         sizeof err) != LMC_CONFIG_OK) {
        fprintf(stderr, "sd_transfer_bench: %s\n", err);
        return -1;
    }
    pid_t pid = bench_server_fork(&cfg);
    lmc_config_free(&cfg);
    usleep(300 * 1000);
    wait_prefault();
    return pid;
}

/* One server per layout, rank count and copy worker count: a fresh L1
 * for each phase.  One rank with two copy workers is one request split
 * across both (docs/protocol.md, "One request across the copy workers"). */
static int phase(size_t chunks, size_t n_workers, int copy_workers, bool hnd,
                 const copy_pair *cp, size_t iters)
{
    char url[64];
    pid_t pid = start_server(chunks, copy_workers, "0", url, sizeof url);
    if (pid < 0)
        return -1;
    worker ws[2];
    int rc = 0;
    for (size_t i = 0; i < n_workers; i++) {
        /* both ranks store the same prompts */
        ws[i] = (worker){.c = lmc_client_connect(url), .instance = 100 + (int64_t)i,
                         .rank = (uint32_t)i, .world = (uint32_t)n_workers, .model = "bench",
                         .nb = 1 + 2 * chunks * CS / BS / n_workers, .layers = LAYERS, .hs = HS,
                         .cs = CS};
        rc |= !ws[i].c || sdw_register_worker(&ws[i], hnd) != 0;
    }
    if (rc == 0)
        rc = bandwidth(ws, n_workers, copy_workers, chunks / n_workers * n_workers, cp, hnd,
                       pid);
    if (rc == 0 && iters) {
        worker small = {.c = ws[0].c, .instance = 900, .world = 1, .model = "small",
                        .nb = 64, .layers = SMALL_LAYERS, .hs = SMALL_HS, .cs = CS};
        rc = clear(&ws[0]) != 0 || sdw_register_worker(&small, hnd) != 0 ||
             overhead(&small, iters) != 0;
        sdw_free_tensors(&small);
    }
    for (size_t i = 0; i < n_workers; i++) {
        sdw_free_tensors(&ws[i]);
        lmc_client_close(ws[i].c);
    }
    bench_server_kill(pid);
    return rc;
}

int main(int argc, char **argv)
{
    size_t chunks = 256, iters = 2000;
    bool layerwise_only = false;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--layerwise-only") == 0)
            layerwise_only = true;
        else if (i + 1 < argc && strcmp(argv[i], "--chunks") == 0)
            chunks = strtoul(argv[++i], NULL, 10);
        else if (i + 1 < argc && strcmp(argv[i], "--iters") == 0)
            iters = strtoul(argv[++i], NULL, 10);
        else if (i + 1 < argc && strcmp(argv[i], "--copy-split-bytes") == 0)
            split_bytes = argv[++i];
    }
    size_t lw_iters = iters < 200 ? iters : 200;    /* 32 MiB each */
    if (layerwise_only)
        return iters < 10 || layerwise_phase(lw_iters) != 0;
    if (chunks < 2 * BATCH || iters < 10) {
        fprintf(stderr, "usage: sd_transfer_bench [--chunks N>=32] [--iters M>=10]\n");
        return 1;
    }
    chunks = chunks / (2 * BATCH) * (2 * BATCH);
    const char *best = "";
    double shm_base = 0, base = baseline(chunks, &best, &shm_base);
    printf("  faster: %s (shared memory's best is %.2fx of it); each phase below is beside "
           "the faster of the two copies, measured around it\n", best, shm_base / base);
    copy_pair cp = {.src = malloc(chunks * OBJ), .dst = malloc(chunks * OBJ), .chunks = chunks};
    int rc = base <= 0 || !cp.src || !cp.dst;
    if (rc == 0) {
        memset(cp.src, 7, chunks * OBJ);
        memset(cp.dst, 1, chunks * OBJ);
    }
    for (int hnd = 0; hnd < 2 && rc == 0; hnd++)
        rc = phase(chunks, 1, 1, hnd, &cp, hnd ? 0 : iters);
    for (int hnd = 0; hnd < 2 && rc == 0; hnd++)
        rc = phase(chunks, 1, 2, hnd, &cp, 0);
    if (rc == 0)
        rc = phase(chunks, 2, 2, false, &cp, 0);
    if (rc == 0)
        rc = layerwise_phase(lw_iters);
    free(cp.src);
    free(cp.dst);
    if (rc)
        fprintf(stderr, "sd_transfer_bench: a request failed\n");
    return rc;
}
