/* Shared by coord_db.c and coord_db_load.c only. */
#ifndef LMC_COORDINATOR_COORD_DB_INTERNAL_H
#define LMC_COORDINATOR_COORD_DB_INTERNAL_H

#include <sqlite3.h>

#include "coordinator/coord_db.h"

enum {
    ST_PUT_LOG, ST_DEL_DEAD_LOG, ST_MAX_LOG_ID, ST_PUT_PIN, ST_DEL_PIN, ST_PUT_CURSOR, ST_DEL_CURSOR,
    ST_PUT_QUOTA, ST_DEL_QUOTA, ST_PUT_META, ST_BEGIN, ST_COMMIT, ST_ROLLBACK, ST_COUNT
};

struct coordinator_db {
    sqlite3 *db;
    sqlite3_stmt *st[ST_COUNT];
    /* L2 key facts are a log of packed records, one row per transaction
     * (coord_db_log.c): one row insert instead of one per key. */
    uint8_t *log;
    size_t log_len, log_cap;
    bool log_failed;       /* out of memory while building the row */
    uint64_t log_records;  /* records in the table */
    /* The row's name dictionary: which model, salt and backend ids the
     * row has defined so far, and the touch its last record carried
     * (records store the difference). */
    uint64_t row_names[3][COORD_MAX_NAMES / 64];
    uint64_t row_touch;
    /* Compaction in slices (coord_db_log.c): the rows up to compact_upto
     * are the log being replaced, the snapshot has walked the key slots
     * below compact_slot of the compact_end there were. */
    bool compacting;
    int64_t compact_upto;
    uint32_t compact_slot, compact_end;
    uint64_t compact_old_records;
    int64_t log_start;  /* the first live row; those below are dead */
    bool dead_rows;     /* dead rows may remain, deleted a few at a time */
    uint64_t txn_log_records; /* log_records when the transaction began */
    /* A failed commit left L2 facts in memory that the log lacks: the
     * next compaction check writes a whole snapshot (coordinator_db_mark_diverged). */
    bool diverged;
};

/* Drops the pending records (a rollback). */
void coordinator_db_log_discard(coordinator_db *d);
/* Writes the pending records as one row (inside the open transaction). */
int coordinator_db_log_flush(coordinator_db *d);
/* Replays the log's live rows into s. */
int coordinator_db_log_load(coordinator_db *d, coordinator_state *s, char *err, size_t errlen);

#endif
