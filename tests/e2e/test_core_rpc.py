"""End-to-end: the core RPC surface of the real lmcached binary."""
import json
import os
import random
import re
from pathlib import Path
import subprocess
import threading
import time
import urllib.request

import msgpack
import pytest
import zmq

from lmc.client import Dealer
from lmc.ops import (CLEAR, GET_CHUNK_SIZE, GET_EXPERIMENTAL, LOOKUP, NOOP, OPS, PING,
                     REPORT_BLOCK_ALLOCATION)
from lmc.server import LMCACHED, ROOT, free_port, run_lmcached


def test_ops_table_is_the_frozen_one():
    """lmc/ops.py, the ids every e2e test sends, is src/rpc/wire.h's table."""
    with open(os.path.join(ROOT, "src", "rpc", "wire.h")) as f:
        wire = {m[1]: int(m[2]) for m in re.finditer(r"\bLMC_OP_(\w+) = (\d+),", f.read())}
    del wire["FROZEN_MAX"]
    assert OPS == wire


def test_byte_examples_from_the_spec(server):
    d = server.dealer()
    # NOOP reply "OK" -> a2 4f 4b; frames 0 and 1 echoed.
    assert d.call(NOOP) == [b"\x00", b"\x18", b"\xa2OK"]
    # PING(None) -> c3
    assert d.call(PING, None) == [b"\x01", b"\x16", b"\xc3"]
    # GET_CHUNK_SIZE 256 -> cd 01 00
    assert d.call(GET_CHUNK_SIZE) == [b"\x02", b"\x15", b"\xcd\x01\x00"]
    # GET_EXPERIMENTAL -> ["kv_events"] = 91 a9 "kv_events" (the log is on by default)
    assert d.call(GET_EXPERIMENTAL) == [b"\x03", b"\x20", b"\x91\xa9kv_events"]
    d.close()


def test_uid_and_op_are_echoed_verbatim(server):
    d = server.dealer()
    d.sock.send_multipart([b"\xcf\x00\x00\x00\x00\x00\x00\x00\x07", b"\xcc\x18"])
    assert d.recv() == [b"\xcf\x00\x00\x00\x00\x00\x00\x00\x07", b"\xcc\x18", b"\xa2OK"]
    # Large uids as a long-running client would send them.
    d.uid = 2**40
    frames = d.call(NOOP)
    assert msgpack.unpackb(frames[0]) == 2**40 and frames[2] == b"\xa2OK"
    d.close()


def test_string_op_names(server):
    d = server.dealer()
    assert d.call("noop") == [b"\x00", b"\xa4noop", b"\xa2OK"]
    assert d.call("get_chunk_size")[2] == b"\xcd\x01\x00"
    d.close()


def test_void_ops_reply_without_response_frame(server):
    d = server.dealer()
    # CLEAR with 0 and with 1 frame (older and newer clients).
    assert d.call(CLEAR) == [b"\x00", b"\x14"]
    assert d.call(CLEAR, False) == [b"\x01", b"\x14"]
    records = [{"req_id": "r1", "new_block_ids": [1, 2], "new_token_ids": [5, 6, 7]}]
    assert d.call(REPORT_BLOCK_ALLOCATION, 1234, "m", records) == [b"\x02", b"\x17"]
    d.close()


def test_ping_variants(server):
    d = server.dealer()
    assert d.call(PING)[2] == b"\xc3"                          # no frame (older clients)
    assert d.call(PING, 2704798079673665322)[2] == b"\xc3"     # 63-bit instance id
    assert d.call(PING, 4242)[2] == b"\xc3"
    assert d.call(PING, "x", timeout_ms=500) is None           # wrong type: dropped
    assert d.call(NOOP)[2] == b"\xa2OK"
    d.close()


def test_default_host_localhost_resolves(start_server):
    port = free_port()
    s = start_server("--host", "localhost", port=port)
    d = s.dealer()
    assert d.call(NOOP)[2] == b"\xa2OK"
    d.close()


def test_chunk_size_flag(start_server):
    s = start_server("--chunk-size", "16")
    d = s.dealer()
    assert d.call(GET_CHUNK_SIZE)[2] == b"\x10"
    d.close()


