/* L2 adapters through the asynchronous interface: mock, fs, fault_inject. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include "blake3.h"
#include "gate_backend.h"
#include "scratch_dir.h"
#include "storage/l2/l2_adapter.h"

#define OBJ 1000u   /* deliberately not a multiple of any block size */
#define N 4
#define XATTR "user.lmcache.b3"   /* docs/l2.md, "fs" */

typedef struct {
    lmc_key_interner *in;
    lmc_object_key keys[N];
    uint8_t *arena;          /* [0, N*OBJ) source, [N*OBJ, 2*N*OBJ) destination */
    uint64_t src[N], dst[N], sizes[N];
    char dir[64];
    char other_fs[64];       /* a directory on another filesystem, when used */
} fx;

static void make_key(fx *f, size_t i, const char *model)
{
    lmc_object_key *k = &f->keys[i];
    memset(k, 0, sizeof *k);
    for (int b = 0; b < 32; b++)
        k->chunk_hash[b] = (uint8_t)(i * 37 + b);
    k->chunk_hash_len = 32;
    k->kv_rank = lmc_kv_rank_for_worker(2, (uint32_t)(i % 2));
    k->model_name = lmc_intern(f->in, model, strlen(model));
    k->cache_salt = lmc_intern(f->in, "", 0);
}

static int setup(void **state)
{
    fx *f = calloc(1, sizeof *f);
    f->in = lmc_key_interner_new();
    f->arena = malloc(2 * N * OBJ);
    for (size_t i = 0; i < N; i++) {
        make_key(f, i, i == 3 ? "org/other" : "org/model");
        f->src[i] = i * OBJ;
        f->dst[i] = (N + i) * OBJ;
        f->sizes[i] = OBJ;
        for (size_t b = 0; b < OBJ; b++)
            f->arena[i * OBJ + b] = (uint8_t)(b * 7 + i);
    }
    memset(f->arena + N * OBJ, 0, N * OBJ);
    snprintf(f->dir, sizeof f->dir, "/tmp/lmc-l2-test-%ld", (long)getpid());
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fx *f = *state;
    if (f->other_fs[0])
        scratch_dir_remove(f->other_fs);
    scratch_dir_remove(f->dir);
    free(f->arena);
    lmc_key_interner_free(f->in);
    free(f);
    return 0;
}

static void wait_fd(int fd)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};
    assert_int_equal(poll(&p, 1, 10000), 1);
    lmc_l2_drain_fd(fd);
}

static int64_t store(lmc_l2_adapter *a, fx *f, size_t n)
{
    uint64_t id = lmc_l2_adapter_submit_store(a, f->keys, f->src, f->sizes, n), got;
    int64_t result;
    assert_true(id > 0);
    while (!lmc_l2_adapter_pop_completed_store(a, &got, &result))
        wait_fd(lmc_l2_adapter_event_fd(a, LMC_L2_OP_STORE));
    assert_int_equal(got, id);
    return result;
}

static void lookup(lmc_l2_adapter *a, fx *f, const uint64_t *sizes, uint8_t *found)
{
    uint64_t id = lmc_l2_adapter_submit_lookup_and_lock(a, f->keys, sizes, N);
    assert_true(id > 0);
    while (!lmc_l2_adapter_query_lookup(a, id, found))
        wait_fd(lmc_l2_adapter_event_fd(a, LMC_L2_OP_LOOKUP));
    assert_false(lmc_l2_adapter_query_lookup(a, id, found));   /* exactly once */
}

static void load(lmc_l2_adapter *a, fx *f, uint8_t *ok)
{
    memset(f->arena + N * OBJ, 0, N * OBJ);
    uint64_t id = lmc_l2_adapter_submit_load(a, f->keys, f->dst, f->sizes, N);
    assert_true(id > 0);
    while (!lmc_l2_adapter_query_load(a, id, ok))
        wait_fd(lmc_l2_adapter_event_fd(a, LMC_L2_OP_LOAD));
}

static bool same(fx *f, size_t i)
{
    return memcmp(f->arena + f->src[i], f->arena + f->dst[i], OBJ) == 0;
}

