"""The KV event log and POLL_KV_EVENTS (docs/kv_events.md): what an
engine-driven store, an L1 eviction and an L2 store log, the cursor rules,
the capability, the flag, and bad arguments."""
import hashlib
import json
import time
import urllib.request

import msgpack

from lmc.client import unpack
from lmc.ops import CLEAR, GET_EXPERIMENTAL, NOOP, POLL_KV_EVENTS
from lmc.server import l2_fs_args, run_lmcached
from test_l2_fs import metric
from paged_kv import PagedKV
from test_lookup_engine_driven import CS, Worker, prompt
from test_server_driven import ZEROS, Engine

# sha256_cbor with a fixed seed, so that the test computes the chunk
# hashes on its own (docs/hashing.md, "sha256_cbor").
SERVER_ARGS = ("--chunk-size", str(CS), "--hash-algorithm", "sha256_cbor")
SEED = "0"
RECORD_FIELDS = {"seq", "kind", "medium", "model_name", "block_hashes", "parent_block_hash",
                 "token_ids", "block_size"}


def server_env():
    return {"PYTHONHASHSEED": SEED}


def start(start_server, *args):
    return start_server(*SERVER_ARGS, *args, env=server_env())


def cbor_head(major, n):
    if n < 24:
        return bytes([major << 5 | n])
    for extra, size in ((24, 1), (25, 2), (26, 4)):
        if n < 1 << (8 * size):
            return bytes([major << 5 | extra]) + n.to_bytes(size, "big")
    raise ValueError(n)


def chunk_hashes(tokens):
    """H_i of every whole chunk, as docs/hashing.md defines sha256_cbor."""
    prefix = hashlib.sha256(cbor_head(3, len(SEED)) + SEED.encode()).digest()
    out = []
    for c in range(len(tokens) // CS):
        toks = tokens[c * CS:(c + 1) * CS]
        body = (b"\x83\x58\x20" + prefix + cbor_head(4, len(toks)) +
                b"".join(cbor_head(0, t) for t in toks) + b"\xf6")
        prefix = hashlib.sha256(body).digest()
        out.append(prefix)
    return out


def poll(d, model="m", cursor=0, max_events=1024):
    return unpack(d.call(POLL_KV_EVENTS, model, cursor, max_events))


def poll_until(d, pred, model="m", timeout=20):
    """Everything logged for model from cursor 0, once pred(events) holds."""
    deadline = time.monotonic() + timeout
    while True:
        r = poll(d, model)
        if pred(r["events"]) or time.monotonic() > deadline:
            return r
        time.sleep(0.05)


def status(srv):
    url = f"http://127.0.0.1:{srv.http_port}/status"
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())["modules"]["kv_events"]


def one_rank(srv, model="m", **reg):
    return Worker(srv, 2001, 0, world_size=1, model=model, **reg)


def test_disabled_log_is_not_advertised_and_polls_disabled(start_server):
    srv = start(start_server, "--kv-event-log-size", "0")
    d = srv.dealer()
    assert unpack(d.call(GET_EXPERIMENTAL)) == []
    w = one_rank(srv)
    w.store(prompt(1), 0, 2 * CS)
    r = poll(d, cursor=5)
    assert set(r) == {"enabled", "incarnation", "next_cursor", "lost", "events"}
    assert r["enabled"] is False and r["next_cursor"] == 0 and r["lost"] is False
    assert r["events"] == [] and isinstance(r["incarnation"], int)
    st = status(srv)
    assert st["enabled"] is False and st["log_depth"] == 0
    w.close()
    d.close()


