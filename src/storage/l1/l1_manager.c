/* The L1 manager's state machine (docs/storage.md, "L1 manager" and
 * "Leases"): entries, staging and resident buffers, and the leases that
 * hold them.  Events, buffer release and retirement, sampling and the
 * books live beside it (l1_internal.h lists the files). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "obs/log.h"
#include "storage/l1/l1_internal.h"

/* ---- entries ----------------------------------------------------------- */

/* 136 bytes fill a 144-byte malloc chunk; one byte more takes 160
 * (docs/storage.md, "Metadata per object"). */
_Static_assert(sizeof(l1_entry) <= 136, "l1_entry grew past 136 bytes");

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
    lmc_keys_hold(&e->key, 1);
    return e;
}

/* Removes the entry from the table once it holds nothing.  Returns true if
 * it was dropped. */
static bool drop_entry_if_empty(lmc_l1_manager *m, l1_entry *e)
{
    if (e->object.resident || e->staging)
        return false;
    lmc_key_table_remove(&m->entries, &e->key);
    lmc_keys_drop(&e->key, 1);
    free(e);
    return true;
}

static l1_staging *find_staging(l1_entry *e, const char *tag)
{
    for (l1_staging *s = e ? e->staging : NULL; s; s = s->next)
        if (strcmp(s->tag, tag) == 0)
            return s;
    return NULL;
}

/* The staging buffer a WRITE lease names. */
static l1_staging *find_staging_copy(l1_entry *e, lmc_l1_copy_id copy)
{
    for (l1_staging *s = e ? e->staging : NULL; s; s = s->next)
        if (s->rec.copy == copy)
            return s;
    return NULL;
}

static bool has_live_staging(const l1_entry *e, int64_t now)
{
    for (const l1_staging *s = e->staging; s; s = s->next)
        if (lmc_ttl_lock_held(&s->rec.lock, now))
            return true;
    return false;
}

static int add_staging(lmc_l1_manager *m, l1_entry *e, const char *tag, const l1_record *rec)
{
    l1_staging *s = malloc(sizeof *s);
    char *tag_copy = s ? strdup(tag) : NULL;
    if (!tag_copy) {
        free(s);
        return -1;
    }
    *s = (l1_staging){e->staging, tag_copy, *rec};
    e->staging = s;
    m->num_staging++;
    m->staging_bytes += l1_rec_size(m, rec);
    return 0;
}

/* Unlinks staging buffer `s` of `e` and returns its record; the buffer is
 * still allocated (the caller admits or frees it).  The tag goes with the
 * record unless the caller took it (s->tag = NULL). */
static l1_record take_staging(lmc_l1_manager *m, l1_entry *e, l1_staging *s)
{
    l1_staging **link = &e->staging;
    while (*link != s)
        link = &(*link)->next;
    *link = s->next;
    l1_record rec = s->rec;
    free(s->tag);
    free(s);
    m->num_staging--;
    m->staging_bytes -= l1_rec_size(m, &rec);
    return rec;
}

/* Frees staging buffers: only the expired ones (their WRITE leases lapse)
 * unless `all`, which retires live ones instead.  Returns how many were
 * dropped. */
static size_t reclaim_staging(lmc_l1_manager *m, l1_entry *e, int64_t now, bool all)
{
    size_t freed = 0;
    for (l1_staging *s = e->staging, *next; s; s = next) {
        next = s->next;
        bool live = lmc_ttl_lock_held(&s->rec.lock, now);
        if (!all && live)
            continue;
        if (live) {   /* the retired record takes the tag over */
            lmc_l1_retire(m, &e->key, s->tag, &s->rec);
            s->tag = NULL;
        }
        l1_record rec = take_staging(m, e, s);
        if (!live) {
            m->leases.lapsed[LMC_LEASE_WRITE]++;
            lmc_l1_free_buffer(m, &rec);
        }
        freed++;
    }
    return freed;
}

/* How many buffers of `e` a delete or clear would retire: the resident
 * copy while COPY leases on it are out, and (force) live staging. */
static size_t retirements(const l1_entry *e, bool force, int64_t now)
{
    size_t n = e->object.resident && e->object.pins > 0 &&
               !lmc_ttl_lock_expired(&e->object.lock, now);
    for (const l1_staging *s = force ? e->staging : NULL; s; s = s->next)
        n += lmc_ttl_lock_held(&s->rec.lock, now);
    return n;
}

/* Makes `rec` the resident copy.  If the key is already resident the new
 * buffer is freed instead and false is returned. */
