/* The L2 key facts as a log (docs/coordinator.md, "Persistence"): each
 * transaction appends one row of packed records (store, delete, touch),
 * replayed in order at start; a snapshot replaces the log once it holds
 * more than twice the live keys.  One row per /events request costs a
 * fraction of one B-tree insert per key.
 *
 * A row is compact, since its bytes are what the commit writes (twice,
 * through the WAL): integers are LEB128 varints, and names are defined once
 * per row and then named by id:
 *   name:   OP_NAME | kind u8 (model, salt, backend) | id | u16 len + bytes
 *   key:    hash_len u8 | hash | kv_rank | group | model id | salt id
 *   store:  OP_STORE2 | key | size | touch | num_tokens | backend id
 *   touch:  OP_TOUCH2 | key | touch
 *   delete: OP_DELETE2 | key
 * with touch zigzag-coded as the difference to the row's previous touch.
 * Ids are the writer's name ids, meaningful within the row only.  Rows of
 * the first format (ops 1-3: names spelled out in every record, fixed
 * integers in host order) are still replayed. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coordinator/coord_db_internal.h"
#include "core/grow.h"
#include "obs/log.h"

enum { OP_STORE = 1, OP_DELETE = 2, OP_TOUCH = 3, OP_NAME = 4, OP_STORE2 = 5, OP_DELETE2 = 6,
       OP_TOUCH2 = 7 };
enum { NAME_MODEL, NAME_SALT, NAME_BACKEND, NAME_KINDS };
#define SLACK_RECORDS 100000u
#define SNAPSHOT_ROW_RECORDS 10000u
/* The most one record (with the definitions before it) can take. */
#define MAX_RECORD (3 * (1 + 1 + 5 + 2 + COORD_MODEL_MAX) + 2 + COORD_HASH_MAX + 9 * 10)

/* Room for n more bytes; NULL (and the row marked failed) when out of
 * memory. */
static uint8_t *reserve(coordinator_db *d, size_t n)
{
    if (d->log_failed)
        return NULL;
    if (lmc_grow_array(&d->log, &d->log_cap, d->log_len + n, 1, 65536) != 0) {
        d->log_failed = true;
        return NULL;
    }
    return d->log + d->log_len;
}

