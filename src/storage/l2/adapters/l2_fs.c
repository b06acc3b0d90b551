/* "fs" backend (docs/l2.md, "fs"): one file per object in a flat directory,
 * named by lmc_object_key_to_filename() and holding the raw object bytes,
 * so the directory is interchangeable with an upstream server's.
 *
 * Integrity (docs/l2.md, "fs"): the BLAKE3 of the data, in hex, goes into
 * the temp file's "user.lmcache.b3" xattr before its rename, so it appears
 * with the data and costs no file of its own; where the filesystem has no
 * user xattrs, into a "<name>.b3" sidecar published before the data file,
 * as lmcached did before issue 18.  The data file keeps upstream's format.
 * A load checks the size against the expected object size (a truncated
 * file is a miss) and, when an xattr or sidecar exists, the checksum (a
 * corrupted file is a miss).  Files with neither (written by upstream) are
 * accepted on size alone.  The hashing runs on the checksum pool
 * (l2_hasher.h) while the same object is written or read.
 *
 * The in-memory index (key -> size, lock count) serves accounting, listing
 * and locks; presence itself is always checked on disk, so files written by
 * another server on a shared directory are found too.  One mutex guards the
 * index and counters; file I/O runs outside it. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdatomic.h>
#include <time.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/xattr.h>
#include <unistd.h>

#include "core/hex.h"
#include "core/write_all.h"
#include "obs/log.h"
#include "storage/key_table.h"
#include "storage/l2/l2_adapter.h"
#include "storage/l2/l2_hasher.h"
#include "storage/object_key_json.h"

#define FS_PATH_MAX 4096
#define DIRECT_ALIGN 4096u
#define HEX_LEN (2 * LMC_L2_DIGEST_LEN)
/* A load hands the checksum pool this much at a time: small enough that
 * little is left to hash after the last read, large enough for O_DIRECT
 * reads to stay efficient (a multiple of DIRECT_ALIGN). */
#define HASH_PIECE (512u << 10)
#define CACHED_PIECE (256u << 10)   /* read and hashed while in the CPU's cache */

typedef struct fs_item {
    lmc_object_key key;      /* strings interned in fs.interner */
    uint64_t size;
    uint32_t locks;
    bool recovered;          /* indexed at start-up, not stored by us */
    int64_t mtime_ns;        /* of a recovered file */
} fs_item;

typedef struct fs {
    lmc_l2_backend base;     /* first */
    lmc_l2_fs_options o;
    char *base_path, *tmp_dir;
    pthread_mutex_t mu;      /* guards table, used, tmp_seq, counters */
    lmc_key_table table;
    lmc_key_interner *interner;
    uint64_t used, tmp_seq;
    uint64_t corrupt, truncated, recovered, skipped_existing, io_errors, leftovers_removed,
        cached_loads;   /* verified loads served from the page cache (read_verified) */
    lmc_l2_hasher *hasher;   /* NULL without verify_checksum */
    char *xattr;             /* name of the checksum xattr */
    atomic_bool no_xattr;    /* the filesystem refused it: sidecars from now on */
} fs;

static int key_path(const fs *f, const lmc_object_key *k, const char *suffix, char *out,
                    size_t cap)
{
    char name[1024];
    if (lmc_object_key_to_filename(k, name, sizeof name) < 0)
        return -1;
    int n = snprintf(out, cap, "%s/%s%s", f->base_path, name, suffix);
    return n > 0 && (size_t)n < cap ? 0 : -1;
}

/* ---- index ------------------------------------------------------------- */

/* Records (key, size) if new; the caller holds f->mu. */
static fs_item *index_add_locked(fs *f, const lmc_object_key *k, uint64_t size)
{
    fs_item *it = lmc_key_table_find(&f->table, k);
    if (it)
        return it;
    it = calloc(1, sizeof *it);
    if (!it)
        return NULL;
    it->key = *k;
    it->key.model_name = lmc_intern(f->interner, k->model_name, strlen(k->model_name));
    it->key.cache_salt = lmc_intern(f->interner, k->cache_salt, strlen(k->cache_salt));
    it->key.interned = 0; /* the adapter's own names: they count nothing */
    it->size = size;
    if (!it->key.model_name || !it->key.cache_salt || lmc_key_table_insert(&f->table, it)) {
        free(it);
        return NULL;
    }
    f->used += size;
    return it;
}