def test_store_logs_stored_records_with_tokens_and_parents(start_server):
    srv = start(start_server)
    d = srv.dealer()
    assert unpack(d.call(GET_EXPERIMENTAL)) == ["kv_events"]
    toks = prompt(2)
    hashes = chunk_hashes(toks)
    w = one_rank(srv)
    w.store(toks, 0, 3 * CS)
    w.store(toks, 3 * CS, 4 * CS)      # the parent of chunk 3 comes from the earlier chain
    r = poll(d)
    assert r["enabled"] is True and r["lost"] is False and isinstance(r["incarnation"], int)
    ev = r["events"]
    assert [e["seq"] for e in ev] == [1, 2, 3, 4] and r["next_cursor"] == 4
    for c, e in enumerate(ev):
        assert set(e) == RECORD_FIELDS
        assert (e["kind"], e["medium"], e["model_name"], e["block_size"]) == \
            ("stored", "CPU", "m", CS)
        assert e["block_hashes"] == [hashes[c]]
        assert e["parent_block_hash"] == (hashes[c - 1] if c else None)
        assert e["token_ids"] == toks[c * CS:(c + 1) * CS]
    # A store of chunks L1 holds already logs nothing new.
    w.store(toks, 0, 4 * CS)
    assert poll(d, cursor=4)["events"] == []
    # Another model's records only move its cursor.
    other = poll(d, model="other")
    assert other["events"] == [] and other["next_cursor"] == 4 and other["lost"] is False
    st = status(srv)
    assert st["enabled"] is True and st["log_depth"] == 4 and st["next_seq"] == 5
    assert st["log_capacity"] == 32768 and st["lost_markers"] == 0
    assert st["unbound_stores"] == 0 and st["incarnation"] == r["incarnation"]
    assert metric(srv, "lmcache_mp_kv_events_log_depth") == 4
    w.close()
    d.close()


def test_server_driven_store_logs_stored_records(start_server):
    srv = start(start_server, "--cpu-kv-layout", "hint")   # test_server_driven's hint_srv
    d = srv.dealer()
    g = PagedKV("kvev", "fa_nhd", nl=2, nb=8, bs=CS, nh=2, hs=8)
    e = Engine(srv, 31, [g])
    toks = prompt(6)
    hashes = chunk_hashes(toks)
    assert e.store(toks, 0, 2 * CS, [[1, 2]]) == [ZEROS, True]
    assert e.store(toks, 2 * CS, 3 * CS, [[3]]) == [ZEROS, True]
    ev = poll(d)["events"]
    assert [(e["kind"], e["medium"]) for e in ev] == [("stored", "CPU")] * 3
    assert [e["block_hashes"] for e in ev] == [[h] for h in hashes[:3]]
    assert [e["parent_block_hash"] for e in ev] == [None, hashes[0], hashes[1]]
    assert [e["token_ids"] for e in ev] == [toks[c * CS:(c + 1) * CS] for c in range(3)]
    e.close()
    d.close()


def test_paging_and_cursor_past_the_end(start_server):
    srv = start(start_server)
    d = srv.dealer()
    w = one_rank(srv)
    w.store(prompt(3), 0, 4 * CS)
    first = poll(d, max_events=3)
    assert [e["seq"] for e in first["events"]] == [1, 2, 3] and first["next_cursor"] == 3
    rest = poll(d, cursor=first["next_cursor"], max_events=3)
    assert [e["seq"] for e in rest["events"]] == [4] and rest["next_cursor"] == 4
    assert rest["lost"] is False
    past = poll(d, cursor=9)
    assert past["lost"] is True and past["events"] == [] and past["next_cursor"] == 4
    w.close()
    d.close()


def test_falling_behind_a_small_ring_is_lost_then_resumes(start_server):
    srv = start(start_server, "--kv-event-log-size", "2")
    d = srv.dealer()
    w = one_rank(srv)
    toks = prompt(4)
    w.store(toks, 0, 4 * CS)
    r = poll(d)
    assert r["lost"] is True
    assert [e["seq"] for e in r["events"]] == [3, 4] and r["next_cursor"] == 4
    assert [e["block_hashes"][0] for e in r["events"]] == chunk_hashes(toks)[2:]
    again = poll(d, cursor=r["next_cursor"])
    assert again["lost"] is False and again["events"] == []
    assert status(srv)["log_depth"] == 2
    w.close()
    d.close()


