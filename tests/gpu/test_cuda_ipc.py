#!/usr/bin/env python3
"""Server-driven transfer over CUDA IPC on a real GPU (docs/protocol.md,
"Server-driven copies over CUDA IPC"), in two phases.

plugin: liblmcached_cuda.so alone, loaded into this process with ctypes and
driven with torch's device memory: every engine KV format (padded MLA rows,
misaligned tensors, several member groups per object, more heads than
threads, skip_blocks), the STORE object compared with a gather written in
torch from each format's dimension order and the RETRIEVE's tensors with a
torch scatter, plus events, host functions and refusals.

server: an engine process (this one, with torch) allocates vLLM-style
paged KV caches on cuda:0, registers them with the carried lmcached exactly
as LMCache's CudaIPCWrapper pickles them, STOREs chunks from some blocks
behind an interprocess event, LOOKUPs them, RETRIEVEs them into other
blocks (all of them, then skipping the first block), waits on the events
the server returns and compares the blocks with torch.equal.  Each STORE
and RETRIEVE is preceded by a delayed write on the engine's stream, so a
server that did not wait on the engine's event would copy the wrong bytes.

bench (last, once the others passed): the issue's GPU goal, structured as
bench/sd_transfer_bench.c (BENCHMARKS.md).  Per layout (NHD, HND) a fresh
lmcached with a pinned L1 4x the data: STORE of --chunks 2 MiB chunks
(one request per 4096-token prompt), LOOKUP, RETRIEVE into other blocks,
each timed until every reply's event completed, the bytes compared; a
warm-up round, then --rounds measured ones, each beside the mean of
cudaMemcpyAsync D2H / H2D of the same bytes (torch, pinned host memory,
2 MiB pieces or one copy, the faster) measured right before and after it.
Then one-chunk STORE / RETRIEVE p50 beside NOOP p50.  A SUMMARY line says
MET or NOT MET (goals >= 0.85x and <= 2x); missing a goal is no failure,
wrong bytes are.

Needs: python3 with torch (CUDA) and msgpack, no pyzmq: ZMQ goes through
ctypes to the libzmq.so.5 carried in the bundle (tests/gpu/bundle.sh).
Run it with tests/gpu/run.sh.  Prints PASS or FAIL; exit status 0 on PASS.

--emul LIB runs the plugin and bench phases on the CPU, with CPU torch,
against tests/cuda_emul's stand-in library: it checks this script, not
the GPU code, and its bench numbers mean nothing.

--zmq-selftest runs without torch or a GPU: it checks the plugin's ctypes
plumbing (its init then fails with CUDA's reason), the ctypes ZMQ client
against the server (NOOP, LOOKUP, QUERY) and that a CUDA registration on a
machine without a GPU is refused with a reason.

--skip-without-gpu (ctest's gpu.cuda_ipc): where torch is missing or sees
no CUDA device, say why and exit 77, which ctest reports as skipped."""
import argparse
import contextlib
import ctypes
import ctypes.util
import faulthandler
import hashlib
import json
import mmap
import os
import socket
import struct
import subprocess
import sys
import time
import traceback
import urllib.error
import urllib.request

import msgpack

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tests", "pickles"))
import wrappers as w  # noqa: E402  (before torch: it sets up a stand-in module "torch")


def real_torch():
    """The real torch, once wrappers.py's stand-in module is out of the way
    (a real torch.dtype pickles as the same global torch.<name>)."""
    fake = sys.modules.get("torch")
    if fake is not None and not hasattr(fake, "__file__"):
        del sys.modules["torch"]
    import torch
    return torch


# The frozen op ids this script sends (docs/protocol.md; tests/e2e/lmc/ops.py
# holds the full table, which this standalone script cannot import on the
# device machine).
REGISTER_KV_CACHE, UNREGISTER_KV_CACHE, STORE, RETRIEVE = 1, 2, 6, 7
LOOKUP, QUERY_PREFETCH_STATUS, FREE_LOOKUP_LOCKS, END_SESSION = 8, 9, 12, 13
CLEAR, NOOP = 20, 24

# ---- ZMQ through ctypes ---------------------------------------------------

ZMQ_DEALER, ZMQ_LINGER, ZMQ_SNDMORE, ZMQ_RCVMORE, ZMQ_POLLIN = 5, 17, 2, 13, 1
# Loaded from the system when the process has them (torch already did).
SYSTEM_FIRST = ("libstdc++.so", "libgcc_s.so")


class ZmqMsg(ctypes.Structure):
    _fields_ = [("_", ctypes.c_uint64 * 8)]     # zmq_msg_t: 64 bytes, pointer-aligned


class ZmqPollItem(ctypes.Structure):
    _fields_ = [("socket", ctypes.c_void_p), ("fd", ctypes.c_int),
                ("events", ctypes.c_short), ("revents", ctypes.c_short)]


def load_libzmq(lib_dir):
    """libzmq.so.5 from the bundle's lib dir: its dependencies are loaded
    first, by path, RTLD_GLOBAL (the dynamic loader then finds them by
    soname), leaves first by retrying what failed.  Without a bundle: the
    system's."""
    if not lib_dir or not os.path.isdir(lib_dir):
        name = ctypes.util.find_library("zmq") or "libzmq.so.5"
        return ctypes.CDLL(name)
    listing = os.path.join(lib_dir, "..", "zmq-libs.txt")
    if os.path.exists(listing):
        with open(listing) as f:
            names = [l.strip() for l in f if l.strip()]
    else:
        names = sorted(os.listdir(lib_dir))
    pending, errors = [], {}
    for n in names:
        if n.startswith(SYSTEM_FIRST):
            try:
                ctypes.CDLL(n, mode=ctypes.RTLD_GLOBAL)
                continue
            except OSError:
                pass
        pending.append(n)
    while pending:
        progress = False
        for n in list(pending):
            try:
                ctypes.CDLL(os.path.join(lib_dir, n), mode=ctypes.RTLD_GLOBAL)
                pending.remove(n)
                progress = True
            except OSError as e:
                errors[n] = str(e)
        if not progress:
            break
    if any(n.startswith("libzmq.so") for n in pending):
        raise OSError("cannot load the bundled libzmq: " +
                      "; ".join(f"{n}: {errors.get(n)}" for n in pending))
    return ctypes.CDLL(os.path.join(lib_dir, "libzmq.so.5"), mode=ctypes.RTLD_GLOBAL)


class Zmq:
    def __init__(self, lib):
        self.lib = lib
        vp, c_int, sz = ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t
        msgp = ctypes.POINTER(ZmqMsg)
        sig = {
            "zmq_ctx_new": (vp, []), "zmq_ctx_term": (c_int, [vp]),
            "zmq_socket": (vp, [vp, c_int]), "zmq_close": (c_int, [vp]),
            "zmq_setsockopt": (c_int, [vp, c_int, vp, sz]),
            "zmq_getsockopt": (c_int, [vp, c_int, vp, ctypes.POINTER(sz)]),
            "zmq_connect": (c_int, [vp, ctypes.c_char_p]),
            "zmq_msg_init": (c_int, [msgp]), "zmq_msg_init_size": (c_int, [msgp, sz]),
            "zmq_msg_data": (vp, [msgp]), "zmq_msg_size": (sz, [msgp]),
            "zmq_msg_send": (c_int, [msgp, vp, c_int]),
            "zmq_msg_recv": (c_int, [msgp, vp, c_int]), "zmq_msg_close": (c_int, [msgp]),
            "zmq_poll": (c_int, [ctypes.POINTER(ZmqPollItem), c_int, ctypes.c_long]),
            "zmq_errno": (c_int, []), "zmq_strerror": (ctypes.c_char_p, [c_int]),
        }
        for name, (res, args) in sig.items():
            f = getattr(lib, name)
            f.restype, f.argtypes = res, args
        self.ctx = lib.zmq_ctx_new()
        if not self.ctx:
            self.fail("zmq_ctx_new")

    def fail(self, what):
        e = self.lib.zmq_errno()
        raise OSError(f"{what}: {self.lib.zmq_strerror(e).decode()}")

    def close(self):
        self.lib.zmq_ctx_term(self.ctx)


class Dealer:
    """A DEALER socket speaking the MP framing: [uid, op, payload...]
    (the same client as tests/e2e/conftest.py's, without pyzmq)."""

    def __init__(self, z, url):
        self.z, self.lib = z, z.lib
        self.sock = self.lib.zmq_socket(z.ctx, ZMQ_DEALER)
        if not self.sock:
            z.fail("zmq_socket")
        linger = ctypes.c_int(0)
        self.lib.zmq_setsockopt(self.sock, ZMQ_LINGER, ctypes.byref(linger),
                                ctypes.sizeof(linger))
        if self.lib.zmq_connect(self.sock, url.encode()) != 0:
            z.fail("zmq_connect")
        self.uid = 0

    def send_frames(self, frames):
        for i, data in enumerate(frames):
            msg = ZmqMsg()
            if self.lib.zmq_msg_init_size(ctypes.byref(msg), len(data)) != 0:
                self.z.fail("zmq_msg_init_size")
            if data:
                ctypes.memmove(self.lib.zmq_msg_data(ctypes.byref(msg)), data, len(data))
            flags = ZMQ_SNDMORE if i + 1 < len(frames) else 0
            if self.lib.zmq_msg_send(ctypes.byref(msg), self.sock, flags) < 0:
                self.lib.zmq_msg_close(ctypes.byref(msg))
                self.z.fail("zmq_msg_send")

    def recv_frames(self, timeout_ms):
        item = ZmqPollItem(self.sock, 0, ZMQ_POLLIN, 0)
        n = self.lib.zmq_poll(ctypes.byref(item), 1, int(timeout_ms))
        if n < 0:
            self.z.fail("zmq_poll")
        if n == 0:
            return None
        frames = []
        while True:
            msg = ZmqMsg()
            self.lib.zmq_msg_init(ctypes.byref(msg))
            if self.lib.zmq_msg_recv(ctypes.byref(msg), self.sock, 0) < 0:
                self.lib.zmq_msg_close(ctypes.byref(msg))
                self.z.fail("zmq_msg_recv")
            size = self.lib.zmq_msg_size(ctypes.byref(msg))
            frames.append(ctypes.string_at(self.lib.zmq_msg_data(ctypes.byref(msg)), size)
                          if size else b"")
            self.lib.zmq_msg_close(ctypes.byref(msg))
            more, ln = ctypes.c_int(0), ctypes.c_size_t(ctypes.sizeof(ctypes.c_int))
            self.lib.zmq_getsockopt(self.sock, ZMQ_RCVMORE, ctypes.byref(more), ctypes.byref(ln))
            if not more.value:
                return frames

    def call(self, op, *payload, timeout_ms=5000):
        """The reply frames of this request, or None on timeout."""
        uid = self.uid
        self.uid += 1
        self.send_frames([msgpack.packb(uid), msgpack.packb(op)] +
                         [msgpack.packb(p, use_bin_type=True) for p in payload])
        deadline = time.monotonic() + timeout_ms / 1000
        while True:
            left = int((deadline - time.monotonic()) * 1000)
            if left <= 0:
                return None
            frames = self.recv_frames(left)
            if frames is None:
                return None
            try:
                if msgpack.unpackb(frames[0]) == uid:
                    return frames
            except ValueError:
                pass

    def close(self):
        self.lib.zmq_close(self.sock)