static bool admit(lmc_l1_manager *m, l1_entry *e, const l1_record *rec, int64_t now)
{
    if (e->object.resident) {
        lmc_l1_free_buffer(m, rec);
        return false;
    }
    e->object = *rec;
    e->object.resident = true;
    e->object.lock = (lmc_ttl_lock){0, 0};
    e->object.pins = 0;
    e->object.sampled = m->sampler && m->sampler(&e->key, m->sampler_user);
    e->object.admitted_ms = e->object.touched_ms = now;
    m->num_objects++;
    m->object_bytes += l1_rec_size(m, rec);
    if (rec->is_temporary)
        m->num_temporary++;
    return true;
}

/* Unlinks the resident copy; retires its buffer while COPY leases on it
 * are out and its read lock has not lapsed, however the copy came to be
 * dropped (forced clear, the last share of a temporary given back, or
 * evicted after a FREE_LOOKUP_LOCKS took its shares away). */
static void free_resident(lmc_l1_manager *m, l1_entry *e, int64_t now)
{
    m->total_pins -= e->object.pins;   /* retired with the buffer, or lapsed */
    if (e->object.pins > 0 && !lmc_ttl_lock_expired(&e->object.lock, now)) {
        l1_record rec = e->object;
        rec.lock.count = rec.pins;
        lmc_l1_retire(m, &e->key, NULL, &rec);
    } else {
        m->leases.lapsed[LMC_LEASE_COPY] += e->object.pins;
        lmc_l1_free_buffer(m, &e->object);
    }
    m->num_objects--;
    m->object_bytes -= l1_rec_size(m, &e->object);
    if (e->object.is_temporary)
        m->num_temporary--;
    e->object.resident = false;
}

static lmc_lease lease_on(const lmc_l1_manager *m, const l1_record *rec, lmc_lease_kind kind,
                          uint32_t shares)
{
    return (lmc_lease){.copy = rec->copy, .offset = rec->offset, .size = l1_rec_size(m, rec),
                       .object_size = rec->raw_size, .expiry_ms = rec->lock.expiry_ms,
                       .shares = shares, .kind = (uint8_t)kind};
}

static void grant(lmc_l1_manager *m, lmc_lease *lease, const l1_record *rec,
                  lmc_lease_kind kind, uint32_t shares)
{
    *lease = lease_on(m, rec, kind, shares);
    m->leases.granted[kind]++;
}

/* A call that must tell its listeners and cannot allocate the event
 * changes nothing (l1_events.c says why). */
static bool event_missing(const lmc_l1_manager *m, const l1_event *ev, size_t n)
{
    return !ev && m->num_listeners > 0 && n > 0;
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
    m->check_books = opts->check_books;
    pthread_mutex_init(&m->mutex, NULL);
    pthread_mutex_init(&m->dispatch_mutex, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&m->grown, &ca);
    pthread_condattr_destroy(&ca);
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
        for (l1_staging *s = e->staging, *next; s; s = next) {
            next = s->next;
            free(s->tag);
            free(s);
        }
        lmc_keys_drop(&e->key, 1);
        free(e);
    }
    lmc_key_table_destroy(&m->entries);
    for (size_t i = 0; i < m->num_retired; i++) {
        lmc_keys_drop(&m->retired[i].key, 1);
        free(m->retired[i].tag);
    }
    free(m->retired);
    for (l1_event *ev = m->queue_head, *next; ev; ev = next) {
        next = ev->next;
        lmc_keys_drop(ev->keys, ev->n);
        free(ev);
    }
    lmc_l1_alloc_destroy(m->alloc);
    free(m->deferred);
    pthread_mutex_destroy(&m->dispatch_mutex);
    pthread_cond_destroy(&m->grown);
    pthread_mutex_destroy(&m->mutex);
    free(m);
}

uint64_t lmc_l1_manager_aligned_size(const lmc_l1_manager *m, uint64_t raw)
{
    return lmc_l1_alloc_aligned_size(m->alloc, raw);
}

static uint32_t clamp_readers(uint32_t readers)
{
    return readers < 1 ? 1 : readers > LMC_L1_MAX_READERS ? LMC_L1_MAX_READERS : readers;
}

/* ---- WRITE leases ------------------------------------------------------ */

/* First pass of lease_write for one key.  Returns the final result, or
 * OUT_OF_MEMORY as "needs a buffer from the batched allocation". */
