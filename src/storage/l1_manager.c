#include "storage/l1_manager.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

#include "obs/log.h"
#include "storage/key_table.h"

typedef struct l1_record {
    uint64_t offset;
    uint64_t size;           /* aligned allocation */
    uint64_t raw_size;       /* object_size the writer asked for (L2 copies exactly it) */
    lmc_ttl_lock lock;       /* write lock (staging) or read lock (resident) */
    uint32_t pins;           /* resident: unsafe_reads whose copy is not done (unpin) */
    bool is_temporary;
    bool sampled;            /* resident: the lifecycle sampler picked this key */
    int64_t admitted_ms;     /* resident: when it became readable */
    int64_t touched_ms;      /* resident: last read lock or touch */
    lmc_l1_copy_id copy;     /* resident: which copy of the key this is */
} l1_record;

typedef struct l1_staging {
    char *tag;               /* owned copy of the writer tag */
    l1_record rec;
} l1_staging;

typedef struct l1_entry {
    lmc_object_key key;
    bool resident;
    l1_record object;        /* valid when resident */
    l1_staging *staging;
    uint32_t num_staging;
    uint32_t cap_staging;
} l1_entry;

/* A buffer that a forced delete or clear unlinked while someone still used
 * it: a writer with a live reservation (an engine copying into its slot, an
 * L2 load) or readers that took its range and are copying out (pins: an
 * engine's PREPARE_RETRIEVE, a write-behind).  Its key is gone from the
 * cache at once, but the memory stays allocated until they are done or
 * their lock expires, so that a late copy never lands in, or reads from, an
 * object allocated there since.  Read shares nobody is copying under (a
 * LOOKUP's) do not hold a buffer back. */
typedef struct l1_retired {
    lmc_object_key key;
    char *tag;               /* the writer's; NULL for readers of a resident copy */
    l1_record rec;           /* readers: lock.count = copies still in flight */
} l1_retired;

typedef struct l1_event {
    struct l1_event *next;
    lmc_l1_event_kind kind;
    size_t n;
    lmc_object_key keys[];
} l1_event;

typedef struct l1_listener {
    lmc_l1_listener_fn fn;
    void *user;
} l1_listener;

struct lmc_l1_manager {
    pthread_mutex_t mutex;           /* guards everything below */
    lmc_l1_alloc *alloc;
    lmc_key_table entries;
    uint64_t configured_bytes;
    int64_t write_ttl_ms;
    int64_t read_ttl_ms;
    lmc_clock_ms_fn clock;
    void *clock_user;
    char backend[32];
    size_t num_objects, num_staging, num_temporary;
    uint64_t object_bytes, staging_bytes;
    lmc_l1_copy_id last_copy;        /* copy ids count up from 1 */
    l1_retired *retired;             /* see l1_retired; usually empty */
    size_t num_retired, cap_retired;
    uint64_t retired_bytes;
    int64_t retired_due_ms;          /* no retired lock expires before this */
    l1_listener listeners[LMC_L1_MAX_LISTENERS];
    size_t num_listeners;
    l1_event *queue_head, *queue_tail;
    /* Bulk operations (delete, clear) collect freed ranges here and return
     * them with one lmc_l1_alloc_release_batch() at the end. */
    bool deferring_frees;
    lmc_l1_range *deferred;
    size_t num_deferred, cap_deferred;
    pthread_mutex_t dispatch_mutex;  /* held while delivering events */
    /* Lifecycle sampling (lmc_l1_manager_set_sampler): gaps between touches
     * of sampled objects wait here until the next take_reuse_gaps. */
    lmc_l1_sampler_fn sampler;
    void *sampler_user;
    double reuse_gaps_s[LMC_L1_REUSE_GAPS_MAX];
    size_t num_reuse_gaps;
};

const char *lmc_l1_result_name(lmc_l1_result r)
{
    static const char *const names[] = {
        "SUCCESS", "KEY_NOT_EXIST", "KEY_NOT_READABLE", "KEY_NOT_WRITABLE",
        "KEY_IN_WRONG_STATE", "KEY_IS_LOCKED", "OUT_OF_MEMORY",
    };
    return (unsigned)r < sizeof(names) / sizeof(names[0]) ? names[r] : "UNKNOWN";
}

const char *lmc_l1_event_kind_name(lmc_l1_event_kind kind)
{
    static const char *const names[] = {
        "write_reserved", "write_finished", "write_finished_read_reserved",
        "read_reserved", "read_finished", "deleted", "accessed",
    };
    return (unsigned)kind < sizeof(names) / sizeof(names[0]) ? names[kind] : "unknown";
}

/* ---- events ------------------------------------------------------------ */

/* Under the mutex.  NULL when nobody listens (or on allocation failure,
 * which only loses notifications). */
static l1_event *event_begin(lmc_l1_manager *m, lmc_l1_event_kind kind, size_t capacity)
{
    if (m->num_listeners == 0 || capacity == 0)
        return NULL;
    l1_event *ev = malloc(sizeof(*ev) + capacity * sizeof(lmc_object_key));
    if (!ev) {
        LMC_WARN("L1: out of memory, dropping %s notification", lmc_l1_event_kind_name(kind));
        return NULL;
    }
    ev->next = NULL;
    ev->kind = kind;
    ev->n = 0;
    return ev;
}

static void event_add(l1_event *ev, const lmc_object_key *key)
{
    if (ev)
        ev->keys[ev->n++] = *key;
}

/* Under the mutex: queue the event (in mutex order) or drop an empty one. */
static void event_commit(lmc_l1_manager *m, l1_event *ev)
{
    if (!ev)
        return;
    if (ev->n == 0) {
        free(ev);
        return;
    }
    if (m->queue_tail)
        m->queue_tail->next = ev;
    else
        m->queue_head = ev;
    m->queue_tail = ev;
}

static l1_event *detach_queue(lmc_l1_manager *m, l1_listener *snapshot, size_t *num)
{
    pthread_mutex_lock(&m->mutex);
    l1_event *batch = m->queue_head;
    m->queue_head = m->queue_tail = NULL;
    memcpy(snapshot, m->listeners, m->num_listeners * sizeof(*snapshot));
    *num = m->num_listeners;
    pthread_mutex_unlock(&m->mutex);
    return batch;
}

