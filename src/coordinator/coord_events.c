/* The ingest gate and the application of admitted batches
 * (docs/coordinator.md, "Cache events"). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coordinator/coord_db.h"
#include "coordinator/coord_events.h"
#include "obs/log.h"

size_t coordinator_events_fence(coordinator_state *s, uint32_t inst)
{
    s->ingest.fenced++;
    return coordinator_usage_l1_void(s, inst);
}

static void entry_key(const coordinator_event_entry *en, coordinator_key *k)
{
    *k = (coordinator_key){.hash_len = en->key.hash_len, .kv_rank = en->key.kv_rank,
                     .group = en->key.group, .model = en->model, .salt = en->salt};
    memcpy(k->hash, en->key.hash, en->key.hash_len);
}

/* Every name a store could add is interned first, so that a full table is
 * refused before any batch changed anything; the keys' table hashes are
 * taken on the way, for the prefetching of the second pass. */
/* Why a name could not be interned: its table is full, or memory ran out. */
static int intern_failed(const coordinator_names *table, const char *what, int max, char *why,
                         size_t whylen)
{
    if (table->n >= table->max)
        return snprintf(why, whylen, "too many %s (at most %d)", what, max), -1;
    return snprintf(why, whylen, "out of memory"), -1;
}

static int intern_names(coordinator_state *s, coordinator_event_request *r, char *why, size_t whylen)
{
    for (size_t i = 0; i < r->n; i++) {
        const coordinator_event_batch *b = &r->batches[i];
        if (!r->ungated && coordinator_names_intern(&s->instances, b->instance_id) == COORD_NONE)
            return intern_failed(&s->instances, "instances", COORD_MAX_CURSORS, why, whylen);
        if (coordinator_names_intern(&s->backends, b->backend) == COORD_NONE)
            return intern_failed(&s->backends, "backends", COORD_MAX_NAMES, why, whylen);
        for (size_t j = 0; j < b->n; j++) {
            coordinator_event_entry *en = &b->entries[j];
            coordinator_key k;
            bool known = coordinator_wire_key_resolve(s, &en->key, b->type == COORD_EV_STORE, &k);
            if (!known && b->type == COORD_EV_STORE)
                return intern_failed(s->models.n >= s->models.max ? &s->models : &s->salts,
                                     "distinct models or salts", COORD_MAX_NAMES, why, whylen);
            en->model = k.model;
            en->salt = k.salt;
            if (known)
                en->table_hash = coordinator_keys_hash(&s->keys, &k);
        }
    }
    return 0;
}

static void record_capacity(coordinator_cursor *c, const coordinator_event_batch *b, uint32_t backend)
{
    coordinator_capacity *slot = NULL;
    for (uint32_t i = 0; i < c->n_caps && !slot; i++)
        if (c->caps[i].tier_l2 == b->l2 && c->caps[i].backend == backend &&
            c->caps[i].shared == b->shared)
            slot = &c->caps[i];
    if (!slot && c->n_caps < COORD_MAX_CAPACITIES)
        slot = &c->caps[c->n_caps++];
    if (!slot || (slot->revision > b->capacity_revision))
        return; /* a full table keeps what it has; an older revision never wins */
    *slot = (coordinator_capacity){.tier_l2 = b->l2, .shared = b->shared, .backend = backend,
                             .capacity_bytes = b->capacity_bytes,
                             .revision = b->capacity_revision};
}

static int apply_entry(coordinator_state *s, coordinator_db *db, const coordinator_event_batch *b,
                       const coordinator_event_entry *en, uint32_t inst, uint32_t backend)
{
    bool store = b->type == COORD_EV_STORE;
    if (en->model == COORD_NONE || en->salt == COORD_NONE)
        return 0; /* a name never stored: nothing to delete or touch */
    coordinator_key k;
    entry_key(en, &k);
    uint64_t refused = s->keys.refused;
    uint32_t idx = store ? coordinator_keys_get_hashed(&s->keys, &k, en->table_hash)
                         : coordinator_keys_find_hashed(&s->keys, &k, en->table_hash);
    if (idx == COORD_NONE) /* a new key past the directory's bound: counted, not an error */
        return store && s->keys.refused == refused ? -1 : 0;
    int rc = 0;
    if (store && b->l2) {
        rc = coordinator_usage_l2_store(s, idx, en->size, backend, b->shared);
        if (en->num_tokens)
            s->keys.e[idx].num_tokens = en->num_tokens;
        if (rc == 0 && db)
            rc = coordinator_db_put_l2(db, s, idx);
    } else if (store) {
        rc = coordinator_usage_l1_store(s, idx, inst, backend, en->size);
        if (en->num_tokens)
            s->keys.e[idx].num_tokens = en->num_tokens;
    } else if (b->type == COORD_EV_ACCESS && b->l2) {
        coordinator_usage_l2_touch(s, idx);
        if (db && (s->keys.e[idx].flags & COORD_IN_L2))
            rc = coordinator_db_touch_l2(db, s, idx);
    } else if (b->type == COORD_EV_DELETE && b->l2) {
        if (db && (s->keys.e[idx].flags & COORD_IN_L2))
            rc = coordinator_db_del_l2(db, s, idx);
        coordinator_usage_l2_delete(s, idx);
    } else if (b->type == COORD_EV_DELETE) {
        coordinator_usage_l1_delete(s, idx, inst);
    }
    if (store && rc != 0)
        coordinator_keys_release(&s->keys, idx);
    return rc;
}