def test_l1_eviction_logs_removed_records(start_server):
    # 1 MiB objects in the smallest L1 (64 MiB): the later prompts evict
    # the earlier ones.
    srv = start(start_server)
    d = srv.dealer()
    w = one_rank(srv, hidden=8192)
    stored = set()
    for seed in range(12):
        toks = prompt(100 + seed, n_chunks=8)
        w.store(toks, 0, 8 * CS)
        stored.update(chunk_hashes(toks))
    r = poll_until(d, lambda ev: any(e["kind"] == "removed" for e in ev))
    removed = [e for e in r["events"] if e["kind"] == "removed"]
    assert removed, [e["kind"] for e in r["events"]]
    for e in removed:
        assert (e["medium"], e["model_name"], e["parent_block_hash"], e["token_ids"]) == \
            ("CPU", "m", None, [])
        assert e["block_hashes"] and set(e["block_hashes"]) <= stored
        assert len(set(e["block_hashes"])) == len(e["block_hashes"])
    # CLEAR removes the rest: every stored chunk is removed once in all.
    assert d.call(CLEAR, False) is not None
    r = poll_until(d, lambda ev: sum(len(e["block_hashes"]) for e in ev
                                     if e["kind"] == "removed") >= len(stored))
    gone = [h for e in r["events"] if e["kind"] == "removed" for h in e["block_hashes"]]
    assert sorted(gone) == sorted(stored)
    w.close()
    d.close()


def test_l2_store_logs_storage_records(start_server, tmp_path):
    srv = start(start_server, *l2_fs_args(tmp_path))
    d = srv.dealer()
    w = one_rank(srv)
    toks = prompt(5)
    hashes = chunk_hashes(toks)
    w.store(toks, 0, 4 * CS)
    r = poll_until(d, lambda ev: sum(e["medium"] == "STORAGE" for e in ev) >= 4)
    l2 = [e for e in r["events"] if e["medium"] == "STORAGE"]
    assert [e["kind"] for e in l2] == ["stored"] * 4
    assert sorted(e["block_hashes"][0] for e in l2) == sorted(hashes)
    for e in l2:
        c = hashes.index(e["block_hashes"][0])
        assert e["token_ids"] == toks[c * CS:(c + 1) * CS]
        assert e["parent_block_hash"] == (hashes[c - 1] if c else None)
    w.close()
    d.close()


def test_restart_changes_the_incarnation(start_server):
    srv = start(start_server)
    d = srv.dealer()
    before = poll(d)["incarnation"]
    d.close()
    assert srv.stop() == 0, srv.output()
    srv = start(start_server)
    d = srv.dealer()
    after = poll(d)
    assert after["incarnation"] != before and after["events"] == []
    d.close()


def error_of(frames):
    assert frames is not None and frames[2] == b"LMCACHE_RPC_ERROR_V1", frames
    return msgpack.unpackb(frames[3])


def test_malformed_arguments_are_refused_and_the_server_serves_on(start_server):
    srv = start(start_server, "--rpc-error-frames")
    d = srv.dealer()
    for args, word in (((), "model_name"), (("m", 0), "model_name"), ((1, 0, 1), "model_name"),
                       (("m", -1, 1), "cursor"), (("m", True, 1), "cursor"),
                       (("m", "0", 1), "cursor"), (("m", 0, 0), "max_events"),
                       (("m", 0, -5), "max_events"), (("m", 0, 1.5), "max_events"),
                       (("m", 0, 1, 2), "model_name")):
        err = error_of(d.call(POLL_KV_EVENTS, *args))
        assert err["error_type"] == "ValidationError" and word in err["message"], (args, err)
    assert d.call(NOOP)[2] == b"\xa2OK"
    assert poll(d, max_events=10**12)["enabled"] is True   # capped, not refused
    d.close()


def test_flag_in_print_config_and_config_file_and_negative_refused(tmp_path):
    base = ("--l1-size-gb", "0.0625", "--eviction-policy", "LRU")
    r = run_lmcached(*base, "--print-config")
    assert r.returncode == 0 and json.loads(r.stdout)["kv-event-log-size"] == 32768, r.stderr
    conf = tmp_path / "c.json"
    conf.write_text(json.dumps({"kv-event-log-size": 7}))
    r = run_lmcached(*base, "--config", str(conf), "--print-config")
    assert r.returncode == 0 and json.loads(r.stdout)["kv-event-log-size"] == 7, r.stderr
    r = run_lmcached(*base, "--kv-event-log-size", "-1")
    assert r.returncode != 0 and "--kv-event-log-size" in r.stderr and "-1" in r.stderr
