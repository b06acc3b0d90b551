"""lmcached-coordinator over HTTP (docs/coordinator.md): membership and the
sweep, the /events gate, usage and quotas, persistence across a restart,
bad input, the bearer token, and the fleet eviction loop against a real
lmcached with an fs L2."""
import http.client
import json
import os
import resource
import signal
import socket
import sqlite3
import subprocess
import time

import pytest

from lmc.keys import coord_key
from lmc.server import ROOT, free_port

COORDINATOR = os.environ.get("LMCACHED_COORDINATOR_BIN",
                             os.path.join(ROOT, "build", "lmcached-coordinator"))
P = "LMCACHE_MP_COORDINATOR_"


class Coordinator:
    def __init__(self, db_path, port=None, **env):
        self.port = port or free_port()
        self.db_path = str(db_path)
        self.stop_signal = None     # the signal the test stopped it with, if it did
        e = {k: v for k, v in os.environ.items() if not k.startswith(P)}
        e.update({P + "HOST": "127.0.0.1", P + "PORT": str(self.port),
                  P + "DB_PATH": self.db_path, P + "ENABLE_STARTUP_RESYNC": "false"})
        e.update({P + k: str(v) for k, v in env.items()})
        self.log_path = f"{self.db_path}.{self.port}.log"
        self.log = open(self.log_path, "w+b")
        self.proc = subprocess.Popen([COORDINATOR], env=e, stdout=self.log,
                                     stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"coordinator exited {self.proc.returncode}: {self.output()}")
            try:
                if self.call("GET", "/healthcheck")[0] == 200:
                    return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("coordinator did not answer within 10 s")

    def output(self):
        with open(self.log_path, "rb") as f:
            return f.read().decode(errors="replace")

    def call(self, method, path, body=None, raw=None, token=None, headers=None):
        """(status, decoded JSON body or text or None)."""
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        h = dict(headers or {})
        if token:
            h["Authorization"] = f"Bearer {token}"
        data = raw if raw is not None else (json.dumps(body) if body is not None else None)
        c.request(method, path, body=data, headers=h)
        r = c.getresponse()
        text = r.read().decode()
        c.close()
        try:
            return r.status, json.loads(text) if text else None
        except ValueError:
            return r.status, text

    def metric(self, name):
        for line in self.call("GET", "/metrics")[1].splitlines():
            if line.startswith(name + " "):
                return float(line.split()[-1])
        return None

    def stop(self, sig=signal.SIGTERM):
        """Stops it on purpose with sig (a no-op once it exited); its exit
        status, -SIGKILL when it did not exit within 20 s."""
        if self.proc.poll() is None:
            self.stop_signal = self.stop_signal or sig
            self.proc.send_signal(sig)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                return -signal.SIGKILL
        self.log.close()
        return self.proc.returncode

    def teardown_problem(self):
        """At teardown, None or what is wrong: a coordinator the test did not
        stop must still run, answer a health request and exit 0 on SIGTERM;
        one it stopped with SIGTERM must have exited 0.  Only one it killed
        on purpose with another signal may have exited otherwise."""
        if self.stop_signal is None:
            if self.proc.poll() is not None:
                return f"exited {self.proc.returncode} during the test: {self.output()[-3000:]}"
            try:
                health = self.call("GET", "/healthcheck")[0]
            except OSError as e:
                health = repr(e)
            rc = self.stop()
            if health != 200 or rc != 0:
                return f"health {health}, SIGTERM exit {rc}: {self.output()[-3000:]}"
        elif self.stop_signal == signal.SIGTERM and self.proc.returncode != 0:
            return f"exited {self.proc.returncode} on SIGTERM: {self.output()[-3000:]}"
        return None


@pytest.fixture
def start_coordinator(tmp_path):
    started = []

    def start(db="coord.db", **env):
        c = Coordinator(tmp_path / db, **env)
        started.append(c)
        return c

    yield start
    problems = [p for p in (c.teardown_problem() for c in started) if p]
    assert not problems, problems


def batch(inst, inc, seq, etype, keys, size=100, tier="l2", backend="fs"):
    b = {"instance_id": inst, "incarnation": inc, "seq": seq, "event_type": etype,
         "tier": tier, "backend": backend, "shared": True, "ts": time.time(),
         "entries": [{"key": k, "size_bytes": size, "token_ids": [], "token_offset": -1}
                     for k in keys]}
    return b


def post_events(c, *batches, token=None):
    return c.call("POST", "/events", {"batches": list(batches)}, token=token)


# ---- membership ---------------------------------------------------------------