def unpack(frames):
    if frames is None:
        raise AssertionError("no reply")
    return msgpack.unpackb(frames[2]) if len(frames) > 2 else None


# ---- the server -------------------------------------------------------------

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, z, binary, lib_dir, cuda_lib, *extra, l1_gb=1):
        self.z = z
        self.port, self.http_port = free_port(), free_port()
        self.url = f"tcp://127.0.0.1:{self.port}"
        env = dict(os.environ)
        if lib_dir and os.path.isdir(lib_dir):
            env["LD_LIBRARY_PATH"] = lib_dir + (":" + env["LD_LIBRARY_PATH"]
                                                if env.get("LD_LIBRARY_PATH") else "")
        if cuda_lib:
            env["LMCACHED_CUDA_LIB"] = os.path.abspath(cuda_lib)
        self.log_path = f"/tmp/lmcached-gpu-{self.port}.log"
        self.log = open(self.log_path, "w+b")
        args = [binary, "--host", "127.0.0.1", "--port", str(self.port),
                "--http-host", "127.0.0.1", "--http-port", str(self.http_port),
                "--l1-size-gb", str(l1_gb), "--eviction-policy", "LRU", "--log-level", "INFO",
                *extra]
        print("starting:", " ".join(args), flush=True)
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT, env=env)
        d = self.dealer()
        try:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"lmcached exited {self.proc.returncode}:\n" +
                                       self.output())
                if d.call(NOOP, timeout_ms=200) is not None:
                    return
            raise RuntimeError("lmcached did not answer NOOP within 30 s:\n" + self.output())
        finally:
            d.close()

    def dealer(self):
        return Dealer(self.z, self.url)

    def output(self):
        if not self.log.closed:
            self.log.flush()
        with open(self.log_path, "rb") as f:
            return f.read().decode(errors="replace")

    def stop(self, timeout=30):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        return self.proc.returncode


def key(tokens, start, end, rid, model, worker_id=0):
    return {"model_name": model, "world_size": 1, "worker_id": worker_id,
            "token_ids": list(tokens), "start": start, "end": end, "request_id": rid,
            "cache_salt": "", "request_configs": None, "num_kv_readers": 1,
            "null_chunk_mask": None}


def prompt(seed, n):
    return [(seed * 7919 + i * 31) % 50000 for i in range(n)]


def lookup(srv, tokens, end, rid, model, want, timeout=10.0, d=None, retry_sleep=0.1):
    """LOOKUP [0, end) and QUERY until the prefetch is done; retries (after
    freeing the locks) while fewer than `want` chunks hit, since a STORE's
    objects are published by the server's completion thread just after its
    event completes.  On a dealer of its own unless one is given (the bench
    reuses its own: a connect per LOOKUP would dominate its loops)."""
    own = d is None
    d = srv.dealer() if own else d
    deadline = time.monotonic() + timeout
    attempt, hits = 0, None
    try:
        while True:
            r = f"{rid}-{attempt}"
            k = key(tokens, 0, end, r, model, worker_id=None)
            if d.call(LOOKUP, k, 1) is None:
                raise AssertionError("LOOKUP: no reply")
            hits = None
            while hits is None and time.monotonic() < deadline:
                hits = unpack(d.call(QUERY_PREFETCH_STATUS, r))
                if hits is None:
                    time.sleep(0.02)
            if hits == want or time.monotonic() >= deadline:
                return hits, r
            d.call(FREE_LOOKUP_LOCKS, k, 1)
            d.call(END_SESSION, r)
            attempt += 1
            time.sleep(retry_sleep)
    finally:
        if own:
            d.close()


# ---- the GPU test -------------------------------------------------------------

class Case:
    """One engine's KV cache: NL per-layer views of one allocation, as vLLM
    carves them, in one of three formats."""

    def __init__(self, torch, fmt, nl=4, nb=64, bs=16, nh=8, hs=128, dtype="bfloat16",
                 alloc=None):
        self.torch, self.fmt, self.nl, self.nb, self.bs = torch, fmt, nl, nb, bs
        dev = torch.device("cuda:0")
        dt = getattr(torch, dtype)
        if fmt == "fa_nhd":       # [2, NB, BS, NH, HS]
            shape, self.hint = (nl, 2, nb, bs, nh, hs), "NHD"
        elif fmt == "fa_hnd":     # physical [2, NB, NH, BS, HS]
            shape, self.hint = (nl, 2, nb, nh, bs, hs), "HND"
        elif fmt == "mla":        # [NB, BS, HS]
            shape, self.hint = (nl, nb, bs, 576), "NHD"
        else:
            raise ValueError(fmt)
        # alloc(shape, dtype): where the cache lives (the bench's --emul: shared memory)
        self.big = alloc(shape, dt) if alloc else torch.zeros(shape, dtype=dt, device=dev)
        self.layers = [self.big[l] for l in range(nl)]

    def block(self, layer, b):
        t = self.layers[layer]
        return t[b] if self.fmt == "mla" else t[:, b]

    def blocks(self, ids):
        """Every layer's copy of the given blocks, in order (a clone)."""
        return [self.block(l, b).clone() for b in ids for l in range(self.nl)]

    def fill_blocks(self, ids, value=None, seed=0):
        g = self.torch.Generator(device="cuda:0")
        g.manual_seed(seed)
        for l in range(self.nl):
            for b in ids:
                blk = self.block(l, b)
                if value is None:
                    blk.copy_(self.torch.randn(blk.shape, generator=g, device="cuda:0",
                                               dtype=self.torch.float32).to(blk.dtype))
                else:
                    blk.fill_(value)

    def handles(self, uuid):
        return [ipc_wrapper(t, tuple(t.untyped_storage()._share_cuda_()), uuid)
                for t in self.layers]


def ipc_wrapper(t, handle, uuid):
    """The ext-1 item of tensor t as LMCache's CudaIPCWrapper pickles it, with
    `handle` the 8-tuple of torch's _share_cuda_() (docs/protocol.md, "Shared
    tensor handles"); t.dtype is torch's own, which pickles as torch.<name>."""
    obj = w._new(w.CUDA_MODULE, "CudaIPCWrapper", [
        ("handle", handle), ("dtype", t.dtype),
        ("shape", tuple(t.shape)), ("stride", tuple(t.stride())),
        ("storage_offset", t.storage_offset()), ("device_uuid", uuid)])
    return msgpack.ExtType(1, w.dumps(obj))


SLEEP_CYCLES = 400_000_000    # ~0.2 s of GPU time before each producer write


def event_handle(torch):
    ev = torch.cuda.Event(interprocess=True)
    ev.record(torch.cuda.current_stream())
    return ev, ev.ipc_handle()


def import_server_event(torch, h):
    """The event of a server's reply, imported into this process; checked
    first: 64 bytes, and not the 64 zero bytes a CPU context replies."""
    if not isinstance(h, (bytes, bytearray)) or len(h) != 64:
        raise AssertionError(f"the server's event handle is {h!r:.80}, not 64 bytes")
    if h == bytes(64):
        raise AssertionError("the server replied with 64 zero bytes to a CUDA client")
    return torch.cuda.Event.from_ipc_handle(torch.device("cuda:0"), h)


