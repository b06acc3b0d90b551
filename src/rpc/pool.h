/* Worker pool with one FIFO per queue index.  Threads are striped over the
 * queues (thread t serves queue t % n_queues), which gives both shapes the
 * RPC server needs from one implementation:
 *   shared pool:   1 queue, M threads;
 *   affinity pool: N queues, N threads: a key always maps to the same
 *                  thread, so its tasks run one at a time, in order. */
#ifndef LMC_RPC_POOL_H
#define LMC_RPC_POOL_H

#include <stdbool.h>
#include <stddef.h>

typedef struct lmc_pool_task {
    struct lmc_pool_task *next;
    size_t bytes;               /* what it counts against its queue's byte bound */
} lmc_pool_task;

typedef void (*lmc_pool_run_fn)(lmc_pool_task *task, void *user);

typedef struct lmc_pool lmc_pool;

/* Each queue holds at most `max_queued` tasks waiting to start and
 * `max_bytes` of their bytes (0: no bound), so a flood of requests cannot
 * grow it without limit (issue 17).  Returns NULL on failure (threads
 * could not be started). */
lmc_pool *lmc_pool_new(const char *name, int n_threads, int n_queues, size_t max_queued,
                       size_t max_bytes, lmc_pool_run_fn run, void *user);
size_t lmc_pool_queue_count(const lmc_pool *pool);
/* Queues `task` (of `bytes`) on queue `queue_index`; false, and not
 * queued, when that queue is at its bound.  A queue with nothing waiting
 * takes any task, so no task is refused for its size alone.  A task that
 * `releases` what others hold may fill the queue to twice `max_queued`. */
bool lmc_pool_submit(lmc_pool *pool, size_t queue_index, lmc_pool_task *task, size_t bytes,
                     bool releases);
/* True when queue `queue_index` has no task queued or running.  With a
 * single submitting thread, that thread's answer stays true until its own
 * next submit. */
bool lmc_pool_queue_idle(lmc_pool *pool, size_t queue_index);
/* One piece of a task's work shared with the pool (lmc_pool_share): true
 * when it went well.  Pieces of one share run concurrently, so each must
 * touch only what is its own. */
typedef bool (*lmc_pool_piece_fn)(void *arg, size_t piece);
/* Runs fn(arg, i) for every i < n_pieces: on the calling thread, and on
 * whichever of the pool's threads have nothing queued, which take pieces
 * in order while unclaimed ones remain (docs/architecture.md, "One
 * request across the copy workers").  Returns once every piece has run:
 * true when each returned true.  The caller claims pieces itself too, so
 * it never waits for a thread that is busy elsewhere; it only waits for
 * pieces other threads are already running. */
bool lmc_pool_share(lmc_pool *pool, size_t n_pieces, lmc_pool_piece_fn fn, void *arg);
/* Pieces run by a thread other than the sharing one, since the pool started. */
size_t lmc_pool_pieces_helped(lmc_pool *pool);
size_t lmc_pool_thread_count(const lmc_pool *pool);
/* Runs every task already queued, then joins the threads and frees the pool. */
void lmc_pool_free(lmc_pool *pool);

#endif