def test_pipelined_requests_from_several_clients(server):
    n_clients, per_client = 6, 300
    results = {}

    def client(idx):
        d = server.dealer()
        for _ in range(per_client):
            d.send(random.choice([NOOP, GET_CHUNK_SIZE, PING]), *([None] if random.random() < 0.3 else []))
        got = {}
        while len(got) < per_client:
            frames = d.recv(10000)
            if frames is None:
                break
            got[msgpack.unpackb(frames[0])] = frames
        results[idx] = got
        d.close()

    threads = [threading.Thread(target=client, args=(i,)) for i in range(n_clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for idx in range(n_clients):
        assert sorted(results[idx]) == list(range(per_client))
        for uid, frames in results[idx].items():
            op = msgpack.unpackb(frames[1])
            expect = {NOOP: b"\xa2OK", GET_CHUNK_SIZE: b"\xcd\x01\x00", PING: b"\xc3"}[op]
            assert frames[2] == expect


def test_garbage_never_stops_the_server(server):
    d = server.dealer()
    rng = random.Random(1234)
    garbage = [
        [],                                      # DEALER drops empty sends; harmless
        [b"\x00"],                               # too short
        [b"\x00", b"\x63"],                      # unknown int op 99
        [b"\x00", b"\xa7unknown"],               # unknown str op
        [b"\x00", b"\xc1"],                      # invalid msgpack
        [b"\x00", b""],                          # empty op frame
        [b"\x00", b"\x18" * 2],                  # trailing bytes in op
        [b"\x00", msgpack.packb(3.5)],           # float op
        [b"\x00", msgpack.packb(-1)],            # negative op
        [b"\x00", msgpack.packb(2**64 - 1)],     # huge op
        [b"\x00", msgpack.packb(PING), b"\xdd\xff\xff\xff\xff"],  # absurd array
        [b"\x00", msgpack.packb(PING), b"\x92"],  # truncated
        [b"\x00", msgpack.packb(CLEAR), msgpack.packb("yes")],    # wrong type
        [b"\x00", msgpack.packb(REPORT_BLOCK_ALLOCATION), msgpack.packb(1)],  # too few args
        [b"\x00", msgpack.packb(REPORT_BLOCK_ALLOCATION), msgpack.packb(1), msgpack.packb("m"),
         msgpack.packb([{"req_id": 5}])],        # wrong record type
        [b"\x00", msgpack.packb(NOOP)] + [b"\x00"] * 200,        # over-long message
        [b"\x00", msgpack.packb(LOOKUP), b"\x80", b"\x01"],       # op without a handler yet
    ]
    for frames in garbage:
        if frames:
            d.sock.send_multipart(frames)
    for _ in range(300):  # deeply nested document
        d.sock.send_multipart([b"\x00", msgpack.packb(PING), b"\x91" * 5000 + b"\xc0"])
    # None of the malformed requests above is answered...
    assert d.recv(500) is None
    # ...and neither kills nor stalls the server; random frames neither (some
    # random messages are valid requests by chance and get answers).
    for _ in range(3000):
        n = rng.randint(1, 6)
        d.sock.send_multipart([rng.randbytes(rng.randint(0, 40)) for _ in range(n)])
    d.uid = 10**6
    frames = d.call(NOOP, timeout_ms=20000)
    assert frames is not None and frames[2] == b"\xa2OK"
    assert server.alive()
    d.close()


def test_error_frames_are_opt_in(start_server):
    s = start_server("--rpc-error-frames")
    d = s.dealer()
    frames = d.call(99)
    assert frames[:3] == [b"\x00", b"\x63", b"LMCACHE_RPC_ERROR_V1"]
    body = msgpack.unpackb(frames[3])
    assert set(body) == {"error_type", "message"} and "99" in body["message"]
    frames = d.call(CLEAR, "not-a-bool")
    assert frames[2] == b"LMCACHE_RPC_ERROR_V1"
    assert "force" in msgpack.unpackb(frames[3])["message"]
    assert d.call(NOOP)[2] == b"\xa2OK"
    d.close()


def test_sigterm_and_sigint_exit_zero(start_server):
    import signal
    for sig in (signal.SIGTERM, signal.SIGINT):
        s = start_server()
        d = s.dealer()
        assert d.call(NOOP)[2] == b"\xa2OK"
        d.close()
        shm = f"/dev/shm/lmcache_l1_pool_{s.proc.pid}"
        assert os.path.exists(shm)
        assert s.stop(sig) == 0, s.output()
        assert "bye" in s.output()
        assert not os.path.exists(shm)  # shared memory released


def test_port_in_use_fails_with_one_clear_message(server):
    r = run_lmcached("--host", "127.0.0.1", "--port", str(server.port),
                     "--l1-size-gb", "0.0625", "--eviction-policy", "LRU")
    assert r.returncode != 0
    assert "Address already in use" in r.stderr or "in use" in r.stderr
    assert len([line for line in r.stderr.splitlines() if "error" in line.lower() or "cannot" in line]) >= 1


def test_shm_name_of_a_running_server_is_refused(start_server):
    name = f"e2e_shared_{os.getpid()}"
    first = start_server("--shm-name", name)
    r = run_lmcached("--host", "127.0.0.1", "--port", str(free_port()), "--http-port", str(free_port()),
                     "--l1-size-gb", "0.0625", "--eviction-policy", "LRU", "--shm-name", name)
    assert r.returncode == 1, r.stderr
    assert "in use by another running lmcached" in r.stderr and "--shm-name" in r.stderr
    assert os.path.exists(f"/dev/shm/lmcache_l1_pool_{name}")  # not taken over
    d = first.dealer()
    assert d.call(NOOP)[2] == b"\xa2OK"
    d.close()


def _can_mount_private_tmpfs():
    r = subprocess.run(["unshare", "-m", "sh", "-c",
                        "mount -t tmpfs -o size=1m tmpfs /dev/shm"], capture_output=True)
    return r.returncode == 0


def _lmcached_with_dev_shm(size, port, *args, http_port=None):
    """Argv running lmcached in a private mount namespace whose /dev/shm is a
    tmpfs of `size` (the rest of the system keeps its own)."""
    script = f"mount -t tmpfs -o size={size} tmpfs /dev/shm && exec \"$@\""
    return ["unshare", "-m", "sh", "-c", script, "sh", LMCACHED, "--host", "127.0.0.1",
            "--port", str(port), "--http-port", str(http_port or free_port()),
            "--l1-size-gb", "0.0625", "--eviction-policy", "LRU", *args]


def test_dev_shm_smaller_than_the_pool():
    """Docker's default /dev/shm is 64 MiB. A pool that does not fit serves with
    the part that does (upstream's default L1 needs no /dev/shm, so such a
    deployment must keep working), saying so in the line that gives the L1's
    size and in /status; it leaves an eighth of /dev/shm to the engine's
    processes beside it (--l1-shm-reserve-mb); with no room at all start-up
    fails with a clear message. Never SIGBUS in an engine writing its slots."""
    if not _can_mount_private_tmpfs():
        pytest.skip("needs to mount a tmpfs in a private mount namespace (root)")
    port, http_port = free_port(), free_port()
    log = open(f"/tmp/lmcached-e2e-shm-{port}.log", "w+b")
    proc = subprocess.Popen(_lmcached_with_dev_shm("32m", port, http_port=http_port),
                            stdout=log, stderr=subprocess.STDOUT)
    ctx = zmq.Context()
    try:
        d = Dealer(ctx, f"tcp://127.0.0.1:{port}")
        deadline = time.monotonic() + 20
        while d.call(NOOP, timeout_ms=200) is None:
            assert proc.poll() is None and time.monotonic() < deadline
        d.close()
        # The pre-fault finds the shortage behind the first answer
        # (docs/storage.md, "Pre-fault").
        while True:
            with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/status", timeout=5) as r:
                prefault = json.load(r)["storage_manager"]["l1_arena"]["prefault"]
            if prefault["state"] != "running":
                break
            assert time.monotonic() < deadline
            time.sleep(0.02)
        assert prefault["state"] == "short", prefault
        log.flush()
        text = open(log.name, "rb").read().decode()
        # 32 MiB less the 4 MiB reserve, in whole 4 MiB granules.
        assert "can back only 29360128 of the 67108864 bytes" in text and "--shm-size" in text
        assert "L1: 67108864 bytes configured but only 29360128 usable" in text, text
        assert "L1: 67108864 bytes (" not in text, text
        with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/status", timeout=5) as r:
            arena = json.load(r)["storage_manager"]["l1_arena"]
        assert arena["committed_bytes"] == 29360128 and arena["size_bytes"] == 67108864
        assert arena["shm_reserve_bytes"] == 4 << 20
        assert "--l1-shm-reserve-mb" in arena["shm_short"], arena
        # Serving (200: a probe must not restart it), but not "healthy".
        with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/healthcheck",
                                    timeout=5) as r:
            assert r.status == 200
            body = json.load(r)
        assert body["status"] == "degraded", body
        assert body["reason"].startswith("L1 smaller than configured: "), body
    finally:
        # The context first: a socket left with a NOOP queued for a server
        # that died would make a later garbage collection of the context
        # wait forever (zmq_ctx_term).
        ctx.destroy(linger=0)
        proc.terminate()
        rc = proc.wait(20)
        log.close()
    assert rc == 0, open(log.name, "rb").read().decode()[-4000:]
    r = subprocess.run(_lmcached_with_dev_shm("1m", free_port()), capture_output=True,
                       text=True, timeout=20)
    assert r.returncode == 1, r.stderr
    assert "--l1-shm-reserve-mb" in r.stderr and "--shm-size" in r.stderr, r.stderr
    # With no reserve, the pool may take all of /dev/shm, as before.
    r = subprocess.run(_lmcached_with_dev_shm("1m", free_port(), "--l1-shm-reserve-mb", "0"),
                       capture_output=True, text=True, timeout=20)
    assert r.returncode == 1, r.stderr
    assert "No space left on device" in r.stderr and "--shm-size" in r.stderr, r.stderr


def test_bad_flags_exit_2_with_a_message_naming_the_flag():
    cases = [
        (["--port", "70000"], "--port"),
        (["--port", "abc"], "--port"),
        (["--chunk-size", "0"], "--chunk-size"),
        (["--worker-reap-timeout-seconds", "10"], "--worker-reap-timeout-seconds"),
        (["--worker-reap-timeout-seconds", "inf"], "--worker-reap-timeout-seconds"),
        (["--worker-registration-grace-seconds", "60"], "--worker-registration-grace-seconds"),
        (["--coordinator-heartbeat-interval", "0"], "--coordinator-heartbeat-interval"),
        (["--runtime-plugin-config", "[1,2]"], "--runtime-plugin-config"),
        (["--p2p-advertise-url", "h:1"], "--p2p-advertise-url"),
        (["--engine-type", "blend", "--supported-transfer-mode", "engine_driven"],
         "--supported-transfer-mode"),
        (["--hash-algorithm", "builtin"], "--hash-algorithm"),
        (["--no-such-flag"], "--no-such-flag"),
        # The coordinator is only used with the HTTP frontend (docs/fleet.md).
        (["--coordinator-url", "http://127.0.0.1:9", "--no-http"], "--coordinator-url"),
        # Blend-only flags without blend (docs/cacheblend.md).
        (["--enable-segmented-prefix"], "--enable-segmented-prefix"),
        (["--enable-dedup-content"], "--enable-dedup-content"),
        (["--engine-type", "blend", "--blend-max-chunks", "0"], "--blend-max-chunks"),
        # Parsed as upstream does, then refused: the feature is not built
        # (docs/configuration.md, "Flags refused by this version").
        (["--script-allowed-imports", "os"], "--script-allowed-imports"),
        (["--enable-extra-logging"], "--enable-extra-logging"),
    ]
    for extra, flag in cases:
        r = run_lmcached("--l1-size-gb", "0.0625", "--eviction-policy", "LRU", *extra)
        assert r.returncode == 2, (extra, r.stderr)
        lines = [line for line in r.stderr.splitlines() if line.strip()]
        assert len(lines) == 1, (extra, r.stderr)
        assert flag in lines[0], (extra, lines[0])


def test_refused_flags_say_so_in_the_flag_tables():
    """Each flag of docs/configuration.md, "Flags refused by this version",
    says "refused" in its row of the flag tables too, not another flag's
    text (a replacement once gave five of them the P2P row's)."""
    doc = (Path(__file__).resolve().parents[2] / "docs" / "configuration.md").read_text()
    before, rest = doc.split("## Flags refused by this version", 1)
    section, after = rest.split("\n## ", 1)
    refused = set(re.findall(r"`(--[a-z0-9-]+)", section.split("`--help` says", 1)[0]))
    assert {"--script-allowed-imports", "--enable-extra-logging"} <= refused
    tables = (before + after).splitlines()
    for flag in sorted(refused):
        rows = [line for line in tables if line.startswith(f"| `{flag}` |")]
        assert len(rows) == 1, (flag, rows)
        assert "efused" in rows[0].rsplit("|", 2)[1], (flag, rows[0])


def test_help_lists_groups():
    r = run_lmcached("--help")
    assert r.returncode == 0
    for heading in ("MP Server", "P2P", "HTTP Frontend", "Coordinator", "Observability"):
        assert heading in r.stdout
    assert "--l1-size-gb" in r.stdout and "--max-gpu-workers" in r.stdout
