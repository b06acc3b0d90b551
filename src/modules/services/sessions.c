#include "modules/services/sessions.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "modules/services/rid_table.h"

struct lmc_session_priv {
    lmc_rid_node node;        /* first: node pointer == priv pointer */
    lmc_session pub;
    pthread_mutex_t lock;
    lmc_hash_chain *chain;
    uint32_t chunk_size;
    uint32_t refs;            /* guarded by the table mutex */
    bool linked;
    struct lmc_session_priv *dead_next; /* unlinked, to free once the table is unlocked */
};

struct lmc_sessions {
    lmc_sessions_options o;
    pthread_mutex_t lock;
    lmc_rid_table table;
};

static int64_t now_ms(lmc_sessions *s)
{
    return s->o.clock ? s->o.clock(s->o.clock_user) : lmc_monotonic_ms(NULL);
}

void lmc_lookup_locks_clear(lmc_lookup_locks *l)
{
    if (l->keys)
        lmc_keys_drop(l->keys, l->n_keys_held);
    free(l->keys);
    free(l->leases);
    *l = (lmc_lookup_locks){0};
}

static void session_free(struct lmc_session_priv *p)
{
    if (p->pub.ext)
        p->pub.ext->release(p->pub.ext);
    lmc_lookup_locks_clear(&p->pub.locks);
    lmc_hash_chain_free(p->chain);
    pthread_mutex_destroy(&p->lock);
    free(p);
}

lmc_sessions *lmc_sessions_new(const lmc_sessions_options *o)
{
    lmc_sessions *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    s->o = *o;
    if (!s->o.max_sessions)
        s->o.max_sessions = 65536;
    if (lmc_rid_table_init(&s->table, 16) != 0) {
        free(s);
        return NULL;
    }
    pthread_mutex_init(&s->lock, NULL);
    return s;
}

/* Unlinks under the table mutex; when nobody holds it, queues it on *dead
 * for free_dead() once the mutex is released (a module's session state
 * may give storage locks back: never under this mutex). */
static void unlink_locked(lmc_sessions *s, struct lmc_session_priv *p,
                          struct lmc_session_priv **dead)
{
    lmc_rid_table_remove(&s->table, &p->node);
    p->linked = false;
    if (p->refs == 0) {
        p->dead_next = *dead;
        *dead = p;
    }
}

static void free_dead(struct lmc_session_priv *p)
{
    while (p) {
        struct lmc_session_priv *next = p->dead_next;
        session_free(p);
        p = next;
    }
}

void lmc_sessions_free(lmc_sessions *s)
{
    if (!s)
        return;
    struct lmc_session_priv *dead = NULL;
    while (s->table.oldest)
        unlink_locked(s, (struct lmc_session_priv *)s->table.oldest, &dead);
    free_dead(dead);
    lmc_rid_table_destroy(&s->table);
    pthread_mutex_destroy(&s->lock);
    free(s);
}

static void prune_locked(lmc_sessions *s, int64_t now, struct lmc_session_priv **dead)
{
    while (s->table.oldest &&
           (s->table.count >= s->o.max_sessions ||
            (s->o.max_idle_ms > 0 && now - s->table.oldest->last_used_ms > s->o.max_idle_ms)))
        unlink_locked(s, (struct lmc_session_priv *)s->table.oldest, dead);
}

static struct lmc_session_priv *create_locked(lmc_sessions *s, const char *rid, size_t len,
                                              int64_t now, struct lmc_session_priv **dead)
{
    prune_locked(s, now, dead);
    struct lmc_session_priv *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    p->chain = lmc_hash_chain_new(s->o.hasher);
    if (!p->chain || lmc_rid_table_insert(&s->table, &p->node, rid, len, now) != 0) {
        lmc_hash_chain_free(p->chain);
        free(p);
        return NULL;
    }
    pthread_mutex_init(&p->lock, NULL);
    p->pub.priv = p;
    p->chunk_size = lmc_token_hasher_chunk_size(s->o.hasher);
    p->pub.hit_chunks = -1;
    p->linked = true;
    return p;
}

lmc_session *lmc_sessions_acquire(lmc_sessions *s, const char *rid, size_t len, bool create)
{
    int64_t now = now_ms(s);
    struct lmc_session_priv *dead = NULL;
    pthread_mutex_lock(&s->lock);
    struct lmc_session_priv *p = (struct lmc_session_priv *)lmc_rid_table_find(&s->table, rid, len);
    if (p && s->o.max_idle_ms > 0 && now - p->node.last_used_ms > s->o.max_idle_ms) {
        unlink_locked(s, p, &dead);   /* stale: start afresh */
        p = NULL;
    }
    if (p)
        lmc_rid_table_touch(&s->table, &p->node, now);
    else if (create)
        p = create_locked(s, rid, len, now, &dead);
    if (p)
        p->refs++;
    pthread_mutex_unlock(&s->lock);
    free_dead(dead);
    if (!p)
        return NULL;
    pthread_mutex_lock(&p->lock);
    return &p->pub;
}

void lmc_sessions_release(lmc_sessions *s, lmc_session *se)
{
    struct lmc_session_priv *p = se->priv;
    pthread_mutex_unlock(&p->lock);
    pthread_mutex_lock(&s->lock);
    bool dead = --p->refs == 0 && !p->linked;
    pthread_mutex_unlock(&s->lock);
    if (dead)
        session_free(p);
}

lmc_session *lmc_sessions_remove(lmc_sessions *s, const char *rid, size_t len)
{
    pthread_mutex_lock(&s->lock);
    struct lmc_session_priv *p = (struct lmc_session_priv *)lmc_rid_table_find(&s->table, rid, len);
    if (p) {
        p->refs++;
        lmc_rid_table_remove(&s->table, &p->node);
        p->linked = false;
    }
    pthread_mutex_unlock(&s->lock);
    if (!p)
        return NULL;
    pthread_mutex_lock(&p->lock);
    return &p->pub;
}

size_t lmc_sessions_count(lmc_sessions *s)
{
    pthread_mutex_lock(&s->lock);
    size_t n = s->table.count;
    pthread_mutex_unlock(&s->lock);
    return n;
}

int lmc_session_hashes(lmc_session *se, const uint64_t *tokens, size_t n_tokens, size_t start,
                       size_t end, const uint8_t **out)
{
    struct lmc_session_priv *p = se->priv;
    int rc = lmc_hash_chain_extend_to(p->chain, tokens, n_tokens, end);
    if (rc != LMC_HASH_OK)
        return rc;
    *out = end > start ? lmc_hash_chain_get(p->chain, start / p->chunk_size) : NULL;
    return LMC_HASH_OK;
}

int lmc_sessions_hash_range(lmc_sessions *s, const char *rid, size_t len, const uint64_t *tokens,
                            size_t n_tokens, size_t start, size_t end, uint8_t *out)
{
    if (end <= start)
        return LMC_HASH_OK;
    lmc_session *se = lmc_sessions_acquire(s, rid, len, true);
    if (!se) /* out of memory: still answer, just without caching */
        return lmc_hash_chunks(s->o.hasher, tokens, n_tokens, start, end, out);
    const uint8_t *h;
    int rc = lmc_session_hashes(se, tokens, n_tokens, start, end, &h);
    if (rc == LMC_HASH_OK)
        memcpy(out, h, (end - start) / se->priv->chunk_size * LMC_TOKEN_HASH_LEN);
    lmc_sessions_release(s, se);
    return rc;
}