static void count(fs *f, uint64_t *counter)
{
    pthread_mutex_lock(&f->mu);
    (*counter)++;
    pthread_mutex_unlock(&f->mu);
}

/* ---- raw I/O ----------------------------------------------------------- */

static bool direct_ok(const fs *f, const void *buf, uint64_t size)
{
    return f->o.use_odirect && (uintptr_t)buf % DIRECT_ALIGN == 0 && size % DIRECT_ALIGN == 0;
}

/* O_DIRECT when asked for and aligned; filesystems without it (tmpfs)
 * fall back to buffered I/O. */
static int open_io(const fs *f, const char *path, int flags, const void *buf, uint64_t size)
{
    if (direct_ok(f, buf, size)) {
        int fd = open(path, flags | O_DIRECT | O_CLOEXEC, 0644);
        if (fd >= 0 || errno != EINVAL)
            return fd;
    }
    return open(path, flags | O_CLOEXEC, 0644);
}

/* Reads exactly n bytes.  The first read asks for read_ahead_size bytes
 * only, so the kernel starts read-ahead early (upstream's option); with a
 * checksum job, each HASH_PIECE read is handed to the pool and hashed while
 * the next one is read. */
static int read_all(fs *f, int fd, uint8_t *p, uint64_t n, lmc_l2_hash_job *job)
{
    uint64_t ra = f->o.read_ahead_size, want = ra && ra < n ? ra : n, got = 0;
    while (got < n) {
        uint64_t ask = n - got < want ? n - got : want;
        if (job && ask > HASH_PIECE)
            ask = HASH_PIECE;
        ssize_t r = read(fd, p + got, ask);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return -1;
        got += (uint64_t)r;
        want = n - got;
        if (job)
            lmc_l2_hash_advance(f->hasher, job, got);
    }
    return 0;
}

static int publish(fs *f, const lmc_object_key *k, const char *final, const char *name,
                   const uint8_t *p, uint64_t n, lmc_l2_hash_job *job);

/* Waits for the checksum of the object being written to `fd` and attaches
 * it: as an xattr of the temp file, or where the filesystem refuses user
 * xattrs as a sidecar published now, before the data file's rename. */
static int attach_checksum(fs *f, const lmc_object_key *k, const char *name, int fd,
                           lmc_l2_hash_job *job)
{
    uint8_t d[LMC_L2_DIGEST_LEN];
    char hex[HEX_LEN + 1], spath[FS_PATH_MAX], sname[1100];
    lmc_l2_hash_finish(f->hasher, job, d);
    lmc_hex_encode(d, LMC_L2_DIGEST_LEN, hex);
    hex[HEX_LEN] = '\n';
    if (!atomic_load(&f->no_xattr)) {
        if (fsetxattr(fd, f->xattr, hex, HEX_LEN, 0) == 0)
            return 0;
        if (errno != ENOTSUP)
            return -1;
        if (!atomic_exchange(&f->no_xattr, true))
            LMC_WARN("L2 fs: %s refuses xattr %s: checksums go to .b3 sidecars", f->base_path,
                     f->xattr);
    }
    snprintf(sname, sizeof sname, "%s.b3", name);
    if (key_path(f, k, ".b3", spath, sizeof spath) != 0)
        return -1;
    return publish(f, k, spath, sname, (const uint8_t *)hex, HEX_LEN + 1, NULL);
}

/* Writes `p` to a fresh temp file and renames it onto `final`.  With a
 * checksum job (hashing `p` meanwhile), its result is attached before the
 * rename, so the data file never appears without its checksum. */
