/* Giving L1 buffers back to the allocator, and the retired buffers that a
 * forced delete or clear left to the leases still out on them
 * (l1_internal.h, l1_retired; docs/storage.md, "Forced clear"). */
#include <stdlib.h>
#include <string.h>

#include "obs/log.h"
#include "core/grow.h"
#include "storage/l1/l1_internal.h"

static void release_now(lmc_l1_manager *m, uint64_t offset, uint64_t size)
{
    if (lmc_l1_alloc_release(m->alloc, offset, size) != 0)
        lmc_l1_violation(m, NULL, "a buffer the allocator does not know was released");
}

static int reserve_deferred(lmc_l1_manager *m, size_t needed)
{
    void *deferred = m->deferred;
    int rc = lmc_grow_array(&deferred, &m->cap_deferred, needed, sizeof *m->deferred, 64);
    m->deferred = deferred;
    return rc;
}

void lmc_l1_free_buffer(lmc_l1_manager *m, const l1_record *rec)
{
    if (m->deferring_frees && reserve_deferred(m, m->num_deferred + 1) == 0) {
        m->deferred[m->num_deferred++] = (lmc_l1_range){rec->offset, l1_rec_size(m, rec)};
        return;
    }
    release_now(m, rec->offset, l1_rec_size(m, rec));   /* no room to defer: one by one */
}

void lmc_l1_begin_deferred_frees(lmc_l1_manager *m, size_t expected)
{
    reserve_deferred(m, expected);   /* best effort; lmc_l1_free_buffer copes */
    m->deferring_frees = true;
    m->num_deferred = 0;
}

void lmc_l1_end_deferred_frees(lmc_l1_manager *m)
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

static void note_lapsed(lmc_l1_manager *m, bool write, uint32_t leases)
{
    m->leases.lapsed[write ? LMC_LEASE_WRITE : LMC_LEASE_COPY] += leases;
}

int lmc_l1_reserve_retired(lmc_l1_manager *m, size_t more)
{
    void *retired = m->retired;
    int rc = lmc_grow_array(&retired, &m->cap_retired, m->num_retired + more, sizeof *m->retired,
                            16);
    m->retired = retired;
    return rc;
}

/* Keeps `rec` allocated for the leases out on it: a writer's (`tag`, whose
 * string the retired record takes over) or rec->lock.count COPY leases.
 * The caller reserved the room (lmc_l1_reserve_retired) before it changed
 * anything, so retiring never has to fall back to freeing a buffer that a
 * copy may still be using. */
void lmc_l1_retire(lmc_l1_manager *m, const lmc_object_key *key, char *tag, const l1_record *rec)
{
    if (m->num_retired == m->cap_retired && lmc_l1_reserve_retired(m, 1) != 0) {
        lmc_l1_violation(m, key, "a buffer was retired without room reserved for it");
        note_lapsed(m, tag != NULL, tag ? 1 : rec->lock.count);
        free(tag);
        lmc_l1_free_buffer(m, rec);
        return;
    }
    if (m->num_retired == 0 || rec->lock.expiry_ms < m->retired_due_ms)
        m->retired_due_ms = rec->lock.expiry_ms;
    m->retired[m->num_retired++] = (l1_retired){*key, tag, *rec};
    lmc_keys_hold(key, 1); /* the entry naming it may go first */
    m->retired_bytes += l1_rec_size(m, rec);
}

void lmc_l1_free_retired(lmc_l1_manager *m, size_t i, uint32_t lapsed)
{
    l1_retired *r = &m->retired[i];
    note_lapsed(m, r->tag != NULL, lapsed);
    lmc_l1_free_buffer(m, &r->rec);
    m->retired_bytes -= l1_rec_size(m, &r->rec);
    free(r->tag);
    lmc_keys_drop(&r->key, 1);
    *r = m->retired[--m->num_retired];
}

/* The retired staging buffer of `key` that writer `tag` still fills. */
ssize_t lmc_l1_find_retired_write(const lmc_l1_manager *m, const lmc_object_key *key,
                              const char *tag)
{
    for (size_t i = 0; i < m->num_retired; i++) {
        const l1_retired *r = &m->retired[i];
        if (r->tag && strcmp(r->tag, tag) == 0 && lmc_object_key_equal(&r->key, key))
            return (ssize_t)i;
    }
    return -1;
}

ssize_t lmc_l1_find_retired(const lmc_l1_manager *m, const lmc_object_key *key,
                        lmc_l1_copy_id copy, bool write)
{
    for (size_t i = 0; i < m->num_retired; i++) {
        const l1_retired *r = &m->retired[i];
        if (r->rec.copy == copy && (r->tag != NULL) == write &&
            lmc_object_key_equal(&r->key, key))
            return (ssize_t)i;
    }
    return -1;
}

/* Frees retired buffers whose leases' lock lapsed (their holders will not
 * come back, or come back too late, as for any lapsed lock). */
void lmc_l1_sweep_retired(lmc_l1_manager *m, int64_t now)
{
    if (now < m->retired_due_ms)
        return;   /* nothing can have expired yet: the common case stays O(1) */
    int64_t due = INT64_MAX;
    for (size_t i = 0; i < m->num_retired;) {
        const l1_retired *r = &m->retired[i];
        if (lmc_ttl_lock_held(&r->rec.lock, now)) {
            if (r->rec.lock.expiry_ms < due)
                due = r->rec.lock.expiry_ms;
            i++;
        } else {
            lmc_l1_free_retired(m, i, r->tag ? 1 : r->rec.lock.count);
        }
    }
    m->retired_due_ms = due;
}