static void deliver(l1_event *batch, const l1_listener *listeners, size_t num)
{
    while (batch) {
        l1_event *next = batch->next;
        for (size_t i = 0; i < num; i++)
            listeners[i].fn(listeners[i].user, batch->kind, batch->keys, batch->n);
        free(batch);
        batch = next;
    }
}

static bool queue_is_empty(lmc_l1_manager *m)
{
    pthread_mutex_lock(&m->mutex);
    bool empty = m->queue_head == NULL;
    pthread_mutex_unlock(&m->mutex);
    return empty;
}

/* Called with the mutex released.  Whoever holds dispatch_mutex delivers
 * everything queued; after letting go it re-checks the queue, so events
 * queued by a thread whose trylock failed are never stranded. */
static void dispatch_events(lmc_l1_manager *m)
{
    l1_listener snapshot[LMC_L1_MAX_LISTENERS];
    size_t num;
    while (pthread_mutex_trylock(&m->dispatch_mutex) == 0) {
        l1_event *batch;
        while ((batch = detach_queue(m, snapshot, &num)) != NULL)
            deliver(batch, snapshot, num);
        pthread_mutex_unlock(&m->dispatch_mutex);
        if (queue_is_empty(m))
            return;
    }
}

static void unlock_and_dispatch(lmc_l1_manager *m)
{
    pthread_mutex_unlock(&m->mutex);
    dispatch_events(m);
}

int lmc_l1_manager_add_listener(lmc_l1_manager *m, lmc_l1_listener_fn fn, void *user)
{
    int rc = -1;
    pthread_mutex_lock(&m->mutex);
    if (fn && m->num_listeners < LMC_L1_MAX_LISTENERS) {
        m->listeners[m->num_listeners++] = (l1_listener){fn, user};
        rc = 0;
    }
    pthread_mutex_unlock(&m->mutex);
    return rc;
}

void lmc_l1_manager_remove_listener(lmc_l1_manager *m, lmc_l1_listener_fn fn, void *user)
{
    pthread_mutex_lock(&m->mutex);
    for (size_t i = 0; i < m->num_listeners; i++) {
        if (m->listeners[i].fn == fn && m->listeners[i].user == user) {
            memmove(&m->listeners[i], &m->listeners[i + 1],
                    (m->num_listeners - i - 1) * sizeof(m->listeners[0]));
            m->num_listeners--;
            break;
        }
    }
    pthread_mutex_unlock(&m->mutex);
}

/* ---- entries ----------------------------------------------------------- */

static int64_t now_ms(const lmc_l1_manager *m)
{
    return m->clock(m->clock_user);
}

static l1_entry *find_entry(lmc_l1_manager *m, const lmc_object_key *key)
{
    return lmc_key_table_find(&m->entries, key);
}

static l1_entry *find_or_create_entry(lmc_l1_manager *m, const lmc_object_key *key)
{
    l1_entry *e = find_entry(m, key);
    if (e)
        return e;
    e = calloc(1, sizeof(*e));
    if (!e)
        return NULL;
    e->key = *key;
    if (lmc_key_table_insert(&m->entries, e) != 0) {
        free(e);
        return NULL;
    }
    return e;
}

/* Removes the entry from the table once it holds nothing.  Returns true if
 * it was dropped. */
static bool drop_entry_if_empty(lmc_l1_manager *m, l1_entry *e)
{
    if (e->resident || e->num_staging > 0)
        return false;
    lmc_key_table_remove(&m->entries, &e->key);
    free(e->staging);
    free(e);
    return true;
}

static l1_staging *find_staging(l1_entry *e, const char *tag)
{
    for (uint32_t i = 0; e && i < e->num_staging; i++)
        if (strcmp(e->staging[i].tag, tag) == 0)
            return &e->staging[i];
    return NULL;
}

static bool has_live_staging(const l1_entry *e, int64_t now)
{
    for (uint32_t i = 0; i < e->num_staging; i++)
        if (lmc_ttl_lock_held(&e->staging[i].rec.lock, now))
            return true;
    return false;
}

static int add_staging(lmc_l1_manager *m, l1_entry *e, const char *tag, const l1_record *rec)
{
    if (e->num_staging == e->cap_staging) {
        uint32_t cap = e->cap_staging ? e->cap_staging * 2 : 1;
        l1_staging *grown = realloc(e->staging, cap * sizeof(*grown));
        if (!grown)
            return -1;
        e->staging = grown;
        e->cap_staging = cap;
    }
    char *tag_copy = strdup(tag);
    if (!tag_copy)
        return -1;
    e->staging[e->num_staging++] = (l1_staging){tag_copy, *rec};
    m->num_staging++;
    m->staging_bytes += rec->size;
    return 0;
}

/* Unlinks staging slot `s` of `e` and returns its record; the buffer is
 * still allocated (the caller admits or frees it). */
static l1_record take_staging(lmc_l1_manager *m, l1_entry *e, l1_staging *s)
{
    l1_record rec = s->rec;
    free(s->tag);
    *s = e->staging[--e->num_staging];
    m->num_staging--;
    m->staging_bytes -= rec.size;
    return rec;
}

static void release_now(lmc_l1_manager *m, uint64_t offset, uint64_t size)
{
    if (lmc_l1_alloc_release(m->alloc, offset, size) != 0)
        LMC_ERROR("L1: releasing [%llu, +%llu) failed; allocator state is inconsistent",
                  (unsigned long long)offset, (unsigned long long)size);
}

static int reserve_deferred(lmc_l1_manager *m, size_t needed)
{
    if (needed <= m->cap_deferred)
        return 0;
    size_t cap = m->cap_deferred ? m->cap_deferred : 64;
    while (cap < needed)
        cap *= 2;
    lmc_l1_range *grown = realloc(m->deferred, cap * sizeof(*grown));
    if (!grown)
        return -1;
    m->deferred = grown;
    m->cap_deferred = cap;
    return 0;
}

static void free_buffer(lmc_l1_manager *m, const l1_record *rec)
{
    if (m->deferring_frees && reserve_deferred(m, m->num_deferred + 1) == 0) {
        m->deferred[m->num_deferred++] = (lmc_l1_range){rec->offset, rec->size};
        return;
    }
    release_now(m, rec->offset, rec->size);
}

static void begin_deferred_frees(lmc_l1_manager *m, size_t expected)
{
    reserve_deferred(m, expected);   /* best effort; free_buffer copes */
    m->deferring_frees = true;
    m->num_deferred = 0;
}

