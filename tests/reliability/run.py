#!/usr/bin/python3
"""Reliability scenarios (issue 17): each one starts the real lmcached on
loopback, does something hostile to it, asserts what docs/RELIABILITY.md
promises and prints its figures. Exit status 1 when a promise is broken.

    /usr/bin/python3 tests/reliability/run.py              # every scenario, full size
    /usr/bin/python3 tests/reliability/run.py --quick      # small sizes (what make test runs)
    /usr/bin/python3 tests/reliability/run.py --only zmq_garbage,http_garbage
    /usr/bin/python3 tests/reliability/run.py --with-alloc-fault   # also make alloc-fault

LMCACHED_BIN picks the binary (default build/lmcached). A real server a
scenario needs (redis-server) that is missing makes it fail under CI=true
and is reported as NOT RUN otherwise."""
import argparse
import collections
import http.client as httpc
import json
import os
import random
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback

import msgpack
import zmq

from rel_common import (CLEAR, CS, END_SESSION, LOOKUP, NOOP, PING, ROOT,
                        WAIT_PREFETCH_STATUS, BooksWatch, Broken,
                        Server, Worker, alive, check, chunk_bytes, ci, fd_count,
                        git_commit, have_redis, http, key, kill, l1, metrics, prompt, round_trip,
                        rss_kib, start_redis, start_redis_fresh, status, unpack)


class NotRun(Exception):
    """A scenario could not run here (a missing real server)."""


def median(xs):
    return statistics.median(xs) if xs else 0.0


def counts(c):
    return ", ".join(f"{k} {v}" for k, v in sorted(c.items()))


# ---- garbage ZMQ frames --------------------------------------------------------

KEY_FIELDS = ["model_name", "world_size", "worker_id", "token_ids", "start", "end",
              "request_id", "cache_salt", "num_kv_readers", "request_configs",
              "null_chunk_mask", "instance_id", "num_layers", "hidden_dim_size", "dtype_str",
              "use_mla", "block_size", "kv_caches", "block_ids"]
# Frames that claim more than they hold, or use the one reserved code.
HOSTILE = [b"\xc1", b"\xdb\xff\xff\xff\xff", b"\xdd\xff\xff\xff\xff", b"\xdf\xff\xff\xff\xff",
           b"\xc6\xff\xff\xff\xffab", b"\xd9", b"\x92\x01", b"\xde\x00\x02\xa1a", b"",
           b"\xc7\xff\x01", b"\xd4", b"\xcf\xff\xff\xff\xff\xff\xff\xff\xff",
           b"\xa3\xff\xfe\xfd"]                       # a str that is not UTF-8


def rand_obj(rng, depth=0):
    t = rng.randrange(10 if depth < 3 else 7)
    if t == 0:
        return rng.choice([0, -1, 1, 2**31, -2**31, 2**63 - 1, -2**63, 2**64 - 1, 16, 64])
    if t == 1:
        return rng.randrange(-1000, 100000)
    if t == 2:
        return rng.choice([0.5, -1.0, float("nan"), float("inf"), 1e300])
    if t == 3:
        return rng.choice([None, True, False])
    if t == 4:
        return "".join(rng.choice("abc/@é\x00 ") for _ in range(rng.randrange(0, 40)))
    if t == 5:
        return rng.randbytes(rng.randrange(0, 64))
    if t == 6:
        return list(range(rng.randrange(0, 200)))
    if t == 7:
        return {f: rand_obj(rng, depth + 1) for f in rng.sample(KEY_FIELDS, rng.randrange(1, 10))}
    if t == 8:
        return [rand_obj(rng, depth + 1) for _ in range(rng.randrange(0, 5))]
    return {rng.choice([0, -1, 2**64 - 1, "", "k", b"\x00", None]): rand_obj(rng, depth + 1)
            for _ in range(rng.randrange(0, 4))}


def pack(obj):
    try:
        return msgpack.packb(obj, use_bin_type=True)
    except (TypeError, ValueError, OverflowError):
        return b"\xc0"


GARBAGE_KINDS = ["random_bytes", "too_few_frames", "unknown_op_id", "unknown_op_name",
                 "op_of_wrong_type", "truncated_payload", "wrong_types", "hostile_lengths",
                 "many_frames", "bad_uid"]
GARBAGE_OPS = [1, 2, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24,
               32, "lookup", "store", "noop", "prepare_store"]


def garbage(kind, rng, i, valid_key):
    uid = pack(10**9 + i)        # never a uid of the valid requests on the same DEALER
    if kind == "random_bytes":
        return [rng.randbytes(rng.randrange(0, 64)) for _ in range(rng.randrange(1, 6))]
    if kind == "too_few_frames":
        return [uid] if rng.random() < 0.5 else [uid, pack(24)][:rng.randrange(1, 3)]
    if kind == "unknown_op_id":
        return [uid, pack(rng.choice([3, 4, 5, 25, 26, 31, 33, 34, 99, 255, 65536, -1, 2**40])),
                pack(rand_obj(rng))]
    if kind == "unknown_op_name":
        return [uid, pack(rng.choice(["nope", "", "NOOP", "lookup ", "x" * 300, "shutdown"])),
                pack(rand_obj(rng))]
    if kind == "op_of_wrong_type":
        return [uid, pack(rng.choice([1.5, None, True, [8], {"op": 8}, b"\x08"])),
                pack(rand_obj(rng))]
    if kind == "truncated_payload":
        cut = rng.randrange(0, len(valid_key))
        return [uid, pack(rng.choice([8, 12, 16, 17, 18, 19])), valid_key[:cut], pack(4242)]
    if kind == "wrong_types":
        return [uid, pack(rng.choice(GARBAGE_OPS))] + \
            [pack(rand_obj(rng)) for _ in range(rng.randrange(0, 5))]
    if kind == "hostile_lengths":
        return [uid, pack(rng.choice(GARBAGE_OPS))] + \
            [rng.choice(HOSTILE) for _ in range(rng.randrange(1, 4))]
    if kind == "many_frames":
        return [uid, pack(rng.choice(GARBAGE_OPS))] + [pack(i)] * rng.randrange(20, 300)
    return [rng.randbytes(rng.randrange(1, 12)), pack(24)]       # bad_uid


