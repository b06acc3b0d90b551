#include "modules/rid_table.h"

#include <stdlib.h>
#include <string.h>

static uint64_t rid_hash(const char *s, size_t len)
{
    uint64_t h = 1469598103934665603ULL; /* FNV-1a */
    for (size_t i = 0; i < len; i++) {
        h ^= (unsigned char)s[i];
        h *= 1099511628211ULL;
    }
    return h;
}

int lmc_rid_table_init(lmc_rid_table *t, size_t nbuckets)
{
    size_t nb = 16;
    while (nb < nbuckets)
        nb <<= 1;
    *t = (lmc_rid_table){.nbuckets = nb};
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
    uint64_t h = rid_hash(rid, len);
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

int lmc_rid_table_insert(lmc_rid_table *t, lmc_rid_node *n, const char *rid, size_t len,
                         int64_t now_ms)
{
    n->rid = malloc(len + 1);
    if (!n->rid)
        return -1;
    memcpy(n->rid, rid, len);
    n->rid[len] = '\0';
    n->rid_len = len;
    n->hash = rid_hash(rid, len);
    n->last_used_ms = now_ms;
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
