/* BLAKE3 of L2 objects on threads beside the I/O (issue 18; docs/l2.md,
 * "fs", "Checksums").  The worker that reads or writes an object starts a
 * job, tells it how many leading bytes are ready (all of them for a store,
 * the bytes read so far for a load) and, once its own I/O is done, waits
 * for the digest.  A pool thread hashes the ready bytes in order while the
 * I/O goes on; a job no pool thread has taken yet when its worker asks for
 * the digest is hashed by the worker itself, so a busy machine costs no
 * more than hashing serially did.
 *
 * Ownership: the job lives in the caller's memory (usually its stack) and
 * the data stays valid and unchanged below `ready` until finish or abort
 * returned; both wait until no pool thread touches the job any more. */
#ifndef LMC_STORAGE_L2_HASHER_H
#define LMC_STORAGE_L2_HASHER_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define LMC_L2_DIGEST_LEN 32

typedef struct lmc_l2_hasher lmc_l2_hasher;

typedef struct lmc_l2_hash_job {
    /* private: guarded by the hasher's mutex */
    const uint8_t *data;
    uint64_t size, ready;
    bool taken, aborted, done;
    pthread_cond_t cv;       /* progress (to the pool thread), done (to the worker) */
    struct lmc_l2_hash_job *next;
    uint8_t digest[LMC_L2_DIGEST_LEN];
} lmc_l2_hash_job;

/* Hashing on the caller's own thread, for bytes it has at hand: what a
 * load read from the page cache is hashed piece by piece right after each
 * read, while the piece is still in the CPU's cache, with no hand-off to
 * the pool (docs/l2.md, "Checksums"). */
typedef struct lmc_l2_inline_hash {
    _Alignas(max_align_t) uint8_t state[1920];   /* a blake3_hasher (l2_hasher.c checks) */
} lmc_l2_inline_hash;

void lmc_l2_inline_init(lmc_l2_inline_hash *ih);
void lmc_l2_inline_update(lmc_l2_inline_hash *ih, const uint8_t *p, size_t n);
void lmc_l2_inline_final(lmc_l2_inline_hash *ih, uint8_t digest[LMC_L2_DIGEST_LEN]);

/* NULL when out of memory or no thread could start. */
lmc_l2_hasher *lmc_l2_hasher_new(size_t threads);
/* Joins the threads; no job may be pending. */
void lmc_l2_hasher_free(lmc_l2_hasher *h);

/* Queues `j` over data[0, size) of which the first `ready` bytes exist. */
void lmc_l2_hash_start(lmc_l2_hasher *h, lmc_l2_hash_job *j, const uint8_t *data,
                       uint64_t size, uint64_t ready);
/* The first `ready` bytes exist now (never less than before). */
void lmc_l2_hash_advance(lmc_l2_hasher *h, lmc_l2_hash_job *j, uint64_t ready);
/* All `size` bytes must be ready: waits for (or computes) the digest. */
void lmc_l2_hash_finish(lmc_l2_hasher *h, lmc_l2_hash_job *j,
                        uint8_t digest[LMC_L2_DIGEST_LEN]);
/* The I/O failed: drops the job, waiting until no thread reads its data. */
void lmc_l2_hash_abort(lmc_l2_hasher *h, lmc_l2_hash_job *j);

#endif