static lmc_l1_result classify_for_write(lmc_l1_manager *m, const lmc_object_key *key,
                                        bool is_temporary, uint64_t unit, uint64_t raw,
                                        const char *tag, int64_t now, lmc_lease *lease)
{
    l1_entry *e = find_entry(m, key);
    if (e && e->object.resident)
        return LMC_L1_KEY_NOT_WRITABLE;
    l1_staging *s = find_staging(e, tag);
    /* A forced clear retired this writer's earlier buffer of the key while
     * it was written; a second one would leave two writes of one writer. */
    if (!s && m->num_retired > 0 && lmc_l1_find_retired_write(m, key, tag) >= 0)
        return LMC_L1_KEY_IN_WRONG_STATE;
    if (!s)
        return LMC_L1_OUT_OF_MEMORY;
    if (lmc_ttl_lock_held(&s->rec.lock, now))
        return LMC_L1_KEY_NOT_WRITABLE;
    if (l1_rec_size(m, &s->rec) != unit)
        return LMC_L1_OUT_OF_MEMORY;   /* different size: replaced in pass 3 */
    LMC_WARN("L1: writer '%s' takes over its expired staging buffer at offset %llu", tag,
             (unsigned long long)s->rec.offset);
    m->leases.lapsed[LMC_LEASE_WRITE]++;   /* the old lease names the old id */
    s->rec.copy = ++m->last_copy;
    lmc_ttl_lock_acquire(&s->rec.lock, 1, now, m->write_ttl_ms);
    s->rec.is_temporary = is_temporary;
    s->rec.raw_size = raw;
    grant(m, lease, &s->rec, LMC_LEASE_WRITE, 0);
    return LMC_L1_SUCCESS;
}

/* Third pass: stage the freshly allocated buffer for one key.  A duplicate
 * key of the same batch finds a live reservation and gets NOT_WRITABLE. */
static lmc_l1_result stage_new_buffer(lmc_l1_manager *m, const lmc_object_key *key,
                                      const l1_record *rec, const char *tag, int64_t now)
{
    l1_entry *e = find_or_create_entry(m, key);
    if (!e) {
        lmc_l1_free_buffer(m, rec);
        return LMC_L1_OUT_OF_MEMORY;
    }
    l1_staging *s = find_staging(e, tag);
    if (s && lmc_ttl_lock_held(&s->rec.lock, now)) {
        lmc_l1_free_buffer(m, rec);
        return LMC_L1_KEY_NOT_WRITABLE;
    }
    if (s) {   /* expired, other size: replace its buffer */
        LMC_WARN("L1: writer '%s' replaces its expired staging buffer", tag);
        l1_record old = take_staging(m, e, s);
        m->leases.lapsed[LMC_LEASE_WRITE]++;
        lmc_l1_free_buffer(m, &old);
    }
    if (add_staging(m, e, tag, rec) != 0) {
        lmc_l1_free_buffer(m, rec);
        drop_entry_if_empty(m, e);
        return LMC_L1_OUT_OF_MEMORY;
    }
    return LMC_L1_SUCCESS;
}

static void stage_batch(lmc_l1_manager *m, const lmc_object_key *keys, const bool *is_temporary,
                        size_t n, const uint64_t *units, uint64_t raw,
                        const char *tag, int64_t now, lmc_lease *leases,
                        lmc_l1_result *results)
{
    size_t next_unit = 0;
    for (size_t i = 0; i < n; i++) {
        if (results[i] != LMC_L1_OUT_OF_MEMORY)
            continue;
        l1_record rec = {.offset = units[next_unit++], .raw_size = raw,
                         .copy = ++m->last_copy,
                         .is_temporary = is_temporary && is_temporary[i]};
        lmc_ttl_lock_acquire(&rec.lock, 1, now, m->write_ttl_ms);
        results[i] = stage_new_buffer(m, &keys[i], &rec, tag, now);
        if (results[i] == LMC_L1_SUCCESS)
            grant(m, &leases[i], &rec, LMC_LEASE_WRITE, 0);
    }
}