def test_membership_and_sweep(start_coordinator):
    c = start_coordinator(INSTANCE_TIMEOUT="1", HEALTH_CHECK_INTERVAL="0.2")
    st, r = c.call("POST", "/instances", {"ip": " 127.0.0.1 ", "http_port": 8080})
    assert st == 200 and r["re_registered"] is False
    minted = r["instance_id"]
    assert minted.startswith("mp-") and len(minted) == 35 and int(minted[3:], 16) >= 0
    st, r = c.call("POST", "/instances", {"instance_id": " n1 ", "ip": "10.0.0.2",
                                          "http_port": 9000, "metadata": {"zone": "a"},
                                          "p2p_advertised_url": "tcp://10.0.0.2:5", "mq_port": 5})
    assert (st, r) == (200, {"instance_id": "n1", "re_registered": False})
    st, r = c.call("POST", "/instances", {"instance_id": "n1", "ip": "10.0.0.3", "http_port": 9001})
    assert (st, r) == (200, {"instance_id": "n1", "re_registered": True})
    st, r = c.call("GET", "/instances")
    by_id = {i["instance_id"]: i for i in r["instances"]}
    assert set(by_id) == {minted, "n1"} and by_id[minted]["ip"] == "127.0.0.1"
    assert by_id["n1"]["ip"] == "10.0.0.3" and by_id["n1"]["metadata"] == {}
    assert by_id["n1"]["registration_time"] > time.time() - 60
    assert c.call("PUT", "/instances/nope/heartbeat") == (
        404, {"error": "unknown instance nope; re-register"})
    # n1 keeps heartbeating, the minted one does not: the sweep removes it
    # after the timeout (1 s) plus at most one sweep period.
    t0 = time.monotonic()
    gone_at = None
    while time.monotonic() - t0 < 4:
        assert c.call("PUT", "/instances/n1/heartbeat") == (200, {"instance_id": "n1"})
        ids = {i["instance_id"] for i in c.call("GET", "/instances")[1]["instances"]}
        if minted not in ids and gone_at is None:
            gone_at = time.monotonic() - t0
        time.sleep(0.1)
    assert gone_at is not None and 0.7 < gone_at < 2.0, gone_at
    assert {i["instance_id"] for i in c.call("GET", "/instances")[1]["instances"]} == {"n1"}
    assert c.metric("lmcache_mp_coordinator_instances_expired_total") == 1
    assert c.call("DELETE", "/instances/n1") == (204, None)
    assert c.call("DELETE", "/instances/n1") == (204, None)      # idempotent
    assert c.call("GET", "/instances")[1] == {"instances": []}


def test_registration_validation_changes_nothing(start_coordinator):
    c = start_coordinator()
    bad = [{"http_port": 80}, {"ip": "", "http_port": 80}, {"ip": "  ", "http_port": 80},
           {"ip": "h", "http_port": 0}, {"ip": "h", "http_port": 65536},
           {"ip": "h", "http_port": "80"}, {"ip": "h", "http_port": 80, "mq_port": -1},
           {"ip": "h", "http_port": 80, "metadata": {"a": 1}},
           {"ip": "h", "http_port": 80, "metadata": []},
           {"ip": "h", "http_port": 80, "instance_id": 7},
           {"ip": "h", "http_port": 80, "instance_id": "x" * 257}, [1]]
    for b in bad:
        st, r = c.call("POST", "/instances", b)
        assert st == 422 and r["detail"], (b, st, r)
    assert c.call("POST", "/instances", raw="{nope")[0] == 422
    assert c.call("GET", "/instances")[1] == {"instances": []}


# ---- events, usage and quotas ----------------------------------------------------

def test_events_gate_usage_and_quotas(start_coordinator):
    c = start_coordinator()
    st, r = post_events(c, batch("a", 10, 1, "store", [coord_key(1, "t"), coord_key(2, "t")]),
                        batch("a", 10, 1, "store", [coord_key(3, "t")]),     # duplicate seq
                        batch("a", 10, 2, "store", [coord_key(1, "t")], size=300))  # stored again
    assert (st, r) == (200, {"applied": 2, "duplicates": 1, "stale": 0})
    st, r = c.call("GET", "/quota/t")
    assert st == 200 and r["usage_gb"] * 2**30 == pytest.approx(400)
    assert r["quota_exists"] is False and r["tier"] == "l2"
    assert post_events(c, batch("a", 9, 7, "store", [coord_key(4, "t")]))[1] == {
        "applied": 0, "duplicates": 0, "stale": 1}
    assert post_events(c, batch("a", 10, 5, "delete", [coord_key(2, "t")]))[1]["applied"] == 1
    assert c.metric("lmcache_mp_coordinator_events_gaps_total") == 1      # 3, 4 missing
    assert c.metric("lmcache_mp_coordinator_events_duplicates_total") == 1
    assert c.metric("lmcache_mp_coordinator_events_stale_total") == 1
    assert c.metric('lmcache_mp_coordinator_l2_usage_bytes{cache_salt="t"}') == 300
    assert c.metric('lmcache_mp_key_directory_placement_count{tier="l2"}') == 1
    post_events(c, batch("b", 1, 1, "store", [coord_key(9)], size=2**30))        # the empty salt
    # Quotas: explicit, _default (= empty salt), the default for others.
    # (lmcached's names beside upstream's, issue 31: test_coordinator_ops.py)
    assert c.call("PUT", "/quota/t", {"limit_gb": 2.5}) == (
        200, {"cache_salt": "t", "limit_gb": 2.5, "status": "ok", "tier": "l2",
              "enforced": True})
    assert c.call("PUT", "/quota/_default", {"limit_gb": 0, "tier": "l2"})[0] == 200
    st, r = c.call("GET", "/quota/_default?tier=l2")
    assert r == {"cache_salt": "", "quota_limit_gb": 0.0, "quota_exists": True, "usage_gb": 1.0,
                 "tier": "l2", "limit_gb": 0.0, "exists": True, "current_usage_gb": 1.0}
    assert c.call("GET", "/quota/config") == (200, {"default_limit_gb": None, "tier": "l2"})
    assert c.call("PUT", "/quota/config", {"default_limit_gb": 1.5, "tier": "l2"}) == (
        200, {"default_limit_gb": 1.5, "tier": "l2"})
    st, r = c.call("GET", "/quota?tier=l2")
    assert st == 200 and [x["cache_salt"] for x in r["by_cache_salt"]] == ["", "t"]
    assert r["total_gb"] == pytest.approx(1 + 300 / 2**30)
    assert c.call("DELETE", "/quota/t")[1]["status"] == "removed"
    assert c.call("DELETE", "/quota/t")[1]["status"] == "not_found"
    assert c.call("PUT", "/quota/config", {"default_limit_gb": None})[1]["default_limit_gb"] is None