def call_skipping(d, op, *args, timeout_ms=5000):
    """Sends a valid request; returns (reply frames or None, replies to
    garbage read meanwhile)."""
    uid = d.send(op, *args)
    other = 0
    deadline = time.monotonic() + timeout_ms / 1000
    while True:
        left = int((deadline - time.monotonic()) * 1000)
        frames = d.recv(left) if left > 0 else None
        if frames is None:
            return None, other
        try:
            if msgpack.unpackb(frames[0]) == uid:
                return frames, other
        except Exception:  # noqa: BLE001 - an echoed garbage uid
            pass
        other += 1


def sc_zmq_garbage(quick):
    n = 400 if quick else 5000
    raw_conns = 10 if quick else 100
    rng = random.Random(1701)
    srv = Server("--chunk-size", str(CS))
    fig = {}
    try:
        pid = srv.proc.pid
        fds0, rss0 = fd_count(pid), rss_kib(pid)
        m0 = metrics(srv)
        w = Worker(srv, 7001, 0, world_size=1)
        toks = prompt(11)
        w.store(toks, 0, len(toks))
        valid_key = pack(key(toks, 0, len(toks), "g", world_size=1))
        d = srv.dealer()
        kinds = collections.Counter()
        garbage_replies = valid_sent = valid_served = 0
        t0 = time.monotonic()
        for i in range(n):
            kind = GARBAGE_KINDS[i % len(GARBAGE_KINDS)]
            d.sock.send_multipart(garbage(kind, rng, i, valid_key))
            kinds[kind] += 1
            if i % 10 == 9:                  # a valid request among the garbage
                valid_sent += 1
                r, other = call_skipping(d, NOOP)
                garbage_replies += other
                valid_served += r is not None and r[2] == b"\xa2OK"
            if i % 200 == 199:               # and a worker's heartbeat now and then
                valid_sent += 1
                r, other = call_skipping(d, PING, 7001)
                garbage_replies += other
                valid_served += r is not None
        # Bytes that are not ZMTP at all, on raw TCP connections.
        for j in range(raw_conns):
            with socket.create_connection(("127.0.0.1", srv.port), timeout=2) as s:
                data = (b"\xff" + b"\x00" * 8 + b"\x7f\x03\x00NULL" + rng.randbytes(300)
                        if j % 2 else rng.randbytes(rng.randrange(1, 4096)))
                try:
                    s.sendall(data)
                    s.settimeout(0.2)
                    s.recv(64)
                except OSError:
                    pass
        kinds["raw_tcp_connections"] = raw_conns
        elapsed = time.monotonic() - t0
        d.close()
        w.close()
        check(alive(srv), "the server stopped answering after the garbage")
        round_trip(srv, 12, instance_id=7002)
        valid_sent += 1
        valid_served += 1
        books = BooksWatch()
        books.read(srv)
        books.read(srv)
        books.assert_ok()
        m1 = metrics(srv)
        time.sleep(0.5)
        fig["garbage messages sent"] = f"{n} ({counts(kinds)})"
        fig["garbage answered"] = f"{garbage_replies} (replies the server sent to garbage)"
        fig["valid requests served"] = f"{valid_served}/{valid_sent}"
        fig["rpc received/dropped (metrics)"] = (
            f"{m1.get('lmcache_mp_rpc_received_total', 0) - m0.get('lmcache_mp_rpc_received_total', 0):.0f}"
            f"/{m1.get('lmcache_mp_rpc_dropped_total', 0) - m0.get('lmcache_mp_rpc_dropped_total', 0):.0f}")
        fig["fds before/after"] = f"{fds0}/{fd_count(pid)}"
        fig["RSS before/after KiB"] = f"{rss0}/{rss_kib(pid)}"
        fig["L1 books"] = books.summary()
        fig["seconds sending"] = f"{elapsed:.1f}"
        check(valid_served == valid_sent, f"only {valid_served} of {valid_sent} valid requests served")
        check(fd_count(pid) <= fds0 + 4, f"fds grew from {fds0} to {fd_count(pid)}")
    finally:
        rc = srv.stop()
        fig["exit status at SIGTERM"] = rc
    check(rc == 0, f"lmcached exited {rc} at SIGTERM")
    return fig


# ---- garbage HTTP bodies ---------------------------------------------------------

# (method, path, a valid-looking body, the 5xx statuses docs/http.md documents)
HTTP_ROUTES = [
    ("POST", "/cache/clear", {"tier": "l1", "force": True}, ()),
    ("POST", "/clear-cache", {}, ()),
    ("POST", "/coordinator/command", {"type": "x"}, ()),
    ("POST", "/cache/checksums", {"block_ids": [0, 1], "chunk_size": 16, "instance_id": 7101}, ()),
    ("POST", "/cache/prefetches", {"model_name": "m", "world_size": 1,
                                   "token_ids": list(range(64)), "cache_salt": "",
                                   "source_tier": "l2", "target_tier": "l1"}, (503,)),
    ("POST", "/api/kv/store", None, (503,)),
    ("POST", "/api/kv/retrieve", {"model_name": "m", "tokens": list(range(64)),
                                  "cache_salt": ""}, ()),
    ("POST", "/api/kv/lookup", {"model_name": "m", "tokens": list(range(64)),
                                "cache_salt": ""}, ()),
    ("POST", "/config/policies/validate", {}, (501,)),
    ("POST", "/reconfigure/l1", {}, (501,)),
    ("PATCH", "/config/policies", {}, (501,)),
    ("PUT", "/quota/tenant", {"limit_gb": 1}, ()),
    ("PUT", "/api/quota/tenant", {"limit_gb": 1}, ()),
    ("DELETE", "/cache/objects", {"keys": [], "tier": "l1"}, ()),
]


