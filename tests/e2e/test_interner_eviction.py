"""Issue 17: the interner of model names and cache salts is bounded with
eviction (docs/storage.md, "Interned strings").  Past --max-interned-strings
the names no object, lock, queue or event uses any more are evicted, so a
stream of passing tenants never locks new ones out, and a name that comes
back after its eviction finds its objects again (in L2 here)."""
import contextlib
import json
import urllib.request

from lmc.keys import ipc_key
from lmc.ops import CLEAR, END_SESSION, LOOKUP
from lmc.server import Server
from test_l2_fs import data_files, wait_stored
from test_lookup_engine_driven import CS, Worker, chunk_bytes, lookup, prompt

MAX_STRINGS = 16


def interner(srv):
    with urllib.request.urlopen(f"http://127.0.0.1:{srv.http_port}/status", timeout=10) as r:
        return json.loads(r.read())["interner"]


@contextlib.contextmanager
def two_ranks(*args):
    """A server started with args, and the workers of ranks 0 and 1."""
    srv = Server("--chunk-size", str(CS), "--max-interned-strings", str(MAX_STRINGS), *args)
    ws = []
    try:
        ws = [Worker(srv, 1001, 0), Worker(srv, 1002, 1)]
        yield srv, ws
    finally:
        for w in ws:
            w.close()
        rc = srv.stop()
        assert rc == 0, srv.output()


def test_passing_tenants_are_evicted_and_come_back_from_l2(tmp_path):
    spec = {"type": "fs", "base_path": str(tmp_path)}
    with two_ranks("--l2-adapter", json.dumps(spec)) as (srv, ws):
        sched = srv.dealer()
        tenants = 3 * MAX_STRINGS
        for i in range(tenants):
            toks = prompt(1000 + i)
            for w in ws:
                ctx = w.store(toks, 0, 64, rid=f"s{i}", salt=f"tenant-{i}")
                # Refused past the bound before eviction: no slots at all.
                assert ctx["chunk_indices"] == [0, 1, 2, 3], (i, interner(srv))
            wait_stored(srv, tmp_path, 8 * (i + 1))
            # L1 forgets the tenant: its name is referenced by nothing now.
            assert sched.call(CLEAR, False) is not None
        st = interner(srv)
        assert st["refused"] == 0, st
        assert st["evicted"] >= tenants - MAX_STRINGS, st
        assert st["strings"] <= MAX_STRINGS, st
        assert len(data_files(tmp_path)) == 8 * tenants

        # An early tenant's name was evicted long ago; it comes back with a
        # LOOKUP and finds its own objects (a recycled name would find none).
        for i in (0, 1, tenants // 2):
            toks, salt = prompt(1000 + i), f"tenant-{i}"
            assert lookup(sched, toks, f"back{i}", salt=salt, wait=True) == 4, (i, interner(srv))
            for w in ws:
                got = w.retrieve(toks, 0, 64, f"back{i}", salt=salt)
                assert got == [chunk_bytes(w.rank, toks, c) for c in range(4)]

        # The unauthenticated path: LOOKUPs naming ever new salts intern
        # them while an L2 tier is attached, and give them back at END.
        toks = prompt(1)
        evicted_before = interner(srv)["evicted"]
        for j in range(40 * MAX_STRINGS):
            sched.send(LOOKUP, ipc_key(toks, 0, 64, f"l{j}", world_size=2, salt=f"probe-{j}"), 1)
            sched.send(END_SESSION, f"l{j}")
            assert sched.recv(10000) is not None and sched.recv(10000) is not None
        st = interner(srv)
        # A probe's name stays referenced while its L2 lookup runs, so one
        # may meet an interner full of names in use (a LOOKUP then misses);
        # what passed is evicted.
        assert st["strings"] <= MAX_STRINGS, st
        assert st["evicted"] - evicted_before >= 30 * MAX_STRINGS, st
        # ... and a tenant that arrives after them still stores.
        for w in ws:
            ctx = w.store(toks, 0, 64, rid="late", salt="late-tenant")
            assert ctx["chunk_indices"] == [0, 1, 2, 3], interner(srv)
        assert lookup(sched, toks, "late-r", salt="late-tenant", wait=True) == 4
        sched.close()


def test_names_in_use_are_never_evicted():
    """Every name held by resident objects: a new one is refused (counted),
    and the held tenants keep their objects."""
    with two_ranks() as (srv, ws):
        sched = srv.dealer()
        # "m" and the resident tenants fill the interner.
        held = MAX_STRINGS - 1
        for i in range(held):
            for w in ws:
                assert w.store(prompt(2000 + i), 0, 64, rid=f"h{i}",
                               salt=f"held-{i}")["chunk_indices"] == [0, 1, 2, 3]
        assert interner(srv)["strings"] == MAX_STRINGS
        ctx = ws[0].store(prompt(9), 0, 64, rid="x", salt="one-too-many")
        assert ctx["chunk_indices"] == [] and ctx["slots"] == []
        st = interner(srv)
        assert st["refused"] >= 1 and st["evicted"] == 0, st
        for i in range(held):
            toks, salt = prompt(2000 + i), f"held-{i}"
            end = len(toks) // CS * CS
            assert sched.call(LOOKUP, ipc_key(toks, 0, end, f"r{i}", world_size=2, salt=salt), 1) is not None
            for w in ws:
                got = w.retrieve(toks, 0, 64, f"r{i}", salt=salt)
                assert got == [chunk_bytes(w.rank, toks, c) for c in range(4)], i
        sched.close()
