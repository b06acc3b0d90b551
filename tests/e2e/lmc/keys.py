"""Key builders: the IPCCacheServerKey every lookup and transfer op names
its chunks with (docs/protocol.md, "Keys"), and the coordinator's key of
one stored object."""


def ipc_key(tokens, start, end, rid, *, model="m", world_size=1, worker_id=None, salt="",
            readers=1, newest=True):
    """An IPCCacheServerKey for tokens[start:end] of request rid.  The field
    order is the newest key's; newest=False leaves out the two fields older
    clients do not send (request_configs, null_chunk_mask)."""
    k = {"model_name": model, "world_size": world_size, "worker_id": worker_id,
         "token_ids": list(tokens), "start": start, "end": end, "request_id": rid,
         "cache_salt": salt, "request_configs": None, "num_kv_readers": readers,
         "null_chunk_mask": None}
    if not newest:
        del k["request_configs"], k["null_chunk_mask"]
    return k


def coord_key(h, salt="", model="m", rank=0):
    """The coordinator's key of one object: its chunk hash h as an int."""
    return {"chunk_hash_hex": f"{h:064x}", "model_name": model, "kv_rank": rank,
            "object_group_id": 0, "cache_salt": salt}


def object_key(chunk_hash, *, model="m", kv_rank=0, group=0, salt=""):
    """An ObjectKey as msgpack carries it between servers (P2P ops 29-31,
    docs/p2p.md): a map of every field, chunk_hash as bytes."""
    return {"chunk_hash": bytes(chunk_hash), "model_name": model, "kv_rank": kv_rank,
            "object_group_id": group, "cache_salt": salt}
