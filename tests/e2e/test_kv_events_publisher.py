"""The KV event publisher (docs/kv_events.md, "Publishing to routers"): a
subscriber written from vLLM's wire format (docs/upstream/kv-events-and-trace.md
section 5) hears the stores and evictions an engine drives, fills a gap
through the replay socket, and hears a loss as AllBlocksCleared; the
refusals at start."""
import socket
import time

import msgpack
import zmq

from lmc.server import BASE_ARGS, free_port, run_lmcached
from test_kv_events import CS, chunk_hashes, one_rank, prompt, start, status

TOPIC = "kv-events"
END_SEQ = b"\xff" * 8
# The fields of vLLM's KVEventBatch and tagged events that carry no default,
# so that its msgspec decoder needs them (docs/compatibility.md).
BATCH_FIELDS = {"ts", "events"}
EVENT_FIELDS = {
    "BlockStored": {"block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id",
                    "medium", "lora_name"},
    "BlockRemoved": {"block_hashes", "medium"},
    "AllBlocksCleared": set(),
}


def int_hash(h):
    """vLLM's default int block hash of a chunk hash (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES)."""
    return int.from_bytes(h, "big") & (2**64 - 1)


def decode_batch(payload):
    """A KVEventBatch as vLLM's subscriber decodes it: a map; events tagged by "type"."""
    b = msgpack.unpackb(payload, raw=False)
    assert isinstance(b, dict) and BATCH_FIELDS <= set(b), b
    assert isinstance(b["ts"], float) and b.get("data_parallel_rank") in (None, 0)
    for e in b["events"]:
        assert isinstance(e, dict) and e.get("type") in EVENT_FIELDS, e
        assert set(e) - {"type"} == EVENT_FIELDS[e["type"]], e
    return b


def pub_args(pub_port, *more):
    return ("--kv-events-publish-endpoint", f"tcp://127.0.0.1:{pub_port}",
            "--kv-events-topic", TOPIC) + more


def subscriber(srv, pub_port):
    sub = srv.ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt_string(zmq.SUBSCRIBE, TOPIC)
    sub.connect(f"tcp://127.0.0.1:{pub_port}")
    time.sleep(0.5)   # the subscription reaches the publisher
    return sub


def receive(sub, pred, timeout=20):
    """(seq, batch) received until pred(all events so far) holds."""
    got, events = [], []
    deadline = time.monotonic() + timeout
    while not pred(events) and time.monotonic() < deadline:
        if not sub.poll(200):
            continue
        topic, seq, payload = sub.recv_multipart()
        assert topic == TOPIC.encode() and len(seq) == 8
        b = decode_batch(payload)
        got.append((int.from_bytes(seq, "big"), b))
        events += b["events"]
    assert pred(events), events
    return got, events


def stored_count(n):
    return lambda ev: sum(e["type"] == "BlockStored" for e in ev) >= n


def assert_stored_chain(events, toks, n):
    hashes = [int_hash(h) for h in chunk_hashes(toks)][:n]
    assert [e["type"] for e in events] == ["BlockStored"] * len(hashes)
    for c, e in enumerate(events):
        assert e["block_hashes"] == [hashes[c]]
        assert e["parent_block_hash"] == (hashes[c - 1] if c else None)
        assert e["token_ids"] == toks[c * CS:(c + 1) * CS]
        assert (e["block_size"], e["medium"], e["lora_id"], e["lora_name"]) == \
            (CS, "CPU", None, None)


def test_store_publishes_block_stored_with_int_hashes(start_server):
    pub_port = free_port()
    srv = start(start_server, *pub_args(pub_port))
    sub = subscriber(srv, pub_port)
    toks = prompt(2)
    w = one_rank(srv)
    w.store(toks, 0, 3 * CS)
    w.store(toks, 3 * CS, 4 * CS)      # the parent of chunk 3 comes from the earlier chain
    got, events = receive(sub, stored_count(4))
    assert [s for s, _ in got] == list(range(len(got)))
    assert_stored_chain(events, toks, 4)
    st = status(srv)["publisher"]
    assert st["endpoint"] == f"tcp://127.0.0.1:{pub_port}"
    assert st["batches_published"] == len(got) == st["next_seq"]
    assert st["events_published"] == 4 and st["replay_requests"] == 0
    w.close()
    sub.close()