static int publish(fs *f, const lmc_object_key *k, const char *final, const char *name,
                   const uint8_t *p, uint64_t n, lmc_l2_hash_job *job)
{
    char tmp[FS_PATH_MAX];
    pthread_mutex_lock(&f->mu);
    uint64_t seq = ++f->tmp_seq;
    pthread_mutex_unlock(&f->mu);
    /* Unique per write: two workers storing the same key never share one. */
    int len = snprintf(tmp, sizeof tmp, "%s/%s.%ld.%llu.tmp", f->tmp_dir, name, (long)getpid(),
                       (unsigned long long)seq);
    int fd = len > 0 && (size_t)len < sizeof tmp
                 ? open_io(f, tmp, O_WRONLY | O_CREAT | O_TRUNC, p, n) : -1;
    int rc = fd < 0 ? -1 : lmc_core_write_all(fd, p, n);
    if (job && rc == 0)
        rc = attach_checksum(f, k, name, fd, job);
    else if (job)
        lmc_l2_hash_abort(f->hasher, job);
    if (fd < 0)
        return -1;
    rc |= close(fd);
    if (rc == 0 && rename(tmp, final) == 0)
        return 0;
    unlink(tmp);
    return -1;
}

/* ---- operations -------------------------------------------------------- */

static int store_one(fs *f, const lmc_object_key *k, const uint8_t *buf, uint64_t size)
{
    char path[FS_PATH_MAX], name[1024];
    struct stat st;
    if (key_path(f, k, "", path, sizeof path) != 0 ||
        lmc_object_key_to_filename(k, name, sizeof name) < 0)
        return -1;
    if (stat(path, &st) == 0) {   /* skip existing (upstream does the same) */
        count(f, &f->skipped_existing);
        return 0;
    }
    pthread_mutex_lock(&f->mu);
    bool full = f->o.capacity_bytes && f->used + size > f->o.capacity_bytes;
    pthread_mutex_unlock(&f->mu);
    if (full)
        return -1;   /* no L2 eviction yet: a full adapter refuses stores */
    /* The checksum is computed on the pool while this thread writes. */
    lmc_l2_hash_job job;
    if (f->hasher)
        lmc_l2_hash_start(f->hasher, &job, buf, size, size);
    if (publish(f, k, path, name, buf, size, f->hasher ? &job : NULL) != 0)
        return -1;
    pthread_mutex_lock(&f->mu);
    index_add_locked(f, k, size);
    pthread_mutex_unlock(&f->mu);
    return 0;
}

static int64_t fs_store(lmc_l2_backend *b, const lmc_object_key *keys, uint8_t *const *bufs,
                        const uint64_t *sizes, size_t n)
{
    fs *f = (fs *)b;
    int64_t bytes = 0;
    bool failed = false;
    for (size_t i = 0; i < n; i++) {
        if (store_one(f, &keys[i], bufs[i], sizes[i]) == 0) {
            bytes += (int64_t)sizes[i];
        } else {
            failed = true;
            count(f, &f->io_errors);
        }
    }
    return failed ? -1 : bytes;
}

static void fs_lookup(lmc_l2_backend *b, const lmc_object_key *keys, const uint64_t *sizes,
                      size_t n, uint8_t *found)
{
    fs *f = (fs *)b;
    for (size_t i = 0; i < n; i++) {
        char path[FS_PATH_MAX];
        struct stat st;
        found[i] = key_path(f, &keys[i], "", path, sizeof path) == 0 &&
                   stat(path, &st) == 0 && S_ISREG(st.st_mode);
        if (found[i] && sizes && (uint64_t)st.st_size != sizes[i]) {
            found[i] = 0;   /* truncated (or foreign): never serve it */
            count(f, &f->truncated);
        }
        if (!found[i])
            continue;
        pthread_mutex_lock(&f->mu);
        fs_item *it = index_add_locked(f, &keys[i], (uint64_t)st.st_size);
        if (it)
            it->locks++;
        else
            found[i] = 0;
        pthread_mutex_unlock(&f->mu);
    }
}

/* The checksum the writer left for the file open as `fd`: 1 (in `want`), 0
 * when there is none (an upstream-written file, accepted on size alone), -1
 * when it cannot be right (a corrupt object).  The xattr comes first: it
 * belongs to this very inode.  A sidecar is what lmcached wrote before
 * issue 18, and still writes where the filesystem has no user xattrs. */
