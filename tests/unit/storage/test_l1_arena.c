/* L1 arena: SHM naming, sharing through a second mapping, stale segment
 * replacement, refusing a live server's pool, sweeping pools of servers
 * that are gone, committing ranges, unlink on close, private memory. */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "storage/l1/l1_arena.h"

#define ARENA_BYTES (64ull << 20)

static void unique_name(char *out, size_t cap, const char *what)
{
    snprintf(out, cap, "unit_%s_%ld", what, (long)getpid());
}

static void test_name_resolution(void **state)
{
    (void)state;
    char out[LMC_L1_SHM_NAME_MAX + 1];
    assert_int_equal(lmc_l1_arena_resolve_shm_name(NULL, 4242, out, sizeof(out)), 0);
    assert_string_equal(out, "lmcache_l1_pool_4242");
    assert_int_equal(lmc_l1_arena_resolve_shm_name("", 1, out, sizeof(out)), 0);
    assert_string_equal(out, "");
    assert_int_equal(lmc_l1_arena_resolve_shm_name("mine", 1, out, sizeof(out)), 0);
    assert_string_equal(out, "lmcache_l1_pool_mine");
    assert_int_equal(lmc_l1_arena_resolve_shm_name("lmcache_l1_pool_x", 1, out, sizeof(out)), 0);
    assert_string_equal(out, "lmcache_l1_pool_x");
    assert_int_equal(lmc_l1_arena_resolve_shm_name("/lead", 1, out, sizeof(out)), 0);
    assert_string_equal(out, "lmcache_l1_pool_lead");
    assert_int_equal(lmc_l1_arena_resolve_shm_name("a/b", 1, out, sizeof(out)), -1);
    char long_name[400];
    memset(long_name, 'x', sizeof(long_name) - 1);
    long_name[sizeof(long_name) - 1] = '\0';
    assert_int_equal(lmc_l1_arena_resolve_shm_name(long_name, 1, out, sizeof(out)), -1);
}