static void end_deferred_frees(lmc_l1_manager *m)
{
    m->deferring_frees = false;
    if (lmc_l1_alloc_release_batch(m->alloc, m->deferred, m->num_deferred) != 0) {
        LMC_ERROR("L1: batched release of %zu ranges failed; releasing one by one",
                  m->num_deferred);
        for (size_t i = 0; i < m->num_deferred; i++)
            release_now(m, m->deferred[i].offset, m->deferred[i].size);
    }
    m->num_deferred = 0;
}

/* ---- retired buffers (l1_retired) -------------------------------------- */

/* Keeps `rec` allocated for its holder; frees it at once (the behaviour
 * without retirement) only if the list cannot grow. */
static void retire(lmc_l1_manager *m, const lmc_object_key *key, const char *tag,
                   const l1_record *rec)
{
    if (m->num_retired == m->cap_retired) {
        size_t cap = m->cap_retired ? m->cap_retired * 2 : 16;
        l1_retired *grown = realloc(m->retired, cap * sizeof(*grown));
        if (!grown)
            goto no_memory;
        m->retired = grown;
        m->cap_retired = cap;
    }
    char *tag_copy = NULL;
    if (tag && !(tag_copy = strdup(tag)))
        goto no_memory;
    if (m->num_retired == 0 || rec->lock.expiry_ms < m->retired_due_ms)
        m->retired_due_ms = rec->lock.expiry_ms;
    m->retired[m->num_retired++] = (l1_retired){*key, tag_copy, *rec};
    m->retired_bytes += rec->size;
    return;
no_memory:
    LMC_WARN("L1: out of memory; freeing a buffer that is still in use");
    free_buffer(m, rec);
}

static void free_retired(lmc_l1_manager *m, size_t i)
{
    l1_retired *r = &m->retired[i];
    free_buffer(m, &r->rec);
    m->retired_bytes -= r->rec.size;
    free(r->tag);
    *r = m->retired[--m->num_retired];
}

/* The retired staging buffer of `key` that writer `tag` still fills. */
static ssize_t find_retired_write(const lmc_l1_manager *m, const lmc_object_key *key,
                                  const char *tag)
{
    for (size_t i = 0; i < m->num_retired; i++) {
        const l1_retired *r = &m->retired[i];
        if (r->tag && strcmp(r->tag, tag) == 0 && lmc_object_key_equal(&r->key, key))
            return (ssize_t)i;
    }
    return -1;
}

/* The retired resident copy of `key` at `offset` that readers still copy
 * out of.  The offset tells it from a newer copy of the same key. */
static ssize_t find_retired_copy(const lmc_l1_manager *m, const lmc_object_key *key,
                                 uint64_t offset)
{
    for (size_t i = 0; i < m->num_retired; i++) {
        const l1_retired *r = &m->retired[i];
        if (!r->tag && r->rec.offset == offset && lmc_object_key_equal(&r->key, key))
            return (ssize_t)i;
    }
    return -1;
}

/* Frees retired buffers whose holders' locks expired (they will not come
 * back, or came back too late, as for any expired lock). */
static void sweep_retired(lmc_l1_manager *m, int64_t now)
{
    if (now < m->retired_due_ms)
        return;   /* nothing can have expired yet: the common case stays O(1) */
    int64_t due = INT64_MAX;
    for (size_t i = 0; i < m->num_retired;) {
        const lmc_ttl_lock *lock = &m->retired[i].rec.lock;
        if (lmc_ttl_lock_held(lock, now)) {
            if (lock->expiry_ms < due)
                due = lock->expiry_ms;
            i++;
        } else {
            free_retired(m, i);
        }
    }
    m->retired_due_ms = due;
}

/* Frees staging buffers: only the expired ones unless `all`, which retires
 * live ones instead.  Returns how many were dropped. */
static size_t reclaim_staging(lmc_l1_manager *m, l1_entry *e, int64_t now, bool all)
{
    size_t freed = 0;
    for (uint32_t i = 0; i < e->num_staging;) {
        l1_staging *s = &e->staging[i];
        bool live = lmc_ttl_lock_held(&s->rec.lock, now);
        if (all || !live) {
            if (live)
                retire(m, &e->key, s->tag, &s->rec);
            l1_record rec = take_staging(m, e, s);
            if (!live)
                free_buffer(m, &rec);
            freed++;
        } else {
            i++;
        }
    }
    return freed;
}

/* Makes `rec` the resident copy.  If the key is already resident the new
 * buffer is freed instead and false is returned. */
static bool admit(lmc_l1_manager *m, l1_entry *e, const l1_record *rec, int64_t now)
{
    if (e->resident) {
        free_buffer(m, rec);
        return false;
    }
    e->resident = true;
    e->object = *rec;
    e->object.lock = (lmc_ttl_lock){0, 0};
    e->object.sampled = m->sampler && m->sampler(&e->key, m->sampler_user);
    e->object.admitted_ms = e->object.touched_ms = now;
    e->object.copy = ++m->last_copy;
    m->num_objects++;
    m->object_bytes += rec->size;
    if (rec->is_temporary)
        m->num_temporary++;
    return true;
}

/* Unlinks the resident copy; retires its buffer while copies out of it are
 * in flight and its read lock's TTL has not run out, however the copy came
 * to be dropped (forced clear, the last share of a temporary released, or
 * evicted after a FREE_LOOKUP_LOCKS took its shares away). */
static void free_resident(lmc_l1_manager *m, l1_entry *e, int64_t now)
{
    if (e->object.pins > 0 && !lmc_ttl_lock_expired(&e->object.lock, now)) {
        l1_record rec = e->object;
        rec.lock.count = rec.pins;
        retire(m, &e->key, NULL, &rec);
    } else {
        free_buffer(m, &e->object);
    }
    m->num_objects--;
    m->object_bytes -= e->object.size;
    if (e->object.is_temporary)
        m->num_temporary--;
    e->resident = false;
}

/* ---- lifecycle --------------------------------------------------------- */

