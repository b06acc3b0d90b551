#include "storage/l1/l1_arena.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "obs/log.h"

#define HUGEPAGE_BYTES (2ull << 20)

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23   /* Linux 5.14; older headers lack it */
#endif

struct lmc_l1_arena {
    lmc_l1_arena_desc desc;
    char shm_name[LMC_L1_SHM_NAME_MAX + 1];
    int shm_fd;   /* the SHM segment, held open with a shared flock; -1 if none */
    char thp[16];        /* the bracketed value of the THP setting, "" unknown */
    bool thp_requested;  /* populate asks for huge pages (MADV_HUGEPAGE) */
    _Atomic bool populate_unsupported;   /* MADV_POPULATE_WRITE said EINVAL */
};

int lmc_l1_arena_resolve_shm_name(const char *requested, pid_t pid, char *out, size_t cap)
{
    int n;
    if (!requested) {
        n = snprintf(out, cap, "%s%ld", LMC_L1_SHM_PREFIX, (long)pid);
        return n > 0 && (size_t)n < cap ? 0 : -1;
    }
    while (*requested == '/')
        requested++;
    if (*requested == '\0' || strchr(requested, '/')) {
        /* "" (or only slashes) is private; an inner '/' is not a valid name */
        if (cap == 0)
            return -1;
        out[0] = '\0';
        return strchr(requested, '/') ? -1 : 0;
    }
    bool has_prefix = strncmp(requested, LMC_L1_SHM_PREFIX, strlen(LMC_L1_SHM_PREFIX)) == 0;
    n = snprintf(out, cap, "%s%s", has_prefix ? "" : LMC_L1_SHM_PREFIX, requested);
    return n > 0 && (size_t)n < cap && n <= LMC_L1_SHM_NAME_MAX ? 0 : -1;
}

static uint64_t shm_bytes_available(void)
{
    struct statvfs vfs;
    if (statvfs("/dev/shm", &vfs) != 0)
        return UINT64_MAX;
    return (uint64_t)vfs.f_bavail * vfs.f_frsize;
}

static uint64_t shm_bytes_total(void)
{
    struct statvfs vfs;
    if (statvfs("/dev/shm", &vfs) != 0)
        return 0;
    return (uint64_t)vfs.f_blocks * vfs.f_frsize;
}

#define AUTO_RESERVE_MAX (1ull << 30)

static uint64_t resolve_reserve(int64_t requested)
{
    if (requested >= 0)
        return (uint64_t)requested;
    uint64_t eighth = shm_bytes_total() / 8;
    return eighth < AUTO_RESERVE_MAX ? eighth : AUTO_RESERVE_MAX;
}

static void warn_if_shm_too_small(uint64_t size, uint64_t reserve)
{
    uint64_t avail = shm_bytes_available();
    if (avail < size + reserve)
        LMC_WARN("/dev/shm has %llu bytes available but the L1 arena is %llu bytes, and %llu "
                 "stay free for other processes (--l1-shm-reserve-mb); the L1 will grow only "
                 "as far as /dev/shm can back it",
                 (unsigned long long)avail, (unsigned long long)size,
                 (unsigned long long)reserve);
}

/* Every lmcached holds a shared flock on its pool, so an exclusive one is
 * refused exactly while a server is using the segment. */
static bool segment_in_use(const char *path)
{
    int fd = shm_open(path, O_RDONLY, 0);
    if (fd < 0)
        return false;
    bool busy = flock(fd, LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK;
    close(fd);
    return busy;
}

/* True when /dev/shm/<name> is "lmcache_l1_pool_<pid>" (the default name)
 * and no server uses it: <pid> is not a live process here, and no process
 * holds the flock every lmcached keeps on its pool.  The lock covers
 * servers in other pid namespaces sharing /dev/shm; the pid covers
 * servers that take no lock (older versions, upstream). */
static bool abandoned_pool(const char *name)
{
    size_t plen = strlen(LMC_L1_SHM_PREFIX);
    char *end;
    if (strncmp(name, LMC_L1_SHM_PREFIX, plen) != 0 || !isdigit((unsigned char)name[plen]))
        return false;
    long pid = strtol(name + plen, &end, 10);
    if (*end != '\0' || pid <= 0 || pid == (long)getpid() ||
        kill((pid_t)pid, 0) == 0 || errno != ESRCH)
        return false;
    char path[sizeof "/dev/shm/" + 256];   /* d_name is at most 255 bytes */
    snprintf(path, sizeof path, "/dev/shm/%s", name);
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0)
        return false;   /* another user's, or gone already */
    bool unused = flock(fd, LOCK_EX | LOCK_NB) == 0;
    close(fd);
    return unused;
}

