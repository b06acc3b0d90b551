/* SQLite persistence (coord_db.h). */
#include "coordinator/coord_db_internal.h"

#include <errno.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "obs/log.h"

static const char *const SQL[ST_COUNT] = {
    [ST_PUT_LOG] = "INSERT INTO l2_log(data) VALUES(?1)",
    [ST_DEL_DEAD_LOG] = "DELETE FROM l2_log WHERE id IN (SELECT id FROM l2_log WHERE id < ?1 "
                        "ORDER BY id LIMIT 64)",
    [ST_MAX_LOG_ID] = "SELECT coalesce(max(id), 0) FROM l2_log",
    [ST_PUT_PIN] = "INSERT OR REPLACE INTO pins(model,salt,hash,kv_rank,grp,count) "
                   "VALUES(?1,?2,?3,?4,?5,?6)",
    [ST_DEL_PIN] = "DELETE FROM pins WHERE model=?1 AND salt=?2 AND hash=?3 AND kv_rank=?4 "
                   "AND grp=?5",
    [ST_PUT_CURSOR] = "INSERT OR REPLACE INTO cursors(instance,incarnation,last_seq,gap) "
                      "VALUES(?1,?2,?3,?4)",
    [ST_DEL_CURSOR] = "DELETE FROM cursors WHERE instance=?1",
    [ST_PUT_QUOTA] = "INSERT OR REPLACE INTO quotas(salt,limit_gb) VALUES(?1,?2)",
    [ST_DEL_QUOTA] = "DELETE FROM quotas WHERE salt=?1",
    [ST_PUT_META] = "INSERT OR REPLACE INTO meta(name,value) VALUES(?1,?2)",
    [ST_BEGIN] = "BEGIN",
    [ST_COMMIT] = "COMMIT",
    [ST_ROLLBACK] = "ROLLBACK",
};

static const char SCHEMA[] =
    "PRAGMA journal_mode=WAL;"
    "PRAGMA synchronous=NORMAL;"
    "CREATE TABLE IF NOT EXISTS meta(name TEXT PRIMARY KEY, value REAL);"
    "CREATE TABLE IF NOT EXISTS quotas(salt TEXT PRIMARY KEY, limit_gb REAL NOT NULL);"
    "CREATE TABLE IF NOT EXISTS cursors(instance TEXT PRIMARY KEY, incarnation INTEGER, "
    "  last_seq INTEGER, gap INTEGER);"
    "CREATE TABLE IF NOT EXISTS pins(model TEXT, salt TEXT, hash BLOB, kv_rank INTEGER, "
    "  grp INTEGER, count INTEGER, PRIMARY KEY(model,salt,hash,kv_rank,grp)) WITHOUT ROWID;"
    "CREATE TABLE IF NOT EXISTS l2_log(id INTEGER PRIMARY KEY, data BLOB NOT NULL);";

/* Why the database file cannot be created, in the operator's terms: the
 * directory it names is missing or not one (SQLite says only "unable to
 * open database file").  "" when the directory is there. */
static void describe_directory(const char *path, char *why, size_t len)
{
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    why[0] = '\0';
    if (!slash)
        return;  /* the current directory */
    if (slash == dir)
        slash[1] = '\0';
    else
        *slash = '\0';
    struct stat st;
    if (stat(dir, &st) != 0)
        snprintf(why, len, "its directory %s does not exist (%s): create it, or point "
                           "LMCACHE_MP_COORDINATOR_DB_PATH elsewhere", dir, strerror(errno));
    else if (!S_ISDIR(st.st_mode))
        snprintf(why, len, "%s is not a directory", dir);
}

int coordinator_db_open(const char *path, coordinator_db **out, char *err, size_t errlen)
{
    coordinator_db *d = calloc(1, sizeof *d);
    if (!d)
        return snprintf(err, errlen, "out of memory"), -1;
    char *msg = NULL;
    if (sqlite3_open_v2(path, &d->db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE |
                        SQLITE_OPEN_NOMUTEX, NULL) != SQLITE_OK ||
        sqlite3_exec(d->db, SCHEMA, NULL, NULL, &msg) != SQLITE_OK) {
        char why[4200];
        describe_directory(path, why, sizeof why);
        snprintf(err, errlen, "LMCACHE_MP_COORDINATOR_DB_PATH %s: %s", path,
                 why[0] ? why : msg ? msg : sqlite3_errmsg(d->db));
        goto fail;
    }
    for (int i = 0; i < ST_COUNT; i++) {
        if (sqlite3_prepare_v2(d->db, SQL[i], -1, &d->st[i], NULL) != SQLITE_OK) {
            snprintf(err, errlen, "LMCACHE_MP_COORDINATOR_DB_PATH %s: %s", path,
                     sqlite3_errmsg(d->db));
            goto fail;
        }
    }
    *out = d;
    return 0;
fail:
    sqlite3_free(msg);
    coordinator_db_close(d);
    return -1;
}