def replay(srv, replay_port, start_seq):
    """[(seq, payload)] up to and including the end marker, as vLLM's
    replay protocol answers a REQ-shaped request."""
    d = srv.ctx.socket(zmq.DEALER)
    d.setsockopt(zmq.LINGER, 0)
    d.connect(f"tcp://127.0.0.1:{replay_port}")
    d.send_multipart([b"", start_seq.to_bytes(8, "big")])
    out = []
    while not out or out[-1][0] != END_SEQ:
        assert d.poll(10000), out
        empty, seq, payload = d.recv_multipart()
        assert empty == b""
        out.append((seq, payload))
    d.close()
    return out


def test_late_subscriber_fills_the_gap_through_replay(start_server):
    pub_port, replay_port = free_port(), free_port()
    srv = start(start_server, *pub_args(pub_port, "--kv-events-replay-endpoint",
                                        f"tcp://127.0.0.1:{replay_port}"))
    toks = prompt(3)
    w = one_rank(srv)
    w.store(toks, 0, 2 * CS)
    w.store(toks, 2 * CS, 3 * CS)
    deadline = time.monotonic() + 20
    while status(srv)["publisher"]["events_published"] < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    n = status(srv)["publisher"]["next_seq"]
    assert n >= 1
    got = replay(srv, replay_port, 0)
    assert got[-1] == (END_SEQ, b"")
    assert [int.from_bytes(s, "big") for s, _ in got[:-1]] == list(range(n))
    assert_stored_chain([e for _, p in got[:-1] for e in decode_batch(p)["events"]], toks, 3)
    later = replay(srv, replay_port, n - 1)
    assert [int.from_bytes(s, "big") for s, _ in later] == [n - 1, 2**64 - 1]
    assert status(srv)["publisher"]["replay_requests"] == 2
    w.close()


def test_eviction_publishes_block_removed(start_server):
    # 1 MiB objects in the smallest L1 (64 MiB): the later prompts evict
    # the earlier ones (as in test_kv_events).
    pub_port = free_port()
    srv = start(start_server, *pub_args(pub_port))
    sub = subscriber(srv, pub_port)
    w = one_rank(srv, hidden=8192)
    stored = set()
    for seed in range(12):
        toks = prompt(100 + seed, n_chunks=8)
        w.store(toks, 0, 8 * CS)
        stored.update(int_hash(h) for h in chunk_hashes(toks))
    _, events = receive(sub, lambda ev: any(e["type"] == "BlockRemoved" for e in ev))
    removed = [e for e in events if e["type"] == "BlockRemoved"]
    for e in removed:
        assert e["medium"] == "CPU" and e["block_hashes"]
        assert set(e["block_hashes"]) <= stored
    w.close()
    sub.close()


def test_falling_behind_the_log_publishes_all_blocks_cleared(start_server):
    # A ring of 2 records: one store of 4 chunks overruns it before the
    # publisher wakes, so it announces the loss, then the 2 it still has.
    pub_port = free_port()
    srv = start(start_server, *pub_args(pub_port, "--kv-event-log-size", "2"))
    sub = subscriber(srv, pub_port)
    toks = prompt(4)
    w = one_rank(srv)
    w.store(toks, 0, 4 * CS)
    _, events = receive(sub, stored_count(2))
    assert [e["type"] for e in events] == ["AllBlocksCleared", "BlockStored", "BlockStored"]
    assert [e["block_hashes"][0] for e in events[1:]] == \
        [int_hash(h) for h in chunk_hashes(toks)[2:]]
    w.close()
    sub.close()


def refused(*args):
    r = run_lmcached(*BASE_ARGS, "--host", "127.0.0.1", "--port", str(free_port()),
                     "--http-host", "127.0.0.1", "--http-port", str(free_port()), *args)
    assert r.returncode != 0, r.stderr
    return r.stderr


def test_publisher_without_the_log_is_refused():
    err = refused("--kv-event-log-size", "0", *pub_args(free_port()))
    assert "--kv-events-publish-endpoint" in err and "--kv-event-log-size" in err, err


def test_replay_without_publisher_is_refused():
    err = refused("--kv-events-replay-endpoint", f"tcp://127.0.0.1:{free_port()}")
    assert "--kv-events-replay-endpoint" in err and "--kv-events-publish-endpoint" in err, err


def test_taken_ports_are_refused_naming_the_flag():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        taken = s.getsockname()[1]
        err = refused(*pub_args(taken))
        assert "--kv-events-publish-endpoint" in err and str(taken) in err, err
        err = refused(*pub_args(free_port(), "--kv-events-replay-endpoint",
                                f"tcp://127.0.0.1:{taken}"))
        assert "--kv-events-replay-endpoint" in err and str(taken) in err, err