/* store 3 of 4, lookup, load, bytes equal, list, delete. */
static void common_contract(lmc_l2_adapter *a, fx *f)
{
    uint8_t found[N], ok[N];
    assert_int_equal(store(a, f, 3), 3 * OBJ);
    assert_int_equal(store(a, f, 3), 3 * OBJ);   /* existing keys: skipped, success */
    lookup(a, f, f->sizes, found);
    assert_memory_equal(found, ((uint8_t[]){1, 1, 1, 0}), N);
    load(a, f, ok);
    assert_memory_equal(ok, ((uint8_t[]){1, 1, 1, 0}), N);
    for (size_t i = 0; i < 3; i++)
        assert_true(same(f, i));
    /* Locked keys survive a delete until unlocked. */
    assert_int_equal(lmc_l2_adapter_delete(a, &f->keys[0], 1), 0);
    lmc_l2_adapter_unlock(a, f->keys, N);
    lmc_l2_usage u;
    lmc_l2_adapter_usage(a, &u);
    assert_int_equal(u.used_bytes, 3 * OBJ);
    assert_int_equal(u.num_keys, 3);
    json_t *page = lmc_l2_adapter_list_keys(a, "org/model", 2, NULL);
    assert_int_equal(json_array_size(json_object_get(page, "entries")), 2);
    const char *tok = json_string_value(json_object_get(page, "next_page_token"));
    assert_non_null(tok);
    json_t *page2 = lmc_l2_adapter_list_keys(a, "org/model", 2, tok);
    assert_int_equal(json_array_size(json_object_get(page2, "entries")), 1);
    assert_true(json_is_null(json_object_get(page2, "next_page_token")));
    json_decref(page);
    json_decref(page2);
    assert_int_equal(lmc_l2_adapter_delete(a, &f->keys[0], 1), 1);
    lookup(a, f, NULL, found);
    assert_memory_equal(found, ((uint8_t[]){0, 1, 1, 0}), N);
    lmc_l2_adapter_unlock(a, f->keys, N);
}

static void test_mock(void **state)
{
    fx *f = *state;
    lmc_l2_adapter *a = lmc_l2_adapter_new(lmc_l2_mock_new(0), f->arena, 2);
    assert_non_null(a);
    common_contract(a, f);
    json_t *st = lmc_l2_adapter_status(a);
    assert_string_equal(json_string_value(json_object_get(st, "type_name")), "mock");
    assert_true(json_integer_value(json_object_get(json_object_get(st, "counters"),
                                                   "stores_ok")) >= 2);
    json_decref(st);
    lmc_l2_adapter_close(a);
}

static lmc_l2_adapter *open_fs(fx *f, bool recover)
{
    char err[256];
    lmc_l2_fs_options o = {.base_path = f->dir, .recover_on_start = recover,
                           .verify_checksum = true, .read_ahead_size = 256};
    lmc_l2_backend *be = lmc_l2_fs_new(&o, err, sizeof err);
    assert_non_null(be);
    return lmc_l2_adapter_new(be, f->arena, 3);
}

static char *path_of(fx *f, size_t i, const char *suffix)
{
    static char path[2][1024];   /* test-only scratch; two live at a time */
    static int turn;
    char name[512];
    assert_true(lmc_object_key_to_filename(&f->keys[i], name, sizeof name) > 0);
    char *p = path[turn++ % 2];
    snprintf(p, 1024, "%s/%s%s", f->dir, name, suffix);
    return p;
}

static json_int_t fs_counter(lmc_l2_adapter *a, const char *name)
{
    json_t *st = lmc_l2_adapter_status(a);
    json_int_t v = json_integer_value(json_object_get(st, name));
    json_decref(st);
    return v;
}

static void assert_status_string(lmc_l2_adapter *a, const char *name, const char *want)
{
    json_t *st = lmc_l2_adapter_status(a);
    const char *got = json_string_value(json_object_get(st, name));
    assert_non_null(got);
    assert_string_equal(got, want);
    json_decref(st);
}

/* A new file (new inode, no xattr), as upstream or an older lmcached writes. */
static void write_file(const char *path, const void *p, size_t n)
{
    unlink(path);
    FILE *fp = fopen(path, "wb");
    assert_non_null(fp);
    assert_int_equal(fwrite(p, 1, n, fp), n);
    assert_int_equal(fclose(fp), 0);
}

/* The checksum as lmcached keeps it: BLAKE3 in lowercase hex, then '\n'. */
static void b3_hex(const uint8_t *p, size_t n, char out[65])
{
    blake3_hasher h;
    uint8_t d[32];
    char two[3];
    blake3_hasher_init(&h);
    blake3_hasher_update(&h, p, n);
    blake3_hasher_finalize(&h, d, sizeof d);
    for (int i = 0; i < 32; i++) {
        snprintf(two, sizeof two, "%02x", d[i]);
        memcpy(out + 2 * i, two, 2);
    }
    out[64] = '\n';
}

static bool exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

static void test_fs_contract_and_format(void **state)
{
    fx *f = *state;
    lmc_l2_adapter *a = open_fs(f, true);
    common_contract(a, f);
    /* Upstream format: "<model, / -> -SEP->@0x<rank>@<group>@<hash>.data",
     * raw bytes only (the checksum: test_fs_checksum_in_xattr). */
    struct stat st;
    char *p = path_of(f, 1, "");
    assert_non_null(strstr(p, "/org-SEP-model@0x02010201@0@2526"));
    assert_int_equal(stat(p, &st), 0);
    assert_int_equal(st.st_size, OBJ);
    FILE *fp = fopen(p, "rb");
    uint8_t buf[OBJ];
    assert_int_equal(fread(buf, 1, OBJ, fp), OBJ);
    fclose(fp);
    assert_memory_equal(buf, f->arena + f->src[1], OBJ);
    lmc_l2_adapter_close(a);
}