static uint8_t *put_varint(uint8_t *p, uint64_t v)
{
    while (v >= 0x80) {
        *p++ = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    *p++ = (uint8_t)v;
    return p;
}

static uint64_t zigzag(int64_t v)
{
    return ((uint64_t)v << 1) ^ (uint64_t)(v >> 63);
}

/* Defines name id of kind in the row unless it already is. */
static uint8_t *put_name(coordinator_db *d, uint8_t *p, int kind, uint32_t id, const char *str)
{
    uint64_t *bits = &d->row_names[kind][id / 64], bit = (uint64_t)1 << (id % 64);
    if (*bits & bit)
        return p;
    *bits |= bit;
    uint16_t n = (uint16_t)strlen(str);
    *p++ = OP_NAME;
    *p++ = (uint8_t)kind;
    p = put_varint(p, id);
    memcpy(p, &n, 2);
    memcpy(p + 2, str, n);
    return p + 2 + n;
}

static uint8_t *put_key(uint8_t *p, uint8_t op, const coordinator_entry *e)
{
    *p++ = op;
    *p++ = e->hash_len;
    memcpy(p, e->hash, e->hash_len);
    p += e->hash_len;
    p = put_varint(p, e->kv_rank);
    p = put_varint(p, e->group);
    p = put_varint(p, e->model);
    return put_varint(p, e->salt);
}

static uint8_t *put_touch(coordinator_db *d, uint8_t *p, uint64_t touch)
{
    p = put_varint(p, zigzag((int64_t)(touch - d->row_touch)));
    d->row_touch = touch;
    return p;
}

/* Opens a record of op for entry e; NULL when out of memory. */
static uint8_t *begin_record(coordinator_db *d, const coordinator_state *s, uint8_t op, const coordinator_entry *e)
{
    uint8_t *p = reserve(d, MAX_RECORD);
    if (!p)
        return NULL;
    p = put_name(d, p, NAME_MODEL, e->model, coordinator_names_str(&s->models, e->model));
    p = put_name(d, p, NAME_SALT, e->salt, coordinator_names_str(&s->salts, e->salt));
    if (op == OP_STORE2)
        p = put_name(d, p, NAME_BACKEND, e->l2_backend,
                     coordinator_names_str(&s->backends, e->l2_backend));
    return put_key(p, op, e);
}

static int end_record(coordinator_db *d, uint8_t *p)
{
    d->log_len = (size_t)(p - d->log);
    d->log_records++;
    return 0;
}

int coordinator_db_put_l2(coordinator_db *d, const coordinator_state *s, uint32_t idx)
{
    const coordinator_entry *e = &s->keys.e[idx];
    if (!(e->flags & COORD_IN_L2))
        return coordinator_db_del_l2(d, s, idx);
    uint8_t *p = begin_record(d, s, OP_STORE2, e);
    if (!p)
        return -1;
    p = put_varint(p, e->l2_size);
    p = put_touch(d, p, e->touch);
    p = put_varint(p, e->num_tokens);
    p = put_varint(p, e->l2_backend);
    return end_record(d, p);
}

int coordinator_db_del_l2(coordinator_db *d, const coordinator_state *s, uint32_t idx)
{
    uint8_t *p = begin_record(d, s, OP_DELETE2, &s->keys.e[idx]);
    return p ? end_record(d, p) : -1;
}

int coordinator_db_touch_l2(coordinator_db *d, const coordinator_state *s, uint32_t idx)
{
    const coordinator_entry *e = &s->keys.e[idx];
    uint8_t *p = begin_record(d, s, OP_TOUCH2, e);
    if (!p)
        return -1;
    return end_record(d, put_touch(d, p, e->touch));
}

/* A new row starts with an empty dictionary. */
static void row_reset(coordinator_db *d)
{
    d->log_len = 0;
    d->log_failed = false;
    d->row_touch = 0;
    memset(d->row_names, 0, sizeof d->row_names);
}

void coordinator_db_log_discard(coordinator_db *d)
{
    row_reset(d);
}

int coordinator_db_log_flush(coordinator_db *d)
{
    if (d->log_failed) {
        LMC_ERROR("coordinator: out of memory while saving L2 facts");
        row_reset(d);
        return -1;
    }
    if (!d->log_len)
        return 0;
    sqlite3_stmt *st = d->st[ST_PUT_LOG];
    sqlite3_bind_blob(st, 1, d->log, (int)d->log_len, SQLITE_STATIC);
    int rc = sqlite3_step(st);
    sqlite3_reset(st);
    sqlite3_clear_bindings(st);
    row_reset(d);
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

/* Per kind: the writer's name id -> ours, valid while its stamp is the
 * row's (so a new row needs no clearing). */
typedef struct {
    uint32_t id[NAME_KINDS][COORD_MAX_NAMES];
    uint32_t stamp[NAME_KINDS][COORD_MAX_NAMES];
} row_names;

typedef struct {
    const uint8_t *p, *end;
    row_names *names;
    uint32_t row;   /* the stamp of the current row, from 1 */
    uint64_t touch; /* the row's previous touch */
} reader;

static bool get(reader *r, void *out, size_t n)
{
    if ((size_t)(r->end - r->p) < n)
        return false;
    memcpy(out, r->p, n);
    r->p += n;
    return true;
}

static bool get_varint(reader *r, uint64_t *out)
{
    uint64_t v = 0;
    for (unsigned shift = 0; shift < 64 && r->p < r->end; shift += 7) {
        uint8_t b = *r->p++;
        v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80))
            return *out = v, true;
    }
    return false;
}

