#include "storage/object_key_msgpack.h"

#include <string.h>

static void pack_str(msgpack_packer *pk, const char *s)
{
    size_t n = strlen(s);
    msgpack_pack_str(pk, n);
    msgpack_pack_str_body(pk, s, n);
}

void lmc_object_key_pack_msgpack(msgpack_packer *pk, const lmc_object_key *k)
{
    msgpack_pack_map(pk, 5);
    pack_str(pk, "chunk_hash");
    msgpack_pack_bin(pk, k->chunk_hash_len);
    msgpack_pack_bin_body(pk, k->chunk_hash, k->chunk_hash_len);
    pack_str(pk, "model_name");
    pack_str(pk, k->model_name);
    pack_str(pk, "kv_rank");
    msgpack_pack_uint32(pk, k->kv_rank);
    pack_str(pk, "object_group_id");
    msgpack_pack_uint32(pk, k->object_group_id);
    pack_str(pk, "cache_salt");
    pack_str(pk, k->cache_salt);
}