def test_quota_errors_change_nothing(start_coordinator):
    c = start_coordinator()
    assert c.call("PUT", "/quota/t", {"limit_gb": 1})[0] == 200
    for body in ({"limit_gb": -1}, {"limit_gb": "1"}, {"limit_gb": None}, {}, [1]):
        st, r = c.call("PUT", "/quota/t", body)
        assert st == 400 and "invalid quota limit" in r["error"], body
    assert c.call("PUT", "/quota/t", raw='{"limit_gb": 1e999}')[0] == 400   # not finite
    assert c.call("PUT", "/quota/t", raw="{bad")[0] == 400
    st, r = c.call("PUT", "/quota/t", {"limit_gb": 3, "tier": "all"})
    assert st == 400 and "tier 'all' has no quota accounting" in r["error"]
    assert c.call("GET", "/quota?tier=all")[0] == 400
    assert c.call("GET", "/quota/t?tier=l9")[0] == 400
    assert c.call("PUT", "/quota/config", {"default_limit_gb": -2})[0] == 400
    assert c.call("PUT", "/quota/a@b", {"limit_gb": 1})[0] == 400
    assert c.call("GET", "/quota/t")[1]["quota_limit_gb"] == 1.0
    assert c.call("GET", "/quota/config")[1]["default_limit_gb"] is None


# ---- bad input ------------------------------------------------------------------

def test_bad_events_change_nothing(start_coordinator):
    c = start_coordinator()
    assert post_events(c, batch("a", 1, 1, "store", [coord_key(1)]))[0] == 200
    good = batch("a", 1, 2, "store", [coord_key(2)])
    bad = [
        {"batches": [dict(good, seq=0)]},
        {"batches": [dict(good, tier="all")]},
        {"batches": [dict(good, event_type="evict")]},
        {"batches": [dict(good, incarnation="1")]},
        {"batches": [{k: v for k, v in good.items() if k != "backend"}]},
        {"batches": [dict(good, entries=[{"key": coord_key(2), "size_bytes": -5}])]},
        {"batches": [dict(good, entries=[{"key": dict(coord_key(2), kv_rank="0"), "size_bytes": 1}])]},
        {"batches": [dict(good, entries=[{"key": dict(coord_key(2), model_name="a@b"),
                                          "size_bytes": 1}])]},
        {"batches": [dict(good, instance_id="")]},
        {"batches": [good, dict(good, seq=3, tier="l7")]},   # one bad batch rejects all
        {"batches": "x"},
        [],
    ]
    for b in bad:
        st, r = c.call("POST", "/events", b)
        assert st == 422 and r["detail"], (b, st, r)
    assert c.call("POST", "/events", raw="{oops")[0] == 422
    assert c.call("POST", "/events", raw="")[0] == 422
    # Nothing changed: seq 2 is still new, key 2 unknown, usage one key.
    assert c.metric('lmcache_mp_key_directory_placement_count{tier="l2"}') == 1
    assert post_events(c, good)[1] == {"applied": 1, "duplicates": 0, "stale": 0}
    assert c.call("GET", "/directory/keys")[1]["total"] == 2


def test_missing_or_mistyped_batch_fields_are_refused_by_name(start_coordinator):
    """Issue 29: one unauthenticated POST /events without event_type or tier
    crashed the coordinator.  Every required field is checked before use:
    each case is a 422 naming the field, and the coordinator keeps serving."""
    c = start_coordinator()
    good = batch("a", 1, 1, "store", [coord_key(1)])
    without = lambda field: {k: v for k, v in good.items() if k != field}
    cases = [
        (without("event_type"), "event_type is required"),
        (without("tier"), "tier is required"),
        (without("instance_id"), "instance_id is required"),
        (without("entries"), "entries is required"),
        (dict(good, event_type=1), "event_type must be a str"),
        (dict(good, event_type=None), "event_type must be a str"),
        (dict(good, event_type={"store": 1}), "event_type must be a str"),
        (dict(good, tier=2), "tier must be a str"),
        (dict(good, backend=""), "backend is required for store batches"),
        (dict(without("backend"), event_type="delete"), "backend is required for delete"),
    ]
    for body, reason in cases:
        st, r = c.call("POST", "/events", {"batches": [body]})
        assert st == 422 and reason in r["detail"], (body, st, r)
        assert c.call("GET", "/healthcheck")[0] == 200, c.output()
    assert c.proc.poll() is None, c.output()
    # Nothing was applied: seq 1 is still new.
    assert post_events(c, good)[1] == {"applied": 1, "duplicates": 0, "stale": 0}
    # An access batch may still go without a backend (the protocol's one exception).
    access = dict(without("backend"), seq=2, event_type="access")
    assert post_events(c, access)[1] == {"applied": 1, "duplicates": 0, "stale": 0}


