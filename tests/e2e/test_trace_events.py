"""The events level of the trace (docs/trace.md, "The events level"): a
server with --trace-level events records its cache-event stream, the
batches in the wire form of POST /events between a start and a stop mark,
with or without a coordinator; the recorded batches are accepted by a
coordinator that never saw the server, as upstream's replay-events hands
them over."""
import json
import time
import urllib.request

from test_coordinator_api import Coordinator
from test_kv_events import SEED, chunk_hashes
from test_lookup_engine_driven import CS, Worker, prompt
from test_trace import decode

FLUSH = "0.2"


def status(srv):
    with urllib.request.urlopen(f"http://127.0.0.1:{srv.http_port}/status", timeout=10) as r:
        return json.loads(r.read())


def record_a_store(start_server, tmp_path, *extra):
    """Stores one prompt on a server recording an events trace, stops it;
    (tokens, http port, header, records)."""
    out = tmp_path / "events.lct"
    srv = start_server("--chunk-size", str(CS), "--hash-algorithm", "sha256_cbor",
                       "--instance-id", "node-t", "--trace-level", "events",
                       "--trace-output", str(out), "--coordinator-event-flush-interval", FLUSH,
                       *extra, env={"PYTHONHASHSEED": SEED})
    toks = prompt(5)
    w = Worker(srv, 3101, 0, world_size=1)
    try:
        assert w.store(toks, 0, 64)["chunk_indices"] == [0, 1, 2, 3]
    finally:
        w.close()
    deadline = time.monotonic() + 10   # a flush interval, then the writer's poll
    while status(srv)["trace"]["records_written"] < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert status(srv)["trace"]["level"] == "events"
    port = srv.http_port
    assert srv.stop() == 0
    header, records = decode(out.read_bytes())
    return toks, port, header, records


def batches_of(records):
    return [r["args"] for r in records if r["qualname"] == "events.batch"]


def test_the_stream_is_recorded_without_a_coordinator(start_server, tmp_path):
    toks, port, header, records = record_a_store(start_server, tmp_path)
    assert header["level"] == "events" and header["magic"] == b"LMCT"
    meta = header["level_meta"]
    assert meta["instance_id"] == "node-t" and isinstance(meta["lmcache_version"], str)
    assert all(r["type"] == "record" for r in records)
    start, stop = records[0], records[-1]
    assert start["qualname"] == "events.lifecycle" and stop["qualname"] == "events.lifecycle"
    assert start["args"]["phase"] == "start" and start["args"]["instance_id"] == "node-t"
    assert start["args"]["http_port"] == port and start["args"]["mq_port"] == 0
    assert start["args"]["ip"] == "" and start["args"]["incarnation"] > 1.7e9
    assert stop["args"] == {"phase": "stop", "instance_id": "node-t"}
    batches = batches_of(records)
    assert [b["seq"] for b in batches] == list(range(1, len(batches) + 1))
    assert {b["instance_id"] for b in batches} == {"node-t"}
    assert {b["incarnation"] for b in batches} == {start["args"]["incarnation"]}
    assert "config" in {b["event_type"] for b in batches}   # the capacity declaration
    stores = [b for b in batches if b["event_type"] == "store" and b["tier"] == "l1"]
    keys = [e["key"]["chunk_hash_hex"] for b in stores for e in b["entries"]]
    assert keys == [h.hex() for h in chunk_hashes(toks)]
    assert all(e["size_bytes"] > 0 for b in stores for e in b["entries"])
    # Nothing of the storage level is in an events trace.
    assert not [r for r in records if r["qualname"].startswith("lmcache.")]


def test_recorded_batches_are_what_a_coordinator_takes(start_server, tmp_path):
    """Recorded with a live coordinator, each batch is recorded once and is
    the batch the coordinator applied: handed to a fresh coordinator, which
    never saw the server, every recorded batch is applied there too."""
    live = Coordinator(tmp_path / "live.db", CHUNK_SIZE=str(CS))
    fresh = None
    try:
        url = f"http://127.0.0.1:{live.port}"
        toks, port, header, records = record_a_store(
            start_server, tmp_path, "--coordinator-url", url,
            "--coordinator-event-reporting")
        batches = batches_of(records)
        assert [b["seq"] for b in batches] == list(range(1, len(batches) + 1))
        stores = [b for b in batches if b["event_type"] == "store"]
        assert len([e for b in stores for e in b["entries"]]) == len(chunk_hashes(toks))
        fresh = Coordinator(tmp_path / "fresh.db", CHUNK_SIZE=str(CS))
        start = records[0]["args"]
        st, r = fresh.call("POST", "/instances", {"instance_id": start["instance_id"],
                                                  "ip": "127.0.0.1", "http_port": port})
        assert st == 200, r
        applied = 0
        for b in batches:
            st, r = fresh.call("POST", "/events", {"batches": [b]})
            assert st == 200, (b, r)
            applied += r["applied"]
        assert applied == len(batches)
    finally:
        for c in (live, fresh):
            if c:
                problem = c.teardown_problem()
                assert problem is None, problem