static void test_fs_recovery(void **state)
{
    fx *f = *state;
    lmc_l2_adapter *a = open_fs(f, true);
    assert_int_equal(store(a, f, N), N * OBJ);
    lmc_l2_adapter_close(a);
    a = open_fs(f, true);
    assert_int_equal(fs_counter(a, "recovered_keys"), N);
    lmc_l2_usage u;
    lmc_l2_adapter_usage(a, &u);
    assert_int_equal(u.used_bytes, N * OBJ);
    json_t *page = lmc_l2_adapter_list_keys(a, NULL, 100, NULL);
    assert_int_equal(json_array_size(json_object_get(page, "entries")), N);
    json_decref(page);
    uint8_t ok[N];
    load(a, f, ok);
    assert_memory_equal(ok, ((uint8_t[]){1, 1, 1, 1}), N);
    lmc_l2_adapter_close(a);
    a = open_fs(f, false);
    assert_int_equal(fs_counter(a, "recovered_keys"), 0);
    lmc_l2_adapter_close(a);
}

static void test_fs_corruption(void **state)
{
    fx *f = *state;
    lmc_l2_adapter *a = open_fs(f, true);
    assert_int_equal(store(a, f, N), N * OBJ);
    /* 0: a bit flip (same size); 1: truncated; 2: rewritten without a
     * checksum, as upstream writes it. */
    FILE *fp = fopen(path_of(f, 0, ""), "r+b");
    fseek(fp, 10, SEEK_SET);
    fputc(0xAB ^ f->arena[10], fp);
    fclose(fp);
    assert_int_equal(truncate(path_of(f, 1, ""), OBJ / 2), 0);
    write_file(path_of(f, 2, ""), f->arena + f->src[2], OBJ);
    uint8_t found[N], ok[N];
    lookup(a, f, f->sizes, found);
    assert_memory_equal(found, ((uint8_t[]){1, 0, 1, 1}), N);
    lmc_l2_adapter_unlock(a, f->keys, N);
    assert_int_equal(fs_counter(a, "truncated_files_detected"), 1);
    load(a, f, ok);
    assert_memory_equal(ok, ((uint8_t[]){0, 0, 1, 1}), N);
    assert_true(same(f, 2) && same(f, 3));
    assert_int_equal(fs_counter(a, "corrupt_files_detected"), 1);
    /* Without a checksum a wrong size is still caught. */
    assert_int_equal(truncate(path_of(f, 2, ""), OBJ - 1), 0);
    load(a, f, ok);
    assert_memory_equal(ok, ((uint8_t[]){0, 0, 0, 1}), N);
    lmc_l2_adapter_close(a);
}

static json_int_t max_parts(lmc_l2_adapter *a)
{
    return fs_counter(a, "max_parts_in_flight");
}

/* Issue 18: one task's keys run on every worker at once (one key a part
 * here), and an adapter with a single worker still does the whole task. */
static void test_parts_run_in_parallel(void **state)
{
    fx *f = *state;
    for (int workers = 1; workers <= N; workers += N - 1) {
        gate *g;
        lmc_l2_adapter *a = lmc_l2_adapter_new(gate_new(lmc_l2_mock_new(0), workers, -1, &g),
                                               f->arena, (size_t)workers);
        assert_int_equal(store(a, f, N), N * OBJ);
        assert_int_equal(gate_max_inside(g), workers);
        uint8_t ok[N];
        load(a, f, ok);
        assert_memory_equal(ok, ((uint8_t[]){1, 1, 1, 1}), N);
        for (size_t i = 0; i < N; i++)
            assert_true(same(f, i));
        assert_int_equal(max_parts(a), workers);
        lmc_l2_adapter_close(a);
    }
}

/* Issue 18: a file corrupted on disk while the loads of the other chunks
 * run beside it is a miss; the others load. */
