/* The P2P serving side's lease registry (docs/p2p.md, "Serving side"):
 * which L1 objects this server holds leased for peers, so that the
 * transfer channel reads only bytes a peer was handed by
 * P2P_LOOKUP_AND_LOCK and has not yet given back (P2P_UNLOCK_OBJECTS) or
 * outlived (the lease's TTL).
 *
 * The registry only keeps the books: the storage leases themselves are
 * taken and given back by the module (p2p_serve.c).  It is bounded
 * (max_leases) and thread-safe; every function may be called from any
 * thread. */
#ifndef LMC_MODULES_P2P_LEASE_REGISTRY_H
#define LMC_MODULES_P2P_LEASE_REGISTRY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "storage/lease.h"
#include "storage/object_key.h"
#include "storage/ttl_lock.h"

/* Who took a lease: the requesting connection's routing id on the
 * message-queue socket, kept whole up to 32 bytes (ZMQ's own ids are 5)
 * and beyond that by its first 32 bytes, length and hash. */
#define LMC_P2P_SERVE_OWNER_HEAD 32
typedef struct lmc_p2p_serve_owner {
    uint64_t hash;
    uint8_t len;   /* of the whole id, capped at 255 */
    uint8_t head[LMC_P2P_SERVE_OWNER_HEAD];
} lmc_p2p_serve_owner;

void lmc_p2p_serve_owner_set(lmc_p2p_serve_owner *o, const uint8_t *id, size_t len);
bool lmc_p2p_serve_owner_equal(const lmc_p2p_serve_owner *a, const lmc_p2p_serve_owner *b);

/* One leased object: its key (holding a reference on its strings when
 * interned), the storage lease behind it and who took it.  [lease.offset,
 * lease.offset + lease.object_size) is the range the peer was handed. */
typedef struct lmc_p2p_serve_held {
    lmc_object_key key;
    lmc_lease lease;
    lmc_p2p_serve_owner owner;
} lmc_p2p_serve_held;

typedef struct lmc_p2p_serve_reg lmc_p2p_serve_reg;

/* max_leases > 0.  clock NULL: CLOCK_MONOTONIC (the storage manager's). */
lmc_p2p_serve_reg *lmc_p2p_serve_reg_new(size_t max_leases, lmc_clock_ms_fn clock,
                                         void *clock_user);
/* Frees the books; leases still held are dropped without being given back
 * (take them out with lmc_p2p_serve_reg_take_all() first). */
void lmc_p2p_serve_reg_free(lmc_p2p_serve_reg *r);

/* How many more leases fit. */
size_t lmc_p2p_serve_reg_room(lmc_p2p_serve_reg *r);
/* Records held[0..n) (keys' string references are taken anew, the caller
 * keeps its own).  Records nothing and returns false when they do not all
 * fit or memory ran out. */
bool lmc_p2p_serve_reg_add(lmc_p2p_serve_reg *r, const lmc_p2p_serve_held *held, size_t n);
/* Takes out one lease of `key` that `owner` took (NULL: anyone), the
 * oldest, handing its reference over to the caller; false when none is
 * held (an unknown key, or only other owners' leases). */
bool lmc_p2p_serve_reg_take(lmc_p2p_serve_reg *r, const lmc_object_key *key,
                            const lmc_p2p_serve_owner *owner, lmc_p2p_serve_held *out);
/* Takes out one lease `owner` took on the object at arena offset `offset`
 * (NULL owner: anyone's); false when there is none.  For a lookup result
 * that was never handed out (tasks.h): its addresses name the leases. */
bool lmc_p2p_serve_reg_take_at(lmc_p2p_serve_reg *r, uint64_t offset,
                               const lmc_p2p_serve_owner *owner, lmc_p2p_serve_held *out);
/* Takes out up to `cap` leases whose expiry has passed; returns how many. */
size_t lmc_p2p_serve_reg_take_expired(lmc_p2p_serve_reg *r, lmc_p2p_serve_held *out, size_t cap);
/* Takes out up to `cap` leases, expired or not (shutdown). */
size_t lmc_p2p_serve_reg_take_all(lmc_p2p_serve_reg *r, lmc_p2p_serve_held *out, size_t cap);

/* Whether every byte of [offset, offset + len) lies inside objects leased
 * now and not expired (adjacent leased objects cover a range across them).
 * len 0, or a range that wraps around, is never covered. */
bool lmc_p2p_serve_reg_covers(lmc_p2p_serve_reg *r, uint64_t offset, uint64_t len);
/* The same, counting only the leases `owner` took (NULL: anyone's). */
bool lmc_p2p_serve_reg_covers_for(lmc_p2p_serve_reg *r, const lmc_p2p_serve_owner *owner,
                                  uint64_t offset, uint64_t len);

/* Leases held (expired ones not yet taken out included) and their bytes. */
void lmc_p2p_serve_reg_counts(lmc_p2p_serve_reg *r, size_t *leases, uint64_t *bytes);

#endif
