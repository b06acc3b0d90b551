"""Replaying a storage trace against a live lmcached (docs/trace.md,
"Replaying a trace"): a recorded engine workload replayed with
`lmcache-cli trace replay` against a fresh server started with
--allow-trace-replay gets the hit count the recording server answered;
the endpoint is off without the flag, refuses a bad frame by its index and
serves on, and the CLI refuses a trace cut short at its byte offset."""
import json
import re
import struct
import urllib.error
import urllib.request

import msgpack

from lmc.client import lookup as lmc_lookup
from lmc.server import run_cli
from test_kv_events import SEED
from test_lookup_engine_driven import CS, Worker, prompt
from test_trace import decode, frames

SERVER_ARGS = ("--chunk-size", str(CS), "--hash-algorithm", "sha256_cbor")
REPLAY = "/api/trace/replay"


def recorded_run(start_server, tmp_path):
    """Stores, then lookups and retrieves of shared prefixes through the
    engine protocol, recorded; returns (trace path, the hit chunks the
    server answered, the chunks asked for)."""
    out = tmp_path / "run.lct"
    srv = start_server(*SERVER_ARGS, "--trace-level", "storage", "--trace-output", str(out),
                       env={"PYTHONHASHSEED": SEED})
    a, b, c = prompt(11), prompt(12), prompt(13)
    shared = a[:2 * CS] + b[2 * CS:]          # a's first two chunks, then b's tokens
    w = Worker(srv, 4001, 0, world_size=1)
    sched = srv.dealer()
    hits, asked = [], 0
    try:
        w.store(a, 0, 4 * CS)
        w.store(b, 0, 4 * CS)
        for rid, toks in (("r1", a), ("r2", shared), ("r3", c), ("r4", b)):
            hits.append(lmc_lookup(sched, toks, rid, cs=CS, world_size=1))
            asked += len(toks) // CS
            if hits[-1]:
                assert len(w.retrieve(toks, 0, hits[-1] * CS, rid)) == hits[-1]
        w.store(shared, 0, 4 * CS)             # its last two chunks are new
        hits.append(lmc_lookup(sched, shared, "r5", cs=CS, world_size=1))
        asked += 4
    finally:
        sched.close()
        w.close()
    assert hits == [4, 2, 0, 4, 4], hits      # the workload hits what it should
    assert srv.stop() == 0
    return out, sum(hits), asked


def replay_cli(trace, srv, *more):
    return run_cli("trace", "replay", str(trace), "--server",
                   f"http://127.0.0.1:{srv.http_port}", *more, timeout=60)


def counts(stdout):
    return {k: v for k, v in re.findall(r"^([a-z ]+): ([0-9.]+)$", stdout, re.M)}


def test_a_replay_gets_the_recorded_hit_count(start_server, tmp_path):
    trace, hit_chunks, asked = recorded_run(start_server, tmp_path)
    _, records = decode(trace.read_bytes())
    fresh = start_server(*SERVER_ARGS, "--allow-trace-replay")
    r = replay_cli(trace, fresh)
    assert r.returncode == 0, r.stderr
    got = counts(r.stdout)
    # one key per chunk: one rank, one object group
    assert int(got["hit keys"]) == hit_chunks, r.stdout
    assert int(got["lookups"]) == 5 and int(got["lookup keys"]) == asked, r.stdout
    assert int(got["records replayed"]) == len(records), r.stdout
    assert float(got["hit rate"]) == round(hit_chunks / asked, 4)
    for op in ("reserve_write", "finish_write", "submit_prefetch_task",
               "read_prefetched_results.__enter__", "read_prefetched_results.__exit__"):
        assert re.search(rf"^{re.escape(op)} +\d+ +[0-9.]+ +[0-9.]+ +[0-9.]+$", r.stdout,
                         re.M), (op, r.stdout)
    # The replay gave back every lease it held, and stored what the run
    # stored: replayed again, the lookup of the shared prefix before its
    # store finds its last two chunks too.
    again = counts(replay_cli(trace, fresh, "--as-fast-as-possible").stdout)
    assert int(again["hit keys"]) == hit_chunks + 2, again


def post(srv, body, path=REPLAY):
    req = urllib.request.Request(f"http://127.0.0.1:{srv.http_port}{path}", data=body,
                                 method="POST",
                                 headers={"Content-Type": "application/octet-stream"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def framed(*bodies):
    return b"".join(struct.pack(">I", len(b)) + b for b in bodies)


def a_record(tmp_path, start_server):
    trace, _, _ = recorded_run(start_server, tmp_path)
    fs, _ = frames(trace.read_bytes())
    return fs[1]   # the first record: a reserve_write


def test_replay_is_off_without_the_flag(start_server, tmp_path):
    trace, _, _ = recorded_run(start_server, tmp_path)
    plain = start_server(*SERVER_ARGS)
    status, body = post(plain, framed(frames(trace.read_bytes())[0][1]))
    assert status == 403 and "--allow-trace-replay" in body["detail"], body
    r = replay_cli(trace, plain)
    assert r.returncode == 1 and "403" in r.stderr and "--allow-trace-replay" in r.stderr, \
        r.stderr


def test_a_bad_frame_is_refused_by_its_index_and_the_server_serves_on(start_server,
                                                                      tmp_path):
    good = a_record(tmp_path, start_server)
    fresh = start_server(*SERVER_ARGS, "--allow-trace-replay")
    not_a_record = msgpack.packb({"type": "record", "qualname": 7}, use_bin_type=True)
    for bad, why in ((framed(good, b"\x81\xa1"), "frame 1"),
                     (framed(good, good, not_a_record), "frame 2"),
                     (framed(good)[:-3], "frame 0"),
                     (framed(good) + b"\x00\x00", "frame 1")):
        status, body = post(fresh, bad)
        assert status == 400 and why in body["detail"], (why, body)
    # nothing of a refused batch was applied, and the server serves on
    status, body = post(fresh, framed(good), REPLAY + "?release=1")
    assert status == 200 and body["records"] == 1, body
    assert body["results"][0]["op"] == "reserve_write" and body["results"][0]["granted"] == 4
    assert body["released"] == 4 and body["held"] == {"writes": 0, "reads": 0, "copies": 0}
    with urllib.request.urlopen(f"http://127.0.0.1:{fresh.http_port}/status", timeout=10) as r:
        assert r.status == 200


def test_a_trace_cut_short_is_refused_at_its_byte_offset(start_server, tmp_path):
    trace, _, _ = recorded_run(start_server, tmp_path)
    data = trace.read_bytes()
    whole, _ = frames(data)
    last = len(data) - 4 - len(whole[-1])   # the last frame's length prefix
    cut = tmp_path / "cut.lct"
    cut.write_bytes(data[:-5])
    fresh = start_server(*SERVER_ARGS, "--allow-trace-replay")
    r = replay_cli(cut, fresh)
    assert r.returncode == 1 and f"at byte {last}" in r.stderr, r.stderr
    assert "nothing was replayed" in r.stderr and r.stdout == ""
    # nothing reached the server: it holds nothing and stored nothing
    status, body = post(fresh, b"", REPLAY + "?release=1")
    assert status == 200 and body["released"] == 0, body
