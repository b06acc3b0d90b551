#!/usr/bin/python3
"""p2p_lookup_bench: a LOOKUP that a peer's L1 answers (docs/p2p.md,
"Requesting side") beside the same LOOKUP answered by the local L1, in one
run.  A real lmcached-coordinator and two lmcached servers (A and B) with
the tcp engine (--engine ucx: the ucx engine, UCX_TLS from the environment)
discover each other on loopback; a worker stores a prompt
of --chunks chunks of 256 tokens on A (default 128: 32,768 tokens).  Each
round then times, in alternating order:

  peer:  a forced CLEAR of B's L1 (untimed), then LOOKUP + WAIT_PREFETCH_STATUS
         of the prompt on B: every chunk leased, read and unlocked from A;
  local: the same LOOKUP + WAIT_PREFETCH_STATUS on A, whose L1 holds it;

each timed from sending LOOKUP to WAIT's reply of all chunks hit (the key
frames packed beforehand), then FREE_LOOKUP_LOCKS and END_SESSION.  The
first round, on fresh servers (B's first connection to A), is printed apart
from the median of the others.  Also printed, for scale: a memcpy of the
prompt's bytes in this process.  Goal: peer / local <= 3x.

With --breakdown, A also reports its cache events to the coordinator, whose
directory gives the prompt's object keys; this process then does what B's
reader of A does, step by step and timed apart (docs/p2p.md, "Requesting
side"): P2P_LOOKUP_AND_LOCK (29) and P2P_QUERY_LOOKUP_RESULTS (30) of the
chunks on A, one read of all of them over A's tcp channel, and
P2P_UNLOCK_OBJECTS (31), which B sends without waiting.  Python's own
cost makes these upper bounds of what B's C reader spends.

    /usr/bin/python3 bench/p2p_lookup_bench.py [--rounds 11] [--chunks 128]
        [--layers 8 --hidden 256] [--breakdown] [--engine tcp|ucx]

The chunk's bytes are 2 x layers x 256 x hidden x 2 (float16 K and V):
2 MiB by default, as l2_lookup_bench and transfer_bench; --layers 2
--hidden 8 gives the 16 KiB of the e2e tests' Worker at 256 tokens.
Binaries: LMCACHED_BIN and LMCACHED_COORDINATOR_BIN, else build/.
"""
import argparse
import ctypes
import json
import os
import shutil
import socket
import struct
import statistics
import sys
import tempfile
import time
import urllib.request

import msgpack

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "e2e"))

from lmc.client import unpack  # noqa: E402
from lmc.keys import ipc_key, object_key  # noqa: E402
from lmc.ops import (CLEAR, END_SESSION, FREE_LOOKUP_LOCKS, LOOKUP, NOOP, P2P_LOOKUP_AND_LOCK,  # noqa: E402
                     P2P_QUERY_LOOKUP_RESULTS, P2P_UNLOCK_OBJECTS, WAIT_PREFETCH_STATUS)
from lmc.server import Server, free_port  # noqa: E402
from test_coordinator_api import Coordinator  # noqa: E402
from test_lookup_engine_driven import Worker  # noqa: E402

CS = 256
GOAL = 3.0


def status(srv):
    with urllib.request.urlopen(f"http://127.0.0.1:{srv.http_port}/status", timeout=5) as r:
        return json.loads(r.read())


def node(coord, name, l1_gb, engine, *more):
    return Server(*more, "--p2p-advertise-url", f"127.0.0.1:{free_port()}",
                  "--p2p-transfer-engine", engine,
                  "--coordinator-url", f"http://127.0.0.1:{coord.port}", "--instance-id", name,
                  "--coordinator-advertise-ip", "127.0.0.1", "--coordinator-heartbeat-interval",
                  "0.2", "--chunk-size", str(CS), "--l1-size-gb", str(l1_gb),
                  "--log-level", "WARNING")


def minor_faults(pid):
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[7])


def wait_until(what, probe, timeout=15):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if what(probe()):
            return
        time.sleep(0.05)
    raise SystemExit(f"p2p_lookup_bench: never happened; last: {probe()}")


def timed_lookup(d, toks, rid, n_chunks):
    """Seconds from sending LOOKUP to WAIT_PREFETCH_STATUS's reply; exits
    when not every chunk is a hit."""
    key = ipc_key(toks, 0, n_chunks * CS, rid, world_size=1)
    frames = [msgpack.packb(key, use_bin_type=True), msgpack.packb(1)]
    wait = [msgpack.packb(rid), msgpack.packb(10.0)]
    t0 = time.perf_counter()
    ok = d.call(LOOKUP, raw=frames) is not None
    hits = unpack(d.call(WAIT_PREFETCH_STATUS, raw=wait, timeout_ms=15000)) if ok else None
    dt = time.perf_counter() - t0
    if hits != n_chunks:
        raise SystemExit(f"p2p_lookup_bench: {rid}: {hits} of {n_chunks} chunks hit")
    assert d.call(FREE_LOOKUP_LOCKS, key, 1) is not None
    assert d.call(END_SESSION, rid) is not None
    return dt


