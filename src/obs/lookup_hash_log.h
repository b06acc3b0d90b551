/* The lookup hash log (--lookup-hash-log-dir): a LOOKUP_END subscriber
 * that appends one JSON line per lookup to
 *     DIR/lookup_hashes_YYYYMMDD-HHMMSS.uuuuuu_NNNNNN.jsonl
 * (UTC time of the file's first line, then a sequence number), e.g.
 *     {"timestamp":1764437400.5,"session_id":"req-1","request_id":"req-1",
 *      "model_name":"m","cache_salt":"","requested_chunks":4,"hit_chunks":2,
 *      "hashes":["ab12...", ...]}
 * A new file starts when the current one holds max_size bytes or more, or
 * is rotation_interval seconds old (event time); after each new file the
 * oldest files of that pattern are deleted until at most max_files remain.
 * Names sort in creation order.
 *
 * Threads: lmc_lookup_hash_log_write runs on the bus drain thread only (or
 * the test's thread); open/close by the owner. */
#ifndef LMC_OBS_LOOKUP_HASH_LOG_H
#define LMC_OBS_LOOKUP_HASH_LOG_H

#include <stddef.h>
#include <stdint.h>

#include "obs/event_bus.h"

typedef struct {
    const char *dir;            /* created when missing */
    double rotation_interval;   /* seconds, > 0 */
    int64_t max_size;           /* bytes, > 0 */
    int max_files;              /* >= 1 */
} lmc_lookup_hash_log_options;

typedef struct lmc_lookup_hash_log lmc_lookup_hash_log;

lmc_lookup_hash_log *lmc_lookup_hash_log_open(const lmc_lookup_hash_log_options *o, char *err,
                                              size_t errlen);
/* Subscribes to LOOKUP_END; free the bus before closing the log. */
int lmc_lookup_hash_log_attach(lmc_lookup_hash_log *log, lmc_event_bus *bus);
/* Writes one line for `ev` (rotating first when due).  0, or -1 on an I/O
 * error (logged once per file). */
int lmc_lookup_hash_log_write(lmc_lookup_hash_log *log, const lmc_event *ev);
void lmc_lookup_hash_log_close(lmc_lookup_hash_log *log);

#define LMC_LOOKUP_HASH_LOG_PREFIX "lookup_hashes_"
#define LMC_LOOKUP_HASH_LOG_SUFFIX ".jsonl"

#endif