static void test_fs_corruption_during_parallel_load(void **state)
{
    fx *f = *state;
    char err[256];
    lmc_l2_fs_options o = {.base_path = f->dir, .verify_checksum = true};
    gate *g;
    lmc_l2_backend *fs = lmc_l2_fs_new(&o, err, sizeof err);
    assert_non_null(fs);
    lmc_l2_adapter *a = lmc_l2_adapter_new(gate_new(fs, N, -1, &g), f->arena, N);
    assert_int_equal(store(a, f, N), N * OBJ);
    FILE *fp = fopen(path_of(f, 1, ""), "r+b");
    fseek(fp, OBJ / 2, SEEK_SET);
    fputc(0x5A ^ f->arena[f->src[1] + OBJ / 2], fp);
    fclose(fp);
    uint8_t ok[N];
    load(a, f, ok);
    assert_memory_equal(ok, ((uint8_t[]){1, 0, 1, 1}), N);
    assert_true(same(f, 0) && same(f, 2) && same(f, 3));
    assert_int_equal(fs_counter(a, "corrupt_files_detected"), 1);
    assert_int_equal(gate_max_inside(g), N);
    lmc_l2_adapter_close(a);
}

/* Issue 18: the checksum is an xattr of the data file (set before its
 * rename), so no sidecar is created; a wrong xattr makes the object a miss. */
static void test_fs_checksum_in_xattr(void **state)
{
    fx *f = *state;
    lmc_l2_adapter *a = open_fs(f, true);
    assert_int_equal(store(a, f, N), N * OBJ);
    for (size_t i = 0; i < N; i++) {
        char got[80], want[65];
        b3_hex(f->arena + f->src[i], OBJ, want);
        assert_int_equal(getxattr(path_of(f, i, ""), XATTR, got, sizeof got), 64);
        assert_memory_equal(got, want, 64);
        assert_false(exists(path_of(f, i, ".b3")));
    }
    assert_status_string(a, "checksum_in", "xattr");
    char bad[64];
    memset(bad, '0', sizeof bad);
    assert_int_equal(setxattr(path_of(f, 0, ""), XATTR, bad, sizeof bad, XATTR_REPLACE), 0);
    uint8_t ok[N];
    load(a, f, ok);
    assert_memory_equal(ok, ((uint8_t[]){0, 1, 1, 1}), N);
    assert_int_equal(fs_counter(a, "corrupt_files_detected"), 1);
    lmc_l2_adapter_close(a);
}

/* Issue 18: objects an older lmcached wrote (data file + "<name>.b3"
 * sidecar, no xattr) still load, and their sidecar is still checked; the
 * xattr of a file stored now wins over a stale sidecar left beside it. */
static void test_fs_sidecar_still_read(void **state)
{
    fx *f = *state;
    lmc_l2_adapter *a = open_fs(f, true);
    for (size_t i = 0; i < 2; i++) {
        char sum[65];
        b3_hex(f->arena + f->src[i], OBJ, sum);
        sum[0] ^= (char)i;   /* key 1: a sidecar that does not match */
        write_file(path_of(f, i, ""), f->arena + f->src[i], OBJ);
        write_file(path_of(f, i, ".b3"), sum, sizeof sum);
    }
    assert_int_equal(store(a, f, 3), 3 * OBJ);   /* keys 0 and 1 exist: only 2 is written */
    char stale[65];
    memset(stale, 'f', 64);
    stale[64] = '\n';
    write_file(path_of(f, 2, ".b3"), stale, sizeof stale);
    uint8_t ok[N];
    load(a, f, ok);
    assert_memory_equal(ok, ((uint8_t[]){1, 0, 1, 0}), N);
    assert_true(same(f, 0) && same(f, 2));
    assert_int_equal(fs_counter(a, "corrupt_files_detected"), 1);
    lmc_l2_adapter_close(a);
}

/* Issue 18: where the filesystem refuses the xattr (EOPNOTSUPP, as ramfs
 * does for user xattrs; here a namespace the kernel does not know), the
 * checksum goes to a sidecar, published before the data file, and is
 * checked at load. */
static void test_fs_without_xattrs(void **state)
{
    fx *f = *state;
    char err[256];
    lmc_l2_fs_options o = {.base_path = f->dir, .verify_checksum = true,
                           .checksum_xattr = "lmctest.b3"};
    lmc_l2_backend *be = lmc_l2_fs_new(&o, err, sizeof err);
    assert_non_null(be);
    lmc_l2_adapter *a = lmc_l2_adapter_new(be, f->arena, 2);
    assert_int_equal(store(a, f, N), N * OBJ);
    assert_status_string(a, "checksum_in", "sidecar");
    for (size_t i = 0; i < N; i++) {
        char got[80], want[65];
        b3_hex(f->arena + f->src[i], OBJ, want);
        FILE *fp = fopen(path_of(f, i, ".b3"), "rb");
        assert_non_null(fp);
        assert_int_equal(fread(got, 1, sizeof got, fp), 65);
        fclose(fp);
        assert_memory_equal(got, want, 65);
    }
    FILE *fp = fopen(path_of(f, 3, ""), "r+b");
    fseek(fp, OBJ / 2, SEEK_SET);
    fputc(0x11 ^ f->arena[f->src[3] + OBJ / 2], fp);
    fclose(fp);
    uint8_t ok[N];
    load(a, f, ok);
    assert_memory_equal(ok, ((uint8_t[]){1, 1, 1, 0}), N);
    assert_int_equal(fs_counter(a, "corrupt_files_detected"), 1);
    lmc_l2_adapter_close(a);
}