lmc_l1_manager *lmc_l1_manager_new(const lmc_l1_manager_options *opts)
{
    uint64_t align = opts->align_bytes;
    if (align == 0 || (align & (align - 1)) != 0 || opts->configured_bytes < align)
        return NULL;
    lmc_l1_manager *m = calloc(1, sizeof(*m));
    if (!m)
        return NULL;
    m->configured_bytes = opts->configured_bytes & ~(align - 1);
    uint64_t committed = opts->committed_bytes < m->configured_bytes ? opts->committed_bytes
                                                                     : m->configured_bytes;
    m->alloc = lmc_l1_alloc_new(align, committed);
    if (!m->alloc || lmc_key_table_init(&m->entries, offsetof(l1_entry, key), 1024) != 0)
        goto fail;
    m->write_ttl_ms = opts->write_ttl_ms;
    m->read_ttl_ms = opts->read_ttl_ms;
    m->clock = opts->clock ? opts->clock : lmc_monotonic_ms;
    m->clock_user = opts->clock_user;
    snprintf(m->backend, sizeof(m->backend), "%s", opts->backend ? opts->backend : "dram");
    pthread_mutex_init(&m->mutex, NULL);
    pthread_mutex_init(&m->dispatch_mutex, NULL);
    return m;
fail:
    lmc_l1_alloc_destroy(m->alloc);
    free(m);
    return NULL;
}

void lmc_l1_manager_free(lmc_l1_manager *m)
{
    if (!m)
        return;
    for (size_t i = 0; i < m->entries.capacity; i++) {
        l1_entry *e = lmc_key_table_slot_item(&m->entries, i);
        if (!e)
            continue;
        for (uint32_t s = 0; s < e->num_staging; s++)
            free(e->staging[s].tag);
        free(e->staging);
        free(e);
    }
    lmc_key_table_destroy(&m->entries);
    for (size_t i = 0; i < m->num_retired; i++)
        free(m->retired[i].tag);
    free(m->retired);
    for (l1_event *ev = m->queue_head, *next; ev; ev = next) {
        next = ev->next;
        free(ev);
    }
    lmc_l1_alloc_destroy(m->alloc);
    free(m->deferred);
    pthread_mutex_destroy(&m->dispatch_mutex);
    pthread_mutex_destroy(&m->mutex);
    free(m);
}

uint64_t lmc_l1_manager_aligned_size(const lmc_l1_manager *m, uint64_t raw)
{
    return lmc_l1_alloc_aligned_size(m->alloc, raw);
}

/* ---- write path -------------------------------------------------------- */

static uint32_t clamp_readers(uint32_t readers)
{
    return readers < 1 ? 1 : readers > LMC_L1_MAX_READERS ? LMC_L1_MAX_READERS : readers;
}

/* First pass of reserve_write for one key.  Returns the final result, or
 * OUT_OF_MEMORY as "needs a buffer from the batched allocation". */
static lmc_l1_result classify_for_write(lmc_l1_manager *m, const lmc_object_key *key,
                                        bool is_temporary, uint64_t unit, uint64_t raw,
                                        const char *tag, int64_t now, uint64_t *offset)
{
    l1_entry *e = find_entry(m, key);
    if (e && e->resident)
        return LMC_L1_KEY_NOT_WRITABLE;
    l1_staging *s = find_staging(e, tag);
    /* A forced clear retired this writer's earlier buffer of the key while
     * it was written; a second one would make its finish ambiguous. */
    if (!s && m->num_retired > 0 && find_retired_write(m, key, tag) >= 0)
        return LMC_L1_KEY_IN_WRONG_STATE;
    if (!s)
        return LMC_L1_OUT_OF_MEMORY;
    if (lmc_ttl_lock_held(&s->rec.lock, now))
        return LMC_L1_KEY_NOT_WRITABLE;
    if (s->rec.size != unit)
        return LMC_L1_OUT_OF_MEMORY;   /* different size: replaced in pass 3 */
    LMC_WARN("L1: writer '%s' takes over its expired staging buffer at offset %llu", tag,
             (unsigned long long)s->rec.offset);
    lmc_ttl_lock_acquire(&s->rec.lock, 1, now, m->write_ttl_ms);
    s->rec.is_temporary = is_temporary;
    s->rec.raw_size = raw;
    *offset = s->rec.offset;
    return LMC_L1_SUCCESS;
}

/* Third pass: stage the freshly allocated buffer for one key.  A duplicate
 * key of the same batch finds a live reservation and gets NOT_WRITABLE. */
static lmc_l1_result stage_new_buffer(lmc_l1_manager *m, const lmc_object_key *key,
                                      const l1_record *rec, const char *tag, int64_t now)
{
    l1_entry *e = find_or_create_entry(m, key);
    if (!e) {
        free_buffer(m, rec);
        return LMC_L1_OUT_OF_MEMORY;
    }
    l1_staging *s = find_staging(e, tag);
    if (s && lmc_ttl_lock_held(&s->rec.lock, now)) {
        free_buffer(m, rec);
        return LMC_L1_KEY_NOT_WRITABLE;
    }
    if (s) {   /* expired, other size: replace its buffer */
        LMC_WARN("L1: writer '%s' replaces its expired staging buffer", tag);
        l1_record old = take_staging(m, e, s);
        free_buffer(m, &old);
    }
    if (add_staging(m, e, tag, rec) != 0) {
        free_buffer(m, rec);
        drop_entry_if_empty(m, e);
        return LMC_L1_OUT_OF_MEMORY;
    }
    return LMC_L1_SUCCESS;
}

static void stage_batch(lmc_l1_manager *m, const lmc_object_key *keys, const bool *is_temporary,
                        size_t n, const uint64_t *units, uint64_t unit, uint64_t raw,
                        const char *tag, int64_t now, uint64_t *offsets,
                        lmc_l1_result *results)
{
    size_t next_unit = 0;
    for (size_t i = 0; i < n; i++) {
        if (results[i] != LMC_L1_OUT_OF_MEMORY)
            continue;
        l1_record rec = {.offset = units[next_unit++], .size = unit, .raw_size = raw,
                         .is_temporary = is_temporary && is_temporary[i]};
        lmc_ttl_lock_acquire(&rec.lock, 1, now, m->write_ttl_ms);
        results[i] = stage_new_buffer(m, &keys[i], &rec, tag, now);
        if (results[i] == LMC_L1_SUCCESS)
            offsets[i] = rec.offset;
    }
}