/* Removes the default-named pools of servers that are gone: a killed
 * lmcached cannot unlink its pool, and a restarted one gets a new pid, so
 * without this every crash would leave a whole L1 of tmpfs memory behind. */
static void sweep_abandoned_pools(void)
{
    DIR *d = opendir("/dev/shm");
    struct dirent *e;
    while (d && (e = readdir(d)) != NULL) {
        if (!abandoned_pool(e->d_name))
            continue;
        char path[sizeof "/" + 256];
        snprintf(path, sizeof path, "/%s", e->d_name);
        if (shm_unlink(path) == 0)
            LMC_WARN("removed shared-memory pool %s of a server that is gone", path);
    }
    if (d)
        closedir(d);
}

static int map_shm(lmc_l1_arena *arena, uint64_t size, char *err, size_t errlen)
{
    sweep_abandoned_pools();
    char path[LMC_L1_SHM_NAME_MAX + 2];
    snprintf(path, sizeof(path), "/%s", arena->shm_name);
    /* Taking over a live server's pool would hand its engines our slots. */
    if (segment_in_use(path)) {
        snprintf(err, errlen, "shared-memory pool %s is in use by another running lmcached; "
                              "give each server its own --shm-name", path);
        return -1;
    }
    if (shm_unlink(path) == 0)
        LMC_WARN("unlinked stale shared-memory segment %s", path);
    int fd = shm_open(path, O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd < 0) {
        snprintf(err, errlen, "shm_open(%s) failed: %s", path, strerror(errno));
        return -1;
    }
    if (ftruncate(fd, (off_t)size) != 0) {
        snprintf(err, errlen, "ftruncate(%s, %llu) failed: %s", path,
                 (unsigned long long)size, strerror(errno));
        goto fail;
    }
    void *base = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd, 0);
    if (base == MAP_FAILED) {
        snprintf(err, errlen, "mmap of %s (%llu bytes) failed: %s", path,
                 (unsigned long long)size, strerror(errno));
        goto fail;
    }
    flock(fd, LOCK_SH);   /* "in use", for other servers' sweeps; kept till destroy */
    arena->shm_fd = fd;
    warn_if_shm_too_small(size, arena->desc.shm_reserve);
    arena->desc.base = base;
    arena->desc.size = size;
    return 0;
fail:
    close(fd);
    shm_unlink(path);
    return -1;
}

static int map_private(lmc_l1_arena *arena, uint64_t size, bool hugepages, char *err,
                       size_t errlen)
{
    /* Hugepages are reserved at mmap time (no MAP_NORESERVE) so a too small
     * pool fails here instead of with SIGBUS on first touch. */
    int flags = MAP_PRIVATE | MAP_ANONYMOUS | (hugepages ? MAP_HUGETLB : MAP_NORESERVE);
    if (hugepages) {
        size = (size + HUGEPAGE_BYTES - 1) & ~(HUGEPAGE_BYTES - 1);
    }
    void *base = mmap(NULL, size, PROT_READ | PROT_WRITE, flags, -1, 0);
    if (base == MAP_FAILED) {
        snprintf(err, errlen, "mmap of %llu bytes%s failed: %s%s", (unsigned long long)size,
                 hugepages ? " with 2 MiB hugepages" : "", strerror(errno),
                 hugepages ? " (is the hugepage pool large enough? see "
                             "/sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages)"
                           : "");
        return -1;
    }
    arena->desc.base = base;
    arena->desc.size = size;
    arena->desc.hugepages = hugepages;
    return 0;
}

/* The selected value of a THP sysfs file, e.g. "always [advise] never". */
static void read_thp_setting(const char *path, char *out, size_t cap)
{
    out[0] = '\0';
    FILE *f = fopen(path, "re");
    if (!f)
        return;
    char line[256];
    if (fgets(line, sizeof line, f)) {
        char *open = strchr(line, '['), *close = open ? strchr(open, ']') : NULL;
        if (open && close && (size_t)(close - open - 1) < cap)
            snprintf(out, cap, "%.*s", (int)(close - open - 1), open + 1);
    }
    fclose(f);
}

/* Shared memory follows shmem_enabled, private memory `enabled`; huge
 * pages are asked for where the setting leaves them to madvise or grants
 * them anyway (docs/storage.md, "Pre-fault"). */
static void probe_thp(lmc_l1_arena *arena)
{
    read_thp_setting(arena->shm_fd >= 0 ? "/sys/kernel/mm/transparent_hugepage/shmem_enabled"
                                        : "/sys/kernel/mm/transparent_hugepage/enabled",
                     arena->thp, sizeof arena->thp);
    arena->thp_requested = !arena->desc.hugepages && arena->thp[0] &&
                           strcmp(arena->thp, "never") != 0 && strcmp(arena->thp, "deny") != 0;
}