static int expected_checksum(fs *f, const lmc_object_key *k, int fd, char want[HEX_LEN])
{
    char spath[FS_PATH_MAX];
    ssize_t r = fgetxattr(fd, f->xattr, want, HEX_LEN);
    if (r == HEX_LEN)
        return 1;
    if (r >= 0 || (errno != ENODATA && errno != ENOTSUP))
        return -1;   /* wrong length (ERANGE: too long) or unreadable */
    if (key_path(f, k, ".b3", spath, sizeof spath) != 0)
        return -1;
    int sfd = open(spath, O_RDONLY | O_CLOEXEC);
    if (sfd < 0)
        return 0;
    r = read(sfd, want, HEX_LEN);
    close(sfd);
    return r == HEX_LEN ? 1 : -1;
}

/* Reads what the page cache holds of the object from its start, without
 * waiting for the disk (RWF_NOWAIT), hashing each piece on this thread as
 * soon as it is read, while it is still in the CPU's cache: for a cached
 * file a hand-off to the pool costs more than the hash it overlaps.  Stops
 * at the first piece the cache does not hold.  Bytes read and hashed. */
static uint64_t read_cached_hashing(int fd, uint8_t *buf, uint64_t size,
                                    lmc_l2_inline_hash *ih)
{
    uint64_t got = 0;
    while (got < size) {
        size_t ask = size - got < CACHED_PIECE ? (size_t)(size - got) : CACHED_PIECE;
        struct iovec v = {buf + got, ask};
        ssize_t r = preadv2(fd, &v, 1, (off_t)got, RWF_NOWAIT);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;   /* EAGAIN: not cached; any other error shows again below */
        lmc_l2_inline_update(ih, buf + got, (size_t)r);
        got += (uint64_t)r;
        if ((size_t)r < ask)
            break;
    }
    return got;
}

/* The rest of an object whose head came from the page cache, read and
 * hashed on this thread.  0, or -1 on a read error or a short file. */
static int read_rest_hashing(int fd, uint8_t *buf, uint64_t from, uint64_t size,
                             lmc_l2_inline_hash *ih)
{
    while (from < size) {
        size_t ask = size - from < CACHED_PIECE ? (size_t)(size - from) : CACHED_PIECE;
        ssize_t r = pread(fd, buf + from, ask, (off_t)from);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return -1;
        lmc_l2_inline_update(ih, buf + from, (size_t)r);
        from += (uint64_t)r;
    }
    return 0;
}

/* Reads the object into `buf` and checks its digest: 0 when it matches
 * `want`, -1 on a read error, -2 on a mismatch.  A buffered file the page
 * cache holds is read and hashed piece by piece on this thread; one that
 * needs the disk is read while the pool hashes what has been read. */
static int read_verified(fs *f, int fd, uint8_t *buf, uint64_t size,
                         const char want[HEX_LEN])
{
    lmc_l2_hash_job job;
    uint8_t d[LMC_L2_DIGEST_LEN];
    char got[HEX_LEN + 1];
    if (!(fcntl(fd, F_GETFL) & O_DIRECT)) {
        lmc_l2_inline_hash ih;
        lmc_l2_inline_init(&ih);
        uint64_t cached = read_cached_hashing(fd, buf, size, &ih);
        if (cached > 0) {
            if (cached < size && read_rest_hashing(fd, buf, cached, size, &ih) != 0)
                return -1;
            count(f, &f->cached_loads);
            lmc_l2_inline_final(&ih, d);
            lmc_hex_encode(d, LMC_L2_DIGEST_LEN, got);
            return memcmp(want, got, HEX_LEN) == 0 ? 0 : -2;
        }
    }
    lmc_l2_hash_start(f->hasher, &job, buf, size, 0);
    if (read_all(f, fd, buf, size, &job) != 0) {
        lmc_l2_hash_abort(f->hasher, &job);
        return -1;
    }
    lmc_l2_hash_finish(f->hasher, &job, d);
    lmc_hex_encode(d, LMC_L2_DIGEST_LEN, got);
    return memcmp(want, got, HEX_LEN) == 0 ? 0 : -2;
}

/* Bad bytes may land in `buf` (L1 staging) but the key then fails, so the
 * prefetch never publishes them (docs/l2.md, "fs"). */