def test_key_directory_bound(start_coordinator):
    """Issue 29: the key directory grew with every new key.  Past MAX_KEYS
    new keys are not recorded (counted, warned once); the request is still
    applied; the keys the eviction loop works on are all kept."""
    c = start_coordinator(MAX_KEYS="3")
    st, r = post_events(c, batch("a", 1, 1, "store", [coord_key(i, "t") for i in range(5)]))
    assert (st, r) == (200, {"applied": 1, "duplicates": 0, "stale": 0})
    assert c.metric("lmcache_mp_coordinator_keys_tracked") == 3
    assert c.metric("lmcache_mp_coordinator_keys_max") == 3
    assert c.metric("lmcache_mp_coordinator_keys_refused_total") == 2
    assert c.call("GET", "/quota/t")[1]["usage_gb"] * 2**30 == pytest.approx(300)
    post_events(c, batch("a", 1, 2, "store", [coord_key(7, "t")]))
    assert c.metric("lmcache_mp_coordinator_keys_refused_total") == 3
    assert c.output().count("the key directory is full") == 1, c.output()   # once a minute
    post_events(c, batch("a", 1, 3, "delete", [coord_key(0, "t")], size=0))     # room for one
    post_events(c, batch("a", 1, 4, "store", [coord_key(8, "t")]))
    assert c.call("GET", "/directory/keys")[1]["total"] == 3
    pin = {"model_name": "m", "world_size": 1, "token_ids": list(range(256)), "cache_salt": "t"}
    st, r = c.call("POST", "/cache/pins", pin)
    assert st == 503 and "MAX_KEYS" in r["detail"], (st, r)
    assert c.stop() == 0
    # A smaller bound later: what the database holds is loaded all the same.
    c2 = start_coordinator(MAX_KEYS="2")
    assert c2.call("GET", "/directory/keys")[1]["total"] == 3
    assert "no new key is recorded until deletes make room" in c2.output()
    post_events(c2, batch("a", 1, 5, "store", [coord_key(9, "t")]))
    assert c2.metric("lmcache_mp_coordinator_keys_refused_total") == 1


