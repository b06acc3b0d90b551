/* Reading a storage trace back (docs/trace.md, "Reading a trace"): the
 * file lmcached's --trace-level storage writes, or upstream LMCache's,
 * frame by frame.  Used by `lmcache-cli trace` (info, whatif, replay) and
 * by the server's replay endpoint, which decodes single record frames.
 *
 * A reader refuses, with the byte offset of the frame at fault, a file
 * whose header is not an LMCT header of format 1 and schema 1 or 2, a
 * frame that is cut short, and a frame that does not decode as a Record.
 * Every size from the file is bounded before it is used: a frame is at
 * most LMC_TRACE_FRAME_MAX bytes, a record at most LMC_TRACE_KEYS_MAX keys,
 * a chunk hash at most 32 bytes, a layout's size must fit 64 bits.
 * Upstream's reader skips a record frame that does not decode; this one
 * refuses the file there (docs/trace.md, "Reading a trace"). */
#ifndef LMC_STORAGE_STORAGE_TRACE_READER_H
#define LMC_STORAGE_STORAGE_TRACE_READER_H

#include <stddef.h>
#include <stdint.h>

#include "storage/object_key.h"
#include "storage/storage_trace.h"

#define LMC_TRACE_FRAME_MAX (64u << 20)
#define LMC_TRACE_KEYS_MAX 65536u
/* msgpack values in one frame: 32 per key of a record of the most keys. */
#define LMC_TRACE_OBJECTS_MAX (LMC_TRACE_KEYS_MAX * 32u)

typedef struct {
    int format_version;          /* 1 */
    int schema_version;          /* trace_schema_version; 1 when the header has lmcache_version */
    char level[32];              /* "storage" */
    double t_mono_start;
    double t_wall_start;
    char *sm_config_json;        /* owned by the reader; "" when absent */
    char sm_config_digest[65];   /* hex, "" when absent */
} lmc_trace_header;

typedef struct {
    uint64_t offset;             /* byte offset of this frame's length prefix */
    double t_mono;               /* seconds since the header's t_mono_start */
    double t_wall;
    lmc_storage_trace_op op;     /* LMC_STORAGE_TRACE_UNKNOWN for a qualname we do not replay */
    const char *qualname;        /* valid until the next call */
    const lmc_object_key *keys;  /* valid until the next call; strings interned by the reader */
    size_t n_keys;
    uint64_t object_size;        /* reserve_write: product of the layout's shapes times the
                                  * dtype's size, summed over its tensors; 0 otherwise */
    const uint8_t *frame;        /* the frame's msgpack body, valid until the next call */
    size_t frame_len;
} lmc_trace_record;

typedef struct lmc_trace_reader lmc_trace_reader;

/* Opens `path` and reads its header.  NULL with a reason in err (naming
 * the path and, for a bad header, byte offset 0). */
lmc_trace_reader *lmc_trace_reader_open(const char *path, char *err, size_t errlen);
const lmc_trace_header *lmc_trace_reader_header(const lmc_trace_reader *r);
/* 1: a record in *rec; 0: the file ended on a frame boundary; -1: the
 * frame at rec->offset is cut short or does not decode: err says which
 * and names that byte offset ("at byte N"). */
int lmc_trace_reader_next(lmc_trace_reader *r, lmc_trace_record *rec, char *err, size_t errlen);
void lmc_trace_reader_close(lmc_trace_reader *r);

/* Decodes one record body (no length prefix) into *rec, interning key
 * strings in `in` (bounded or not).  rec's pointers stay valid until the
 * next call with the same `scratch`; its keys hold one reference on their
 * strings until then (a copy kept longer takes its own, lmc_keys_hold).
 * 0 or -1 with a reason in err. */
typedef struct lmc_trace_scratch lmc_trace_scratch;
lmc_trace_scratch *lmc_trace_scratch_new(lmc_key_interner *in);
void lmc_trace_scratch_free(lmc_trace_scratch *s);
int lmc_trace_decode_record(lmc_trace_scratch *s, const uint8_t *body, size_t len,
                            lmc_trace_record *rec, char *err, size_t errlen);

/* Decodes a header body (no length prefix) into *out; 0, or -1 with a
 * reason in err (out then owns nothing).  lmc_trace_header_clear frees
 * what a decoded header owns. */
int lmc_trace_decode_header(const uint8_t *body, size_t len, lmc_trace_header *out, char *err,
                            size_t errlen);
void lmc_trace_header_clear(lmc_trace_header *h);

#endif