def recv_into(sock, view):
    while len(view):
        n = sock.recv_into(view)
        if not n:
            raise SystemExit("p2p_lookup_bench: the channel closed mid-reply")
        view = view[n:]


def channel_read(sock, rid, addrs, buf):
    """One tcp-channel request of every (offset, size) (docs/p2p.md,
    "Framing (tcp)") read into buf; seconds."""
    req = struct.pack("<III", 1, rid, len(addrs)) + b"".join(
        struct.pack("<qq", a["offset"], a["size"]) for a in addrs)
    head = bytearray(16 + (len(addrs) + 7) // 8)
    t0 = time.perf_counter()
    sock.sendall(req)
    recv_into(sock, memoryview(head))
    if not all(head[16 + i // 8] >> (i % 8) & 1 for i in range(len(addrs))):
        raise SystemExit("p2p_lookup_bench: the channel refused a range")
    view, at = memoryview(buf), 0
    for a in addrs:
        recv_into(sock, view[at:at + a["size"]])
        at += a["size"]
    return time.perf_counter() - t0


def breakdown(coord, srv_a, chan_port, n_chunks, obj, rounds):
    """B's reader's steps, timed apart from this process against A."""
    total = 0
    while total < n_chunks:
        time.sleep(0.1)
        total = coord.call("GET", "/directory/keys?tier=l1&instance_id=node-a")[1]["total"]
    listed = coord.call("GET", f"/directory/keys?tier=l1&instance_id=node-a&limit={n_chunks}")[1]
    keys = [object_key(bytes.fromhex(e["key"]["chunk_hash_hex"]), model=e["key"]["model_name"],
                       kv_rank=e["key"]["kv_rank"], group=e["key"]["object_group_id"],
                       salt=e["key"]["cache_salt"]) for e in listed["keys"]]
    frame = [msgpack.packb(keys, use_bin_type=True), msgpack.packb(None)]
    unlock = [msgpack.packb(keys, use_bin_type=True)]
    d = srv_a.dealer()
    sock = socket.create_connection(("127.0.0.1", chan_port), timeout=10)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.sendall(b"LMTCP001")
    hs = bytearray(8)
    recv_into(sock, memoryview(hs))
    buf = bytearray(n_chunks * obj)
    steps = {"NOOP": [], "29 lock": [], "30 query": [], "channel read": [], "31 unlock": []}
    try:
        for r in range(rounds):
            t0 = time.perf_counter()
            assert d.call(NOOP) is not None
            steps["NOOP"].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            task = unpack(d.call(P2P_LOOKUP_AND_LOCK, raw=frame))
            t1 = time.perf_counter()
            addrs = unpack(d.call(P2P_QUERY_LOOKUP_RESULTS, task))
            t2 = time.perf_counter()
            assert len(addrs) == n_chunks and all(a["size"] == obj for a in addrs), addrs[:2]
            steps["channel read"].append(channel_read(sock, r + 1, addrs, buf))
            t3 = time.perf_counter()
            assert d.call(P2P_UNLOCK_OBJECTS, raw=unlock) is not None
            steps["31 unlock"].append(time.perf_counter() - t3)
            steps["29 lock"].append(t1 - t0)
            steps["30 query"].append(t2 - t1)
    finally:
        sock.close()
        d.close()
    return {k: statistics.median(v[1:] if len(v) > 1 else v) for k, v in steps.items()}


def memcpy_s(nbytes, reps=5):
    src, dst = bytearray(b"\1" * nbytes), bytearray(nbytes)
    s = (ctypes.c_char * nbytes).from_buffer(src)
    t = (ctypes.c_char * nbytes).from_buffer(dst)
    best = []
    for _ in range(reps):
        t0 = time.perf_counter()
        ctypes.memmove(t, s, nbytes)
        best.append(time.perf_counter() - t0)
    return statistics.median(best)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=11)
    ap.add_argument("--chunks", type=int, default=128)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--breakdown", action="store_true")
    ap.add_argument("--engine", choices=("tcp", "ucx"), default="tcp")
    a = ap.parse_args()
    if a.breakdown and a.engine != "tcp":
        ap.error("--breakdown reads over the tcp engine's framing: it needs --engine tcp")
    obj = 2 * a.layers * CS * a.hidden * 2
    nbytes = a.chunks * obj
    l1_gb = max(0.25, 2.5 * nbytes / 2**30)
    layout = {"world_size": 1, "layers": a.layers, "hidden": a.hidden, "block_size": CS}
    tmp = tempfile.mkdtemp(prefix="p2p-lookup-bench-")
    coord = Coordinator(os.path.join(tmp, "coord.db"))
    servers, workers, dealers = [], [], []
    try:
        report = ("--coordinator-event-reporting", "--coordinator-event-flush-interval", "0.1")
        srv_a = node(coord, "node-a", l1_gb, a.engine, *(report if a.breakdown else ()))
        servers.append(srv_a)
        srv_b = node(coord, "node-b", l1_gb, a.engine)
        servers.append(srv_b)
        wa = Worker(srv_a, 9101, 0, **layout)
        workers.append(wa)
        wb = Worker(srv_b, 9102, 0, **layout)   # B's layout: its lookups reach the peer
        workers.append(wb)
        toks = [(i * 31 + 7) % 50000 for i in range(a.chunks * CS)]
        ctx = wa.store(toks, 0, a.chunks * CS)
        assert len(ctx["slots"]) == a.chunks and ctx["slots"][0]["length"] == obj, ctx["slots"][:1]
        wait_until(lambda st: st["p2p_peer_count"] == 1 and st["p2p_state"] == "registered",
                   lambda: status(srv_b))
        da, db = srv_a.dealer(), srv_b.dealer()
        dealers += [da, db]
        cpu = "?"
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), cpu)
        print(f"p2p_lookup_bench: {a.chunks} chunks x {obj} B ({nbytes / 2**20:.1f} MiB, "
              f"{a.chunks * CS} tokens), {a.engine} engine on loopback"
              f"{', UCX_TLS=' + os.environ.get('UCX_TLS', '(unset)') if a.engine == 'ucx' else ''}; "
              f"{os.cpu_count()} CPUs, {cpu}")
        peer, local, faults = [], [], []
        for r in range(a.rounds):
            sides = ("peer", "local") if r % 2 == 0 else ("local", "peer")
            row = {}
            for side in sides:
                if side == "peer":
                    assert db.call(CLEAR, True) is not None
                    wait_until(lambda n: n == 0,
                               lambda: status(srv_b)["storage_manager"]["l1_manager"]["num_objects"])
                    f0 = minor_faults(srv_b.proc.pid)
                    row[side] = timed_lookup(db, toks, f"p{r}", a.chunks)
                    faults.append(minor_faults(srv_b.proc.pid) - f0)
                else:
                    row[side] = timed_lookup(da, toks, f"l{r}", a.chunks)
            peer.append(row["peer"])
            local.append(row["local"])
            print(f"round {r + 1:2d}: peer {row['peer'] * 1e3:8.2f} ms  local "
                  f"{row['local'] * 1e3:7.2f} ms  ratio {row['peer'] / row['local']:6.2f}",
                  flush=True)
        cp = memcpy_s(nbytes)
        print(f"B's minor page faults per peer LOOKUP: {faults[0]} in the first round, "
              f"{statistics.median(faults[1:]):.0f} (median) later")
        print(f"first round (fresh servers): peer {peer[0] * 1e3:.2f} ms, local "
              f"{local[0] * 1e3:.2f} ms, peer/local {peer[0] / local[0]:.2f}")
        mp, ml = statistics.median(peer[1:]), statistics.median(local[1:])
        print(f"steady state (median of rounds 2-{a.rounds}): peer {mp * 1e3:.2f} ms "
              f"({nbytes / mp / 2**30:.2f} GiB/s), local {ml * 1e3:.2f} ms, "
              f"peer/local {mp / ml:.2f}")
        print(f"memcpy of the same {nbytes / 2**20:.1f} MiB in this process: {cp * 1e3:.2f} ms "
              f"({nbytes / cp / 2**30:.2f} GiB/s); peer / memcpy {mp / cp:.2f}")
        pr = status(srv_b)["storage_manager"]["l2_adapters"][-1]["peers"][0]
        sv = status(srv_a)["modules"]["p2p_serve"]
        print(f"B's reader of A: lookups {pr['lookups']}, hits {pr['hits']}, loads {pr['loads']}, "
              f"loaded_bytes {pr['loaded_bytes']}, failures "
              f"{pr['lookup_failures'] + pr['load_failures']}; A: p2p lookups {sv['lookups']}, "
              f"leases_held {sv['leases_held']}")
        if a.breakdown:
            chan = int(status(srv_b)["p2p_peers"][0]["p2p_advertised_url"].rsplit(":", 1)[1])
            steps = breakdown(coord, srv_a, chan, a.chunks, obj, a.rounds)
            waited = sum(v for k, v in steps.items() if k not in ("NOOP", "31 unlock"))
            print("the reader's steps from this process (Python) against A, median of rounds "
                  "2-N: " + ", ".join(f"{k} {v * 1e3:.2f} ms" for k, v in steps.items()) +
                  f"; 29 + 30 + read (B waits for these; not for 31) {waited * 1e3:.2f} ms, "
                  f"peer LOOKUP - local LOOKUP {(mp - ml) * 1e3:.2f} ms")
        print(f"goal peer/local <= {GOAL}: {'met' if mp / ml <= GOAL else 'MISSED'} "
              f"(steady {mp / ml:.2f}, first round {peer[0] / local[0]:.2f})")
    finally:
        for d in dealers:
            d.close()
        for w in workers:
            w.close()
        for s in servers:
            s.stop()
        coord.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
