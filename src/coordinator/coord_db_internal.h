/* Shared by coord_db.c and coord_db_load.c only. */
#ifndef LMC_COORDINATOR_COORD_DB_INTERNAL_H
#define LMC_COORDINATOR_COORD_DB_INTERNAL_H

#include <sqlite3.h>

#include "coordinator/coord_db.h"

enum {
    ST_PUT_L2, ST_DEL_L2, ST_TOUCH_L2, ST_PUT_PIN, ST_DEL_PIN, ST_PUT_CURSOR, ST_DEL_CURSOR,
    ST_PUT_QUOTA, ST_DEL_QUOTA, ST_PUT_META, ST_BEGIN, ST_COMMIT, ST_ROLLBACK, ST_COUNT
};

struct coord_db {
    sqlite3 *db;
    sqlite3_stmt *st[ST_COUNT];
};

#endif
