"""The client side of CacheBlend for the e2e tests (docs/cacheblend.md,
"Blend RPCs on the wire"; spec §x as that page cites it): the blend RPCs as a vLLM worker and
scheduler send them, a RoPE cos/sin cache in CPU shared memory (the
CpuShmTensorWrapper pickles REGISTER_KV_CACHE uses), the K/V values a test
writes into paged blocks, and a float64 reference of the re-rotation of K
(spec §4.2) with the tolerance docs/cacheblend.md, "The math and its
precision", holds lmcached's float32 arithmetic to.  No torch: values go
through struct, bfloat16 by hand."""
import math
import os
import random
import struct
import time

import msgpack

from lmc.client import unpack
from lmc.keys import ipc_key
from lmc.ops import (CB_PROTOCOL_HANDSHAKE, CB_REGISTER_ROPE, CB_RETRIEVE_PRE_COMPUTED,
                     CB_UNIFIED_LOOKUP, CB_UNREGISTER_ROPE)
from paged_kv import Tensor, w

ERROR_MARKER = b"LMCACHE_RPC_ERROR_V1"

# The string form newer clients send instead of the id (spec §1.3).
OP_NAMES = {CB_REGISTER_ROPE: "cb_register_rope", CB_UNREGISTER_ROPE: "cb_unregister_rope",
            CB_RETRIEVE_PRE_COMPUTED: "cb_retrieve_pre_computed",
            CB_UNIFIED_LOOKUP: "cb_unified_lookup", CB_PROTOCOL_HANDSHAKE: "cb_protocol_handshake"}

# ---- element values ------------------------------------------------------

# Unit roundoff of each K type and half fp16's smallest subnormal
# (docs/cacheblend.md, "The math and its precision").
UNIT = {"float16": 2.0 ** -11, "bfloat16": 2.0 ** -8, "float32": 2.0 ** -24}
FLOOR = {"float16": 2.0 ** -25, "bfloat16": 0.0, "float32": 0.0}
SIZE = {"float16": 2, "bfloat16": 2, "float32": 4}


def _bf16_bits(v):
    b = struct.unpack("<I", struct.pack("<f", v))[0]
    return ((b + 0x7FFF + ((b >> 16) & 1)) >> 16) & 0xFFFF   # nearest, ties to even


def encode(values, dtype):
    """Little-endian bytes of values rounded to dtype (to nearest)."""
    if dtype == "bfloat16":
        return struct.pack(f"<{len(values)}H", *(_bf16_bits(v) for v in values))
    return struct.pack(f"<{len(values)}{'e' if dtype == 'float16' else 'f'}", *values)


def decode(data, dtype):
    """The float values of dtype's little-endian bytes."""
    n = len(data) // SIZE[dtype]
    if dtype == "bfloat16":
        return [struct.unpack("<f", struct.pack("<I", h << 16))[0]
                for h in struct.unpack(f"<{n}H", data)]
    return list(struct.unpack(f"<{n}{'e' if dtype == 'float16' else 'f'}", data))


def random_row(rng, n, dtype, scale=4.0):
    """n finite values of dtype in [-scale, scale], as bytes."""
    return encode([rng.uniform(-scale, scale) for _ in range(n)], dtype)


def write_row(g, kv, l, b, s, h, data):
    """Overwrites one head's row of a paged_kv.PagedKV of a non-folded
    format (the counterpart of its row())."""
    t = g.tensors[0 if g.cross else l]
    where = {"kv": kv, "b": b, "s": s, "h": h, "e": 0, "l": l}
    off = t.offset([where[d] for d in g.order])
    assert len(data) == g.row_elems * g.item
    t.mm[off:off + len(data)] = data


def fill_blocks(g, blocks, rng):
    """Random finite K and V values in every row of the given blocks (the
    bytes PagedKV starts with may be NaN or inf)."""
    for kv in range(g.kv_size):
        for l in range(g.nl):
            for b in blocks:
                for s in range(g.bs):
                    for h in range(g.nh):
                        write_row(g, kv, l, b, s, h, random_row(rng, g.row_elems, g.dtype))