/* ---- writes and renames that fail (issue 29) ----------------------------- */

static json_int_t adapter_counter(lmc_l2_adapter *a, const char *name)
{
    json_t *st = lmc_l2_adapter_status(a);
    json_int_t v = json_integer_value(json_object_get(json_object_get(st, "counters"), name));
    json_decref(st);
    return v;
}

/* Entries of `dir` whose names end in `suffix` ("" counts all). */
static int count_entries(const char *dir, const char *suffix)
{
    DIR *d = opendir(dir);
    assert_non_null(d);
    struct dirent *e;
    int n = 0;
    size_t sl = strlen(suffix);
    while ((e = readdir(d)) != NULL) {
        size_t l = strlen(e->d_name);
        if (e->d_name[0] != '.' && l >= sl && strcmp(e->d_name + l - sl, suffix) == 0)
            n++;
    }
    closedir(d);
    return n;
}

/* docs/l2.md, "fs": a store writes a temp file and renames it onto the
 * final name.  After keys 0..2 were stored with the store of keys 1 and 2
 * failing: the task failed and was counted, the failed keys left no file
 * at all (no half-written temp file, no data file, no sidecar), usage
 * counts key 0 only, and key 0 still loads. */
static void assert_failed_store_left_nothing(lmc_l2_adapter *a, fx *f, int64_t result,
                                             const char *tmp_dir)
{
    assert_int_equal(result, -1);
    assert_int_equal(adapter_counter(a, "stores_ok"), 1);
    assert_int_equal(adapter_counter(a, "stores_failed"), 1);
    assert_int_equal(fs_counter(a, "io_errors"), 2);
    for (size_t i = 1; i < 3; i++) {
        assert_false(exists(path_of(f, i, "")));
        assert_false(exists(path_of(f, i, ".b3")));
    }
    assert_int_equal(count_entries(tmp_dir, ".tmp"), 0);
    assert_int_equal(count_entries(f->dir, ".data"), 1);
    lmc_l2_usage u;
    lmc_l2_adapter_usage(a, &u);
    assert_int_equal(u.used_bytes, OBJ);
    assert_int_equal(u.num_keys, 1);
    uint8_t found[N], ok[N];
    lookup(a, f, f->sizes, found);
    assert_memory_equal(found, ((uint8_t[]){1, 0, 0, 0}), N);
    lmc_l2_adapter_unlock(a, f->keys, N);
    load(a, f, ok);
    assert_memory_equal(ok, ((uint8_t[]){1, 0, 0, 0}), N);
    assert_true(same(f, 0));
}

/* ...and once the cause is gone the same adapter stores them. */
static void assert_stores_again(lmc_l2_adapter *a, fx *f)
{
    assert_int_equal(store(a, f, 3), 3 * OBJ);
    assert_int_equal(adapter_counter(a, "stores_ok"), 2);
    uint8_t ok[N];
    load(a, f, ok);
    assert_memory_equal(ok, ((uint8_t[]){1, 1, 1, 0}), N);
    assert_true(same(f, 0) && same(f, 1) && same(f, 2));
}

/* A write that fails half way (EFBIG: the file size limit, which binds
 * root too, as a full disk would with ENOSPC). */
static void test_fs_write_failure_leaves_nothing(void **state)
{
    fx *f = *state;
    lmc_l2_adapter *a = open_fs(f, true);
    assert_int_equal(store(a, f, 1), OBJ);
    struct rlimit was, small;
    assert_int_equal(getrlimit(RLIMIT_FSIZE, &was), 0);
    small = was;
    small.rlim_cur = OBJ / 2;     /* the first half of each object lands */
    void (*old_handler)(int) = signal(SIGXFSZ, SIG_IGN);  /* EFBIG, not death */
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &small), 0);
    int64_t r = store(a, f, 3);   /* key 0 exists: skipped; 1 and 2 fail */
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &was), 0);
    signal(SIGXFSZ, old_handler);
    assert_failed_store_left_nothing(a, f, r, f->dir);
    assert_stores_again(a, f);
    lmc_l2_adapter_close(a);
}

/* A rename that fails after the whole temp file was written: the temp
 * directory (relative_tmp_dir, here a link) is on another filesystem,
 * so rename() answers EXDEV, whoever runs the test. */
