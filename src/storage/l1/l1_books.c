/* The L1 manager's books: counters, status, and the check that they
 * balance (docs/storage.md, "Invariants").  Debug builds run the check
 * after every mutating call; release builds on each status report, and
 * count what the cheap checks on the data path find. */
#include <errno.h>
#include <time.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "obs/log.h"
#include "core/hex.h"
#include "storage/l1/l1_internal.h"

const char *lmc_l1_result_name(lmc_l1_result r)
{
    static const char *const names[] = {
        "SUCCESS", "KEY_NOT_EXIST", "KEY_NOT_READABLE", "KEY_NOT_WRITABLE",
        "KEY_IN_WRONG_STATE", "KEY_IS_LOCKED", "OUT_OF_MEMORY", "KEY_WRONG_SIZE",
    };
    return (unsigned)r < sizeof(names) / sizeof(names[0]) ? names[r] : "UNKNOWN";
}

const char *lmc_lease_kind_name(lmc_lease_kind kind)
{
    static const char *const names[] = {"none", "write", "read", "copy", "returned"};
    return (unsigned)kind < sizeof(names) / sizeof(names[0]) ? names[kind] : "unknown";
}

void lmc_l1_violation(lmc_l1_manager *m, const lmc_object_key *key, const char *what)
{
    if (!m->violation_logged) {
        char hex[2 * LMC_CHUNK_HASH_MAX + 1] = "";
        if (key)
            lmc_hex_encode(key->chunk_hash, key->chunk_hash_len, hex);
        LMC_ERROR("L1 invariant broken: %s%s%s (logged once; counted in "
                  "lmcache_mp_l1_invariant_violations_total)",
                  what, key ? "; object " : "", hex);
        m->violation_logged = true;
    }
    m->violations++;
}

/* What a walk of every object finds, to hold against the counters. */
typedef struct {
    size_t objects, staging, temporary, empty_entries;
    uint64_t object_bytes, staging_bytes, retired_bytes, pins;
    const l1_entry *bad;       /* an object whose own record is inconsistent */
} l1_walk;

static void walk_entry(const lmc_l1_manager *m, const l1_entry *e, l1_walk *w)
{
    if (!e->object.resident && !e->staging)
        w->empty_entries++;
    if (e->object.resident) {
        w->objects++;
        w->object_bytes += l1_rec_size(m, &e->object);
        w->temporary += e->object.is_temporary;
        w->pins += e->object.pins;
        if (e->object.copy == 0 || e->object.copy > m->last_copy)
            w->bad = e;
    }
    for (const l1_staging *s = e->staging; s; s = s->next) {
        w->staging++;
        w->staging_bytes += l1_rec_size(m, &s->rec);
        if (s->rec.copy == 0 || s->rec.copy > m->last_copy || s->rec.resident)
            w->bad = e;
    }
}

static void walk(const lmc_l1_manager *m, l1_walk *w)
{
    memset(w, 0, sizeof *w);
    for (size_t i = 0; i < m->entries.capacity; i++) {
        const l1_entry *e = lmc_key_table_slot_item(&m->entries, i);
        if (e)
            walk_entry(m, e, w);
    }
    for (size_t i = 0; i < m->num_retired; i++)
        w->retired_bytes += l1_rec_size(m, &m->retired[i].rec);
}

static uint64_t outstanding(const lmc_lease_counts *c, lmc_lease_kind k)
{
    return c->granted[k] - c->returned[k] - c->lapsed[k];
}

/* The rules that need no walk of the objects: the ledger against the
 * counters and the retired list (which is short), the bytes against the
 * allocator's books, and the allocator's own check (its free list). */
static const char *cheap_rule_broken(lmc_l1_manager *m)
{
    size_t retired_writes = 0;
    uint64_t retired_pins = 0;
    for (size_t i = 0; i < m->num_retired; i++) {
        if (m->retired[i].tag)
            retired_writes++;
        else
            retired_pins += m->retired[i].rec.lock.count;
    }
    if (!lmc_l1_alloc_memcheck(m->alloc))
        return "the allocator's free list is inconsistent";
    if (m->object_bytes + m->staging_bytes + m->retired_bytes !=
        lmc_l1_alloc_allocated_size(m->alloc))
        return "resident + staging + retired bytes differ from the allocator's";
    if (outstanding(&m->leases, LMC_LEASE_WRITE) != m->num_staging + retired_writes)
        return "WRITE leases out differ from the staging and retired writes";
    if (outstanding(&m->leases, LMC_LEASE_COPY) != m->total_pins + retired_pins)
        return "COPY leases out differ from the pins on resident and retired copies";
    return NULL;
}

