"""Multi-group engine-driven registrations (docs/protocol.md, "Engine-driven
multi-group layouts"): a hybrid model's worker registers its object groups
and transfer metadata, PREPARE_STORE hands it one slot per kernel group of
every chunk object it must write, PREPARE_RETRIEVE the ones it reads (a
sliding-window group only its last chunks), and the objects are the very
ones the server-driven path stores for the same model.  Also: every
refusal of an inconsistent registration, with the server still serving."""
import copy
import functools
import hashlib
import json
import mmap
import os
import time

import msgpack
import pytest

from lmc.client import lookup as lmc_lookup
from lmc.client import unpack
from lmc.ops import (CLEAR, COMMIT_RETRIEVE, COMMIT_STORE, LOOKUP, NOOP, PREPARE_RETRIEVE,
                     PREPARE_STORE, REGISTER_KV_CACHE_ENGINE_DRIVEN_CONTEXT, WAIT_PREFETCH_STATUS)
from paged_kv import PagedKV
from test_server_driven import ZEROS, Engine, info, key, prompt, status

CS = 64
SERVER_ARGS = ("--chunk-size", str(CS))      # the srv fixture's (conftest.py)
ITEM = {"float16": 2, "bfloat16": 2, "float32": 4}


def kg(i, eg, layers, kv, slots, hidden, bs, dtype="float16", fmt=1):
    """One KernelGroupTransferMetadataWire (fields in declaration order)."""
    return {"kernel_group_id": i, "engine_group_id": eg, "layer_indices": layers,
            "blocks_per_chunk": CS // bs, "blocks_per_window": slots // bs,
            "slots_per_chunk_in_window": slots, "kv_size": kv, "num_layers": len(layers),
            "hidden_dim_size": hidden, "slots_per_block": bs, "tokens_per_block": bs,
            "dtype_str": dtype, "engine_kv_format_int": fmt}


def og(i, members, sw):
    return {"object_group_id": i, "kernel_group_ids": members, "sw_size_chunks": sw}


def shape(k, drop_plane=False):
    s = [k["kv_size"], k["num_layers"], k["slots_per_chunk_in_window"], k["hidden_dim_size"]]
    return s[1:] if drop_plane and k["kv_size"] == 1 else s


def registration(instance, kgs, ogs, model="hy", infos=None, drop_plane=True, world_size=1):
    """The newest client's payload: flat fields of kernel group 0, then the
    object-group fields (upstream's worker, "Step 3")."""
    kgs, ogs = copy.deepcopy(kgs), copy.deepcopy(ogs)
    sw = [o["sw_size_chunks"] for o in ogs]
    k0 = kgs[0]
    return {"instance_id": instance, "model_name": model, "world_size": world_size,
            "block_size": k0["slots_per_block"], "num_layers": k0["num_layers"],
            "hidden_dim_size": k0["hidden_dim_size"], "dtype_str": k0["dtype_str"],
            "use_mla": k0["kv_size"] == 1,
            "engine_group_infos": infos if infos is not None else [
                {"engine_group_id": e, "layer_indices":
                 [l for k in kgs if k["engine_group_id"] == e for l in k["layer_indices"]]}
                for e in dict.fromkeys(k["engine_group_id"] for k in kgs)],
            "object_group_layout_shapes": [[shape(kgs[m], drop_plane)
                                            for m in o["kernel_group_ids"]] for o in ogs],
            "object_group_layout_dtype_strs": [[kgs[m]["dtype_str"]
                                                for m in o["kernel_group_ids"]] for o in ogs],
            "num_chunks_in_sw": sw,
            "transfer_metadata_wire": {"num_chunks_in_sw": sw, "tokens_per_chunk": CS,
                                       "kernel_groups": kgs, "object_groups": ogs}}


