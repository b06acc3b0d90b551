/* L1 arena: the one contiguous byte region that holds every L1 object.
 *
 * By default the arena lives in a POSIX shared-memory segment so engine
 * processes can map it by name (docs/storage.md, "L1 arena"): they call
 * shm_open("/" + shm_name) and mmap `size` bytes; an object's slot offset is
 * its arena offset.  With an empty shm name the arena is private anonymous
 * memory (optionally 2 MiB hugepages).  The owner commits ranges of an SHM
 * arena before handing them to the allocator (lmc_l1_arena_commit), so a
 * full /dev/shm is an error there instead of SIGBUS in whichever process
 * first touches the page; private memory is committed by the kernel on
 * first touch (MAP_NORESERVE).
 *
 * The descriptor {base, size, shm_name} is what a future CUDA path (pinned
 * host registration) or a P2P transport needs to expose the region.
 *
 * Thread-safety: immutable after creation; destroy only when no one uses
 * the memory any more. */
#ifndef LMC_STORAGE_L1_L1_ARENA_H
#define LMC_STORAGE_L1_L1_ARENA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define LMC_L1_SHM_PREFIX "lmcache_l1_pool_"
#define LMC_L1_SHM_NAME_MAX 240

typedef struct lmc_l1_arena lmc_l1_arena;

typedef struct lmc_l1_arena_options {
    uint64_t size;            /* bytes, > 0 */
    /* NULL: "lmcache_l1_pool_<pid>"; "": private memory, no SHM; otherwise
     * the name, with LMC_L1_SHM_PREFIX prepended when missing. */
    const char *shm_name;
    bool use_hugepages;       /* private memory only (needs shm_name "") */
    /* Bytes of /dev/shm that commits leave free for the processes beside
     * the server (the engine's own IPC); < 0: an eighth of /dev/shm, at
     * most 1 GiB (docs/configuration.md, --l1-shm-reserve-mb). */
    int64_t shm_reserve_bytes;
} lmc_l1_arena_options;

typedef struct lmc_l1_arena_desc {
    void *base;
    uint64_t size;            /* mapped bytes (hugepages: rounded up to 2 MiB) */
    const char *shm_name;     /* without leading "/"; "" when private */
    bool hugepages;
    uint64_t shm_reserve;     /* resolved shm_reserve_bytes; 0 when private */
} lmc_l1_arena_desc;

/* Resolves the SHM segment name per the rules above for process `pid`.
 * Writes "" for a private arena.  0, or -1 if the name is invalid (contains
 * '/' after leading slashes, or is too long). */
int lmc_l1_arena_resolve_shm_name(const char *requested, pid_t pid, char *out, size_t cap);

/* Creates the arena.  An existing segment of the same name is unlinked
 * first (stale, from a crashed run) unless a running lmcached holds it,
 * which is an error.  NULL on failure, with a one-line reason in `err`. */
lmc_l1_arena *lmc_l1_arena_create(const lmc_l1_arena_options *opts, char *err, size_t errlen);

/* Backs [offset, offset + len) of an SHM arena with tmpfs pages now
 * (no-op for private memory).  -1 with a reason in `err` when /dev/shm (or
 * the memory limit) cannot hold them beside the reserve; nothing of the
 * range is kept then.
 * This is also where a CUDA build will pin the range. */
int lmc_l1_arena_commit(lmc_l1_arena *arena, uint64_t offset, uint64_t len, char *err,
                        size_t errlen);

/* How lmc_l1_arena_populate faults pages in (docs/storage.md, "Pre-fault"). */
typedef enum {
    LMC_L1_POPULATE_MADVISE,   /* MADV_POPULATE_WRITE (Linux 5.14+) */
    LMC_L1_POPULATE_TOUCH,     /* an atomic add of 0 to a byte of each page */
} lmc_l1_populate_method;

/* Faults [offset, offset + len) of this process's mapping in writable, so
 * that the server's first write to a page takes no fault, and asks for
 * transparent huge pages first where the kernel's setting allows them.
 * The bytes are left as they are: a page a request is writing meanwhile
 * keeps what it writes.  Returns the method used. */
lmc_l1_populate_method lmc_l1_arena_populate(lmc_l1_arena *arena, uint64_t offset, uint64_t len);
/* The THP setting the arena's pages follow ("advise", "never", ...; ""
 * when unknown) and whether populate asks for huge pages. */
const char *lmc_l1_arena_thp_setting(const lmc_l1_arena *arena);
bool lmc_l1_arena_thp_requested(const lmc_l1_arena *arena);

const lmc_l1_arena_desc *lmc_l1_arena_describe(const lmc_l1_arena *arena);

/* Unmaps the arena and unlinks its SHM segment.  NULL is a no-op. */
void lmc_l1_arena_destroy(lmc_l1_arena *arena);

#endif
