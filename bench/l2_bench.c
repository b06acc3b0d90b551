/* L2 fs tier against the disk (issue 18): write-behind of one (or two)
 * prompts to an fs adapter and the prefetch that LOOKUP + QUERY waits for,
 * each beside `dd` direct I/O of the same number of bytes on the same
 * filesystem, back to back and repeated (the disk is bursty).
 *
 *   l2_bench [--dir DIR] [--chunks N] [--chunk-mb M] [--reps R]
 *            [--workers W] [--odirect]
 *
 * Defaults: DIR = ./l2_bench.dir (removed at the end), 128 chunks of 2 MiB
 * (a 32k-token prompt at 256 tokens a chunk), 3 repetitions, the adapter's
 * default worker count.  The tier runs in this process over a real storage
 * manager, so the numbers are the tier's own (no RPC; LOOKUP + QUERY adds
 * one round trip, docs/l2.md "Prefetch (LOOKUP)").
 *
 * Rows, each lmcached vs its baseline:
 *   store       publish of the prompt -> every chunk written (write-behind),
 *               vs `dd if=/dev/zero oflag=direct` of the same bytes;
 *   load cold   prefetch with the files dropped from the page cache
 *               (fdatasync + POSIX_FADV_DONTNEED), vs `dd iflag=direct`;
 *   load warm   prefetch with the files in the page cache, vs a memcpy of
 *               the same bytes;
 *   x2          the same with two prompts in flight at once, vs one dd
 *               stream of both prompts' bytes.
 *
 * With --adapter JSON (any --l2-adapter object, e.g. resp or s3) the rows
 * are "store" and "load" of one prompt, each right after its baseline: a
 * shell command (--store-baseline, --load-baseline) that moves the same
 * bytes, timed from start to exit.  --prepare CMD runs, untimed, before
 * each of the two stores, so that both find the server in the same state
 * (Redis: no retained free memory to reuse).  bench/l2_net_bench.sh starts
 * Redis and s3rver and pairs them with redis-benchmark and curl (issue 18). */
#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "storage/l2/l2_service.h"
#include "storage/storage_config.h"
#include "storage/storage_manager.h"

#define MAX_PROMPTS 2

typedef struct {
    const char *dir;
    const char *adapter, *store_base, *load_base;   /* --adapter mode */
    const char *prepare;                            /* untimed, before each store */
    size_t chunks, workers;
    uint64_t chunk;
    int reps;
    bool odirect;
    lmc_config cfg;
    lmc_storage_manager *sm;
    lmc_key_interner *in;
    lmc_object_key *keys[MAX_PROMPTS];
    lmc_lease *leases[MAX_PROMPTS];
    uint64_t next_key;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    size_t done, hit_units;
} bench;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void die(const char *what)
{
    fprintf(stderr, "l2_bench: %s\n", what);
    exit(1);
}

static json_int_t counter(bench *b, const char *section, const char *name)
{
    json_t *st = lmc_storage_manager_report_status(b->sm);
    json_int_t v = json_integer_value(json_object_get(json_object_get(st, section), name));
    json_decref(st);
    return v;
}

/* Fresh keys for prompt p (never stored before in this directory). */
static void new_keys(bench *b, int p)
{
    for (size_t i = 0; i < b->chunks; i++) {
        lmc_object_key *k = &b->keys[p][i];
        memset(k, 0, sizeof *k);
        k->chunk_hash_len = 32;
        uint64_t id = ++b->next_key, pid = (uint64_t)getpid();
        memcpy(k->chunk_hash, &id, sizeof id);
        memcpy(k->chunk_hash + 8, &pid, sizeof pid);
        k->model_name = lmc_intern(b->in, "bench", 5);
        k->cache_salt = lmc_intern(b->in, "", 0);
    }
}

/* Puts prompt p into L1 (filled, unpublished leases in b->leases[p]). */
static void fill_prompt(bench *b, int p)
{
    lmc_l1_result *res = calloc(b->chunks, sizeof *res);
    uint8_t *base = lmc_storage_manager_l1_arena(b->sm)->base;
    if (!res || lmc_storage_manager_lease_write(b->sm, b->keys[p], b->chunks, b->chunk, false,
                                                "bench", b->leases[p], res) != 0)
        die("lease_write failed");
    for (size_t i = 0; i < b->chunks; i++) {
        if (res[i] != LMC_L1_SUCCESS)
            die("L1 too small");
        uint8_t *d = base + b->leases[p][i].offset;
        for (uint64_t o = 0; o < b->chunk; o += 8) {
            uint64_t v = (o + 1) * 0x9e3779b97f4a7c15ULL ^ b->keys[p][i].chunk_hash[0];
            memcpy(d + o, &v, 8);
        }
    }
    free(res);
}

static void publish_prompt(bench *b, int p)
{
    lmc_l1_result *res = calloc(b->chunks, sizeof *res);
    if (!res || lmc_storage_manager_publish_writes(b->sm, b->keys[p], b->leases[p], b->chunks, 0,
                                                   res) != 0)
        die("publish failed");
    free(res);
}