static void test_fs_rename_failure_leaves_nothing(void **state)
{
    fx *f = *state;
    char link[128];
    struct stat here, there;
    snprintf(f->other_fs, sizeof f->other_fs, "/dev/shm/lmc-l2-test-tmp-%ld", (long)getpid());
    snprintf(link, sizeof link, "%s/xdev", f->dir);
    assert_int_equal(mkdir(f->dir, 0755), 0);
    assert_int_equal(mkdir(f->other_fs, 0755), 0);
    assert_int_equal(symlink(f->other_fs, link), 0);
    assert_int_equal(stat(f->dir, &here), 0);
    assert_int_equal(stat(f->other_fs, &there), 0);
    if (here.st_dev == there.st_dev)
        fail_msg("%s and %s are on one filesystem: the rename cannot fail", f->dir,
                 f->other_fs);
    char err[256];
    lmc_l2_fs_options o = {.base_path = f->dir, .relative_tmp_dir = "xdev",
                           .recover_on_start = true, .verify_checksum = true};
    lmc_l2_backend *be = lmc_l2_fs_new(&o, err, sizeof err);
    assert_non_null(be);
    lmc_l2_adapter *a = lmc_l2_adapter_new(be, f->arena, 3);
    /* Key 0 goes in while the temp directory is on the same filesystem. */
    assert_int_equal(unlink(link), 0);
    assert_int_equal(mkdir(link, 0755), 0);
    assert_int_equal(store(a, f, 1), OBJ);
    assert_int_equal(rmdir(link), 0);
    assert_int_equal(symlink(f->other_fs, link), 0);
    int64_t r = store(a, f, 3);
    assert_failed_store_left_nothing(a, f, r, f->other_fs);
    assert_int_equal(unlink(link), 0);
    assert_int_equal(mkdir(link, 0755), 0);
    assert_stores_again(a, f);
    lmc_l2_adapter_close(a);
    assert_int_equal(count_entries(link, ""), 0);
    assert_int_equal(rmdir(link), 0);
}

/* Several checksum pieces (512 KiB each, l2_fs.c) and an odd tail; with
 * O_DIRECT, an aligned tail. */
#define BIG (3u * (512u << 10) + 1000u)
#define BIG_DIRECT (3u * (512u << 10) + 4096u)

static void big_task(lmc_l2_adapter *a, lmc_l2_op op, fx *f, const uint64_t *offs,
                     const uint64_t *sizes, uint8_t *ok)
{
    uint64_t id = op == LMC_L2_OP_STORE ? lmc_l2_adapter_submit_store(a, f->keys, offs, sizes, N)
                                        : lmc_l2_adapter_submit_load(a, f->keys, offs, sizes, N);
    int64_t result;
    uint64_t got;
    assert_true(id > 0);
    if (op == LMC_L2_OP_STORE) {
        while (!lmc_l2_adapter_pop_completed_store(a, &got, &result))
            wait_fd(lmc_l2_adapter_event_fd(a, op));
        assert_int_equal(result, (int64_t)(N * sizes[0]));
    } else {
        while (!lmc_l2_adapter_query_load(a, id, ok))
            wait_fd(lmc_l2_adapter_event_fd(a, op));
    }
}

/* A byte flipped in the middle of object 2 of N objects of `size` bytes is
 * a miss while the loads of the others run beside it on every worker, and
 * the others load intact.  With `direct` every file is read with O_DIRECT,
 * so none comes from the page cache: the pool hashes beside the reads. */
static void mid_object_corruption(fx *f, uint64_t size, bool direct)
{
    char err[256];
    size_t bytes = (2 * N * (size_t)size + 4095) / 4096 * 4096;   /* C17 7.22.3.1 */
    uint8_t *arena = aligned_alloc(4096, bytes), ok[N];
    uint64_t src[N], dst[N], sizes[N];
    assert_non_null(arena);
    for (size_t i = 0; i < N; i++) {
        src[i] = i * size, dst[i] = (N + i) * size, sizes[i] = size;
        for (size_t b = 0; b < size; b++)
            arena[src[i] + b] = (uint8_t)(b * 13 + i + b / 4096);
    }
    memset(arena + N * size, 0, N * (size_t)size);
    lmc_l2_fs_options o = {.base_path = f->dir, .verify_checksum = true, .hash_threads = 2,
                           .use_odirect = direct};
    gate *g;
    lmc_l2_backend *fs = lmc_l2_fs_new(&o, err, sizeof err);
    assert_non_null(fs);
    lmc_l2_adapter *a = lmc_l2_adapter_new(gate_new(fs, N, -1, &g), arena, N);
    big_task(a, LMC_L2_OP_STORE, f, src, sizes, NULL);
    assert_int_equal(getxattr(path_of(f, 2, ""), XATTR, err, sizeof err), 64);
    FILE *fp = fopen(path_of(f, 2, ""), "r+b");
    fseek(fp, (long)size / 2, SEEK_SET);   /* in the second piece */
    fputc(0x5A ^ arena[src[2] + size / 2], fp);
    fclose(fp);
    big_task(a, LMC_L2_OP_LOAD, f, dst, sizes, ok);
    assert_memory_equal(ok, ((uint8_t[]){1, 1, 0, 1}), N);
    for (size_t i = 0; i < N; i++)
        assert_true(i == 2 || memcmp(arena + src[i], arena + dst[i], size) == 0);
    assert_int_equal(fs_counter(a, "corrupt_files_detected"), 1);
    if (direct)
        assert_int_equal(fs_counter(a, "cached_loads"), 0);
    assert_int_equal(gate_max_inside(g), N);
    lmc_l2_adapter_close(a);
    free(arena);
}