static bool load_one(fs *f, const lmc_object_key *k, uint8_t *buf, uint64_t size)
{
    char path[FS_PATH_MAX], want[HEX_LEN];
    struct stat st;
    if (key_path(f, k, "", path, sizeof path) != 0)
        return false;
    int fd = open_io(f, path, O_RDONLY, buf, size);
    if (fd < 0)
        return false;
    bool ok = fstat(fd, &st) == 0 && (uint64_t)st.st_size == size;
    if (!ok)
        count(f, &f->truncated);
    int have = ok && f->hasher ? expected_checksum(f, k, fd, want) : 0;
    if (ok && f->o.read_ahead_size)
        posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
    int rc = !ok ? -1 : have < 0 ? -2 : have ? read_verified(f, fd, buf, size, want)
                                             : read_all(f, fd, buf, size, NULL);
    close(fd);
    if (rc == -2) {
        LMC_WARN("L2 fs: checksum mismatch in %s: treated as a miss", path);
        count(f, &f->corrupt);
    }
    return rc == 0;
}

static void fs_load(lmc_l2_backend *b, const lmc_object_key *keys, uint8_t *const *bufs,
                    const uint64_t *sizes, size_t n, uint8_t *ok)
{
    fs *f = (fs *)b;
    for (size_t i = 0; i < n; i++)
        ok[i] = load_one(f, &keys[i], bufs[i], sizes[i]);
}

static void fs_unlock(lmc_l2_backend *b, const lmc_object_key *keys, size_t n)
{
    fs *f = (fs *)b;
    pthread_mutex_lock(&f->mu);
    for (size_t i = 0; i < n; i++) {
        fs_item *it = lmc_key_table_find(&f->table, &keys[i]);
        if (it && it->locks)
            it->locks--;
    }
    pthread_mutex_unlock(&f->mu);
}

/* A missing file counts as deleted; another unlink error keeps the key. */
static size_t fs_remove(lmc_l2_backend *b, const lmc_object_key *keys, size_t n)
{
    fs *f = (fs *)b;
    size_t done = 0;
    for (size_t i = 0; i < n; i++) {
        char path[FS_PATH_MAX], spath[FS_PATH_MAX];
        pthread_mutex_lock(&f->mu);
        fs_item *it = lmc_key_table_find(&f->table, &keys[i]);
        bool locked = it && it->locks;
        pthread_mutex_unlock(&f->mu);
        if (locked || key_path(f, &keys[i], "", path, sizeof path) != 0 ||
            key_path(f, &keys[i], ".b3", spath, sizeof spath) != 0)
            continue;
        bool removed = unlink(path) == 0;
        if (!removed && errno != ENOENT)
            continue;
        unlink(spath);
        pthread_mutex_lock(&f->mu);
        it = lmc_key_table_remove(&f->table, &keys[i]);
        if (it)
            f->used -= it->size;
        pthread_mutex_unlock(&f->mu);
        free(it);
        done += removed; /* an absent key is skipped, not counted */
    }
    return done;
}

static void fs_usage(lmc_l2_backend *b, lmc_l2_usage *u)
{
    fs *f = (fs *)b;
    pthread_mutex_lock(&f->mu);
    u->used_bytes = f->used;
    u->capacity_bytes = f->o.capacity_bytes;
    u->num_keys = f->table.count;
    pthread_mutex_unlock(&f->mu);
}

static void fs_list(lmc_l2_backend *b, const char *model, json_t *entries)
{
    fs *f = (fs *)b;
    pthread_mutex_lock(&f->mu);
    for (size_t i = 0; i < f->table.capacity; i++) {
        fs_item *it = lmc_key_table_slot_item(&f->table, i);
        char name[1024];
        if (!it || (model && strcmp(model, it->key.model_name) != 0) ||
            lmc_object_key_to_string(&it->key, name, sizeof name) < 0)
            continue;
        json_array_append_new(entries, json_pack("{s:s, s:o, s:I}", "name", name, "key",
                                                 lmc_object_key_json(&it->key), "size_bytes",
                                                 (json_int_t)it->size));
    }
    pthread_mutex_unlock(&f->mu);
}

