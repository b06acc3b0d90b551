"""SGLang's unified layout over CPU shared tensors (docs/protocol.md,
"SGLang unified layout"): the engine registers every K, V, MLA or state
tensor as its own block view with kv_list_layout "unified" and
EngineGroupInfos carrying tokens_per_block, sw_size_tokens and
recurrent_state, as upstream's unified_lmcache_mp_connector.py does.
Attention-only, MLA and a hybrid (full attention, a sliding window and
recurrent state) round trip byte for byte with one and two workers; every
byte outside the blocks a RETRIEVE names stays as it was, and STORE writes
nothing of the engine's.  The refusals name their field."""
import functools
import os
import time

import msgpack
import pytest

from lmc.client import lookup as lmc_lookup
from lmc.client import unpack
from lmc.keys import ipc_key
from lmc.ops import NOOP, REGISTER_KV_CACHE, RETRIEVE, STORE, UNREGISTER_KV_CACHE
from paged_kv import Tensor
from test_server_driven import status
import wrappers  # noqa: E402  (on sys.path through paged_kv)

ZEROS = b"\0" * 64
CS = 16
UNIFIED = {"kv_list_layout": "unified"}


def prompt(seed, n_chunks=3):
    return [(seed * 7919 + i * 31) % 50000 for i in range(n_chunks * CS)]


class Group:
    """The tensors of one EngineGroupInfo: each a dense block view whose
    block b is bytes [b * block, (b + 1) * block) of its segment."""

    def __init__(self, tag, shapes, dtype, tokens_per_block, sw=-1, recurrent=False):
        pid = os.getpid()
        self.tensors = [Tensor(f"/lmcache_kv_{pid}_{tag}_{i}", s, dtype)
                        for i, s in enumerate(shapes)]
        self.tpb, self.sw, self.recurrent = tokens_per_block, sw, recurrent
        self.per_chunk = CS // tokens_per_block

    def block(self, t, b):
        n = self.tensors[t].nbytes // self.tensors[t].shape[0]
        return bytes(self.tensors[t].mm[b * n:(b + 1) * n])

    def object_bytes(self, ids):
        """Upstream's object entry of one chunk: per tensor in order, the
        chunk's kept blocks back to back ([1, nl, slots, row])."""
        return b"".join(self.block(t, b) for t in range(len(self.tensors)) for b in ids)

    def snapshot(self):
        return [bytes(t.mm) for t in self.tensors]

    def close(self):
        for t in self.tensors:
            t.close()


def attention(tag, layers, nb=32, bs=4, nh=2, hs=8, **kw):
    """K then V of every layer, each [NB, BS, NH, HS] (SGLang's MHA pool)."""
    return Group(tag, [[nb, bs, nh, hs]] * (2 * layers), "float16", bs, **kw)


def mla(tag, layers, nb=32, bs=4, width=36):
    return Group(tag, [[nb, bs, width]] * layers, "bfloat16", bs)


def state(tag, layers, ns=8, elems=24):
    """Opaque Mamba state [NS, 1, 1, E], one checkpoint slot per chunk."""
    return Group(tag, [[ns, 1, 1, elems]] * layers, "float32", CS, recurrent=True)


def infos(groups):
    out, first = [], 0
    for i, g in enumerate(groups):
        n = len(g.tensors)
        out.append({"engine_group_id": i, "layer_indices": list(range(first, first + n)),
                    "tokens_per_block": g.tpb, "sw_size_tokens": g.sw,
                    "recurrent_state": g.recurrent})
        first += n
    return out


def handles(groups):
    return [msgpack.ExtType(1, wrappers.dumps(t.wrapper()))
            for g in groups for t in g.tensors]


class Worker:
    def __init__(self, srv, instance, groups, rank=0, world=1, model="u", infos_=None):
        self.srv, self.id, self.groups = srv, instance, groups
        self.key = functools.partial(ipc_key, model=model, world_size=world, worker_id=rank)
        self.d = srv.dealer()
        frames = self.d.call(REGISTER_KV_CACHE, instance, handles(groups), model, world,
                             "sglang", UNIFIED, infos_ or infos(groups), timeout_ms=3000)
        assert frames is not None and len(frames) == 2, srv.output()

    def store(self, toks, blocks, rid):
        return unpack(self.d.call(STORE, self.key(toks, 0, len(toks), rid), self.id, blocks,
                                  ZEROS))

    def retrieve(self, toks, blocks, rid, skip=0):
        return unpack(self.d.call(RETRIEVE, self.key(toks, 0, len(toks), rid), self.id,
                                  blocks, ZEROS, skip))

    def close(self):
        assert len(self.d.call(UNREGISTER_KV_CACHE, self.id)) == 2
        self.d.close()
        for g in self.groups:
            g.close()