/* Under the mutex.  Names the first rule broken. */
static const char *first_broken_rule(lmc_l1_manager *m, bool full, const lmc_object_key **key)
{
    *key = NULL;
    const char *broken = cheap_rule_broken(m);
    if (broken || !full)
        return broken;
    l1_walk w;
    walk(m, &w);
    *key = w.bad ? &w.bad->key : NULL;
    if (w.bad)
        return "an object's copy id is out of range (or a staging record claims residence)";
    if (w.empty_entries)
        return "an entry holds neither a resident copy nor a staging buffer";
    if (w.objects != m->num_objects || w.object_bytes != m->object_bytes ||
        w.temporary != m->num_temporary)
        return "resident objects do not add up to their counters";
    if (w.staging != m->num_staging || w.staging_bytes != m->staging_bytes)
        return "staging buffers do not add up to their counters";
    if (w.retired_bytes != m->retired_bytes)
        return "retired buffers do not add up to their counter";
    if (w.pins != m->total_pins)
        return "the pins on resident copies do not add up to their counter";
    return NULL;
}

bool lmc_l1_books_balance(lmc_l1_manager *m, bool full)
{
    const lmc_object_key *key;
    const char *broken = first_broken_rule(m, full, &key);
    m->books_checks++;
    if (broken)
        lmc_l1_violation(m, key, broken);
    return broken == NULL;
}

bool lmc_l1_manager_check_books(lmc_l1_manager *m)
{
    pthread_mutex_lock(&m->mutex);
    bool ok = lmc_l1_books_balance(m, true);
    pthread_mutex_unlock(&m->mutex);
    return ok;
}

uint64_t lmc_l1_manager_invariant_violations(lmc_l1_manager *m)
{
    pthread_mutex_lock(&m->mutex);
    uint64_t v = m->violations;
    pthread_mutex_unlock(&m->mutex);
    return v;
}

void lmc_l1_manager_lease_counts(lmc_l1_manager *m, lmc_lease_counts *out)
{
    pthread_mutex_lock(&m->mutex);
    *out = m->leases;
    pthread_mutex_unlock(&m->mutex);
}

uint64_t lmc_l1_manager_grow(lmc_l1_manager *m, uint64_t bytes)
{
    pthread_mutex_lock(&m->mutex);
    uint64_t heap = lmc_l1_alloc_heap_size(m->alloc);
    uint64_t room = m->configured_bytes - heap;
    if (bytes > 0)
        heap = lmc_l1_alloc_sbrk(m->alloc, bytes < room ? bytes : room);
    pthread_cond_broadcast(&m->grown);
    pthread_mutex_unlock(&m->mutex);
    return heap;
}

void lmc_l1_manager_set_commit_target(lmc_l1_manager *m, uint64_t target)
{
    pthread_mutex_lock(&m->mutex);
    m->commit_target = target < m->configured_bytes ? target : m->configured_bytes;
    pthread_cond_broadcast(&m->grown);
    pthread_mutex_unlock(&m->mutex);
}

bool lmc_l1_manager_wait_growth(lmc_l1_manager *m, uint64_t seen, int64_t timeout_ms)
{
    struct timespec deadline;
    clock_gettime(CLOCK_MONOTONIC, &deadline);
    deadline.tv_sec += (time_t)(timeout_ms / 1000);
    deadline.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (deadline.tv_nsec >= 1000000000L) {
        deadline.tv_sec++;
        deadline.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&m->mutex);
    uint64_t heap = lmc_l1_alloc_heap_size(m->alloc);
    int rc = 0;
    while (heap <= seen && heap < m->commit_target && rc != ETIMEDOUT) {
        rc = pthread_cond_timedwait(&m->grown, &m->mutex, &deadline);
        heap = lmc_l1_alloc_heap_size(m->alloc);
    }
    pthread_mutex_unlock(&m->mutex);
    return heap > seen;
}