/* Issue 18: a byte flipped in the middle of a multi-piece object is a miss
 * (the checksum is verified while each is read). */
static void test_fs_mid_object_corruption_parallel(void **state)
{
    mid_object_corruption(*state, BIG, false);
}

/* Whether dir's filesystem takes O_DIRECT (tmpfs does not); dir is made. */
static bool direct_io_works(const char *dir)
{
    char p[1100];
    snprintf(p, sizeof p, "%s/direct-probe", dir);
    mkdir(dir, 0755);
    int fd = open(p, O_CREAT | O_WRONLY | O_DIRECT, 0600);
    if (fd >= 0) {
        close(fd);
        unlink(p);
    }
    return fd >= 0;
}

/* The same read from the disk, deterministically: a page-cache read
 * cannot stand in for it here.  The scratch directory moves to /var/tmp or
 * the working directory (ctest's: the build tree) where /tmp is a tmpfs. */
static void test_fs_mid_object_corruption_direct(void **state)
{
    fx *f = *state;
    const char *where[] = {"/var/tmp", "."};
    bool works = direct_io_works(f->dir);
    for (size_t i = 0; !works && i < sizeof where / sizeof where[0]; i++) {
        scratch_dir_remove(f->dir);
        snprintf(f->dir, sizeof f->dir, "%s/lmc-l2-direct-%ld", where[i], (long)getpid());
        works = direct_io_works(f->dir);
    }
    if (!works) {
        const char *ci = getenv("CI");
        if (ci && strcmp(ci, "true") == 0)
            fail_msg("no scratch directory takes O_DIRECT, and CI=true requires this test");
        skip();
    }
    mid_object_corruption(f, BIG_DIRECT, true);
}

static void test_fault_inject(void **state)
{
    fx *f = *state;
    lmc_l2_fault_options all = {.fail_rate = 1.0, .seed = 1};
    lmc_l2_adapter *a = lmc_l2_adapter_new(lmc_l2_fault_new(lmc_l2_mock_new(0), &all),
                                           f->arena, 1);
    uint8_t found[N];
    assert_int_equal(store(a, f, N), -1);
    lookup(a, f, NULL, found);
    assert_memory_equal(found, ((uint8_t[]){0, 0, 0, 0}), N);
    lmc_l2_adapter_close(a);

    lmc_l2_fault_options none = {.delay_rate = 1.0, .delay_ms = 5, .seed = 2};
    a = lmc_l2_adapter_new(lmc_l2_fault_new(lmc_l2_mock_new(0), &none), f->arena, 1);
    common_contract(a, f);
    json_t *st = lmc_l2_adapter_status(a);
    json_t *fi = json_object_get(st, "fault_inject");
    assert_true(json_integer_value(json_object_get(fi, "delayed")) > 0);
    assert_int_equal(json_integer_value(json_object_get(fi, "failed")), 0);
    json_decref(st);
    lmc_l2_adapter_close(a);
}

/* Same seed, same decisions: a failing run is reproducible. */
static void test_fault_inject_seeded(void **state)
{
    fx *f = *state;
    int64_t runs[2][16];
    for (int r = 0; r < 2; r++) {
        lmc_l2_fault_options half = {.fail_rate = 0.5, .seed = 42};
        lmc_l2_adapter *a = lmc_l2_adapter_new(lmc_l2_fault_new(lmc_l2_mock_new(0), &half),
                                               f->arena, 1);
        for (int i = 0; i < 16; i++)
            runs[r][i] = store(a, f, 1);
        lmc_l2_adapter_close(a);
    }
    assert_memory_equal(runs[0], runs[1], sizeof runs[0]);
    int fails = 0;
    for (int i = 0; i < 16; i++)
        fails += runs[0][i] < 0;
    assert_true(fails > 0 && fails < 16);
}

