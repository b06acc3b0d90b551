/* "mock" backend: objects in process memory (tests and demos).  One mutex
 * guards the table; copies run under it, which is fine for a test double. */
#include <pthread.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "storage/key_table.h"
#include "storage/l2/l2_adapter.h"
#include "storage/object_key_json.h"

typedef struct mock_item {
    lmc_object_key key;      /* strings interned in mock.interner */
    uint8_t *data;
    uint64_t size;
    uint32_t locks;
} mock_item;

typedef struct mock {
    lmc_l2_backend base;     /* first: a backend pointer is a mock pointer */
    pthread_mutex_t mu;
    lmc_key_table table;
    lmc_key_interner *interner;
    uint64_t used, capacity;
} mock;

/* A copy of k whose strings live as long as the backend. */
static int own_key(mock *m, const lmc_object_key *k, lmc_object_key *out)
{
    *out = *k;
    out->model_name = lmc_intern(m->interner, k->model_name, strlen(k->model_name));
    out->cache_salt = lmc_intern(m->interner, k->cache_salt, strlen(k->cache_salt));
    out->interned = 0; /* the backend's own names: they count nothing */
    return out->model_name && out->cache_salt ? 0 : -1;
}

static int store_one(mock *m, const lmc_object_key *k, const uint8_t *buf, uint64_t size)
{
    if (lmc_key_table_find(&m->table, k))
        return 0;   /* skip existing */
    if (m->capacity && m->used + size > m->capacity)
        return -1;  /* no L2 eviction yet: a full mock refuses */
    mock_item *it = calloc(1, sizeof *it);
    if (!it || own_key(m, k, &it->key) != 0 || !(it->data = malloc(size ? size : 1))) {
        free(it);
        return -1;
    }
    memcpy(it->data, buf, size);
    it->size = size;
    if (lmc_key_table_insert(&m->table, it) != 0) {
        free(it->data);
        free(it);
        return -1;
    }
    m->used += size;
    return 0;
}

static int64_t mock_store(lmc_l2_backend *b, const lmc_object_key *keys, uint8_t *const *bufs,
                          const uint64_t *sizes, size_t n)
{
    mock *m = (mock *)b;
    int64_t bytes = 0;
    bool failed = false;
    pthread_mutex_lock(&m->mu);
    for (size_t i = 0; i < n; i++) {
        if (store_one(m, &keys[i], bufs[i], sizes[i]) != 0)
            failed = true;
        else
            bytes += (int64_t)sizes[i];
    }
    pthread_mutex_unlock(&m->mu);
    return failed ? -1 : bytes;
}

static void mock_lookup(lmc_l2_backend *b, const lmc_object_key *keys, const uint64_t *sizes,
                        size_t n, uint8_t *found)
{
    mock *m = (mock *)b;
    pthread_mutex_lock(&m->mu);
    for (size_t i = 0; i < n; i++) {
        mock_item *it = lmc_key_table_find(&m->table, &keys[i]);
        found[i] = it && (!sizes || it->size == sizes[i]);
        if (found[i])
            it->locks++;
    }
    pthread_mutex_unlock(&m->mu);
}

static void mock_load(lmc_l2_backend *b, const lmc_object_key *keys, uint8_t *const *bufs,
                      const uint64_t *sizes, size_t n, uint8_t *ok)
{
    mock *m = (mock *)b;
    pthread_mutex_lock(&m->mu);
    for (size_t i = 0; i < n; i++) {
        mock_item *it = lmc_key_table_find(&m->table, &keys[i]);
        ok[i] = it && it->size == sizes[i];
        if (ok[i])
            memcpy(bufs[i], it->data, sizes[i]);
    }
    pthread_mutex_unlock(&m->mu);
}

static void mock_unlock(lmc_l2_backend *b, const lmc_object_key *keys, size_t n)
{
    mock *m = (mock *)b;
    pthread_mutex_lock(&m->mu);
    for (size_t i = 0; i < n; i++) {
        mock_item *it = lmc_key_table_find(&m->table, &keys[i]);
        if (it && it->locks)
            it->locks--;
    }
    pthread_mutex_unlock(&m->mu);
}

static size_t mock_remove(lmc_l2_backend *b, const lmc_object_key *keys, size_t n)
{
    mock *m = (mock *)b;
    size_t done = 0;
    pthread_mutex_lock(&m->mu);
    for (size_t i = 0; i < n; i++) {
        mock_item *it = lmc_key_table_find(&m->table, &keys[i]);
        if (!it || it->locks)
            continue;
        lmc_key_table_remove(&m->table, &keys[i]);
        m->used -= it->size;
        free(it->data);
        free(it);
        done++;
    }
    pthread_mutex_unlock(&m->mu);
    return done;
}

static void mock_usage(lmc_l2_backend *b, lmc_l2_usage *u)
{
    mock *m = (mock *)b;
    pthread_mutex_lock(&m->mu);
    u->used_bytes = m->used;
    u->capacity_bytes = m->capacity;
    u->num_keys = m->table.count;
    pthread_mutex_unlock(&m->mu);
}

static void mock_list(lmc_l2_backend *b, const char *model, json_t *entries)
{
    mock *m = (mock *)b;
    pthread_mutex_lock(&m->mu);
    for (size_t i = 0; i < m->table.capacity; i++) {
        mock_item *it = lmc_key_table_slot_item(&m->table, i);
        if (!it || (model && strcmp(model, it->key.model_name) != 0))
            continue;
        char name[512];
        if (lmc_object_key_to_string(&it->key, name, sizeof name) < 0)
            continue;
        json_array_append_new(entries, json_pack("{s:s, s:o, s:I}", "name", name, "key",
                                                 lmc_object_key_json(&it->key), "size_bytes",
                                                 (json_int_t)it->size));
    }
    pthread_mutex_unlock(&m->mu);
}

static json_t *mock_status(lmc_l2_backend *b)
{
    (void)b;
    return json_object();
}

static void mock_destroy(lmc_l2_backend *b)
{
    mock *m = (mock *)b;
    for (size_t i = 0; i < m->table.capacity; i++) {
        mock_item *it = lmc_key_table_slot_item(&m->table, i);
        if (it) {
            free(it->data);
            free(it);
        }
    }
    lmc_key_table_destroy(&m->table);
    lmc_key_interner_free(m->interner);
    pthread_mutex_destroy(&m->mu);
    free(m);
}

static const lmc_l2_backend_ops mock_ops = {
    mock_store, mock_lookup, mock_load, mock_unlock, mock_remove,
    mock_usage, mock_list, mock_status, mock_destroy, NULL, /* in memory: nothing survives */
    NULL, /* in process: nothing to reach, always healthy */
};

lmc_l2_backend *lmc_l2_mock_new(uint64_t capacity_bytes)
{
    mock *m = calloc(1, sizeof *m);
    if (!m)
        return NULL;
    m->base = (lmc_l2_backend){&mock_ops, "mock",
                               LMC_L2_SPLIT_STORE | LMC_L2_SPLIT_LOOKUP | LMC_L2_SPLIT_LOAD};
    m->capacity = capacity_bytes;
    m->interner = lmc_key_interner_new();
    if (!m->interner || lmc_key_table_init(&m->table, offsetof(mock_item, key), 64) != 0) {
        lmc_key_interner_free(m->interner);
        free(m);
        return NULL;
    }
    pthread_mutex_init(&m->mu, NULL);
    return &m->base;
}
