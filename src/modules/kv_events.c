#include "modules/kv_events.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "storage/storage_events.h"
#include "storage/storage_manager.h"

/* A chunk's tokens and parent, shared by the bindings table (while it
 * remembers the chunk) and the stored records that carry them. */
typedef struct binding {
    atomic_uint refs;
    struct binding *next;              /* bucket chain */
    struct binding *older, *newer;     /* LRU list */
    uint8_t hash[LMC_CHUNK_HASH_MAX];
    uint8_t hash_len;
    bool has_parent;
    uint8_t parent[LMC_CHUNK_HASH_MAX];
    uint64_t position;                 /* of its first token in the prompt */
    uint32_t n_tokens;
    uint32_t tokens[];
} binding;

/* A record with its model name and hashes in one allocation; a stored
 * record's tokens are its binding's. */
typedef struct {
    lmc_kv_event pub;   /* first: the public pointer is the record's */
    atomic_uint refs;
    binding *tokens_of; /* referenced, or NULL */
} record;

struct lmc_kv_events {
    pthread_mutex_t lock;
    uint64_t incarnation;
    /* The record of seq s sits at ring[(s - 1) % capacity]; NULL there is a
     * loss marker, so that logging a loss never needs memory. */
    record **ring;
    size_t capacity;
    size_t count;
    uint64_t next_seq;
    uint64_t lost_markers;
    uint64_t unbound_stores;
    binding **buckets;
    size_t n_buckets;                  /* power of two */
    size_t n_bindings, max_bindings;
    binding *oldest, *newest;
    lmc_storage_listener l1;          /* lmc_kv_events_attach() */
    lmc_l2_placement_sink l2;
};

static void binding_unref(binding *b)
{
    if (b && atomic_fetch_sub(&b->refs, 1) == 1)
        free(b);
}

static void record_unref(record *r)
{
    if (r && atomic_fetch_sub(&r->refs, 1) == 1) {
        binding_unref(r->tokens_of);
        free(r);
    }
}

lmc_kv_events *lmc_kv_events_new(size_t capacity, size_t max_bindings, uint64_t incarnation)
{
    if (capacity == 0 || max_bindings == 0)
        return NULL;
    lmc_kv_events *ev = calloc(1, sizeof *ev);
    if (!ev)
        return NULL;
    ev->n_buckets = 16;
    while (ev->n_buckets < max_bindings)
        ev->n_buckets <<= 1;
    ev->ring = calloc(capacity, sizeof *ev->ring);
    ev->buckets = calloc(ev->n_buckets, sizeof *ev->buckets);
    if (!ev->ring || !ev->buckets) {
        free(ev->ring);
        free(ev->buckets);
        free(ev);
        return NULL;
    }
    ev->capacity = capacity;
    ev->max_bindings = max_bindings;
    ev->incarnation = incarnation;
    ev->next_seq = 1;
    pthread_mutex_init(&ev->lock, NULL);
    return ev;
}

void lmc_kv_events_free(lmc_kv_events *ev)
{
    if (!ev)
        return;
    for (size_t i = 0; i < ev->capacity; i++)
        record_unref(ev->ring[i]);
    for (binding *b = ev->oldest, *n; b; b = n) {
        n = b->newer;
        binding_unref(b);
    }
    free(ev->ring);
    free(ev->buckets);
    pthread_mutex_destroy(&ev->lock);
    free(ev);
}

uint64_t lmc_kv_events_incarnation(const lmc_kv_events *ev)
{
    return ev->incarnation;
}

/* ---- the ring ----------------------------------------------------------- */

/* Logs r (NULL: a loss marker) as the next seq; the oldest goes when full. */
static void append_locked(lmc_kv_events *ev, record *r)
{
    size_t slot = (size_t)((ev->next_seq - 1) % ev->capacity);
    if (ev->count == ev->capacity)
        record_unref(ev->ring[slot]);
    else
        ev->count++;
    ev->ring[slot] = r;
    ev->next_seq++;
    if (!r)
        ev->lost_markers++;
}

void lmc_kv_events_mark_lost(lmc_kv_events *ev)
{
    pthread_mutex_lock(&ev->lock);
    append_locked(ev, NULL);
    pthread_mutex_unlock(&ev->lock);
}

static record *record_new(lmc_kv_event_kind kind, lmc_kv_event_medium medium, const char *model,
                          size_t n_hashes, size_t hash_len)
{
    size_t model_len = strlen(model);
    record *r = malloc(sizeof(record) + n_hashes * hash_len + model_len + 1);
    if (!r)
        return NULL;
    uint8_t *hashes = (uint8_t *)(r + 1);
    char *name = (char *)(hashes + n_hashes * hash_len);
    memcpy(name, model, model_len + 1);
    r->pub = (lmc_kv_event){.kind = kind, .medium = medium, .model = name,
                            .model_len = model_len, .hashes = hashes,
                            .n_hashes = (uint32_t)n_hashes, .hash_len = (uint32_t)hash_len};
    atomic_init(&r->refs, 1);
    r->tokens_of = NULL;
    return r;
}