def position_rows(g, table, pos, kv):
    """The rows (layer-major, then head) of request position pos through
    the block table."""
    return [g.row(kv, l, table[pos // g.bs], pos % g.bs, h)
            for l in range(g.nl) for h in range(g.nh)]


# ---- RoPE: the cos/sin cache and the reference ------------------------------

def inv_freq(rot_dim, base=10000.0):
    return [base ** (-2.0 * i / rot_dim) for i in range(rot_dim // 2)]


def cos_sin_rows(max_position, rot_dim, base=10000.0):
    """vLLM's cos/sin cache in float64: row p = cos of every pair's angle
    at p, then their sin (spec §2.2)."""
    f = inv_freq(rot_dim, base)
    return [[math.cos(p * x) for x in f] + [math.sin(p * x) for x in f]
            for p in range(max_position)]


class RopeCache:
    """A [max_position, rot_dim] cos/sin cache of dtype in a shared-memory
    segment, and its values as the server reads them (rounded to dtype)."""

    def __init__(self, tag, max_position, rot_dim, dtype="float32", base=10000.0):
        self.rot_dim, self.dtype, self.max_position = rot_dim, dtype, max_position
        exact = cos_sin_rows(max_position, rot_dim, base)
        self.t = Tensor(f"/lmcache_rope_{os.getpid()}_{tag}", [max_position, rot_dim], dtype)
        self.t.mm[:] = b"".join(encode(r, dtype) for r in exact)
        self.rows = [decode(encode(r, dtype), dtype) for r in exact]
        # The server divides a cache whose mscale is off by 1e-3 or more
        # (spec §2.2); the reference below assumes it does not.
        e = rot_dim // 2
        m = math.sqrt(sum(r[i] ** 2 + r[e + i] ** 2 for r in self.rows for i in range(e)) /
                      (max_position * e))
        assert abs(m - 1) < 1e-3, m

    def handle(self):
        return msgpack.ExtType(1, w.dumps(self.t.wrapper()))

    def close(self):
        self.t.close()


def rotation_pairs(head_size, rot_dim, neox, offset=0):
    """The (x, y) element pairs of one head that RoPE turns, pair i using
    cos/sin column i (spec §4.2)."""
    e = rot_dim // 2
    assert offset + rot_dim <= head_size
    if neox:
        return [(offset + i, offset + i + e) for i in range(e)]
    return [(offset + 2 * i, offset + 2 * i + 1) for i in range(e)]


def rerotate(head, old, new, rows, rot_dim, neox):
    """One head's K values stored at position old, moved to new: spec
    §4.2's two steps (undo at old, apply at new) in float64 on the cache
    values `rows`.  Elements outside the rotated pairs are unchanged."""
    e = rot_dim // 2
    out = list(head)
    for i, (ix, iy) in enumerate(rotation_pairs(len(head), rot_dim, neox)):
        co, so, cn, sn = rows[old][i], rows[old][e + i], rows[new][i], rows[new][e + i]
        x, y = head[ix], head[iy]
        x1, y1 = x * co + y * so, y * co - x * so
        out[ix], out[iy] = x1 * cn - y1 * sn, y1 * cn + x1 * sn
    return out


def k_tolerance(dtype, x, y):
    """docs/cacheblend.md: |got - ref| <= (u_K + 64 u_f32)(|x| + |y|) + m_K."""
    return (UNIT[dtype] + 64 * UNIT["float32"]) * (abs(x) + abs(y)) + FLOOR[dtype]


def k_rerotation_errors(got, stored, old, new, rows, rot_dim, neox, dtype):
    """What is wrong with got (one head's K bytes) as the re-rotation of
    stored (its bytes at old) to new: a list of messages, empty if nothing.
    Rotated elements are held to k_tolerance, the others must be the
    stored bytes."""
    g, s = decode(got, dtype), decode(stored, dtype)
    ref = rerotate(s, old, new, rows, rot_dim, neox)
    bad, paired = [], set()
    for ix, iy in rotation_pairs(len(s), rot_dim, neox):
        tol = k_tolerance(dtype, s[ix], s[iy])
        for j in (ix, iy):
            paired.add(j)
            if not abs(g[j] - ref[j]) <= tol:
                bad.append(f"elem {j}: got {g[j]!r}, want {ref[j]!r} +- {tol:.3g} "
                           f"(stored {s[j]!r}, {old}->{new})")
    n = SIZE[dtype]
    for j in range(len(s)):
        if j not in paired and got[j * n:(j + 1) * n] != stored[j * n:(j + 1) * n]:
            bad.append(f"elem {j} outside the rotation changed: {s[j]!r} -> {g[j]!r}")
    return bad


# ---- the RPCs --------------------------------------------------------------

def error_message(frames):
    """The message of an error frame (--rpc-error-frames), None if frames
    is not one."""
    if frames is None or len(frames) < 4 or frames[2] != ERROR_MARKER:
        return None
    return msgpack.unpackb(frames[3], raw=False)["message"]


def handshake(d, version, by_name=False):
    """CB_PROTOCOL_HANDSHAKE: the raw reply frames."""
    return d.call(OP_NAMES[CB_PROTOCOL_HANDSHAKE] if by_name else CB_PROTOCOL_HANDSHAKE,
                  version)


def register_rope(d, instance, caches, head_size, neox, group_to_cache=(), group_rot=(),
                  by_name=False, timeout_ms=5000):
    """CB_REGISTER_ROPE with the handles of caches (RopeCache or raw
    handles): the raw reply frames (void: two frames)."""
    handles = [c.handle() if hasattr(c, "handle") else c for c in caches]
    op = OP_NAMES[CB_REGISTER_ROPE] if by_name else CB_REGISTER_ROPE
    return d.call(op, instance, handles, head_size, neox, list(group_to_cache),
                  [list(r) for r in group_rot], timeout_ms=timeout_ms)


def unregister_rope(d, instance, by_name=False):
    return d.call(OP_NAMES[CB_UNREGISTER_ROPE] if by_name else CB_UNREGISTER_ROPE, instance)


def lookup_key(tokens, rid, cs, **fields):
    """The scheduler's key: the prompt truncated to whole chunks, worker_id
    None (spec §1.4 step 5)."""
    end = len(tokens) // cs * cs
    return ipc_key(list(tokens[:end]), 0, end, rid, **fields)


def unified_lookup(d, tokens, rid, cs, tp_size=1, timeout_s=15.0, by_name=False, **fields):
    """CB_UNIFIED_LOOKUP re-issued until it answers (a void reply means
    pending, spec §2.4): the decoded CBUnifiedLookupResult map.  A missing
    reply or an error frame fails."""
    key = lookup_key(tokens, rid, cs, **fields)
    op = OP_NAMES[CB_UNIFIED_LOOKUP] if by_name else CB_UNIFIED_LOOKUP
    deadline = time.monotonic() + timeout_s
    polls = 0
    while True:
        frames = d.call(op, key, tp_size)
        polls += 1
        assert frames is not None, f"CB_UNIFIED_LOOKUP {rid}: no reply (poll {polls})"
        assert error_message(frames) is None, error_message(frames)
        if len(frames) > 2:
            return unpack(frames)
        assert time.monotonic() < deadline, f"CB_UNIFIED_LOOKUP {rid}: pending after {polls} polls"
        time.sleep(0.005)


def retrieve_frames(d, tokens, rid, cs, matches, tables, instance, event=b"", worker_id=0,
                    by_name=False, **fields):
    """CB_RETRIEVE_PRE_COMPUTED for rank worker_id: the raw reply frames."""
    end = len(tokens) // cs * cs
    key = ipc_key(list(tokens[:end]), 0, end, rid, worker_id=worker_id, **fields)
    op = OP_NAMES[CB_RETRIEVE_PRE_COMPUTED] if by_name else CB_RETRIEVE_PRE_COMPUTED
    return d.call(op, key, list(matches), [list(t) for t in tables], instance, event)


def retrieve(d, *args, **kw):
    """CB_RETRIEVE_PRE_COMPUTED: the decoded [event_handle, scatter_ran]."""
    frames = retrieve_frames(d, *args, **kw)
    assert error_message(frames) is None, error_message(frames)
    return unpack(frames)


def match(old_st, cur_st, h, cs):
    """A CBMatchResult map (spec §2.8)."""
    return {"old_st": old_st, "old_ed": old_st + cs, "cur_st": cur_st, "cur_ed": cur_st + cs,
            "hash": h}


def rng(seed):
    return random.Random(seed)