/* Entry j + FAR's index slot is fetched, and entry j + NEAR's slot, by
 * then in cache, read to fetch the entry it names: some ten misses in
 * flight instead of one (the index and entries are far larger than the
 * cache at millions of keys). */
#define PREFETCH_FAR 16
#define PREFETCH_NEAR 8

static bool resolved(const coordinator_event_entry *en)
{
    return en->model != COORD_NONE && en->salt != COORD_NONE;
}

static void prefetch_ahead(const coordinator_state *s, const coordinator_event_batch *b, size_t j)
{
    for (size_t i = 0; j == 0 && i < PREFETCH_FAR && i < b->n; i++)
        if (resolved(&b->entries[i]))
            coordinator_keys_prefetch_slot(&s->keys, b->entries[i].table_hash);
    const coordinator_event_entry *far = j + PREFETCH_FAR < b->n ? &b->entries[j + PREFETCH_FAR] : NULL;
    const coordinator_event_entry *near =
        j + PREFETCH_NEAR < b->n ? &b->entries[j + PREFETCH_NEAR] : NULL;
    if (far && resolved(far))
        coordinator_keys_prefetch_slot(&s->keys, far->table_hash);
    if (near && resolved(near))
        coordinator_keys_prefetch_entry(&s->keys, near->table_hash);
}

/* The gate: false when the batch is stale or a duplicate. */
static bool admit(coordinator_state *s, coordinator_cursor *c, uint32_t inst, const coordinator_event_batch *b,
                  coordinator_ingest_result *res)
{
    if (c->used && b->incarnation < c->incarnation) {
        res->stale++;
        s->ingest.stale++;
        return false;
    }
    if (c->used && b->incarnation > c->incarnation) {
        size_t voided = coordinator_events_fence(s, inst);
        LMC_INFO("coordinator: %s restarted (incarnation %lld -> %lld): %zu L1 placements "
                 "voided", b->instance_id, (long long)c->incarnation, (long long)b->incarnation,
                 voided);
        c->used = false;
        c->n_caps = 0;
    }
    if (!c->used) {
        *c = (coordinator_cursor){.used = true, .incarnation = b->incarnation, .last_seq = 0};
    } else if (b->seq <= c->last_seq) {
        res->duplicates++;
        s->ingest.duplicates++;
        return false;
    }
    if (b->seq > c->last_seq + 1) {
        if (!c->gap)
            LMC_WARN("coordinator: %s skipped batches %lld..%lld (incarnation %lld): its slice "
                     "needs replay", b->instance_id, (long long)c->last_seq + 1,
                     (long long)b->seq - 1, (long long)b->incarnation);
        c->gap = true;
        s->ingest.gaps++;
    }
    c->last_seq = b->seq;
    return true;
}

/* The entries of one admitted batch, in order. */
static int apply_entries(coordinator_state *s, coordinator_db *db, const coordinator_event_batch *b,
                         uint32_t inst, uint32_t backend, char *why, size_t whylen)
{
    for (size_t j = 0; j < b->n; j++) {
        prefetch_ahead(s, b, j);
        if (apply_entry(s, db, b, &b->entries[j], inst, backend) != 0)
            return snprintf(why, whylen, "an entry of %s seq %lld could not be recorded "
                                         "(out of memory or a database error); send the "
                                         "batches again later", b->instance_id,
                            (long long)b->seq), -1;
    }
    return 0;
}

/* The older L2 usage stream has no incarnation to gate on: every batch is
 * applied, which is harmless twice (a store replaces, a lookup touches). */
static int apply_ungated(coordinator_state *s, coordinator_db *db, coordinator_event_request *r,
                         coordinator_ingest_result *res, char *why, size_t whylen)
{
    s->ingest.l2_usage_posts++;
    for (size_t i = 0; i < r->n; i++) {
        const coordinator_event_batch *b = &r->batches[i];
        uint32_t backend = coordinator_names_find(&s->backends, b->backend);
        if (apply_entries(s, db, b, COORD_NONE, backend, why, whylen) != 0)
            return -1;
        res->applied++;
        s->ingest.l2_usage_events += b->n;
    }
    return 0;
}