int lmc_l1_manager_reserve_write(lmc_l1_manager *m, const lmc_object_key *keys,
                                 const bool *is_temporary, size_t n, uint64_t object_size,
                                 const char *tag, uint64_t *offsets, lmc_l1_result *results)
{
    uint64_t unit = lmc_l1_alloc_aligned_size(m->alloc, object_size);
    if (unit == 0 || !tag)
        return -1;
    uint64_t *units = malloc((n ? n : 1) * sizeof(*units));
    if (!units)
        return -1;
    pthread_mutex_lock(&m->mutex);
    int64_t now = now_ms(m);
    if (m->num_retired > 0)
        sweep_retired(m, now);
    size_t needed = 0;
    for (size_t i = 0; i < n; i++) {
        bool temp = is_temporary && is_temporary[i];
        results[i] = classify_for_write(m, &keys[i], temp, unit, object_size, tag, now,
                                        &offsets[i]);
        needed += results[i] == LMC_L1_OUT_OF_MEMORY;
    }
    uint64_t got_unit;
    if (needed > 0 && lmc_l1_alloc_batch(m->alloc, object_size, needed, units, &got_unit) == 0)
        stage_batch(m, keys, is_temporary, n, units, unit, object_size, tag, now, offsets,
                    results);
    l1_event *ev = event_begin(m, LMC_L1_EVENT_WRITE_RESERVED, n);
    for (size_t i = 0; i < n; i++)
        if (results[i] == LMC_L1_SUCCESS)
            event_add(ev, &keys[i]);
    event_commit(m, ev);
    unlock_and_dispatch(m);
    free(units);
    return 0;
}

/* Unlinks the tag's staging record for finishing.  NOT_EXIST without one,
 * WRONG_STATE (entry left in place) when its write lock expired. */
static lmc_l1_result pop_live_staging(lmc_l1_manager *m, const lmc_object_key *key,
                                      const char *tag, int64_t now, l1_entry **entry,
                                      l1_record *rec)
{
    l1_entry *e = find_entry(m, key);
    l1_staging *s = find_staging(e, tag);
    if (!s) {
        ssize_t r = m->num_retired ? find_retired_write(m, key, tag) : -1;
        if (r >= 0)
            free_retired(m, (size_t)r);   /* cleared while written: the write is void */
        return LMC_L1_KEY_NOT_EXIST;
    }
    if (!lmc_ttl_lock_held(&s->rec.lock, now))
        return LMC_L1_KEY_IN_WRONG_STATE;
    *rec = take_staging(m, e, s);
    *entry = e;
    return LMC_L1_SUCCESS;
}

typedef enum { FINISH_ADMIT, FINISH_ADMIT_AND_READ, FINISH_DISCARD } finish_mode;

/* Applies one finish_* to one key; returns true if the key belongs in the
 * call's event. */
static bool finish_one(lmc_l1_manager *m, const lmc_object_key *key, const char *tag,
                       finish_mode mode, uint32_t readers, int64_t now, lmc_l1_result *result,
                       lmc_l1_copy_id *copy)
{
    l1_entry *e;
    l1_record rec;
    *result = pop_live_staging(m, key, tag, now, &e, &rec);
    if (*result != LMC_L1_SUCCESS)
        return false;
    if (mode == FINISH_DISCARD) {
        free_buffer(m, &rec);
        return drop_entry_if_empty(m, e);
    }
    bool newly_admitted = admit(m, e, &rec, now);
    if (mode == FINISH_ADMIT)
        return newly_admitted && !rec.is_temporary;
    lmc_ttl_lock_acquire(&e->object.lock, readers, now, m->read_ttl_ms);
    if (copy)   /* the copy now locked: the one admitted, or an earlier one */
        *copy = e->object.copy;
    return true;
}

static const lmc_l1_event_kind finish_event_kind[] = {
    [FINISH_ADMIT] = LMC_L1_EVENT_WRITE_FINISHED,
    [FINISH_ADMIT_AND_READ] = LMC_L1_EVENT_WRITE_FINISHED_READ_RESERVED,
    [FINISH_DISCARD] = LMC_L1_EVENT_DELETED,
};

static int finish_batch(lmc_l1_manager *m, const lmc_object_key *keys, size_t n,
                        const char *tag, finish_mode mode, uint32_t readers,
                        lmc_l1_result *results, lmc_l1_copy_id *copies)
{
    if (!tag)
        return -1;
    pthread_mutex_lock(&m->mutex);
    int64_t now = now_ms(m);
    l1_event *ev = event_begin(m, finish_event_kind[mode], n);
    for (size_t i = 0; i < n; i++)
        if (finish_one(m, &keys[i], tag, mode, readers, now, &results[i],
                       copies ? &copies[i] : NULL))
            event_add(ev, &keys[i]);
    event_commit(m, ev);
    unlock_and_dispatch(m);
    return 0;
}

int lmc_l1_manager_finish_write(lmc_l1_manager *m, const lmc_object_key *keys, size_t n,
                                const char *tag, lmc_l1_result *results)
{
    return finish_batch(m, keys, n, tag, FINISH_ADMIT, 0, results, NULL);
}

int lmc_l1_manager_finish_write_and_reserve_read(lmc_l1_manager *m, const lmc_object_key *keys,
                                                 size_t n, uint32_t readers, const char *tag,
                                                 lmc_l1_result *results, lmc_l1_copy_id *copies)
{
    return finish_batch(m, keys, n, tag, FINISH_ADMIT_AND_READ, clamp_readers(readers),
                        results, copies);
}

int lmc_l1_manager_finish_write_and_delete(lmc_l1_manager *m, const lmc_object_key *keys,
                                           size_t n, const char *tag, lmc_l1_result *results)
{
    return finish_batch(m, keys, n, tag, FINISH_DISCARD, 0, results, NULL);
}

/* ---- read path --------------------------------------------------------- */

/* Under the mutex: a read or touch of a resident object.  Sampled objects
 * leave the gap since their previous touch for take_reuse_gaps; when the
 * buffer is full the gap is dropped (it is a sample anyway). */
static void note_touch(lmc_l1_manager *m, l1_entry *e, int64_t now)
{
    if (e->object.sampled && m->num_reuse_gaps < LMC_L1_REUSE_GAPS_MAX)
        m->reuse_gaps_s[m->num_reuse_gaps++] = (double)(now - e->object.touched_ms) / 1000.0;
    e->object.touched_ms = now;
}

