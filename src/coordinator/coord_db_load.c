/* Loading the persisted state back at start (coord_db.h). */
#include <sqlite3.h>
#include <stdio.h>
#include <string.h>

#include "coordinator/coord_db_internal.h"

typedef int (*row_fn)(coordinator_state *s, sqlite3_stmt *row);

static int each_row(coordinator_db *d, coordinator_state *s, const char *sql, row_fn fn, char *err,
                    size_t errlen)
{
    sqlite3_stmt *st = NULL;
    int rc = sqlite3_prepare_v2(d->db, sql, -1, &st, NULL);
    while (rc == SQLITE_OK && (rc = sqlite3_step(st)) == SQLITE_ROW) {
        if (fn(s, st) != 0) {
            sqlite3_finalize(st);
            return snprintf(err, errlen, "database: a row does not fit (%s)", sql), -1;
        }
        rc = SQLITE_OK;
    }
    sqlite3_finalize(st);
    if (rc != SQLITE_DONE)
        return snprintf(err, errlen, "database: %s", sqlite3_errmsg(d->db)), -1;
    return 0;
}

static const char *text(sqlite3_stmt *st, int col)
{
    const char *t = (const char *)sqlite3_column_text(st, col);
    return t ? t : "";
}

static int load_default(coordinator_state *s, sqlite3_stmt *st)
{
    s->has_default_quota = sqlite3_column_type(st, 0) != SQLITE_NULL;
    s->default_quota_gb = sqlite3_column_double(st, 0);
    return 0;
}

static int load_quota(coordinator_state *s, sqlite3_stmt *st)
{
    uint32_t salt = coordinator_names_intern(&s->salts, text(st, 0));
    coordinator_salt *sa = salt == COORD_NONE ? NULL : coordinator_salt_at(s, salt);
    if (!sa)
        return -1;
    sa->has_quota = true;
    sa->quota_gb = sqlite3_column_double(st, 1);
    return 0;
}

static int load_cursor(coordinator_state *s, sqlite3_stmt *st)
{
    uint32_t inst = coordinator_names_intern(&s->instances, text(st, 0));
    coordinator_cursor *c = inst == COORD_NONE ? NULL : coordinator_cursor_at(s, inst);
    if (!c)
        return -1;
    *c = (coordinator_cursor){.used = true, .incarnation = sqlite3_column_int64(st, 1),
                        .last_seq = sqlite3_column_int64(st, 2),
                        .gap = sqlite3_column_int(st, 3) != 0};
    return 0;
}

/* Columns model, salt, hash, kv_rank, grp first. */
static uint32_t key_of_row(coordinator_state *s, sqlite3_stmt *st)
{
    coordinator_key k = {0};
    int len = sqlite3_column_bytes(st, 2);
    if (len < 1 || len > COORD_HASH_MAX)
        return COORD_NONE;
    memcpy(k.hash, sqlite3_column_blob(st, 2), (size_t)len);
    k.hash_len = (uint8_t)len;
    k.kv_rank = (uint32_t)sqlite3_column_int64(st, 3);
    k.group = (uint32_t)sqlite3_column_int64(st, 4);
    k.model = coordinator_names_intern(&s->models, text(st, 0));
    k.salt = coordinator_names_intern(&s->salts, text(st, 1));
    if (k.model == COORD_NONE || k.salt == COORD_NONE)
        return COORD_NONE;
    return coordinator_keys_get(&s->keys, &k);
}

static int load_pin(coordinator_state *s, sqlite3_stmt *st)
{
    uint32_t idx = key_of_row(s, st);
    if (idx == COORD_NONE)
        return -1;
    s->keys.e[idx].pins = (uint32_t)sqlite3_column_int64(st, 5);
    return 0;
}

int coordinator_db_load(coordinator_db *d, coordinator_state *s, char *err, size_t errlen)
{
    if (each_row(d, s, "SELECT value FROM meta WHERE name='default_limit_gb'", load_default,
                 err, errlen) ||
        each_row(d, s, "SELECT salt, limit_gb FROM quotas", load_quota, err, errlen) ||
        each_row(d, s, "SELECT instance, incarnation, last_seq, gap FROM cursors", load_cursor,
                 err, errlen) ||
        coordinator_db_log_load(d, s, err, errlen) ||
        each_row(d, s, "SELECT model,salt,hash,kv_rank,grp,count FROM pins", load_pin, err,
                 errlen))
        return -1;
    return 0;
}
