#include "modules/services/rid_table.h"

#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

/* ---- SipHash-2-4: a keyed hash whose outputs a client that does not know
 * the key cannot steer; two rounds per 8-byte word, four to finish. */

static inline uint64_t rotl(uint64_t x, int b)
{
    return (x << b) | (x >> (64 - b));
}

static inline void sip_round(uint64_t v[4])
{
    v[0] += v[1], v[1] = rotl(v[1], 13), v[1] ^= v[0], v[0] = rotl(v[0], 32);
    v[2] += v[3], v[3] = rotl(v[3], 16), v[3] ^= v[2];
    v[0] += v[3], v[3] = rotl(v[3], 21), v[3] ^= v[0];
    v[2] += v[1], v[1] = rotl(v[1], 17), v[1] ^= v[2], v[2] = rotl(v[2], 32);
}

static inline void sip_word(uint64_t v[4], uint64_t m)
{
    v[3] ^= m;
    sip_round(v);
    sip_round(v);
    v[0] ^= m;
}

static uint64_t load_le(const unsigned char *p, size_t n)
{
    uint64_t w = 0;
    for (size_t i = 0; i < n; i++)
        w |= (uint64_t)p[i] << (8 * i);
    return w;
}

uint64_t lmc_rid_hash(const uint64_t k[2], const char *s, size_t len)
{
    const unsigned char *p = (const unsigned char *)s;
    uint64_t v[4] = {k[0] ^ 0x736f6d6570736575ULL, k[1] ^ 0x646f72616e646f6dULL,
                     k[0] ^ 0x6c7967656e657261ULL, k[1] ^ 0x7465646279746573ULL};
    size_t whole = len & ~(size_t)7;
    for (size_t i = 0; i < whole; i += 8)
        sip_word(v, load_le(p + i, 8));
    sip_word(v, load_le(p + whole, len - whole) | (uint64_t)len << 56);
    v[2] ^= 0xff;
    for (int i = 0; i < 4; i++)
        sip_round(v);
    return v[0] ^ v[1] ^ v[2] ^ v[3];
}

/* ---- the table ---------------------------------------------------------- */

int lmc_rid_table_init(lmc_rid_table *t, size_t nbuckets)
{
    size_t nb = 16;
    while (nb < nbuckets)
        nb <<= 1;
    *t = (lmc_rid_table){.nbuckets = nb};
    if (getrandom(t->key, sizeof t->key, 0) != (ssize_t)sizeof t->key)
        return -1;
    t->buckets = calloc(nb, sizeof *t->buckets);
    return t->buckets ? 0 : -1;
}

void lmc_rid_table_destroy(lmc_rid_table *t)
{
    free(t->buckets);
    t->buckets = NULL;
}

lmc_rid_node *lmc_rid_table_find(lmc_rid_table *t, const char *rid, size_t len)
{
    uint64_t h = lmc_rid_hash(t->key, rid, len);
    for (lmc_rid_node *n = t->buckets[h & (t->nbuckets - 1)]; n; n = n->hnext) {
        if (n->hash == h && n->rid_len == len && memcmp(n->rid, rid, len) == 0)
            return n;
    }
    return NULL;
}

static void link_newest(lmc_rid_table *t, lmc_rid_node *n)
{
    n->older = t->newest;
    n->newer = NULL;
    if (t->newest)
        t->newest->newer = n;
    t->newest = n;
    if (!t->oldest)
        t->oldest = n;
}

static void unlink_recency(lmc_rid_table *t, lmc_rid_node *n)
{
    if (n->newer)
        n->newer->older = n->older;
    else
        t->newest = n->older;
    if (n->older)
        n->older->newer = n->newer;
    else
        t->oldest = n->newer;
    n->newer = n->older = NULL;
}

/* Doubles the bucket array; keeps the old one when memory is short (the
 * table stays correct, its chains only get longer). */
static void grow(lmc_rid_table *t)
{
    size_t nb = t->nbuckets * 2;
    lmc_rid_node **b = calloc(nb, sizeof *b);
    if (!b)
        return;
    for (size_t i = 0; i < t->nbuckets; i++) {
        for (lmc_rid_node *n = t->buckets[i], *next; n; n = next) {
            next = n->hnext;
            n->hnext = b[n->hash & (nb - 1)];
            b[n->hash & (nb - 1)] = n;
        }
    }
    free(t->buckets);
    t->buckets = b;
    t->nbuckets = nb;
}

int lmc_rid_table_insert(lmc_rid_table *t, lmc_rid_node *n, const char *rid, size_t len,
                         int64_t now_ms)
{
    n->rid = malloc(len + 1);
    if (!n->rid)
        return -1;
    memcpy(n->rid, rid, len);
    n->rid[len] = '\0';
    n->rid_len = len;
    n->hash = lmc_rid_hash(t->key, rid, len);
    n->last_used_ms = now_ms;
    if (t->count >= t->nbuckets)
        grow(t);
    lmc_rid_node **b = &t->buckets[n->hash & (t->nbuckets - 1)];
    n->hnext = *b;
    *b = n;
    link_newest(t, n);
    t->count++;
    return 0;
}

void lmc_rid_table_remove(lmc_rid_table *t, lmc_rid_node *n)
{
    lmc_rid_node **p = &t->buckets[n->hash & (t->nbuckets - 1)];
    while (*p && *p != n)
        p = &(*p)->hnext;
    if (*p)
        *p = n->hnext;
    unlink_recency(t, n);
    t->count--;
    free(n->rid);
    n->rid = NULL;
}

void lmc_rid_table_touch(lmc_rid_table *t, lmc_rid_node *n, int64_t now_ms)
{
    n->last_used_ms = now_ms;
    unlink_recency(t, n);
    link_newest(t, n);
}