static void test_from_json(void **state)
{
    fx *f = *state;
    char err[256], text[256];
    size_t workers = 0;
    snprintf(text, sizeof text,
             "{\"type\":\"fault_inject\",\"fail_rate\":0,\"inner\":{\"type\":\"fs\","
             "\"base_path\":\"%s\",\"num_workers\":3}}", f->dir);
    json_t *o = json_loads(text, 0, NULL);
    lmc_l2_backend *be = lmc_l2_backend_from_json(o, &workers, err, sizeof err);
    assert_non_null(be);
    assert_int_equal(workers, 3);
    assert_string_equal(be->type, "fault_inject");
    be->ops->destroy(be);
    json_decref(o);
    o = json_loads("{\"type\":\"fs\",\"base_path\":\"/tmp/x\",\"nope\":1}", 0, NULL);
    assert_null(lmc_l2_backend_from_json(o, &workers, err, sizeof err));
    assert_non_null(strstr(err, "unknown field \"nope\""));
    json_decref(o);
    o = json_loads("{\"type\":\"gcs\"}", 0, NULL);
    assert_null(lmc_l2_backend_from_json(o, &workers, err, sizeof err));
    assert_non_null(strstr(err, "unknown L2 adapter type 'gcs'"));
    json_decref(o);
    o = json_loads("{\"type\":\"s3\"}", 0, NULL);
    assert_null(lmc_l2_backend_from_json(o, &workers, err, sizeof err));
    assert_non_null(strstr(err, "needs \"s3_endpoint\""));
    json_decref(o);
    o = json_loads("{\"type\":\"s3\",\"s3_endpoint\":\"nodot\"}", 0, NULL);
    assert_null(lmc_l2_backend_from_json(o, &workers, err, sizeof err));
    assert_non_null(strstr(err, "<bucket>.<host>"));
    json_decref(o);
    o = json_loads("{\"type\":\"resp\",\"host\":\"h\",\"port\":0}", 0, NULL);
    assert_null(lmc_l2_backend_from_json(o, &workers, err, sizeof err));
    json_decref(o);
    o = json_loads("{\"type\":\"fault_inject\"}", 0, NULL);
    assert_null(lmc_l2_backend_from_json(o, &workers, err, sizeof err));
    assert_non_null(strstr(err, "needs \"inner\""));
    json_decref(o);
}

/* The common fields are honoured or refused by name (issue 17). */
static void test_common_fields_refused_where_ignored(void **state)
{
    (void)state;
    static const struct {
        const char *json, *why;
    } refused[] = {
        {"{\"type\":\"mock\",\"persist_enabled\":false}", "\"persist_enabled\": false"},
        {"{\"type\":\"fault_inject\",\"max_capacity_gb\":1,\"inner\":{\"type\":\"mock\"}}",
         "\"max_capacity_gb\""},
        {"{\"type\":\"fault_inject\",\"inner\":{\"type\":\"mock\",\"eviction\":{}}}",
         "\"eviction\""},
        {"{\"type\":\"fault_inject\",\"inner\":{\"type\":\"mock\",\"shared\":true}}",
         "\"shared\""},
        {"{\"type\":\"fault_inject\",\"inner\":{\"type\":\"mock\",\"affinity_tag\":\"a\"}}",
         "\"affinity_tag\""},
    };
    char err[256];
    size_t workers;
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        json_t *o = json_loads(refused[i].json, 0, NULL);
        err[0] = '\0';
        lmc_l2_backend *be = lmc_l2_backend_from_json(o, &workers, err, sizeof err);
        if (be)
            be->ops->destroy(be);
        assert_null(be);
        assert_non_null(strstr(err, refused[i].why));
        json_decref(o);
    }
    json_t *o = json_loads("{\"type\":\"fault_inject\",\"persist_enabled\":true,\"shared\":true,"
                           "\"inner\":{\"type\":\"mock\",\"max_capacity_gb\":1}}", 0, NULL);
    lmc_l2_backend *be = lmc_l2_backend_from_json(o, &workers, err, sizeof err);
    assert_non_null(be);
    lmc_l2_usage u = {0};
    be->ops->usage(be, &u);
    assert_int_equal(u.capacity_bytes, 1ull << 30);   /* the inner adapter's capacity */
    be->ops->destroy(be);
    json_decref(o);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_mock, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fs_contract_and_format, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fs_recovery, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fs_corruption, setup, teardown),
        cmocka_unit_test_setup_teardown(test_parts_run_in_parallel, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fs_corruption_during_parallel_load, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_fs_checksum_in_xattr, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fs_sidecar_still_read, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fs_without_xattrs, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fs_write_failure_leaves_nothing, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fs_rename_failure_leaves_nothing, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fs_mid_object_corruption_parallel, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_fs_mid_object_corruption_direct, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_fault_inject, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fault_inject_seeded, setup, teardown),
        cmocka_unit_test_setup_teardown(test_from_json, setup, teardown),
        cmocka_unit_test(test_common_fields_refused_where_ignored),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