int lmc_l1_manager_reserve_read(lmc_l1_manager *m, const lmc_object_key *keys, size_t n,
                                uint32_t readers, lmc_l1_result *results)
{
    readers = clamp_readers(readers);
    pthread_mutex_lock(&m->mutex);
    int64_t now = now_ms(m);
    l1_event *ev = event_begin(m, LMC_L1_EVENT_READ_RESERVED, n);
    for (size_t i = 0; i < n; i++) {
        l1_entry *e = find_entry(m, &keys[i]);
        results[i] = e && e->resident ? LMC_L1_SUCCESS : LMC_L1_KEY_NOT_EXIST;
        if (results[i] == LMC_L1_SUCCESS) {
            lmc_ttl_lock_acquire(&e->object.lock, readers, now, m->read_ttl_ms);
            note_touch(m, e, now);
            event_add(ev, &keys[i]);
        }
    }
    event_commit(m, ev);
    unlock_and_dispatch(m);
    return 0;
}

size_t lmc_l1_manager_reserve_read_prefix(lmc_l1_manager *m, const lmc_object_key *keys,
                                          size_t n, uint32_t readers, lmc_l1_copy_id *copies)
{
    readers = clamp_readers(readers);
    pthread_mutex_lock(&m->mutex);
    int64_t now = now_ms(m);
    l1_event *ev = event_begin(m, LMC_L1_EVENT_READ_RESERVED, n);
    size_t hits = 0;
    for (; hits < n; hits++) {
        l1_entry *e = find_entry(m, &keys[hits]);
        if (!e || !e->resident)
            break;
        lmc_ttl_lock_acquire(&e->object.lock, readers, now, m->read_ttl_ms);
        note_touch(m, e, now);
        event_add(ev, &keys[hits]);
        if (copies)
            copies[hits] = e->object.copy;
    }
    event_commit(m, ev);
    unlock_and_dispatch(m);
    return hits;
}

int lmc_l1_manager_unsafe_read(lmc_l1_manager *m, const lmc_object_key *keys, size_t n,
                               lmc_l1_range *ranges, lmc_l1_result *results)
{
    pthread_mutex_lock(&m->mutex);
    int64_t now = now_ms(m);
    for (size_t i = 0; i < n; i++) {
        l1_entry *e = find_entry(m, &keys[i]);
        if (!e || !e->resident) {
            results[i] = LMC_L1_KEY_NOT_EXIST;
        } else if (!lmc_ttl_lock_held(&e->object.lock, now)) {
            results[i] = LMC_L1_KEY_NOT_READABLE;
        } else {
            results[i] = LMC_L1_SUCCESS;
            ranges[i] = (lmc_l1_range){e->object.offset, e->object.size};
            e->object.pins++;
        }
    }
    pthread_mutex_unlock(&m->mutex);
    return 0;
}

/* One copy out of a retired copy is done; the last frees the buffer. */
static void unpin_retired(lmc_l1_manager *m, const lmc_object_key *key, uint64_t offset,
                          int64_t now)
{
    ssize_t r = m->num_retired ? find_retired_copy(m, key, offset) : -1;
    if (r < 0)
        return;
    lmc_ttl_lock *lock = &m->retired[r].rec.lock;
    if (lmc_ttl_lock_held(lock, now))
        lmc_ttl_lock_release(lock, 1, now);
    if (!lmc_ttl_lock_held(lock, now))
        free_retired(m, (size_t)r);
}

/* Which copy of a key a release is for: any resident one, the one at a
 * range a read handed out, or the one with a copy id. */
typedef struct {
    const lmc_l1_range *range;
    lmc_l1_copy_id copy;
} copy_ref;

static bool is_that_copy(const l1_entry *e, copy_ref which)
{
    return e && e->resident && (!which.range || e->object.offset == which.range->offset) &&
           (!which.copy || e->object.copy == which.copy);
}

/* Ends one copy out of `range`: unpins the resident copy if it is the one
 * at `range` (and returns its entry), else the retired copy there. */
static l1_entry *unpin_one(lmc_l1_manager *m, const lmc_object_key *key,
                           const lmc_l1_range *range, int64_t now)
{
    l1_entry *e = find_entry(m, key);
    if (is_that_copy(e, (copy_ref){range, 0})) {
        if (e->object.pins > 0)
            e->object.pins--;
        return e;
    }
    unpin_retired(m, key, range->offset, now);
    return NULL;
}

void lmc_l1_manager_unpin(lmc_l1_manager *m, const lmc_object_key *keys,
                          const lmc_l1_range *ranges, size_t n)
{
    pthread_mutex_lock(&m->mutex);
    int64_t now = now_ms(m);
    for (size_t i = 0; i < n; i++)
        unpin_one(m, &keys[i], &ranges[i], now);
    pthread_mutex_unlock(&m->mutex);
}

/* Returns true if the object was temporary and got freed. */
static bool finish_read_one(lmc_l1_manager *m, l1_entry *e, uint32_t readers, int64_t now)
{
    lmc_ttl_lock_release(&e->object.lock, readers, now);
    if (e->object.lock.count > 0 || !e->object.is_temporary)
        return false;
    free_resident(m, e, now);
    drop_entry_if_empty(m, e);
    return true;
}

void lmc_l1_manager_object_sizes(lmc_l1_manager *m, const lmc_object_key *keys, size_t n,
                                 uint64_t *sizes)
{
    pthread_mutex_lock(&m->mutex);
    for (size_t i = 0; i < n; i++) {
        l1_entry *e = find_entry(m, &keys[i]);
        sizes[i] = e && e->resident ? e->object.raw_size : 0;
    }
    pthread_mutex_unlock(&m->mutex);
}

/* Gives back `readers` shares of `key` on the copy `which` names
 * (NOT_EXIST if that copy is gone); `unpin` first ends the copy out of
 * which.range (end_read). */
static lmc_l1_result release_read(lmc_l1_manager *m, const lmc_object_key *key,
                                  copy_ref which, uint32_t readers, bool unpin,
                                  int64_t now, l1_event *done, l1_event *freed)
{
    /* Unpin first: a temporary's last share then frees it outright. */
    l1_entry *e = unpin ? unpin_one(m, key, which.range, now) : find_entry(m, key);
    if (!is_that_copy(e, which))
        return LMC_L1_KEY_NOT_EXIST;
    if (!lmc_ttl_lock_held(&e->object.lock, now))
        return LMC_L1_KEY_IN_WRONG_STATE;
    event_add(done, key);
    if (finish_read_one(m, e, readers, now))
        event_add(freed, key);
    return LMC_L1_SUCCESS;
}