int lmc_l1_manager_lease_write(lmc_l1_manager *m, const lmc_object_key *keys,
                               const bool *is_temporary, size_t n, uint64_t object_size,
                               const char *tag, lmc_lease *leases, lmc_l1_result *results)
{
    uint64_t unit = lmc_l1_alloc_aligned_size(m->alloc, object_size);
    if (unit == 0 || !tag)
        return -1;
    uint64_t *units = malloc((n ? n : 1) * sizeof(*units));
    if (!units)
        return -1;
    pthread_mutex_lock(&m->mutex);
    l1_event *ev = lmc_l1_event_begin(m, LMC_L1_EVENT_WRITE_RESERVED, n);
    if (event_missing(m, ev, n)) {
        pthread_mutex_unlock(&m->mutex);
        free(units);
        return -1;
    }
    int64_t now = l1_now(m);
    if (m->num_retired > 0)
        lmc_l1_sweep_retired(m, now);
    size_t needed = 0;
    for (size_t i = 0; i < n; i++) {
        bool temp = is_temporary && is_temporary[i];
        leases[i] = (lmc_lease){0};
        results[i] = classify_for_write(m, &keys[i], temp, unit, object_size, tag, now,
                                        &leases[i]);
        needed += results[i] == LMC_L1_OUT_OF_MEMORY;
    }
    uint64_t got_unit;
    if (needed > 0 && lmc_l1_alloc_batch(m->alloc, object_size, needed, units, &got_unit) == 0)
        stage_batch(m, keys, is_temporary, n, units, object_size, tag, now, leases,
                    results);
    for (size_t i = 0; i < n; i++)
        if (results[i] == LMC_L1_SUCCESS)
            lmc_l1_event_add(m, ev, &keys[i]);
    lmc_l1_event_commit(m, ev);
    lmc_l1_unlock_and_dispatch(m);
    free(units);
    return 0;
}

/* A WRITE lease whose staging buffer is gone: a forced clear retired it
 * (the write is void: its buffer goes now), or it lapsed and was taken.
 * The lease ends as `end`: RETURNED when its holder gave it back, NONE when
 * a publish found it void (it holds nothing; giving it back is no error). */
static void settle_lost_write(lmc_l1_manager *m, const lmc_object_key *key, lmc_lease *lease,
                              lmc_lease_kind end)
{
    ssize_t r = m->num_retired ? lmc_l1_find_retired(m, key, lease->copy, true) : -1;
    if (r >= 0) {
        lmc_l1_free_retired(m, (size_t)r, 0);
        m->leases.returned[LMC_LEASE_WRITE]++;
    } else {
        m->leases.returned_stale++;
    }
    lease->kind = (uint8_t)end;
}

/* Publishes one WRITE lease; returns true if the key belongs in the event. */
static bool publish_one(lmc_l1_manager *m, const lmc_object_key *key, lmc_lease *lease,
                        uint32_t readers, int64_t now, lmc_l1_result *result)
{
    *result = LMC_L1_KEY_NOT_EXIST;
    if (lease->kind != LMC_LEASE_WRITE)
        return false;
    l1_entry *e = find_entry(m, key);
    l1_staging *s = find_staging_copy(e, lease->copy);
    if (!s) {
        settle_lost_write(m, key, lease, LMC_LEASE_NONE);
        return false;
    }
    if (!lmc_ttl_lock_held(&s->rec.lock, now)) {
        *result = LMC_L1_KEY_IN_WRONG_STATE;   /* the holder still gives it back */
        return false;
    }
    l1_record rec = take_staging(m, e, s);
    m->leases.returned[LMC_LEASE_WRITE]++;
    bool newly_admitted = admit(m, e, &rec, now);
    *result = LMC_L1_SUCCESS;
    if (readers == 0) {
        lease->kind = LMC_LEASE_RETURNED;
        return newly_admitted && !rec.is_temporary;
    }
    /* The copy now locked: the one admitted, or an earlier one. */
    lmc_ttl_lock_acquire(&e->object.lock, readers, now, m->read_ttl_ms);
    grant(m, lease, &e->object, LMC_LEASE_READ, readers);
    return true;
}

int lmc_l1_manager_publish_writes(lmc_l1_manager *m, const lmc_object_key *keys,
                                  lmc_lease *leases, size_t n, uint32_t readers,
                                  lmc_l1_result *results)
{
    if (readers > 0)
        readers = clamp_readers(readers);
    pthread_mutex_lock(&m->mutex);
    l1_event *ev = lmc_l1_event_begin(m, readers ? LMC_L1_EVENT_WRITE_FINISHED_READ_RESERVED
                                             : LMC_L1_EVENT_WRITE_FINISHED, n);
    if (event_missing(m, ev, n)) {
        pthread_mutex_unlock(&m->mutex);
        return -1;
    }
    int64_t now = l1_now(m);
    for (size_t i = 0; i < n; i++)
        if (publish_one(m, &keys[i], &leases[i], readers, now, &results[i]))
            lmc_l1_event_add(m, ev, &keys[i]);
    lmc_l1_event_commit(m, ev);
    lmc_l1_unlock_and_dispatch(m);
    return 0;
}