# A hybrid model: two full-attention kernel groups of different head sizes
# in object group 0, a sub-chunk sliding window (32 of 64 tokens) in group
# 1, a single-plane (MLA-like) bf16 group in object group 2.
HYBRID_KGS = [kg(0, 0, [0, 1], 2, CS, 16, 16), kg(1, 0, [2], 2, CS, 8, 16),
              kg(2, 1, [3, 4], 2, 32, 8, 16), kg(3, 2, [5], 1, CS, 24, 16, "bfloat16", 3)]
HYBRID_OGS = [og(0, [0, 1], -1), og(1, [2], 1), og(2, [3], -1)]


def entry_bytes(k):
    n = ITEM[k["dtype_str"]]
    for d in shape(k):
        n *= d
    return n


def fill(tag, n):
    seed = hashlib.sha256(repr(tag).encode()).digest()
    return (seed * (n // len(seed) + 1))[:n]


class GroupWorker:
    """A multi-group engine-driven worker: maps the pool, fills slots."""

    def __init__(self, srv, payload, rank=0):
        self.d, self.id, self.model = srv.dealer(), payload["instance_id"], payload["model_name"]
        self.rank, self.world = rank, payload["world_size"]
        self.kgs = payload["transfer_metadata_wire"]["kernel_groups"]
        self.ogs = payload["transfer_metadata_wire"]["object_groups"]
        self.shapes = payload["object_group_layout_shapes"]
        self.reply = unpack(self.d.call(REGISTER_KV_CACHE_ENGINE_DRIVEN_CONTEXT, payload))
        assert "error" not in self.reply, self.reply
        fd = os.open("/dev/shm/" + self.reply["shm_name"], os.O_RDWR)
        self.pool = mmap.mmap(fd, self.reply["pool_size"])
        os.close(fd)

    def key(self, tokens, start, end, rid):
        return key(tokens, start, end, rid, worker_id=self.rank, world_size=self.world,
                   model=self.model)

    def check_context(self, ctx):
        assert [g["object_group_id"] for g in ctx["object_groups"]] == list(range(len(self.ogs)))
        for g, o in zip(ctx["object_groups"], self.ogs):
            assert len(g["slots"]) == len(g["chunk_indices"])
            assert g["chunk_indices"] == sorted(set(g["chunk_indices"]))
            for slots in g["slots"]:
                assert len(slots) == len(o["kernel_group_ids"])
                for s, m, shp in zip(slots, o["kernel_group_ids"],
                                     self.shapes[o["object_group_id"]]):
                    k = self.kgs[m]
                    assert s["shape"] == shp and s["dtype"] == k["dtype_str"]
                    assert s["length"] == entry_bytes(k)
                    assert 0 <= s["offset"] and s["offset"] + s["length"] <= len(self.pool)
                # one object: the entries back to back, in member order
                for a, b in zip(slots, slots[1:]):
                    assert b["offset"] == a["offset"] + a["length"]

    def store(self, tokens, start, end, data, rid="s"):
        """data(og, chunk, entry, length) -> bytes.  Returns the context."""
        k = self.key(tokens, start, end, rid)
        ctx = unpack(self.d.call(PREPARE_STORE, k, self.id))["context"]
        self.check_context(ctx)
        for g in ctx["object_groups"]:
            for c, slots in zip(g["chunk_indices"], g["slots"]):
                for e, s in enumerate(slots):
                    b = data(g["object_group_id"], start // CS + c, e, s["length"])
                    self.pool[s["offset"]:s["offset"] + s["length"]] = b
        if any(g["chunk_indices"] for g in ctx["object_groups"]):
            assert unpack(self.d.call(COMMIT_STORE, k, self.id, b"")) is True
        return ctx

    def retrieve(self, tokens, start, end, rid):
        """{(og, chunk): [entry bytes]}, or None when not a hit."""
        k = self.key(tokens, start, end, rid)
        r = unpack(self.d.call(PREPARE_RETRIEVE, k, self.id))
        if not r["success"]:
            assert r["context"] == {}
            return None
        self.check_context(r["context"])
        out = {}
        for g in r["context"]["object_groups"]:
            for c, slots in zip(g["chunk_indices"], g["slots"]):
                out[(g["object_group_id"], start // CS + c)] = [
                    bytes(self.pool[s["offset"]:s["offset"] + s["length"]]) for s in slots]
        assert unpack(self.d.call(COMMIT_RETRIEVE, k, self.id)) is True
        return out

    def close(self):
        self.pool.close()
        self.d.close()


# LOOKUP at this module's chunk size, its hybrid model by default.
lookup = functools.partial(lmc_lookup, model="hy", cs=CS)


def test_hybrid_model_stores_looks_up_and_retrieves(srv):
    w = GroupWorker(srv, registration(41, HYBRID_KGS, HYBRID_OGS))
    toks = prompt(1, n_chunks=4, cs=CS)
    ctx = w.store(toks, 0, 4 * CS, lambda g, c, e, n: fill(("a", g, c, e), n))
    assert [g["chunk_indices"] for g in ctx["object_groups"]] == [[0, 1, 2, 3]] * 3
    assert lookup(srv, toks, "r") == 4
    got = w.retrieve(toks, 0, 4 * CS, "r")
    # the window group reads only the last chunk; the others every chunk
    assert sorted(got) == sorted([(0, c) for c in range(4)] + [(1, 3)] + [(2, c) for c in range(4)])
    for (g, c), entries in got.items():
        assert entries == [fill(("a", g, c, e), len(b)) for e, b in enumerate(entries)]
    # what is there already is not handed out again, in any group
    again = w.store(toks, 0, 4 * CS, lambda g, c, e, n: b"\xff" * n)
    assert [g["chunk_indices"] for g in again["object_groups"]] == [[], [], []]
    # a longer prompt stores only its new chunk, and hits its whole prefix
    longer = toks + prompt(2, n_chunks=1, cs=CS)
    more = w.store(longer, 0, 5 * CS, lambda g, c, e, n: fill(("a", g, c, e), n))
    assert [g["chunk_indices"] for g in more["object_groups"]] == [[4]] * 3
    assert lookup(srv, longer, "r2") == 5
    got = w.retrieve(longer, 0, 5 * CS, "r2")
    assert (1, 4) in got and (1, 3) not in got and len(got) == 11
    w.close()


def test_two_tensor_parallel_ranks(srv):
    """Each rank stores and retrieves its own objects of every group; the
    scheduler's LOOKUP hits only where both ranks stored."""
    ws = [GroupWorker(srv, registration(80 + r, HYBRID_KGS, HYBRID_OGS, model="tp",
                                        world_size=2), rank=r) for r in range(2)]
    toks = prompt(9, n_chunks=3, cs=CS)
    ws[0].store(toks, 0, 3 * CS, lambda g, c, e, n: fill(("r0", g, c, e), n))
    assert lookup(srv, toks, "half", model="tp", world_size=2) == 0   # rank 1 has nothing
    ws[1].store(toks, 0, 2 * CS, lambda g, c, e, n: fill(("r1", g, c, e), n))
    assert lookup(srv, toks, "r", model="tp", world_size=2) == 2
    for r, w in enumerate(ws):
        got = w.retrieve(toks, 0, 2 * CS, "r")
        assert sorted(got) == [(0, 0), (0, 1), (1, 1), (2, 0), (2, 1)]
        for (g, c), entries in got.items():
            assert entries == [fill(("r%d" % r, g, c, e), len(b)) for e, b in enumerate(entries)]
        w.close()


def test_retrieve_without_the_lookup_locks_fails_whole(srv):
    w = GroupWorker(srv, registration(42, HYBRID_KGS, HYBRID_OGS))
    toks = prompt(3, n_chunks=2, cs=CS)
    assert w.retrieve(toks, 0, 2 * CS, "none") is None           # nothing stored
    w.store(toks, 0, 2 * CS, lambda g, c, e, n: fill(("b", g, c, e), n))
    assert w.retrieve(toks, 0, 2 * CS, "nolookup") is None       # no LOOKUP's shares
    assert lookup(srv, toks, "r") == 2
    assert w.retrieve(toks, 0, 2 * CS, "r") is not None
    assert w.retrieve(toks, 0, 2 * CS, "r") is None              # its shares are spent
    w.close()


def test_array_encoded_wire_structs_are_read_in_field_order(srv):
    p = registration(43, HYBRID_KGS, HYBRID_OGS, model="arr")
    tm = p["transfer_metadata_wire"]
    p["transfer_metadata_wire"] = [tm["num_chunks_in_sw"], tm["tokens_per_chunk"],
                                   [list(k.values()) for k in tm["kernel_groups"]],
                                   [list(o.values()) for o in tm["object_groups"]]]
    d = srv.dealer()
    r = unpack(d.call(REGISTER_KV_CACHE_ENGINE_DRIVEN_CONTEXT, p))
    assert "error" not in r and r["pool_size"] > 0
    d.close()
    p = registration(43, HYBRID_KGS, HYBRID_OGS, model="arr")
    w = GroupWorker(srv, p)          # same instance: idempotent
    toks = prompt(4, n_chunks=1, cs=CS)
    w.store(toks, 0, CS, lambda g, c, e, n: fill(("c", g, c, e), n))
    assert lookup(srv, toks, "r", model="arr") == 1
    assert len(w.retrieve(toks, 0, CS, "r")) == 3
    w.close()


def test_single_group_fields_give_the_plain_layout(srv):
    """One object group of one [2, L, chunk, H] entry is the legacy layout:
    a legacy worker of the same model registers beside it and reads its
    objects, and the reverse."""
    k = kg(0, 0, [0, 1], 2, CS, 16, 16)
    w = GroupWorker(srv, registration(44, [k], [og(0, [0], -1)], model="plain"))
    d = srv.dealer()
    legacy = {"instance_id": 45, "model_name": "plain", "world_size": 1, "block_size": 16,
              "num_layers": 2, "hidden_dim_size": 16, "dtype_str": "float16", "use_mla": False}
    r = unpack(d.call(REGISTER_KV_CACHE_ENGINE_DRIVEN_CONTEXT, legacy))
    assert "error" not in r
    toks = prompt(5, n_chunks=2, cs=CS)
    w.store(toks, 0, 2 * CS, lambda g, c, e, n: fill(("d", g, c, e), n))
    assert lookup(srv, toks, "r", model="plain") == 2
    rep = unpack(d.call(PREPARE_RETRIEVE, key(toks, 0, 2 * CS, "r", model="plain"), 45))
    assert rep["success"] and len(rep["context"]["slots"]) == 2
    for c, s in enumerate(rep["context"]["slots"]):
        assert bytes(w.pool[s["offset"]:s["offset"] + s["length"]]) == fill(("d", 0, c, 0), 4096 * 2)
    assert unpack(d.call(COMMIT_RETRIEVE, key(toks, 0, 2 * CS, "r", model="plain"), 45)) is True
    d.close()
    w.close()


def test_objects_cross_with_the_server_driven_path(start_server):
    """The server-driven registration of the same hybrid model (three engine
    groups, one a 32-token window, separate object groups) and a multi-group
    engine-driven worker share the layout and each other's objects."""
    s = start_server("--chunk-size", str(CS), "--cpu-kv-layout", "hint")
    full = PagedKV("xg0", "fa_nhd", nl=2, nb=32, bs=16, nh=2, hs=8)     # 4 blocks a chunk
    big = PagedKV("xg1", "fi_nhd", nl=1, nb=16, bs=32, nh=1, hs=16)     # 2 blocks a chunk
    swa = PagedKV("xg2", "fa_nhd", nl=2, nb=32, bs=16, nh=2, hs=4)      # window 32 tokens
    e = Engine(s, 51, [full, big, swa], model="x",
               infos=[info(0, [0, 1], 16), info(1, [2], 32), info(2, [3, 4], 16, sw=32)])
    kgs = [kg(0, 0, [0, 1], 2, CS, 16, 16), kg(1, 1, [2], 2, CS, 16, 32, fmt=2),
           kg(2, 2, [3, 4], 2, 32, 8, 16)]
    w = GroupWorker(s, registration(52, kgs, [og(0, [0, 1], -1), og(1, [2], 1)], model="x"))
    toks = prompt(6, n_chunks=3, cs=CS)
    src = [list(range(1, 13)), list(range(1, 7)), list(range(1, 13))]
    assert e.store(toks, 0, 3 * CS, src) == [ZEROS, True]
    assert lookup(s, toks, "a", model="x") == 3
    got = w.retrieve(toks, 0, 3 * CS, "a")
    assert sorted(got) == [(0, 0), (0, 1), (0, 2), (1, 2)]
    for c in range(3):
        assert got[(0, c)] == [b"".join(full.rows(src[0][4 * c:4 * c + 4], CS)),
                               b"".join(big.rows(src[1][2 * c:2 * c + 2], CS))]
    kept = [src[2][i] for i in (10, 11)]              # the last two blocks of chunk 2
    assert got[(1, 2)] == [b"".join(swa.rows(kept, 32))]
    # the reverse: objects the worker wrote, scattered into blocks
    other = prompt(7, n_chunks=3, cs=CS)
    w.store(other, 0, 3 * CS, lambda g, c, e_, n: fill(("x", g, c, e_), n))
    assert lookup(s, other, "b", model="x") == 3
    dst = [list(range(13, 25)), list(range(7, 13)), list(range(13, 25))]
    assert e.retrieve(other, 0, 3 * CS, dst, "b") == [ZEROS, True]
    for c in range(3):
        assert b"".join(full.rows(dst[0][4 * c:4 * c + 4], CS)) == fill(("x", 0, c, 0), 4096 * 2)
        assert b"".join(big.rows(dst[1][2 * c:2 * c + 2], CS)) == fill(("x", 0, c, 1), 2048 * 2)
    assert b"".join(swa.rows([dst[2][i] for i in (10, 11)], 32)) == fill(("x", 1, 2, 0), 1024 * 2)
    w.close()
    e.close()


def test_objects_of_every_group_come_back_from_l2(start_server, tmp_path):
    """Written behind to the fs adapter at their own sizes, dropped from L1
    by a CLEAR, found again by LOOKUP and handed to PREPARE_RETRIEVE."""
    spec = json.dumps({"type": "fs", "base_path": str(tmp_path)})
    s = start_server("--chunk-size", str(CS), "--l2-adapter", spec)
    w = GroupWorker(s, registration(71, HYBRID_KGS, HYBRID_OGS))
    toks = prompt(8, n_chunks=2, cs=CS)
    w.store(toks, 0, 2 * CS, lambda g, c, e, n: fill(("l2", g, c, e), n))
    sizes = [sum(entry_bytes(HYBRID_KGS[m]) for m in o["kernel_group_ids"]) for o in HYBRID_OGS]
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        files = [f for f in os.listdir(tmp_path) if f.endswith(".data")]
        if len(files) >= 6 and status(s)["storage_manager"]["store_controller"][
                "batches_in_flight"] == 0:
            break
        time.sleep(0.05)
    got_sizes = sorted(os.path.getsize(os.path.join(tmp_path, f)) for f in files)
    assert got_sizes == sorted(sizes * 2)
    d = s.dealer()
    assert d.call(CLEAR, False) is not None                      # L1 is empty
    assert d.call(LOOKUP, key(toks, 0, 2 * CS, "r", worker_id=None, model="hy"), 1) is not None
    assert unpack(d.call(WAIT_PREFETCH_STATUS, "r", 10.0, timeout_ms=15000)) == 2  # from L2
    d.close()
    got = w.retrieve(toks, 0, 2 * CS, "r")
    assert sorted(got) == [(0, 0), (0, 1), (1, 1), (2, 0), (2, 1)]
    for (g, c), entries in got.items():
        assert entries == [fill(("l2", g, c, e), len(b)) for e, b in enumerate(entries)]
    w.close()


def mutate(fn):
    p = registration(60, HYBRID_KGS, HYBRID_OGS, model="bad")
    fn(p, p["transfer_metadata_wire"])
    return p


REFUSALS = {
    "no wire": lambda p, t: p.update(transfer_metadata_wire=None),
    "tokens_per_chunk": lambda p, t: t.update(tokens_per_chunk=CS * 2),
    "kernel ids": lambda p, t: t["kernel_groups"][1].update(kernel_group_id=3),
    "object ids": lambda p, t: t["object_groups"][1].update(object_group_id=2),
    "unknown member": lambda p, t: t["object_groups"][1].update(kernel_group_ids=[7]),
    "member twice": lambda p, t: t["object_groups"][1].update(kernel_group_ids=[0]),
    "orphan kernel group": lambda p, t: t["kernel_groups"].append(kg(4, 2, [6], 2, CS, 8, 16)),
    "sw mismatch": lambda p, t: t["object_groups"][1].update(sw_size_chunks=2),
    "sw zero": lambda p, t: (t.update(num_chunks_in_sw=[-1, 0, -1]),
                             t["object_groups"][1].update(sw_size_chunks=0),
                             p.update(num_chunks_in_sw=[-1, 0, -1])),
    "top-level sw": lambda p, t: p.update(num_chunks_in_sw=[-1, 2, -1]),
    "shape": lambda p, t: p["object_group_layout_shapes"][0][1].__setitem__(3, 9),
    "3-d shape of two planes": lambda p, t: p["object_group_layout_shapes"][0].__setitem__(
        0, [2, CS, 16]),
    "dtype": lambda p, t: p["object_group_layout_dtype_strs"][2].__setitem__(0, "float16"),
    "unsupported dtype": lambda p, t: (t["kernel_groups"][0].update(dtype_str="complex64"),
                                       p["object_group_layout_dtype_strs"][0].__setitem__(
                                           0, "complex64")),
    "shapes per group": lambda p, t: p["object_group_layout_shapes"].pop(),
    "entries per group": lambda p, t: p["object_group_layout_shapes"][0].pop(),
    "kv_size 3": lambda p, t: t["kernel_groups"][1].update(kv_size=3),
    "format 17": lambda p, t: t["kernel_groups"][1].update(engine_kv_format_int=17),
    "slots over the chunk": lambda p, t: t["kernel_groups"][1].update(
        slots_per_chunk_in_window=CS + 1),
    "tokens_per_block": lambda p, t: t["kernel_groups"][1].update(tokens_per_block=24),
    "string for an int": lambda p, t: t["kernel_groups"][1].update(num_layers="1"),
    "infos layers": lambda p, t: p["engine_group_infos"][0].update(layer_indices=[0, 1]),
    "infos order": lambda p, t: p.update(engine_group_infos=p["engine_group_infos"][::-1]),
    "nine object groups": lambda p, t: (
        t.update(kernel_groups=[kg(i, i, [i], 2, CS, 8, 16) for i in range(9)],
                 object_groups=[og(i, [i], -1) for i in range(9)], num_chunks_in_sw=[-1] * 9),
        p.update(engine_group_infos=[], num_chunks_in_sw=[-1] * 9,
                 object_group_layout_shapes=[[[2, 1, CS, 8]]] * 9,
                 object_group_layout_dtype_strs=[["float16"]] * 9)),
    "wire not a struct": lambda p, t: p.update(transfer_metadata_wire="x"),
}


# What each refusal must say (issue 29: a refusal for another reason, or a
# crash answered by chance, must not pass).
REASONS = {
    "no wire": "a multi-group registration needs transfer_metadata_wire",
    "tokens_per_chunk": "transfer_metadata_wire.tokens_per_chunk must equal the server's "
                        f"chunk size {CS}",
    "kernel ids": "kernel_groups[1].kernel_group_id must be 1",
    "object ids": "object_groups[1].object_group_id must be 1",
    "unknown member": "object group 1 names kernel group outside 0..3",
    "member twice": "kernel group 0 belongs to more than one object group",
    "orphan kernel group": "every kernel group must belong to an object group",
    "sw mismatch": "object group 1: sw_size_chunks does not match num_chunks_in_sw",
    "sw zero": "object group 1: sw_size_chunks must be -1 or positive",
    "top-level sw": "object group 1: num_chunks_in_sw differs from the transfer metadata's",
    "shape": "object group 0 entry 1: the shape does not match the transfer metadata",
    "3-d shape of two planes": "object group 0 entry 0: the shape must be [kv_size, "
                               "num_layers, slots, hidden_dim_size]",
    "dtype": "object group 2 entry 0: the dtype does not match the transfer metadata",
    "unsupported dtype": "kernel group 0: unsupported dtype_str 'complex64'",
    "shapes per group": "object_group_layout_shapes and object_group_layout_dtype_strs must "
                        "have one entry per object group (3)",
    "entries per group": "object group 0: one shape and one dtype per kernel group (2)",
    "kv_size 3": "kernel group 1: kv_size must be an int in 1..2",
    "format 17": "kernel group 1: engine_kv_format_int must be an int in 0..16",
    "slots over the chunk": f"kernel group 1: slots_per_chunk_in_window must be an int in "
                            f"1..{CS}",
    "tokens_per_block": "kernel group 1: tokens_per_block 24 is not a multiple of "
                        "slots_per_block 16",
    "string for an int": "kernel group 1: num_layers must be an int in 1..4096",
    "infos layers": "engine group 0: engine_group_infos and the kernel groups list different "
                    "layers",
    "infos order": "engine_group_infos and the kernel groups order engine groups differently",
    "nine object groups": "transfer_metadata_wire needs 1..32 kernel groups and 1..8 object "
                          "groups",
    "wire not a struct": "a multi-group registration needs transfer_metadata_wire",
}


def test_every_refusal_has_its_reason():
    assert sorted(REASONS) == sorted(REFUSALS)


@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_inconsistent_registrations_are_refused_with_the_reason(srv, case):
    d = srv.dealer()
    r = unpack(d.call(REGISTER_KV_CACHE_ENGINE_DRIVEN_CONTEXT, mutate(REFUSALS[case])))
    assert r["shm_name"] == "" and r["pool_size"] == 0, (case, r)
    assert r.get("error") == REASONS[case], (case, r)
    assert unpack(d.call(NOOP)) == "OK"
    # nothing was registered: the same instance registers cleanly afterwards
    good = unpack(d.call(REGISTER_KV_CACHE_ENGINE_DRIVEN_CONTEXT, registration(60, HYBRID_KGS, HYBRID_OGS, model="bad")))
    assert "error" not in good
    d.close()


def test_engine_group_infos_without_object_groups_are_refused(srv):
    d = srv.dealer()
    p = {"instance_id": 61, "model_name": "m", "world_size": 1, "block_size": 16,
         "num_layers": 2, "hidden_dim_size": 8, "dtype_str": "float16", "use_mla": False,
         "engine_group_infos": [{"engine_group_id": 0}, {"engine_group_id": 1}]}
    r = unpack(d.call(REGISTER_KV_CACHE_ENGINE_DRIVEN_CONTEXT, p))
    assert "object_group_layout_shapes" in r["error"]
    d.close()
