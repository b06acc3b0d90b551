/* TTL lock (docs/storage.md, "TTL lock"): a counter plus an expiry time
 * in monotonic milliseconds, used for both the write lock of a staging
 * reservation and the read lock of a resident object.  A crashed client
 * cannot pin memory forever: once `now >= expiry_ms` the lock counts as
 * released.
 *
 * Not thread-safe on its own: every lock in the L1 tier lives inside an L1
 * manager record and is only touched under the L1 manager's mutex.  The
 * clock is injected (lmc_clock_ms_fn) so tests can expire locks without
 * sleeping. */
#ifndef LMC_STORAGE_TTL_LOCK_H
#define LMC_STORAGE_TTL_LOCK_H

#include <stdbool.h>
#include <stdint.h>
#include <time.h>

/* Returns "now" in milliseconds of a monotonic clock. */
typedef int64_t (*lmc_clock_ms_fn)(void *user);

/* Default clock: CLOCK_MONOTONIC.  `user` is ignored. */
static inline int64_t lmc_monotonic_ms(void *user)
{
    (void)user;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

typedef struct lmc_ttl_lock {
    uint32_t count;
    int64_t expiry_ms;   /* the lock is expired when now >= expiry_ms */
} lmc_ttl_lock;

static inline bool lmc_ttl_lock_expired(const lmc_ttl_lock *l, int64_t now_ms)
{
    return now_ms >= l->expiry_ms;
}

/* lock(): an expired lock restarts from 0; then count += n and the expiry
 * moves to now + ttl. */
static inline void lmc_ttl_lock_acquire(lmc_ttl_lock *l, uint32_t n, int64_t now_ms,
                                        int64_t ttl_ms)
{
    if (lmc_ttl_lock_expired(l, now_ms))
        l->count = 0;
    l->count = (UINT32_MAX - l->count < n) ? UINT32_MAX : l->count + n;
    l->expiry_ms = now_ms + ttl_ms;
}

/* unlock(): an expired lock just drops to 0; otherwise count -= n (not
 * below 0).  The expiry is left alone. */
static inline void lmc_ttl_lock_release(lmc_ttl_lock *l, uint32_t n, int64_t now_ms)
{
    if (lmc_ttl_lock_expired(l, now_ms)) {
        l->count = 0;
        return;
    }
    l->count = l->count > n ? l->count - n : 0;
}

static inline bool lmc_ttl_lock_held(const lmc_ttl_lock *l, int64_t now_ms)
{
    return !lmc_ttl_lock_expired(l, now_ms) && l->count > 0;
}

#endif
