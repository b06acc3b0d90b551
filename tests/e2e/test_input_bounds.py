"""Issue 17: no input from the network grows the server's memory without
bound (docs/protocol.md, "Bounds"; docs/storage.md, "Interned strings").

Strings a request only asks about are never interned, over-long names are
refused, a full worker queue is answered at once, an oversized ZMQ message
costs its sender the connection and nobody else anything, and error frames
are valid UTF-8."""
import http.client
import json
import os
import struct
import time

import msgpack
import pytest

from lmc.keys import ipc_key
from lmc.ops import (END_SESSION, LOOKUP, NOOP, PING, REGISTER_KV_CACHE_ENGINE_DRIVEN_CONTEXT,
                     WAIT_PREFETCH_STATUS)

CS = 16
MODEL_NAME_MAX, SALT_MAX, REQUEST_ID_MAX = 256, 128, 1024
KEY_MAX_TOKENS = 1 << 24
MAX_MESSAGE_BYTES = 128 << 20
ERROR_MARKER = b"LMCACHE_RPC_ERROR_V1"


def http_call(port, method, path, body=None, timeout=30):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request(method, path, body=body, headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


# Sanitizer builds keep freed memory in a quarantine, so RSS says nothing
# there: the interner's own count is asserted in every build, RSS only in
# the release build (CMake passes LMC_SANITIZE to the e2e tests).
SANITIZED = bool(os.environ.get("LMC_SANITIZE"))


def interned(port):
    st, body = http_call(port, "GET", "/status")
    assert st == 200, body
    return json.loads(body)["interner"]["strings"]


def vm_rss_kib(server):
    with open(f"/proc/{server.proc.pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS line")


def register(d, model="m", instance_id=1):
    p = {"instance_id": instance_id, "model_name": model, "world_size": 1, "block_size": CS,
         "num_layers": 1, "hidden_dim_size": 8, "dtype_str": "float16", "use_mla": False}
    frames = d.call(REGISTER_KV_CACHE_ENGINE_DRIVEN_CONTEXT, p)
    assert frames is not None and len(frames) == 3
    return msgpack.unpackb(frames[2])


def error_of(frames):
    """The {"error_type", "message"} of an error frame, decoded strictly."""
    assert frames is not None, "no reply"
    assert frames[2] == ERROR_MARKER, frames
    return msgpack.unpackb(frames[3], raw=False)


def delete_keys(port, models, tier="l1"):
    keys = [{"chunk_hash_hex": "ab" * 32, "model_name": m, "kv_rank": 0} for m in models]
    return http_call(port, "DELETE", "/cache/objects", json.dumps({"keys": keys, "tier": tier}))


def test_unique_model_names_through_delete_do_not_grow_memory(start_server):
    s = start_server("--chunk-size", str(CS))
    batch = 2000
    names = iter(f"model-{i:07d}-{'x' * 40}" for i in range(10**7))
    for _ in range(5):   # warm the allocator and the HTTP threads up
        assert delete_keys(s.http_port, [next(names) for _ in range(batch)])[0] == 200
    before, strings = vm_rss_kib(s), interned(s.http_port)
    for _ in range(300_000 // batch):
        st, body = delete_keys(s.http_port, [next(names) for _ in range(batch)])
        assert st == 200, body
        assert json.loads(body)["deleted"] == 0
    grown = vm_rss_kib(s) - before
    # Interning them all took ~80 MB (issue 17); a query interns nothing.
    assert interned(s.http_port) == strings
    if not SANITIZED:
        assert grown < 8 * 1024, f"RSS grew by {grown} KiB"


def test_unique_salts_through_lookup_do_not_grow_memory(start_server):
    s = start_server("--chunk-size", str(CS))
    d = s.dealer()
    assert "error" not in register(d)
    tokens = list(range(CS))
    window = 256

    def lookups(first, n):
        for i in range(first, first + n, window):
            for j in range(i, min(first + n, i + window)):
                salt = f"{j:08d}" + "s" * 92
                d.send(LOOKUP, ipc_key(tokens, 0, len(tokens), f"r{j}", salt=salt), 1)
                d.send(END_SESSION, f"r{j}")
            for _ in range(2 * (min(first + n, i + window) - i)):
                assert d.recv(10000) is not None

    lookups(0, 5000)   # warm-up: sessions and jobs come and go
    before, strings = vm_rss_kib(s), interned(s.http_port)
    lookups(5000, 100_000)
    grown = vm_rss_kib(s) - before
    # Interned, 100k salts of 100 bytes took ~20 MB; a salt nothing was
    # stored under is never interned.
    assert interned(s.http_port) == strings
    if not SANITIZED:
        assert grown < 8 * 1024, f"RSS grew by {grown} KiB"
    d.close()


def test_over_long_names_and_salts_are_refused(start_server):
    s = start_server("--chunk-size", str(CS), "--rpc-error-frames")
    d = s.dealer()
    long_model = "m" * (MODEL_NAME_MAX + 1)
    assert register(d, model="m" * MODEL_NAME_MAX, instance_id=7).get("error") is None
    reply = register(d, model=long_model, instance_id=8)
    assert reply["shm_name"] == "" and reply["pool_size"] == 0
    assert f"at most {MODEL_NAME_MAX} bytes" in reply["error"]

    tokens = list(range(CS))
    err = error_of(d.call(LOOKUP, ipc_key(tokens, 0, len(tokens), "r", model=long_model), 1))
    assert err["error_type"] == "ValidationError"
    assert f"at most {MODEL_NAME_MAX} bytes" in err["message"]
    err = error_of(d.call(LOOKUP, ipc_key(tokens, 0, len(tokens), "r", salt="s" * (SALT_MAX + 1)), 1))
    assert f"at most {SALT_MAX} bytes" in err["message"]
    # Names at the limits are fine.
    uid = d.uid
    assert d.call(LOOKUP, ipc_key(tokens, 0, len(tokens), "r", model="m" * MODEL_NAME_MAX, salt="s" * SALT_MAX),
                  1) == [msgpack.packb(uid), b"\x08"]

    st, body = delete_keys(s.http_port, [long_model])
    assert st == 400
    assert f"at most {MODEL_NAME_MAX} bytes" in json.loads(body)["detail"]
    assert d.call(NOOP)[2] == b"\xa2OK"
    d.close()


def test_request_ids_and_token_counts_are_bounded(start_server):
    s = start_server("--chunk-size", str(CS), "--rpc-error-frames")
    d = s.dealer()
    tokens = list(range(CS))
    err = error_of(d.call(LOOKUP, ipc_key(tokens, 0, len(tokens), "r" * (REQUEST_ID_MAX + 1)), 1))
    assert err["error_type"] == "ValidationError"
    assert f"at most {REQUEST_ID_MAX} bytes" in err["message"]
    uid = d.uid
    assert d.call(LOOKUP, ipc_key(tokens, 0, len(tokens), "r" * REQUEST_ID_MAX), 1) == [msgpack.packb(uid), b"\x08"]
    # More token ids than any key may carry: refused before they are read.
    n = KEY_MAX_TOKENS + CS
    head = msgpack.packb({"model_name": "m", "world_size": 1, "worker_id": None,
                          "start": 0, "end": CS, "request_id": "big"})
    frame = bytes([head[0] + 1]) + head[1:] + msgpack.packb("token_ids") + \
        b"\xdd" + struct.pack(">I", n) + b"\x00" * n
    err = error_of(d.call(LOOKUP, raw=[frame, msgpack.packb(1)], timeout_ms=20000))
    assert f"at most {KEY_MAX_TOKENS} token ids" in err["message"]
    assert d.call(NOOP)[2] == b"\xa2OK"
    d.close()


def metric(port, name):
    st, body = http_call(port, "GET", "/metrics")
    assert st == 200
    for line in body.decode().splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return None


def test_full_worker_queue_is_answered_at_once(start_server):
    s = start_server("--chunk-size", "256", "--max-cpu-workers", "1",
                     "--max-queued-requests", "1", "--rpc-error-frames")
    d = s.dealer()
    assert "error" not in register(d)
    # A LOOKUP whose hashing keeps the only CPU worker busy for a while
    # (too large to run on the socket thread), then a burst behind it.
    n = 1 << 21
    big = ipc_key([], 0, n, "busy")
    big["token_ids"] = [i & 0x7f for i in range(n)]
    busy_uid = d.send(LOOKUP, big, 1)
    waits = [d.send(WAIT_PREFETCH_STATUS, f"unknown-{i}", 0.0) for i in range(40)]
    ends = [d.send(END_SESSION, f"unknown-{i}") for i in range(40)]
    replies = {}
    deadline = time.monotonic() + 20
    while len(replies) < 81 and time.monotonic() < deadline:
        frames = d.recv(1000)
        if frames is not None:
            replies[msgpack.unpackb(frames[0])] = frames
    assert len(replies) == 81, "every request is answered"
    assert replies[busy_uid][1:] == [b"\x08"]
    # WAIT on an unknown id answers 0; a full queue answers None at once.
    answered = [replies[u][2:] for u in waits]
    assert all(a in ([b"\x00"], []) for a in answered), answered
    assert [] in answered, "no WAIT was refused"
    # END_SESSION has no failure reply: a full queue sends an error frame.
    refused = [error_of(replies[u]) for u in ends if replies[u][2:3] == [ERROR_MARKER]]
    assert refused and all(e["error_type"] == "ServerBusyError" for e in refused)
    assert "queue" in refused[0]["message"]
    assert metric(s.http_port, "lmcache_mp_rpc_overloaded_total") >= len(refused) + 1
    # The server keeps serving.
    assert d.call(NOOP)[2] == b"\xa2OK"
    assert d.call(WAIT_PREFETCH_STATUS, "unknown", 0.0)[2] == b"\x00"
    d.close()


def test_oversized_message_costs_its_sender_the_connection_only(start_server):
    s = start_server("--rpc-error-frames")
    bad = s.dealer()
    # One frame past the limit: ZMQ closes the connection before it is read.
    uid = bad.send(NOOP, raw=[b"\x00" * (MAX_MESSAGE_BYTES + 1)])
    others = s.dealer()
    assert others.call(NOOP)[2] == b"\xa2OK"
    got = bad.recv(2000)
    assert got is None or msgpack.unpackb(got[0]) != uid
    # ZMQ reconnects the first client, which is served again.
    deadline = time.monotonic() + 10
    ok = None
    while ok is None and time.monotonic() < deadline:
        ok = bad.call(NOOP, timeout_ms=500)
    assert ok is not None and ok[2] == b"\xa2OK"
    # Frames under the limit whose sum is over it: answered with an error
    # and freed at once.
    frames = bad.call(NOOP, raw=[b"\x00" * (70 << 20), b"\x00" * (70 << 20)],
                      timeout_ms=20000)
    err = error_of(frames)
    assert f"limit of {MAX_MESSAGE_BYTES} bytes" in err["message"]
    assert s.alive()
    assert others.call(NOOP)[2] == b"\xa2OK"
    bad.close()
    others.close()


@pytest.mark.parametrize("op_frame", [
    msgpack.packb("x" + "\u00e9" * 40),          # cut at 64 bytes: mid-sequence
    msgpack.packb("\u20ac" * 30),                # 3-byte characters
    b"\xa4ab\xff\xfe",                          # not UTF-8 at all
    b"\xa2\xe2\x82",                            # a sequence cut short
], ids=["2-byte", "3-byte", "invalid", "cut-short"])
def test_error_frames_are_valid_utf8(start_server, op_frame):
    s = start_server("--rpc-error-frames")
    d = s.dealer()
    d.sock.send_multipart([msgpack.packb(5), op_frame])
    frames = d.recv()
    assert frames[:3] == [msgpack.packb(5), op_frame, ERROR_MARKER]
    err = error_of(frames)   # raw=False: strict UTF-8
    assert err["error_type"] == "ValueError"
    assert "no handler registered for request type" in err["message"]
    assert d.call(NOOP)[2] == b"\xa2OK"
    d.close()


def test_pings_of_fresh_ids_do_not_grow_memory(start_server):
    """Issue 29: PING(id) of any int64 id used to add a liveness entry for
    ever (and every STORE and RETRIEVE scanned them all).  Now the table
    holds registered workers plus the 1024 ids that pinged last."""
    server = start_server()
    d = server.dealer()
    for i in range(2000):       # warm up: the allocator's first arenas
        d.send(PING, -i - 1)
    for _ in range(2000):
        assert d.recv() is not None
    before = vm_rss_kib(server)
    sent = 0
    while sent < 300_000:       # pipelined, 1000 in flight
        batch = min(1000, 300_000 - sent)
        for i in range(batch):
            d.send(PING, 10_000_000 + sent + i)
        for _ in range(batch):
            frames = d.recv()
            assert frames is not None and msgpack.unpackb(frames[2]) is True
        sent += batch
    st, body = http_call(server.http_port, "GET", "/status")
    assert st == 200
    assert json.loads(body)["modules"]["management"]["tracked_instances"] == 1024
    if not SANITIZED:
        assert vm_rss_kib(server) - before < 4096, (before, vm_rss_kib(server))
    assert d.call(NOOP)[2] == msgpack.packb("OK")
    d.close()
