/* A request-id keyed intrusive hash table with recency order, shared by the
 * session table and the prefetch-job registry.
 *
 * Entries embed an lmc_rid_node; the table never allocates entries, it only
 * links them.  The node owns a copy of its request id.  Recency order lets
 * both users drop the least recently used entry when they hit their bound,
 * so clients that never end their requests cannot grow memory without
 * limit.
 *
 * Request ids come from clients, so the bucket index is a keyed hash
 * (SipHash-2-4) under a key drawn from getrandom() per table: a client
 * cannot pick ids that all land in one bucket.  The bucket array doubles
 * whenever the count passes it, so chains stay short at any count (issue
 * 17).  Not thread-safe: the owner serialises access. */
#ifndef LMC_MODULES_SERVICES_RID_TABLE_H
#define LMC_MODULES_SERVICES_RID_TABLE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct lmc_rid_node {
    char *rid;                    /* owned copy, NUL-terminated */
    size_t rid_len;
    uint64_t hash;
    struct lmc_rid_node *hnext;   /* bucket chain */
    struct lmc_rid_node *newer, *older; /* recency list */
    int64_t last_used_ms;
} lmc_rid_node;

typedef struct {
    lmc_rid_node **buckets;
    size_t nbuckets;              /* power of two, >= count once it could grow */
    size_t count;
    lmc_rid_node *newest, *oldest;
    uint64_t key[2];              /* the hash key, from getrandom() */
} lmc_rid_table;

/* Starts with `nbuckets` (rounded up to a power of two, at least 16)
 * buckets and a fresh random key.  0, or -1 (no memory, no randomness). */
int lmc_rid_table_init(lmc_rid_table *t, size_t nbuckets);
/* Frees the buckets only; entries belong to the caller. */
void lmc_rid_table_destroy(lmc_rid_table *t);
lmc_rid_node *lmc_rid_table_find(lmc_rid_table *t, const char *rid, size_t len);
/* Copies rid into the node and links it as newest.  0, or -1 (no memory). */
int lmc_rid_table_insert(lmc_rid_table *t, lmc_rid_node *n, const char *rid, size_t len,
                         int64_t now_ms);
/* Unlinks and frees the node's rid copy (the node itself is the caller's). */
void lmc_rid_table_remove(lmc_rid_table *t, lmc_rid_node *n);
/* Marks the node most recently used. */
void lmc_rid_table_touch(lmc_rid_table *t, lmc_rid_node *n, int64_t now_ms);
/* SipHash-2-4 of s[0..len) under key k (exposed for its known-answer test). */
uint64_t lmc_rid_hash(const uint64_t k[2], const char *s, size_t len);

#endif