static json_t *fs_status(lmc_l2_backend *b)
{
    fs *f = (fs *)b;
    pthread_mutex_lock(&f->mu);
    const char *where = !f->hasher ? "off" : atomic_load(&f->no_xattr) ? "sidecar" : "xattr";
    json_t *st = json_pack("{s:s, s:b, s:b, s:s, s:I, s:I, s:I, s:I, s:I, s:I, s:I}", "base_path",
                           f->base_path, "use_odirect", f->o.use_odirect, "verify_checksum",
                           f->o.verify_checksum, "checksum_in", where, "corrupt_files_detected",
                           (json_int_t)f->corrupt, "truncated_files_detected",
                           (json_int_t)f->truncated, "recovered_keys",
                           (json_int_t)f->recovered, "skipped_existing",
                           (json_int_t)f->skipped_existing, "io_errors",
                           (json_int_t)f->io_errors, "leftovers_removed",
                           (json_int_t)f->leftovers_removed, "cached_loads",
                           (json_int_t)f->cached_loads);
    pthread_mutex_unlock(&f->mu);
    return st;
}

static void fs_destroy(lmc_l2_backend *b)
{
    fs *f = (fs *)b;
    for (size_t i = 0; f->table.items && i < f->table.capacity; i++)
        free(lmc_key_table_slot_item(&f->table, i));
    lmc_key_table_destroy(&f->table);
    lmc_key_interner_free(f->interner);
    lmc_l2_hasher_free(f->hasher);
    pthread_mutex_destroy(&f->mu);
    free(f->xattr);
    free(f->base_path);
    free(f->tmp_dir);
    free(f);
}

typedef struct {
    lmc_object_key key;
    uint64_t size;
    int64_t mtime_ns;
} fs_recovered;

static int by_mtime(const void *a, const void *b)
{
    int64_t x = ((const fs_recovered *)a)->mtime_ns, y = ((const fs_recovered *)b)->mtime_ns;
    return (x > y) - (x < y);
}

/* Copies the recovered keys out (the callback runs without f->mu) and hands
 * them over by modification time.  The files do not say which were stored
 * together, so those written within the same second count as one batch: an
 * LRU then evicts the newest of a batch first, which for a prompt's chunks,
 * written in order, is its last chunk, as for a batch stored by this process. */
static void fs_for_each_recovered(lmc_l2_backend *b, lmc_l2_recovered_fn fn, void *user)
{
    fs *f = (fs *)b;
    pthread_mutex_lock(&f->mu);
    fs_recovered *r = malloc((f->table.count ? f->table.count : 1) * sizeof *r);
    size_t n = 0;
    for (size_t i = 0; r && i < f->table.capacity; i++) {
        fs_item *it = lmc_key_table_slot_item(&f->table, i);
        if (it && it->recovered)
            r[n++] = (fs_recovered){it->key, it->size, it->mtime_ns};
    }
    pthread_mutex_unlock(&f->mu);
    lmc_object_key *keys = malloc((n ? n : 1) * sizeof *keys);
    uint64_t *sizes = malloc((n ? n : 1) * sizeof *sizes);
    if (!r || !keys || !sizes) {
        LMC_WARN("L2 fs: out of memory listing recovered keys; they will not be evicted");
        n = 0;
    } else {
        qsort(r, n, sizeof *r, by_mtime);
    }
    for (size_t i = 0; i < n; i++)
        keys[i] = r[i].key, sizes[i] = r[i].size;
    for (size_t start = 0, end; start < n; start = end) {
        int64_t second = r[start].mtime_ns / 1000000000;
        for (end = start + 1; end < n && r[end].mtime_ns / 1000000000 == second; end++)
            ;
        fn(user, keys + start, sizes + start, end - start);
    }
    free(keys);
    free(sizes);
    free(r);
}

/* ---- health (docs/l2.md, "Health") -------------------------------------- */

/* `what` (a configured path) is a directory this process may write in. */
static int dir_usable(const char *what, const char *path, char *why, size_t cap)
{
    struct stat st;
    if (stat(path, &st) != 0)
        return snprintf(why, cap, "%s %s: %s", what, path, strerror(errno)), -1;
    if (!S_ISDIR(st.st_mode))
        return snprintf(why, cap, "%s %s is not a directory", what, path), -1;
    if (access(path, W_OK | X_OK) != 0)
        return snprintf(why, cap, "%s %s is not writable: %s", what, path, strerror(errno)), -1;
    return 0;
}

