"""Issue 29: one client must never read another tenant's bytes, read an
object past its end, or cost another tenant anything.

* A worker registered for one model cannot STORE or RETRIEVE under another
  model's name: its objects would have its layout's size under keys whose
  readers expect another.
* A model redeployed with another shape (the same name, more layers) while
  L1 still holds the old objects: no lookup counts them, no retrieve reads
  them (a metric counts each refusal), and the new layout's stores replace
  them.
* Model names that are not UTF-8 are refused at the wire boundary, with the
  rule in the reason."""
import time
import urllib.request

import msgpack
import pytest

from lmc.client import unpack
from lmc.ops import (FREE_LOOKUP_LOCKS, LOOKUP, NOOP, PREPARE_STORE, QUERY_PREFETCH_STATUS,
                     REGISTER_KV_CACHE_ENGINE_DRIVEN_CONTEXT, STORE)
from paged_kv import PagedKV
from test_coordinator_api import start_coordinator  # noqa: F401  (a fixture)
from test_server_driven import (CS, ZEROS, EdWorker, Engine, chunk_rows, key, lookup, prompt,
                                wait_for_log)

SERVER_ARGS = ("--chunk-size", str(CS), "--cpu-kv-layout", "hint")   # srv's (conftest.py)


def size_mismatches(srv):
    with urllib.request.urlopen(f"http://127.0.0.1:{srv.http_port}/metrics", timeout=5) as r:
        for line in r.read().decode().splitlines():
            if line.startswith("lmcache_mp_l1_object_size_mismatches_total "):
                return float(line.split()[1])
    raise AssertionError("no lmcache_mp_l1_object_size_mismatches_total")


def test_a_worker_cannot_store_under_another_models_name(srv):
    """Worker A (model "a", one layer) stores under model "b"'s name, whose
    worker has two layers: refused, so B never finds a short object."""
    ga = PagedKV("tena", "fa_nhd", nl=1, nb=16, bs=16, nh=2, hs=8)
    gb = PagedKV("tenb", "fa_nhd", nl=2, nb=16, bs=16, nh=2, hs=8)
    a = Engine(srv, 31, [ga], model="a")
    b = Engine(srv, 32, [gb], model="b")
    toks = prompt(40)
    d = srv.dealer()
    assert unpack(d.call(STORE, key(toks, 0, CS, "s", model="b"), 31, [[1, 2]], ZEROS)) == \
        [ZEROS, False]
    assert wait_for_log(srv, "the key names another model or world size"), srv.output()
    assert lookup(srv, toks, "rb", model="b") == 0
    # An engine-driven worker of model "a" is answered as unregistered too.
    ed = EdWorker(srv, 33, layers=1, hidden=16, model="a")
    r = unpack(ed.d.call(PREPARE_STORE, key(toks, 0, CS, "s", model="b"), 33))
    assert r == {"context": {}} or r.get("context", {}).get("slots") in (None, []), r
    assert wait_for_log(srv, "answered as unregistered"), srv.output()
    assert lookup(srv, toks, "rb2", model="b") == 0
    ed.close()
    d.close()
    a.close()
    b.close()


def test_a_redeployed_model_never_reads_the_old_layouts_objects(srv):
    """Model "m" with one layer stores three chunks and goes away; "m"
    comes back with two layers (twice the object size) while L1 still
    holds the old objects under the same keys.  No lookup counts them, a
    RETRIEVE reads nothing into the engine's blocks, a metric counts the
    refusals; a STORE of the new layout replaces them, and then they hit."""
    old = PagedKV("redep1", "fa_nhd", nl=1, nb=16, bs=16, nh=2, hs=8)
    e1 = Engine(srv, 41, [old])
    toks = prompt(41)
    assert e1.store(toks, 0, 3 * CS, [list(range(1, 7))]) == [ZEROS, True]
    assert lookup(srv, toks, "r1") == 3
    d = srv.dealer()   # the engine does not retrieve: the lookup's read locks go
    assert d.call(FREE_LOOKUP_LOCKS, key(toks, 0, 3 * CS, "r1", worker_id=None), 1) is not None
    d.close()
    e1.close()   # the last engine of "m": its layout is released
    old.close()

    new = PagedKV("redep2", "fa_nhd", nl=2, nb=16, bs=16, nh=2, hs=8)
    e2 = Engine(srv, 42, [new])
    before = size_mismatches(srv)
    assert lookup(srv, toks, "r2") == 0
    assert size_mismatches(srv) > before
    dst = list(range(7, 13))
    untouched = [new.block_bytes(b) for b in dst]
    assert e2.retrieve(toks, 0, 3 * CS, [dst], "r2", skip=0) == [ZEROS, False]
    assert [new.block_bytes(b) for b in dst] == untouched
    # The new layout's STORE replaces the old objects.
    assert e2.store(toks, 0, 3 * CS, [list(range(1, 7))]) == [ZEROS, True]
    assert wait_for_log(srv, "replaced 3 resident object(s) of another size"), srv.output()
    assert lookup(srv, toks, "r3") == 3
    assert e2.retrieve(toks, 0, 3 * CS, [dst], "r3", skip=0) == [ZEROS, True]
    for c in range(3):
        assert chunk_rows(new, dst, c) == chunk_rows(new, list(range(1, 7)), c)
    e2.close()
    new.close()


