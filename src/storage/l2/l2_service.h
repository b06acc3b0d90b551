/* The L2 tier of one storage manager: the --l2-adapter adapters, the store
 * controller and the prefetch controller (docs/l2.md).  The server calls
 * lmc_l2_attach() right after creating the storage manager; from then on
 * the storage manager owns the tier (storage/storage_tier.h) and closes it
 * first in lmc_storage_manager_close().  Every caller that needs L2 (the
 * lookup, the warm prefetch, the HTTP frontends) goes through this header;
 * without an attached tier each call below answers as documented. */
#ifndef LMC_STORAGE_L2_SERVICE_H
#define LMC_STORAGE_L2_SERVICE_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "config/config.h"
#include "storage/quota.h"
#include "obs/metrics.h"
#include "storage/storage_manager.h"

/* No --l2-adapter: attaches nothing and returns 0.  -1 with a one-line
 * reason in err (unknown type or field, unusable base_path, ...). */
int lmc_l2_attach(lmc_storage_manager *sm, const lmc_config *cfg, char *err, size_t errlen);
bool lmc_l2_attached(const lmc_storage_manager *sm);
/* With P2P on (--p2p-advertise-url), the discovered peers the last L2
 * adapter reads from (docs/p2p.md, "Requesting side"): set adds or
 * replaces peer `id` (0, or -1 with err), drop removes it.  Thread-safe. */
int lmc_l2_p2p_peer_set(lmc_storage_manager *sm, const char *id, const char *mq_url,
                        const char *chan_url, char *err, size_t errlen);
void lmc_l2_p2p_peer_drop(lmc_storage_manager *sm, const char *id);
/* Lookups asking the peers now (0 with P2P off). */
size_t lmc_l2_p2p_active_lookups(const lmc_storage_manager *sm);
/* With P2P on, the per-peer families lmcache_mp_p2p_peer_* (docs/metrics.md,
 * "P2P requesting side"), one series per live peer; 0 and nothing with
 * P2P off. */
int lmc_l2_p2p_register_metrics(lmc_storage_manager *sm, lmc_metrics *r);

/* ---- prefetch -----------------------------------------------------------
 * A prefetch request: keys[0..n) are the L1 misses after the caller's L1
 * hit run, in units of keys_per_unit keys (a chunk = groups x ranks); only
 * whole units count.  The tier looks the keys up in its adapters, loads
 * the leading run of available units into fresh L1 objects of object_size
 * bytes and read-locks each `readers` times.  Callbacks run on the tier's
 * thread, never inside prefetch(), with no storage lock held:
 *   on_lookup_done(user, units): the lookup phase is over (may be NULL);
 *   on_done(user, units): exactly once; keys[0..units*keys_per_unit) are
 *   then resident and read-locked (`readers` shares) for the caller. */
typedef struct lmc_l2_prefetch_request {
    const lmc_object_key *keys;   /* copied by prefetch() */
    lmc_lease *leases;            /* before on_done, the READ leases (`readers`
                                   * shares) of keys [0..units*keys_per_unit) for
                                   * the caller to give back; must live until
                                   * on_done (required when readers > 0) */
    size_t n;
    uint32_t keys_per_unit;
    uint64_t object_size;
    const uint64_t *unit_sizes;   /* NULL: every key object_size bytes; else key i
                                   * unit_sizes[i % keys_per_unit] (object groups
                                   * of different sizes; copied by prefetch()) */
    uint32_t readers;
    bool retain;                  /* keep loaded objects resident whatever
                                   * --l2-prefetch-policy says (warm prefetch) */
    void (*on_lookup_done)(void *user, size_t units);
    void (*on_done)(void *user, size_t units);
    void *user;
} lmc_l2_prefetch_request;

/* -1 without an L2 tier or when refused: the caller has no L2 hits then. */
int lmc_l2_prefetch(lmc_storage_manager *sm, const lmc_l2_prefetch_request *req);
/* Finishes every pending prefetch with on_done(0) and refuses new ones;
 * after it no callback runs (owners of callback state call it first). */
void lmc_l2_stop_prefetch(lmc_storage_manager *sm);

/* ---- usage, quotas, objects ---------------------------------------------- */
/* The per-salt L2 quota registry (there with or without a tier). */
lmc_quotas *lmc_l2_quotas(lmc_storage_manager *sm);
/* Bytes per cache_salt held in L2 ({salt: bytes}, summed over the adapters
 * that track salts, i.e. those with an "eviction" config).  New reference;
 * an empty object without an L2 tier. */
json_t *lmc_l2_usage_by_salt(lmc_storage_manager *sm);
/* True when an L2 adapter runs IsolatedLRU eviction, the one place the
 * per-salt quotas are enforced (docs/http.md, "Quotas"). */
bool lmc_l2_enforces_quotas(lmc_storage_manager *sm);
/* ---- health (docs/l2.md, "Health") ---------------------------------------
 * The adapters whose last probe failed: a new JSON array of {index,
 * type_name, reason, since_ms}; empty when every adapter is healthy or
 * there is no tier, NULL when out of memory.  Reads the last verdicts
 * only: cheap enough for a liveness probe. */
json_t *lmc_l2_unhealthy(lmc_storage_manager *sm);

/* L2 object listing and deletion (HTTP /cache/objects).  Without an L2
 * tier find returns -1 and the others do nothing.
 * find: index of the adapter whose type name is `type` (case-insensitive;
 * NULL or "" = the primary, 0), or -1 when none matches.
 * list: one page {"adapter", "shared", "entries", "next_page_token"}; new
 * reference, NULL when the adapter cannot list.
 * delete: absent or locked keys are skipped; returns how many were removed. */
int lmc_l2_find_adapter(lmc_storage_manager *sm, const char *type);
json_t *lmc_l2_list(lmc_storage_manager *sm, int adapter, const char *model, size_t page_size,
                    const char *page_token);
size_t lmc_l2_delete(lmc_storage_manager *sm, int adapter, const lmc_object_key *keys, size_t n);

#endif
