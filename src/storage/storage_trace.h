/* The storage trace recorder (docs/trace.md): --trace-level storage writes
 * every write-path call of the storage manager into a file in upstream
 * LMCache's trace format, a sequence of [u32 big-endian length][msgpack
 * frame], the first frame a Header, every later one a Record.
 *
 * Off the request path: a calling thread encodes its record (a few dozen
 * bytes plus its keys) into its own buffer and copies it into a bounded
 * byte ring under a short mutex; one writer thread writes the ring to the
 * file.  When the ring has no room the record is dropped and counted, so
 * no request ever waits on the disk (docs/trace.md, "Bounds"). */
#ifndef LMC_STORAGE_STORAGE_TRACE_H
#define LMC_STORAGE_STORAGE_TRACE_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "storage/object_key.h"

#define LMC_STORAGE_TRACE_MAGIC "LMCT"
#define LMC_STORAGE_TRACE_FORMAT_VERSION 1
/* Schema 2 is the one whose ObjectKey carries cache_salt (docs/trace.md). */
#define LMC_STORAGE_TRACE_SCHEMA_VERSION 2
#define LMC_STORAGE_TRACE_RING_BYTES (16u << 20)

/* Upstream's StorageManager methods a record names (docs/trace.md,
 * "What is recorded"). */
typedef enum {
    LMC_STORAGE_TRACE_RESERVE_WRITE,
    LMC_STORAGE_TRACE_FINISH_WRITE,
    LMC_STORAGE_TRACE_ABORT_WRITE,
    LMC_STORAGE_TRACE_SUBMIT_PREFETCH_TASK,
    LMC_STORAGE_TRACE_FINISH_READ_PREFETCHED,
    LMC_STORAGE_TRACE_READ_PREFETCHED_ENTER,   /* read_prefetched_results.__enter__ */
    LMC_STORAGE_TRACE_READ_PREFETCHED_EXIT,    /* read_prefetched_results.__exit__ */
    LMC_STORAGE_TRACE_UNKNOWN,                 /* a reader's name for any other qualname */
} lmc_storage_trace_op;

typedef struct lmc_storage_trace lmc_storage_trace;

typedef struct {
    uint64_t records_written;   /* frames on disk, the header not counted */
    uint64_t records_dropped;   /* ring full, or the file refused a write */
    uint64_t bytes_written;     /* file size so far, header included */
} lmc_storage_trace_stats;

/* Creates (truncates) `path`, writes the header at once and starts the
 * writer thread.  `sm_config_json`: the storage configuration the header
 * carries with its SHA-256.  NULL with a reason in `err` that names
 * --trace-output when the file cannot be written. */
lmc_storage_trace *lmc_storage_trace_open(const char *path, const char *level,
                                          const char *sm_config_json, size_t ring_bytes,
                                          char *err, size_t errlen);
/* The same with the header's `level_meta` (a JSON object, left out when
 * NULL or empty; held by the recorder): the events level's identity. */
lmc_storage_trace *lmc_storage_trace_open_meta(const char *path, const char *level,
                                               const char *sm_config_json,
                                               json_t *level_meta, size_t ring_bytes,
                                               char *err, size_t errlen);
/* Writes what the ring holds, syncs and closes the file.  NULL: no-op. */
void lmc_storage_trace_close(lmc_storage_trace *t);

/* Records one call.  object_size: the layout of reserve_write and
 * submit_prefetch_task (ignored otherwise).  Never blocks on the file;
 * drops and counts when full. */
void lmc_storage_trace_record(lmc_storage_trace *t, lmc_storage_trace_op op,
                              const lmc_object_key *keys, size_t n, uint64_t object_size);

/* Records a call whose args are a JSON object, packed type for type (the
 * events level's batches and lifecycle marks).  Same bounds as above. */
void lmc_storage_trace_record_json(lmc_storage_trace *t, const char *qualname,
                                   const json_t *args);

void lmc_storage_trace_get_stats(lmc_storage_trace *t, lmc_storage_trace_stats *out);
const char *lmc_storage_trace_path(const lmc_storage_trace *t);
const char *lmc_storage_trace_level(const lmc_storage_trace *t);

/* ---- the encoder, exposed for its tests -------------------------------
 * Each writes one whole frame (length prefix included) into buf and
 * returns its length; when that exceeds cap nothing useful was written
 * and the caller retries with a buffer of the returned size. */
size_t lmc_storage_trace_encode_header(uint8_t *buf, size_t cap, const char *level,
                                       double t_mono_start, double t_wall_start,
                                       const char *sm_config_json);
size_t lmc_storage_trace_encode_header_meta(uint8_t *buf, size_t cap, const char *level,
                                            double t_mono_start, double t_wall_start,
                                            const char *sm_config_json,
                                            const json_t *level_meta);
size_t lmc_storage_trace_encode_json_record(uint8_t *buf, size_t cap, double t_mono,
                                            double t_wall, const char *qualname,
                                            const json_t *args);
size_t lmc_storage_trace_encode_record(uint8_t *buf, size_t cap, double t_mono, double t_wall,
                                       lmc_storage_trace_op op, const lmc_object_key *keys,
                                       size_t n, uint64_t object_size);

#endif