void lmc_l1_manager_usage(lmc_l1_manager *m, uint64_t *used, uint64_t *total)
{
    pthread_mutex_lock(&m->mutex);
    uint64_t heap = lmc_l1_alloc_heap_size(m->alloc);
    *total = heap > m->commit_target ? heap : m->commit_target;
    *used = heap - lmc_l1_alloc_free_size(m->alloc);
    pthread_mutex_unlock(&m->mutex);
}

static size_t count_read_locked(lmc_l1_manager *m, int64_t now)
{
    size_t locked = 0;
    for (size_t i = 0; i < m->entries.capacity; i++) {
        const l1_entry *e = lmc_key_table_slot_item(&m->entries, i);
        locked += e && e->object.resident && lmc_ttl_lock_held(&e->object.lock, now);
    }
    return locked;
}

void lmc_l1_manager_stats(lmc_l1_manager *m, lmc_l1_stats *out)
{
    pthread_mutex_lock(&m->mutex);
    out->num_objects = m->num_objects;
    out->num_staging = m->num_staging;
    out->num_locked = count_read_locked(m, l1_now(m));
    out->num_temporary = m->num_temporary;
    out->object_bytes = m->object_bytes;
    out->staging_bytes = m->staging_bytes;
    out->num_retired = m->num_retired;
    out->retired_bytes = m->retired_bytes;
    out->committed_bytes = lmc_l1_alloc_heap_size(m->alloc);
    out->used_bytes = out->committed_bytes - lmc_l1_alloc_free_size(m->alloc);
    out->configured_bytes = m->configured_bytes;
    out->events_lost = m->events_lost;
    out->invariant_violations = m->violations;
    out->books_checks = m->books_checks;
    out->leases = m->leases;
    pthread_mutex_unlock(&m->mutex);
}

static int set_u64(json_t *obj, const char *name, uint64_t value)
{
    return json_object_set_new(obj, name, json_integer((json_int_t)value));
}

static json_t *lease_status(const lmc_lease_counts *c)
{
    json_t *st = json_object();
    int rc = st ? 0 : -1;
    for (int k = LMC_LEASE_WRITE; st && k <= LMC_LEASE_COPY; k++) {
        json_t *kind = json_pack("{s:I, s:I, s:I, s:I}", "granted", (json_int_t)c->granted[k],
                                 "returned", (json_int_t)c->returned[k], "lapsed",
                                 (json_int_t)c->lapsed[k], "outstanding",
                                 (json_int_t)outstanding(c, (lmc_lease_kind)k));
        rc |= json_object_set_new(st, lmc_lease_kind_name((lmc_lease_kind)k), kind);
    }
    if (st) {
        rc |= set_u64(st, "returned_twice", c->returned_twice);
        rc |= set_u64(st, "returned_stale", c->returned_stale);
        rc |= set_u64(st, "returned_expired", c->returned_expired);
        rc |= set_u64(st, "size_mismatches", c->size_mismatches);
    }
    if (rc != 0) {
        json_decref(st);
        return NULL;
    }
    return st;
}

/* The health a status report shows: the rules that need no walk, so that
 * a metrics scrape never holds the L1 mutex for a pass over millions of
 * objects (the walk runs after every call in debug builds, and on
 * lmc_l1_manager_check_books). */
static bool books_balance_cheaply(lmc_l1_manager *m)
{
    pthread_mutex_lock(&m->mutex);
    bool ok = lmc_l1_books_balance(m, false);
    pthread_mutex_unlock(&m->mutex);
    return ok;
}

json_t *lmc_l1_manager_report_status(lmc_l1_manager *m)
{
    lmc_l1_stats s;
    bool healthy = books_balance_cheaply(m);
    lmc_l1_manager_stats(m, &s);
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
    rc |= set_u64(st, "events_lost", s.events_lost);
    rc |= set_u64(st, "invariant_violations", s.invariant_violations);
    rc |= set_u64(st, "books_checks", s.books_checks);
    rc |= json_object_set_new(st, "leases", lease_status(&s.leases));
    if (rc != 0)
        goto fail;
    json_decref(by_backend);
    return st;
fail:
    json_decref(by_backend);
    json_decref(st);
    return NULL;
}