/* ---- READ and COPY leases ---------------------------------------------- */

static size_t fail_all(lmc_lease *leases, lmc_l1_result *results, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        leases[i] = (lmc_lease){0};
        results[i] = LMC_L1_OUT_OF_MEMORY;
    }
    return 0;
}

/* The resident object of key i, if it is of the size its reader expects;
 * otherwise NULL with the result that says why. */
static l1_entry *readable(lmc_l1_manager *m, const lmc_object_key *key, size_t i,
                          const lmc_object_sizes *want, lmc_l1_result *result)
{
    l1_entry *e = find_entry(m, key);
    if (!e || !e->object.resident) {
        *result = LMC_L1_KEY_NOT_EXIST;
        return NULL;
    }
    if (want && e->object.raw_size != lmc_object_size_of(want, i)) {
        m->leases.size_mismatches++;
        *result = LMC_L1_KEY_WRONG_SIZE;
        return NULL;
    }
    *result = LMC_L1_SUCCESS;
    return e;
}

size_t lmc_l1_manager_lease_read(lmc_l1_manager *m, const lmc_object_key *keys, size_t n,
                                 uint32_t readers, bool prefix, const lmc_object_sizes *want,
                                 lmc_lease *leases, lmc_l1_result *results)
{
    readers = clamp_readers(readers);
    pthread_mutex_lock(&m->mutex);
    l1_event *ev = lmc_l1_event_begin(m, LMC_L1_EVENT_READ_RESERVED, n);
    if (event_missing(m, ev, n)) {
        pthread_mutex_unlock(&m->mutex);
        return fail_all(leases, results, n);
    }
    int64_t now = l1_now(m);
    size_t granted = 0;
    bool missed = false;
    for (size_t i = 0; i < n; i++) {
        leases[i] = (lmc_lease){0};
        results[i] = LMC_L1_KEY_NOT_EXIST;
        l1_entry *e = missed ? NULL : readable(m, &keys[i], i, want, &results[i]);
        if (!e) {
            missed = prefix;
            continue;
        }
        lmc_ttl_lock_acquire(&e->object.lock, readers, now, m->read_ttl_ms);
        lmc_l1_note_touch(m, e, now);
        lmc_l1_event_add(m, ev, &keys[i]);
        grant(m, &leases[i], &e->object, LMC_LEASE_READ, readers);
        results[i] = LMC_L1_SUCCESS;
        granted++;
    }
    lmc_l1_event_commit(m, ev);
    lmc_l1_unlock_and_dispatch(m);
    return granted;
}

static lmc_l1_result classify_for_copy(lmc_l1_manager *m, const lmc_object_key *key, size_t i,
                                       lmc_copy_share share, const lmc_object_sizes *want,
                                       int64_t now)
{
    lmc_l1_result r;
    l1_entry *e = readable(m, key, i, want, &r);
    if (!e)
        return r;
    if (share == LMC_COPY_CARRIES_SHARE && !lmc_ttl_lock_held(&e->object.lock, now))
        return LMC_L1_KEY_NOT_READABLE;
    return LMC_L1_SUCCESS;
}

size_t lmc_l1_manager_lease_copy(lmc_l1_manager *m, const lmc_object_key *keys, size_t n,
                                 lmc_copy_share share, bool all_or_none,
                                 const lmc_object_sizes *want, lmc_lease *leases,
                                 lmc_l1_result *results)
{
    bool takes = share == LMC_COPY_TAKES_SHARE;
    pthread_mutex_lock(&m->mutex);
    l1_event *ev = takes ? lmc_l1_event_begin(m, LMC_L1_EVENT_READ_RESERVED, n) : NULL;
    if (takes && event_missing(m, ev, n)) {
        pthread_mutex_unlock(&m->mutex);
        return fail_all(leases, results, n);
    }
    int64_t now = l1_now(m);
    size_t ok = 0;
    for (size_t i = 0; i < n; i++) {
        leases[i] = (lmc_lease){0};
        results[i] = classify_for_copy(m, &keys[i], i, share, want, now);
        ok += results[i] == LMC_L1_SUCCESS;
    }
    if (all_or_none && ok < n)
        ok = 0;
    for (size_t i = 0; ok > 0 && i < n; i++) {
        if (results[i] != LMC_L1_SUCCESS)
            continue;
        l1_entry *e = find_entry(m, &keys[i]);
        if (takes) {
            lmc_ttl_lock_acquire(&e->object.lock, 1, now, m->read_ttl_ms);
            lmc_l1_note_touch(m, e, now);
            lmc_l1_event_add(m, ev, &keys[i]);
        }
        e->object.pins++;
        m->total_pins++;
        grant(m, &leases[i], &e->object, LMC_LEASE_COPY, 1);
    }
    lmc_l1_event_commit(m, ev);
    lmc_l1_unlock_and_dispatch(m);
    return ok;
}

