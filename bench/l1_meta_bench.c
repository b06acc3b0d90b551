/* Heap metadata per resident L1 object: what the L1 tier spends in malloc
 * (entry, key, table slots, LRU, allocator) for each object it holds, as
 * opposed to the object's own bytes in the arena.
 *
 *   l1_meta_bench [--objects N] [--size BYTES] [--batch KEYS]
 *                 (defaults 245760 512 256)
 *
 * Stores N distinct keys (an interned model name, a 32-byte chunk hash, as a
 * prompt's chunk keys are) through a storage manager with private memory and
 * LRU eviction, in batches like a PREPARE/COMMIT store, and divides the heap
 * growth (mallinfo2: in-use chunks + mmapped blocks) and the RSS growth
 * outside the arena mapping by N.  The goal is at most 256 B per object: a
 * node with a large L1 of small objects holds millions of them
 * (docs/storage.md, "Metadata per object").
 *
 * The L1 entry is private to the L1 manager, so its share is the total less
 * the parts measured on their own: a key table, an LRU policy and an
 * allocator fed the same keys and batches, each measured the same way. */
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "obs/log.h"
#include "storage/eviction_policy.h"
#include "storage/key_table.h"
#include "storage/l1/l1_alloc.h"
#include "storage/object_key.h"
#include "storage/storage_manager.h"
#include "storage/storage_manager_testing.h"

#define GOAL_BYTES 256.0
#define MAX_BATCH 4096
#define MODEL_NAME "meta-bench/Llama-3.1-8B-Instruct"

typedef struct footprint {
    long long heap;   /* mallinfo2: bytes in in-use chunks + mmapped blocks */
    long long rss;    /* resident bytes outside the arena mapping */
} footprint;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static long long heap_bytes(void)
{
    struct mallinfo2 mi = mallinfo2();
    return (long long)(mi.uordblks + mi.hblkhd);
}

/* Rss of the mapping that starts at `base` (0 when absent): the arena is a
 * mapping of its own, and only what lies outside it is metadata. */
static long long mapping_rss(const void *base)
{
    FILE *f = fopen("/proc/self/smaps", "r");
    if (!f)
        return 0;
    char line[512];
    bool inside = false;
    long long rss = 0;
    while (fgets(line, sizeof line, f)) {
        unsigned long start, end;
        if (sscanf(line, "%lx-%lx ", &start, &end) == 2) {
            inside = start == (unsigned long)base;
            continue;
        }
        long long kb;
        if (inside && sscanf(line, "Rss: %lld kB", &kb) == 1) {
            rss = kb * 1024;
            break;
        }
    }
    fclose(f);
    return rss;
}

static footprint measure(const void *arena_base)
{
    long long pages = 0, resident = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (f) {
        if (fscanf(f, "%lld %lld", &pages, &resident) != 2)
            resident = 0;
        fclose(f);
    }
    long long rss = resident * sysconf(_SC_PAGESIZE);
    if (arena_base)
        rss -= mapping_rss(arena_base);
    return (footprint){heap_bytes(), rss};
}

/* Chunk i's key: fresh 32-byte hashes, as blake3 chains give. */
static void make_key(lmc_object_key *k, size_t i, const char *model, const char *salt)
{
    memset(k, 0, sizeof *k);
    uint64_t x = 0x9e3779b97f4a7c15ULL * (i + 1);
    for (int w = 0; w < 4; w++) {
        x += 0x9e3779b97f4a7c15ULL;
        uint64_t z = x;
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
        z ^= z >> 31;
        memcpy(&k->chunk_hash[w * 8], &z, 8);
    }
    k->chunk_hash_len = LMC_CHUNK_HASH_MAX;
    k->kv_rank = lmc_kv_rank_for_worker(1, 0);
    k->object_group_id = 0;
    k->model_name = model;
    k->cache_salt = salt;
}

static void make_batch(lmc_object_key *keys, size_t first, size_t n, const char *model,
                       const char *salt)
{
    for (size_t i = 0; i < n; i++)
        make_key(&keys[i], first + i, model, salt);
}

/* Every storage-manager write call of the benchmark is here, so that a
 * change of the write API touches this function only.  A store as a
 * PREPARE/COMMIT makes it: reserve the batch, then publish it.  0, or -1
 * when any key was not stored. */
