/* Persistence in SQLite (docs/coordinator.md, "Persistence"): quotas and
 * the default, pins, event cursors and the L2 key facts.  WAL mode; the
 * writes of one request go in one transaction.  Single-threaded: callers
 * hold the coordinator's lock. */
#ifndef LMC_COORDINATOR_COORD_DB_H
#define LMC_COORDINATOR_COORD_DB_H

#include <stddef.h>

#include "coordinator/coord_state.h"

typedef struct coordinator_db coordinator_db;

int coordinator_db_open(const char *path, coordinator_db **out, char *err, size_t errlen);
/* Checkpoints the WAL into the database file and closes.  NULL: no-op. */
void coordinator_db_close(coordinator_db *db);
/* Loads everything into an empty state.  0, or -1 with err. */
int coordinator_db_load(coordinator_db *db, coordinator_state *s, char *err, size_t errlen);

/* 0, or -1 when no transaction could begin (the database is locked by
 * another process, or cannot be read). */
int coordinator_db_begin(coordinator_db *db);
/* 0 once the transaction is durable as docs/coordinator.md says; -1 when it
 * could not be written (disk full, a file-size limit, an I/O error): it is
 * then rolled back, nothing of it is in the database. */
int coordinator_db_commit(coordinator_db *db);
void coordinator_db_rollback(coordinator_db *db);
/* The state holds L2 facts the database lost (a failed commit whose
 * changes stay in memory): the next coordinator_db_maybe_compact starts a whole
 * snapshot, restarting one under way, so that the log catches up with the
 * state however the facts changed since. */
void coordinator_db_mark_diverged(coordinator_db *db);

/* The entry's L2 fact as it is now (in L2: stored, else deleted); these
 * three only add to the transaction's log row (coord_db_log.c). */
int coordinator_db_put_l2(coordinator_db *db, const coordinator_state *s, uint32_t idx);
int coordinator_db_del_l2(coordinator_db *db, const coordinator_state *s, uint32_t idx);
int coordinator_db_touch_l2(coordinator_db *db, const coordinator_state *s, uint32_t idx);
/* The entry's pin count (0 deletes the row). */
int coordinator_db_put_pin(coordinator_db *db, const coordinator_state *s, uint32_t idx);
int coordinator_db_put_cursor(coordinator_db *db, const char *instance, const coordinator_cursor *c);
int coordinator_db_del_cursor(coordinator_db *db, const char *instance);
/* limit_gb < 0 deletes the salt's quota. */
int coordinator_db_put_quota(coordinator_db *db, const char *salt, double limit_gb);
/* has false: no default (salts without a quota are exempt). */
int coordinator_db_put_default(coordinator_db *db, bool has, double limit_gb);
/* Rewrites the L2 log as a snapshot of s when it has grown past twice the
 * live keys (plus a slack), so that it stays proportional to them. */
int coordinator_db_maybe_compact(coordinator_db *db, const coordinator_state *s);

#endif