static void *map_by_name(const char *shm_name, uint64_t *size)
{
    char path[300];
    snprintf(path, sizeof(path), "/%s", shm_name);
    int fd = shm_open(path, O_RDWR, 0);
    if (fd < 0)
        return NULL;
    struct stat st;
    assert_int_equal(fstat(fd, &st), 0);
    *size = (uint64_t)st.st_size;
    void *p = mmap(NULL, *size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    assert_true(p != MAP_FAILED);
    return p;
}

static void test_shm_shared_with_second_mapping(void **state)
{
    (void)state;
    char name[64], err[256] = "";
    unique_name(name, sizeof(name), "share");
    lmc_l1_arena_options o = {ARENA_BYTES, name, false, 0};
    lmc_l1_arena *arena = lmc_l1_arena_create(&o, err, sizeof(err));
    assert_non_null(arena);
    const lmc_l1_arena_desc *d = lmc_l1_arena_describe(arena);
    char expected[128];
    snprintf(expected, sizeof(expected), "lmcache_l1_pool_%s", name);
    assert_string_equal(d->shm_name, expected);
    assert_int_equal(d->size, ARENA_BYTES);
    uint8_t *base = d->base;
    memcpy(base + 12345, "hello", 5);
    base[ARENA_BYTES - 1] = 0x7f;
    uint64_t size = 0;
    uint8_t *other = map_by_name(d->shm_name, &size);
    assert_non_null(other);
    assert_int_equal(size, ARENA_BYTES);
    assert_memory_equal(other + 12345, "hello", 5);
    assert_int_equal(other[ARENA_BYTES - 1], 0x7f);
    other[4096] = 0x42;                               /* and the other way round */
    assert_int_equal(base[4096], 0x42);
    munmap(other, size);
    char path[300];
    snprintf(path, sizeof(path), "/%s", expected);
    lmc_l1_arena_destroy(arena);
    errno = 0;
    assert_int_equal(shm_open(path, O_RDONLY, 0), -1);   /* unlinked */
    assert_int_equal(errno, ENOENT);
}

static void test_default_name_uses_pid(void **state)
{
    (void)state;
    char err[256] = "";
    lmc_l1_arena_options o = {1 << 20, NULL, false, 0};
    lmc_l1_arena *arena = lmc_l1_arena_create(&o, err, sizeof(err));
    assert_non_null(arena);
    char expected[64];
    snprintf(expected, sizeof(expected), "lmcache_l1_pool_%ld", (long)getpid());
    assert_string_equal(lmc_l1_arena_describe(arena)->shm_name, expected);
    lmc_l1_arena_destroy(arena);
}

static void test_stale_segment_is_replaced(void **state)
{
    (void)state;
    char name[64], path[128], err[256] = "";
    unique_name(name, sizeof(name), "stale");
    snprintf(path, sizeof(path), "/lmcache_l1_pool_%s", name);
    int fd = shm_open(path, O_RDWR | O_CREAT, 0600);
    assert_true(fd >= 0);
    assert_int_equal(ftruncate(fd, 4096), 0);
    assert_int_equal(write(fd, "stale!", 6), 6);
    close(fd);
    lmc_l1_arena_options o = {ARENA_BYTES, name, false, 0};
    lmc_l1_arena *arena = lmc_l1_arena_create(&o, err, sizeof(err));
    assert_non_null(arena);
    const lmc_l1_arena_desc *d = lmc_l1_arena_describe(arena);
    uint64_t size = 0;
    uint8_t *other = map_by_name(d->shm_name, &size);
    assert_int_equal(size, ARENA_BYTES);              /* a fresh, full-size segment */
    assert_int_equal(other[0], 0);                    /* not the stale bytes */
    assert_int_equal(((uint8_t *)d->base)[0], 0);
    munmap(other, size);
    lmc_l1_arena_destroy(arena);
}

/* A pid that was just a process's and is no longer (reuse right after is
 * as unlikely as the test needs). */
static pid_t dead_pid(void)
{
    pid_t pid = fork();
    if (pid == 0)
        _exit(0);
    assert_true(pid > 0);
    assert_int_equal(waitpid(pid, NULL, 0), pid);
    return pid;
}

static int make_pool(pid_t pid)
{
    char path[64];
    snprintf(path, sizeof(path), "/lmcache_l1_pool_%ld", (long)pid);
    int fd = shm_open(path, O_RDWR | O_CREAT, 0600);
    assert_true(fd >= 0);
    assert_int_equal(ftruncate(fd, 4096), 0);
    return fd;
}

static bool pool_exists(pid_t pid)
{
    char path[64];
    snprintf(path, sizeof(path), "/dev/shm/lmcache_l1_pool_%ld", (long)pid);
    return access(path, F_OK) == 0;
}

/* Creating an SHM arena removes default-named pools whose server is gone
 * (dead pid, nobody holding the pool's flock) and keeps the others: a live
 * pid, or a pool locked by a server this process cannot see (another pid
 * namespace).  The arena itself holds that lock while it lives. */
static void test_abandoned_pools_are_swept(void **state)
{
    (void)state;
    pid_t gone = dead_pid(), hidden = dead_pid(), alive = getppid();
    close(make_pool(gone));
    int locked = make_pool(hidden);
    assert_int_equal(flock(locked, LOCK_SH), 0);
    close(make_pool(alive));
    char name[64], err[256] = "";
    unique_name(name, sizeof(name), "sweeper");
    lmc_l1_arena_options o = {1 << 20, name, false, 0};
    lmc_l1_arena *arena = lmc_l1_arena_create(&o, err, sizeof(err));
    assert_non_null(arena);
    assert_false(pool_exists(gone));
    assert_true(pool_exists(hidden));
    assert_true(pool_exists(alive));
    /* The live arena's own segment is locked against other sweepers. */
    char path[128];
    snprintf(path, sizeof(path), "/dev/shm/%s", lmc_l1_arena_describe(arena)->shm_name);
    int fd = open(path, O_RDONLY);
    assert_true(fd >= 0);
    assert_int_equal(flock(fd, LOCK_EX | LOCK_NB), -1);
    close(fd);
    lmc_l1_arena_destroy(arena);
    close(locked);
    char p2[64];
    snprintf(p2, sizeof(p2), "/lmcache_l1_pool_%ld", (long)hidden);
    shm_unlink(p2);
    snprintf(p2, sizeof(p2), "/lmcache_l1_pool_%ld", (long)alive);
    shm_unlink(p2);
}

/* A pool another running server holds is not taken over: its engines would
 * be handed the newcomer's slots.  Once that server is gone it is stale. */
static void test_live_pool_name_is_refused(void **state)
{
    (void)state;
    char name[64], err[256] = "";
    unique_name(name, sizeof(name), "taken");
    lmc_l1_arena_options o = {1 << 20, name, false, 0};
    lmc_l1_arena *first = lmc_l1_arena_create(&o, err, sizeof(err));
    assert_non_null(first);
    uint8_t *base = lmc_l1_arena_describe(first)->base;
    base[100] = 0x5c;
    assert_null(lmc_l1_arena_create(&o, err, sizeof(err)));
    assert_non_null(strstr(err, "in use by another running lmcached"));
    assert_non_null(strstr(err, "--shm-name"));
    uint64_t size = 0;
    uint8_t *other = map_by_name(lmc_l1_arena_describe(first)->shm_name, &size);
    assert_non_null(other);                    /* still the first server's segment */
    assert_int_equal(other[100], 0x5c);
    munmap(other, size);
    lmc_l1_arena_destroy(first);
    lmc_l1_arena *second = lmc_l1_arena_create(&o, err, sizeof(err));
    assert_non_null(second);
    lmc_l1_arena_destroy(second);
}

static uint64_t allocated_bytes(const char *shm_name)
{
    char path[300];
    snprintf(path, sizeof(path), "/dev/shm/%s", shm_name);
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    return (uint64_t)st.st_blocks * 512;
}

/* Committing backs exactly the range with tmpfs pages, before anyone
 * touches them; private memory has nothing to commit. */
static void test_commit_backs_range(void **state)
{
    (void)state;
    char name[64], err[256] = "";
    unique_name(name, sizeof(name), "commit");
    lmc_l1_arena_options o = {ARENA_BYTES, name, false, 0};
    lmc_l1_arena *arena = lmc_l1_arena_create(&o, err, sizeof(err));
    assert_non_null(arena);
    const char *shm = lmc_l1_arena_describe(arena)->shm_name;
    assert_int_equal(allocated_bytes(shm), 0);
    assert_int_equal(lmc_l1_arena_commit(arena, 0, 4 << 20, err, sizeof(err)), 0);
    assert_int_equal(allocated_bytes(shm), 4 << 20);
    assert_int_equal(lmc_l1_arena_commit(arena, 4 << 20, 2 << 20, err, sizeof(err)), 0);
    assert_int_equal(allocated_bytes(shm), 6 << 20);
    assert_int_equal(lmc_l1_arena_commit(arena, 0, 0, err, sizeof(err)), 0);
    lmc_l1_arena_destroy(arena);
    lmc_l1_arena_options priv = {ARENA_BYTES, "", false, 0};
    arena = lmc_l1_arena_create(&priv, err, sizeof(err));
    assert_non_null(arena);
    assert_int_equal(lmc_l1_arena_commit(arena, 0, ARENA_BYTES, err, sizeof(err)), 0);
    lmc_l1_arena_destroy(arena);
}

/* A commit that would eat into the reserve is refused whole, naming the
 * flag; the automatic reserve is an eighth of /dev/shm, at most 1 GiB. */
static void test_commit_keeps_shm_reserve(void **state)
{
    (void)state;
    char name[64], err[256] = "";
    unique_name(name, sizeof(name), "reserve");
    struct statvfs vfs;
    assert_int_equal(statvfs("/dev/shm", &vfs), 0);
    uint64_t avail = (uint64_t)vfs.f_bavail * vfs.f_frsize;
    uint64_t total = (uint64_t)vfs.f_blocks * vfs.f_frsize;
    lmc_l1_arena_options o = {ARENA_BYTES, name, false, (int64_t)(avail - (1 << 20))};
    lmc_l1_arena *arena = lmc_l1_arena_create(&o, err, sizeof(err));
    assert_non_null(arena);
    const char *shm = lmc_l1_arena_describe(arena)->shm_name;
    assert_int_equal(lmc_l1_arena_commit(arena, 0, 4 << 20, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "--l1-shm-reserve-mb"));
    assert_int_equal(allocated_bytes(shm), 0);
    lmc_l1_arena_destroy(arena);

    lmc_l1_arena_options automatic = {ARENA_BYTES, name, false, -1};
    arena = lmc_l1_arena_create(&automatic, err, sizeof(err));
    assert_non_null(arena);
    uint64_t expect = total / 8 < (1ull << 30) ? total / 8 : (1ull << 30);
    assert_int_equal(lmc_l1_arena_describe(arena)->shm_reserve, expect);
    lmc_l1_arena_destroy(arena);
}

static void test_private_memory(void **state)
{
    (void)state;
    char err[256] = "";
    lmc_l1_arena_options o = {ARENA_BYTES, "", false, 0};
    lmc_l1_arena *arena = lmc_l1_arena_create(&o, err, sizeof(err));
    assert_non_null(arena);
    const lmc_l1_arena_desc *d = lmc_l1_arena_describe(arena);
    assert_string_equal(d->shm_name, "");
    assert_int_equal(d->size, ARENA_BYTES);
    assert_false(d->hugepages);
    memset((uint8_t *)d->base + ARENA_BYTES - 4096, 0xab, 4096);
    assert_int_equal(((uint8_t *)d->base)[ARENA_BYTES - 1], 0xab);
    lmc_l1_arena_destroy(arena);
    lmc_l1_arena_destroy(NULL);
}

static long free_hugepages(void)
{
    FILE *f = fopen("/sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages", "r");
    long n = 0;
    if (f) {
        if (fscanf(f, "%ld", &n) != 1)
            n = 0;
        fclose(f);
    }
    return n;
}

static void test_hugepages(void **state)
{
    (void)state;
    char err[256] = "";
    lmc_l1_arena_options with_shm = {ARENA_BYTES, "x", true, 0};
    assert_null(lmc_l1_arena_create(&with_shm, err, sizeof(err)));
    assert_non_null(strstr(err, "hugepages"));
    lmc_l1_arena_options o = {3ull << 20, "", true, 0};   /* rounded up to 4 MiB */
    lmc_l1_arena *arena = lmc_l1_arena_create(&o, err, sizeof(err));
    if (free_hugepages() < 2) {
        assert_null(arena);
        assert_non_null(strstr(err, "hugepage"));
        return;
    }
    assert_non_null(arena);
    assert_true(lmc_l1_arena_describe(arena)->hugepages);
    assert_int_equal(lmc_l1_arena_describe(arena)->size, 4ull << 20);
    lmc_l1_arena_destroy(arena);
}

static void test_invalid_options(void **state)
{
    (void)state;
    char err[256] = "";
    lmc_l1_arena_options zero = {0, "", false, 0};
    assert_null(lmc_l1_arena_create(&zero, err, sizeof(err)));
    lmc_l1_arena_options bad_name = {4096, "a/b", false, 0};
    assert_null(lmc_l1_arena_create(&bad_name, err, sizeof(err)));
    assert_non_null(strstr(err, "a/b"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_name_resolution),
        cmocka_unit_test(test_shm_shared_with_second_mapping),
        cmocka_unit_test(test_default_name_uses_pid),
        cmocka_unit_test(test_stale_segment_is_replaced),
        cmocka_unit_test(test_abandoned_pools_are_swept),
        cmocka_unit_test(test_live_pool_name_is_refused),
        cmocka_unit_test(test_commit_backs_range),
        cmocka_unit_test(test_commit_keeps_shm_reserve),
        cmocka_unit_test(test_private_memory),
        cmocka_unit_test(test_hugepages),
        cmocka_unit_test(test_invalid_options),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
