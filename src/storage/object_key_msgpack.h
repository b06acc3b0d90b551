/* An ObjectKey as a msgpack map of its five fields by name, chunk_hash as
 * bin: what the P2P ops carry (docs/p2p.md, "The ops") and the payload of
 * a trace's ObjectKey (docs/trace.md, "Format"). */
#ifndef LMC_STORAGE_OBJECT_KEY_MSGPACK_H
#define LMC_STORAGE_OBJECT_KEY_MSGPACK_H

#include <msgpack.h>

#include "storage/object_key.h"

/* {chunk_hash, model_name, kv_rank, object_group_id, cache_salt}, in this
 * order. */
void lmc_object_key_pack_msgpack(msgpack_packer *pk, const lmc_object_key *k);

#endif