/* ---- giving leases back ------------------------------------------------ */

typedef struct {
    l1_event *read_finished, *deleted;
    int64_t now;
} give_back_ctx;

static void give_back_write(lmc_l1_manager *m, const lmc_object_key *key, lmc_lease *lease,
                            give_back_ctx *g)
{
    l1_entry *e = find_entry(m, key);
    l1_staging *s = find_staging_copy(e, lease->copy);
    if (!s) {
        settle_lost_write(m, key, lease, LMC_LEASE_RETURNED);
        return;
    }
    if (!lmc_ttl_lock_held(&s->rec.lock, g->now))
        m->leases.returned_expired++;
    l1_record rec = take_staging(m, e, s);
    lmc_l1_free_buffer(m, &rec);
    m->leases.returned[LMC_LEASE_WRITE]++;
    if (drop_entry_if_empty(m, e))
        lmc_l1_event_add(m, g->deleted, key);
}

/* A COPY lease on a copy a forced clear retired: the last one frees it. */
static void give_back_retired_copy(lmc_l1_manager *m, const lmc_object_key *key,
                                   const lmc_lease *lease, int64_t now)
{
    ssize_t r = m->num_retired ? lmc_l1_find_retired(m, key, lease->copy, false) : -1;
    if (r < 0) {
        m->leases.returned_stale++;
        return;
    }
    lmc_ttl_lock *lock = &m->retired[r].rec.lock;
    m->leases.returned[LMC_LEASE_COPY]++;
    if (lmc_ttl_lock_held(lock, now)) {
        lmc_ttl_lock_release(lock, 1, now);
        if (lock->count == 0)
            lmc_l1_free_retired(m, (size_t)r, 0);
    } else {   /* lapsed: nobody may copy out of it any more */
        m->leases.returned_expired++;
        lmc_l1_free_retired(m, (size_t)r, lock->count > 0 ? lock->count - 1 : 0);
    }
}

/* READ and COPY leases: unpin (a COPY), then give the shares back on the
 * very copy the lease names; a newer copy of the key is not touched. */
static void give_back_read(lmc_l1_manager *m, const lmc_object_key *key, lmc_lease *lease,
                           give_back_ctx *g)
{
    bool copying = lease->kind == LMC_LEASE_COPY;
    l1_entry *e = find_entry(m, key);
    if (!e || !e->object.resident || e->object.copy != lease->copy) {
        if (copying)
            give_back_retired_copy(m, key, lease, g->now);
        else
            m->leases.returned_stale++;
        return;
    }
    m->leases.returned[lease->kind]++;
    if (copying) {   /* unpin first: a temporary's last share then frees it outright */
        if (e->object.pins > 0) {
            e->object.pins--;
            m->total_pins--;
        }
        else
            lmc_l1_violation(m, key, "a COPY lease came back to a copy with no pins");
    }
    /* Past its own expiry the lease's shares may belong to a lock that
     * lapsed and restarted since (the count is shared): they stay counted
     * until the lock lapses, and no newer holder's share is taken. */
    if (!lmc_ttl_lock_held(&e->object.lock, g->now) || g->now >= lease->expiry_ms) {
        m->leases.returned_expired++;
        return;
    }
    lmc_l1_event_add(m, g->read_finished, key);
    lmc_ttl_lock_release(&e->object.lock, lease->shares, g->now);
    if (e->object.lock.count > 0 || !e->object.is_temporary)
        return;
    /* Without room to retire it for the copies still out, the temporary
     * stays resident and unlocked: eviction takes it later. */
    if (retirements(e, false, g->now) > 0 && lmc_l1_reserve_retired(m, 1) != 0)
        return;
    free_resident(m, e, g->now);
    drop_entry_if_empty(m, e);
    lmc_l1_event_add(m, g->deleted, key);
}

