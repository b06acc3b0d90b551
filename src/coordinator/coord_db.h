/* Persistence in SQLite (docs/coordinator.md, "Persistence"): quotas and
 * the default, pins, event cursors and the L2 key facts.  WAL mode; the
 * writes of one request go in one transaction.  Single-threaded: callers
 * hold the coordinator's lock. */
#ifndef LMC_COORDINATOR_COORD_DB_H
#define LMC_COORDINATOR_COORD_DB_H

#include <stddef.h>

#include "coordinator/coord_state.h"

typedef struct coord_db coord_db;

int coord_db_open(const char *path, coord_db **out, char *err, size_t errlen);
/* Checkpoints the WAL into the database file and closes.  NULL: no-op. */
void coord_db_close(coord_db *db);
/* Loads everything into an empty state.  0, or -1 with err. */
int coord_db_load(coord_db *db, coord_state *s, char *err, size_t errlen);

/* 0, or -1 when no transaction could begin (the database is locked by
 * another process, or cannot be read). */
int coord_db_begin(coord_db *db);
/* 0 once the transaction is durable as docs/coordinator.md says; -1 when it
 * could not be written (disk full, a file-size limit, an I/O error): it is
 * then rolled back, nothing of it is in the database. */
int coord_db_commit(coord_db *db);
void coord_db_rollback(coord_db *db);
/* The state holds L2 facts the database lost (a failed commit whose
 * changes stay in memory): the next coord_db_maybe_compact starts a whole
 * snapshot, restarting one under way, so that the log catches up with the
 * state however the facts changed since. */
void coord_db_mark_diverged(coord_db *db);

/* The entry's L2 fact as it is now (in L2: stored, else deleted); these
 * three only add to the transaction's log row (coord_db_log.c). */
int coord_db_put_l2(coord_db *db, const coord_state *s, uint32_t idx);
int coord_db_del_l2(coord_db *db, const coord_state *s, uint32_t idx);
int coord_db_touch_l2(coord_db *db, const coord_state *s, uint32_t idx);
/* The entry's pin count (0 deletes the row). */
int coord_db_put_pin(coord_db *db, const coord_state *s, uint32_t idx);
int coord_db_put_cursor(coord_db *db, const char *instance, const coord_cursor *c);
int coord_db_del_cursor(coord_db *db, const char *instance);
/* limit_gb < 0 deletes the salt's quota. */
int coord_db_put_quota(coord_db *db, const char *salt, double limit_gb);
/* has false: no default (salts without a quota are exempt). */
int coord_db_put_default(coord_db *db, bool has, double limit_gb);
/* Rewrites the L2 log as a snapshot of s when it has grown past twice the
 * live keys (plus a slack), so that it stays proportional to them. */
int coord_db_maybe_compact(coord_db *db, const coord_state *s);

#endif