/* A write starts with a temp file in tmp_dir: creating one (named as
 * write_file names them, so a crash's leftover is removed at the next
 * start) is the probe that a full or read-only filesystem fails. */
static int fs_probe(lmc_l2_backend *b, char *why, size_t cap)
{
    fs *f = (fs *)b;
    if (dir_usable("base_path", f->base_path, why, cap) != 0 ||
        (strcmp(f->tmp_dir, f->base_path) != 0 &&
         dir_usable("temp dir", f->tmp_dir, why, cap) != 0))
        return -1;
    char path[FS_PATH_MAX];
    int n = snprintf(path, sizeof path, "%s/.lmcache-health.%ld.0.tmp", f->tmp_dir,
                     (long)getpid());
    if (n < 0 || (size_t)n >= sizeof path)
        return snprintf(why, cap, "temp dir %s: path too long", f->tmp_dir), -1;
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return snprintf(why, cap, "cannot create a file in %s: %s", f->tmp_dir,
                        strerror(errno)), -1;
    close(fd);
    unlink(path);
    return 0;
}

static const lmc_l2_backend_ops fs_ops = {
    fs_store, fs_lookup, fs_load, fs_unlock, fs_remove,
    fs_usage, fs_list, fs_status, fs_destroy, fs_for_each_recovered, fs_probe,
};

/* ---- creation and recovery --------------------------------------------- */

/* Indexes every "<key>.data" file so a restarted server accounts for (and
 * lists) what an earlier one - or an upstream server - left behind. */
static void recover(fs *f)
{
    DIR *d = opendir(f->base_path);
    if (!d)
        return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        lmc_object_key k;
        char path[FS_PATH_MAX];
        struct stat st;
        if (lmc_object_key_parse_filename(f->interner, e->d_name, &k) != 0)
            continue;   /* temp files, sidecars, foreign files */
        int n = snprintf(path, sizeof path, "%s/%s", f->base_path, e->d_name);
        if (n < 0 || (size_t)n >= sizeof path || stat(path, &st) != 0 || !S_ISREG(st.st_mode))
            continue;
        pthread_mutex_lock(&f->mu);
        fs_item *it = index_add_locked(f, &k, (uint64_t)st.st_size);
        if (it) {
            it->recovered = true;
            it->mtime_ns = (int64_t)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec;
            f->recovered++;
        }
        pthread_mutex_unlock(&f->mu);
    }
    closedir(d);
}

/* A crash between a temp file's creation and its rename, or between a
 * sidecar's publication and its data file's, leaves files nobody reads.
 * At start they are removed once certainly dead: untouched for
 * LEFTOVER_AGE_S (a live write touches its file every few milliseconds),
 * and for a temp file, its writer's pid runs no process on this host (a
 * directory shared with other hosts may hold their live temp files); for
 * a sidecar, no data file beside it (docs/l2.md, "fs"). */
#define LEFTOVER_AGE_S 30

/* "<name>.<pid>.<seq>.tmp", as write_file names them: true when that pid
 * runs no process here. */
static bool temp_writer_gone(const char *name)
{
    size_t n = strlen(name);
    if (n < 8 || strcmp(name + n - 4, ".tmp") != 0)
        return false;
    const char *seq = name + n - 4;
    while (seq > name && seq[-1] != '.')
        seq--;
    const char *pid_at = seq - 1;
    while (pid_at > name && pid_at[-1] != '.')
        pid_at--;
    if (pid_at == name || pid_at >= seq - 1)
        return false;
    char *end;
    long pid = strtol(pid_at, &end, 10);
    if (end != seq - 1 || pid <= 0 || pid == (long)getpid())
        return false;
    return kill((pid_t)pid, 0) != 0 && errno == ESRCH;
}

static bool sidecar_orphaned(const char *dir, const char *name)
{
    size_t n = strlen(name);
    char data[FS_PATH_MAX];
    struct stat st;
    if (n < 4 || strcmp(name + n - 3, ".b3") != 0)
        return false;
    int len = snprintf(data, sizeof data, "%s/%.*s", dir, (int)(n - 3), name);
    return len > 0 && (size_t)len < sizeof data && stat(data, &st) != 0 && errno == ENOENT;
}