/* ---- bindings ----------------------------------------------------------- */

static size_t bucket_of(const lmc_kv_events *ev, const uint8_t *hash, size_t len)
{
    uint64_t h = 0;
    memcpy(&h, hash, len < 8 ? len : 8);
    h ^= h >> 29;
    h *= 0xbf58476d1ce4e5b9ULL;
    return (size_t)(h >> 17) & (ev->n_buckets - 1);
}

static binding **find_slot(lmc_kv_events *ev, const uint8_t *hash, size_t len)
{
    binding **p = &ev->buckets[bucket_of(ev, hash, len)];
    while (*p && ((*p)->hash_len != len || memcmp((*p)->hash, hash, len) != 0))
        p = &(*p)->next;
    return p;
}

static void lru_unlink(lmc_kv_events *ev, binding *b)
{
    *(b->older ? &b->older->newer : &ev->oldest) = b->newer;
    *(b->newer ? &b->newer->older : &ev->newest) = b->older;
}

static void lru_push(lmc_kv_events *ev, binding *b)
{
    b->older = ev->newest;
    b->newer = NULL;
    *(ev->newest ? &ev->newest->newer : &ev->oldest) = b;
    ev->newest = b;
}

static void forget_oldest_locked(lmc_kv_events *ev)
{
    binding *b = ev->oldest;
    binding **p = find_slot(ev, b->hash, b->hash_len);
    *p = b->next;
    lru_unlink(ev, b);
    ev->n_bindings--;
    binding_unref(b);   /* records logged with it keep it */
}

static void bind_one_locked(lmc_kv_events *ev, const uint8_t *hash, size_t hash_len,
                            const uint64_t *tokens, size_t n_tokens, const uint8_t *parent,
                            uint64_t position)
{
    binding **p = find_slot(ev, hash, hash_len);
    if (*p) {   /* the same hash means the same tokens and parent */
        lru_unlink(ev, *p);
        lru_push(ev, *p);
        return;
    }
    binding *b = malloc(sizeof *b + n_tokens * sizeof(uint32_t));
    if (!b)
        return;   /* its store will count as unbound */
    if (ev->n_bindings == ev->max_bindings) {
        forget_oldest_locked(ev);
        p = find_slot(ev, hash, hash_len);
    }
    atomic_init(&b->refs, 1);
    memcpy(b->hash, hash, hash_len);
    b->hash_len = (uint8_t)hash_len;
    b->has_parent = parent != NULL;
    if (parent)
        memcpy(b->parent, parent, hash_len);
    b->position = position;
    b->n_tokens = (uint32_t)n_tokens;
    for (size_t i = 0; i < n_tokens; i++)
        b->tokens[i] = (uint32_t)tokens[i];
    b->next = NULL;
    *p = b;
    lru_push(ev, b);
    ev->n_bindings++;
}

void lmc_kv_events_bind(lmc_kv_events *ev, const uint8_t *hashes, size_t n_chunks,
                        size_t hash_len, const uint64_t *tokens, size_t chunk_size,
                        const uint8_t *parent, uint64_t position)
{
    if (hash_len == 0 || hash_len > LMC_CHUNK_HASH_MAX)
        return;
    pthread_mutex_lock(&ev->lock);
    for (size_t i = 0; i < n_chunks; i++)
        bind_one_locked(ev, hashes + i * hash_len, hash_len, tokens + i * chunk_size,
                        chunk_size, i ? hashes + (i - 1) * hash_len : parent,
                        position + i * chunk_size);
    pthread_mutex_unlock(&ev->lock);
}

size_t lmc_kv_events_tokens_of(lmc_kv_events *ev, const uint8_t *hash, size_t hash_len,
                               uint32_t *tokens, size_t cap, uint64_t *position)
{
    if (hash_len == 0 || hash_len > LMC_CHUNK_HASH_MAX)
        return 0;
    pthread_mutex_lock(&ev->lock);
    const binding *b = *find_slot(ev, hash, hash_len);
    size_t n = b && b->n_tokens <= cap ? b->n_tokens : 0;
    if (n) {
        memcpy(tokens, b->tokens, n * sizeof *tokens);
        *position = b->position;
    }
    pthread_mutex_unlock(&ev->lock);
    return n;
}

/* ---- records from keys -------------------------------------------------- */

