/* The L2 key facts as a log (docs/coordinator.md, "Persistence"): each
 * transaction appends one row of packed records (store, delete, touch),
 * replayed in order at start; a snapshot replaces the log once it holds
 * more than twice the live keys.  One row per /events request costs a
 * fraction of one B-tree insert per key.
 *
 * Record: op u8 | hash_len u8 | hash | kv_rank u32 | group u32 |
 *         model (u16 len + bytes) | salt (u16 len + bytes) | then
 *   store: size u64 | touch u64 | num_tokens u32 | backend (u16 + bytes)
 *   touch: touch u64
 *   delete: nothing.
 * Integers little-endian as the host writes them (the file is not meant
 * to move between architectures). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coordinator/coord_db_internal.h"
#include "obs/log.h"

enum { OP_STORE = 1, OP_DELETE = 2, OP_TOUCH = 3 };
#define SLACK_RECORDS 100000u
#define SNAPSHOT_ROW_RECORDS 10000u

static void put_bytes(coord_db *d, const void *p, size_t n)
{
    if (d->log_failed)
        return;
    if (d->log_len + n > d->log_cap) {
        size_t cap = d->log_cap ? d->log_cap : 65536;
        while (cap < d->log_len + n)
            cap *= 2;
        uint8_t *grown = realloc(d->log, cap);
        if (!grown) {
            d->log_failed = true;
            return;
        }
        d->log = grown;
        d->log_cap = cap;
    }
    memcpy(d->log + d->log_len, p, n);
    d->log_len += n;
}

static void put_str(coord_db *d, const char *s)
{
    uint16_t n = (uint16_t)strlen(s);
    put_bytes(d, &n, sizeof n);
    put_bytes(d, s, n);
}

static void put_key(coord_db *d, uint8_t op, const coord_state *s, const coord_entry *e)
{
    put_bytes(d, &op, 1);
    put_bytes(d, &e->hash_len, 1);
    put_bytes(d, e->hash, e->hash_len);
    put_bytes(d, &e->kv_rank, 4);
    put_bytes(d, &e->group, 4);
    put_str(d, coord_names_str(&s->models, e->model));
    put_str(d, coord_names_str(&s->salts, e->salt));
}

int coord_db_put_l2(coord_db *d, const coord_state *s, uint32_t idx)
{
    const coord_entry *e = &s->keys.e[idx];
    if (!(e->flags & COORD_IN_L2))
        return coord_db_del_l2(d, s, idx);
    put_key(d, OP_STORE, s, e);
    put_bytes(d, &e->l2_size, 8);
    put_bytes(d, &e->touch, 8);
    put_bytes(d, &e->num_tokens, 4);
    put_str(d, coord_names_str(&s->backends, e->l2_backend));
    d->log_records++;
    return d->log_failed ? -1 : 0;
}

int coord_db_del_l2(coord_db *d, const coord_state *s, uint32_t idx)
{
    put_key(d, OP_DELETE, s, &s->keys.e[idx]);
    d->log_records++;
    return d->log_failed ? -1 : 0;
}

int coord_db_touch_l2(coord_db *d, const coord_state *s, uint32_t idx)
{
    put_key(d, OP_TOUCH, s, &s->keys.e[idx]);
    put_bytes(d, &s->keys.e[idx].touch, 8);
    d->log_records++;
    return d->log_failed ? -1 : 0;
}

int coord_db_log_flush(coord_db *d)
{
    if (d->log_failed) {
        LMC_ERROR("coordinator: out of memory while saving L2 facts");
        d->log_len = 0;
        d->log_failed = false;
        return -1;
    }
    if (!d->log_len)
        return 0;
    sqlite3_stmt *st = d->st[ST_PUT_LOG];
    sqlite3_bind_blob(st, 1, d->log, (int)d->log_len, SQLITE_STATIC);
    int rc = sqlite3_step(st);
    sqlite3_reset(st);
    sqlite3_clear_bindings(st);
    d->log_len = 0;
    if (d->log_cap > ((size_t)16 << 20)) { /* a huge snapshot row: give it back */
        free(d->log);
        d->log = NULL;
        d->log_cap = 0;
    }
    if (rc != SQLITE_DONE) {
        LMC_ERROR("coordinator: database: %s", sqlite3_errmsg(d->db));
        return -1;
    }
    return 0;
}

/* ---- replay ---------------------------------------------------------------------- */

typedef struct {
    const uint8_t *p, *end;
} reader;

static bool get(reader *r, void *out, size_t n)
{
    if ((size_t)(r->end - r->p) < n)
        return false;
    memcpy(out, r->p, n);
    r->p += n;
    return true;
}

/* A string into buf (NUL-terminated); false when malformed. */
static bool get_str(reader *r, char *buf, size_t cap)
{
    uint16_t n;
    if (!get(r, &n, 2) || n >= cap || !get(r, buf, n))
        return false;
    buf[n] = '\0';
    return true;
}