def wait_server_event(torch, h):
    """Makes the engine's stream wait on the server's event, then the host."""
    ev = import_server_event(torch, h)
    torch.cuda.current_stream().wait_event(ev)
    torch.cuda.current_stream().synchronize()


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def http_post_json(srv, path, body):
    req = urllib.request.Request(f"http://127.0.0.1:{srv.http_port}{path}",
                                 data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")


def torch_checksums(torch, c, ids, per_chunk):
    """Upstream's /cache/checksums digest: per chunk of ids, MD5 over every
    layer's blocks gathered along the block axis, bf16 widened to fp32, in
    row-major order."""
    out = []
    for i in range(0, len(ids), per_chunk):
        h = hashlib.md5()
        sel = torch.tensor(ids[i:i + per_chunk], device=c.layers[0].device)
        for t in c.layers:
            g = t.index_select(0 if c.fmt == "mla" else 1, sel)
            if g.dtype == torch.bfloat16:
                g = g.float()
            g = g.contiguous().cpu()
            h.update(ctypes.string_at(g.data_ptr(), g.numel() * g.element_size()))
        out.append(h.hexdigest())
    return out


def run_case(torch, srv, fmt, instance, uuid, cs):
    c = Case(torch, fmt)
    model = f"gpu-{fmt}"
    bpc = cs // c.bs
    n_chunks = 3
    n_blocks = n_chunks * bpc
    src = list(range(1, 1 + n_blocks))                      # 12 blocks
    dst = list(range(40, 40 + n_blocks))[::-1]              # elsewhere, reversed
    dst2 = list(range(20, 20 + 2 * bpc))                    # 2 chunks, skip the first block
    untouched = [0, 63]
    toks = prompt(instance, n_chunks * cs)
    d = srv.dealer()
    try:
        frames = d.call(REGISTER_KV_CACHE, instance, c.handles(uuid), model, 1, "vllm",
                        {"kv_layout": c.hint}, [], timeout_ms=60000)
        check(frames is not None and len(frames) == 2,
              f"{fmt}: REGISTER_KV_CACHE got no reply (refused): see the server log")
        c.fill_blocks(untouched + dst + dst2, seed=instance + 1)
        torch.cuda.synchronize()
        keep = c.blocks(untouched)

        # STORE behind a delayed producer: the server must wait on our event.
        torch.cuda._sleep(SLEEP_CYCLES)
        c.fill_blocks(src, seed=instance)
        want = c.blocks(src)        # enqueued after the fill: what the server must store
        ev, h = event_handle(torch)
        r = unpack(d.call(STORE, key(toks, 0, n_chunks * cs, f"s-{fmt}", model), instance,
                          [src], h))
        check(isinstance(r, list) and len(r) == 2 and r[1] is True,
              f"{fmt}: STORE replied {r!r:.120}")
        wait_server_event(torch, r[0])
        d.call(END_SESSION, f"s-{fmt}")
        c.fill_blocks(src, value=0.0)     # the stored copy must live in L1 now

        hits, rid = lookup(srv, toks, n_chunks * cs, f"r-{fmt}", model, n_chunks)
        check(hits == n_chunks, f"{fmt}: LOOKUP hit {hits} of {n_chunks} chunks")

        # RETRIEVE behind a delayed producer write to the very blocks.
        torch.cuda._sleep(SLEEP_CYCLES)
        c.fill_blocks(dst, value=3.0)
        ev, h = event_handle(torch)
        r = unpack(d.call(RETRIEVE, key(toks, 0, n_chunks * cs, rid, model), instance, [dst],
                          h, 0))
        check(isinstance(r, list) and len(r) == 2 and r[1] is True,
              f"{fmt}: RETRIEVE replied {r!r:.120}")
        wait_server_event(torch, r[0])
        got = c.blocks(dst)
        for i in range(len(want)):
            check(torch.equal(got[i], want[i]),
                  f"{fmt}: block {dst[i // c.nl]} layer {i % c.nl} differs from what "
                  f"block {src[i // c.nl]} held")
        d.call(END_SESSION, rid)

        # /cache/checksums reads the blocks back from the device: upstream's
        # digest, computed here with torch from the same blocks.
        st, body = http_post_json(srv, "/cache/checksums", {
            "block_ids": dst, "chunk_size": bpc, "instance_id": instance})
        check(st == 200, f"{fmt}: /cache/checksums answered {st}: {body}")
        check(body["chunk_checksums"] == torch_checksums(torch, c, dst, bpc),
              f"{fmt}: /cache/checksums differ from torch's digests of the blocks")

        # RETRIEVE two chunks skipping their first block (vLLM's prefix cache).
        hits, rid = lookup(srv, toks, 2 * cs, f"k-{fmt}", model, 2)
        check(hits == 2, f"{fmt}: second LOOKUP hit {hits} of 2 chunks")
        c.fill_blocks(dst2, value=7.0)
        ev, h = event_handle(torch)
        r = unpack(d.call(RETRIEVE, key(toks, 0, 2 * cs, rid, model), instance, [dst2], h,
                          c.bs))
        check(isinstance(r, list) and r[1] is True,
              f"{fmt}: RETRIEVE with skip replied {r!r:.120}")
        wait_server_event(torch, r[0])
        for l in range(c.nl):
            check(bool((c.block(l, dst2[0]) == 7.0).all()),
                  f"{fmt}: the skipped block {dst2[0]} of layer {l} was written")
            for j in range(1, len(dst2)):
                check(torch.equal(c.block(l, dst2[j]), want[j * c.nl + l]),
                      f"{fmt}: block {dst2[j]} layer {l} differs after the skip")
        d.call(END_SESSION, rid)

        # A RETRIEVE of chunks nobody locked: [event, false], a valid event.
        ev, h = event_handle(torch)
        other = prompt(instance + 1000, cs)
        r = unpack(d.call(RETRIEVE, key(other, 0, cs, f"miss-{fmt}", model), instance,
                          [dst[:bpc]], h, 0))
        check(isinstance(r, list) and r[1] is False, f"{fmt}: a miss replied {r!r:.120}")
        wait_server_event(torch, r[0])
        d.call(END_SESSION, f"miss-{fmt}")

        got = c.blocks(untouched)
        check(all(torch.equal(a, b) for a, b in zip(got, keep)),
              f"{fmt}: blocks outside every list changed")
        frames = d.call(UNREGISTER_KV_CACHE, instance, timeout_ms=30000)
        check(frames is not None and len(frames) == 2, f"{fmt}: UNREGISTER got no reply")
        print(f"  {fmt}: ok ({n_chunks} chunks stored and retrieved, skip, miss)", flush=True)
    finally:
        d.close()


def run_layerwise_case(torch, srv, instance, uuid, cs):
    """RETRIEVE_LAYERWISE over CUDA IPC (docs/protocol.md, "Layerwise
    retrieve"), against a server started with --layerwise-batch 2: the pool's
    events imported once; each batch's reply arrives with the pool index of
    its first layer, and once the engine's stream waited on that event the
    batch's layers hold what was stored, before the final reply."""
    c = Case(torch, "fa_nhd", nl=5)
    model = "gpu-layerwise"
    bpc = cs // c.bs
    src = list(range(1, 1 + 2 * bpc))
    dst = list(range(40, 40 + 2 * bpc))
    toks = prompt(instance, 2 * cs)
    d = srv.dealer()
    try:
        frames = d.call(REGISTER_KV_CACHE, instance, c.handles(uuid), model, 1, "vllm",
                        {"kv_layout": c.hint}, [], timeout_ms=60000)
        check(frames is not None and len(frames) == 2, "layerwise: REGISTER_KV_CACHE refused")
        batch, handles = unpack(d.call("register_layerwise_ipc_event_pool", instance,
                                       timeout_ms=30000))
        check(batch == 2 and len(handles) == c.nl,
              f"layerwise: the pool reply is batch {batch}, {len(handles)} handles")
        pool = [import_server_event(torch, h) for h in handles]
        c.fill_blocks(src, seed=instance)
        want = c.blocks(src)
        ev, h = event_handle(torch)
        r = unpack(d.call(STORE, key(toks, 0, 2 * cs, "s-lw", model), instance, [src], h))
        check(r[1] is True, f"layerwise: STORE replied {r!r:.120}")
        wait_server_event(torch, r[0])
        d.call(END_SESSION, "s-lw")
        hits, rid = lookup(srv, toks, 2 * cs, "r-lw", model, 2)
        check(hits == 2, f"layerwise: LOOKUP hit {hits} of 2")
        c.fill_blocks(dst, value=3.0)
        ev, h = event_handle(torch)
        uid = d.uid
        d.uid += 1
        d.send_frames([msgpack.packb(uid), msgpack.packb("retrieve_layerwise"),
                       msgpack.packb(key(toks, 0, 2 * cs, rid, model), use_bin_type=True),
                       msgpack.packb(instance), msgpack.packb([dst]),
                       msgpack.packb(h, use_bin_type=True), msgpack.packb(0)])
        seen = []
        while True:
            frames = d.recv_frames(30000)
            check(frames is not None, "layerwise: no reply")
            payload, final, ok = unpack(frames)
            if final:
                check(ok is True, "layerwise: the final reply says false")
                break
            first, count, idx = struct.unpack("<3i", payload[:12])
            torch.cuda.current_stream().wait_event(pool[idx])
            torch.cuda.current_stream().synchronize()
            for l in range(first, first + count):
                for j, b in enumerate(dst):
                    check(torch.equal(c.block(l, b), want[j * c.nl + l]),
                          f"layerwise: layer {l} block {b} not in place after its event")
            seen.append((first, count, idx))
        check(seen == [(0, 2, 0), (2, 2, 2), (4, 1, 4)], f"layerwise: batches {seen}")
        d.call(END_SESSION, rid)
        frames = d.call(UNREGISTER_KV_CACHE, instance, timeout_ms=30000)
        check(frames is not None, "layerwise: UNREGISTER got no reply")
        print("  layerwise: ok (3 batches, each in place after its pool event)", flush=True)
    finally:
        d.close()


# ---- the plugin alone, in this process ----------------------------------------
# liblmcached_cuda.so driven through ctypes with torch's own device memory
# (no IPC: one process), against a gather/scatter written in torch from
# each format's dimension order, independent of kv_format.h's formulas.

DEV = "cuda:0"    # "cpu" with --emul: a CPU stand-in whose device addresses are host ones


def dev_sync(torch):
    if DEV != "cpu":
        torch.cuda.synchronize()


(F_CROSS, F_FA_NHD, F_FA_HND, F_FI_NHD, F_FI_HND, F_MLA, F_FUSED_NHD, F_FUSED_HND, F_TRT,
 F_SGLANG, F_UNIFIED) = range(11)


class Geo(ctypes.Structure):
    _fields_ = [("format", ctypes.c_int), ("kv_size", ctypes.c_uint32),
                ("nl", ctypes.c_uint32), ("nb", ctypes.c_uint64), ("bs", ctypes.c_uint32),
                ("nh", ctypes.c_uint32), ("hs", ctypes.c_uint32),
                ("element_size", ctypes.c_uint32), ("block_stride", ctypes.c_uint64)]


class KernelGroup(ctypes.Structure):
    _fields_ = [("geo", Geo), ("tensors", ctypes.POINTER(ctypes.c_uint32)),
                ("n_tensors", ctypes.c_uint32), ("engine_group_id", ctypes.c_int64),
                ("tokens_per_block", ctypes.c_uint32), ("physical_per_engine", ctypes.c_uint32),
                ("sw_size_tokens", ctypes.c_int64),
                ("blocks_per_chunk", ctypes.c_uint32), ("keep_blocks", ctypes.c_uint32),
                ("slots", ctypes.c_uint32), ("has_null_block", ctypes.c_bool),
                ("null_block_id", ctypes.c_int64), ("object_group", ctypes.c_uint32),
                ("entry_offset", ctypes.c_uint64), ("entry_bytes", ctypes.c_uint64),
                ("span_bytes", ctypes.c_uint64)]


class CudaObject(ctypes.Structure):
    _fields_ = [("groups", ctypes.POINTER(ctypes.POINTER(KernelGroup))),
                ("tensors", ctypes.POINTER(ctypes.POINTER(ctypes.c_uint64))),
                ("n_groups", ctypes.c_uint32), ("object_size", ctypes.c_uint64)]


_i, _sz, _vp, _cp = ctypes.c_int, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_char_p
HOSTFN = ctypes.CFUNCTYPE(None, _vp)


class CudaOps(ctypes.Structure):
    _fields_ = [
        ("abi_version", _i),
        ("init", ctypes.CFUNCTYPE(_i, ctypes.POINTER(_i), _cp, _sz)),
        ("device_by_uuid", ctypes.CFUNCTYPE(_i, _cp, ctypes.POINTER(_i), _cp, _sz)),
        ("open_mem", ctypes.CFUNCTYPE(_i, _i, _vp, ctypes.POINTER(ctypes.c_uint64),
                                      ctypes.POINTER(ctypes.c_uint64), _cp, _sz)),
        ("close_mem", ctypes.CFUNCTYPE(None, _i, ctypes.c_uint64)),
        ("pin", ctypes.CFUNCTYPE(_i, _vp, ctypes.c_uint64, _cp, _sz)),
        ("unpin", ctypes.CFUNCTYPE(None, _vp)),
        ("stream_new", ctypes.CFUNCTYPE(_vp, _i, ctypes.c_uint64, _cp, _sz)),
        ("stream_free", ctypes.CFUNCTYPE(None, _vp)),
        ("wait_event", ctypes.CFUNCTYPE(_i, _vp, _vp, _sz, _cp, _sz)),
        ("copy_object", ctypes.CFUNCTYPE(_i, _vp, ctypes.POINTER(CudaObject), _vp,
                                         ctypes.POINTER(ctypes.POINTER(ctypes.c_int64)),
                                         ctypes.POINTER(ctypes.c_uint32), ctypes.c_bool,
                                         _cp, _sz)),
        ("record_event", ctypes.CFUNCTYPE(_i, _vp, _vp, _cp, _sz)),
        ("then", ctypes.CFUNCTYPE(_i, _vp, HOSTFN, _vp, _cp, _sz)),
        ("sync", ctypes.CFUNCTYPE(_i, _vp, _cp, _sz)),
        ("read", ctypes.CFUNCTYPE(_i, _i, ctypes.c_uint64, _vp, ctypes.c_uint64, _cp, _sz)),
        ("event_pool", ctypes.CFUNCTYPE(_i, _vp, ctypes.c_uint32, _vp, _cp, _sz)),
        ("record_pool_event", ctypes.CFUNCTYPE(_i, _vp, ctypes.c_uint32, _cp, _sz)),
        ("copy_layers", ctypes.CFUNCTYPE(_i, _vp, ctypes.POINTER(CudaObject), _vp,
                                         ctypes.POINTER(ctypes.POINTER(ctypes.c_int64)),
                                         ctypes.POINTER(ctypes.c_uint32),
                                         ctypes.POINTER(ctypes.c_uint32),
                                         ctypes.POINTER(ctypes.c_uint32), _cp, _sz)),
        # ABI 6: CacheBlend's plan (tests/gpu/blend_check.c drives it)
        ("blend_execute", ctypes.CFUNCTYPE(_i, _vp, _vp, _cp, _sz)),
        # ABI 7: device memory the server owns (a divided cos/sin cache)
        ("upload", ctypes.CFUNCTYPE(_i, _i, _vp, ctypes.c_uint64,
                                    ctypes.POINTER(ctypes.c_uint64), _cp, _sz)),
        ("free_device", ctypes.CFUNCTYPE(None, _i, ctypes.c_uint64)),
    ]


def load_plugin(path):
    lib = ctypes.CDLL(os.path.abspath(path), mode=ctypes.RTLD_LOCAL)
    entry = lib.lmc_cuda_transfer_ops
    entry.restype, entry.argtypes = ctypes.POINTER(CudaOps), []
    ops = entry().contents
    check(ops.abi_version == 7, f"plugin ABI {ops.abi_version}, want 7")
    return lib, ops


class Err:
    def __init__(self):
        self.buf = ctypes.create_string_buffer(512)

    def __str__(self):
        return self.buf.value.decode(errors="replace")


class PGroup:
    """One kernel group: its tensors (torch, on cuda:0) and a logical view
    [kv_size, nl, nb, bs, nh, hs] built from the format's dimension order."""

    def __init__(self, torch, fmt, nl, nb, bs, nh, hs, dtype, pad=0, misalign=0, seed=0):
        self.torch, self.fmt = torch, fmt
        kv = 1 if fmt in (F_MLA, F_FUSED_NHD, F_FUSED_HND, F_UNIFIED) else 2
        if fmt == F_MLA:
            nh = 1
        self.kv, self.nl, self.nb, self.bs, self.nh, self.hs = kv, nl, nb, bs, nh, hs
        self.dtype = dtype
        self.es = torch.empty((), dtype=dtype).element_size()
        phys = {F_FA_NHD: (2, nb, bs, nh, hs), F_FA_HND: (2, nb, nh, bs, hs),
                F_FI_NHD: (nb, 2, bs, nh, hs), F_FI_HND: (nb, 2, nh, bs, hs),
                F_MLA: (nb, bs, hs), F_FUSED_NHD: (nb, bs, nh, hs),
                F_FUSED_HND: (nb, nh, bs, hs), F_CROSS: (nb, nl, 2, bs, nh, hs),
                F_TRT: (nb, nl, 2, nh, bs, hs), F_SGLANG: (nb, bs, nh, hs),
                F_UNIFIED: (nb, bs, nh, hs)}[fmt]
        n_t = 1 if fmt in (F_CROSS, F_TRT) else (2 * nl if fmt == F_SGLANG else nl)
        self.block_stride = bs * hs + pad if fmt == F_MLA else bs * nh * hs
        g = torch.Generator(device=DEV)
        g.manual_seed(seed)
        self.tensors = []
        for _ in range(n_t):
            numel = 1
            for d in phys:
                numel *= d
            if fmt == F_MLA:
                numel = nb * self.block_stride
            flat = self.rand(torch, numel + misalign, g)
            if fmt == F_MLA:
                t = flat.as_strided((nb, bs, hs), (self.block_stride, hs, 1), misalign)
            else:
                t = flat[misalign:].view(phys)
            self.tensors.append(t)

    def rand(self, torch, n, g):
        if self.es == 1:
            return torch.randint(0, 256, (n,), dtype=torch.uint8, device=DEV, generator=g)
        lo, hi = {2: (-32768, 32767), 4: (-2**31, 2**31 - 1)}[self.es]
        idt = {2: torch.int16, 4: torch.int32}[self.es]
        return torch.randint(lo, hi, (n,), dtype=idt, device=DEV, generator=g)

    def layer_view(self, ts, kv, l):
        """A writable [nb, bs, nh, hs] view of (kv, layer l) in tensors ts."""
        f, nl = self.fmt, self.nl
        if f == F_CROSS:
            return ts[0][:, l, kv]
        if f == F_TRT:
            return ts[0][:, l, kv].permute(0, 2, 1, 3)
        if f == F_SGLANG:
            return ts[kv * nl + l]
        t = ts[l]
        return {F_FA_NHD: lambda: t[kv], F_FA_HND: lambda: t[kv].permute(0, 2, 1, 3),
                F_FI_NHD: lambda: t[:, kv], F_FI_HND: lambda: t[:, kv].permute(0, 2, 1, 3),
                F_MLA: lambda: t.unsqueeze(2), F_FUSED_NHD: lambda: t, F_UNIFIED: lambda: t,
                F_FUSED_HND: lambda: t.permute(0, 2, 1, 3)}[f]()

    def entry(self, blocks):
        """The group's entry of an object, [kv, nl, keep*bs, nh*hs], as bytes."""
        rows = [self.layer_view(self.tensors, kv, l)[blocks].reshape(
                    len(blocks) * self.bs, self.nh * self.hs)
                for kv in range(self.kv) for l in range(self.nl)]
        return self.torch.stack(rows).contiguous().view(-1).view(self.torch.uint8)

    def scatter_expected(self, before, entry_bytes, blocks, skip):
        """What the tensors must hold after a RETRIEVE of entry_bytes."""
        exp = [t.clone() for t in before]
        e = entry_bytes.clone().view(self.tensors[0].dtype)
        e = e.view(self.kv, self.nl, len(blocks), self.bs, self.nh, self.hs)
        for j in range(skip, len(blocks)):
            for kv in range(self.kv):
                for l in range(self.nl):
                    self.layer_view(exp, kv, l)[blocks[j]] = e[kv, l, j]
        return exp

    def kernel_group(self, keep, entry_offset):
        kg = KernelGroup()
        kg.geo = Geo(self.fmt, self.kv, self.nl, self.nb, self.bs, self.nh, self.hs, self.es,
                     self.block_stride)
        kg.n_tensors = len(self.tensors)
        kg.keep_blocks = kg.blocks_per_chunk = keep
        kg.slots = keep * self.bs
        kg.entry_offset = entry_offset
        kg.entry_bytes = self.kv * self.nl * kg.slots * self.nh * self.hs * self.es
        kg.sw_size_tokens = -1
        kg.physical_per_engine = 1
        return kg


def plugin_read(torch, ops):
    """read(): device bytes at an offset into pageable host memory, the
    /cache/checksums path."""
    err = Err()
    g = torch.Generator(device=DEV)
    g.manual_seed(99)
    dev = torch.randint(0, 256, (1 << 20,), dtype=torch.uint8, device=DEV, generator=g)
    host = bytearray(4099)
    buf = (ctypes.c_char * len(host)).from_buffer(host)
    rc = ops.read(0, dev.data_ptr() + 12345, ctypes.addressof(buf), len(host), err.buf, 512)
    check(rc == 0, f"read: {err}")
    want = dev[12345:12345 + len(host)].cpu()
    check(bytes(host) == bytes(want.tolist()), "read: the bytes differ from the device's")
    print("  plugin: read of 4099 device bytes at an odd offset: ok", flush=True)


def plugin_upload(ops):
    """upload() and free_device(): device memory the server owns
    (CacheBlend's divided cos/sin cache, docs/cacheblend.md "The GPU
    path"), read back through read()."""
    err = Err()
    host = os.urandom(4099)
    src = ctypes.create_string_buffer(host, len(host))
    dev = ctypes.c_uint64(0)
    rc = ops.upload(0, ctypes.addressof(src), len(host), ctypes.byref(dev), err.buf, 512)
    check(rc == 0 and dev.value != 0, f"upload: {err}")
    back = ctypes.create_string_buffer(len(host))
    rc = ops.read(0, dev.value, ctypes.addressof(back), len(host), err.buf, 512)
    check(rc == 0, f"read: {err}")
    check(back.raw == host, "upload: the device bytes differ from the host's")
    ops.free_device(0, dev.value)
    print("  plugin: upload of 4099 bytes, read back, freed: ok", flush=True)


def plugin_case(torch, ops, name, groups, blocks, dst, skips):
    """One object of `groups` (PGroups): STORE it to pinned host memory,
    compare with torch's gather; RETRIEVE a fresh object into `dst` with
    `skips`, compare every tensor with torch's scatter."""
    err = Err()
    kgs, off = [], 0
    for g, b in zip(groups, blocks):
        kgs.append(g.kernel_group(len(b), off))
        off += kgs[-1].entry_bytes
    size = off
    # page-aligned, like lmcached's L1 arena (an mmap), pinned by the plugin
    mm = mmap.mmap(-1, (size + 64 + 4095) // 4096 * 4096)
    host = torch.frombuffer(mm, dtype=torch.uint8)
    host.fill_(0xEE)
    check(ops.pin(host.data_ptr(), host.numel(), err.buf, 512) == 0, f"pin: {err}")
    s = ops.stream_new(0, size, err.buf, 512)
    check(s, f"stream_new: {err}")
    try:
        kg_ptrs = (ctypes.POINTER(KernelGroup) * len(kgs))(*[ctypes.pointer(k) for k in kgs])
        addr_arrays = [(ctypes.c_uint64 * len(g.tensors))(*[t.data_ptr() for t in g.tensors])
                       for g in groups]
        t_ptrs = (ctypes.POINTER(ctypes.c_uint64) * len(groups))(
            *[ctypes.cast(a, ctypes.POINTER(ctypes.c_uint64)) for a in addr_arrays])
        obj = CudaObject(kg_ptrs, t_ptrs, len(kgs), size)

        def block_lists(lists):
            arrs = [(ctypes.c_int64 * len(b))(*b) for b in lists]
            return arrs, (ctypes.POINTER(ctypes.c_int64) * len(arrs))(
                *[ctypes.cast(a, ctypes.POINTER(ctypes.c_int64)) for a in arrs])

        dev_sync(torch)
        keep_alive, bl = block_lists(blocks)
        rc = ops.copy_object(s, ctypes.byref(obj), host.data_ptr(), bl, None, True, err.buf, 512)
        check(rc == 0, f"{name}: copy_object (STORE): {err}")
        h = (ctypes.c_uint8 * 64)()
        check(ops.record_event(s, ctypes.cast(h, ctypes.c_void_p), err.buf, 512) == 0,
              f"{name}: record_event: {err}")
        check(bytes(h) != bytes(64), f"{name}: record_event exported 64 zero bytes")
        ran = []
        cb = HOSTFN(lambda arg: ran.append(arg))
        check(ops.then(s, cb, ctypes.c_void_p(42), err.buf, 512) == 0, f"{name}: then: {err}")
        check(ops.sync(s, err.buf, 512) == 0, f"{name}: sync: {err}")
        for _ in range(100):
            if ran:
                break
            time.sleep(0.01)
        check(ran == [42], f"{name}: the host function ran {ran}")
        want = torch.cat([g.entry(b) for g, b in zip(groups, blocks)]).cpu()
        if not torch.equal(host[:size], want):
            bad = (host[:size] != want).nonzero()
            raise AssertionError(f"{name}: the stored object differs from torch's gather "
                                 f"({want.numel()} bytes expected, {size} stored; first bad "
                                 f"byte {int(bad[0]) if bad.numel() else None})")
        check(bool((host[size:size + 64] == 0xEE).all()), f"{name}: bytes past the object "
              "written")

        # RETRIEVE a fresh object into dst, skipping the first skips[i] blocks
        fresh = torch.randint(0, 256, (size,), dtype=torch.uint8)
        host[:size] = fresh
        before = [[t.clone() for t in g.tensors] for g in groups]
        dev_sync(torch)
        keep_alive2, bl2 = block_lists(dst)
        sk = (ctypes.c_uint32 * len(groups))(*skips)
        rc = ops.copy_object(s, ctypes.byref(obj), host.data_ptr(), bl2, sk, False, err.buf, 512)
        check(rc == 0, f"{name}: copy_object (RETRIEVE): {err}")
        check(ops.sync(s, err.buf, 512) == 0, f"{name}: sync: {err}")
        fresh_dev = fresh.to(DEV)
        for i, (g, k) in enumerate(zip(groups, kgs)):
            part = fresh_dev[k.entry_offset:k.entry_offset + k.entry_bytes]
            exp = g.scatter_expected(before[i], part, dst[i], min(skips[i], len(dst[i])))
            for t, (a, b) in enumerate(zip(g.tensors, exp)):
                check(torch.equal(a, b), f"{name}: member {i} tensor {t} differs from "
                      f"torch's scatter (skip {skips[i]})")
        del keep_alive, keep_alive2
        print(f"  plugin {name}: ok ({size}-byte object)", flush=True)
    finally:
        ops.stream_free(s)
        ops.unpin(host.data_ptr())


def plugin_main(torch, args, uuid):
    lib, ops = load_plugin(args.cuda_lib or os.path.join(args.bundle, "liblmcached_cuda.so"))
    err = Err()
    n = ctypes.c_int(0)
    check(ops.init(ctypes.byref(n), err.buf, 512) == 0, f"init: {err}")
    check(n.value >= 1, f"init: {n.value} devices")
    dev = ctypes.c_int(-1)
    for u in (uuid, "GPU-" + uuid) + ((uuid.upper(),) if DEV != "cpu" else ()):
        check(ops.device_by_uuid(u.encode(), ctypes.byref(dev), err.buf, 512) == 0 and
              dev.value == 0, f"device_by_uuid({u}): {err}")
    check(ops.device_by_uuid(b"00000000-0000-0000-0000-000000000000", ctypes.byref(dev),
                             err.buf, 512) == -1, "a made-up UUID was found")
    print(f"  plugin: {n.value} device(s); unknown UUID: {err}")
    i16, u8, i32 = torch.int16, torch.uint8, torch.int32
    B = [17, 3, 9, 21]
    D = [5, 11, 2, 20]
    cases = [
        ("fa_nhd+mla_padded", [PGroup(torch, F_FA_NHD, 3, 24, 16, 4, 64, i16, seed=1),
                               PGroup(torch, F_MLA, 3, 24, 16, 1, 36, i16, pad=5, seed=2)]),
        ("fa_hnd", [PGroup(torch, F_FA_HND, 2, 24, 16, 4, 64, i16, seed=3)]),
        ("fi_nhd+fi_hnd", [PGroup(torch, F_FI_NHD, 2, 24, 16, 2, 128, i16, seed=4),
                           PGroup(torch, F_FI_HND, 2, 24, 16, 2, 128, i16, seed=5)]),
        ("fused_nhd+fused_hnd", [PGroup(torch, F_FUSED_NHD, 2, 24, 16, 2, 32, i16, seed=6),
                                 PGroup(torch, F_FUSED_HND, 2, 24, 16, 2, 32, i16, seed=7)]),
        ("cross+trt", [PGroup(torch, F_CROSS, 4, 24, 16, 2, 64, i16, seed=8),
                       PGroup(torch, F_TRT, 4, 24, 16, 2, 64, i16, seed=9)]),
        ("sglang_kv_lists", [PGroup(torch, F_SGLANG, 3, 24, 16, 2, 64, i16, seed=10)]),
        # SGLang unified: K and V views as layers, then opaque fp32 state
        ("sglang_unified+state", [PGroup(torch, F_UNIFIED, 4, 24, 16, 2, 64, i16, seed=16),
                                  PGroup(torch, F_UNIFIED, 2, 24, 1, 1, 1000, i32, seed=17)]),
        ("many_heads_hnd", [PGroup(torch, F_FA_HND, 2, 24, 4, 40, 256, i16, seed=11)]),
        ("fp8_odd_rows+misaligned", [PGroup(torch, F_FA_NHD, 2, 24, 16, 3, 3, u8, seed=12),
                                     PGroup(torch, F_FA_NHD, 2, 24, 16, 2, 64, i16,
                                            misalign=1, seed=13)]),
        ("fp32", [PGroup(torch, F_FI_NHD, 2, 24, 32, 1, 128, i32, seed=14)]),
    ]
    for name, groups in cases:
        plugin_case(torch, ops, name, groups, [B] * len(groups), [D] * len(groups),
                    [0] + [2] * (len(groups) - 1) if len(groups) > 1 else [0])
        if len(groups) == 1:
            plugin_case(torch, ops, name + " skip 3", groups, [B], [D], [3])

    plugin_read(torch, ops)
    plugin_upload(ops)
    if DEV == "cpu":
        return
    # refusals: nothing enqueued, an error line, no abort
    g = PGroup(torch, F_FA_NHD, 1, 2048, 16, 1, 8, i16, seed=15)
    big = list(range(1025))
    kg = g.kernel_group(len(big), 0)
    s = ops.stream_new(0, kg.entry_bytes, err.buf, 512)
    try:
        addrs = (ctypes.c_uint64 * 1)(g.tensors[0].data_ptr())
        obj = CudaObject((ctypes.POINTER(KernelGroup) * 1)(ctypes.pointer(kg)),
                         (ctypes.POINTER(ctypes.c_uint64) * 1)(
                             ctypes.cast(addrs, ctypes.POINTER(ctypes.c_uint64))),
                         1, kg.entry_bytes)
        ids = (ctypes.c_int64 * len(big))(*big)
        bl = (ctypes.POINTER(ctypes.c_int64) * 1)(ctypes.cast(ids, ctypes.POINTER(ctypes.c_int64)))
        host = torch.empty(kg.entry_bytes, dtype=torch.uint8)
        rc = ops.copy_object(s, ctypes.byref(obj), host.data_ptr(), bl, None, True, err.buf, 512)
        check(rc == -1 and "1025" in str(err), f"1025 blocks: rc {rc}, {err}")
        print(f"  plugin refuses: {err}")
        check(ops.wait_event(s, None, 0, err.buf, 512) == 0, "wait_event of no handle")
        check(ops.wait_event(s, b"12345", 5, err.buf, 512) == -1, "a 5-byte event handle")
        print(f"  plugin refuses: {err}")
        check(ops.sync(s, err.buf, 512) == 0, f"sync after refusals: {err}")
    finally:
        ops.stream_free(s)


# ---- the bandwidth phase ----------------------------------------------------------
# The GPU goal, measured the way bench/sd_transfer_bench.c measures
# the CPU one (BENCHMARKS.md): server-driven STORE and RETRIEVE of N chunks
# of 2 MiB beside the copy an engine could do itself, cudaMemcpyAsync of the
# same bytes between device and pinned host memory, measured in the same
# run right before and right after each measured round.

BENCH_CS, BENCH_BS = 256, 16              # chunk size, block size (vLLM's default)
BENCH_NL, BENCH_NH, BENCH_HS = 8, 2, 128  # per chunk [2, 8, 256, 256] bf16 = 2 MiB
BENCH_OBJ = 2 * BENCH_NL * BENCH_CS * BENCH_NH * BENCH_HS * 2
PROMPT_CHUNKS = 16                        # one request per 4096-token prompt
PROMPT_TOKENS = PROMPT_CHUNKS * BENCH_CS
BW_GOAL, P50_GOAL = 0.85, 2.0             # x cudaMemcpyAsync; x NOOP p50


class CudaEngine:
    """The engine's side of the bench on the GPU: KV caches are torch CUDA
    tensors shared as CudaIPCWrapper pickles, and the server's replies carry
    interprocess events that say when its copies are done."""
    emulated = False

    def __init__(self, torch, uuid):
        self.torch, self.uuid = torch, uuid
        self.events = []      # the events whose handles we sent: alive while in use

    def zeros(self, shape, dtype):
        return self.torch.zeros(shape, dtype=dtype, device="cuda:0")

    def handles(self, case):
        return case.handles(self.uuid)

    def ready(self):
        """The event handle a request carries (every write enqueued so far),
        synchronized here: the timed requests then measure the server's
        copies, not our fills."""
        ev, h = event_handle(self.torch)
        self.torch.cuda.synchronize()
        self.events = self.events[-8:] + [ev]
        return h

    def imported(self, h):
        """A reply's event, imported as the reply arrives (while the server's
        copies run, so the import costs the measurement nothing)."""
        return import_server_event(self.torch, h)

    def wait(self, events):
        """Blocks until each imported reply event has completed: a reply comes
        as soon as the copies are enqueued, so a time that ended at the reply
        would not include them."""
        for ev in events:
            ev.synchronize()

    def sync(self):
        self.torch.cuda.synchronize()

    def settled(self, pred):
        return pred()         # after wait(): no polling, a late byte is a FAIL

    def copy_buffers(self, nbytes):
        """Device memory and pinned host memory (cudaHostAlloc) for the baseline."""
        t = self.torch
        return (t.empty(nbytes, dtype=t.uint8, device="cuda:0"),
                t.empty(nbytes, dtype=t.uint8, pin_memory=True), t.cuda.Stream())

    def stream(self, s):
        return self.torch.cuda.stream(s)

    def close(self):
        pass


class EmulEngine:
    """--emul: the bench's requests against lmcached running the CPU stand-in
    of the library (tests/cuda_emul, LMCACHED_CUDA_LIB): KV caches in POSIX
    shared memory that the memory handles name, device UUID emul-0.  The
    stand-in's events are counters nobody can wait on, so wait() returns at
    once and the byte checks poll.  It checks this script's requests and
    bookkeeping without a GPU; its numbers mean nothing."""
    emulated = True

    def __init__(self, torch):
        self.torch, self.names, self.keep = torch, {}, []

    def zeros(self, shape, dtype):
        t = self.torch
        nbytes = t.empty((), dtype=dtype).element_size()
        for n in shape:
            nbytes *= n
        name = f"/lmc_gpubench_{os.getpid()}_{len(self.keep)}"
        fd = os.open("/dev/shm" + name, os.O_CREAT | os.O_RDWR | os.O_TRUNC, 0o600)
        try:
            os.ftruncate(fd, nbytes)
            mm = mmap.mmap(fd, nbytes)
        finally:
            os.close(fd)
        big = t.frombuffer(mm, dtype=t.uint8).view(dtype).view(shape)
        self.keep.append((name, mm))
        self.names[big.data_ptr()] = (name, nbytes)
        return big

    def handles(self, case):
        name, nbytes = self.names[case.big.data_ptr()]
        handle = (0, name.encode().ljust(64, b"\0"), nbytes, 0, b"/emul", 0, bytes(64), False)
        return [ipc_wrapper(t, handle, "emul-0") for t in case.layers]

    def ready(self):
        return bytes(64)

    def imported(self, h):
        check(isinstance(h, bytes) and len(h) == 64, f"an event handle of {h!r:.80}")
        return h

    def wait(self, events):
        pass

    def sync(self):
        pass

    def settled(self, pred, timeout=30.0):
        deadline = time.monotonic() + timeout
        while not pred() and time.monotonic() < deadline:
            time.sleep(0.05)
        return pred()

    def copy_buffers(self, nbytes):
        t = self.torch
        return t.empty(nbytes, dtype=t.uint8), t.empty(nbytes, dtype=t.uint8), None

    def stream(self, s):
        return contextlib.nullcontext()

    def close(self):
        for name, _ in self.keep:
            try:
                os.unlink("/dev/shm" + name)
            except OSError:
                pass


class CopyBaseline:
    """cudaMemcpyAsync of the bench's bytes between device memory and pinned
    host memory, issued as an engine would with torch (copy_(non_blocking=
    True) on a stream of its own, then a synchronize): in chunk-sized pieces,
    as the server copies one object at a time, and as one big copy.  Each
    direction's faster one is its baseline: D2H for STORE, H2D for RETRIEVE."""

    def __init__(self, eng, nbytes, piece, reps=2):
        self.eng, self.nbytes, self.piece, self.reps = eng, nbytes, piece, reps
        self.dev, self.host, self.s = eng.copy_buffers(nbytes)

    def _gbps(self, dst, src, piece):
        best = 0.0
        for _ in range(self.reps):
            self.eng.sync()
            t0 = time.perf_counter()
            with self.eng.stream(self.s):
                if piece:
                    for off in range(0, self.nbytes, piece):
                        dst[off:off + piece].copy_(src[off:off + piece], non_blocking=True)
                else:
                    dst.copy_(src, non_blocking=True)
            if self.s is not None:
                self.s.synchronize()
            best = max(best, self.nbytes / (time.perf_counter() - t0) / 1e9)
        return best

    def measure(self):
        """{"d2h": (best GB/s, "pieces"|"one copy", {way: GB/s}), "h2d": ...}"""
        out = {}
        for way, dst, src in (("d2h", self.host, self.dev), ("h2d", self.dev, self.host)):
            by = {"pieces": self._gbps(dst, src, self.piece), "one copy": self._gbps(dst, src, 0)}
            name = max(by, key=by.get)
            out[way] = (by[name], name, by)
        return out


def kv_blocks(case, first, n):
    """Blocks [first, first + n) of every layer and plane, as int16: bf16
    random bits may be NaNs, which torch.equal would call different."""
    return case.big[:, :, first:first + n].view(case.torch.int16)


def bench_round(eng, srv, d, case, instance, model, n_chunks, seed):
    """STORE of n_chunks chunks from blocks 1.. (one request per 4096-token
    prompt), LOOKUP of each prompt, RETRIEVE into the blocks after them; each
    transfer timed from the first request until every reply's event has
    completed.  GB/s of STORE and RETRIEVE; wrong bytes raise."""
    torch = eng.torch
    per = PROMPT_CHUNKS * BENCH_CS // BENCH_BS            # block ids per request
    n_blocks = n_chunks * BENCH_CS // BENCH_BS
    src0, dst0 = 1, 1 + n_blocks                          # block 0: vLLM's null block
    prompts = [prompt(seed * 1000 + p, PROMPT_TOKENS) for p in range(n_chunks // PROMPT_CHUNKS)]
    torch.manual_seed(seed)
    kv_blocks(case, src0, n_blocks).random_()             # new bytes every round
    kv_blocks(case, dst0, n_blocks).zero_()

    def transfer(op, rids, first, *extra):
        h = eng.ready()
        t0 = time.perf_counter()
        events = []
        for p, toks in enumerate(prompts):
            ids = list(range(first + p * per, first + (p + 1) * per))
            r = unpack(d.call(op, key(toks, 0, PROMPT_TOKENS, rids[p], model), instance, [ids],
                              h, *extra))
            check(isinstance(r, list) and len(r) == 2 and r[1] is True,
                  f"{'STORE' if op == STORE else 'RETRIEVE'} of prompt {p} replied {r!r:.120}")
            events.append(eng.imported(r[0]))
        eng.wait(events)
        return n_chunks * BENCH_OBJ / (time.perf_counter() - t0) / 1e9

    srids = [f"bw{seed}-s{p}" for p in range(len(prompts))]
    st = transfer(STORE, srids, src0)
    for r in srids:
        d.call(END_SESSION, r)
    rrids = []
    for p, toks in enumerate(prompts):   # untimed; retried until the STORE is published
        hits, rid = lookup(srv, toks, PROMPT_TOKENS, f"bw{seed}-r{p}", model, PROMPT_CHUNKS,
                           d=d, retry_sleep=0.005)
        check(hits == PROMPT_CHUNKS, f"LOOKUP of prompt {p} hit {hits} of {PROMPT_CHUNKS}")
        rrids.append(rid)
    rt = transfer(RETRIEVE, rrids, dst0, 0)
    for r in rrids:
        d.call(END_SESSION, r)
    check(eng.settled(lambda: torch.equal(kv_blocks(case, dst0, n_blocks),
                                          kv_blocks(case, src0, n_blocks))),
          f"the {n_chunks} retrieved chunks differ from the stored blocks")
    return st, rt


def bench_overhead(eng, srv, d, iters):
    """Request overhead, as sd_transfer_bench's: per iteration a NOOP, the
    STORE of one new 16 KiB chunk (1 layer, [2, 16, 2, 8] bf16 blocks), its
    LOOKUP, its RETRIEVE into other blocks (checked), END.  A CUDA reply comes
    before the copy ends, so STORE and RETRIEVE are timed until the reply's
    event completed, which is what a CPU server's reply means; the reply
    alone is printed too.  Returns (STORE p50 / NOOP p50, RETRIEVE's)."""
    torch = eng.torch
    case = Case(torch, "fa_nhd", nl=1, nb=64, bs=BENCH_BS, nh=2, hs=8, alloc=eng.zeros)
    frames = d.call(REGISTER_KV_CACHE, 900, eng.handles(case), "small", 1, "vllm", {"kv_layout": "NHD"}, [],
                    timeout_ms=60000)
    check(frames is not None and len(frames) == 2, "overhead: REGISTER_KV_CACHE refused")
    bpc = BENCH_CS // BENCH_BS
    src, dst = list(range(1, 1 + bpc)), list(range(1 + bpc, 1 + 2 * bpc))
    torch.manual_seed(5)
    kv_blocks(case, 1, bpc).random_()
    h = eng.ready()
    noop, st, st_reply, rt, rt_reply = [], [], [], [], []
    for i in range(iters):
        toks = prompt(30000 + i, BENCH_CS)
        rid = f"o{i}"
        t0 = time.perf_counter()
        check(d.call(NOOP) is not None, "NOOP: no reply")
        t1 = time.perf_counter()
        r = unpack(d.call(STORE, key(toks, 0, BENCH_CS, rid, "small"), 900, [src], h))
        t2 = time.perf_counter()
        check(isinstance(r, list) and len(r) == 2 and r[1] is True, f"STORE replied {r!r:.120}")
        eng.wait([eng.imported(r[0])])
        t3 = time.perf_counter()
        d.call(END_SESSION, rid)
        hits, lrid = lookup(srv, toks, BENCH_CS, rid + "-l", "small", 1, d=d, retry_sleep=0.001)
        check(hits == 1, f"overhead: LOOKUP {i} hit {hits}")
        kv_blocks(case, 1 + bpc, bpc).zero_()
        eng.sync()
        t4 = time.perf_counter()
        r = unpack(d.call(RETRIEVE, key(toks, 0, BENCH_CS, lrid, "small"), 900, [dst], h, 0))
        t5 = time.perf_counter()
        check(isinstance(r, list) and len(r) == 2 and r[1] is True,
              f"RETRIEVE replied {r!r:.120}")
        eng.wait([eng.imported(r[0])])
        t6 = time.perf_counter()
        d.call(END_SESSION, lrid)
        check(eng.settled(lambda: torch.equal(kv_blocks(case, 1 + bpc, bpc),
                                              kv_blocks(case, 1, bpc))),
              f"overhead: iteration {i} retrieved other bytes")
        noop.append(t1 - t0)
        st.append(t3 - t1), st_reply.append(t2 - t1)
        rt.append(t6 - t4), rt_reply.append(t5 - t4)
    frames = d.call(UNREGISTER_KV_CACHE, 900, timeout_ms=30000)
    check(frames is not None, "overhead: UNREGISTER got no reply")

    def p50(xs):
        return sorted(xs)[len(xs) // 2]
    n50 = p50(noop)
    kib = 2 * BENCH_CS * 2 * 8 * 2 // 1024
    print(f"  one {kib} KiB chunk, {iters} requests: NOOP p50 {n50 * 1e6:.1f} us; "
          f"STORE p50 {p50(st) * 1e6:.1f} us ({p50(st) / n50:.2f}x; reply "
          f"{p50(st_reply) * 1e6:.1f} us); RETRIEVE p50 {p50(rt) * 1e6:.1f} us "
          f"({p50(rt) / n50:.2f}x; reply {p50(rt_reply) * 1e6:.1f} us)", flush=True)
    return p50(st) / n50, p50(rt) / n50


def l1_placement(l1_bytes):
    """lmcached's default L1, a /dev/shm segment, where /dev/shm can hold it
    (a container's default is 64 MiB, and a short one leaves part of the
    arena uncommitted, hence unpinned), else private memory (--shm-name ""),
    which the server-driven path does not mind.  (extra args, words)."""
    st = os.statvfs("/dev/shm")
    avail = st.f_bavail * st.f_frsize
    if avail >= l1_bytes + (256 << 20):
        return [], "in /dev/shm"
    return ["--shm-name", ""], f"in private memory (/dev/shm has {avail / 2**30:.1f} GiB free)"


def median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2]


def bench_layout(eng, z, args, layout, baseline, label):
    """One fresh server for one layout: registration, a warm-up round (the
    server's first copies: kernels, event paths, the arena's first use),
    CLEAR, then args.rounds measured rounds (CLEAR after each), each beside
    the mean of the baseline measured right before and right after it; the
    request-overhead loop on the NHD server.  Returns the phase's results."""
    torch = eng.torch
    n = args.chunks
    l1_gb = 4 * n * BENCH_OBJ / 2**30 + 0.25
    extra, where = l1_placement(int(l1_gb * 2**30))
    srv = Server(z, args.lmcached, args.lib_dir, args.cuda_lib, "--chunk-size", str(BENCH_CS),
                 "--no-l1-use-lazy", "--max-gpu-workers", "1", *extra, l1_gb=f"{l1_gb:.3f}")
    ok, res = False, {"layout": layout}
    d = srv.dealer()
    try:
        fmt = {"NHD": "fa_nhd", "HND": "fa_hnd"}[layout]
        case = Case(torch, fmt, nl=BENCH_NL, nb=1 + 2 * n * BENCH_CS // BENCH_BS, bs=BENCH_BS,
                    nh=BENCH_NH, hs=BENCH_HS, alloc=eng.zeros)
        instance, model = 800, f"bench-{layout.lower()}"
        t0 = time.monotonic()       # the first CUDA registration pins the L1: seconds
        frames = d.call(REGISTER_KV_CACHE, instance, eng.handles(case), model, 1, "vllm",
                        {"kv_layout": layout}, [], timeout_ms=120000)
        reg_s = time.monotonic() - t0
        check(frames is not None and len(frames) == 2,
              f"bench {layout}: REGISTER_KV_CACHE got no reply (refused): see the server log")
        pin = [l.split(": ", 1)[-1] for l in srv.output().splitlines() if "not pinned" in l]
        print(f"  {layout}: L1 {l1_gb:.2f} GiB {where}, "
              f"{'NOT pinned: ' + pin[0] if pin else 'pinned (no not-pinned line in the log)'}"
              f"; REGISTER_KV_CACHE took {reg_s:.2f} s", flush=True)

        st, rt = bench_round(eng, srv, d, case, instance, model, n, seed=1)
        print(f"  {layout} warm-up round on the fresh server: STORE {st:.2f} GB/s, "
              f"RETRIEVE {rt:.2f} GB/s", flush=True)
        check(d.call(CLEAR) is not None, "CLEAR: no reply")
        rounds = []
        for r in range(args.rounds):
            before = baseline.measure()
            st, rt = bench_round(eng, srv, d, case, instance, model, n, seed=2 + r)
            after = baseline.measure()
            check(d.call(CLEAR) is not None, "CLEAR: no reply")
            d2h = (before["d2h"][0] + after["d2h"][0]) / 2
            h2d = (before["h2d"][0] + after["h2d"][0]) / 2
            rounds.append((st, rt, d2h, h2d))
            print(f"  {layout} round {r + 1}: STORE {st:.2f} GB/s ({st / d2h:.2f}x), RETRIEVE "
                  f"{rt:.2f} GB/s ({rt / h2d:.2f}x); D2H {before['d2h'][0]:.2f} -> "
                  f"{after['d2h'][0]:.2f} GB/s, H2D {before['h2d'][0]:.2f} -> "
                  f"{after['h2d'][0]:.2f} GB/s (before -> after); bytes equal", flush=True)
        res["store_x"] = median([s / b for s, _, b, _ in rounds])
        res["retrieve_x"] = median([r / b for _, r, _, b in rounds])
        res["store"] = median([s for s, _, _, _ in rounds])
        res["retrieve"] = median([r for _, r, _, _ in rounds])
        res["d2h"] = median([b for _, _, b, _ in rounds])
        res["h2d"] = median([b for _, _, _, b in rounds])
        print(f"{label} {layout} {n} chunks: STORE {res['store']:.2f} GB/s "
              f"({res['store_x']:.2f}x), RETRIEVE {res['retrieve']:.2f} GB/s "
              f"({res['retrieve_x']:.2f}x) beside D2H {res['d2h']:.2f} GB/s / H2D "
              f"{res['h2d']:.2f} GB/s (median of {args.rounds} round"
              f"{'s' if args.rounds > 1 else ''})", flush=True)
        if layout == "NHD" and args.iters:
            res["p50"] = bench_overhead(eng, srv, d, args.iters)
        frames = d.call(UNREGISTER_KV_CACHE, instance, timeout_ms=30000)
        check(frames is not None and len(frames) == 2, f"bench {layout}: UNREGISTER: no reply")
        ok = True
    finally:
        d.close()
        rc = srv.stop()
        if not ok or rc != 0 or args.verbose:
            print("---- lmcached log (tail) ----")
            print("\n".join(srv.output().splitlines()[-60:]))
    check(rc == 0, f"lmcached exited {rc}")
    return res


def bench_main(eng, z, args):
    """The bandwidth phase: one server per layout (NHD, then HND) and a
    summary line; missing a goal is reported, never a failure, as in every
    benchmark here; wrong bytes or a failed request raise (FAIL)."""
    label = "EMUL" if eng.emulated else "GPU"
    t_start = time.monotonic()
    n = args.chunks
    print(f"bench: server-driven STORE/RETRIEVE of {n} chunks of {BENCH_OBJ >> 20} MiB "
          f"([2, {BENCH_NL} layers, {BENCH_CS} tokens, {BENCH_NH}x{BENCH_HS}] bf16, block size "
          f"{BENCH_BS}, {PROMPT_CHUNKS} chunks a request) beside cudaMemcpyAsync of the same "
          f"{n * BENCH_OBJ >> 20} MiB", flush=True)
    if eng.emulated:
        print("  (--emul: the CPU stand-in of the library; these numbers mean nothing)")
    baseline = CopyBaseline(eng, n * BENCH_OBJ, BENCH_OBJ)
    first = baseline.measure()
    for way in ("d2h", "h2d"):
        by = first[way][2]
        print(f"  baseline {way.upper()}: {BENCH_OBJ >> 20} MiB pieces {by['pieces']:.2f} GB/s, "
              f"one copy {by['one copy']:.2f} GB/s (faster: {first[way][1]})", flush=True)
    results = [bench_layout(eng, z, args, layout, baseline, label) for layout in args.layouts]
    del baseline
    bw = [(r["layout"], r["store_x"], r["retrieve_x"]) for r in results]
    bw_met = all(s >= BW_GOAL and x >= BW_GOAL for _, s, x in bw)
    p50 = next((r["p50"] for r in results if "p50" in r), None)
    words = ", ".join(f"{l} STORE {s:.2f}x RETRIEVE {x:.2f}x" for l, s, x in bw)
    line = (f"SUMMARY {label}: bytes PASS (every round verified); bandwidth >= {BW_GOAL}x "
            f"cudaMemcpyAsync: {'MET' if bw_met else 'NOT MET'} ({words})")
    if p50:
        p50_met = p50[0] <= P50_GOAL and p50[1] <= P50_GOAL
        line += (f"; one-chunk p50 <= {P50_GOAL:g}x NOOP: {'MET' if p50_met else 'NOT MET'} "
                 f"(STORE {p50[0]:.2f}x, RETRIEVE {p50[1]:.2f}x)")
    print(line)
    print(f"bench: {time.monotonic() - t_start:.1f} s", flush=True)


SKIPPED = 77                   # ctest's SKIP_RETURN_CODE for gpu.cuda_ipc


def no_gpu_reason():
    """Why the GPU phases cannot run here, or None when they can."""
    try:
        torch = real_torch()
    except ImportError as e:
        return f"no torch ({e})"
    if not torch.cuda.is_available():
        return f"torch {torch.__version__} sees no CUDA device"
    return None


def with_server(z, args, fn, *extra):
    """fn(srv) against a fresh lmcached; its log's tail printed on failure."""
    srv = Server(z, args.lmcached, args.lib_dir, args.cuda_lib,
                 "--chunk-size", str(args.chunk_size), *extra)
    ok = False
    try:
        fn(srv)
        ok = True
    finally:
        rc = srv.stop()
        if not ok or rc != 0 or args.verbose:
            print("---- lmcached log (tail) ----")
            print("\n".join(srv.output().splitlines()[-80:]))
    check(rc == 0, f"lmcached exited {rc}")


def gpu_main(args, z):
    torch = real_torch()
    check(torch.cuda.is_available(), "torch sees no CUDA device")
    props = torch.cuda.get_device_properties(0)
    uuid = str(props.uuid)
    print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, {props.name}, uuid {uuid}",
          flush=True)
    if "plugin" in args.phases:
        t0 = time.monotonic()
        print("plugin: liblmcached_cuda.so driven directly, against torch", flush=True)
        plugin_main(torch, args, uuid)
        print(f"plugin: PASS ({time.monotonic() - t0:.1f} s)", flush=True)
    if "server" in args.phases:
        t0 = time.monotonic()
        print("server: lmcached over CUDA IPC", flush=True)

        def formats(srv):
            for i, fmt in enumerate(args.formats):
                run_case(torch, srv, fmt, 100 + i, uuid, args.chunk_size)
        with_server(z, args, formats)
        with_server(z, args, lambda srv: run_layerwise_case(torch, srv, 200, uuid,
                                                            args.chunk_size),
                    "--layerwise-batch", "2")
        print(f"server: PASS ({time.monotonic() - t0:.1f} s)", flush=True)
    if "bench" in args.phases:      # last: only once the correctness phases passed
        torch.cuda.empty_cache()
        bench_main(CudaEngine(torch, uuid), z, args)


def emul_main(args):
    """The plugin and bench phases on the CPU, against a stand-in library
    that copies host memory (tests/cuda_emul): checks this script's torch
    gather and scatter and the bench's requests, not the CUDA kernel."""
    global DEV
    torch = real_torch()
    DEV = "cpu"
    args.cuda_lib = args.emul
    if "plugin" in args.phases:
        plugin_main(torch, args, "emul-0")
    if "bench" in args.phases:
        eng = EmulEngine(torch)
        try:
            bench_main(eng, Zmq(load_libzmq(args.lib_dir)), args)
        finally:
            eng.close()


def selftest_main(args, z):
    """No torch, no GPU: the plugin's ctypes plumbing, the ZMQ client and
    the server's refusal."""
    _, ops = load_plugin(args.cuda_lib or os.path.join(args.bundle, "liblmcached_cuda.so"))
    err, n = Err(), ctypes.c_int(0)
    rc = ops.init(ctypes.byref(n), err.buf, 512)
    print(f"  plugin: ABI {ops.abi_version}, init rc {rc}: {n.value} device(s) {err}")
    check(rc == 0 or str(err), "init failed without a reason")
    srv = Server(z, args.lmcached, args.lib_dir, args.cuda_lib,
                 "--chunk-size", str(args.chunk_size))
    ok = False
    try:
        d = srv.dealer()
        check(d.call(NOOP) is not None, "NOOP: no reply")
        toks = prompt(1, 2 * args.chunk_size)
        check(d.call(LOOKUP, key(toks, 0, len(toks), "st", "m", worker_id=None), 1)
              is not None, "LOOKUP: no reply")
        hits = None
        for _ in range(100):
            hits = unpack(d.call(QUERY_PREFETCH_STATUS, "st"))
            if hits is not None:
                break
            time.sleep(0.02)
        check(hits == 0, f"QUERY on an empty cache: {hits}")
        fake = w.cuda_ipc((2, 8, 16, 2, 8), (2048, 256, 16, 8, 1))
        frames = d.call(REGISTER_KV_CACHE, 5, [msgpack.ExtType(1, w.dumps(fake))], "m", 1, "vllm",
                        {"kv_layout": "NHD"}, [], timeout_ms=5000)
        check(frames is None, "a CUDA registration without a GPU was accepted")
        deadline = time.monotonic() + 5
        while "CUDA" not in srv.output() and time.monotonic() < deadline:
            time.sleep(0.05)
        log = srv.output()
        line = next((l for l in log.splitlines() if "CUDA" in l), None)
        check(line is not None, "the server logged no reason for refusing CUDA tensors")
        print("  refused:", line.strip())
        d.close()
        ok = True
    finally:
        rc = srv.stop()
        if not ok or args.verbose:
            print(srv.output()[-4000:])
    check(rc == 0, f"lmcached exited {rc}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bundle", default=os.path.join(HERE, "bundle"),
                    help="dir with lmcached, liblmcached_cuda.so and lib/ (tests/gpu/bundle.sh)")
    ap.add_argument("--lmcached", help="the server binary (default: BUNDLE/lmcached)")
    ap.add_argument("--lib-dir", help="shared libraries for the server and libzmq "
                                      "(default: BUNDLE/lib)")
    ap.add_argument("--cuda-lib", help="liblmcached_cuda.so to load (LMCACHED_CUDA_LIB; "
                                       "default: the one beside lmcached)")
    ap.add_argument("--chunk-size", type=int, default=64,
                    help="server phase: the chunk size (the bench uses 256)")
    ap.add_argument("--formats", nargs="+", default=["fa_nhd", "fa_hnd", "mla"],
                    help="server phase: the engine KV formats registered")
    ap.add_argument("--phases", nargs="+", default=["plugin", "server", "bench"],
                    choices=["plugin", "server", "bench"],
                    help="plugin: the library alone in this process; server: lmcached over "
                         "IPC; bench: STORE/RETRIEVE bandwidth beside cudaMemcpyAsync (last)")
    ap.add_argument("--bench", action="store_true", help="only the bench phase")
    ap.add_argument("--no-bench", action="store_true", help="only the correctness phases")
    ap.add_argument("--chunks", type=int,
                    help="bench: 2 MiB chunks per round, a multiple of 16 (default 512, "
                         "--emul 32)")
    ap.add_argument("--rounds", type=int, default=3,
                    help="bench: measured rounds per layout (the medians are reported)")
    ap.add_argument("--iters", type=int,
                    help="bench: one-chunk requests timed for the p50s (default 1000, "
                         "--emul 50; 0 skips)")
    ap.add_argument("--layouts", nargs="+", default=["NHD", "HND"], choices=["NHD", "HND"],
                    help="bench: the FlashAttention layouts measured, a fresh server each")
    ap.add_argument("--zmq-selftest", action="store_true",
                    help="no torch/GPU: check the ZMQ client and the refusal without a GPU")
    ap.add_argument("--emul", metavar="LIB",
                    help="no GPU: the plugin phase on the CPU against a stand-in library "
                         "(libcuda_emul.so), to check this script")
    ap.add_argument("--skip-without-gpu", action="store_true",
                    help="exit 77 (skipped) with the reason where torch sees no CUDA device")
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args()
    if args.skip_without_gpu and not (args.emul or args.zmq_selftest):
        why = no_gpu_reason()
        if why:
            print(f"SKIP: {why}: the CUDA IPC check needs a GPU (tests/gpu/README.md)")
            return SKIPPED
    if args.bench:
        args.phases = ["bench"]
    elif args.no_bench:
        args.phases = [p for p in args.phases if p != "bench"]
    n = args.chunks if args.chunks is not None else (32 if args.emul else 512)
    args.chunks = max(PROMPT_CHUNKS, n // PROMPT_CHUNKS * PROMPT_CHUNKS)
    args.iters = args.iters if args.iters is not None else (50 if args.emul else 1000)
    args.rounds = max(1, args.rounds)
    # run.sh's timeout kills us silently: print where we hung a little before it.
    limit = int(os.environ.get("GPU_TEST_TIMEOUT", "0") or 0)
    if limit > 30:
        faulthandler.dump_traceback_later(limit - 20, exit=False)
    args.lmcached = args.lmcached or os.path.join(args.bundle, "lmcached")
    args.lib_dir = args.lib_dir or os.path.join(args.bundle, "lib")
    try:
        if args.emul:
            emul_main(args)
        else:
            if not args.zmq_selftest:
                real_torch()   # first: its libstdc++ is the one libzmq gets
            z = Zmq(load_libzmq(args.lib_dir))
            (selftest_main if args.zmq_selftest else gpu_main)(args, z)
    except Exception as e:  # noqa: BLE001
        traceback.print_exc()
        print(f"FAIL: {e}")
        return 1
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