lmc_l1_arena *lmc_l1_arena_create(const lmc_l1_arena_options *opts, char *err, size_t errlen)
{
    if (opts->size == 0) {
        snprintf(err, errlen, "L1 arena size must be > 0");
        return NULL;
    }
    lmc_l1_arena *arena = calloc(1, sizeof(*arena));
    if (!arena) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    arena->shm_fd = -1;
    if (lmc_l1_arena_resolve_shm_name(opts->shm_name, getpid(), arena->shm_name,
                                      sizeof(arena->shm_name)) != 0) {
        snprintf(err, errlen, "invalid shared-memory name '%s'", opts->shm_name);
        goto fail;
    }
    arena->desc.shm_name = arena->shm_name;
    bool use_shm = arena->shm_name[0] != '\0';
    arena->desc.shm_reserve = use_shm ? resolve_reserve(opts->shm_reserve_bytes) : 0;
    if (use_shm && opts->use_hugepages) {
        snprintf(err, errlen, "hugepages cannot be combined with a shared-memory L1; "
                              "use --shm-name \"\"");
        goto fail;
    }
    int rc = use_shm ? map_shm(arena, opts->size, err, errlen)
                     : map_private(arena, opts->size, opts->use_hugepages, err, errlen);
    if (rc != 0)
        goto fail;
    probe_thp(arena);
    return arena;
fail:
    free(arena);
    return NULL;
}

lmc_l1_populate_method lmc_l1_arena_populate(lmc_l1_arena *arena, uint64_t offset, uint64_t len)
{
    if (offset >= arena->desc.size)
        return LMC_L1_POPULATE_MADVISE;
    if (len > arena->desc.size - offset)
        len = arena->desc.size - offset;
    uint8_t *start = (uint8_t *)arena->desc.base + offset;
    if (arena->thp_requested)
        madvise(start, len, MADV_HUGEPAGE);   /* advice only: its failure changes nothing */
    if (!atomic_load(&arena->populate_unsupported)) {
        if (madvise(start, len, MADV_POPULATE_WRITE) == 0)
            return LMC_L1_POPULATE_MADVISE;
        if (errno == EINVAL)
            atomic_store(&arena->populate_unsupported, true);
    }
    /* An atomic add of 0 write-faults the page without changing a byte a
     * request may be writing at the same moment. */
    long page = sysconf(_SC_PAGESIZE);
    for (uint64_t at = 0; at < len; at += (uint64_t)(page > 0 ? page : 4096))
        __atomic_fetch_add(start + at, 0, __ATOMIC_RELAXED);
    return LMC_L1_POPULATE_TOUCH;
}

const char *lmc_l1_arena_thp_setting(const lmc_l1_arena *arena)
{
    return arena->thp;
}

bool lmc_l1_arena_thp_requested(const lmc_l1_arena *arena)
{
    return arena->thp_requested;
}

int lmc_l1_arena_commit(lmc_l1_arena *arena, uint64_t offset, uint64_t len, char *err,
                        size_t errlen)
{
    if (arena->shm_fd < 0 || len == 0)
        return 0;   /* private memory: the kernel commits it on first touch */
    uint64_t avail = shm_bytes_available(), reserve = arena->desc.shm_reserve;
    if (reserve > 0 && (avail < reserve || avail - reserve < len)) {
        snprintf(err, errlen, "cannot back bytes %llu..%llu of shared-memory pool /%s: /dev/shm "
                              "has %llu bytes available and %llu stay free for other processes "
                              "(--l1-shm-reserve-mb)",
                 (unsigned long long)offset, (unsigned long long)(offset + len), arena->shm_name,
                 (unsigned long long)avail, (unsigned long long)reserve);
        return -1;
    }
    int rc;
    do
        rc = posix_fallocate(arena->shm_fd, (off_t)offset, (off_t)len);
    while (rc == EINTR);
    if (rc == 0)
        return 0;
    snprintf(err, errlen, "cannot back bytes %llu..%llu of shared-memory pool /%s: %s "
                          "(/dev/shm has %llu bytes available)",
             (unsigned long long)offset, (unsigned long long)(offset + len), arena->shm_name,
             strerror(rc), (unsigned long long)shm_bytes_available());
    return -1;
}

const lmc_l1_arena_desc *lmc_l1_arena_describe(const lmc_l1_arena *arena)
{
    return &arena->desc;
}

void lmc_l1_arena_destroy(lmc_l1_arena *arena)
{
    if (!arena)
        return;
    munmap(arena->desc.base, arena->desc.size);
    if (arena->shm_name[0]) {
        char path[LMC_L1_SHM_NAME_MAX + 2];
        snprintf(path, sizeof(path), "/%s", arena->shm_name);
        shm_unlink(path);
    }
    if (arena->shm_fd >= 0)
        close(arena->shm_fd);
    free(arena);
}