/* ranges or copies (or neither) name the copy of each key. */
static void release_reads(lmc_l1_manager *m, const lmc_object_key *keys,
                          const lmc_l1_range *ranges, const lmc_l1_copy_id *copies, size_t n,
                          uint32_t readers, bool unpin, lmc_l1_result *results)
{
    pthread_mutex_lock(&m->mutex);
    int64_t now = now_ms(m);
    l1_event *done = event_begin(m, LMC_L1_EVENT_READ_FINISHED, n);
    l1_event *freed = event_begin(m, LMC_L1_EVENT_DELETED, n);
    for (size_t i = 0; i < n; i++) {
        copy_ref which = {ranges ? &ranges[i] : NULL, copies ? copies[i] : 0};
        lmc_l1_result r = copies && !copies[i]
                              ? LMC_L1_KEY_NOT_EXIST /* no copy was locked */
                              : release_read(m, &keys[i], which, readers < 1 ? 1 : readers,
                                             unpin, now, done, freed);
        if (results)
            results[i] = r;
    }
    event_commit(m, done);
    event_commit(m, freed);
    unlock_and_dispatch(m);
}

int lmc_l1_manager_finish_read(lmc_l1_manager *m, const lmc_object_key *keys,
                               const lmc_l1_range *ranges, size_t n, uint32_t readers,
                               lmc_l1_result *results)
{
    release_reads(m, keys, ranges, NULL, n, readers, false, results);
    return 0;
}

int lmc_l1_manager_finish_read_copies(lmc_l1_manager *m, const lmc_object_key *keys,
                                      const lmc_l1_copy_id *copies, size_t n, uint32_t readers,
                                      lmc_l1_result *results)
{
    release_reads(m, keys, NULL, copies, n, readers, false, results);
    return 0;
}

void lmc_l1_manager_end_read(lmc_l1_manager *m, const lmc_object_key *keys,
                             const lmc_l1_range *ranges, size_t n)
{
    release_reads(m, keys, ranges, NULL, n, 1, true, NULL);
}

/* ---- delete / clear ---------------------------------------------------- */

static lmc_l1_result delete_one(lmc_l1_manager *m, const lmc_object_key *key, bool force,
                                int64_t now, lmc_l1_object_age *age)
{
    l1_entry *e = find_entry(m, key);
    if (!e)
        return LMC_L1_KEY_NOT_EXIST;
    size_t freed = reclaim_staging(m, e, now, force);
    if (e->num_staging > 0)
        return LMC_L1_KEY_IS_LOCKED;   /* a live reservation remains */
    if (e->resident) {
        if (!force && lmc_ttl_lock_held(&e->object.lock, now))
            return LMC_L1_KEY_IS_LOCKED;
        if (age)
            *age = (lmc_l1_object_age){e->object.sampled,
                                       (double)(now - e->object.admitted_ms) / 1000.0,
                                       (double)(now - e->object.touched_ms) / 1000.0};
        free_resident(m, e, now);
        freed++;
    }
    drop_entry_if_empty(m, e);
    return freed > 0 ? LMC_L1_SUCCESS : LMC_L1_KEY_NOT_EXIST;
}

int lmc_l1_manager_delete(lmc_l1_manager *m, const lmc_object_key *keys, size_t n, bool force,
                          lmc_l1_result *results)
{
    return lmc_l1_manager_delete_aged(m, keys, n, force, NULL, results);
}

int lmc_l1_manager_delete_aged(lmc_l1_manager *m, const lmc_object_key *keys, size_t n,
                               bool force, lmc_l1_object_age *ages, lmc_l1_result *results)
{
    pthread_mutex_lock(&m->mutex);
    int64_t now = now_ms(m);
    l1_event *ev = event_begin(m, LMC_L1_EVENT_DELETED, n);
    begin_deferred_frees(m, n);
    for (size_t i = 0; i < n; i++) {
        if (ages)
            ages[i] = (lmc_l1_object_age){false, 0, 0};
        results[i] = delete_one(m, &keys[i], force, now, ages ? &ages[i] : NULL);
        if (results[i] == LMC_L1_SUCCESS)
            event_add(ev, &keys[i]);
    }
    end_deferred_frees(m);
    event_commit(m, ev);
    unlock_and_dispatch(m);
    return 0;
}

/* Returns true if the key should be reported as deleted. */
static bool clear_one(lmc_l1_manager *m, l1_entry *e, bool force, int64_t now,
                      lmc_object_key *key_out)
{
    *key_out = e->key;
    bool freed_resident = false;
    reclaim_staging(m, e, now, force);
    if (e->resident && (force || !lmc_ttl_lock_held(&e->object.lock, now))) {
        free_resident(m, e, now);
        freed_resident = true;
    }
    return drop_entry_if_empty(m, e) || freed_resident;
}

long lmc_l1_manager_clear(lmc_l1_manager *m, bool force)
{
    pthread_mutex_lock(&m->mutex);
    if (m->num_retired > 0)
        sweep_retired(m, now_ms(m));
    size_t count = m->entries.count;
    l1_entry **all = malloc((count ? count : 1) * sizeof(*all));
    if (!all) {
        pthread_mutex_unlock(&m->mutex);
        LMC_ERROR("L1: out of memory while clearing %zu keys", count);
        return -1;
    }
    size_t k = 0;
    for (size_t i = 0; i < m->entries.capacity; i++) {
        l1_entry *e = lmc_key_table_slot_item(&m->entries, i);
        if (e)
            all[k++] = e;
    }
    int64_t now = now_ms(m);
    l1_event *ev = event_begin(m, LMC_L1_EVENT_DELETED, count);
    long deleted = 0;
    begin_deferred_frees(m, m->num_objects + m->num_staging);
    for (size_t i = 0; i < k; i++) {
        lmc_object_key key;
        if (clear_one(m, all[i], force, now, &key)) {
            event_add(ev, &key);
            deleted++;
        }
    }
    end_deferred_frees(m);
    event_commit(m, ev);
    unlock_and_dispatch(m);
    free(all);
    return deleted;
}

void lmc_l1_manager_touch(lmc_l1_manager *m, const lmc_object_key *keys, size_t n)
{
    pthread_mutex_lock(&m->mutex);
    int64_t now = now_ms(m);
    l1_event *ev = event_begin(m, LMC_L1_EVENT_ACCESSED, n);
    for (size_t i = 0; i < n; i++) {
        l1_entry *e = find_entry(m, &keys[i]);
        if (e && e->resident)
            note_touch(m, e, now);
        event_add(ev, &keys[i]);
    }
    event_commit(m, ev);
    unlock_and_dispatch(m);
}

