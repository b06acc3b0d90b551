/* L1 eviction policies (docs/storage.md, "Eviction") behind a small
 * vtable so ARC and IsolatedLRU can be added later.
 *
 * A policy tracks keys from L1 listener events (added = reserved/written,
 * accessed = touched, removed = deleted) and, when asked, proposes victims
 * oldest first, skipping keys the `evictable` callback refuses and
 * forgetting keys it reports as gone.
 *
 * Thread-safety: every policy has its own mutex; all entry points may be
 * called from any thread.  select_victims calls `evictable` while holding
 * the policy mutex, so that callback may take the L1 mutex (lock order:
 * policy -> L1) but must never call back into the policy. */
#ifndef LMC_STORAGE_EVICTION_POLICY_H
#define LMC_STORAGE_EVICTION_POLICY_H

#include <stddef.h>

#include "storage/l1/l1_manager.h"
#include "storage/object_key.h"

typedef lmc_l1_evictability (*lmc_evictable_fn)(void *user, const lmc_object_key *key);

typedef struct lmc_eviction_policy lmc_eviction_policy;

typedef struct lmc_eviction_policy_ops {
    const char *name;
    /* A batch of new keys, in chunk order (keys[0] = first chunk). */
    void (*on_keys_added)(lmc_eviction_policy *p, const lmc_object_key *keys, size_t n);
    void (*on_keys_accessed)(lmc_eviction_policy *p, const lmc_object_key *keys, size_t n);
    void (*on_keys_removed)(lmc_eviction_policy *p, const lmc_object_key *keys, size_t n);
    /* Up to `max` victims into out[]; returns how many.  Each holds its
     * string references (object_key.h): the caller drops them. */
    size_t (*select_victims)(lmc_eviction_policy *p, size_t max, lmc_evictable_fn evictable,
                             void *user, lmc_object_key *out);
    size_t (*num_tracked)(lmc_eviction_policy *p);
    void (*destroy)(lmc_eviction_policy *p);
} lmc_eviction_policy_ops;

/* Every policy object starts with this header. */
struct lmc_eviction_policy {
    const lmc_eviction_policy_ops *ops;
};

/* "LRU" or "noop" (case-sensitive, as on the command line).  NULL for an
 * unknown or not yet implemented name ("ARC", "IsolatedLRU") or on
 * allocation failure. */
lmc_eviction_policy *lmc_eviction_policy_new(const char *name);
lmc_eviction_policy *lmc_eviction_policy_lru_new(void);
lmc_eviction_policy *lmc_eviction_policy_noop_new(void);
void lmc_eviction_policy_free(lmc_eviction_policy *p);

#endif