static void remove_leftovers(fs *f, const char *dir, bool sidecars)
{
    DIR *d = opendir(dir);
    if (!d)
        return;
    time_t now = time(NULL);
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        char path[FS_PATH_MAX];
        struct stat st;
        bool temp = temp_writer_gone(e->d_name);
        if (!temp && !(sidecars && sidecar_orphaned(dir, e->d_name)))
            continue;
        int n = snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (n < 0 || (size_t)n >= sizeof path || lstat(path, &st) != 0 || !S_ISREG(st.st_mode) ||
            now - st.st_mtim.tv_sec < LEFTOVER_AGE_S || unlink(path) != 0)
            continue;
        f->leftovers_removed++;
    }
    closedir(d);
}

static int make_dir(const char *path, char *err, size_t errlen)
{
    if (mkdir(path, 0755) == 0 || errno == EEXIST)
        return 0;
    snprintf(err, errlen, "L2 fs: cannot create %s: %s", path, strerror(errno));
    return -1;
}

static int set_paths(fs *f, const lmc_l2_fs_options *o, char *err, size_t errlen)
{
    f->base_path = strdup(o->base_path);
    size_t len = strlen(o->base_path) + (o->relative_tmp_dir ? strlen(o->relative_tmp_dir) : 0);
    f->tmp_dir = malloc(len + 2);
    if (!f->base_path || !f->tmp_dir) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    if (o->relative_tmp_dir && *o->relative_tmp_dir)
        snprintf(f->tmp_dir, len + 2, "%s/%s", o->base_path, o->relative_tmp_dir);
    else
        snprintf(f->tmp_dir, len + 2, "%s", o->base_path);
    return make_dir(f->base_path, err, errlen) || make_dir(f->tmp_dir, err, errlen) ? -1 : 0;
}

static int start_checksums(fs *f, const lmc_l2_fs_options *o, char *err, size_t errlen)
{
    f->xattr = strdup(o->checksum_xattr ? o->checksum_xattr : "user.lmcache.b3");
    if (o->verify_checksum)
        f->hasher = lmc_l2_hasher_new(o->hash_threads ? o->hash_threads : 4);
    if (!f->xattr || (o->verify_checksum && !f->hasher)) {
        snprintf(err, errlen, "L2 fs: cannot start the checksum threads");
        return -1;
    }
    return 0;
}

lmc_l2_backend *lmc_l2_fs_new(const lmc_l2_fs_options *o, char *err, size_t errlen)
{
    fs *f = calloc(1, sizeof *f);
    if (!f || !o->base_path || !*o->base_path) {
        free(f);
        snprintf(err, errlen, f ? "L2 fs: base_path is required" : "out of memory");
        return NULL;
    }
    f->base = (lmc_l2_backend){&fs_ops, "fs",
                               LMC_L2_SPLIT_STORE | LMC_L2_SPLIT_LOOKUP | LMC_L2_SPLIT_LOAD};
    f->o = *o;
    pthread_mutex_init(&f->mu, NULL);
    f->interner = lmc_key_interner_new();
    if (!f->interner || lmc_key_table_init(&f->table, offsetof(fs_item, key), 1024) != 0) {
        snprintf(err, errlen, "out of memory");
        fs_destroy(&f->base);
        return NULL;
    }
    if (set_paths(f, o, err, errlen) != 0 || start_checksums(f, o, err, errlen) != 0) {
        fs_destroy(&f->base);
        return NULL;
    }
    f->o.base_path = f->base_path;
    f->o.relative_tmp_dir = NULL;
    f->o.checksum_xattr = f->xattr;
    if (o->recover_on_start)
        recover(f);
    remove_leftovers(f, f->base_path, true);
    if (strcmp(f->tmp_dir, f->base_path) != 0)
        remove_leftovers(f, f->tmp_dir, false);
    if (f->leftovers_removed)
        LMC_INFO("L2 fs: removed %llu files left by a crashed write",
                 (unsigned long long)f->leftovers_removed);
    LMC_INFO("L2 fs: %s (%llu keys, %llu bytes recovered)", f->base_path,
             (unsigned long long)f->recovered, (unsigned long long)f->used);
    return &f->base;
}