static int store_batch(lmc_storage_manager *sm, const lmc_object_key *keys, size_t n,
                       uint64_t object_size)
{
    lmc_lease leases[MAX_BATCH];
    lmc_l1_result results[MAX_BATCH];
    if (n > MAX_BATCH ||
        lmc_storage_manager_lease_write(sm, keys, n, object_size, false, NULL, leases,
                                        results) != 0)
        return -1;
    for (size_t i = 0; i < n; i++)
        if (results[i] != LMC_L1_SUCCESS)
            return -1;
    if (lmc_storage_manager_publish_writes(sm, keys, leases, n, 0, results) != 0)
        return -1;
    for (size_t i = 0; i < n; i++)
        if (results[i] != LMC_L1_SUCCESS)
            return -1;
    return 0;
}

typedef struct params {
    size_t objects;
    uint64_t size;
    size_t batch;
    uint64_t align;
} params;

/* The same key table the L1 manager keeps, grown the same way. */
static double key_table_share(const params *p, const lmc_object_key *all)
{
    lmc_key_table t;
    if (lmc_key_table_init(&t, 0, 1024) != 0)
        return -1;
    long long empty = heap_bytes();
    for (size_t i = 0; i < p->objects; i++)
        if (lmc_key_table_insert(&t, (void *)&all[i]) != 0)
            return -1;
    double share = (double)(heap_bytes() - empty) / (double)p->objects;
    double slots = (double)lmc_key_table_memory(&t) / (double)p->objects;
    size_t capacity = t.capacity;
    lmc_key_table_destroy(&t);
    printf("  L1 key table         %7.1f   %zu slots for %zu items (%.1f B/object in slot "
           "arrays)\n",
           share, capacity, p->objects, slots);
    return share;
}

/* The LRU policy fed what the L1 manager tells it on a store: each batch
 * once when reserved and once when published. */
static double lru_share(const params *p, const lmc_object_key *all)
{
    lmc_eviction_policy *lru = lmc_eviction_policy_lru_new();
    if (!lru)
        return -1;
    long long empty = heap_bytes();
    for (size_t first = 0; first < p->objects; first += p->batch) {
        size_t n = p->objects - first < p->batch ? p->objects - first : p->batch;
        lru->ops->on_keys_added(lru, &all[first], n);
        lru->ops->on_keys_added(lru, &all[first], n);
    }
    double share = (double)(heap_bytes() - empty) / (double)p->objects;
    size_t tracked = lru->ops->num_tracked(lru);
    lmc_eviction_policy_free(lru);
    printf("  LRU policy           %7.1f   %zu keys tracked\n", share, tracked);
    return share;
}

static double allocator_share(const params *p)
{
    uint64_t unit = 0;
    uint64_t offsets[MAX_BATCH];
    lmc_l1_alloc *a = lmc_l1_alloc_new(p->align, 0);
    if (!a)
        return -1;
    uint64_t heap = (p->size + p->align - 1) / p->align * p->align * p->objects;
    lmc_l1_alloc_sbrk(a, heap + p->align);
    long long empty = heap_bytes();
    for (size_t first = 0; first < p->objects; first += p->batch) {
        size_t n = p->objects - first < p->batch ? p->objects - first : p->batch;
        if (lmc_l1_alloc_batch(a, p->size, n, offsets, &unit) != 0)
            return -1;
    }
    double share = (double)(heap_bytes() - empty) / (double)p->objects;
    size_t blocks = lmc_l1_alloc_free_block_count(a);
    lmc_l1_alloc_destroy(a);
    printf("  allocator            %7.1f   %zu free blocks; allocated blocks carry no "
           "record\n",
           share, blocks);
    return share;
}

static int parse_args(int argc, char **argv, params *p)
{
    if (argc % 2 == 0)
        return -1;   /* every option takes a value */
    for (int i = 1; i < argc; i += 2) {
        const char *v = argv[i + 1];
        if (strcmp(argv[i], "--objects") == 0)
            p->objects = strtoull(v, NULL, 10);
        else if (strcmp(argv[i], "--size") == 0)
            p->size = strtoull(v, NULL, 10);
        else if (strcmp(argv[i], "--batch") == 0)
            p->batch = strtoull(v, NULL, 10);
        else
            return -1;
    }
    return p->objects && p->size && p->batch && p->batch <= MAX_BATCH ? 0 : -1;
}

