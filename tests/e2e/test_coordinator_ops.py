"""Issue 31, the operator's first hour with lmcached-coordinator
(docs/coordinator.md): the older L2 usage stream (POST /l2/events) from a
real lmcached, the database's default place, /version and the process
metrics, the first log lines, the quota replies beside lmcached's, and
--config / --print-config."""
import json
import os
import subprocess
import time
import urllib.request

import pytest

from lmc.server import Server
from test_coordinator_api import COORDINATOR, P, Coordinator
from test_fleet import GIB, l2_listing, wait_for
from test_lookup_engine_driven import CS, Worker, prompt


@pytest.fixture
def started(tmp_path):
    """Calls start(kind, ...) and stops what it started at the end."""
    things = []

    def start(thing):
        things.append(thing)
        return thing

    yield start
    problems = []
    for t in reversed(things):
        if isinstance(t, Coordinator):
            p = t.teardown_problem()
        elif isinstance(t, Worker):
            t.close()
            p = None
        else:
            rc = t.stop() if t.alive() else t.proc.returncode
            p = None if rc == 0 else f"lmcached exited {rc}: {t.output()[-2000:]}"
        if p:
            problems.append(p)
    assert not problems, problems


def http_json(port, path):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
        return json.loads(r.read())


# ---- POST /l2/events ------------------------------------------------------------

def l2_usage_status(srv):
    return http_json(srv.http_port, "/status")["coordinator"]["l2_usage_events"]


def test_l2_usage_stream_from_lmcached(tmp_path, started):
    """lmcached with --coordinator-l2-event-reporting and an fs L2 posts its
    L2 stores to /l2/events: every batch is accepted (none dropped) and the
    coordinator's usage view and metrics show them."""
    coord = started(Coordinator(tmp_path / "coord.db", CHUNK_SIZE=str(CS)))
    l2 = tmp_path / "l2"
    l2.mkdir()
    spec = json.dumps({"type": "fs", "base_path": str(l2), "shared": True})
    srv = started(Server("--chunk-size", str(CS), "--instance-id", "node-a",
                         "--l2-adapter", spec,
                         "--coordinator-url", f"http://127.0.0.1:{coord.port}",
                         "--coordinator-heartbeat-interval", "0.3",
                         "--coordinator-l2-event-reporting",
                         "--coordinator-l2-event-flush-interval", "0.2"))
    ws = [started(Worker(srv, 3001, 0)), started(Worker(srv, 3002, 1))]
    for w in ws:
        ctx = w.store(prompt(5), 0, 64, rid="st5", salt="tenant-a")
        assert ctx["chunk_indices"] == [0, 1, 2, 3], ctx
    wait_for("8 objects in L2", lambda: len(l2_listing(srv)) >= 8)
    stored = sum(size for k, size in l2_listing(srv).items() if k[4] == "tenant-a")
    assert stored > 0

    def usage():
        st, r = coord.call("GET", "/quota/tenant-a?tier=l2")
        assert st == 200, r
        return round(r["usage_gb"] * GIB)
    wait_for("the coordinator's usage of tenant-a", lambda: usage() == stored)
    status = wait_for("a batch accepted", lambda: (lambda s: s if s["batches_sent"] >= 1
                                                   else None)(l2_usage_status(srv)))
    assert status["enabled"] is True
    assert status["batches_dropped"] == 0 and status["events_dropped"] == 0, status
    assert coord.metric("lmcache_mp_coordinator_l2_usage_posts_total") >= 1
    assert coord.metric("lmcache_mp_coordinator_l2_usage_events_total") >= 8
    assert "HTTP 404" not in srv.output()


def test_l2_events_body_checks_and_token(tmp_path, started):
    coord = started(Coordinator(tmp_path / "coord.db", AUTH_TOKEN="tok"))
    key = {"chunk_hash_hex": "ab" * 16, "model_name": "m", "kv_rank": 0,
           "object_group_id": 0, "cache_salt": "s"}
    good = {"instance_id": "n", "seq": 1, "tier": "l2",
            "events": [{"type": "store", "key": key, "bytes": 1 << 20},
                       {"type": "lookup", "key": key, "bytes": 0}]}
    st, r = coord.call("POST", "/l2/events", good)
    assert st == 401, r                                   # the token is required
    st, r = coord.call("POST", "/l2/events", good, token="tok")
    assert (st, r) == (200, {"recorded": 2})
    st, r = coord.call("POST", "/l2/events", good, token="tok")   # again: replaces
    assert (st, r) == (200, {"recorded": 2})
    st, r = coord.call("GET", "/quota/s", token="tok")
    assert r["usage_gb"] == pytest.approx(1 / 1024)
    bad = [
        (b"{", "JSON"),
        (b"[]", "body must be"),
        (json.dumps({**good, "events": {}}), "events must be a list"),
        (json.dumps({**good, "tier": "l1"}), "tier must be"),
        (json.dumps({k: v for k, v in good.items() if k != "instance_id"}), "instance_id"),
        (json.dumps({**good, "seq": -1}), "seq must be"),
        (json.dumps({**good, "events": [{"type": "delete", "key": key}]}),
         "events[0]: type must be"),
        (json.dumps({**good, "events": [{"type": "store", "key": key}]}),
         "events[0]: bytes must be"),
        (json.dumps({**good, "events": [{"type": "store", "key": {**key, "kv_rank": -1},
                                         "bytes": 1}]}), "events[0]: key: kv_rank"),
    ]
    for body, reason in bad:
        st, r = coord.call("POST", "/l2/events", raw=body, token="tok")
        assert st == 422 and reason in r["detail"], (body, st, r)
    st, r = coord.call("GET", "/quota/s", token="tok")
    assert r["usage_gb"] == pytest.approx(1 / 1024)        # nothing of those applied
    assert coord.metric("lmcache_mp_coordinator_l2_usage_posts_total") == 2
    assert coord.metric("lmcache_mp_coordinator_l2_usage_events_total") == 4
    # The usage from the stream is saved like the /events stream's.
    coord.stop()
    again = started(Coordinator(tmp_path / "coord.db", AUTH_TOKEN="tok"))
    st, r = again.call("GET", "/quota/s", token="tok")
    assert r["usage_gb"] == pytest.approx(1 / 1024)