static bool get_u32(reader *r, uint32_t *out)
{
    uint64_t v;
    if (!get_varint(r, &v) || v > UINT32_MAX)
        return false;
    *out = (uint32_t)v;
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

static coordinator_names *names_of(coordinator_state *s, int kind)
{
    return kind == NAME_MODEL ? &s->models : kind == NAME_SALT ? &s->salts : &s->backends;
}

/* OP_NAME: the writer's id of a name for the rest of the row. */
static int define_name(reader *r, coordinator_state *s)
{
    uint8_t kind;
    uint32_t wid;
    char name[COORD_MODEL_MAX + 1];
    if (!get(r, &kind, 1) || kind >= NAME_KINDS || !get_u32(r, &wid) ||
        wid >= COORD_MAX_NAMES || !get_str(r, name, sizeof name))
        return -1;
    uint32_t id = coordinator_names_intern(names_of(s, kind), name);
    if (id == COORD_NONE)
        return -1;
    r->names->id[kind][wid] = id;
    r->names->stamp[kind][wid] = r->row;
    return 0;
}

/* A name id of the compact format, as ours; COORD_NONE when not defined
 * in the row. */
static uint32_t get_name_ref(reader *r, int kind)
{
    uint32_t wid;
    if (!get_u32(r, &wid) || wid >= COORD_MAX_NAMES || r->names->stamp[kind][wid] != r->row)
        return COORD_NONE;
    return r->names->id[kind][wid];
}

/* The record's key, its entry created; COORD_NONE when malformed. */
static uint32_t get_key(reader *r, coordinator_state *s, bool compact)
{
    coordinator_key k = {0};
    if (!get(r, &k.hash_len, 1) || !k.hash_len || k.hash_len > COORD_HASH_MAX ||
        !get(r, k.hash, k.hash_len))
        return COORD_NONE;
    if (compact) {
        if (!get_u32(r, &k.kv_rank) || !get_u32(r, &k.group))
            return COORD_NONE;
        k.model = get_name_ref(r, NAME_MODEL);
        k.salt = get_name_ref(r, NAME_SALT);
    } else {
        char model[COORD_MODEL_MAX + 1], salt[COORD_SALT_MAX + 1];
        if (!get(r, &k.kv_rank, 4) || !get(r, &k.group, 4) ||
            !get_str(r, model, sizeof model) || !get_str(r, salt, sizeof salt))
            return COORD_NONE;
        k.model = coordinator_names_intern(&s->models, model);
        k.salt = coordinator_names_intern(&s->salts, salt);
    }
    if (k.model == COORD_NONE || k.salt == COORD_NONE)
        return COORD_NONE;
    return coordinator_keys_get(&s->keys, &k);
}

/* Takes idx out of L2 (it may be freed) and returns it again. */
static uint32_t out_of_l2(coordinator_state *s, uint32_t idx)
{
    s->keys.e[idx].pins++; /* keeps the entry while it leaves L2 */
    coordinator_usage_l2_delete(s, idx);
    s->keys.e[idx].pins--;
    return idx;
}

typedef struct {
    uint64_t size, touch;
    uint32_t tokens, backend;
} l2_fact;

/* The store's (or touch's) fields after the key. */
static bool get_fact(reader *r, coordinator_state *s, uint8_t op, l2_fact *f)
{
    uint64_t delta;
    char bname[COORD_BACKEND_MAX + 1];
    switch (op) {
    case OP_STORE:
        return get(r, &f->size, 8) && get(r, &f->touch, 8) && get(r, &f->tokens, 4) &&
               get_str(r, bname, sizeof bname) &&
               (f->backend = coordinator_names_intern(&s->backends, bname)) != COORD_NONE;
    case OP_TOUCH: return get(r, &f->touch, 8);
    case OP_STORE2:
    case OP_TOUCH2:
        if (op == OP_STORE2 && !get_varint(r, &f->size))
            return false;
        if (!get_varint(r, &delta))
            return false;
        f->touch = r->touch + (uint64_t)(int64_t)((delta >> 1) ^ -(delta & 1));
        r->touch = f->touch;
        return op == OP_TOUCH2 ||
               (get_u32(r, &f->tokens) &&
                (f->backend = get_name_ref(r, NAME_BACKEND)) != COORD_NONE);
    default: return true;
    }
}

/* One record: 1 for a fact, 0 for a name definition, -1 when malformed. */
static int replay_one(reader *r, coordinator_state *s)
{
    uint8_t op;
    if (!get(r, &op, 1))
        return -1;
    if (op == OP_NAME)
        return define_name(r, s);
    if (op < OP_STORE || op > OP_TOUCH2)
        return -1;
    uint32_t idx = get_key(r, s, op >= OP_STORE2);
    if (idx == COORD_NONE)
        return -1;
    coordinator_entry *e = &s->keys.e[idx];
    l2_fact f = {.size = e->l2_size, .tokens = e->num_tokens, .backend = e->l2_backend};
    if (!get_fact(r, s, op, &f))
        return -1;
    bool store = op == OP_STORE || op == OP_STORE2, touch = op == OP_TOUCH || op == OP_TOUCH2;
    if (touch && !(e->flags & COORD_IN_L2))
        return coordinator_keys_release(&s->keys, idx), 1;
    if (e->flags & COORD_IN_L2)
        idx = out_of_l2(s, idx);
    if (!store && !touch)
        return coordinator_keys_release(&s->keys, idx), 1;
    s->keys.e[idx].num_tokens = f.tokens;
    return coordinator_usage_l2_append(s, idx, f.size, f.backend, f.touch) == 0 ? 1 : -1;
}

/* The first live row of the log: rows below it were replaced by a
 * snapshot (coordinator_db_maybe_compact). */
static int64_t log_start(coordinator_db *d)
{
    sqlite3_stmt *st = NULL;
    int64_t start = 0;
    if (sqlite3_prepare_v2(d->db, "SELECT value FROM meta WHERE name='l2_log_start'", -1, &st,
                           NULL) == SQLITE_OK &&
        sqlite3_step(st) == SQLITE_ROW)
        start = sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    return start;
}

int coordinator_db_log_load(coordinator_db *d, coordinator_state *s, char *err, size_t errlen)
{
    sqlite3_stmt *st = NULL;
    reader r = {.names = malloc(sizeof *r.names)};
    if (!r.names)
        return snprintf(err, errlen, "database: out of memory"), -1;
    memset(r.names->stamp, 0, sizeof r.names->stamp);
    d->log_start = log_start(d);
    d->dead_rows = d->log_start > 0;
    int rc = sqlite3_prepare_v2(d->db, "SELECT data FROM l2_log WHERE id >= ?1 ORDER BY id", -1,
                                &st, NULL);
    if (rc == SQLITE_OK)
        sqlite3_bind_int64(st, 1, d->log_start);
    while (rc == SQLITE_OK && (rc = sqlite3_step(st)) == SQLITE_ROW) {
        r.p = sqlite3_column_blob(st, 0);
        r.end = r.p + sqlite3_column_bytes(st, 0);
        r.row++;
        r.touch = 0;
        while (r.p && r.p < r.end) {
            int one = replay_one(&r, s);
            if (one < 0) {
                sqlite3_finalize(st);
                free(r.names);
                snprintf(err, errlen, "database: a malformed L2 log record (or out of memory)");
                return -1;
            }
            d->log_records += (uint64_t)one;
        }
        rc = SQLITE_OK;
    }
    sqlite3_finalize(st);
    free(r.names);
    if (rc != SQLITE_DONE)
        return snprintf(err, errlen, "database: %s", sqlite3_errmsg(d->db)), -1;
    if (coordinator_usage_l2_sort(s) != 0)
        return snprintf(err, errlen, "database: out of memory ordering the L2 keys"), -1;
    return 0;
}

/* ---- compaction ------------------------------------------------------------------ */

/* The snapshot is written a slice of key slots at a time, one slice after
 * each /events commit, so that the lock is never held for a walk of every
 * key.  Rows written meanwhile land after the old log and among the
 * slices; replayed in id order, everything from the old log's end on
 * rebuilds the state: a slice records each key as it was then, and every
 * later change has its own later row.  Once the walk is done, one small
 * transaction moves the log's start past the old rows (kept in meta as
 * l2_log_start), and they are deleted a few at a time afterwards: dead
 * rows are never replayed, so a crash anywhere leaves a whole log. */
#define SLICE_SLOTS 65536u

static int delete_dead_rows(coordinator_db *d)
{
    sqlite3_stmt *st = d->st[ST_DEL_DEAD_LOG];
    sqlite3_bind_int64(st, 1, d->log_start);
    int rc = sqlite3_step(st);
    sqlite3_reset(st);
    if (rc != SQLITE_DONE) {
        LMC_WARN("coordinator: database: %s", sqlite3_errmsg(d->db));
        return -1;
    }
    d->dead_rows = sqlite3_changes(d->db) > 0;
    return 0;
}

static int start_compaction(coordinator_db *d, const coordinator_state *s)
{
    sqlite3_stmt *st = d->st[ST_MAX_LOG_ID];
    int rc = sqlite3_step(st);
    d->compact_upto = rc == SQLITE_ROW ? sqlite3_column_int64(st, 0) : 0;
    sqlite3_reset(st);
    if (rc != SQLITE_ROW) {
        LMC_WARN("coordinator: database: %s", sqlite3_errmsg(d->db));
        return -1;
    }
    d->compacting = true;
    d->compact_slot = 0;
    d->compact_end = s->keys.n_slots;
    d->compact_old_records = d->log_records;
    return 0;
}

/* The next slice's records into the open transaction. */
static int write_slice(coordinator_db *d, const coordinator_state *s)
{
    uint32_t end = d->compact_end - d->compact_slot > SLICE_SLOTS
                       ? d->compact_slot + SLICE_SLOTS : d->compact_end;
    size_t in_row = 0;
    for (uint32_t i = d->compact_slot; i < end; i++) {
        if (!(s->keys.e[i].flags & COORD_IN_L2))
            continue;
        if (coordinator_db_put_l2(d, s, i) != 0)
            return -1;
        if (++in_row == SNAPSHOT_ROW_RECORDS) {
            if (coordinator_db_log_flush(d) != 0)
                return -1;
            in_row = 0;
        }
    }
    d->compact_slot = end;
    return 0;
}

static int set_log_start(coordinator_db *d, int64_t start)
{
    sqlite3_stmt *st = d->st[ST_PUT_META];
    sqlite3_bind_text(st, 1, "l2_log_start", -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, start);
    int rc = sqlite3_step(st);
    sqlite3_reset(st);
    sqlite3_clear_bindings(st);
    return rc == SQLITE_DONE ? 0 : -1;
}

int coordinator_db_maybe_compact(coordinator_db *d, const coordinator_state *s)
{
    if (d->diverged) { /* a fresh snapshot, from the first slot, of the state as it is now */
        d->compacting = false;
        if (start_compaction(d, s) != 0)
            return -1;
        d->diverged = false;
        LMC_WARN("coordinator: a failed commit left the database behind the state; rewriting "
                 "the L2 log as a snapshot");
    }
    if (!d->compacting && d->dead_rows)
        return coordinator_db_begin(d) == 0 && delete_dead_rows(d) == 0 ? coordinator_db_commit(d)
                                                                   : (coordinator_db_rollback(d), -1);
    if (!d->compacting && d->log_records <= 2 * s->l2_entries + SLACK_RECORDS)
        return 0;
    if (!d->compacting && start_compaction(d, s) != 0)
        return -1;
    uint64_t before = d->log_records;
    uint32_t from = d->compact_slot;
    if (coordinator_db_begin(d) != 0)
        return -1;
    bool done = false;
    int rc = write_slice(d, s);
    if (rc == 0 && (done = d->compact_slot >= d->compact_end))
        rc = set_log_start(d, d->compact_upto + 1);
    if (rc != 0 || coordinator_db_commit(d) != 0) {
        if (rc != 0)
            coordinator_db_rollback(d);
        d->log_records = before; /* the slice is retried after the next commit */
        d->compact_slot = from;
        return -1;
    }
    if (!done)
        return 0;
    d->compacting = false;
    d->log_records -= d->compact_old_records;
    d->log_start = d->compact_upto + 1;
    d->dead_rows = true;
    LMC_INFO("coordinator: L2 log compacted: %llu records replaced, %llu live",
             (unsigned long long)d->compact_old_records, (unsigned long long)d->log_records);
    return 0;
}
