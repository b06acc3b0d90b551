"""CacheBlend end to end (issue 35; docs/cacheblend.md, and the CacheBlend
spec's sections as §x, as that page cites them): a worker registers CPU shared paged KV and its RoPE cos/sin
cache, STOREs documents after preambles, a scheduler finds them at other
positions of a new prompt with CB_UNIFIED_LOOKUP, and
CB_RETRIEVE_PRE_COMPUTED writes them into fresh blocks, V verbatim and K
re-rotated from the stored to the new positions (checked against the
float64 reference of blend_client.py).  Also the retrieve outcomes of
§5.2, segmented prefix (§6), refused inputs and the start-up rules of
--engine-type.

The tests that start `--engine-type blend` fail until the blend module is
in (the flag is refused at start before it); the reference's self-tests,
the default-mode check of the document fixture and the refusals that
already hold run today."""
import json
import time
import urllib.error
import urllib.request

import pytest

import blend_client as bc
from lmc.client import lookup, unpack
from lmc.keys import ipc_key
from lmc.ops import (CB_PROTOCOL_HANDSHAKE, CLEAR, END_SESSION, NOOP, REGISTER_KV_CACHE, RETRIEVE,
                     STORE, UNREGISTER_KV_CACHE)
from lmc.server import BASE_ARGS, free_port, run_lmcached
from paged_kv import PagedKV

CS, BS, NL, NH, HS, NB = 16, 8, 2, 2, 16, 64
ZEROS = b"\0" * 64
COMMON = ("--chunk-size", str(CS), "--cpu-kv-layout", "hint", "--rpc-error-frames")
SERVER_ARGS = ("--engine-type", "blend") + COMMON        # srv's (conftest.py)
HINTS = {"fa_nhd": "NHD", "fa_hnd": "HND"}
MAX_POSITION = 256


def preamble(i):
    return [100 + CS * i + j for j in range(CS)]


def doc(i):
    return [1000 * (i + 1) + j for j in range(2 * CS)]


def filler(n, seed):
    return [60000 + 100 * seed + j for j in range(n)]


# Document i is stored as preamble(i) + doc(i) from blocks 1+6i..6+6i:
# its two chunks are fingerprinted at old_st 16 and 32 (chunk 0, the
# preamble, never is: §2.7).
def stored_prompt(i):
    return preamble(i) + doc(i)


def src_blocks(i):
    return list(range(1 + 6 * i, 7 + 6 * i))


# The new prompt: preamble 0 (a prefix hit of one chunk), then documents
# 3, 1 and 2 after fillers that shift them off chunk and block boundaries;
# document 0 is not in it.  128 tokens, 16 blocks.
NEW_PROMPT = (preamble(0) + filler(7, 1) + doc(3) + filler(5, 2) + doc(1) + filler(3, 3) +
              doc(2) + filler(1, 4))
# (document, old_st, cur_st) of every chunk the lookup must find.
EXPECTED = [(3, 16, 23), (3, 32, 39), (1, 16, 60), (1, 32, 76), (2, 16, 95), (2, 32, 111)]
DST = list(range(32, 48))      # fresh blocks for the new prompt
DST2 = list(range(48, 64))
# The event handle of a CPU retrieve's reply (the contract of the blend
# module: nothing to wait for on CPU tensors).
NO_EVENT = b""


class Worker:
    """One vLLM worker (rank `rank` of `world_size`): paged KV `g`
    registered as `instance`."""

    def __init__(self, srv, instance, g, model="m", rank=0, world_size=1):
        self.srv, self.id, self.g, self.model = srv, instance, g, model
        self.rank, self.world_size = rank, world_size
        self.d = srv.dealer()
        frames = self.d.call(REGISTER_KV_CACHE, instance, g.handles(), model, world_size,
                             "vllm", {"kv_layout": HINTS[g.fmt]}, [])
        assert frames is not None and len(frames) == 2, srv.output()[-3000:]

    def store(self, tokens, start, end, blocks, rid):
        key = ipc_key(tokens, start, end, rid, worker_id=self.rank, model=self.model,
                      world_size=self.world_size)
        reply = unpack(self.d.call(STORE, key, self.id, [blocks], ZEROS))
        assert reply == [ZEROS, True] or reply == [NO_EVENT, True], reply
        self.d.call(END_SESSION, rid)

    def close(self):
        self.d.close()
        self.g.close()


def status(srv):
    """GET /status; the HTTP frontend may come up a moment after NOOP is
    answered, so a refused connection is retried for a while."""
    deadline = time.monotonic() + 5
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{srv.http_port}/status",
                                        timeout=5) as r:
                return json.load(r)
        except urllib.error.URLError as e:
            if isinstance(e, urllib.error.HTTPError) or time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def registered_chunks(srv, want, timeout=5.0):
    """/status modules.blend.registered_chunks once it is want (the STORE
    hook registers in the background, §2.7), or its last value."""
    deadline = time.monotonic() + timeout
    while True:
        n = status(srv)["modules"]["blend"]["registered_chunks"]
        if n == want or time.monotonic() > deadline:
            return n
        time.sleep(0.02)


def store_documents(w, seed=1):
    """Random finite K/V in the source blocks, then the four documents
    stored as separate requests."""
    r = bc.rng(seed)
    for i in range(4):
        bc.fill_blocks(w.g, src_blocks(i), r)
        w.store(stored_prompt(i), 0, 3 * CS, src_blocks(i), f"store-{i}")