/* Seconds from publishing `np` prompts to the end of their write-behind. */
static double store_prompts(bench *b, int np)
{
    json_int_t want = counter(b, "store_controller", "keys_submitted") +
                      (json_int_t)(np * b->chunks);
    json_int_t failed = counter(b, "store_controller", "stores_failed");
    for (int p = 0; p < np; p++) {
        new_keys(b, p);
        fill_prompt(b, p);
    }
    double t0 = now_s();
    for (int p = 0; p < np; p++)
        publish_prompt(b, p);
    while (counter(b, "store_controller", "keys_submitted") < want ||
           counter(b, "store_controller", "batches_in_flight") > 0)
        nanosleep(&(struct timespec){0, 200000}, NULL);
    double t = now_s() - t0;
    if (counter(b, "store_controller", "stores_failed") != failed)
        die("a store failed");
    return t;
}

static void on_done(void *user, size_t units)
{
    bench *b = user;
    pthread_mutex_lock(&b->mu);
    b->done++;
    b->hit_units += units;
    pthread_cond_broadcast(&b->cv);
    pthread_mutex_unlock(&b->mu);
}

/* Seconds of the prefetch of `np` prompts at once (L1 emptied first). */
static double load_prompts(bench *b, int np)
{
    if (lmc_storage_manager_clear(b->sm, false) < 0)
        die("clear failed");
    b->done = b->hit_units = 0;
    double t0 = now_s();
    for (int p = 0; p < np; p++) {
        memset(b->leases[p], 0, b->chunks * sizeof *b->leases[p]);
        lmc_l2_prefetch_request req = {.keys = b->keys[p], .leases = b->leases[p],
                                       .n = b->chunks, .keys_per_unit = 1,
                                       .object_size = b->chunk, .readers = 1,
                                       .on_done = on_done, .user = b};
        if (lmc_l2_prefetch(b->sm, &req) != 0)
            die("prefetch refused");
    }
    pthread_mutex_lock(&b->mu);
    while (b->done < (size_t)np)
        pthread_cond_wait(&b->cv, &b->mu);
    pthread_mutex_unlock(&b->mu);
    double t = now_s() - t0;
    if (b->hit_units != np * b->chunks)
        die("prefetch missed chunks");
    for (int p = 0; p < np; p++)
        lmc_storage_manager_give_back(b->sm, b->keys[p], b->leases[p], b->chunks);
    return t;
}

/* Flushes and drops every file of the directory from the page cache. */
static void drop_cache(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    char path[4096];
    while (d && (e = readdir(d)) != NULL) {
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
            continue;
        fdatasync(fd);
        posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
        close(fd);
    }
    if (d)
        closedir(d);
}

static double run_cmd(const char *cmd)
{
    double t0 = now_s();
    if (system(cmd) != 0)
        die(cmd);
    return now_s() - t0;
}

static double dd_write(bench *b, int np)
{
    char cmd[4200];
    snprintf(cmd, sizeof cmd,
             "dd if=/dev/zero of=%s/dd.bin bs=%lluM count=%zu oflag=direct status=none", b->dir,
             (unsigned long long)(b->chunk >> 20), np * b->chunks);
    return run_cmd(cmd);
}

static double dd_read(bench *b)
{
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "dd if=%s/dd.bin of=/dev/null bs=%lluM iflag=direct status=none",
             b->dir, (unsigned long long)(b->chunk >> 20));
    return run_cmd(cmd);
}

static double memcpy_time(size_t bytes)
{
    uint8_t *src = malloc(bytes), *dst = malloc(bytes);
    if (!src || !dst)
        die("out of memory");
    memset(src, 1, bytes);
    memset(dst, 2, bytes);
    double best = 1e9;
    for (int i = 0; i < 3; i++) {
        double t0 = now_s();
        memcpy(dst, src, bytes);
        double t = now_s() - t0;
        best = t < best ? t : best;
    }
    free(src);
    free(dst);
    return best;
}

static void row(const char *what, const char *base, double bytes, double t, double tb)
{
    printf("%-22s lmcached %7.0f MB/s (%7.1f ms)   %-16s %7.0f MB/s (%7.1f ms)   ratio %.2f\n",
           what, bytes / t / 1e6, t * 1e3, base, bytes / tb / 1e6, tb * 1e3, tb / t);
    fflush(stdout);
}

static void one_round(bench *b, int np)
{
    double bytes = (double)np * (double)b->chunks * (double)b->chunk;
    const char *tag[] = {"", "", "x2 "};
    char what[64];
    double tb = dd_write(b, np);
    double t = store_prompts(b, np);
    snprintf(what, sizeof what, "%sstore", tag[np]);
    row(what, "dd oflag=direct", bytes, t, tb);
    drop_cache(b->dir);
    tb = dd_read(b);
    t = load_prompts(b, np);
    snprintf(what, sizeof what, "%sload cold", tag[np]);
    row(what, "dd iflag=direct", bytes, t, tb);
    t = load_prompts(b, np);   /* the files are in the page cache now */
    tb = memcpy_time((size_t)bytes);
    snprintf(what, sizeof what, "%sload warm", tag[np]);
    row(what, "memcpy", bytes, t, tb);
}