/* The admitted batches of r, in order (names interned already). */
static int apply_batches(coordinator_state *s, coordinator_db *db, coordinator_event_request *r,
                         coordinator_ingest_result *res, char *why, size_t whylen)
{
    if (r->ungated)
        return apply_ungated(s, db, r, res, why, whylen);
    for (size_t i = 0; i < r->n; i++) {
        const coordinator_event_batch *b = &r->batches[i];
        uint32_t inst = coordinator_names_find(&s->instances, b->instance_id);
        uint32_t backend = coordinator_names_find(&s->backends, b->backend);
        coordinator_cursor *c = coordinator_cursor_at(s, inst);
        if (!c)
            return snprintf(why, whylen, "out of memory"), -1;
        if (!admit(s, c, inst, b, res))
            continue;
        r->batches[i].admitted = true;
        res->applied++;
        s->ingest.applied++;
        if (b->type == COORD_EV_CONFIG)
            record_capacity(c, b, backend);
        if (apply_entries(s, db, b, inst, backend, why, whylen) != 0)
            return -1;
        s->ingest.entries_applied += b->n;
        if (db && coordinator_db_put_cursor(db, b->instance_id, c) != 0)
            return snprintf(why, whylen, "the cursor of %s could not be saved; send the "
                                         "batches again later", b->instance_id), -1;
    }
    return 0;
}

int coordinator_events_apply(coordinator_state *s, coordinator_db *db, coordinator_event_request *r,
                       coordinator_ingest_result *res, char *why, size_t whylen)
{
    memset(res, 0, sizeof *res);
    if (intern_names(s, r, why, whylen) != 0)
        return -1;
    return apply_batches(s, db, r, res, why, whylen);
}

/* ---- one request, one transaction ---------------------------------------------- */

/* What a request's gate changed, to put back when its transaction fails. */
typedef struct {
    coordinator_ingest_counters counters;
    size_t n;
    struct saved_cursor {
        uint32_t inst;
        coordinator_cursor cursor;
    } *cursors;
} gate_undo;

/* Marks the instance ids r names (interned) in seen; how many there are. */
static size_t instances_of(const coordinator_state *s, const coordinator_event_request *r, uint64_t *seen)
{
    size_t n = 0;
    for (size_t i = 0; i < r->n; i++) {
        uint32_t inst = coordinator_names_find(&s->instances, r->batches[i].instance_id);
        if (inst < COORD_MAX_CURSORS && !(seen[inst / 64] >> (inst % 64) & 1)) {
            seen[inst / 64] |= (uint64_t)1 << (inst % 64);
            n++;
        }
    }
    return n;
}

/* The cursors of the instances r names, each once (a request is mostly
 * one server's), and the counters. */
static int save_gate(coordinator_state *s, const coordinator_event_request *r, gate_undo *u)
{
    uint64_t seen[COORD_MAX_CURSORS / 64] = {0};
    size_t n = instances_of(s, r, seen);
    *u = (gate_undo){.counters = s->ingest};
    u->cursors = malloc((n ? n : 1) * sizeof *u->cursors);
    if (!u->cursors)
        return -1;
    for (uint32_t inst = 0; u->n < n; inst++) {
        if (!(seen[inst / 64] >> (inst % 64) & 1))
            continue;
        coordinator_cursor *c = coordinator_cursor_at(s, inst);
        if (!c)
            return free(u->cursors), -1;
        u->cursors[u->n++] = (struct saved_cursor){.inst = inst, .cursor = *c};
    }
    return 0;
}

/* Puts the gate back as it was before the request: its retry is admitted
 * again, not taken for a duplicate of what the database never got.  The
 * facts stay (re-applying a batch is harmless: a store replaces, a delete
 * of an absent key is nothing) and the database is told to catch up. */
static void undo_gate(coordinator_state *s, gate_undo *u)
{
    for (size_t i = 0; i < u->n; i++)
        *coordinator_cursor_at(s, u->cursors[i].inst) = u->cursors[i].cursor;
    s->ingest = u->counters;
}

int coordinator_events_ingest(coordinator_state *s, coordinator_db *db, coordinator_event_request *r,
                        coordinator_ingest_result *res, char *why, size_t whylen)
{
    memset(res, 0, sizeof *res);
    why[0] = '\0';
    if (coordinator_db_begin(db) != 0)
        return snprintf(why, whylen, "the database cannot take writes now; nothing was "
                                     "applied, send the batches again later"), -2;
    gate_undo u = {0};
    if (intern_names(s, r, why, whylen) != 0 || save_gate(s, r, &u) != 0) {
        if (!why[0])
            snprintf(why, whylen, "out of memory");
        coordinator_db_rollback(db);
        return -1;
    }
    int rc = apply_batches(s, db, r, res, why, whylen);
    if (rc == 0 && coordinator_db_commit(db) == 0) {
        free(u.cursors);
        coordinator_db_maybe_compact(db, s);
        return 0;
    }
    if (rc == 0)
        snprintf(why, whylen, "the events could not be saved; nothing was applied, send the "
                              "batches again later");
    else
        coordinator_db_rollback(db);
    undo_gate(s, &u);
    coordinator_db_mark_diverged(db);
    free(u.cursors);
    memset(res, 0, sizeof *res);
    return rc == 0 ? -2 : -1;
}