int main(int argc, char **argv)
{
    params p = {.objects = 245760, .size = 512, .batch = 256};
    if (parse_args(argc, argv, &p) != 0) {
        fprintf(stderr, "usage: %s [--objects N] [--size BYTES] [--batch KEYS<=%d]\n", argv[0],
                MAX_BATCH);
        return 2;
    }
    lmc_log_set_level(LMC_LOG_WARNING);
    lmc_key_interner *in = lmc_key_interner_new();
    const char *model = in ? lmc_intern(in, MODEL_NAME, strlen(MODEL_NAME)) : NULL;
    const char *salt = in ? lmc_intern(in, "", 0) : NULL;
    lmc_object_key *batch = malloc(p.batch * sizeof *batch);
    if (!model || !salt || !batch)
        return 1;

    /* As `make run` (LRU, default alignment), with private memory, the
     * controller thread off so that nothing is evicted while measuring,
     * and room for every object below the eviction watermark. */
    lmc_storage_options o;
    lmc_storage_options_defaults(&o);
    p.align = o.l1_align_bytes;
    uint64_t aligned = (p.size + p.align - 1) / p.align * p.align;
    o.l1_size_bytes = (uint64_t)((double)(aligned * p.objects) / o.eviction_trigger_watermark) +
                      64 * p.align;
    o.l1_use_lazy = false;
    o.shm_auto = false;
    o.shm_name[0] = '\0';
    o.eviction_period_ms = 0;
    char err[256];
    lmc_storage_manager *sm = lmc_storage_manager_create(&o, err, sizeof err);
    if (!sm) {
        fprintf(stderr, "storage manager: %s\n", err);
        return 1;
    }
    const void *arena = lmc_storage_manager_l1_arena(sm)->base;

    footprint before = measure(arena);
    double t0 = now_s();
    for (size_t first = 0; first < p.objects; first += p.batch) {
        size_t n = p.objects - first < p.batch ? p.objects - first : p.batch;
        make_batch(batch, first, n, model, salt);
        if (store_batch(sm, batch, n, p.size) != 0) {
            fprintf(stderr, "store of keys %zu..%zu failed\n", first, first + n);
            return 1;
        }
    }
    double elapsed = now_s() - t0;
    footprint after = measure(arena);
    uint64_t used = 0, total = 0;
    lmc_storage_manager_usage(sm, &used, &total);
    size_t resident = (size_t)(used / aligned);
    if (resident != p.objects) {
        fprintf(stderr, "%zu of %zu objects resident\n", resident, p.objects);
        return 1;
    }
    double heap_per = (double)(after.heap - before.heap) / (double)p.objects;
    double rss_per = (double)(after.rss - before.rss) / (double)p.objects;
    printf("l1_meta_bench: %zu objects of %llu B (arena slot %llu B), batches of %zu, "
           "LRU, private memory; stored in %.2f s\n",
           p.objects, (unsigned long long)p.size, (unsigned long long)aligned, p.batch, elapsed);
    printf("metadata per resident object: heap %.1f B, RSS outside the arena %.1f B\n",
           heap_per, rss_per);
    printf("goal %.0f B: heap %.2fx the goal; raw object %llu B, heap metadata %.1f%% of it\n",
           GOAL_BYTES, heap_per / GOAL_BYTES, (unsigned long long)p.size,
           100.0 * heap_per / (double)p.size);
    /* What the L1 mutex is held for by a status report (the health check)
     * and, in debug builds, after every mutating call. */
    double c0 = now_s();
    bool healthy = lmc_storage_manager_check_books(sm);
    double c1 = now_s();
    json_t *status = lmc_storage_manager_report_status(sm);
    double c2 = now_s();
    json_decref(status);
    printf("books check (debug builds, every call): %.2f ms; status report: %.2f ms (%s)\n",
           (c1 - c0) * 1e3, (c2 - c1) * 1e3, healthy ? "balanced" : "NOT BALANCED");
    lmc_storage_manager_close(sm);

    /* Same keys, fed to each part on its own. */
    lmc_object_key *all = malloc(p.objects * sizeof *all);
    if (!all)
        return 1;
    make_batch(all, 0, p.objects, model, salt);
    printf("breakdown (heap B/object):\n");
    double table = key_table_share(&p, all);
    double lru = lru_share(&p, all);
    double alloc = allocator_share(&p);
    if (table < 0 || lru < 0 || alloc < 0)
        return 1;
    printf("  L1 entry and rest    %7.1f   total - L1 key table - LRU - allocator "
           "(sizeof(lmc_object_key) = %zu)\n",
           heap_per - table - lru - alloc, sizeof(lmc_object_key));
    free(all);
    free(batch);
    lmc_key_interner_free(in);
    return 0;
}
