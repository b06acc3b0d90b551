/* LRU: a doubly linked list from oldest (head, evicted first) to newest
 * (tail) plus a key table for O(1) lookup.
 *
 * A batch of added keys is linked in reverse chunk order, so the batch's
 * LAST chunk ends up oldest and is evicted first: the leading chunks of a
 * prefix, which every later request reuses, survive longest.  Touching
 * moves keys to the newest end (in the same reverse order). */
#include <pthread.h>
#include <stdlib.h>

#include "obs/log.h"
#include "storage/eviction_policy.h"
#include "storage/key_table.h"

typedef struct lru_node {
    lmc_object_key key;
    struct lru_node *prev, *next;
} lru_node;

typedef struct lru_policy {
    lmc_eviction_policy base;
    pthread_mutex_t mutex;       /* guards everything below */
    lmc_key_table nodes;
    lru_node *oldest, *newest;
} lru_policy;

static lru_policy *as_lru(lmc_eviction_policy *p)
{
    return (lru_policy *)p;
}

static void unlink_node(lru_policy *lru, lru_node *node)
{
    if (node->prev)
        node->prev->next = node->next;
    else
        lru->oldest = node->next;
    if (node->next)
        node->next->prev = node->prev;
    else
        lru->newest = node->prev;
    node->prev = node->next = NULL;
}

static void append_newest(lru_policy *lru, lru_node *node)
{
    node->prev = lru->newest;
    node->next = NULL;
    if (lru->newest)
        lru->newest->next = node;
    else
        lru->oldest = node;
    lru->newest = node;
}

static void forget(lru_policy *lru, lru_node *node)
{
    unlink_node(lru, node);
    lmc_key_table_remove(&lru->nodes, &node->key);
    free(node);
}

/* Moves a tracked key to the newest end; adds it if `create`. */
static void refresh(lru_policy *lru, const lmc_object_key *key, bool create)
{
    lru_node *node = lmc_key_table_find(&lru->nodes, key);
    if (node) {
        unlink_node(lru, node);
        append_newest(lru, node);
        return;
    }
    if (!create)
        return;
    node = calloc(1, sizeof(*node));
    if (node)
        node->key = *key;
    if (!node || lmc_key_table_insert(&lru->nodes, node) != 0) {
        free(node);
        LMC_WARN("LRU: out of memory, key not tracked");
        return;
    }
    append_newest(lru, node);
}

static void refresh_batch(lmc_eviction_policy *p, const lmc_object_key *keys, size_t n,
                          bool create)
{
    lru_policy *lru = as_lru(p);
    pthread_mutex_lock(&lru->mutex);
    for (size_t i = n; i-- > 0;)
        refresh(lru, &keys[i], create);
    pthread_mutex_unlock(&lru->mutex);
}

static void lru_added(lmc_eviction_policy *p, const lmc_object_key *keys, size_t n)
{
    refresh_batch(p, keys, n, true);
}

static void lru_accessed(lmc_eviction_policy *p, const lmc_object_key *keys, size_t n)
{
    refresh_batch(p, keys, n, false);
}

static void lru_removed(lmc_eviction_policy *p, const lmc_object_key *keys, size_t n)
{
    lru_policy *lru = as_lru(p);
    pthread_mutex_lock(&lru->mutex);
    for (size_t i = 0; i < n; i++) {
        lru_node *node = lmc_key_table_find(&lru->nodes, &keys[i]);
        if (node)
            forget(lru, node);
    }
    pthread_mutex_unlock(&lru->mutex);
}

static size_t lru_select(lmc_eviction_policy *p, size_t max, lmc_evictable_fn evictable,
                         void *user, lmc_object_key *out)
{
    lru_policy *lru = as_lru(p);
    size_t found = 0;
    pthread_mutex_lock(&lru->mutex);
    for (lru_node *node = lru->oldest, *next; node && found < max; node = next) {
        next = node->next;
        lmc_l1_evictability verdict = evictable(user, &node->key);
        if (verdict == LMC_L1_EVICTABLE)
            out[found++] = node->key;
        else if (verdict == LMC_L1_GONE)
            forget(lru, node);
    }
    pthread_mutex_unlock(&lru->mutex);
    return found;
}

static size_t lru_tracked(lmc_eviction_policy *p)
{
    lru_policy *lru = as_lru(p);
    pthread_mutex_lock(&lru->mutex);
    size_t n = lru->nodes.count;
    pthread_mutex_unlock(&lru->mutex);
    return n;
}

static void lru_destroy(lmc_eviction_policy *p)
{
    lru_policy *lru = as_lru(p);
    for (lru_node *node = lru->oldest, *next; node; node = next) {
        next = node->next;
        free(node);
    }
    lmc_key_table_destroy(&lru->nodes);
    pthread_mutex_destroy(&lru->mutex);
    free(lru);
}

static const lmc_eviction_policy_ops lru_ops = {
    .name = "LRU",
    .on_keys_added = lru_added,
    .on_keys_accessed = lru_accessed,
    .on_keys_removed = lru_removed,
    .select_victims = lru_select,
    .num_tracked = lru_tracked,
    .destroy = lru_destroy,
};

lmc_eviction_policy *lmc_eviction_policy_lru_new(void)
{
    lru_policy *lru = calloc(1, sizeof(*lru));
    if (!lru)
        return NULL;
    if (lmc_key_table_init(&lru->nodes, offsetof(lru_node, key), 1024) != 0) {
        free(lru);
        return NULL;
    }
    pthread_mutex_init(&lru->mutex, NULL);
    lru->base.ops = &lru_ops;
    return &lru->base;
}
