/* Wire-level facts of the MP protocol (docs/protocol.md, "Framing",
 * "Serialization" and "Op ids"): the frozen op-id table, msgpack
 * validation of untrusted frames, and small typed accessors over decoded
 * msgpack objects. */
#ifndef LMC_RPC_WIRE_H
#define LMC_RPC_WIRE_H

#include <msgpack.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Frozen wire ids (never renumber: deployed clients depend on them). */
typedef enum {
    LMC_OP_REGISTER_KV_CACHE = 1,
    LMC_OP_UNREGISTER_KV_CACHE = 2,
    LMC_OP_REGISTER_Q_CACHE = 3,
    LMC_OP_UNREGISTER_Q_CACHE = 4,
    LMC_OP_STORE_Q = 5,
    LMC_OP_STORE = 6,
    LMC_OP_RETRIEVE = 7,
    LMC_OP_LOOKUP = 8,
    LMC_OP_QUERY_PREFETCH_STATUS = 9,
    LMC_OP_WAIT_PREFETCH_STATUS = 10,
    LMC_OP_QUERY_PREFETCH_LOOKUP_HITS = 11,
    LMC_OP_FREE_LOOKUP_LOCKS = 12,
    LMC_OP_END_SESSION = 13,
    LMC_OP_REGISTER_KV_CACHE_ENGINE_DRIVEN_CONTEXT = 14,
    LMC_OP_UNREGISTER_KV_CACHE_ENGINE_DRIVEN_CONTEXT = 15,
    LMC_OP_PREPARE_STORE = 16,
    LMC_OP_COMMIT_STORE = 17,
    LMC_OP_PREPARE_RETRIEVE = 18,
    LMC_OP_COMMIT_RETRIEVE = 19,
    LMC_OP_CLEAR = 20,
    LMC_OP_GET_CHUNK_SIZE = 21,
    LMC_OP_PING = 22,
    LMC_OP_REPORT_BLOCK_ALLOCATION = 23,
    LMC_OP_NOOP = 24,
    LMC_OP_CB_REGISTER_ROPE = 25,
    LMC_OP_CB_UNREGISTER_ROPE = 26,
    LMC_OP_CB_RETRIEVE_PRE_COMPUTED = 27,
    LMC_OP_CB_UNIFIED_LOOKUP = 28,
    LMC_OP_P2P_LOOKUP_AND_LOCK = 29,
    LMC_OP_P2P_QUERY_LOOKUP_RESULTS = 30,
    LMC_OP_P2P_UNLOCK_OBJECTS = 31,
    LMC_OP_GET_EXPERIMENTAL = 32,
    LMC_OP_CB_PROTOCOL_HANDSHAKE = 33,
    LMC_OP_POLL_KV_EVENTS = 34,
    LMC_OP_FROZEN_MAX = 34,
} lmc_op_id;

/* snake_case name of a frozen op ("noop", "lookup", ...), NULL if unknown. */
const char *lmc_op_name(int op_id);
/* Frozen id for a snake_case name, or 0 if the name is not in the table. */
int lmc_op_id_from_name(const char *name, size_t len);

/* Walks one msgpack document without allocating and checks that it is
 * complete, that every declared length fits in the remaining bytes, and that
 * nesting stays within `max_depth`.  This runs before msgpack-c sees a frame
 * so that a hostile length (an array32 claiming 4 billion items in 5 bytes)
 * can never turn into a huge allocation.  Returns true if `data` holds exactly
 * one well-formed document. */
bool lmc_mp_validate(const uint8_t *data, size_t len, unsigned max_depth);

/* Typed accessors.  Each returns false when the object has another type, or
 * is NULL (lmc_rpc_call_arg's answer for a missing or undecodable argument),
 * so handlers can reject a wrong or absent argument with one check. */
bool lmc_mp_get_int(const msgpack_object *o, int64_t *out);  /* int (any width), also bool */
bool lmc_mp_get_uint(const msgpack_object *o, uint64_t *out);
bool lmc_mp_get_double(const msgpack_object *o, double *out); /* float32/64 or int */
bool lmc_mp_get_bool(const msgpack_object *o, bool *out);     /* bool or 0/1 int */
/* Never a NULL *ptr, also for "" and b"" (msgpack-c leaves those NULL). */
bool lmc_mp_get_str(const msgpack_object *o, const char **ptr, size_t *len);
bool lmc_mp_get_bin(const msgpack_object *o, const uint8_t **ptr, size_t *len);
bool lmc_mp_is_nil(const msgpack_object *o);
/* Map lookup by string key; NULL when absent or when `map` is not a map
 * (or is NULL, as lmc_rpc_call_arg returns for a missing argument). */
const msgpack_object *lmc_mp_map_get(const msgpack_object *map, const char *key);
bool lmc_mp_str_eq(const msgpack_object *o, const char *s);

/* ---- pull reader ---------------------------------------------------------
 * Reads one msgpack document in place, bounds-checked at every step, with
 * no allocation and no object tree: the decoder for big payloads (a prompt's
 * token ids) where msgpack-c's object tree would cost more than the work.
 * Each read returns false (and consumes nothing) when the next value has
 * another type or is truncated. */
typedef struct {
    const uint8_t *p;
    const uint8_t *end;
} lmc_mp_reader;

static inline void lmc_mpr_init(lmc_mp_reader *r, const uint8_t *data, size_t len)
{
    r->p = data;
    r->end = data + len;
}
static inline bool lmc_mpr_at_end(const lmc_mp_reader *r)
{
    return r->p == r->end;
}
bool lmc_mpr_map(lmc_mp_reader *r, uint32_t *count);
bool lmc_mpr_array(lmc_mp_reader *r, uint32_t *count);
bool lmc_mpr_str(lmc_mp_reader *r, const char **ptr, size_t *len);
bool lmc_mpr_uint(lmc_mp_reader *r, uint64_t *out);   /* non-negative int */
bool lmc_mpr_int(lmc_mp_reader *r, int64_t *out);     /* any int, never a bool */
bool lmc_mpr_nil(lmc_mp_reader *r);                   /* consumes a nil */
/* Reads `n` non-negative ints, each <= `max`, into out[] (the elements of an
 * array whose header was already read).  The hot loop of every LOOKUP: a
 * prompt's token ids.  Returns the count read; < n means the next element
 * is not such an int, and it is left unread. */
size_t lmc_mpr_uints(lmc_mp_reader *r, size_t n, uint64_t max, uint64_t *out);
/* Skips one whole value (nesting limited to `max_depth`). */
bool lmc_mpr_skip(lmc_mp_reader *r, unsigned max_depth);

/* Packs a NUL-terminated string as msgpack str. */
int lmc_mp_pack_cstr(msgpack_packer *pk, const char *s);

/* Copies src[0..len) into dst (cap bytes, always NUL-terminated when cap >
 * 0) as valid UTF-8, for text a client decodes strictly (error frames,
 * docs/protocol.md "Framing"): a byte that does not start a well-formed
 * sequence becomes '?', a sequence the end of src cuts short is dropped,
 * and the copy stops before a character that would not fit whole.
 * Returns the bytes written, without the NUL. */
size_t lmc_utf8_sanitize(char *dst, size_t cap, const char *src, size_t len);

#endif