def written(g, ids, chunks, keep):
    """(chunk, kept block ids) a RETRIEVE writes: the last `keep` of each
    chunk's ids, for the given chunks."""
    return {c: ids[c * g.per_chunk + g.per_chunk - keep:(c + 1) * g.per_chunk]
            for c in chunks}


def assert_only_written(g, before, blocks):
    """Every block of every tensor of g equals `before`, except `blocks`."""
    for t, old in enumerate(before):
        n = len(old) // g.tensors[t].shape[0]
        now = bytes(g.tensors[t].mm)
        for b in range(g.tensors[t].shape[0]):
            if b not in blocks:
                assert now[b * n:(b + 1) * n] == old[b * n:(b + 1) * n], (t, b)


def model(kind, tag):
    """Groups, STORE ids, RETRIEVE ids, and per group which chunks a
    RETRIEVE writes and how many blocks of each it keeps."""
    full = list(range(1, 13)), list(range(13, 25))
    if kind == "attention":
        return [attention(tag, 2)], [full[0]], [full[1]], [((0, 1, 2), 4)]
    if kind == "mla":
        return [mla(tag, 3)], [full[0]], [full[1]], [((0, 1, 2), 4)]
    # A hybrid: full attention; a window of 8 tokens (the last two blocks
    # of each chunk; chunk 0 all null, so not stored); state checkpointed
    # at chunks 1 and 2 only (chunk 0's id is the null block).
    groups = [attention(tag + "f", 2), attention(tag + "w", 1, nh=1, sw=8),
              state(tag + "s", 2)]
    store = [full[0], [0, 0, 0, 0, 0, 0, 5, 6, 0, 0, 7, 8], [0, 3, 4]]
    load = [full[1], list(range(17, 29)), [5, 6, 7]]
    return groups, store, load, [((0, 1, 2), 4), ((2,), 2), ((2,), 1)]


@pytest.mark.parametrize("split", [False, True])
@pytest.mark.parametrize("world", [1, 2])
@pytest.mark.parametrize("kind", ["attention", "mla", "hybrid"])
def test_unified_round_trips_byte_for_byte(start_server, kind, world, split):
    """`split`: two copy workers take pieces of every copy (docs/protocol.md,
    "One request across the copy workers")."""
    s = start_server("--chunk-size", str(CS),
                     *(("--max-gpu-workers", "2", "--copy-split-bytes", "1") if split else ()))
    ranks = []
    for r in range(world):
        groups, store, load, writes = model(kind, f"{kind}{r}")
        ranks.append((Worker(s, 500 + r, groups, rank=r, world=world), store, load, writes))
    toks = prompt(3 + world)
    for w, store, load, _ in ranks:
        before = [g.snapshot() for g in w.groups]
        assert w.store(toks, store, "st") == [ZEROS, True], s.output()
        assert [g.snapshot() for g in w.groups] == before          # STORE only reads
    assert lmc_lookup(s, toks, "r", cs=CS, model="u", world_size=world) == 3
    for w, store, load, writes in ranks:
        before = [g.snapshot() for g in w.groups]
        assert w.retrieve(toks, load, "r") == [ZEROS, True], s.output()
        for g, src_ids, dst_ids, old, (chunks, keep) in zip(w.groups, store, load, before,
                                                             writes):
            src, dst = written(g, src_ids, chunks, keep), written(g, dst_ids, chunks, keep)
            for c in chunks:
                assert g.object_bytes(dst[c]) == g.object_bytes(src[c]), (kind, c)
            assert_only_written(g, old, {b for ids in dst.values() for b in ids})
    splits = status(s)["modules"]["lmcache_driven_transfer"]["split_copies"]
    assert (splits >= 2 * world) if split else splits == 0, splits
    for w, *_ in ranks:
        w.close()