def raw_status(port, data):
    """Sends raw bytes; the status code of the reply (0 if none) and the reply."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(data)
        reply = b""
        while b"\r\n\r\n" not in reply or not reply.rstrip().endswith(b"}"):
            chunk = s.recv(4096)
            if not chunk:
                break
            reply += chunk
    parts = reply.split(b" ", 2)
    return (int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0), reply


def test_body_limits(start_coordinator):
    c = start_coordinator()
    # A declared 10 MB body on a 1 MiB route, 17 MiB on a 16 MiB one:
    # answered from the headers, the body is never read.
    for path, size, limit in (("/quota/t", 10_000_000, 1 << 20),
                              ("/instances", 10_000_000, 1 << 20),
                              ("/events", (16 << 20) + 1, 16 << 20)):
        head = b"%s %s HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % (
            b"PUT" if path.startswith("/quota") else b"POST", path.encode(), size)
        st, reply = raw_status(c.port, head)
        assert st == 413 and b"request body exceeds %d bytes" % limit in reply, reply
    # A chunked body is counted as it streams: refused once past the limit.
    chunk = b" " * 65536
    body = b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for _ in range(20)) + b"0\r\n\r\n"
    head = b"POST /instances HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    assert raw_status(c.port, head + body)[0] == 413
    assert c.metric("lmcache_mp_coordinator_http_too_large_total") == 4
    assert c.call("GET", "/quota/t")[1]["quota_exists"] is False
    assert c.call("GET", "/instances")[1] == {"instances": []}
    # A body at the limit is read (and here rejected for what it says).
    assert c.call("PUT", "/quota/t", raw=b" " * ((1 << 20) - 2) + b"{}")[0] == 400
    assert c.call("GET", "/nowhere")[0] == 404
    assert c.call("PATCH", "/events")[0] == 405
    st, r = c.call("POST", "/blend/match", {})
    assert st == 501 and "/blend/" in r["detail"]
    assert c.call("POST", "/directory/blend-lookup", {})[0] == 400


def test_buffered_body_budget(start_coordinator):
    """Issue 29: 512 connections could buffer 16 MiB each.  All bodies held
    at once share MAX_BUFFERED_MB: a body that would not fit now is a 503
    (a declared one from its headers, a chunked one once it outgrows the
    room), one larger than the whole budget a 413; the coordinator keeps
    serving and the room comes back when a body is done with."""
    c = start_coordinator(MAX_BUFFERED_MB="1")
    post = b"POST /events HTTP/1.1\r\nHost: x\r\n"
    st, reply = raw_status(c.port, post + b"Content-Length: %d\r\n\r\n" % (2 << 20))
    assert st == 413 and b"LMCACHE_MP_COORDINATOR_MAX_BUFFERED_MB" in reply, reply
    # One connection holds 700 kB of the budget while its body comes in.
    body = json.dumps({"batches": [batch("a", 1, 1, "store", [coord_key(1)])]}).encode()
    body = body.ljust(700_000)
    holder = socket.create_connection(("127.0.0.1", c.port), timeout=10)
    try:
        holder.sendall(post + b"Content-Length: %d\r\n\r\n" % len(body) + body[:1000])
        deadline = time.monotonic() + 5
        while c.metric("lmcache_mp_coordinator_http_buffered_bytes") < len(body):
            assert time.monotonic() < deadline, "the first body was never reserved"
            time.sleep(0.02)
        st, reply = raw_status(c.port, post + b"Content-Length: 400000\r\n\r\n")
        assert st == 503 and b"send it again later" in reply, reply
        chunk = b" " * 65536
        chunked = b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for _ in range(8))
        st, reply = raw_status(c.port, post + b"Transfer-Encoding: chunked\r\n\r\n" + chunked +
                               b"0\r\n\r\n")
        assert st == 503, reply
        assert c.call("GET", "/healthcheck")[0] == 200
        holder.sendall(body[1000:])
        reply = b""
        while not reply.rstrip().endswith(b"}"):
            reply += holder.recv(4096)
        assert reply.startswith(b"HTTP/1.1 200") and b'"applied":1' in reply, reply
    finally:
        holder.close()
    assert c.metric("lmcache_mp_coordinator_http_buffered_bytes") == 0
    assert c.metric("lmcache_mp_coordinator_http_busy_total") == 2
    assert c.metric("lmcache_mp_coordinator_http_too_large_total") == 1
    # The 503'd request sent again fits now.
    assert post_events(c, batch("a", 1, 2, "store", [coord_key(2)]))[0] == 200


# ---- persistence ------------------------------------------------------------------

def test_restart_keeps_quotas_pins_cursors_and_usage(start_coordinator):
    c = start_coordinator(CHUNK_SIZE="4")
    toks = list(range(8))                       # two chunks
    assert post_events(c, batch("a", 3, 1, "store", [coord_key(1, "t"), coord_key(2, "t")]))[0] == 200
    assert c.call("PUT", "/quota/t", {"limit_gb": 4})[0] == 200
    assert c.call("PUT", "/quota/config", {"default_limit_gb": 0.5})[0] == 200
    pin = {"model_name": "m", "world_size": 2, "token_ids": toks, "cache_salt": "t"}
    assert c.call("POST", "/cache/pins", pin)[1] == {"requested": 4, "affected": 4,
                                                      "status": "pinned"}
    assert c.call("POST", "/cache/pins", pin)[1]["affected"] == 0     # counted, not new
    assert c.call("DELETE", "/cache/pins", pin)[1] == {"requested": 4, "affected": 0,
                                                        "status": "unpinned"}
    assert c.stop() == 0
    c2 = start_coordinator(CHUNK_SIZE="4")
    assert c2.call("GET", "/quota/t")[1]["quota_limit_gb"] == 4.0
    assert c2.call("GET", "/quota/t")[1]["usage_gb"] * 2**30 == pytest.approx(200)
    assert c2.call("GET", "/quota/config")[1]["default_limit_gb"] == 0.5
    assert c2.call("GET", "/directory/stats")[1]["pinned_keys"] == 4
    # The cursor survived: seq 1 is a duplicate, seq 2 new.
    assert post_events(c2, batch("a", 3, 1, "store", [coord_key(5, "t")]))[1]["duplicates"] == 1
    assert post_events(c2, batch("a", 3, 2, "store", [coord_key(5, "t")]))[1]["applied"] == 1
    assert c2.call("DELETE", "/cache/pins", pin)[1]["affected"] == 4
    assert c2.call("GET", "/directory/stats")[1]["pinned_keys"] == 0


def test_events_not_saved_are_answered_503_and_applied_once_when_sent_again(start_coordinator):
    """Issue 29: events the database did not take were acknowledged 200.
    Now a request whose transaction cannot begin or commit is a 503 with the
    gate as before it; the same batches sent again are applied once, and
    what the failed request did in memory (a delete here) reaches the
    database too."""
    c = start_coordinator()
    assert post_events(c, batch("a", 1, 1, "store", [coord_key(1, "t")]))[0] == 200
    again = [batch("a", 1, 2, "store", [coord_key(2, "t")], size=300),
             batch("a", 1, 3, "delete", [coord_key(1, "t")], size=0)]
    # Another process holds the database's write lock (an operator's sqlite3).
    con = sqlite3.connect(c.db_path, timeout=0, isolation_level=None)
    con.execute("BEGIN IMMEDIATE")
    try:
        st, r = post_events(c, *again)
    finally:
        con.execute("ROLLBACK")
        con.close()
    assert st == 503 and "send the batches again later" in r["detail"], (st, r)
    # A file-size limit: every write of the database fails, at the commit.
    soft, hard = resource.prlimit(c.proc.pid, resource.RLIMIT_FSIZE)
    resource.prlimit(c.proc.pid, resource.RLIMIT_FSIZE, (0, hard))
    try:
        st, r = post_events(c, *again)
        health = c.call("GET", "/healthcheck")[0]
    finally:
        resource.prlimit(c.proc.pid, resource.RLIMIT_FSIZE, (soft, hard))
    assert st == 503 and "could not be saved" in r["detail"], (st, r)
    assert health == 200 and c.proc.poll() is None, c.output()
    assert c.metric("lmcache_mp_coordinator_events_applied_total") == 1
    # Sent again once the database takes writes: applied once, then duplicates.
    assert post_events(c, *again)[1] == {"applied": 2, "duplicates": 0, "stale": 0}
    assert post_events(c, *again)[1] == {"applied": 0, "duplicates": 2, "stale": 0}
    assert c.metric("lmcache_mp_coordinator_events_applied_total") == 3
    assert c.metric("lmcache_mp_coordinator_events_gaps_total") == 0
    assert c.call("GET", "/quota/t")[1]["usage_gb"] * 2**30 == pytest.approx(300)
    assert c.stop() == 0, c.output()
    c2 = start_coordinator()
    assert c2.call("GET", "/quota/t")[1]["usage_gb"] * 2**30 == pytest.approx(300)
    assert c2.call("GET", "/directory/keys")[1]["total"] == 1
    assert post_events(c2, batch("a", 1, 4, "access", [coord_key(2, "t")]))[1]["applied"] == 1
    assert c2.metric("lmcache_mp_coordinator_events_gaps_total") == 0


# ---- auth ---------------------------------------------------------------------------

def test_auth_token(start_coordinator):
    c = start_coordinator(AUTH_TOKEN="s3cret")
    writes = [("POST", "/instances", {"ip": "h", "http_port": 1}),
              ("POST", "/events", {"batches": []}),
              ("PUT", "/quota/t", {"limit_gb": 1}),
              ("PUT", "/quota/config", {"default_limit_gb": 1}),
              ("DELETE", "/quota/t", None),
              ("POST", "/cache/pins", {"model_name": "m", "world_size": 1, "token_ids": []}),
              ("PUT", "/instances/x/heartbeat", None),
              ("DELETE", "/instances/x", None),
              ("POST", "/directory/lookup", {"keys": []}),
              # reads that name tenants' salts or keys (issue 31)
              ("GET", "/quota", None),
              ("GET", "/quota/t", None),
              ("GET", "/quota/config", None),
              ("GET", "/directory/keys", None)]
    for method, path, body in writes:
        assert c.call(method, path, body)[0] == 401, path
        assert c.call(method, path, body, token="wrong")[0] == 401, path
        assert c.call(method, path, body, headers={"Authorization": "Basic s3cret"})[0] == 401
        assert c.call(method, path, body, token="s3cret")[0] != 401, path
    for path in ("/healthcheck", "/metrics", "/instances", "/directory/stats"):
        assert c.call("GET", path)[0] == 200, path
    assert c.metric("lmcache_mp_coordinator_http_auth_rejected_total") == 3 * len(writes)
    assert c.call("GET", "/quota/config", token="s3cret")[1]["default_limit_gb"] == 1


def test_config_refusals_and_cli(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(P)}
    env[P + "DB_PATH"] = str(tmp_path / "refused.db")   # never used unless a refusal fails
    # Issue 29: a value that does not parse, is out of range or too long,
    # a bad hash algorithm and a database that cannot be opened are each
    # refused at start (exit 1), naming the variable, where a bad number
    # was logged and replaced by the default before.
    for name, value in (("ENABLE_BLEND_LOOKUP", "maybe"), ("BLEND_PROBE_STRIDE", "0"),
                        ("MAX_BLEND_CHUNKS", "16777217"), ("OTLP_ENDPOINT", "http://x:4317"),
                        ("NO_SUCH_SETTING", "1"), ("PORT", "70000"), ("PORT", "http"),
                        ("EVICTION_RATIO", "2"), ("TRIGGER_WATERMARK", "0"),
                        ("METRICS_ENABLED", "maybe"), ("HASH_ALGORITHM", "md5"),
                        ("HOST", "h" * 300), ("AUTH_TOKEN", "t" * 2000),
                        ("DB_PATH", str(tmp_path / "no-such-dir" / "x.db"))):
        r = subprocess.run([COORDINATOR], env=dict(env, **{P + name: value}),
                           capture_output=True, text=True, timeout=10)
        assert r.returncode == 1 and P + name in r.stderr, (name, value[:40], r.stderr)
        # one line; a database refused at start follows the first log line
        # (version, commit and the database's path, issue 31)
        assert len([x for x in r.stderr.splitlines() if " INFO " not in x]) == 1, r.stderr
    # A database in a directory that is not there says so, not only
    # SQLite's "unable to open database file" (issue 31).
    missing = tmp_path / "no-such-dir"
    r = subprocess.run([COORDINATOR], env=dict(env, **{P + "DB_PATH": str(missing / "x.db")}),
                       capture_output=True, text=True, timeout=10)
    assert f"its directory {missing} does not exist" in r.stderr, r.stderr
    r = subprocess.run([COORDINATOR, "--version"], capture_output=True, text=True, timeout=10)
    assert r.returncode == 0 and r.stdout.startswith("lmcached-coordinator ")
    r = subprocess.run([COORDINATOR, "--help"], capture_output=True, text=True, timeout=10)
    assert r.returncode == 0 and P + "DB_PATH" in r.stdout
    assert subprocess.run([COORDINATOR, "--port", "1"], capture_output=True,
                          timeout=10).returncode == 2


OPEN_WARNING = "without LMCACHE_MP_COORDINATOR_AUTH_TOKEN: anyone who can reach port"


def test_warning_when_reachable_without_a_token(start_coordinator):
    """Issue 29: bound beyond loopback without a token, every write route is
    open to the network; the start-up log says so, and what it allows."""
    c = start_coordinator(HOST="0.0.0.0")
    line = next((l for l in c.output().splitlines() if OPEN_WARNING in l), None)
    assert line and "WARN" in line and f"port {c.port}" in line, c.output()
    for allowed in ("register and remove servers", "delete L2 objects", "pin keys"):
        assert allowed in line, line
    # The warning is written before the port answers, so its absence is
    # final once a coordinator answers.
    quiet = [start_coordinator(db="loop.db"),                           # 127.0.0.1
             start_coordinator(db="token.db", HOST="0.0.0.0", AUTH_TOKEN="s3cret")]
    for q in quiet:
        assert OPEN_WARNING not in q.output(), q.output()


def test_metrics_disabled(start_coordinator):
    c = start_coordinator(METRICS_ENABLED="false")
    assert c.call("GET", "/metrics")[0] == 404


# ---- the fleet eviction loop against a real lmcached -----------------------------------

def canon(k):
    return json.dumps(k, sort_keys=True)


def test_eviction_deletes_lru_unpinned_keys_on_a_server(start_coordinator, tmp_path):
    from lmc.server import Server, l2_fs_args
    from test_l2_fs import http_json, store_all, wait_stored
    from test_lookup_engine_driven import CS, prompt

    l2 = tmp_path / "l2"
    l2.mkdir()
    srv = Server("--chunk-size", str(CS), *l2_fs_args(l2))
    ws = []
    try:
        toks = prompt(23)                                   # 4 chunks, 2 ranks: 8 objects
        ws = store_all(srv, toks)
        wait_stored(srv, l2, 8)
        st, page = http_json(srv, "GET", "/cache/objects?model_name=m")
        size = {canon(e["key"]): e["size_bytes"] for e in page["entries"]}
        assert st == 200 and len(size) == 8
        c = start_coordinator(CHUNK_SIZE=str(CS), EVICTION_CHECK_INTERVAL="0.2",
                              EVICTION_RATIO="0.5")
        # The coordinator hashes tokens as the server does: its keys for the
        # prompt are exactly the server's objects, chunk by chunk, rank by rank.
        q = {"model_name": "m", "world_size": 2, "token_ids": toks, "cache_salt": ""}
        st, r = c.call("POST", "/directory/lookup", q)
        assert st == 200 and r["chunks"] == 4
        keys = [x["key"] for x in r["results"]]
        assert sorted(map(canon, keys)) == sorted(size)
        assert all(x["placements"] == [] for x in r["results"])
        # Store events in chunk order, so chunk 0 is the least recent.
        st, r = post_events(c, *[dict(batch("srv", 1, i + 1, "store", [k]),
                                      entries=[{"key": k, "size_bytes": size[canon(k)]}])
                                 for i, k in enumerate(keys)])
        assert r["applied"] == 8
        assert all(x["placements"][0]["tier"] == "l2"
                   for x in c.call("POST", "/directory/lookup", q)[1]["results"])
        pin = dict(q, token_ids=toks[:CS])                  # chunk 0, both ranks
        assert c.call("POST", "/cache/pins", pin)[1]["affected"] == 2
        assert c.call("POST", "/instances", {"instance_id": "srv", "ip": "127.0.0.1",
                                             "http_port": srv.http_port})[0] == 200
        total = sum(size.values())
        assert c.call("PUT", "/quota/_default", {"limit_gb": total / 2**30})[0] == 200
        # ceil(0.5 x 8) = 4 keys, the least recent unpinned: chunks 1 and 2.
        victims, kept = {canon(k) for k in keys[2:6]}, {canon(k) for k in keys[:2] + keys[6:]}
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            present = {canon(e["key"]) for e in
                       http_json(srv, "GET", "/cache/objects?model_name=m")[1]["entries"]}
            if not present & victims:
                break
            time.sleep(0.1)
        assert present == kept, (present, kept)
        assert c.metric("lmcache_mp_coordinator_eviction_keys_requested_total") >= 4
        assert c.metric("lmcache_mp_coordinator_eviction_request_failures_total") == 0
        # Until the delete events come back the keys stay in the LRU (and are
        # asked for again, harmlessly); once they do, usage is under the quota
        # and nothing else goes.
        post_events(c, batch("srv", 1, 9, "delete", keys[2:6], size=0))
        assert c.call("GET", "/quota/_default")[1]["usage_gb"] * 2**30 == pytest.approx(
            total - sum(size[v] for v in victims))
        time.sleep(1.0)
        present = {canon(e["key"]) for e in
                   http_json(srv, "GET", "/cache/objects?model_name=m")[1]["entries"]}
        assert present == kept
    finally:
        for w in ws:
            w.close()
        assert srv.stop() == 0, srv.output()


def test_directory_views(start_coordinator):
    c = start_coordinator()
    post_events(c, batch("a", 1, 1, "store", [coord_key(i) for i in range(5)], size=10),
                batch("a", 1, 2, "store", [coord_key(0), coord_key(1)], size=7, tier="l1", backend="dram"),
                batch("b", 1, 1, "store", [coord_key(1)], size=7, tier="l1", backend="dram"))
    st, r = c.call("POST", "/directory/lookup", {"keys": [coord_key(1), coord_key(9)]})
    assert st == 200 and r["chunks"] == 2
    tiers = sorted((p["tier"], p.get("instance_id", "")) for p in r["results"][0]["placements"])
    assert tiers == [("l1", "a"), ("l1", "b"), ("l2", "")]
    assert r["results"][1]["placements"] == []
    st, r = c.call("GET", "/directory/keys?tier=l2&limit=2&offset=1")
    assert st == 200 and r["total"] == 5 and len(r["keys"]) == 2
    seen = []
    for off in range(0, 5, 2):                                 # paging covers every key once
        seen += [canon(k["key"]) for k in c.call("GET", f"/directory/keys?tier=l2&limit=2&offset={off}")[1]["keys"]]
    assert sorted(seen) == sorted(canon(coord_key(i)) for i in range(5))
    assert c.call("GET", "/directory/keys?tier=l1&instance_id=b")[1]["total"] == 1
    assert c.call("GET", "/directory/keys?tier=l1&instance_id=zz")[1]["total"] == 0
    assert c.call("GET", "/directory/keys?backend=dram")[1]["total"] == 2
    assert c.call("GET", "/directory/keys?limit=10001")[0] == 400
    assert c.call("GET", "/directory/keys?tier=l3")[0] == 400
    st, r = c.call("GET", "/directory/stats")
    assert r["l2"] == {"placement_count": 5, "placement_size_bytes": 50}
    assert r["l1"]["placement_count"] == 3 and r["l1"]["by_instance"] == {"a": 2, "b": 1}
    # A new incarnation of b voids its L1 facts; a's stay.
    post_events(c, batch("b", 2, 1, "access", [], tier="l1"))
    assert c.call("GET", "/directory/stats")[1]["l1"]["by_instance"] == {"a": 2}
    assert c.call("POST", "/directory/lookup", {"keys": [{"chunk_hash_hex": "zz"}]})[0] == 422
    assert c.call("POST", "/directory/lookup", {"model_name": "m", "world_size": 0,
                                                 "token_ids": []})[0] == 422


def test_prefetch_proxy_and_resync(start_coordinator, tmp_path):
    from lmc.server import Server, l2_fs_args
    from test_l2_fs import store_all, wait_stored
    from test_lookup_engine_driven import CS, prompt

    l2 = tmp_path / "l2"
    l2.mkdir()
    srv = Server("--chunk-size", str(CS), *l2_fs_args(l2))
    ws = []
    try:
        ws = store_all(srv, prompt(41))
        wait_stored(srv, l2, 8)
        c = start_coordinator(CHUNK_SIZE=str(CS), ENABLE_STARTUP_RESYNC="true",
                              RESYNC_POLL_INTERVAL="0.1", RESYNC_PAGE_SIZE="3")
        q = {"instance_id": "srv", "model_name": "m", "world_size": 2, "token_ids": prompt(41),
             "cache_salt": ""}
        assert c.call("POST", "/cache/prefetches", q)[0] == 404               # not registered
        assert c.call("GET", "/cache/prefetches/srv/1")[0] == 404
        assert c.call("POST", "/instances", {"instance_id": "srv", "ip": "127.0.0.1",
                                             "http_port": srv.http_port})[0] == 200
        # The resync pages (3 at a time) through the server's objects.
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and c.call("GET", "/directory/stats")[1]["l2"][
                "placement_count"] < 8:
            time.sleep(0.1)
        assert c.call("GET", "/directory/stats")[1]["l2"]["placement_count"] == 8
        assert c.metric("lmcache_mp_coordinator_resync_keys_total") == 8
        st, r = c.call("POST", "/cache/prefetches", q)
        assert st == 202 and r["instance_id"] == "srv" and r["status"] == "submitted"
        deadline = time.monotonic() + 10
        while True:
            st, p = c.call("GET", f"/cache/prefetches/srv/{r['request_id']}")
            assert st == 200
            if p["status"] == "completed" or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert p["status"] == "completed" and p["found_keys"] == 8
        assert c.call("GET", f"/cache/prefetches/srv/{r['request_id']}")[0] == 404  # relayed
        assert c.call("POST", "/cache/prefetches", dict(q, world_size=0))[0] == 422
        # The server's 503 comes back as 502 with the server's own reason
        # (issue 31): here no worker registered that model's layout.
        st, r = c.call("POST", "/cache/prefetches", dict(q, model_name="unregistered"))
        assert st == 502 and r["detail"] == ("the server answered 503: no memory layout "
                                             "registered for this model and world_size"), r
        # A registered server that is gone: 502.
        c.call("POST", "/instances", {"instance_id": "dead", "ip": "127.0.0.1",
                                      "http_port": free_port()})
        st, r = c.call("POST", "/cache/prefetches", dict(q, instance_id="dead"))
        assert st == 502 and "could not be reached" in r["detail"]
    finally:
        for w in ws:
            w.close()
        assert srv.stop() == 0, srv.output()