static int cmp_key_ptr(const void *a, const void *b)
{
    const lmc_object_key *x = *(const lmc_object_key *const *)a;
    const lmc_object_key *y = *(const lmc_object_key *const *)b;
    int c = x->model_name == y->model_name ? 0 : strcmp(x->model_name, y->model_name);
    if (!c)
        c = (int)x->chunk_hash_len - (int)y->chunk_hash_len;
    if (!c)
        c = memcmp(x->chunk_hash, y->chunk_hash, x->chunk_hash_len);
    if (!c)   /* equal keys keep their order: the first is the one logged */
        c = (x > y) - (x < y);
    return c;
}

static bool same_chunk(const lmc_object_key *x, const lmc_object_key *y)
{
    return x->chunk_hash_len == y->chunk_hash_len &&
           memcmp(x->chunk_hash, y->chunk_hash, x->chunk_hash_len) == 0 &&
           (x->model_name == y->model_name || strcmp(x->model_name, y->model_name) == 0);
}

/* Calls of up to SMALL keys (a store request's chunks, ranks and groups)
 * sort on the stack. */
#define SMALL 64

/* keys sorted by (model, hash, position), in `small` when they fit; NULL
 * when out of memory. */
static const lmc_object_key **sorted_keys(const lmc_object_key *keys, size_t n,
                                          const lmc_object_key **small)
{
    const lmc_object_key **s = n <= SMALL ? small : malloc(n * sizeof *s);
    if (!s)
        return NULL;
    for (size_t i = 0; i < n; i++)
        s[i] = &keys[i];
    qsort(s, n, sizeof *s, cmp_key_ptr);
    return s;
}

static void log_stored_locked(lmc_kv_events *ev, lmc_kv_event_medium medium,
                              const lmc_object_key *k)
{
    binding **p = find_slot(ev, k->chunk_hash, k->chunk_hash_len);
    if (!*p) {
        ev->unbound_stores++;
        return;
    }
    binding *b = *p;
    record *r = record_new(LMC_KV_EVENT_STORED, medium, k->model_name, 1, b->hash_len);
    if (!r) {
        append_locked(ev, NULL);
        return;
    }
    memcpy((uint8_t *)r->pub.hashes, b->hash, b->hash_len);
    atomic_fetch_add(&b->refs, 1);
    r->tokens_of = b;
    r->pub.tokens = b->tokens;
    r->pub.n_tokens = b->n_tokens;
    r->pub.has_parent = b->has_parent;
    memcpy(r->pub.parent, b->parent, sizeof r->pub.parent);
    append_locked(ev, r);
}

void lmc_kv_events_stored(lmc_kv_events *ev, lmc_kv_event_medium medium,
                          const lmc_object_key *keys, size_t n)
{
    if (n == 0)
        return;
    const lmc_object_key *small_s[SMALL];
    bool small_first[SMALL] = {0};
    const lmc_object_key **s = sorted_keys(keys, n, small_s);
    bool *first = n <= SMALL ? small_first : calloc(n, sizeof *first);
    if (s && first) /* keys[i] is logged when it is its chunk's first */
        for (size_t i = 0; i < n; i++)
            if (i == 0 || !same_chunk(s[i - 1], s[i]))
                first[s[i] - keys] = true;
    pthread_mutex_lock(&ev->lock);
    if (!s || !first)
        append_locked(ev, NULL);
    else
        for (size_t i = 0; i < n; i++)
            if (first[i])
                log_stored_locked(ev, medium, &keys[i]);
    pthread_mutex_unlock(&ev->lock);
    if (first != small_first)
        free(first);
    if (s != small_s)
        free(s);
}

/* One removed record of s[0..n), the sorted keys of one model. */
static record *removed_record(lmc_kv_event_medium medium, const lmc_object_key **s, size_t n)
{
    size_t distinct = 0, hash_len = s[0]->chunk_hash_len;
    for (size_t i = 0; i < n; i++)
        distinct += i == 0 || !same_chunk(s[i - 1], s[i]);
    record *r = record_new(LMC_KV_EVENT_REMOVED, medium, s[0]->model_name, distinct, hash_len);
    if (!r)
        return NULL;
    uint8_t *out = (uint8_t *)r->pub.hashes;
    for (size_t i = 0; i < n; i++)
        if (i == 0 || !same_chunk(s[i - 1], s[i])) {
            memcpy(out, s[i]->chunk_hash, hash_len);
            out += hash_len;
        }
    return r;
}

