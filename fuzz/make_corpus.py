#!/usr/bin/env python3
"""Writes the seed corpus of the fuzz targets (fuzz/corpus/<target>/), the
inputs the ctest fuzz.<target> replays.  Deterministic: rerunning it
rewrites the same files.  Inputs that libFuzzer finds worth keeping (a crash
reproducer, after the fix) go into the same folders by hand."""
import json
import os
import sys

import msgpack

HERE = os.path.dirname(os.path.abspath(__file__))
CHUNK = 16  # fuzz_ipc_key decodes with chunk size 16


def write(target, name, data):
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


def key(tokens, start, end, rid="r", worker_id=None, world_size=2, model="m", salt="",
        readers=1):
    # Field order of the newest IPCCacheServerKey (docs/protocol.md, "Keys").
    return {"model_name": model, "world_size": world_size, "worker_id": worker_id,
            "token_ids": list(tokens), "start": start, "end": end, "request_id": rid,
            "cache_salt": salt, "request_configs": None, "num_kv_readers": readers,
            "null_chunk_mask": None}


def ipc_keys():
    toks = [(i * 40503) % 128000 for i in range(4 * CHUNK)]
    good = {
        "scheduler": key(toks, 0, 4 * CHUNK),
        "worker": key(toks, CHUNK, 3 * CHUNK, worker_id=1),
        "salted_mla": key(toks, 0, 2 * CHUNK, world_size=1, salt="tenant-a", readers=4),
        "big_ids": key([0, 127, 128, 65535, 65536, 2**32 - 1] * 3, 0, CHUNK),
        "empty_range": key(toks, 0, 0),
        "extra_field": dict(key(toks, 0, CHUNK), future_field=[1, {"x": b"y"}]),
    }
    bad = {
        "unaligned": key(toks, 3, 4 * CHUNK),
        "end_past_tokens": key(toks, 0, 8 * CHUNK),
        "worker_out_of_range": key(toks, 0, CHUNK, worker_id=2),
        "world_zero": key(toks, 0, CHUNK, world_size=0),
        "token_too_big": key([2**32] + toks[1:], 0, CHUNK),
        "negative_token": key([-1] + toks[1:], 0, CHUNK),
        "tokens_not_list": dict(key(toks, 0, CHUNK), token_ids="abc"),
        "missing_model": {k: v for k, v in key(toks, 0, CHUNK).items() if k != "model_name"},
    }
    for name, k in {**good, **bad}.items():
        write("ipc_key", name, msgpack.packb(k))
    # Truncated and as an array instead of a map.
    full = msgpack.packb(good["scheduler"])
    write("ipc_key", "truncated", full[: len(full) // 2])
    write("ipc_key", "as_array", msgpack.packb(list(good["worker"].values())))


def msgpack_frames():
    frames = {
        "int": 5, "neg": -(2**63), "u64": 2**64 - 1, "float": 1.5, "str": "héllo",
        "bin": b"\x00\x01", "nil": None, "bools": [True, False],
        "nested": {"a": [1, {"b": [None, "c", b"d"]}], "e": {}},
        "deep": [[[[[[[[[[[[[[[[0]]]]]]]]]]]]]]]],
        "ext": msgpack.ExtType(1, b"\x01\x02\x03"),
        "key_map": key(range(CHUNK), 0, CHUNK),
    }
    for name, v in frames.items():
        write("msgpack", name, msgpack.packb(v, use_bin_type=True))
    write("msgpack", "array32_huge_claim", b"\xdd\xff\xff\xff\xff\x01")
    write("msgpack", "str32_huge_claim", b"\xdb\x7f\xff\xff\xff")
    write("msgpack", "two_documents", msgpack.packb(1) + msgpack.packb(2))


def object_keys():
    h = "0123456789abcdef" * 4
    texts = {
        "canonical": f"m@00020001@0@{h}",
        "canonical_salt": f"org/model@02000100@1f@{h}@tenant",
        "filename": f"org-SEP-model@0x00020001@0@{h}.data",
        "filename_salt": f"m@0x00020001@ab@{h}@s.data",
        "uppercase_hex": f"m@00020001@0@{h.upper()}",
        "leading_zero_group": f"m@00020001@01@{h}",
        "odd_hash": f"m@00020001@0@{h[:-1]}",
        "slash_in_filename": f"a/b@0x00020001@0@{h}.data",
    }
    for name, t in texts.items():
        write("object_key", name, t)


def l2_specs():
    specs = {
        "fs": {"type": "fs", "base_path": "/tmp/kv", "max_capacity_gb": 10,
               "eviction": {"eviction_policy": "LRU", "trigger_watermark": 0.8,
                            "eviction_ratio": 0.2}},
        "resp": {"type": "resp", "host": "127.0.0.1", "port": 6379, "num_workers": 2},
        "s3": {"type": "s3", "s3_endpoint": "http://127.0.0.1:9000", "disable_tls": True},
        "mock": {"type": "mock", "max_capacity_gb": 1},
        "fault": {"type": "fault_inject", "fail_rate": 0.5, "delay_ms": 3,
                  "inner": {"type": "mock"}},
        "bad_ratio": {"type": "fs", "base_path": "/x", "eviction": {"eviction_ratio": 2}},
        "unknown_type": {"type": "nope"},
        "not_an_object": [1, 2],
    }
    for name, s in specs.items():
        write("l2_json", name, json.dumps(s))


def config_files():
    files = {
        "minimal": {"l1-size-gb": 0.0625, "eviction-policy": "LRU"},
        "underscores": {"l1_size_gb": 1, "eviction_policy": "LRU", "http": False,
                        "max_workers": 2},
        "lists": {"l1-size-gb": 1, "eviction-policy": "LRU",
                  "l2-adapter": [{"type": "fs", "base_path": "/tmp/x"}, {"type": "mock"}],
                  "runtime-plugin-locations": ["/a", "/b"],
                  "runtime-plugin-config": {"k": 1}},
        "secret": {"l1-size-gb": 1, "eviction-policy": "LRU", "http-auth-token": "tok"},
        "placeholder": {"http-auth-token": "***"},
        "nulls": {"l1-size-gb": 1, "eviction-policy": "LRU", "instance-id": None,
                  "shm-name": None},
        "unknown_key": {"l1-sise-gb": 1},
        "wrong_type": {"l1-size-gb": True},
        "out_of_range": {"l1-size-gb": 1, "eviction-policy": "LRU", "port": 70000},
        "not_an_object": [1, 2],
    }
    for name, obj in files.items():
        write("config_file", name, json.dumps(obj))
    write("config_file", "duplicate", '{"port": 1, "port": 2}')
    write("config_file", "truncated", '{"port": 1,')


# fuzz_rpc: records [n_frames][len16 LE, bytes]...; frames are uid, op, payload.
REG, UNREG, PSTORE, CSTORE, PRETR, CRETR = 14, 15, 16, 17, 18, 19
SD_REG, SD_UNREG, SD_STORE = 1, 2, 6
LOOKUP, QUERY, WAIT, HITS, FREE, END, CLEAR, GET_CS, PING, REPORT = 8, 9, 10, 11, 12, 13, 20, 21, 22, 23
P2P_LOCK, P2P_QUERY, P2P_UNLOCK = 29, 30, 31
GET_EXP, POLL_KV = 32, 34


def message(uid, op, *payload):
    frames = [msgpack.packb(uid), msgpack.packb(op)] + [
        p if isinstance(p, bytes) and p[:1] == b"\x00" else msgpack.packb(p) for p in payload]
    out = bytes([len(frames)])
    for f in frames:
        out += len(f).to_bytes(2, "little") + f
    return out


def registration(instance_id, world_size=2, model="m"):
    # Tiny objects: 2 x 2 layers x 16 tokens x 8 hidden x float16 = 1 KiB.
    return {"instance_id": instance_id, "model_name": model, "world_size": world_size,
            "block_size": CHUNK, "num_layers": 2, "hidden_dim_size": 8,
            "dtype_str": "float16", "use_mla": False, "num_physical_slots": None,
            "engine_group_infos": [], "group_hidden_dim_sizes": None,
            "group_layout_descs": None, "enable_l1_kvweave_quant": False}


def group_registration(instance_id):
    # A hybrid model (docs/protocol.md, "Engine-driven multi-group layouts"):
    # a full-attention group and a one-chunk sliding window of half a chunk.
    def kg(i, layers, slots):
        return {"kernel_group_id": i, "engine_group_id": i, "layer_indices": layers,
                "blocks_per_chunk": 1, "blocks_per_window": 1,
                "slots_per_chunk_in_window": slots, "kv_size": 2, "num_layers": len(layers),
                "hidden_dim_size": 8, "slots_per_block": slots, "tokens_per_block": slots,
                "dtype_str": "float16", "engine_kv_format_int": 1}
    p = registration(instance_id, world_size=1, model="hy")
    p.update(engine_group_infos=[{"engine_group_id": 0, "layer_indices": [0, 1]},
                                 {"engine_group_id": 1, "layer_indices": [2]}],
             object_group_layout_shapes=[[[2, 2, CHUNK, 8]], [[2, 1, CHUNK // 2, 8]]],
             object_group_layout_dtype_strs=[["float16"], ["float16"]],
             num_chunks_in_sw=[-1, 1],
             transfer_metadata_wire={
                 "num_chunks_in_sw": [-1, 1], "tokens_per_chunk": CHUNK,
                 "kernel_groups": [kg(0, [0, 1], CHUNK), kg(1, [2], CHUNK // 2)],
                 "object_groups": [
                     {"object_group_id": 0, "kernel_group_ids": [0], "sw_size_chunks": -1},
                     {"object_group_id": 1, "kernel_group_ids": [1], "sw_size_chunks": 1}]})
    return p


def sd_registration(instance_id, infos):
    """REGISTER_KV_CACHE of two CPU shared-memory layers (segments that do
    not exist: the plan is built, then mapping fails) with engine group
    infos (docs/protocol.md, "Kernel groups and object groups")."""
    sys.path.insert(0, os.path.join(HERE, "..", "tests", "pickles"))
    import wrappers as w
    handles = [msgpack.ExtType(1, w.dumps(w.cpu_shm(f"/lmcache_fuzz_missing_{i}",
                                                      [2, 8, 8, 2, 8])))
               for i in range(2)]
    return [instance_id, handles, "sd", 1, "vllm", {"kv_layout": "NHD"}, infos]


def rpc_flows():
    toks = list(range(100, 100 + 4 * CHUNK))
    sched = key(toks, 0, 4 * CHUNK, "q")
    w0 = key(toks, 0, 4 * CHUNK, "q", worker_id=0)
    w1 = key(toks, 0, 2 * CHUNK, "q", worker_id=1)
    p2p_keys = [{"chunk_hash": bytes([c]) * 32, "model_name": "m", "kv_rank": 0x01000100,
                 "object_group_id": 0, "cache_salt": ""} for c in range(4)]
    flows = {
        "store_lookup_retrieve": [
            message(1, REG, registration(7)), message(2, PSTORE, w0, 7),
            message(3, CSTORE, w0, 7, b""), message(4, LOOKUP, sched, 1),
            message(5, QUERY, "q"), message(6, PRETR, w0, 7), message(7, CRETR, w0, 7),
            message(8, FREE, sched, 1), message(9, END, "q")],
        "lookup_wait_hits": [
            message(1, LOOKUP, sched, 2), message(2, WAIT, "q", 0.05),
            message(3, HITS, "q"), message(4, END, "q", {"hit": 1})],
        "two_ranks_unregister": [
            message(1, REG, registration(8)), message(2, REG, registration(9)),
            message(3, PSTORE, w0, 8), message(4, PSTORE, w1, 9),
            message(5, UNREG, 8), message(6, CSTORE, w1, 9, b""), message(7, PING, 9)],
        "multi_group_store_retrieve": [
            message(1, REG, group_registration(11)),
            message(2, PSTORE, key(toks, 0, 4 * CHUNK, "g", worker_id=0, world_size=1,
                                   model="hy"), 11),
            message(3, CSTORE, key(toks, 0, 4 * CHUNK, "g", worker_id=0, world_size=1,
                                   model="hy"), 11, b""),
            message(4, LOOKUP, key(toks, 0, 4 * CHUNK, "g", world_size=1, model="hy"), 1),
            message(5, PRETR, key(toks, 0, 4 * CHUNK, "g", worker_id=0, world_size=1,
                                  model="hy"), 11),
            message(6, CRETR, key(toks, 0, 4 * CHUNK, "g", worker_id=0, world_size=1,
                                  model="hy"), 11)],
        "server_driven_split_blocks": [
            message(1, SD_REG, *sd_registration(21, [
                {"engine_group_id": 0, "layer_indices": [0, 1], "tokens_per_block": 16,
                 "sw_size_tokens": -1, "physical_blocks_per_engine_block": 2,
                 "null_block_id": -1}])),
            message(2, SD_REG, *sd_registration(22, [
                {"engine_group_id": 0, "layer_indices": [0, 1], "tokens_per_block": 16,
                 "physical_blocks_per_engine_block": 3}])),
            message(3, SD_STORE, w0, 21, [[2, 3, 4, 5]], b""),
            message(4, SD_UNREG, 21)],
        "commit_without_prepare": [
            message(1, CSTORE, w0, 7, b""), message(2, CRETR, w0, 7),
            message(3, CSTORE, w0, 7, b"pickled")],
        "management": [
            message(1, GET_CS), message(2, PING, None), message(3, CLEAR, True),
            message(4, CLEAR), message(5, REPORT, 7, "m",
                                       [{"req_id": "q", "new_block_ids": [1, 2],
                                         "new_token_ids": toks[:4]}])],
        # docs/p2p.md, "Serving side": the chunk hashes are not this
        # server's (blake3 of the tokens), so mutations find the hits.
        "p2p_lease_query_unlock": [
            message(1, REG, registration(12, world_size=1)),
            message(2, PSTORE, key(toks, 0, 4 * CHUNK, "p", worker_id=0, world_size=1), 12),
            message(3, CSTORE, key(toks, 0, 4 * CHUNK, "p", worker_id=0, world_size=1), 12,
                    b""),
            message(4, P2P_LOCK, p2p_keys, {0: {"shapes": [[2, 2, CHUNK, 8]],
                                                "dtypes": ["float16"]}}),
            message(5, P2P_QUERY, 1), message(6, P2P_QUERY, 1),
            message(7, P2P_LOCK, p2p_keys[:1], None), message(8, P2P_UNLOCK, p2p_keys),
            message(9, P2P_LOCK, [{"chunk_hash": "x"}], [1]), message(10, P2P_QUERY, "1")],
        # docs/kv_events.md: a store the log records, then polls good and bad.
        "kv_events_store_poll": [
            message(1, REG, registration(13, world_size=1)),
            message(2, PSTORE, key(toks, 0, 4 * CHUNK, "k", worker_id=0, world_size=1), 13),
            message(3, CSTORE, key(toks, 0, 4 * CHUNK, "k", worker_id=0, world_size=1), 13,
                    b""),
            message(4, GET_EXP), message(5, POLL_KV, "m", 0, 2), message(6, POLL_KV, "m", 2, 1024),
            message(7, POLL_KV, "m", 99, 1), message(8, POLL_KV, "m", -1, 0),
            message(9, "poll_kv_events", "x", 0, 10**12)],
        "op_by_name_and_bad_frames": [
            message(1, "lookup", sched, 1), bytes([1, 1, 0, 0x01]),
            bytes([2, 1, 0, 0x05, 1, 0, 0xc1]), message(b"raw-uid", 24)],
    }
    for name, msgs in flows.items():
        write("rpc", name, b"".join(msgs))


# fuzz_http: [method index][path]\n[header lines]\n\n[body]
GET_, POST_, PUT_, DELETE_, HEAD_, PATCH_ = range(6)


def http_request(method, path, body=b"", headers=()):
    if isinstance(body, (dict, list)):
        body = json.dumps(body).encode()
    elif isinstance(body, str):
        body = body.encode()
    return (bytes([method]) + path.encode() + b"\n" + "\n".join(headers).encode() + b"\n\n"
            + body)


def http_requests():
    toks = list(range(100, 100 + 2 * CHUNK))
    key = {"model_name": "m", "kv_rank": 0, "object_group_id": 0,
           "chunk_hash": "00" * 32, "cache_salt": ""}
    reqs = {
        "health": http_request(GET_, "/healthcheck"),
        "status": http_request(GET_, "/status"),
        "pressure": http_request(GET_, "/status/memory-pressure"),
        "config": http_request(GET_, "/config"),
        "metrics": http_request(GET_, "/metrics"),
        "threads": http_request(GET_, "/threads?name=lmc&tid=1"),
        "clear": http_request(POST_, "/cache/clear", {"force": True}),
        "clear_legacy": http_request(POST_, "/clear-cache", "force=true"),
        "quota_put": http_request(PUT_, "/quota/tenant-a", {"limit_gb": 1.5}),
        "quota_get": http_request(GET_, "/api/quota/tenant-a"),
        "quota_delete": http_request(DELETE_, "/quota/tenant-a"),
        "quota_list": http_request(GET_, "/quota"),
        "objects_list": http_request(GET_, "/cache/objects?tier=l2&page_size=5"),
        "objects_delete": http_request(DELETE_, "/cache/objects",
                                       {"keys": [key], "tier": "all", "force": False}),
        "prefetch": http_request(POST_, "/cache/prefetches",
                                 {"model_name": "m", "world_size": 1, "token_ids": toks,
                                  "cache_salt": "", "source_tier": "l2", "target_tier": "l1"}),
        "prefetch_query": http_request(GET_, "/cache/prefetches/abc"),
        "kv_store": http_request(POST_, "/api/kv/store", b"\x01" * 2048,
                                 ["X-LMCache-Model-Name: m",
                                  "X-LMCache-Tokens: " + ",".join(map(str, toks)),
                                  "Content-Type: application/x-lmcache-kv; v=1"]),
        "kv_lookup": http_request(POST_, "/api/kv/lookup",
                                  {"model_name": "m", "tokens": toks, "cache_salt": ""}),
        "kv_retrieve": http_request(POST_, "/api/kv/retrieve",
                                    {"model_name": "m", "tokens": toks}),
        "policies": http_request(PATCH_, "/config/policies", {"l1_eviction": {"policy": "LRU"}}),
        "reconfigure": http_request(POST_, "/reconfigure/l2/fs/add", {"adapter_index": 0}),
        "bad_json": http_request(PUT_, "/quota/x", "{\"limit_gb\": "),
        "head_version": http_request(HEAD_, "/version"),
    }
    for name, r in reqs.items():
        write("http", name, r)


def pickles():
    """Tensor-wrapper pickles from tests/pickles (Python's own pickle over
    stand-ins of upstream's classes), good and hostile."""
    sys.path.insert(0, os.path.join(HERE, "..", "tests", "pickles"))
    import gen_vectors
    good, bad = gen_vectors.vectors()
    for name, data in list(good.items()) + list(bad.items()):
        write("pickle", name, data)


def event_batch(seq, etype="store", tier="l2", backend="fs", entries=None, **extra):
    b = {"instance_id": "node-a", "incarnation": 1700000000, "seq": seq, "event_type": etype,
         "tier": tier, "backend": backend, "shared": True, "ts": 1700000000.25,
         "entries": entries if entries is not None else [], "capacity_bytes": 0,
         "capacity_revision": 0}
    b.update(extra)
    return b


def event_entry(h, size=4096, model="m", salt="", rank=0, tokens=()):
    return {"key": {"chunk_hash_hex": f"{h:064x}", "model_name": model, "kv_rank": rank,
                    "object_group_id": 0, "cache_salt": salt},
            "size_bytes": size, "token_ids": list(tokens), "token_offset": -1}


def coord_events():
    """POST /events bodies for fuzz_coord_events: what lmcached sends, the
    refusals of docs/coordinator.md ("Cache events"), and JSON the pull
    parser must take or refuse as jansson does."""
    store = event_batch(1, entries=[event_entry(1), event_entry(2, salt="tenant-x")])
    without = lambda field: {k: v for k, v in store.items() if k != field}  # noqa: E731
    bodies = {
        "store_l2": [store],
        "stream": [event_batch(1, "config", "l1", "dram", capacity_bytes=1 << 30,
                               capacity_revision=1),
                   event_batch(2, "store", "l1", "dram", [event_entry(3, 512)], shared=False),
                   event_batch(3, "access", "l1", "", [event_entry(3, 0)]),
                   event_batch(4, "delete", "l2", "fs", [event_entry(1, 0)]),
                   event_batch(2, "store", "l2", "fs", [event_entry(4)])],   # a duplicate
        "new_incarnation": [event_batch(9, "store", "l1", "dram", [event_entry(5)]),
                            dict(event_batch(1, "access", "l1", "", [event_entry(5, 0)]),
                                 incarnation=1700000001),
                            event_batch(10, "store", "l1", "dram", [event_entry(6)])],
        "tokens_and_ranks": [event_batch(1, entries=[event_entry(7, rank=0x02010201,
                                                                 tokens=range(0, 64, 3))])],
        "access_without_backend": [without("backend") | {"event_type": "access"}],
        "missing_event_type": [without("event_type")],
        "missing_tier": [without("tier")],
        "missing_instance_id": [without("instance_id")],
        "missing_entries": [without("entries")],
        "event_type_number": [dict(store, event_type=1)],
        "event_type_list": [dict(store, event_type=["store"])],
        "tier_null": [dict(store, tier=None)],
        "empty_backend": [dict(store, backend="")],
        "config_with_entries": [dict(store, event_type="config")],
        "store_without_size": [dict(store, entries=[{"key": event_entry(1)["key"]}])],
        "bad_hash": [dict(store, entries=[dict(event_entry(1), key=dict(
            event_entry(1)["key"], chunk_hash_hex="ABZ"))])],
        "model_with_at": [event_batch(1, entries=[event_entry(1, model="a@b")])],
    }
    for name, batches in bodies.items():
        write("coord_events", name, json.dumps({"batches": batches}))
    raw = {
        "escapes": '{"batches": [{"instance_id": "\\u006e\\/a", "incarnation": 0, "seq": 1, '
                   '"event_type": "st\\u006fre", "tier": "l2", "backend": "caf\u00e9", '
                   '"entries": []}], "x": "\\ud83d\\ude00"}',
        "long_real": '{"batches": [], "x": 0.' + "0" * 80 + '1}',
        "long_integer": '{"batches": [], "x": ' + "9" * 40 + '}',
        "nested_64": '{"batches": [], "x": ' + "[" * 63 + "]" * 63 + '}',
        "nested_65": '{"batches": [], "x": ' + "[" * 65 + "]" * 65 + '}',
        "lone_surrogate": '{"batches": [], "x": "\\ud800"}',
        "escaped_nul": '{"batches": [], "x": "\\u0000"}',
        "trailing_data": '{"batches": []} {}',
        "duplicate_member": '{"batches": [], "batches": [{"seq": 1}]}',
        "scalar": '"batches"',
        "truncated": json.dumps({"batches": [store]})[:97],
    }
    for name, text in raw.items():
        write("coord_events", name, text.encode("utf-8", "surrogatepass"))
    write("coord_events", "invalid_utf8", b'{"batches": [], "x": "\xc3\x28 \xed\xa0\x80"}')
    l2_usage()


def l2_usage():
    """POST /l2/events bodies (the older L2 usage stream, docs/coordinator.md
    "L2 usage events"), fed to the same target: what lmcached's reporter
    sends, and its refusals."""
    key = event_entry(1)["key"]
    salted = event_entry(2, salt="tenant-x")["key"]
    body = {"instance_id": "node-a", "seq": 1, "tier": "l2",
            "events": [{"type": "store", "key": key, "bytes": 4096},
                       {"type": "store", "key": salted, "bytes": 8192},
                       {"type": "lookup", "key": key, "bytes": 0},
                       {"type": "store", "key": key, "bytes": 2048}]}
    bodies = {
        "l2_usage": body,
        "l2_usage_no_tier": {k: v for k, v in body.items() if k != "tier"},
        "l2_usage_tier_l1": dict(body, tier="l1"),
        "l2_usage_delete": dict(body, events=[{"type": "delete", "key": key}]),
        "l2_usage_store_without_bytes": dict(body, events=[{"type": "store", "key": key}]),
        "l2_usage_negative_seq": dict(body, seq=-1),
        "l2_usage_events_object": dict(body, events={}),
        "l2_usage_bad_key": dict(body, events=[{"type": "lookup", "key": dict(key, kv_rank=-1)}]),
    }
    for name, b in bodies.items():
        write("coord_events", name, json.dumps(b))


def p2p_wire():
    """fuzz_p2p_wire: byte 0 even, a client's bytes to the server (its
    arena is 4 KiB, 16 items a request); odd, a server's answer to the
    client's three-item read of 1, 17 and 100 bytes (docs/p2p.md)."""
    import struct
    magic = b"LMTCP001"

    def req(rid, items):
        return struct.pack("<III", 1, rid, len(items)) + b"".join(
            struct.pack("<qq", o, n) for o, n in items)

    def resp(rid, n, mask, body):
        return struct.pack("<IIII", 2, rid, n, (n + 7) // 8) + bytes([mask]) + body

    write("p2p_wire", "server_two_requests",
          b"\0" + magic + req(1, [(0, 16), (64, 100)]) + req(2, [(4000, 96), (1, 8)]))
    write("p2p_wire", "server_refusals",
          b"\0" + magic + req(3, [(4090, 16), (-1, 4), (2, 1 << 62), (0, 0), (10, 2)]))
    write("p2p_wire", "server_bad_magic", b"\0LMTCP002" + req(1, [(0, 1)]))
    write("p2p_wire", "server_too_many", b"\0" + magic + req(1, [(0, 1)] * 17))
    write("p2p_wire", "server_short_items", b"\0" + magic + req(1, [(0, 1), (8, 8)])[:30])
    body = bytes(range(118))
    write("p2p_wire", "client_all", b"\1" + magic + resp(0, 3, 0x7, body))
    write("p2p_wire", "client_some", b"\1" + magic + resp(0, 3, 0x5, body[:101]))
    write("p2p_wire", "client_wrong_id", b"\1" + magic + resp(9, 3, 0x7, body))
    write("p2p_wire", "client_short", b"\1" + magic + resp(0, 3, 0x7, body[:50]))
    write("p2p_wire", "client_bad_magic", b"\1LMTCPXXX" + resp(0, 3, 0x7, body))
    # The ucx engine's bootstrap answer (docs/p2p.md, "ucx"), as a client
    # would read it: base, size, worker address and remote key lengths.
    write("p2p_wire", "ucx_bootstrap",
          b"\1LMUCX001" + struct.pack("<QQII", 1 << 40, 1 << 30, 5, 3) + b"addrsrk")


def trace_frames():
    """fuzz_trace: one frame body each, headers and records in upstream's
    trace format (docs/trace.md)."""
    import hashlib
    prefix = "lmcache.v1.distributed.storage_manager.StorageManager."

    def key(i, salt=""):
        v = {"chunk_hash": hashlib.sha256(b"%d" % i).digest(), "model_name": "org/m",
             "kv_rank": 0x02000200, "object_group_id": i % 2}
        if salt is not None:
            v["cache_salt"] = salt
        return {"__t__": "ObjectKey", "v": v}

    def layout(shapes, dtypes):
        return {"__t__": "MemoryLayoutDesc", "v": {"shapes": shapes, "dtypes": dtypes}}

    def rec(method, **args):
        return msgpack.packb({"type": "record", "t_mono": 0.5, "t_wall": 1.7e9,
                              "qualname": prefix + method, "args": args}, use_bin_type=True)

    hdr = {"type": "header", "magic": b"LMCT", "format_version": 1, "level": "storage",
           "trace_schema_version": 2, "t_mono_start": 1.5, "t_wall_start": 2.0,
           "sm_config_json": "{}", "sm_config_digest": hashlib.sha256(b"{}").hexdigest()}
    write("trace", "header_schema2", msgpack.packb(hdr, use_bin_type=True))
    old = {k: v for k, v in hdr.items() if k != "trace_schema_version"}
    old["lmcache_version"] = "0.3.9"
    write("trace", "header_schema1", msgpack.packb(old, use_bin_type=True))
    write("trace", "header_bad_magic", msgpack.packb(dict(hdr, magic=b"LMCX"),
                                                     use_bin_type=True))
    ks = [key(i) for i in range(3)]
    write("trace", "reserve_write", rec("reserve_write", keys=ks,
                                        layout_desc=layout([[4, 8], [16]],
                                                           ["torch.bfloat16", "torch.int64"])))
    write("trace", "reserve_overflow", rec("reserve_write", keys=ks[:1],
                                           layout_desc=layout([[2**40, 2**30]], ["torch.float64"])))
    write("trace", "reserve_bad_dtype", rec("reserve_write", keys=ks[:1],
                                            layout_desc=layout([[4]], ["torch.complex64"])))
    write("trace", "finish_write_schema1", rec("finish_write", keys=[key(1, None)]))
    write("trace", "abort_write", rec("abort_write", keys=ks[1:]))
    write("trace", "submit_prefetch_task",
          rec("submit_prefetch_task", keys=ks, layout_desc=layout([[8]], ["torch.uint8"]),
              extra_count=0, external_request_id="r1",
              policy={"__t__": "TrimPolicy", "v": "PREFIX"}))
    write("trace", "finish_read_prefetched", rec("finish_read_prefetched", keys=ks,
                                                 extra_count=1))
    write("trace", "read_enter", rec("read_prefetched_results.__enter__", keys=ks))
    write("trace", "read_exit", rec("read_prefetched_results.__exit__", keys=ks))
    write("trace", "other_method", rec("close"))
    write("trace", "bad_key", rec("finish_write", keys=[{"__t__": "ObjectKey",
                                                         "v": {"chunk_hash": b"x" * 33}}]))


def blend_wire():
    """fuzz_blend_wire: byte 0 picks the RPC (% 5: handshake, register_rope,
    unregister_rope, unified_lookup, retrieve_pre_computed), then the payload
    frames, one msgpack value each (docs/cacheblend.md "Blend RPCs on the
    wire")."""
    def frames(op, *payload):
        return bytes([op]) + b"".join(msgpack.packb(p) for p in payload)

    def cache(rows, rot):  # a cos/sin cache as lmcache >= 0.5.6 describes it
        desc = {"type": "cuda_raw", "version": 1,
                "metadata": {"dtype": "float32", "shape": [rows, rot], "stride": [rot, 1],
                             "storage_offset": 0, "device_uuid": "GPU-0"},
                "ipc_handle": b"\x11" * 64, "alloc_offset": 0, "nbytes": rows * rot * 4}
        return msgpack.ExtType(1, msgpack.packb(desc))

    def match(old, cur, h=b"\xab" * 32, **extra):
        return {"old_st": old, "old_ed": old + CHUNK, "cur_st": cur, "cur_ed": cur + CHUNK,
                "hash": h, **extra}

    toks = [(i * 7919) % 128000 for i in range(4 * CHUNK)]
    write("blend_wire", "handshake_v1", frames(0, 1))
    write("blend_wire", "handshake_v2", frames(0, 2))
    write("blend_wire", "register_rope_dual", frames(
        1, 3, [cache(4096, 128), cache(8192, 64)], 128, True, [0, 1, -1],
        [[512, 64], [], [0, 128]]))
    write("blend_wire", "register_rope_legacy4", frames(1, 3, [cache(2048, 64)], 64, False))
    write("blend_wire", "register_rope_single_handle", frames(1, 0, cache(16, 2), 2, True, []))
    write("blend_wire", "register_rope_bad_group", frames(1, 3, [cache(16, 4)], 4, True, [1]))
    write("blend_wire", "unregister_rope", frames(2, 3))
    write("blend_wire", "unified_lookup", frames(3, key(toks, 0, 4 * CHUNK, readers=2), 2))
    write("blend_wire", "unified_lookup_no_tp", frames(3, key(toks, 0, 2 * CHUNK)))
    ret = key(toks, 0, 4 * CHUNK, worker_id=1)
    write("blend_wire", "retrieve", frames(
        4, ret, [match(32, 0, predecessor_hash=None), match(48, 16, predecessor_hash=b"\1" * 32)],
        [[5, 6, 7], []], 3, b"\xee" * 64))
    write("blend_wire", "retrieve_cpu", frames(4, ret, [match(0, 0)], [[1]], 0, b""))
    write("blend_wire", "retrieve_bad_chunk", frames(
        4, ret, [{**match(0, 16), "old_ed": 17}], [[1]], 0, b""))
    write("blend_wire", "retrieve_flat_blocks", frames(4, ret, [], [1, 2], 0, b""))


def coord_blend():
    """fuzz_coord_blend: POST /directory/blend-lookup bodies (docs/coordinator.md,
    "Blend lookup") over an index of [1, 2, 3, 4] and [65, 66, 67, 68]."""
    import base64
    import struct
    ns = {"model_name": "m", "world_size": 1, "cache_salt": ""}

    def b64(tokens):
        return base64.b64encode(struct.pack(f"<{len(tokens)}I", *tokens)).decode()
    write("coord_blend", "ids_both", json.dumps({**ns, "token_ids": [9, 1, 2, 3, 4, 7, 65, 66, 67, 68]}))
    write("coord_blend", "b64_shifted", json.dumps({**ns, "tokens_b64": b64([0, 0, 65, 66, 67, 68, 1, 2, 3, 4])}))
    write("coord_blend", "b64_bad_padding", json.dumps({**ns, "tokens_b64": "AQAAAA"}))
    write("coord_blend", "b64_odd_bytes", json.dumps({**ns, "tokens_b64": "AQID"}))
    write("coord_blend", "other_namespace", json.dumps({**ns, "world_size": 2, "token_ids": [1, 2, 3, 4]}))
    write("coord_blend", "negative_token", json.dumps({**ns, "token_ids": [1, -2]}))
    write("coord_blend", "not_an_object", "[1, 2, 3]")
    write("coord_blend", "no_tokens", json.dumps(ns))


if __name__ == "__main__":
    coord_blend()
    blend_wire()
    trace_frames()
    p2p_wire()
    coord_events()
    pickles()
    http_requests()
    ipc_keys()
    msgpack_frames()
    object_keys()
    l2_specs()
    config_files()
    rpc_flows()
