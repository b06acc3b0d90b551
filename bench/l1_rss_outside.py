#!/usr/bin/python3
"""Memory per resident L1 object, measured from outside a real lmcached.

Starts the server binary given (or build/lmcached), registers one
engine-driven worker whose chunk objects are 512 bytes, stores --objects
chunks through PREPARE_STORE / COMMIT_STORE in requests of 256 chunks (one
request id, as one engine's stream of prompts), and reports the growth of
the server's anonymous RSS (RssAnon in /proc/PID/status: the arena is
shared memory and not counted) divided by the number of objects the server
says are resident.  Compare it with bench/l1_meta_bench, which measures the
storage layer alone inside one process (docs/storage.md, "Metadata per
object").  Several binaries in one run, e.g. an older build beside the
current one:

    python3 bench/l1_rss_outside.py build/lmcached /tmp/old/lmcached

With --request-id-per-request every request has its own request id, so the
server also keeps a session (the prompt's cached hash chain) per request,
up to its session bound: that is per request, not per object, and shows
separately.  --objects=N changes the count (a multiple of 256).
"""
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import msgpack
import zmq

CS, LAYERS, HIDDEN = 16, 1, 8            # float16 [2, 1, 16, 8] = 512 B
OBJ = 2 * LAYERS * CS * HIDDEN * 2
PER_REQUEST = 256                        # chunks
REG, PSTORE, CSTORE, NOOP = 14, 16, 17, 24


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_uid = [1000]


def call(sock, op, *args):
    """One request in the MP framing, [uid, op, payload...]; the reply's
    result is its third frame (docs/protocol.md, "Framing").  Replies to
    other uids (the start-up NOOPs) are skipped."""
    _uid[0] += 1
    sock.send_multipart([msgpack.packb(_uid[0]), msgpack.packb(op)] +
                        [msgpack.packb(a, use_bin_type=True) for a in args])
    while True:
        if not sock.poll(30000):
            raise RuntimeError(f"no reply to op {op}")
        frames = sock.recv_multipart()
        if msgpack.unpackb(frames[0]) == _uid[0]:
            return msgpack.unpackb(frames[2]) if len(frames) > 2 else None


def rss_anon_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1])
    raise RuntimeError("no RssAnon")


def measure(binary, objects, rid_per_request):
    port, http = free_port(), free_port()
    l1_gb = max(0.25, objects * 4096 * 2 / 2**30)
    proc = subprocess.Popen(
        [binary, "--host", "127.0.0.1", "--port", str(port), "--http-host", "127.0.0.1",
         "--http-port", str(http), "--chunk-size", str(CS), "--l1-size-gb", str(l1_gb),
         "--l1-align-bytes", str(OBJ), "--hash-memo-mb", "0", "--eviction-policy", "LRU"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.connect(f"tcp://127.0.0.1:{port}")
    try:
        deadline = time.monotonic() + 20
        while True:
            sock.send_multipart([msgpack.packb(0), msgpack.packb(NOOP)])
            if sock.poll(200):
                sock.recv_multipart()
                break
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError(f"{binary} did not start")
        call(sock, REG, {"instance_id": 1, "model_name": "bench/model", "world_size": 1,
                         "block_size": CS, "num_layers": LAYERS, "hidden_dim_size": HIDDEN,
                         "dtype_str": "float16", "use_mla": False, "num_physical_slots": None,
                         "engine_group_infos": [], "group_hidden_dim_sizes": None,
                         "group_layout_descs": None, "enable_l1_kvweave_quant": False})

        def store(prompt):
            tokens = list(range(prompt * PER_REQUEST * CS, (prompt + 1) * PER_REQUEST * CS))
            key = {"model_name": "bench/model", "world_size": 1, "worker_id": 0,
                   "token_ids": tokens, "start": 0, "end": len(tokens), "request_id": f"r{prompt}" if rid_per_request else "bench",
                   "cache_salt": "", "request_configs": None, "num_kv_readers": 1,
                   "null_chunk_mask": None}
            slots = call(sock, PSTORE, key, 1)["context"]["slots"]
            assert len(slots) == PER_REQUEST, "L1 refused a store: make it larger"
            assert call(sock, CSTORE, key, 1, b"") is True

        store(0)                           # pools, session and layout warmed up
        before = rss_anon_kib(proc.pid)
        requests = objects // PER_REQUEST
        for p in range(1, requests + 1):
            store(p)
        after = rss_anon_kib(proc.pid)
        status = json.load(urllib.request.urlopen(f"http://127.0.0.1:{http}/status", timeout=10))
        resident = status["storage_manager"]["l1_manager"]["num_objects"]
        if resident != (requests + 1) * PER_REQUEST:
            raise RuntimeError(f"{resident} objects resident, expected {(requests + 1) * PER_REQUEST}")
        return (after - before) * 1024 / (requests * PER_REQUEST), resident
    finally:
        sock.close(0)
        ctx.term()
        proc.send_signal(signal.SIGTERM)
        proc.wait(20)


def main():
    binaries = [a for a in sys.argv[1:] if not a.startswith("--")] or ["build/lmcached"]
    objects = 245760
    for a in sys.argv[1:]:
        if a.startswith("--objects="):
            objects = int(a.split("=", 1)[1])
    rid_per_request = "--request-id-per-request" in sys.argv[1:]
    for b in binaries:
        per_object, resident = measure(b, objects, rid_per_request)
        print(f"l1_rss_outside: {b}: {resident} objects of {OBJ} B resident; anonymous RSS "
              f"{per_object:.1f} B per object = {per_object / 256:.2f}x the 256 B goal"
              f"{' (a request id per request: sessions included)' if rid_per_request else ''}",
              flush=True)


if __name__ == "__main__":
    main()