void coordinator_db_close(coordinator_db *d)
{
    if (!d)
        return;
    for (int i = 0; i < ST_COUNT; i++)
        sqlite3_finalize(d->st[i]);
    if (d->db && sqlite3_wal_checkpoint_v2(d->db, NULL, SQLITE_CHECKPOINT_TRUNCATE, NULL, NULL) !=
                     SQLITE_OK)
        LMC_WARN("coordinator: database checkpoint failed: %s", sqlite3_errmsg(d->db));
    sqlite3_close(d->db);
    free(d->log);
    free(d);
}

/* Runs a prepared statement to completion. */
static int step(coordinator_db *d, sqlite3_stmt *st)
{
    int rc = sqlite3_step(st);
    sqlite3_reset(st);
    sqlite3_clear_bindings(st);
    if (rc == SQLITE_DONE || rc == SQLITE_ROW)
        return 0;
    LMC_WARN("coordinator: database: %s", sqlite3_errmsg(d->db));
    return -1;
}

int coordinator_db_begin(coordinator_db *d)
{
    d->txn_log_records = d->log_records;
    return step(d, d->st[ST_BEGIN]);
}

int coordinator_db_commit(coordinator_db *d)
{
    if (coordinator_db_log_flush(d) != 0 || step(d, d->st[ST_COMMIT]) != 0) {
        coordinator_db_rollback(d);
        return -1;
    }
    return 0;
}

/* SQLite rolls some failed commits back by itself (a full disk, an I/O
 * error) and keeps others open (a busy database): ROLLBACK only what is
 * still open, so that the next BEGIN never meets a stale transaction. */
void coordinator_db_rollback(coordinator_db *d)
{
    coordinator_db_log_discard(d);
    d->log_records = d->txn_log_records;
    if (!sqlite3_get_autocommit(d->db))
        step(d, d->st[ST_ROLLBACK]);
}

void coordinator_db_mark_diverged(coordinator_db *d)
{
    d->diverged = true;
}

static sqlite3_stmt *bind_key(coordinator_db *d, int which, const coordinator_state *s, const coordinator_entry *e)
{
    sqlite3_stmt *st = d->st[which];
    sqlite3_bind_text(st, 1, coordinator_names_str(&s->models, e->model), -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, coordinator_names_str(&s->salts, e->salt), -1, SQLITE_STATIC);
    sqlite3_bind_blob(st, 3, e->hash, e->hash_len, SQLITE_STATIC);
    sqlite3_bind_int64(st, 4, e->kv_rank);
    sqlite3_bind_int64(st, 5, e->group);
    return st;
}

int coordinator_db_put_pin(coordinator_db *d, const coordinator_state *s, uint32_t idx)
{
    const coordinator_entry *e = &s->keys.e[idx];
    if (!e->pins)
        return step(d, bind_key(d, ST_DEL_PIN, s, e));
    sqlite3_stmt *st = bind_key(d, ST_PUT_PIN, s, e);
    sqlite3_bind_int64(st, 6, e->pins);
    return step(d, st);
}

int coordinator_db_put_cursor(coordinator_db *d, const char *instance, const coordinator_cursor *c)
{
    sqlite3_stmt *st = d->st[ST_PUT_CURSOR];
    sqlite3_bind_text(st, 1, instance, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, c->incarnation);
    sqlite3_bind_int64(st, 3, c->last_seq);
    sqlite3_bind_int(st, 4, c->gap);
    return step(d, st);
}

int coordinator_db_del_cursor(coordinator_db *d, const char *instance)
{
    sqlite3_bind_text(d->st[ST_DEL_CURSOR], 1, instance, -1, SQLITE_STATIC);
    return step(d, d->st[ST_DEL_CURSOR]);
}

int coordinator_db_put_quota(coordinator_db *d, const char *salt, double limit_gb)
{
    sqlite3_stmt *st = d->st[limit_gb < 0 ? ST_DEL_QUOTA : ST_PUT_QUOTA];
    sqlite3_bind_text(st, 1, salt, -1, SQLITE_STATIC);
    if (limit_gb >= 0)
        sqlite3_bind_double(st, 2, limit_gb);
    return step(d, st);
}

int coordinator_db_put_default(coordinator_db *d, bool has, double limit_gb)
{
    sqlite3_stmt *st = d->st[ST_PUT_META];
    sqlite3_bind_text(st, 1, "default_limit_gb", -1, SQLITE_STATIC);
    if (has)
        sqlite3_bind_double(st, 2, limit_gb);
    else
        sqlite3_bind_null(st, 2);
    return step(d, st);
}