void lmc_l1_manager_give_back(lmc_l1_manager *m, const lmc_object_key *keys, lmc_lease *leases,
                              size_t n)
{
    pthread_mutex_lock(&m->mutex);
    give_back_ctx g = {lmc_l1_event_begin(m, LMC_L1_EVENT_READ_FINISHED, n),
                       lmc_l1_event_begin(m, LMC_L1_EVENT_DELETED, n), l1_now(m)};
    for (size_t i = 0; i < n; i++) {
        lmc_lease *l = &leases[i];
        if (l->kind == LMC_LEASE_RETURNED)
            m->leases.returned_twice++;
        if (!lmc_lease_held(l))
            continue;
        if (l->kind == LMC_LEASE_WRITE)
            give_back_write(m, &keys[i], l, &g);
        else
            give_back_read(m, &keys[i], l, &g);
        l->kind = LMC_LEASE_RETURNED;
    }
    lmc_l1_event_commit(m, g.read_finished);
    lmc_l1_event_commit(m, g.deleted);
    lmc_l1_unlock_and_dispatch(m);
}

/* ---- delete / clear ---------------------------------------------------- */

static lmc_l1_result delete_one(lmc_l1_manager *m, const lmc_object_key *key, bool force,
                                int64_t now, lmc_l1_object_age *age)
{
    l1_entry *e = find_entry(m, key);
    if (!e)
        return LMC_L1_KEY_NOT_EXIST;
    size_t freed = reclaim_staging(m, e, now, force);
    if (e->staging)
        return LMC_L1_KEY_IS_LOCKED;   /* a live reservation remains */
    if (e->object.resident) {
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

/* Whether delete_where leaves key alone: with keep_size, everything but a
 * resident object of another size with no reservation on its key. */
static bool spared(lmc_l1_manager *m, const lmc_object_key *key, uint64_t keep_size)
{
    if (!keep_size)
        return false;
    l1_entry *e = find_entry(m, key);
    return !e || !e->object.resident || e->staging || e->object.raw_size == keep_size;
}

/* Deletes keys[0..n); keep_size != 0 deletes only resident objects of
 * another size (the others' results are NOT_EXIST). */
static int delete_where(lmc_l1_manager *m, const lmc_object_key *keys, size_t n, bool force,
                        lmc_l1_object_age *ages, uint64_t keep_size, lmc_l1_result *results)
{
    pthread_mutex_lock(&m->mutex);
    l1_event *ev = lmc_l1_event_begin(m, LMC_L1_EVENT_DELETED, n);
    if (event_missing(m, ev, n)) {
        pthread_mutex_unlock(&m->mutex);
        return -1;
    }
    int64_t now = l1_now(m);
    size_t retire = 0;
    for (size_t i = 0; i < n; i++) {
        l1_entry *e = spared(m, &keys[i], keep_size) ? NULL : find_entry(m, &keys[i]);
        retire += e ? retirements(e, force, now) : 0;
    }
    if (lmc_l1_reserve_retired(m, retire) != 0) {
        free(ev);
        pthread_mutex_unlock(&m->mutex);
        return -1;
    }
    lmc_l1_begin_deferred_frees(m, n);
    for (size_t i = 0; i < n; i++) {
        if (ages)
            ages[i] = (lmc_l1_object_age){false, 0, 0};
        results[i] = spared(m, &keys[i], keep_size)
                         ? LMC_L1_KEY_NOT_EXIST
                         : delete_one(m, &keys[i], force, now, ages ? &ages[i] : NULL);
        if (results[i] == LMC_L1_SUCCESS)
            lmc_l1_event_add(m, ev, &keys[i]);
    }
    lmc_l1_end_deferred_frees(m);
    lmc_l1_event_commit(m, ev);
    lmc_l1_unlock_and_dispatch(m);
    return 0;
}

int lmc_l1_manager_delete_aged(lmc_l1_manager *m, const lmc_object_key *keys, size_t n,
                               bool force, lmc_l1_object_age *ages, lmc_l1_result *results)
{
    return delete_where(m, keys, n, force, ages, 0, results);
}

int lmc_l1_manager_delete_other_size(lmc_l1_manager *m, const lmc_object_key *keys, size_t n,
                                     uint64_t object_size, lmc_l1_result *results)
{
    return object_size ? delete_where(m, keys, n, false, NULL, object_size, results) : -1;
}

/* Returns true if the key should be reported as deleted. */
static bool clear_one(lmc_l1_manager *m, l1_entry *e, bool force, int64_t now)
{
    bool freed_resident = false;
    reclaim_staging(m, e, now, force);
    if (e->object.resident && (force || !lmc_ttl_lock_held(&e->object.lock, now))) {
        free_resident(m, e, now);
        freed_resident = true;
    }
    return drop_entry_if_empty(m, e) || freed_resident;
}

long lmc_l1_manager_clear(lmc_l1_manager *m, bool force)
{
    pthread_mutex_lock(&m->mutex);
    if (m->num_retired > 0)
        lmc_l1_sweep_retired(m, l1_now(m));
    size_t count = m->entries.count;
    l1_entry **all = malloc((count ? count : 1) * sizeof(*all));
    l1_event *ev = lmc_l1_event_begin(m, LMC_L1_EVENT_DELETED, count);
    if (!all || event_missing(m, ev, count)) {
        free(all);
        free(ev);
        lmc_l1_unlock_and_dispatch(m);
        LMC_ERROR("L1: out of memory while clearing %zu keys", count);
        return -1;
    }
    int64_t now = l1_now(m);
    size_t k = 0, retire = 0;
    for (size_t i = 0; i < m->entries.capacity; i++) {
        l1_entry *e = lmc_key_table_slot_item(&m->entries, i);
        if (e) {
            all[k++] = e;
            retire += retirements(e, force, now);
        }
    }
    if (lmc_l1_reserve_retired(m, retire) != 0) {
        free(all);
        free(ev);
        lmc_l1_unlock_and_dispatch(m);
        LMC_ERROR("L1: out of memory while clearing %zu keys", count);
        return -1;
    }
    long deleted = 0;
    lmc_l1_begin_deferred_frees(m, m->num_objects + m->num_staging);
    for (size_t i = 0; i < k; i++) {
        /* The entry, and its references, may go: the event's copy keeps
         * the names alive, with one of its own until the commit takes the
         * event's (docs/storage.md, "Interned strings"). */
        lmc_object_key key = all[i]->key;
        lmc_keys_hold(&key, 1);
        bool gone = clear_one(m, all[i], force, now);
        if (gone) {
            lmc_l1_event_add(m, ev, &key);
            deleted++;
        }
        if (!gone || !ev)
            lmc_keys_drop(&key, 1);
    }
    lmc_l1_end_deferred_frees(m);
    size_t copies = ev ? ev->n : 0;
    lmc_l1_event_commit(m, ev);
    if (copies) /* queued, not yet delivered: the mutex is still held */
        lmc_keys_drop(ev->keys, copies);
    lmc_l1_unlock_and_dispatch(m);
    free(all);
    return deleted;
}

void lmc_l1_manager_touch(lmc_l1_manager *m, const lmc_object_key *keys, size_t n)
{
    pthread_mutex_lock(&m->mutex);
    int64_t now = l1_now(m);
    l1_event *ev = lmc_l1_event_begin(m, LMC_L1_EVENT_ACCESSED, n);
    for (size_t i = 0; i < n; i++) {
        l1_entry *e = find_entry(m, &keys[i]);
        if (e && e->object.resident)
            lmc_l1_note_touch(m, e, now);
        lmc_l1_event_add(m, ev, &keys[i]);
    }
    lmc_l1_event_commit(m, ev);
    lmc_l1_unlock_and_dispatch(m);
}

void lmc_l1_manager_resident_sizes(lmc_l1_manager *m, const lmc_object_key *keys, size_t n,
                                   uint64_t *sizes)
{
    pthread_mutex_lock(&m->mutex);
    for (size_t i = 0; i < n; i++) {
        const l1_entry *e = find_entry(m, &keys[i]);
        sizes[i] = e && e->object.resident ? e->object.raw_size : 0;
    }
    pthread_mutex_unlock(&m->mutex);
}

lmc_l1_evictability lmc_l1_manager_is_evictable(lmc_l1_manager *m, const lmc_object_key *key)
{
    pthread_mutex_lock(&m->mutex);
    int64_t now = l1_now(m);
    l1_entry *e = find_entry(m, key);
    lmc_l1_evictability verdict = LMC_L1_GONE;
    if (e) {
        bool locked = has_live_staging(e, now) ||
                      (e->object.resident && lmc_ttl_lock_held(&e->object.lock, now));
        verdict = locked ? LMC_L1_NOT_EVICTABLE : LMC_L1_EVICTABLE;
    }
    pthread_mutex_unlock(&m->mutex);
    return verdict;
}