lmc_l1_evictability lmc_l1_manager_is_evictable(lmc_l1_manager *m, const lmc_object_key *key)
{
    pthread_mutex_lock(&m->mutex);
    int64_t now = now_ms(m);
    l1_entry *e = find_entry(m, key);
    lmc_l1_evictability verdict = LMC_L1_GONE;
    if (e) {
        bool locked = has_live_staging(e, now) ||
                      (e->resident && lmc_ttl_lock_held(&e->object.lock, now));
        verdict = locked ? LMC_L1_NOT_EVICTABLE : LMC_L1_EVICTABLE;
    }
    pthread_mutex_unlock(&m->mutex);
    return verdict;
}

/* ---- lifecycle sampling ------------------------------------------------ */

void lmc_l1_manager_set_sampler(lmc_l1_manager *m, lmc_l1_sampler_fn fn, void *user)
{
    pthread_mutex_lock(&m->mutex);
    m->sampler = fn;
    m->sampler_user = user;
    pthread_mutex_unlock(&m->mutex);
}

size_t lmc_l1_manager_take_reuse_gaps(lmc_l1_manager *m, double *gaps_s, size_t cap)
{
    pthread_mutex_lock(&m->mutex);
    size_t n = m->num_reuse_gaps < cap ? m->num_reuse_gaps : cap;
    memcpy(gaps_s, m->reuse_gaps_s, n * sizeof *gaps_s);
    memmove(m->reuse_gaps_s, m->reuse_gaps_s + n, (m->num_reuse_gaps - n) * sizeof *gaps_s);
    m->num_reuse_gaps -= n;
    pthread_mutex_unlock(&m->mutex);
    return n;
}

/* ---- capacity and status ----------------------------------------------- */

uint64_t lmc_l1_manager_grow(lmc_l1_manager *m, uint64_t bytes)
{
    pthread_mutex_lock(&m->mutex);
    uint64_t heap = lmc_l1_alloc_heap_size(m->alloc);
    uint64_t room = m->configured_bytes - heap;
    if (bytes > 0)
        heap = lmc_l1_alloc_sbrk(m->alloc, bytes < room ? bytes : room);
    pthread_mutex_unlock(&m->mutex);
    return heap;
}

void lmc_l1_manager_usage(lmc_l1_manager *m, uint64_t *used, uint64_t *total)
{
    pthread_mutex_lock(&m->mutex);
    *total = lmc_l1_alloc_heap_size(m->alloc);
    *used = *total - lmc_l1_alloc_free_size(m->alloc);
    pthread_mutex_unlock(&m->mutex);
}

static size_t count_read_locked(lmc_l1_manager *m, int64_t now)
{
    size_t locked = 0;
    for (size_t i = 0; i < m->entries.capacity; i++) {
        const l1_entry *e = lmc_key_table_slot_item(&m->entries, i);
        locked += e && e->resident && lmc_ttl_lock_held(&e->object.lock, now);
    }
    return locked;
}

void lmc_l1_manager_stats(lmc_l1_manager *m, lmc_l1_stats *out)
{
    pthread_mutex_lock(&m->mutex);
    out->num_objects = m->num_objects;
    out->num_staging = m->num_staging;
    out->num_locked = count_read_locked(m, now_ms(m));
    out->num_temporary = m->num_temporary;
    out->object_bytes = m->object_bytes;
    out->staging_bytes = m->staging_bytes;
    out->num_retired = m->num_retired;
    out->retired_bytes = m->retired_bytes;
    out->committed_bytes = lmc_l1_alloc_heap_size(m->alloc);
    out->used_bytes = out->committed_bytes - lmc_l1_alloc_free_size(m->alloc);
    out->configured_bytes = m->configured_bytes;
    pthread_mutex_unlock(&m->mutex);
}

bool lmc_l1_manager_memcheck(lmc_l1_manager *m)
{
    pthread_mutex_lock(&m->mutex);
    bool ok = lmc_l1_alloc_memcheck(m->alloc) &&
              m->object_bytes + m->staging_bytes + m->retired_bytes ==
                  lmc_l1_alloc_allocated_size(m->alloc);
    pthread_mutex_unlock(&m->mutex);
    if (!ok)
        LMC_ERROR("L1 memcheck failed");
    return ok;
}

static int set_u64(json_t *obj, const char *name, uint64_t value)
{
    return json_object_set_new(obj, name, json_integer((json_int_t)value));
}

json_t *lmc_l1_manager_report_status(lmc_l1_manager *m)
{
    lmc_l1_stats s;
    lmc_l1_manager_stats(m, &s);
    bool healthy = lmc_l1_manager_memcheck(m);
    double ratio = s.committed_bytes ? (double)s.used_bytes / (double)s.committed_bytes : 0.0;
    json_t *by_backend = json_object();
    json_t *st = json_object();
    if (!by_backend || !st)
        goto fail;
    int rc = set_u64(by_backend, m->backend, s.configured_bytes);
    rc |= json_object_set_new(st, "is_healthy", json_boolean(healthy));
    rc |= set_u64(st, "num_objects", s.num_objects);
    rc |= set_u64(st, "num_staging_objects", s.num_staging);
    rc |= set_u64(st, "num_locked_objects", s.num_locked);
    rc |= set_u64(st, "num_temporary_objects", s.num_temporary);
    rc |= set_u64(st, "staging_bytes", s.staging_bytes);
    rc |= set_u64(st, "num_retired_buffers", s.num_retired);
    rc |= set_u64(st, "retired_bytes", s.retired_bytes);
    rc |= set_u64(st, "memory_used_bytes", s.used_bytes);
    rc |= set_u64(st, "memory_total_bytes", s.committed_bytes);
    rc |= set_u64(st, "memory_configured_bytes", s.configured_bytes);
    rc |= json_object_set_new(st, "memory_usage_ratio", json_real(ratio));
    rc |= set_u64(st, "used", s.used_bytes);          /* dashboard bar */
    rc |= set_u64(st, "capacity", s.committed_bytes);
    rc |= json_object_set(st, "capacity_bytes_by_backend", by_backend);
    rc |= set_u64(st, "write_ttl_seconds", (uint64_t)(m->write_ttl_ms / 1000));
    rc |= set_u64(st, "read_ttl_seconds", (uint64_t)(m->read_ttl_ms / 1000));
    if (rc != 0)
        goto fail;
    json_decref(by_backend);
    return st;
fail:
    json_decref(by_backend);
    json_decref(st);
    return NULL;
}