def test_a_model_registers_again_with_another_layout_right_after_unregistering(srv):
    """UNREGISTER_KV_CACHE gives the model's layout back with its reply,
    although the context itself lives on while its page-fill thread (which
    touches every page of a large cache) still holds it: the same model,
    registered again at once with another layout, is taken every time."""
    for i in range(6):
        g = PagedKV(f"again{i}", "fa_nhd", nl=1 + i % 2, nb=32768, bs=16, nh=2, hs=8)
        e = Engine(srv, 70 + i, [g])
        e.close()
        g.close()


@pytest.mark.parametrize("name", [b"\xff\xfeevil", b"caf\xc3", b"\xc0\xafetc"])
def test_model_names_that_are_not_utf8_are_refused(srv, name):
    """msgpack str frames whose bytes are not UTF-8 (a Python client can
    send them as raw str): LOOKUP, STORE and engine-driven registration
    refuse them, naming the rule."""
    d = srv.dealer()
    k = key(prompt(42), 0, CS, "r", worker_id=None)
    k["model_name"] = "PLACEHOLDER"
    raw = msgpack.packb(k).replace(msgpack.packb("PLACEHOLDER"),
                                   bytes([0xa0 | len(name)]) + name)
    assert d.call(LOOKUP, raw=[raw, msgpack.packb(1)], timeout_ms=500) is None
    assert wait_for_log(srv, "valid UTF-8"), srv.output()
    assert "model_name must be a non-empty str of at most 256 bytes of valid UTF-8" in \
        srv.output()
    # What the log shows of such bytes is escaped, never raw.
    with open(srv.log_path, "rb") as f:
        log = f.read()
    assert name not in log
    assert d.call(NOOP)[2] == msgpack.packb("OK")
    assert unpack(d.call(QUERY_PREFETCH_STATUS, "r")) == 0
    d.close()


def raw_model(obj, name):
    """obj (a map with model_name "PLACEHOLDER") packed with `name`'s raw
    bytes as a msgpack str, as a client can send them."""
    return msgpack.packb(obj).replace(msgpack.packb("PLACEHOLDER"),
                                      bytes([0xa0 | len(name)]) + name)


def test_a_tenant_with_a_bad_name_costs_the_others_no_event(start_server,
                                                            start_coordinator):
    """A tenant that registers and stores under the model name
    b"\\xff\\xfeevil" while another stores normally: the bad one is refused
    at the wire, and the good one's keys reach the coordinator's directory
    (before, its events were dropped with every post the bad name was in)."""
    coord = start_coordinator()
    srv = start_server("--chunk-size", str(CS), "--instance-id", "node-t",
                       "--coordinator-url", f"http://127.0.0.1:{coord.port}",
                       "--coordinator-event-reporting",
                       "--coordinator-event-flush-interval", "0.2")
    good = EdWorker(srv, 71, layers=1, hidden=16, model="good")
    bad = srv.dealer()
    p = {"instance_id": 72, "model_name": "PLACEHOLDER", "world_size": 1, "block_size": CS,
         "num_layers": 1, "hidden_dim_size": 16, "dtype_str": "float16", "use_mla": False}
    r = unpack(bad.call(REGISTER_KV_CACHE_ENGINE_DRIVEN_CONTEXT, raw=[raw_model(p, b"\xff\xfeevil")]))
    assert r["shm_name"] == "" and "valid UTF-8" in r["error"], r
    toks = prompt(70, n_chunks=2)
    chunk = bytes(2 * 1 * CS * 16 * 2)
    for i in range(20):   # the bad tenant keeps trying while the good one stores
        k = key(toks, 0, 2 * CS, f"b{i}")
        k["model_name"] = "PLACEHOLDER"
        assert bad.call(PREPARE_STORE, raw=[raw_model(k, b"\xff\xfeevil"), msgpack.packb(72)],
                        timeout_ms=300) is None
        if i == 10:
            good.store(toks, 0, 2 * CS, [chunk, chunk])
    deadline = time.monotonic() + 20
    placed = None
    while time.monotonic() < deadline:
        placed = coord.call("GET", "/directory/stats")[1]["l1"]["by_instance"].get("node-t")
        if placed == 2:
            break
        time.sleep(0.1)
    assert placed == 2, (placed, srv.output()[-3000:])
    bad.close()
    good.close()