void lmc_kv_events_removed(lmc_kv_events *ev, lmc_kv_event_medium medium,
                           const lmc_object_key *keys, size_t n)
{
    if (n == 0)
        return;
    const lmc_object_key *small_s[SMALL];
    record *small_recs[SMALL];
    const lmc_object_key **s = sorted_keys(keys, n, small_s);
    /* Build the records before taking the lock: a model's keys run
     * together in s, of one hash length (the server's algorithm). */
    size_t models = 0;
    record **recs = !s ? NULL : n <= SMALL ? small_recs : malloc(n * sizeof *recs);
    bool failed = !recs;
    for (size_t i = 0; recs && i < n;) {
        size_t j = i + 1;
        while (j < n && strcmp(s[j]->model_name, s[i]->model_name) == 0 &&
               s[j]->chunk_hash_len == s[i]->chunk_hash_len)
            j++;
        recs[models] = removed_record(medium, s + i, j - i);
        failed |= !recs[models];
        models += recs[models] != NULL;
        i = j;
    }
    pthread_mutex_lock(&ev->lock);
    for (size_t i = 0; i < models; i++)
        append_locked(ev, recs[i]);
    if (failed)
        append_locked(ev, NULL);
    pthread_mutex_unlock(&ev->lock);
    if (recs != small_recs)
        free(recs);
    if (s != small_s)
        free(s);
}

/* ---- reading ------------------------------------------------------------ */

static void drop_entries(lmc_kv_events_page *page)
{
    for (size_t i = 0; i < page->n; i++)
        record_unref((record *)page->entries[i].event);
    page->n = 0;
}

int lmc_kv_events_read(lmc_kv_events *ev, const char *model, size_t model_len, uint64_t cursor,
                       size_t max_events, lmc_kv_events_page *page)
{
    if (max_events > LMC_KV_EVENTS_MAX_POLL)
        max_events = LMC_KV_EVENTS_MAX_POLL;
    *page = (lmc_kv_events_page){0};
    page->entries = malloc((max_events ? max_events : 1) * sizeof *page->entries);
    if (!page->entries)
        return -1;
    pthread_mutex_lock(&ev->lock);
    uint64_t last = ev->next_seq - 1, first = ev->next_seq - ev->count;
    page->next_cursor = cursor > last ? last : cursor;
    /* A cursor this log never issued, or one from before its oldest record. */
    page->lost = cursor > last || (ev->count > 0 && cursor + 1 < first);
    for (uint64_t seq = cursor + 1 > first ? cursor + 1 : first;
         ev->count > 0 && seq <= last && page->n < max_events; seq++) {
        record *r = ev->ring[(seq - 1) % ev->capacity];
        page->next_cursor = seq;
        if (!r) {   /* what was logged before the loss is no use on its own */
            page->lost = true;
            drop_entries(page);
            continue;
        }
        if (model && (r->pub.model_len != model_len ||
                      memcmp(r->pub.model, model, model_len) != 0))
            continue;
        atomic_fetch_add(&r->refs, 1);
        page->entries[page->n++] = (lmc_kv_events_entry){seq, &r->pub};
    }
    pthread_mutex_unlock(&ev->lock);
    return 0;
}

void lmc_kv_events_page_free(lmc_kv_events_page *page)
{
    drop_entries(page);
    free(page->entries);
    page->entries = NULL;
}

void lmc_kv_events_get_stats(lmc_kv_events *ev, lmc_kv_events_stats *out)
{
    pthread_mutex_lock(&ev->lock);
    *out = (lmc_kv_events_stats){.log_depth = ev->count, .log_capacity = ev->capacity,
                                 .next_seq = ev->next_seq, .lost_markers = ev->lost_markers,
                                 .unbound_stores = ev->unbound_stores,
                                 .bindings = ev->n_bindings};
    pthread_mutex_unlock(&ev->lock);
}

/* ---- the storage's reports (docs/kv_events.md, "What is logged") ------- */

static void l1_written(void *user, const lmc_object_key *keys, size_t n)
{
    lmc_kv_events_stored(user, LMC_KV_MEDIUM_CPU, keys, n);
}

static void l1_deleted(void *user, const lmc_object_key *keys, size_t n)
{
    lmc_kv_events_removed(user, LMC_KV_MEDIUM_CPU, keys, n);
}

static void l2_placed(void *user, lmc_placement_kind kind, const char *backend, bool shared,
                      const lmc_object_key *keys, const uint64_t *sizes, size_t n)
{
    (void)backend, (void)shared, (void)sizes;
    if (kind == LMC_PLACEMENT_STORED)
        lmc_kv_events_stored(user, LMC_KV_MEDIUM_STORAGE, keys, n);
    else if (kind == LMC_PLACEMENT_DELETED)
        lmc_kv_events_removed(user, LMC_KV_MEDIUM_STORAGE, keys, n);
}

int lmc_kv_events_attach(lmc_kv_events *ev, lmc_storage_manager *sm)
{
    ev->l1 = (lmc_storage_listener){.on_written = l1_written, .on_deleted = l1_deleted,
                                    .user = ev};
    ev->l2 = (lmc_l2_placement_sink){.fn = l2_placed, .user = ev};
    if (lmc_storage_manager_add_listener(sm, &ev->l1) != 0)
        return -1;
    return lmc_storage_manager_add_l2_placement_sink(sm, &ev->l2);
}
