/* Decoding the P2P serving ops' arguments (docs/p2p.md, "Serving side";
 * docs/protocol.md, "P2P ops"): ObjectKey maps and the group layouts. */
#ifndef LMC_MODULES_P2P_P2P_WIRE_H
#define LMC_MODULES_P2P_P2P_WIRE_H

#include <msgpack.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "storage/object_key.h"

/* An ObjectKey map {chunk_hash: bin, model_name: str, kv_rank: int,
 * object_group_id: int = 0, cache_salt: str = ""}.  0: a valid key; with
 * a model and salt this server holds objects of, `out` owns a reference on
 * each (lmc_keys_drop() it), else `out->model_name` is NULL: no object can
 * match it.  -1: invalid, with the reason in err. */
int lmc_p2p_serve_decode_key(const msgpack_object *o, lmc_key_interner *in,
                             lmc_object_key *out, char *err, size_t errlen);

/* The object size each object group's MemoryLayoutDesc
 * {shapes: [[int]], dtypes: [str]} gives: Σ prod(shape) × itemsize. */
typedef struct lmc_p2p_serve_group_size {
    uint32_t group;
    uint64_t size;
} lmc_p2p_serve_group_size;

/* group_layout_descs: a map int -> MemoryLayoutDesc, or None (no sizes:
 * any object matches).  Fills out[0..*n), at most `cap`.  0, or -1 with
 * the reason in err. */
int lmc_p2p_serve_decode_layouts(const msgpack_object *o, lmc_p2p_serve_group_size *out,
                                 size_t cap, size_t *n, char *err, size_t errlen);

#endif