/* The record's key, its entry created; COORD_NONE when malformed. */
static uint32_t get_key(reader *r, coord_state *s)
{
    coord_key k = {0};
    char model[COORD_MODEL_MAX + 1], salt[COORD_SALT_MAX + 1];
    if (!get(r, &k.hash_len, 1) || !k.hash_len || k.hash_len > COORD_HASH_MAX ||
        !get(r, k.hash, k.hash_len) || !get(r, &k.kv_rank, 4) || !get(r, &k.group, 4) ||
        !get_str(r, model, sizeof model) || !get_str(r, salt, sizeof salt))
        return COORD_NONE;
    k.model = coord_names_intern(&s->models, model);
    k.salt = coord_names_intern(&s->salts, salt);
    if (k.model == COORD_NONE || k.salt == COORD_NONE)
        return COORD_NONE;
    return coord_keys_get(&s->keys, &k);
}

/* Takes idx out of L2 (it may be freed) and returns it again. */
static uint32_t out_of_l2(coord_state *s, uint32_t idx)
{
    coord_key k;
    coord_entry_key(&s->keys.e[idx], &k);
    s->keys.e[idx].pins++; /* keeps the entry while it leaves L2 */
    coord_usage_l2_delete(s, idx);
    s->keys.e[idx].pins--;
    return idx;
}

static int replay_one(reader *r, coord_state *s)
{
    uint8_t op;
    if (!get(r, &op, 1))
        return -1;
    uint32_t idx = get_key(r, s);
    if (idx == COORD_NONE)
        return -1;
    coord_entry *e = &s->keys.e[idx];
    uint64_t size = e->l2_size, touch = 0;
    uint32_t tokens = e->num_tokens, backend = e->l2_backend;
    char bname[COORD_BACKEND_MAX + 1];
    if (op == OP_STORE) {
        if (!get(r, &size, 8) || !get(r, &touch, 8) || !get(r, &tokens, 4) ||
            !get_str(r, bname, sizeof bname) ||
            (backend = coord_names_intern(&s->backends, bname)) == COORD_NONE)
            return -1;
    } else if (op == OP_TOUCH) {
        if (!get(r, &touch, 8))
            return -1;
        if (!(e->flags & COORD_IN_L2))
            return coord_keys_release(&s->keys, idx), 0;
    } else if (op != OP_DELETE) {
        return -1;
    }
    if (e->flags & COORD_IN_L2)
        idx = out_of_l2(s, idx);
    if (op == OP_DELETE)
        return coord_keys_release(&s->keys, idx), 0;
    s->keys.e[idx].num_tokens = tokens;
    return coord_usage_l2_insert_at(s, idx, size, backend, touch);
}

int coord_db_log_load(coord_db *d, coord_state *s, char *err, size_t errlen)
{
    sqlite3_stmt *st = NULL;
    int rc = sqlite3_prepare_v2(d->db, "SELECT data FROM l2_log ORDER BY id", -1, &st, NULL);
    while (rc == SQLITE_OK && (rc = sqlite3_step(st)) == SQLITE_ROW) {
        reader r = {sqlite3_column_blob(st, 0), NULL};
        r.end = r.p + sqlite3_column_bytes(st, 0);
        while (r.p && r.p < r.end) {
            if (replay_one(&r, s) != 0) {
                sqlite3_finalize(st);
                snprintf(err, errlen, "database: a malformed L2 log record (or out of memory)");
                return -1;
            }
            d->log_records++;
        }
        rc = SQLITE_OK;
    }
    sqlite3_finalize(st);
    if (rc != SQLITE_DONE)
        return snprintf(err, errlen, "database: %s", sqlite3_errmsg(d->db)), -1;
    return 0;
}

int coord_db_maybe_compact(coord_db *d, const coord_state *s)
{
    if (d->log_records <= 2 * s->l2_entries + SLACK_RECORDS)
        return 0;
    uint64_t before = d->log_records;
    if (coord_db_begin(d) != 0)
        return -1;
    if (sqlite3_step(d->st[ST_CLEAR_LOG]) != SQLITE_DONE) {
        sqlite3_reset(d->st[ST_CLEAR_LOG]);
        coord_db_rollback(d);
        return -1;
    }
    sqlite3_reset(d->st[ST_CLEAR_LOG]);
    d->log_records = 0;
    size_t in_row = 0;
    int rc = 0;
    for (uint32_t i = 0; i < s->keys.n_slots && rc == 0; i++) {
        if (!(s->keys.e[i].flags & COORD_IN_L2))
            continue;
        rc = coord_db_put_l2(d, s, i);
        if (rc == 0 && ++in_row == SNAPSHOT_ROW_RECORDS) {
            rc = coord_db_log_flush(d);
            in_row = 0;
        }
    }
    if (rc != 0 || coord_db_commit(d) != 0) {
        if (rc != 0)
            coord_db_rollback(d);
        d->log_records = before;
        return -1;
    }
    LMC_INFO("coordinator: L2 log compacted from %llu to %llu records",
             (unsigned long long)before, (unsigned long long)d->log_records);
    return 0;
}