def test_hybrid_without_a_state_checkpoint_falls_back(start_server):
    """LOOKUP needs the state of a prefix's last chunk: with a checkpoint at
    chunk 1 only, a three-chunk prompt hits two chunks."""
    s = start_server("--chunk-size", str(CS))
    groups, store, _, _ = model("hybrid", "fb")
    store[2] = [0, 3, 0]
    w = Worker(s, 600, groups)
    toks = prompt(9)
    assert w.store(toks, store, "st") == [ZEROS, True]
    assert lmc_lookup(s, toks, "r", cs=CS, model="u") == 2
    w.close()


def test_a_local_hit_inside_a_chunk_is_skipped(start_server):
    """The connector's RETRIEVE after a local hit of 20 tokens: the range
    starts at chunk 1, attention lists lead with null ids for the 4 tokens
    the engine has (skip_first_n_tokens 4), the state list is not padded.
    The skipped block and every block outside the window stay as they
    were."""
    s = start_server("--chunk-size", str(CS))
    groups, store, _, _ = model("hybrid", "sk")
    w = Worker(s, 650, groups)
    toks = prompt(13)
    assert w.store(toks, store, "st") == [ZEROS, True]
    assert lmc_lookup(s, toks, "r", cs=CS, model="u") == 3
    full, swa, st = groups
    load = [[0] + list(range(20, 27)), [0] + list(range(20, 27)), [6, 7]]
    before = [g.snapshot() for g in groups]
    key = w.key(toks, CS, 3 * CS, "r")
    assert unpack(w.d.call(RETRIEVE, key, w.id, load, ZEROS, 4)) == [ZEROS, True]
    pairs = [(full, list(range(20, 27)), list(range(6, 13))), (swa, [25, 26], [7, 8]),
             (st, [7], [4])]
    for (g, dst, src), old in zip(pairs, before):
        assert [g.object_bytes([b]) for b in dst] == [g.object_bytes([b]) for b in src]
        assert_only_written(g, old, set(dst))
    w.close()


def refused(srv, instance, groups, reason, hints=UNIFIED, infos_=None):
    d = srv.dealer()
    frames = d.call(REGISTER_KV_CACHE, instance, handles(groups), "u", 1, "sglang", hints,
                    infos_ if infos_ is not None else infos(groups), timeout_ms=500)
    assert frames is None                                       # unanswered, as upstream
    prefix = "REGISTER_KV_CACHE %d: " % instance

    def line():
        return next((l for l in srv.output().splitlines() if prefix in l), None)
    deadline = time.monotonic() + 5
    while line() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert line() is not None and reason in line(), srv.output()
    assert d.call(NOOP)[2] == msgpack.packb("OK")
    d.close()
    for g in groups:
        g.close()


def test_invalid_unified_registrations_are_refused_with_the_reason(start_server):
    s = start_server("--chunk-size", str(CS))
    # An attention view in a recurrent_state group.
    a = attention("r1", 1)
    a.recurrent = True
    refused(s, 701, [a], "recurrent_state group's tensors must be opaque state views "
                         "[blocks, 1, 1, elements]")
    # State with a window.
    st = state("r2", 1)
    st.sw = 32
    refused(s, 702, [attention("r2a", 1), st],
            "recurrent_state and sw_size_tokens 32 exclude each other")
    # recurrent_state that is not a bool.
    g = [attention("r3a", 1), state("r3", 1)]
    bad = infos(g)
    bad[1]["recurrent_state"] = 1
    refused(s, 703, g, "recurrent_state must be a bool", infos_=bad)
    # A view of a rank no unified tensor has.
    flat = Group("r4", [[128, 16]], "float16", 4)
    refused(s, 704, [flat], "kv_list_layout \"unified\" tensors are [blocks, slots, heads, "
                            "head size], [blocks, slots, head size] or [blocks, 1, 1, "
                            "elements]; got 2 dimensions")
    # A state checkpoint grid that does not divide the chunk.
    st = state("r5", 1)
    st.tpb = 12
    refused(s, 705, [attention("r5a", 1), st], "tokens_per_block 12 must be a multiple")
    # Views of one group that differ.
    mixed = Group("r6", [[32, 4, 2, 8], [32, 4, 2, 4]], "float16", 4)
    refused(s, 706, [mixed], "cannot share a kernel group")


def test_state_without_separate_object_groups_is_refused(start_server):
    s = start_server("--chunk-size", str(CS), "--no-separate-object-groups")
    refused(s, 710, [attention("n1", 1), state("n2", 1)],
            "recurrent_state, which needs --separate-object-groups")