def http_bodies(rng, valid):
    """Garbage bodies for one route: (name, bytes)."""
    text = json.dumps(valid if valid is not None else {"a": 1}).encode()
    yield "empty", b""
    yield "random_bytes", rng.randbytes(rng.randrange(1, 2048))
    yield "truncated_json", text[:rng.randrange(1, max(2, len(text)))]
    yield "not_utf8", text.replace(b'"', b'"\xff', 1)
    yield "nul_inside", text[:len(text) // 2] + b"\x00" + text[len(text) // 2:]
    yield "deep_nesting", b"[" * 20000 + b"]" * 20000
    yield "unterminated_nesting", b'{"a":' * 5000
    yield "huge_numbers", b'{"tier":1e999,"force":-1e999,"limit_gb":1e400,"tokens":[1e30]}'
    yield "wrong_types", json.dumps(rand_json(rng)).encode()
    if isinstance(valid, dict):
        bad = {k: rand_json(rng, 2) for k in valid}
        yield "fields_of_wrong_types", json.dumps(bad).encode()
        yield "duplicate_keys", b"{" + b",".join(
            json.dumps({k: v})[1:-1].encode() for k, v in list(valid.items()) * 2) + b"}"
    yield "over_limit", b"x" * (1024 * 1024 + 1)


def rand_json(rng, depth=0):
    t = rng.randrange(8 if depth < 3 else 5)
    if t == 0:
        return rng.choice([0, -1, 2**63, -2**63 - 1, 2**64, 1.5, -0.0])
    if t == 1:
        return rng.choice([None, True, False])
    if t == 2:
        return "".join(rng.choice("ab\u00e9\u2028\"\\/ ") for _ in range(rng.randrange(0, 30)))
    if t == 3:
        return list(range(rng.randrange(0, 50)))
    if t == 4:
        return ""
    if t == 5:
        return [rand_json(rng, depth + 1) for _ in range(rng.randrange(0, 4))]
    return {rng.choice(["tier", "force", "model_name", "tokens", "keys", "limit_gb",
                        "block_ids", "x"]): rand_json(rng, depth + 1)
            for _ in range(rng.randrange(0, 4))}


KV_HEADER_SETS = [
    {},
    {"X-LMCache-Model-Name": "m"},
    {"X-LMCache-Model-Name": "m", "X-LMCache-Tokens": "1,2,x"},
    {"X-LMCache-Model-Name": "m", "X-LMCache-Tokens": ",".join(["9"] * 64)},
    {"X-LMCache-Model-Name": "m", "X-LMCache-Tokens": "-1,99999999999999999999"},
    {"X-LMCache-Model-Name": "\u00ff", "X-LMCache-Tokens": "1", "X-LMCache-Cache-Salt": "../.."},
    {"X-LMCache-Model-Name": "m", "X-LMCache-Tokens": "1,2",
     "Content-Type": "application/x-lmcache-kv; v=99"},
]


def http_send(port, method, path, body, headers, timeout=10):
    """The status of one request on a fresh connection, or a string
    saying why there was none."""
    c = httpc.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        hdrs = {"Content-Type": "application/json", **headers}
        c.request(method, path, body=body, headers=hdrs)
        r = c.getresponse()
        r.read()
        return r.status
    except (OSError, httpc.HTTPException) as e:
        return f"no answer ({type(e).__name__})"
    finally:
        c.close()


def sc_http_garbage(quick):
    rounds = 2 if quick else 25
    rng = random.Random(1702)
    tmp = tempfile.mkdtemp(prefix="lmc-rel-http-")
    srv = Server("--chunk-size", str(CS), "--l2-adapter",
                 json.dumps({"type": "fs", "base_path": tmp}))
    fig = {}
    try:
        pid = srv.proc.pid
        fds0 = fd_count(pid)
        w = Worker(srv, 7101, 0, world_size=1)       # a model the kv routes know
        per_route = {}
        unexpected = []
        no_answer = []
        sent = 0
        t0 = time.monotonic()
        for r in range(rounds):
            for method, path, valid, allowed_5xx in HTTP_ROUTES:
                c = per_route.setdefault(path if method == "POST" else f"{method} {path}",
                                         collections.Counter())
                for name, body in http_bodies(rng, valid):
                    headers = rng.choice(KV_HEADER_SETS) if path == "/api/kv/store" else {}
                    st = http_send(srv.http_port, method, path, body, headers)
                    sent += 1
                    if isinstance(st, str):
                        if name == "over_limit":     # 413 from the headers may race the upload
                            c["413/closed"] += 1
                            continue
                        no_answer.append((method, path, name, st))
                        c["no answer"] += 1
                        continue
                    c[f"{st // 100}xx"] += 1
                    if st >= 500 and st not in allowed_5xx:
                        unexpected.append((method, path, name, st))
        # Bytes that are not HTTP at all.
        raw = 10 if quick else 100
        raw_answered = 0
        for j in range(raw):
            with socket.create_connection(("127.0.0.1", srv.http_port), timeout=2) as s:
                try:
                    s.sendall(rng.randbytes(rng.randrange(1, 3000)) + b"\r\n\r\n")
                    s.settimeout(2)
                    raw_answered += s.recv(12).startswith(b"HTTP/1.")
                except OSError:
                    pass
        elapsed = time.monotonic() - t0
        check(alive(srv), "the server stopped answering after the garbage bodies")
        # Every route still does its job.
        st, _ = http(srv, "POST", "/cache/clear", {"tier": "l1"})
        check(st == 200, f"POST /cache/clear answered {st} after the garbage")
        st, _ = http(srv, "PUT", "/quota/tenant", {"limit_gb": 1})
        check(st == 200, f"PUT /quota/tenant answered {st} after the garbage")
        round_trip(srv, 21, instance_id=7102)
        books = BooksWatch()
        books.read(srv)
        books.read(srv)
        books.assert_ok()
        w.close()
        time.sleep(0.5)
        fig["requests sent"] = f"{sent} to {len(HTTP_ROUTES)} routes, + {raw} non-HTTP connections"
        for route, c in per_route.items():
            fig[f"  {route}"] = counts(c)
        fig["non-HTTP connections answered 4xx"] = f"{raw_answered}/{raw}"
        fig["undocumented 5xx"] = len(unexpected)
        fig["requests with no answer"] = len(no_answer)
        fig["fds before/after"] = f"{fds0}/{fd_count(pid)}"
        fig["L1 books"] = books.summary()
        fig["seconds sending"] = f"{elapsed:.1f}"
        check(not unexpected, f"undocumented 5xx: {unexpected[:5]}")
        check(not no_answer, f"requests without an answer: {no_answer[:5]}")
        check(fd_count(pid) <= fds0 + 4, f"fds grew from {fds0} to {fd_count(pid)}")
    finally:
        rc = srv.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    check(rc == 0, f"lmcached exited {rc} at SIGTERM")
    return fig


# ---- connections held open ---------------------------------------------------------

def sc_held_connections(quick):
    n_http = 60 if quick else 200          # under the frontend's 256
    n_zmq = 60 if quick else 400
    n_raw = 20 if quick else 100           # raw TCP to the ZMQ port, no greeting
    hold = 3 if quick else 35              # full: past the 30 s HTTP idle timeout
    srv = Server("--chunk-size", str(CS))
    ctx = zmq.Context()
    held = []
    fig = {}
    try:
        pid = srv.proc.pid
        time.sleep(0.3)
        fds0 = fd_count(pid)
        http_socks = []
        for i in range(n_http):
            s = socket.create_connection(("127.0.0.1", srv.http_port), timeout=5)
            if i % 2:
                s.sendall(b"GET /sta")               # half a request line, never finished
            http_socks.append(s)
        raw_socks = [socket.create_connection(("127.0.0.1", srv.port), timeout=5)
                     for _ in range(n_raw)]
        dealers = []
        for i in range(n_zmq):
            d = ctx.socket(zmq.DEALER)
            d.setsockopt(zmq.LINGER, 0)
            d.connect(srv.url)
            dealers.append(d)
        held = http_socks + raw_socks
        # Others are served meanwhile.
        t_end = time.monotonic() + hold
        lat_zmq, lat_http, fds_max = [], [], fd_count(pid)
        failures = 0
        probe = srv.dealer()
        round_trip(srv, 31, instance_id=7201)
        while time.monotonic() < t_end:
            t = time.monotonic()
            r = probe.call(NOOP, timeout_ms=5000)
            lat_zmq.append(time.monotonic() - t)
            failures += r is None
            t = time.monotonic()
            st, _ = http(srv, "GET", "/healthcheck", timeout=5)
            lat_http.append(time.monotonic() - t)
            failures += st != 200
            fds_max = max(fds_max, fd_count(pid))
            time.sleep(0.25)
        round_trip(srv, 32, instance_id=7202)
        # What the server did with the idle HTTP connections.
        closed_by_server = 0
        for s in http_socks:
            s.setblocking(False)
            try:
                closed_by_server += s.recv(1) == b""
            except BlockingIOError:
                pass
            except OSError:
                closed_by_server += 1
        probe.close()
        for s in held:
            s.close()
        for d in dealers:
            d.close(0)
        held = []
        deadline = time.monotonic() + 5
        while fd_count(pid) > fds0 + 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        fds_end = fd_count(pid)
        books = BooksWatch()
        books.read(srv)
        books.assert_ok()
        fig["held"] = f"{n_http} idle HTTP, {n_zmq} idle DEALERs, {n_raw} raw TCP to ZMQ, {hold} s"
        fig["probes failed"] = f"{failures} of {2 * len(lat_zmq)}"
        fig["NOOP latency median/max ms"] = \
            f"{1000 * median(lat_zmq):.1f}/{1000 * max(lat_zmq):.1f}"
        fig["/healthcheck latency median/max ms"] = \
            f"{1000 * median(lat_http):.1f}/{1000 * max(lat_http):.1f}"
        fig["fds idle/peak/after release"] = f"{fds0}/{fds_max}/{fds_end}"
        fig["idle HTTP connections closed by the server"] = f"{closed_by_server}/{n_http}"
        check(failures == 0, f"{failures} probes not served while connections were held")
        check(fds_max <= fds0 + n_http + n_zmq + n_raw + 16,
              f"fds peaked at {fds_max} (idle {fds0}) for {n_http + n_zmq + n_raw} connections")
        check(fds_end <= fds0 + 2, f"fds {fds_end} after release (idle {fds0})")
        if hold > 30:
            check(closed_by_server == n_http,
                  f"only {closed_by_server}/{n_http} idle HTTP connections closed after {hold} s")
        if not quick:
            fig.update(over_http_limit(srv, pid))
    finally:
        for s in held:
            s.close()
        ctx.destroy(linger=0)
        rc = srv.stop()
    check(rc == 0, f"lmcached exited {rc} at SIGTERM")
    return fig


def over_http_limit(srv, pid):
    """More idle HTTP connections than the frontend takes (256): what a new
    client sees, and that the server's fds stay bounded."""
    fds0 = fd_count(pid)
    socks = []
    try:
        for _ in range(300):
            socks.append(socket.create_connection(("127.0.0.1", srv.http_port), timeout=5))
        time.sleep(0.5)
        fds = fd_count(pid)
        t = time.monotonic()
        st = http_send(srv.http_port, "GET", "/healthcheck", None, {}, timeout=3)
        took = time.monotonic() - t
        d = srv.dealer()
        zmq_ok = d.call(NOOP, timeout_ms=3000) is not None
        d.close()
    finally:
        for s in socks:
            s.close()
    check(fds <= fds0 + 256 + 16, f"fds {fds} with 300 idle HTTP connections (idle {fds0})")
    check(zmq_ok, "ZMQ stopped answering while HTTP was full")
    return {"300 idle HTTP (limit 256): fds": f"{fds} (idle {fds0})",
            "300 idle HTTP: a new /healthcheck": f"{st} after {took:.2f} s",
            "300 idle HTTP: ZMQ NOOP served": zmq_ok}


# ---- clients killed mid-transfer -------------------------------------------------

# A worker in a process of its own, stopped (SIGKILL) where it says READY.
CHILD = r"""
import sys, time
sys.path.insert(0, {here!r})
import zmq
from rel_common import PREPARE_RETRIEVE, PREPARE_STORE, Dealer, Worker, prompt, unpack
class Srv:
    ctx = zmq.Context()
    def dealer(self):
        return Dealer(self.ctx, {url!r})
w = Worker(Srv(), {iid}, 0, world_size=1)
toks = prompt({seed})
if {mode!r} == "store":
    ctx_ = unpack(w.d.call(PREPARE_STORE, w.key(toks, 0, len(toks), "s"), w.id))["context"]
    for slot, idx in list(zip(ctx_["slots"], ctx_["chunk_indices"]))[: len(ctx_["slots"]) // 2]:
        w.pool[slot["offset"]:slot["offset"] + slot["length"]] = b"\xee" * slot["length"]
    print("READY", len(ctx_["slots"]), flush=True)
else:
    r = unpack(w.d.call(PREPARE_RETRIEVE, w.key(toks, 0, len(toks), {rid!r}), w.id))
    slots = r["context"].get("slots", []) if r["success"] else []
    for s in slots[: len(slots) // 2]:
        bytes(w.pool[s["offset"]:s["offset"] + s["length"]])
    print("READY", len(slots), flush=True)
time.sleep(3600)
"""


def spawn_child(srv, iid, seed, mode, rid=""):
    code = CHILD.format(here=os.path.dirname(os.path.abspath(__file__)), url=srv.url, iid=iid,
                        seed=seed, mode=mode, rid=rid)
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    line = p.stdout.readline().split()
    check(line[:1] == ["READY"], f"the {mode} client did not get ready: {line}")
    return p, int(line[1])


def leases_out(srv):
    m = l1(status(srv))
    return (m["leases"]["write"]["outstanding"], m["leases"]["copy"]["outstanding"],
            m["num_staging_objects"], m["num_retired_buffers"])


def wait_settled(srv, want, timeout=15):
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if leases_out(srv) == want:
            return time.monotonic() - t0
        time.sleep(0.05)
    raise Broken(f"the lease ledger did not settle in {timeout} s: {leases_out(srv)} != {want}")


def sc_client_killed(quick):
    rounds = 2 if quick else 10
    os.environ["LMCACHED_TEST_REAP_SCALE"] = "60"          # 30 s -> 0.5 s
    try:
        srv = Server("--chunk-size", str(CS), "--worker-reap-timeout-seconds", "30",
                     "--worker-registration-grace-seconds", "30")
    finally:
        del os.environ["LMCACHED_TEST_REAP_SCALE"]
    stop = threading.Event()
    fig = {}
    children = []
    try:
        keeper = Worker(srv, 7301, 0, world_size=1)         # keeps the layout alive

        def ping():
            d = srv.dealer()
            while not stop.is_set():
                d.call(PING, 7301, timeout_ms=2000)
                stop.wait(0.1)
            d.close()
        pinger = threading.Thread(target=ping)
        pinger.start()
        sched = srv.dealer()
        books = BooksWatch()
        settle_store, settle_retr, out_store, out_retr = [], [], [], []
        half_published = mismatches = 0
        for r in range(rounds):
            # Killed between PREPARE_STORE and COMMIT_STORE, half its slots written.
            seed = 500 + r
            base = leases_out(srv)
            p, nslots = spawn_child(srv, 8000 + 2 * r, seed, "store")
            children.append(p)
            check(nslots == 4, f"the store client got {nslots} slots")
            out_store.append(leases_out(srv)[0] - base[0])
            books.read(srv)
            kill(p)
            settle_store.append(wait_settled(srv, base))
            toks = prompt(seed)
            rid = f"after-store-{r}"
            sched.call(LOOKUP, key(toks, 0, len(toks), rid, world_size=1), 1)
            hits = unpack(sched.call(WAIT_PREFETCH_STATUS, rid, 5.0, timeout_ms=10000))
            half_published += hits
            sched.call(END_SESSION, rid)
            keeper.store(toks, 0, len(toks))                # the key is writable again
            # Killed between PREPARE_RETRIEVE and COMMIT_RETRIEVE, half copied out.
            rid = f"retr-{r}"
            sched.call(LOOKUP, key(toks, 0, len(toks), rid, world_size=1), 1)
            check(unpack(sched.call(WAIT_PREFETCH_STATUS, rid, 5.0, timeout_ms=10000)) == 4, "lookup before retrieve")
            base = leases_out(srv)
            p, nslots = spawn_child(srv, 8001 + 2 * r, seed, "retrieve", rid)
            children.append(p)
            check(nslots == 4, f"the retrieve client got {nslots} slots")
            out_retr.append(leases_out(srv)[1] - base[1])
            books.read(srv)
            kill(p)
            settle_retr.append(wait_settled(srv, base))
            rid = f"again-{r}"
            sched.call(LOOKUP, key(toks, 0, len(toks), rid, world_size=1), 1)
            check(unpack(sched.call(WAIT_PREFETCH_STATUS, rid, 5.0, timeout_ms=10000)) == 4, "lookup after kill")
            got = keeper.retrieve(toks, 0, len(toks), rid)
            mismatches += got != [chunk_bytes(0, toks, c) for c in range(4)]
            sched.call(END_SESSION, rid)
        # Nothing pinned any more: a forced clear frees every byte.
        sched.call(CLEAR, True)
        m = l1(books.read(srv))
        books.read(srv)
        books.assert_ok()
        ed = status(srv)["modules"]["engine_driven_transfer"]
        fig["clients killed"] = f"{rounds} mid-store, {rounds} mid-retrieve (SIGKILL)"
        fig["WRITE leases out at the kill"] = f"{median(out_store):.0f} (median)"
        fig["COPY leases out at the kill"] = f"{median(out_retr):.0f} (median)"
        fig["settled after (s) store min/median/max"] = \
            f"{min(settle_store):.2f}/{median(settle_store):.2f}/{max(settle_store):.2f}"
        fig["settled after (s) retrieve min/median/max"] = \
            f"{min(settle_retr):.2f}/{median(settle_retr):.2f}/{max(settle_retr):.2f}"
        fig["reaped instances"] = ed["reaped_instances"]
        fig["chunks of a killed store visible"] = half_published
        fig["retrieves with wrong bytes"] = mismatches
        fig["after a forced clear: used bytes, retired"] = \
            f"{m['memory_used_bytes']}, {m['num_retired_buffers']}"
        fig["L1 books"] = books.summary()
        fig["reap timeout"] = "0.5 s (30 s flag / LMCACHED_TEST_REAP_SCALE=60)"
        check(all(o >= 4 for o in out_store), f"WRITE leases at the kill: {out_store}")
        check(all(o >= 4 for o in out_retr), f"COPY leases at the kill: {out_retr}")
        check(half_published == 0, f"{half_published} chunks of killed stores were published")
        check(mismatches == 0, f"{mismatches} retrieves got wrong bytes")
        check(ed["reaped_instances"] >= 2 * rounds, f"reaped {ed['reaped_instances']}")
        check(m["memory_used_bytes"] == 0 and m["num_retired_buffers"] == 0,
              f"memory left after a forced clear: {m}")
        sched.close()
        keeper.close()
    finally:
        stop.set()
        for p in children:
            kill(p)
        rc = srv.stop()
    check(rc == 0, f"lmcached exited {rc} at SIGTERM")
    return fig


# ---- an L2 server killed and restarted --------------------------------------------

def wait_l2_idle(srv, n_keys, timeout=30):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        st = status(srv)["storage_manager"]
        sc = st["store_controller"]
        if sc["batches_in_flight"] == 0 and sc["keys_submitted"] >= n_keys:
            return st
        time.sleep(0.05)
    raise Broken(f"L2 write-behind did not finish {n_keys} keys")


def lookup_hits(sched, toks, rid):
    sched.call(LOOKUP, key(toks, 0, len(toks), rid, world_size=1), 1)
    return unpack(sched.call(WAIT_PREFETCH_STATUS, rid, 10.0, timeout_ms=15000))


def sc_redis_killed(quick):
    if not have_redis():
        raise NotRun("redis-server is missing (make deps-test installs it)")
    per_batch = 4 if quick else 25
    outage_s = 1 if quick else 10
    port, redis = start_redis_fresh()
    srv = Server("--chunk-size", str(CS), "--l2-adapter",
                 json.dumps({"type": "resp", "host": "127.0.0.1", "port": port,
                             "num_workers": 2, "timeout_ms": 500}))
    fig = {}
    try:
        w = Worker(srv, 7401, 0, world_size=1)
        sched = srv.dealer()
        books = BooksWatch()
        batches = {b: [prompt(600 + 100 * i + j) for j in range(per_batch)]
                   for i, b in enumerate("ABCD")}
        n = 0

        def store(b):
            nonlocal n
            for toks in batches[b]:
                w.store(toks, 0, len(toks))
                n += 4
        store("A")
        st = wait_l2_idle(srv, n)
        ok_a = st["l2_adapters"][0]["counters"]["stores_ok"]
        store("B")
        kill(redis)                                         # during B's write-behind
        t_down = time.monotonic()
        for toks in batches["C"]:                           # spread over the outage
            w.store(toks, 0, len(toks))
            n += 4
            time.sleep(outage_s / per_batch)
        st = wait_l2_idle(srv, n)
        books.read(srv)
        failed_down = st["store_controller"]["stores_failed"]
        ok_down = st["l2_adapters"][0]["counters"]["stores_ok"]
        # Nothing in L1 was lost: A, B and C are all hits, with their bytes.
        l1_hits = l1_total = mismatches = 0
        for b in "ABC":
            for i, toks in enumerate(batches[b]):
                rid = f"l1-{b}{i}"
                h = lookup_hits(sched, toks, rid)
                l1_hits += h
                l1_total += 4
                got = w.retrieve(toks, 0, h * CS, rid) if h else []
                mismatches += got != [chunk_bytes(0, toks, c) for c in range(h)]
                sched.call(END_SESSION, rid)
        check(alive(srv), "lmcached stopped answering with Redis down")
        redis = start_redis(port)                           # back, empty, same port
        outage = time.monotonic() - t_down
        t_up = time.monotonic()
        store("D")
        st = wait_l2_idle(srv, n)
        resumed = None
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if st["l2_adapters"][0]["counters"]["stores_ok"] > ok_down:
                resumed = time.monotonic() - t_up
                break
            time.sleep(0.05)
            st = status(srv)["storage_manager"]
        ok_after = st["l2_adapters"][0]["counters"]["stores_ok"]
        sched.call(CLEAR, True)                             # now only Redis has them
        l2_hits = {b: 0 for b in "ABCD"}
        for b in "ABCD":
            for i, toks in enumerate(batches[b]):
                rid = f"l2-{b}{i}"
                h = lookup_hits(sched, toks, rid)
                l2_hits[b] += h
                if h:
                    got = w.retrieve(toks, 0, h * CS, rid)
                    mismatches += got != [chunk_bytes(0, toks, c) for c in range(h)]
                sched.call(END_SESSION, rid)
        books.read(srv)
        books.assert_ok()
        resp = st["l2_adapters"][0]
        fig["prompts per batch"] = f"{per_batch} (4 chunks each); A stored, B then Redis SIGKILLed, C stored while down, Redis restarted empty, D stored"
        fig["adapter stores ok: after A / while down / after D"] = f"{ok_a}/{ok_down}/{ok_after}"
        fig["store tasks failed (counted)"] = failed_down
        fig["resp errors counted (store_errors, io_errors)"] = \
            f"{resp.get('store_errors', '?')}, {resp.get('io_errors', '?')}"
        fig["L1 hits for A+B+C while Redis was down"] = f"{l1_hits}/{l1_total}"
        fig["outage (s)"] = f"{outage:.1f}"
        fig["first L2 store ok after restart (s)"] = \
            f"{resumed:.2f}" if resumed is not None else "never"
        fig["L2 hits after a forced L1 clear, by batch (Redis restarted empty)"] = \
            ", ".join(f"{b} {l2_hits[b]}/{4 * per_batch}" for b in "ABCD")
        fig["wrong bytes"] = mismatches
        fig["L1 books"] = books.summary()
        check(failed_down >= 1, "no failed store counted while Redis was down")
        check(l1_hits == l1_total, f"L1 lost chunks while Redis was down: {l1_hits}/{l1_total}")
        check(resumed is not None, "L2 stores did not resume after Redis came back")
        check(l2_hits["D"] == 4 * per_batch, f"D not found in Redis: {l2_hits['D']}")
        check(mismatches == 0, f"{mismatches} retrieves with wrong bytes")
        w.close()
        sched.close()
    finally:
        rc = srv.stop()
        kill(redis)
    check(rc == 0, f"lmcached exited {rc} at SIGTERM")
    return fig


# ---- lmcached SIGKILLed with an fs L2, restarted on the same directory ---------------

def fs_server(path):
    return Server("--chunk-size", str(CS), "--l2-adapter",
                  json.dumps({"type": "fs", "base_path": path}))


def sc_lmcached_killed_fs(quick):
    rounds = 2 if quick else 6
    per_round = 6 if quick else 30
    tmp = tempfile.mkdtemp(prefix="lmc-rel-fs-")
    rng = random.Random(1706)
    fig = {}
    expected = {}                       # file content -> True: every chunk ever stored
    stored = []                         # prompts stored in earlier rounds
    settled_prompts = []                # written behind completely before a kill
    found_full = found_partial = missing = mismatches = torn_files = 0
    recovered, restart_s, tmp_left, files_at_kill = [], [], [], []
    srv = None
    try:
        for r in range(rounds + 1):
            t = time.monotonic()
            srv = fs_server(tmp)
            restart_s.append(time.monotonic() - t)
            st = status(srv)["storage_manager"]
            recovered.append(st["l2_adapters"][0]["recovered_keys"])
            w = Worker(srv, 7500 + r, 0, world_size=1)
            sched = srv.dealer()
            # Everything earlier rounds stored: a hit is byte for byte right.
            for i, toks in enumerate(stored):
                rid = f"r{r}-{i}"
                h = lookup_hits(sched, toks, rid)
                if h:
                    got = w.retrieve(toks, 0, h * CS, rid)
                    mismatches += got != [chunk_bytes(0, toks, c) for c in range(h)]
                sched.call(END_SESSION, rid)
                if r == rounds:
                    if h == 4:
                        found_full += 1
                    elif h:
                        found_partial += 1
                    else:
                        missing += 1
                if toks in settled_prompts:
                    check(h == 4, f"a prompt written behind before the kill was not found: {h}/4")
            books = BooksWatch()
            books.read(srv)
            books.assert_ok()
            if r == rounds:
                w.close()
                sched.close()
                break
            new = [prompt(10000 + 1000 * r + j) for j in range(per_round)]
            for toks in new:
                w.store(toks, 0, len(toks))
                for c in range(4):
                    expected[chunk_bytes(0, toks, c)] = True
            stored += new
            if r == 0:                  # the first round waits for the write-behind
                wait_l2_idle(srv, 4 * per_round)
                settled_prompts += new
            else:                       # later ones are killed in the middle of it
                time.sleep(rng.uniform(0, 0.05))
            srv.proc.send_signal(signal.SIGKILL)
            srv.proc.wait()
            w.close()
            sched.close()
            srv.stop()
            srv = None
            files = os.listdir(tmp)
            files_at_kill.append(len([f for f in files if f.endswith(".data")]))
            tmp_left.append(len([f for f in files if f.endswith(".tmp")]))
            # No torn object on disk: every data file holds one stored chunk.
            for f in os.listdir(tmp):
                if f.endswith(".data"):
                    with open(os.path.join(tmp, f), "rb") as fh:
                        torn_files += fh.read() not in expected
        fig["rounds"] = (f"{rounds} SIGKILLs, {per_round} prompts (4 chunks) stored per round; "
                         "round 1 killed after its write-behind finished, later rounds within 50 ms")
        fig["data files at each kill"] = "/".join(map(str, files_at_kill))
        fig["recovered_keys at each start"] = "/".join(map(str, recovered))
        fig["restart to first NOOP (s) median/max"] = \
            f"{median(restart_s):.2f}/{max(restart_s):.2f}"
        fig["prompts at the end: full/partial/missing"] = \
            f"{found_full}/{found_partial}/{missing} of {len(stored)}"
        fig["hits with wrong bytes"] = mismatches
        fig["torn or foreign data files"] = torn_files
        files = os.listdir(tmp)
        fig["temp files left by each kill"] = "/".join(map(str, tmp_left))
        fig["temp files still there after the last restart"] = \
            len([f for f in files if f.endswith(".tmp")])
        fig["checksum sidecars without a data file"] = \
            len([f for f in files if f.endswith(".b3") and f[:-3] not in files])
        check(mismatches == 0, f"{mismatches} hits served wrong bytes after a restart")
        check(torn_files == 0, f"{torn_files} data files hold no stored chunk")
        check(found_full >= len(settled_prompts),
              f"only {found_full} prompts found, {len(settled_prompts)} were written behind")
    finally:
        if srv is not None:
            srv.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    return fig


# ---- allocation failures ---------------------------------------------------------------

SUMMARY_LINE = re.compile(r"^alloc_fault: (\S+): (\d+) allocations[;,]")


def alloc_fault_summary(stdout):
    """{scenario: {injected, errors, absorbed, problems}} from the summary
    lines make alloc-fault prints (tests/alloc_fault/alloc_fault.c)."""
    out = {}
    for line in stdout.splitlines():
        m = SUMMARY_LINE.match(line)
        if not m:
            continue

        def num(pattern):
            f = re.search(pattern, line)
            return int(f.group(1)) if f else 0
        out[m.group(1)] = {"injected": num(r"(\d+) failures injected"),
                           "errors": num(r"(\d+) reported as errors"),
                           "absorbed": num(r"(\d+) absorbed"),
                           "problems": num(r"(\d+) problems?\b")}
    return out


def sc_alloc_fault(quick, run_it):
    if not run_it:
        raise NotRun("make alloc-fault is heavy (Debug, ASan+UBSan); pass --with-alloc-fault "
                     "(docs/testing.md, \"Allocation-failure testing\")")
    t = time.monotonic()
    p = subprocess.run(["make", "alloc-fault"], cwd=ROOT, capture_output=True, text=True)
    lines = alloc_fault_summary(p.stdout)
    total = {k: sum(v[k] for v in lines.values())
             for k in ("injected", "errors", "absorbed", "problems")}
    fig = {"scenarios": len(lines),
           "failures injected": total["injected"],
           "reported as errors / absorbed": f"{total['errors']}/{total['absorbed']}",
           "problems": total["problems"],
           "make exit status": p.returncode,
           "seconds": f"{time.monotonic() - t:.0f}"}
    check(p.returncode == 0 and total["problems"] == 0 and lines,
          f"make alloc-fault: exit {p.returncode}, {total['problems']} problems\n"
          f"{p.stdout[-2000:]}")
    return fig


SCENARIOS = {
    "zmq_garbage": sc_zmq_garbage,
    "http_garbage": sc_http_garbage,
    "held_connections": sc_held_connections,
    "client_killed": sc_client_killed,
    "redis_killed": sc_redis_killed,
    "lmcached_killed_fs": sc_lmcached_killed_fs,
    "alloc_fault": None,
}


def run_one(name, quick, with_alloc_fault=False):
    """(result, seconds, figures or reason)."""
    t = time.monotonic()
    try:
        if name == "alloc_fault":
            fig = sc_alloc_fault(quick, with_alloc_fault)
        else:
            fig = SCENARIOS[name](quick)
        return "PASS", time.monotonic() - t, fig
    except NotRun as e:
        return ("FAIL" if ci() and name != "alloc_fault" else "NOT RUN"), \
            time.monotonic() - t, {"why": str(e)}
    except Broken as e:
        return "FAIL", time.monotonic() - t, {"broken": str(e)}
    except Exception as e:  # noqa: BLE001 - a scenario that cannot finish fails
        traceback.print_exc()
        return "FAIL", time.monotonic() - t, {"error": repr(e)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="small sizes, a few seconds each")
    ap.add_argument("--only", help="comma-separated scenario names: " + ", ".join(SCENARIOS))
    ap.add_argument("--with-alloc-fault", action="store_true", help="also run make alloc-fault")
    ap.add_argument("--json", help="write the results to this file too")
    a = ap.parse_args()
    names = a.only.split(",") if a.only else list(SCENARIOS)
    for n in names:
        if n not in SCENARIOS:
            ap.error(f"unknown scenario {n}")
    commit = git_commit()
    print(f"lmcached reliability scenarios at {commit or 'unknown commit'}, "
          f"{'quick' if a.quick else 'full'} sizes, {os.cpu_count()} CPUs", flush=True)
    results = {}
    for n in names:
        print(f"\n== {n}", flush=True)
        res, secs, fig = run_one(n, a.quick, a.with_alloc_fault)
        results[n] = {"result": res, "seconds": round(secs, 1), "figures": fig}
        for k, v in fig.items():
            print(f"  {k}: {v}", flush=True)
        print(f"  -> {res} ({secs:.1f} s)", flush=True)
    print("\n| scenario | result | seconds |\n|---|---|---|")
    for n, r in results.items():
        print(f"| {n} | {r['result']} | {r['seconds']} |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"commit": commit, "quick": a.quick, "results": results}, f, indent=1)
    return 1 if any(r["result"] == "FAIL" for r in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