def snapshot(g):
    return {(kv, l, b, s, h): g.row(kv, l, b, s, h) for kv in range(g.kv_size)
            for l in range(g.nl) for b in range(g.nb) for s in range(g.bs) for h in range(g.nh)}


def changed_slots(g, before):
    """The (block, slot) pairs any of whose rows differ from before."""
    return {(b, s) for (kv, l, b, s, h), row in before.items() if g.row(kv, l, b, s, h) != row}


def slots_of(table, found, bs=BS):
    return {(table[p // bs], p % bs) for m in found for p in range(m["cur_st"], m["cur_ed"])}


def check_found(result, expected=EXPECTED, prefix=CS):
    """The lookup found every expected chunk at its new offset with its
    stored old_st (§2.4, §2.8); returns the matches by (doc, old_st)."""
    assert result["prefix_coverage_tokens"] == prefix, result
    got = result["non_prefix_segments"]
    assert [(m["old_st"], m["cur_st"]) for m in got] == [(o, c) for _, o, c in expected], result
    for m in got:
        assert m["old_ed"] == m["old_st"] + CS and m["cur_ed"] == m["cur_st"] + CS, m
        assert isinstance(m["hash"], bytes) and len(m["hash"]) == 32, m
    assert len({m["hash"] for m in got}) == len(got)
    assert result.get("segmented_prefix_segments", []) == []
    return got


def check_scattered(g, found, table, cache, neox, rot_dim, expected=EXPECTED, src_g=None):
    """Every matched token's V rows are the stored bytes and its K rows
    the stored K re-rotated from old to new within the docs' tolerance
    (cache None: not rotated, the stored bytes too).  src_g: the paged KV
    the documents were stored from, when another worker's (g's own by
    default)."""
    bad = []
    src_g = src_g or g
    for m, (i, old_st, cur_st) in zip(found, expected):
        assert (m["old_st"], m["cur_st"]) == (old_st, cur_st)
        for t in range(CS):
            old, new = old_st + t, cur_st + t
            assert bc.position_rows(g, table, new, 1) == \
                bc.position_rows(src_g, src_blocks(i), old, 1)
            got_k = bc.position_rows(g, table, new, 0)
            stored_k = bc.position_rows(src_g, src_blocks(i), old, 0)
            if cache is None:
                assert got_k == stored_k, (m, t)
                continue
            for got, stored in zip(got_k, stored_k):
                bad += bc.k_rerotation_errors(got, stored, old, new, cache.rows, rot_dim, neox,
                                              g.dtype)
    assert not bad, f"{len(bad)} K elements off, e.g. {bad[:5]}"


def payload(frames):
    """The one response frame of a reply: not missing, not void, not an
    error frame."""
    assert frames is not None, "no reply"
    assert bc.error_message(frames) is None, bc.error_message(frames)
    assert len(frames) == 3, frames
    return frames[2]


def noop_answers(d):
    frames = d.call(NOOP)
    assert frames is not None and frames[2] == b"\xa2OK"


@pytest.fixture
def world(srv):
    """srv with one worker (bf16 NHD, NeoX, full rotary), its rope
    registered and the four documents stored."""
    g = PagedKV("blend", "fa_nhd", nl=NL, nb=NB, bs=BS, nh=NH, hs=HS, dtype="bfloat16")
    w = Worker(srv, 5, g)
    w.cache = bc.RopeCache("blend", MAX_POSITION, HS)
    assert len(bc.register_rope(w.d, 5, [w.cache], HS, True)) == 2
    store_documents(w)
    yield w
    w.cache.close()
    w.close()


# ---- the reference (runs without the server) -----------------------------

@pytest.mark.parametrize("neox", [True, False])
@pytest.mark.parametrize("rot_dim", [16, 8])
def test_reference_rerotation_is_a_complex_rotation(neox, rot_dim):
    """The float64 reference of §4.2 equals multiplying each pair, read as
    x + iy, by e^{i (new - old) theta_i} (RoPE at p turns pair i by
    p theta_i); the elements past rot_dim (partial rotary) stay put."""
    import cmath
    rows = bc.cos_sin_rows(300, rot_dim)
    theta = bc.inv_freq(rot_dim)
    r = bc.rng(7)
    for old, new in [(16, 23), (32, 111), (200, 3), (40, 40)]:
        head = [r.uniform(-4, 4) for _ in range(HS)]
        got = bc.rerotate(head, old, new, rows, rot_dim, neox)
        for i, (ix, iy) in enumerate(bc.rotation_pairs(HS, rot_dim, neox)):
            z = complex(head[ix], head[iy]) * cmath.exp(1j * (new - old) * theta[i])
            assert abs(got[ix] - z.real) < 1e-12 and abs(got[iy] - z.imag) < 1e-12
        paired = {j for p in bc.rotation_pairs(HS, rot_dim, neox) for j in p}
        assert all(got[j] == head[j] for j in range(HS) if j not in paired)
        back = bc.rerotate(got, new, old, rows, rot_dim, neox)
        assert all(abs(a - b) < 1e-12 for a, b in zip(back, head))


def test_reference_pairs_and_element_encodings():
    """NeoX pairs (i, i + rot/2), GPT-J (2i, 2i + 1) (§4.2); bf16 and fp16
    bytes as torch stores them."""
    assert bc.rotation_pairs(8, 8, True) == [(0, 4), (1, 5), (2, 6), (3, 7)]
    assert bc.rotation_pairs(8, 4, False) == [(0, 1), (2, 3)]
    assert bc.encode([1.0, -2.0], "bfloat16") == bytes.fromhex("803f00c0")
    assert bc.encode([1.0 + 2 ** -8], "bfloat16") == bytes.fromhex("803f")    # tie to even
    assert bc.encode([1.0 + 3 * 2 ** -8], "bfloat16") == bytes.fromhex("823f")
    assert bc.encode([1.0], "float16") == bytes.fromhex("003c")
    for dt in ("bfloat16", "float16", "float32"):
        vals = bc.decode(bc.random_row(bc.rng(1), 16, dt), dt)
        assert bc.decode(bc.encode(vals, dt), dt) == vals


@pytest.mark.parametrize("dtype", ["bfloat16", "float32", "float16"])
def test_reference_check_accepts_rounded_and_refuses_unrotated_k(dtype):
    """k_rerotation_errors passes the reference rounded once to the K type
    and fails K left at its old position, a V-like change outside the
    rotation window, and a rotation to another position."""
    rows = bc.cos_sin_rows(64, 8)
    r = bc.rng(3)
    stored = bc.random_row(r, HS, dtype)
    ref = bc.encode(bc.rerotate(bc.decode(stored, dtype), 5, 50, rows, 8, True), dtype)
    assert bc.k_rerotation_errors(ref, stored, 5, 50, rows, 8, True, dtype) == []
    assert bc.k_rerotation_errors(stored, stored, 5, 50, rows, 8, True, dtype)
    off = bc.encode(bc.rerotate(bc.decode(stored, dtype), 5, 51, rows, 8, True), dtype)
    assert bc.k_rerotation_errors(off, stored, 5, 50, rows, 8, True, dtype)
    tail = ref[:-bc.SIZE[dtype]] + bc.encode([7.0], dtype)
    assert any("outside" in e for e in bc.k_rerotation_errors(tail, stored, 5, 50, rows, 8,
                                                                True, dtype))


def test_documents_fixture_round_trips_in_default_mode(start_server):
    """What the blend tests build on, against today's default engine: the
    documents stored with their preambles are ordinary prefix hits, and
    RETRIEVE writes back the very rows fill_blocks wrote."""
    s = start_server(*COMMON)
    g = PagedKV("blend_def", "fa_nhd", nl=NL, nb=NB, bs=BS, nh=NH, hs=HS, dtype="bfloat16")
    w = Worker(s, 5, g)
    store_documents(w)
    for i in range(4):
        assert lookup(w.d, stored_prompt(i), f"l-{i}", cs=CS) == 3
        reply = unpack(w.d.call(RETRIEVE, ipc_key(stored_prompt(i), 0, 3 * CS, f"l-{i}",
                                                  worker_id=0), 5, [DST[:6]], ZEROS, 0))
        assert reply[1] is True, reply
        for p in range(3 * CS):
            for kv in (0, 1):
                assert bc.position_rows(g, DST, p, kv) == bc.position_rows(g, src_blocks(i), p, kv)
    w.close()


def simulate_scatter(g, table, cache, neox, rot_dim, expected=EXPECTED):
    """What a correct retrieve writes (§5.4), done here: V copied, K
    re-rotated by the reference and rounded once to the K type."""
    for i, old_st, cur_st in expected:
        for t in range(CS):
            old, new = old_st + t, cur_st + t
            for l in range(g.nl):
                for h in range(g.nh):
                    b, s = table[new // BS], new % BS
                    sb, ss = src_blocks(i)[old // BS], old % BS
                    bc.write_row(g, 1, l, b, s, h, g.row(1, l, sb, ss, h))
                    k = bc.decode(g.row(0, l, sb, ss, h), g.dtype)
                    bc.write_row(g, 0, l, b, s, h, bc.encode(
                        bc.rerotate(k, old, new, cache.rows, rot_dim, neox), g.dtype))


@pytest.mark.parametrize("fmt,dtype,neox,rot_dim,cache_dtype", [
    ("fa_nhd", "bfloat16", False, 8, "bfloat16"), ("fa_hnd", "float32", True, 16, "float16")])
def test_scatter_check_holds_a_correct_scatter_and_only_that(fmt, dtype, neox, rot_dim,
                                                             cache_dtype):
    """The checks the blend tests apply to the server's scatter, applied to
    one done here: they pass it, and fail it with one V row changed, one
    token's K left unrotated, or a slot written outside the matches."""
    g = PagedKV(f"sim_{fmt}", fmt, nl=NL, nb=NB, bs=BS, nh=NH, hs=HS, dtype=dtype)
    cache = bc.RopeCache(f"sim_{fmt}", MAX_POSITION, rot_dim, cache_dtype)
    r = bc.rng(5)
    for i in range(4):
        bc.fill_blocks(g, src_blocks(i), r)
    found = [bc.match(o, c, bytes([n]) * 32, CS) for n, (_, o, c) in enumerate(EXPECTED)]
    before = snapshot(g)
    simulate_scatter(g, DST, cache, neox, rot_dim)
    assert changed_slots(g, before) == slots_of(DST, found)
    check_scattered(g, found, DST, cache, neox, rot_dim)
    b, s = DST[60 // BS], 60 % BS
    v = g.row(1, 1, b, s, 1)
    bc.write_row(g, 1, 1, b, s, 1, bytes([v[0] ^ 1]) + v[1:])
    with pytest.raises(AssertionError):
        check_scattered(g, found, DST, cache, neox, rot_dim)
    bc.write_row(g, 1, 1, b, s, 1, v)
    k = g.row(0, 0, b, s, 0)
    bc.write_row(g, 0, 0, b, s, 0, g.row(0, 0, src_blocks(1)[16 // BS], 16 % BS, 0))
    with pytest.raises(AssertionError, match="K elements off"):
        check_scattered(g, found, DST, cache, neox, rot_dim)
    bc.write_row(g, 0, 0, b, s, 0, k)
    check_scattered(g, found, DST, cache, neox, rot_dim)
    bc.write_row(g, 1, 0, DST[0], 0, 0, g.row(1, 0, DST[0], 0, 1))
    assert changed_slots(g, before) != slots_of(DST, found)
    cache.close()
    g.close()


# ---- handshake and rope registration (§2.2, §2.3, §2.6) ------------------

def test_handshake_answers_version_1_only(srv):
    d = srv.dealer()
    for by_name in (False, True):
        assert payload(bc.handshake(d, 1, by_name)) == b"\x92\x01\xc3"
        assert payload(bc.handshake(d, 2, by_name)) == b"\x92\x01\xc2"
        assert payload(bc.handshake(d, 0, by_name)) == b"\x92\x01\xc2"
    noop_answers(d)
    d.close()


def test_register_and_unregister_rope_by_id_and_by_name(srv):
    g = PagedKV("rope_reg", "fa_nhd", nl=NL, nb=8, bs=BS, nh=NH, hs=HS)
    w = Worker(srv, 9, g)
    cache = bc.RopeCache("rope_reg", MAX_POSITION, HS, "float16")
    assert status(srv)["modules"]["blend"]["rope_instances"] == 0
    for by_name in (False, True):
        for _ in range(2):            # a second registration replaces the first
            frames = bc.register_rope(w.d, 9, [cache], HS, True, [0], [[0, HS]], by_name=by_name)
            assert frames is not None and len(frames) == 2, frames        # void
            assert status(srv)["modules"]["blend"]["rope_instances"] == 1
        frames = bc.unregister_rope(w.d, 9, by_name=by_name)
        assert frames is not None and len(frames) == 2, frames
        assert status(srv)["modules"]["blend"]["rope_instances"] == 0
    # Unknown instance: a warning, still void (§2.3).
    assert len(bc.unregister_rope(w.d, 12345)) == 2
    noop_answers(w.d)
    cache.close()
    w.close()


@pytest.mark.parametrize("how", ["unregister", "reap"])
def test_rope_state_goes_with_its_worker(start_server, monkeypatch, how):
    """An instance unregistered (UNREGISTER_KV_CACHE) or reaped (no PING)
    takes its rope state with it, the cache's segment unmapped (§1.2: the
    module is a liveness target)."""
    monkeypatch.setenv("LMCACHED_TEST_REAP_SCALE", "60")     # 30 s -> 0.5 s
    s = start_server(*SERVER_ARGS, "--worker-reap-timeout-seconds", "30",
                     "--worker-registration-grace-seconds", "30")
    g = PagedKV(f"gone_{how}", "fa_nhd", nl=NL, nb=8, bs=BS, nh=NH, hs=HS)
    w = Worker(s, 11, g)
    cache = bc.RopeCache(f"gone_{how}", MAX_POSITION, HS)
    assert len(bc.register_rope(w.d, 11, [cache], HS, True)) == 2
    assert status(s)["modules"]["blend"]["rope_instances"] == 1
    assert cache.t.name in open(f"/proc/{s.proc.pid}/maps").read()
    if how == "unregister":
        assert len(w.d.call(UNREGISTER_KV_CACHE, 11)) == 2
    deadline = time.monotonic() + 10
    while status(s)["modules"]["blend"]["rope_instances"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert status(s)["modules"]["blend"]["rope_instances"] == 0
    assert cache.t.name not in open(f"/proc/{s.proc.pid}/maps").read()
    cache.close()
    w.close()


# ---- documents in another order (§1.4, §3.5, §3.7, §4.2, §5) ---------------

LAYOUTS = [  # fmt, K/V dtype, NeoX, rot_dim, cache dtype
    ("fa_nhd", "bfloat16", True, 16, "float32"),
    ("fa_nhd", "float32", False, 16, "float32"),
    ("fa_nhd", "bfloat16", False, 8, "bfloat16"),   # partial rotary
    ("fa_hnd", "float32", True, 16, "float16"),
    ("fa_hnd", "bfloat16", False, 16, "float32"),
]


@pytest.mark.parametrize("fmt,dtype,neox,rot_dim,cache_dtype", LAYOUTS)
def test_reordered_documents_are_found_and_re_rotated(srv, fmt, dtype, neox, rot_dim,
                                                      cache_dtype):
    """Four documents stored after their own preambles; a prompt holding
    three of them in another order at shifted, unaligned offsets finds
    each chunk at its new cur_st with its stored old_st, and the retrieve
    writes V verbatim and K re-rotated into exactly the matched slots of
    fresh blocks."""
    g = PagedKV(f"reord_{fmt}", fmt, nl=NL, nb=NB, bs=BS, nh=NH, hs=HS, dtype=dtype)
    w = Worker(srv, 3, g)
    cache = bc.RopeCache(f"reord_{fmt}", MAX_POSITION, rot_dim, cache_dtype)
    assert len(bc.register_rope(w.d, 3, [cache], HS, neox)) == 2
    store_documents(w, seed=LAYOUTS.index((fmt, dtype, neox, rot_dim, cache_dtype)))
    assert registered_chunks(srv, 8) == 8

    found = check_found(bc.unified_lookup(w.d, NEW_PROMPT, "new", CS))
    before = snapshot(g)
    assert bc.retrieve(w.d, NEW_PROMPT, "new", CS, found, [DST], 3) == [NO_EVENT, True]
    assert changed_slots(g, before) == slots_of(DST, found)
    check_scattered(g, found, DST, cache, neox, rot_dim)
    # The prefix part loads with the ordinary RETRIEVE: the unified lookup
    # read-locked it as LOOKUP does (§1.4 step 7, §2.4).
    reply = unpack(w.d.call(RETRIEVE, ipc_key(NEW_PROMPT, 0, CS, "new", worker_id=0), 3,
                            [DST[:2]], ZEROS, 0))
    assert reply[1] is True, reply
    for p in range(CS):
        for kv in (0, 1):
            assert bc.position_rows(g, DST, p, kv) == bc.position_rows(g, src_blocks(0), p, kv)
    assert changed_slots(g, before) == slots_of(DST, found) | {(b, s) for b in DST[:2]
                                                               for s in range(BS)}
    noop_answers(w.d)
    cache.close()
    w.close()


@pytest.mark.parametrize("nope", ["no caches", "group_rot []"])
def test_unrotated_groups_move_k_verbatim(srv, nope):
    """A NoPE model (no cos/sin cache) or a group declared not rotated
    (group_rot entry []) gets K copied as stored, shifted or not (§2.2,
    §4.1)."""
    g = PagedKV("nope", "fa_nhd", nl=NL, nb=NB, bs=BS, nh=NH, hs=HS, dtype="bfloat16")
    w = Worker(srv, 8, g)
    cache = bc.RopeCache("nope", MAX_POSITION, HS)
    args = ([], HS, True) if nope == "no caches" else ([cache], HS, True, [0], [[]])
    assert len(bc.register_rope(w.d, 8, *args)) == 2
    store_documents(w, seed=21)
    found = check_found(bc.unified_lookup(w.d, NEW_PROMPT, "nope", CS))
    before = snapshot(g)
    assert bc.retrieve(w.d, NEW_PROMPT, "nope", CS, found, [DST], 8) == [NO_EVENT, True]
    assert changed_slots(g, before) == slots_of(DST, found)
    check_scattered(g, found, DST, None, True, HS)
    cache.close()
    w.close()


def test_only_rank_0_stores_register_fingerprints(world, srv):
    """Of a world of two, rank 1's STORE registers no fingerprint; once
    rank 0 has stored too, the document is found (every rank's object
    present) at its new position (§2.7, §3.7 H)."""
    rank0, rank1 = (Worker(srv, 30 + r, PagedKV(f"rank{r}", "fa_nhd", nl=NL, nb=16, bs=BS,
                                                nh=NH, hs=HS, dtype="bfloat16"),
                           model="m2", rank=r, world_size=2) for r in (0, 1))
    prompt = preamble(0) + doc(0)
    new = preamble(4) + filler(5, 8) + doc(0) + filler(11, 9)
    kw = {"model": "m2", "world_size": 2}
    rank1.store(prompt, 0, 3 * CS, list(range(1, 7)), "r1")
    # The lookup drains the registrations still queued before it matches.
    got = bc.unified_lookup(world.d, new, "w2-a", CS, **kw)
    assert got["non_prefix_segments"] == [] and registered_chunks(srv, 8, timeout=0) == 8
    rank0.store(prompt, 0, 3 * CS, list(range(1, 7)), "r0")
    assert registered_chunks(srv, 10) == 10
    got = bc.unified_lookup(world.d, new, "w2-b", CS, **kw)
    assert [(m["old_st"], m["cur_st"]) for m in got["non_prefix_segments"]] == [(16, 21),
                                                                               (32, 37)], got
    rank0.close()
    rank1.close()


def test_chunk_0_of_a_stored_range_is_never_fingerprinted(world, srv):
    """A document stored as its own prompt (from position 0): its first
    chunk is a prefix hit only, never found elsewhere; its second is
    (§2.7)."""
    r = bc.rng(9)
    bc.fill_blocks(world.g, DST2[:4], r)
    world.store(doc(5), 0, 2 * CS, DST2[:4], "alone")
    assert registered_chunks(srv, 9) == 9
    prompt = preamble(4) + filler(3, 5) + doc(5) + filler(13, 6)
    got = bc.unified_lookup(world.d, prompt, "alone-new", CS)
    assert got["prefix_coverage_tokens"] == 0
    assert [(m["old_st"], m["cur_st"]) for m in got["non_prefix_segments"]] == [(16, 35)]


# ---- the outcomes of §5.2 ------------------------------------------------

def test_retrieve_outcomes(world, srv):
    """Deferred while every match lies past the allocated blocks (true,
    nothing written), then scattered; a repeat into the same blocks is
    true and rewrites nothing; matches straddling the allocation are
    false with nothing written; objects that are not there (a hash never
    stored, everything after CLEAR) are false with nothing written."""
    w, g = world, world.g
    found = check_found(bc.unified_lookup(w.d, NEW_PROMPT, "a", CS))
    before = snapshot(g)
    # All beyond: two blocks cover positions 0..15, the first match starts at 23.
    assert bc.retrieve(w.d, NEW_PROMPT, "a", CS, found, [DST[:2]], 5) == [NO_EVENT, True]
    assert changed_slots(g, before) == set()
    assert bc.retrieve(w.d, NEW_PROMPT, "a", CS, found, [DST], 5) == [NO_EVENT, True]
    assert changed_slots(g, before) == slots_of(DST, found)
    check_scattered(g, found, DST, w.cache, True, HS)
    # Repeat: the same matches into the same blocks are not written again.
    b0, s0 = DST[23 // BS], 23 % BS
    for kv in (0, 1):
        bc.write_row(g, kv, 0, b0, s0, 0, b"\x5a" * (HS * 2))
    after = snapshot(g)
    assert bc.retrieve(w.d, NEW_PROMPT, "a", CS, found, [DST], 5,
                       by_name=True) == [NO_EVENT, True]
    assert changed_slots(g, after) == set()

    # Straddling: 8 blocks end at position 64; document 1 starts at 60.
    found = check_found(bc.unified_lookup(w.d, NEW_PROMPT, "b", CS, by_name=True))
    before = snapshot(g)
    assert bc.retrieve(w.d, NEW_PROMPT, "b", CS, found, [DST2[:8]], 5) == [NO_EVENT, False]
    assert changed_slots(g, before) == set()

    # A hash never stored, alone (no lookup) and among found matches.
    fake = bc.match(16, 0, b"\xee" * 32, CS)
    assert bc.retrieve(w.d, NEW_PROMPT, "c", CS, [fake], [DST2], 5) == [NO_EVENT, False]
    found = check_found(bc.unified_lookup(w.d, NEW_PROMPT, "d", CS))
    assert bc.retrieve(w.d, NEW_PROMPT, "d", CS, [fake] + found, [DST2], 5) == [NO_EVENT, False]
    assert changed_slots(g, before) == set()

    # After a CLEAR: the matches of an earlier lookup name objects that are gone,
    # and a new lookup finds nothing.
    found = check_found(bc.unified_lookup(w.d, NEW_PROMPT, "e", CS))
    assert w.d.call(CLEAR, True) is not None
    assert bc.retrieve(w.d, NEW_PROMPT, "f", CS, found, [DST2], 5) == [NO_EVENT, False]
    assert changed_slots(g, before) == set()
    again = bc.unified_lookup(w.d, NEW_PROMPT, "g", CS)
    assert again["prefix_coverage_tokens"] == 0 and again["non_prefix_segments"] == []
    noop_answers(w.d)


# ---- segmented prefix (§6) -------------------------------------------------

@pytest.mark.parametrize("segmented", [False, True])
def test_segmented_prefix(start_server, segmented):
    """Chunks [0,1) and [2,4) of a prompt stored, chunk 1 never: the
    unified lookup of the same prompt covers one chunk as prefix; chunks 2
    and 3 come back at their own positions as non-prefix matches, or with
    --enable-segmented-prefix as segmented-prefix segments (then none as
    non-prefix), and retrieve byte for byte (no rotation at delta 0)."""
    s = start_server(*SERVER_ARGS, *(["--enable-segmented-prefix"] if segmented else []))
    g = PagedKV(f"seg{int(segmented)}", "fa_nhd", nl=NL, nb=NB, bs=BS, nh=NH, hs=HS,
                dtype="bfloat16")
    w = Worker(s, 4, g)
    cache = bc.RopeCache(f"seg{int(segmented)}", MAX_POSITION, HS)
    assert len(bc.register_rope(w.d, 4, [cache], HS, True)) == 2
    prompt = preamble(0) + doc(0) + filler(CS, 7)
    src = list(range(1, 9))
    bc.fill_blocks(g, src, bc.rng(11))
    w.store(prompt, 0, CS, src[:2], "seg-a")
    w.store(prompt, 2 * CS, 4 * CS, src[4:8], "seg-b")
    got = bc.unified_lookup(w.d, prompt, "seg", CS)
    assert got["prefix_coverage_tokens"] == CS, got
    tail = [(32, 32), (48, 48)]
    segs = got["segmented_prefix_segments"] if segmented else got["non_prefix_segments"]
    other = got["non_prefix_segments"] if segmented else got.get("segmented_prefix_segments", [])
    assert [(m["old_st"], m["cur_st"]) for m in segs] == tail, got
    assert other == [], got
    before = snapshot(g)
    assert bc.retrieve(w.d, prompt, "seg", CS, segs, [DST[:8]], 4) == [NO_EVENT, True]
    assert changed_slots(g, before) == slots_of(DST[:8], segs)
    for p in range(2 * CS, 4 * CS):
        for kv in (0, 1):
            assert bc.position_rows(g, DST, p, kv) == bc.position_rows(g, src, p, kv)
    cache.close()
    w.close()


# ---- refused inputs ----------------------------------------------------------

def refused_then_retrieve(w, frames, rid, words):
    """A bad registration is refused where it arrives (error frame naming
    one of words), or, accepted as metadata, fails the retrieve that would
    use it (error frame naming one of words, or scatter_ran false), with
    nothing written."""
    msg = bc.error_message(frames)
    if msg is None:
        assert frames is not None and len(frames) == 2, frames
        found = check_found(bc.unified_lookup(w.d, NEW_PROMPT, rid, CS))
        before = snapshot(w.g)
        frames = bc.retrieve_frames(w.d, NEW_PROMPT, rid, CS, found, [DST2], w.id)
        assert changed_slots(w.g, before) == set()
        msg = bc.error_message(frames)
        if msg is None:
            assert unpack(frames) == [NO_EVENT, False]
            return
    assert any(x in msg.lower() for x in words), msg


def test_bad_inputs_are_refused_and_the_server_keeps_serving(world, srv):
    w, d = world, world.d
    fresh = PagedKV("bad2", "fa_nhd", nl=NL, nb=NB, bs=BS, nh=NH, hs=HS, dtype="bfloat16")
    w2 = Worker(srv, 6, fresh)           # its KV registered, no rope yet
    found = check_found(bc.unified_lookup(d, NEW_PROMPT, "norope", CS))
    before = snapshot(fresh)
    msg = bc.error_message(bc.retrieve_frames(w2.d, NEW_PROMPT, "norope", CS, found, [DST], 6))
    assert msg is not None and "rope" in msg.lower(), msg
    assert changed_slots(fresh, before) == set()
    noop_answers(d)

    msg = bc.error_message(bc.register_rope(d, 777, [w.cache], HS, True))
    assert msg is not None and ("777" in msg or "instance" in msg.lower()), msg
    noop_answers(d)

    # Geometry the rows do not have, each on instance 6.
    refused_then_retrieve(w2, bc.register_rope(w2.d, 6, [w.cache], 12, True), "head",
                          ["head"])
    noop_answers(d)
    refused_then_retrieve(w2, bc.register_rope(w2.d, 6, [w.cache], HS, True, [0], [[0, 64]]),
                          "window", ["group_rot", "window", "row"])
    noop_answers(d)
    short = bc.RopeCache("short", 64, HS)
    refused_then_retrieve(w2, bc.register_rope(w2.d, 6, [short], HS, True), "short",
                          ["cos", "position", "cache"])
    noop_answers(d)

    # A plan past the tensor's blocks.
    assert len(bc.register_rope(w2.d, 6, [w.cache], HS, True)) == 2
    found = check_found(bc.unified_lookup(d, NEW_PROMPT, "past", CS))
    before = snapshot(fresh)
    frames = bc.retrieve_frames(w2.d, NEW_PROMPT, "past", CS, found,
                                [list(range(NB, NB + 16))], 6)
    msg = bc.error_message(frames)
    assert ("block" in msg.lower()) if msg is not None else unpack(frames) == [NO_EVENT, False], frames
    assert changed_slots(fresh, before) == set()
    noop_answers(d)

    # Malformed frames.
    key = bc.lookup_key(NEW_PROMPT, "bad", CS)
    good_m = bc.match(16, 23, b"\x01" * 32, CS)
    bad_calls = [
        ((CB_PROTOCOL_HANDSHAKE, "one"), ["version"]),
        ((bc.CB_REGISTER_ROPE, "x", [w.cache.handle()], HS, True), ["instance"]),
        ((bc.CB_REGISTER_ROPE, 5, [w.cache.handle()], HS, 1), ["neox"]),
        ((bc.CB_REGISTER_ROPE, 5, [b"not a tensor"], HS, True), ["cache", "tensor", "handle"]),
        ((bc.CB_REGISTER_ROPE, 5, [w.cache.handle()], HS, True, [3], []), ["group_to_cache"]),
        ((bc.CB_UNREGISTER_ROPE, "5"), ["instance"]),
        ((bc.CB_UNIFIED_LOOKUP, 5, 1), ["key"]),
        ((bc.CB_UNIFIED_LOOKUP, dict(key, token_ids="abc"), 1), ["token"]),
        ((bc.CB_RETRIEVE_PRE_COMPUTED, dict(key, worker_id=0), [good_m], DST, 5, b""),
         ["block"]),
        ((bc.CB_RETRIEVE_PRE_COMPUTED, dict(key, worker_id=0), [good_m], [], 5, b""),
         ["block", "group"]),
        ((bc.CB_RETRIEVE_PRE_COMPUTED, dict(key, worker_id=0), [dict(good_m, hash=b"ab")],
          [DST], 5, b""), ["hash"]),
        ((bc.CB_RETRIEVE_PRE_COMPUTED, dict(key, worker_id=0), [dict(good_m, cur_ed=24)],
          [DST], 5, b""), ["cur_ed", "one chunk"]),
        ((bc.CB_RETRIEVE_PRE_COMPUTED, dict(key, worker_id=0), "x", [DST], 5, b""),
         ["match"]),
        (("cb_retrieve_pre_computed", dict(key, worker_id=0), [good_m], [DST], "5", b""),
         ["instance"]),
    ]
    for (op, *args), words in bad_calls:
        msg = bc.error_message(d.call(op, *args))
        assert msg is not None and any(x in msg.lower() for x in words), (op, args[:1], msg)
        noop_answers(d)
    short.close()
    w2.d.close()
    fresh.close()


# ---- start-up (§1.2) ---------------------------------------------------------

def ports():
    return ["--host", "127.0.0.1", "--port", str(free_port()), "--http-port", str(free_port())]


def test_blend_refuses_engine_driven_transfer():
    for engine in ("blend", "blend_legacy"):
        r = run_lmcached(*ports(), *BASE_ARGS, "--engine-type", engine,
                         "--supported-transfer-mode", "engine_driven")
        assert r.returncode == 2 and "--supported-transfer-mode" in r.stderr, r.stderr


@pytest.mark.parametrize("engine", ["default", "blend_legacy"])
def test_segmented_prefix_needs_the_blend_engine(engine):
    r = run_lmcached(*ports(), *BASE_ARGS, "--engine-type", engine,
                     "--enable-segmented-prefix")
    assert r.returncode == 2 and "--enable-segmented-prefix" in r.stderr, r.stderr


@pytest.mark.parametrize("mode", ["auto", "lmcache_driven"])
def test_blend_engine_starts(start_server, mode):
    s = start_server("--engine-type", "blend", "--supported-transfer-mode", mode,
                     "--enable-segmented-prefix")
    assert status(s)["engine_type"] == "blend"
    d = s.dealer()
    assert payload(bc.handshake(d, 1)) == b"\x92\x01\xc3"
    d.close()


def test_blend_legacy_serves_as_default_with_a_warning(start_server):
    """The legacy module's ops have no wire ids (§8.1): blend_legacy starts,
    says so in a WARNING, and serves prefix caching only; the blend ops
    are not answered."""
    s = start_server("--engine-type", "blend_legacy", *COMMON[:4])
    warn = [l for l in s.output().splitlines() if "WARNING" in l and "blend_legacy" in l]
    assert warn and "default" in warn[0], s.output()
    d = s.dealer()
    assert d.call(CB_PROTOCOL_HANDSHAKE, 1, timeout_ms=500) is None
    g = PagedKV("legacy", "fa_nhd", nl=NL, nb=16, bs=BS, nh=NH, hs=HS, dtype="bfloat16")
    w = Worker(s, 2, g)
    w.store(stored_prompt(0), 0, 3 * CS, src_blocks(0), "legacy")
    assert lookup(d, stored_prompt(0), "legacy-l", cs=CS) == 3
    d.close()
    w.close()


# ---- read locks (docs/cacheblend.md, "Read locks") -------------------------

def l1_locks(srv):
    l1 = status(srv)["storage_manager"]["l1_manager"]
    return l1["num_locked_objects"], l1["leases"]


# Documents 3, 1 and 2 behind a first chunk nothing stored: no prefix leg
# locks, so every lock the lookup takes is the stash's.
NO_PREFIX_PROMPT = filler(CS, 9) + NEW_PROMPT[CS:]


@pytest.mark.parametrize("retrieve", [False, True])
def test_every_share_a_lookup_takes_goes_back_once(world, srv, retrieve):
    """The found chunks stay read-locked (one share each) until a retrieve
    consumes the share or END_SESSION releases the stash; either way each
    goes back exactly once."""
    w = world
    assert l1_locks(srv)[0] == 0
    result = bc.unified_lookup(w.d, NO_PREFIX_PROMPT, "locks", CS)
    found = check_found(result, prefix=0)
    assert l1_locks(srv)[0] == len(EXPECTED)
    if retrieve:
        key = ipc_key(NO_PREFIX_PROMPT, 0, len(NO_PREFIX_PROMPT), "locks", worker_id=0)
        assert unpack(w.d.call(bc.CB_RETRIEVE_PRE_COMPUTED, key, found, [DST], 5, b"")) == \
            [NO_EVENT, True]
        assert l1_locks(srv)[0] == 0           # the retrieve consumed every share
    w.d.call(END_SESSION, "locks")
    noop_answers(w.d)
    locked, leases = l1_locks(srv)
    assert locked == 0, leases
    assert leases["returned_twice"] == 0 and leases["returned_stale"] == 0, leases
    assert leases["copy"]["outstanding"] == 0, leases
    # A share a retrieve consumed went back with its COPY lease; the READ
    # lease it came from is then spent, as a LOOKUP's delivered one.
    assert leases["read"]["outstanding"] == (len(EXPECTED) if retrieve else 0), leases


def test_a_second_lookup_of_the_request_releases_the_first_ones_locks(world, srv):
    w = world
    check_found(bc.unified_lookup(w.d, NO_PREFIX_PROMPT, "again", CS), prefix=0)
    check_found(bc.unified_lookup(w.d, NO_PREFIX_PROMPT, "again", CS), prefix=0)
    assert l1_locks(srv)[0] == len(EXPECTED)   # not twice as many
    w.d.call(END_SESSION, "again")
    noop_answers(w.d)
    assert l1_locks(srv)[0] == 0