/* --adapter mode: one prompt stored and loaded, each after its baseline. */
static void net_round(bench *b)
{
    double bytes = (double)b->chunks * (double)b->chunk;
    if (b->prepare)
        run_cmd(b->prepare);
    double tb = run_cmd(b->store_base);
    if (b->prepare)
        run_cmd(b->prepare);
    double t = store_prompts(b, 1);
    row("store", "baseline", bytes, t, tb);
    tb = run_cmd(b->load_base);
    t = load_prompts(b, 1);
    row("load", "baseline", bytes, t, tb);
}

static void setup(bench *b)
{
    char spec[4400], l1[32], err[512];
    int n = snprintf(spec, sizeof spec, "{\"type\":\"fs\",\"base_path\":\"%s\",\"use_odirect\":%s",
                     b->dir, b->odirect ? "true" : "false");
    if (b->workers)
        n += snprintf(spec + n, sizeof spec - n, ",\"num_workers\":%zu", b->workers);
    snprintf(spec + n, sizeof spec - n, "}");
    if (b->adapter)
        snprintf(spec, sizeof spec, "%s", b->adapter);
    /* Both prompts stored, then their staging: 2 x 2 prompts, plus slack. */
    snprintf(l1, sizeof l1, "%.2f",
             4.0 * MAX_PROMPTS * (double)(b->chunks * b->chunk) / (1 << 30) / 2 + 0.1);
    const char *argv[] = {"l2_bench", "--l1-size-gb", l1, "--eviction-policy", "LRU",
                          "--shm-name", "", "--l2-adapter", spec, "--log-level", "WARNING",
                          NULL};
    if (lmc_config_parse(&b->cfg, 11, (char *const *)argv, NULL, NULL, err, sizeof err) !=
        LMC_CONFIG_OK)
        die(err);
    lmc_storage_options o;
    if (lmc_storage_options_from_config(&b->cfg, &o, err, sizeof err) != 0 ||
        !(b->sm = lmc_storage_manager_create(&o, err, sizeof err)) ||
        lmc_l2_attach(b->sm, &b->cfg, err, sizeof err) != 0)
        die(err);
    b->in = lmc_key_interner_new();
    for (int p = 0; p < MAX_PROMPTS; p++) {
        b->keys[p] = calloc(b->chunks, sizeof *b->keys[p]);
        b->leases[p] = calloc(b->chunks, sizeof *b->leases[p]);
        if (!b->keys[p] || !b->leases[p])
            die("out of memory");
    }
    pthread_mutex_init(&b->mu, NULL);
    pthread_cond_init(&b->cv, NULL);
    if (b->adapter)
        printf("l2_bench: %s, %zu chunks of %llu MiB\n", spec, b->chunks,
               (unsigned long long)(b->chunk >> 20));
    else
        printf("l2_bench: fs %s, %zu chunks of %llu MiB, use_odirect %s, workers %s\n", b->dir,
               b->chunks, (unsigned long long)(b->chunk >> 20), b->odirect ? "true" : "false",
               b->workers ? spec : "default");
}

int main(int argc, char **argv)
{
    bench b = {.dir = "l2_bench.dir", .chunks = 128, .chunk = 2u << 20, .reps = 3};
    for (int i = 1; i < argc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : "";
        if (!strcmp(argv[i], "--dir"))
            b.dir = v, i++;
        else if (!strcmp(argv[i], "--chunks"))
            b.chunks = strtoul(v, NULL, 10), i++;
        else if (!strcmp(argv[i], "--chunk-mb"))
            b.chunk = strtoull(v, NULL, 10) << 20, i++;
        else if (!strcmp(argv[i], "--reps"))
            b.reps = atoi(v), i++;
        else if (!strcmp(argv[i], "--workers"))
            b.workers = strtoul(v, NULL, 10), i++;
        else if (!strcmp(argv[i], "--odirect"))
            b.odirect = true;
        else if (!strcmp(argv[i], "--adapter"))
            b.adapter = v, i++;
        else if (!strcmp(argv[i], "--store-baseline"))
            b.store_base = v, i++;
        else if (!strcmp(argv[i], "--load-baseline"))
            b.load_base = v, i++;
        else if (!strcmp(argv[i], "--prepare"))
            b.prepare = v, i++;
        else
            die("usage: l2_bench [--dir DIR] [--chunks N] [--chunk-mb M] [--reps R] "
                "[--workers W] [--odirect] [--adapter JSON --store-baseline CMD "
                "--load-baseline CMD [--prepare CMD]]");
    }
    if (!b.chunks || !b.chunk || b.reps < 1 ||
        (b.adapter && (!b.store_base || !b.load_base)))
        die("bad arguments");
    setup(&b);
    for (int r = 0; r < b.reps; r++) {
        if (b.adapter) {
            net_round(&b);
            continue;
        }
        one_round(&b, 1);
        one_round(&b, 2);
    }
    lmc_storage_manager_close(b.sm);
    lmc_key_interner_free(b.in);
    lmc_config_free(&b.cfg);
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", b.dir);
    return system(cmd) == 0 ? 0 : 1;
}
