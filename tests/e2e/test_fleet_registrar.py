"""The fleet side of lmcached (docs/fleet.md): registration, heartbeats and
deregistration with a coordinator, and the cache-event streams.

The coordinator here is a small HTTP server inside the test (python
http.server in a thread) that records every request and answers with the
wire form of the coordinator API (docs/fleet.md, "What the coordinator
answers").  It stands in for the real `lmcached-coordinator` until that
binary lands; the tests check what lmcached sends and how it reacts to
each kind of reply, against the real lmcached binary."""
import http.client
import json
import signal
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from lmc.server import Server, free_port, run_lmcached
from test_lookup_engine_driven import CS, OBJ, Worker, lookup, prompt

INTERVAL = 0.3


class FakeCoordinator:
    """Records requests; `behaviour[kind]` picks the reply per request kind:
    register, heartbeat, delete, events, l2_events."""

    def __init__(self, host="127.0.0.1"):
        self.requests = []
        self.lock = threading.Lock()
        self.behaviour = {}
        self.minted = None             # registration reply id (None: the one sent)
        self.errors = []               # handler exceptions, re-raised in check()
        coord = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _handle(self):
                try:
                    coord._serve(self)
                except (BrokenPipeError, ConnectionResetError):
                    pass
                except Exception as e:  # reaches the test through check()
                    coord.errors.append(e)
                    raise

            do_POST = do_PUT = do_DELETE = do_GET = _handle

        self.httpd = ThreadingHTTPServer((host, 0), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.url = f"http://{host}:{self.port}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    @staticmethod
    def kind_of(method, path):
        if method == "POST" and path == "/instances":
            return "register"
        if method == "PUT" and path.startswith("/instances/") and path.endswith("/heartbeat"):
            return "heartbeat"
        if method == "DELETE" and path.startswith("/instances/"):
            return "delete"
        if method == "POST" and path == "/events":
            return "events"
        if method == "POST" and path == "/l2/events":
            return "l2_events"
        return "other"

    def _serve(self, h):
        n = int(h.headers.get("Content-Length") or 0)
        raw = h.rfile.read(n) if n else b""
        kind = self.kind_of(h.command, h.path)
        rec = {"t": time.monotonic(), "method": h.command, "path": h.path, "kind": kind,
               "headers": {k.lower(): v for k, v in h.headers.items()},
               "body": json.loads(raw) if raw else None}
        mode = self.behaviour.get(kind, "ok")
        rec["mode"] = mode                 # "ok" and "slow" answer 2xx
        with self.lock:
            self.requests.append(rec)
        if mode == "hang":
            time.sleep(30)
            return
        if mode == "slow":
            time.sleep(2.5)
            mode = "ok"
        if mode == "500":
            return self._reply(h, 500, b'{"error":"boom"}')
        if mode == "404":
            return self._reply(h, 404, b'{"error":"unknown instance; re-register"}')
        if mode == "422":
            return self._reply(h, 422, b'{"detail":"batches[0]: refused"}')
        if mode == "401":
            return self._reply(h, 401, b'{"detail":"missing or wrong bearer token"}')
        if mode == "garbage":
            return self._reply(h, 200, b"\x00not json{{{")
        if mode == "huge":
            return self._reply(h, 200, b'{"instance_id":"' + b"x" * (1 << 20) + b'"}')
        if kind == "register":
            rid = self.minted or rec["body"]["instance_id"]
            return self._reply(h, 200, json.dumps({"instance_id": rid,
                                                   "re_registered": False}).encode())
        if kind == "heartbeat":
            return self._reply(h, 200, json.dumps({"instance_id": h.path.split("/")[2]}).encode())
        if kind == "delete":
            return self._reply(h, 204, b"")
        if kind == "events":
            n = len(rec["body"]["batches"])
            return self._reply(h, 200, json.dumps({"applied": n, "duplicates": 0,
                                                   "stale": 0}).encode())
        if kind == "l2_events":
            return self._reply(h, 200, json.dumps({"recorded": len(rec["body"]["events"])}).encode())
        return self._reply(h, 404, b"{}")

    @staticmethod
    def _reply(h, status, body):
        h.send_response(status)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        if body:
            h.wfile.write(body)

    def of(self, kind):
        with self.lock:
            return [r for r in self.requests if r["kind"] == kind]

    def wait_for(self, kind, count=1, timeout=10):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            got = self.of(kind)
            if len(got) >= count:
                return got
            time.sleep(0.05)
        raise AssertionError(f"{count} {kind} request(s) expected, got {len(self.of(kind))}")

    def check(self):
        if self.errors:
            raise self.errors[0]

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()
        self.check()


@pytest.fixture
def coord():
    c = FakeCoordinator()
    yield c
    c.close()


def get_json(port, path, headers=None):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", path, headers=headers or {})
        r = conn.getresponse()
        return r.status, json.loads(r.read())
    finally:
        conn.close()


def coord_status(srv):
    st, body = get_json(srv.http_port, "/status")
    assert st == 200
    return body["coordinator"]


def metric_values(srv):
    """{family: value} of the unlabelled samples of /metrics."""
    conn = http.client.HTTPConnection("127.0.0.1", srv.http_port, timeout=10)
    try:
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
    finally:
        conn.close()
    out = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and not line.startswith("#") and "{" not in parts[0]:
            out[parts[0]] = float(parts[1])
    return out


def coordinator_args(coord):
    """The flags of a server reporting to coord at this module's cadence."""
    return ("--coordinator-url", coord.url, "--coordinator-heartbeat-interval", str(INTERVAL),
            "--chunk-size", str(CS))


def stop_ok(srv):
    assert srv.stop() == 0, srv.output()


def lookup_works(srv, seed=5):
    """A LOOKUP over ZMQ answers (0 hits on an empty cache is fine)."""
    sched = srv.dealer()
    try:
        assert lookup(sched, prompt(seed), f"probe-{seed}-{time.monotonic()}") is not None
    finally:
        sched.close()


# ---- registration ----------------------------------------------------------

def test_registration_body_heartbeats_and_deregistration(coord):
    srv = Server(*coordinator_args(coord), "--instance-id", "mp-test-1", "--coordinator-advertise-ip", "10.1.2.3",
                 "--coordinator-auth-token", "s3cret-token")
    try:
        reg = coord.wait_for("register")[0]
        assert reg["body"] == {"instance_id": "mp-test-1", "ip": "10.1.2.3",
                               "http_port": srv.http_port, "p2p_advertised_url": "",
                               "mq_port": 0}
        assert reg["headers"]["authorization"] == "Bearer s3cret-token"
        assert reg["headers"]["content-type"] == "application/json"
        beats = coord.wait_for("heartbeat", 6)
        assert all(b["path"] == "/instances/mp-test-1/heartbeat" for b in beats)
        assert all(b["body"] is None for b in beats)
        assert all(b["headers"]["authorization"] == "Bearer s3cret-token" for b in beats)
        gaps = [b["t"] - a["t"] for a, b in zip(beats, beats[1:])]
        gaps.sort()
        assert INTERVAL * 0.7 <= gaps[len(gaps) // 2] <= INTERVAL * 2.5, gaps
        assert reg["t"] < beats[0]["t"]
        st = coord_status(srv)
        assert st["registered"] is True and st["instance_id"] == "mp-test-1"
        assert st["url"] == coord.url and st["advertise_ip"] == "10.1.2.3"
        assert st["heartbeats"] >= 5 and st["last_heartbeat"] > time.time() - 5
        assert "s3cret" not in json.dumps(get_json(srv.http_port, "/status")[1])
        _, cfg = get_json(srv.http_port, "/config")
        assert "s3cret" not in json.dumps(cfg)
        assert cfg["coordinator"]["coordinator_auth_token"] == "***"
        assert len(coord.of("register")) == 1
        metrics = metric_values(srv)
        assert metrics["lmcache_mp_coordinator_registered"] == 1
        assert metrics["lmcache_mp_coordinator_registrations_total"] == 1
        assert metrics["lmcache_mp_coordinator_heartbeats_total"] >= 5
        assert metrics["lmcache_mp_coordinator_request_failures_total"] == 0
    finally:
        t0 = time.monotonic()
        stop_ok(srv)
    assert time.monotonic() - t0 < 5
    dels = coord.of("delete")
    assert [d["path"] for d in dels] == ["/instances/mp-test-1"]
    assert dels[0]["headers"]["authorization"] == "Bearer s3cret-token"
    assert "s3cret" not in srv.output()


def host_address():
    """This host's address on its default route (a UDP connect sends nothing)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as u:
        try:
            u.connect(("192.0.2.1", 9))
            return u.getsockname()[0]
        except OSError:
            return None


def test_default_advertise_ip_is_the_outbound_address():
    ip = host_address()
    if not ip or ip.startswith("127."):
        pytest.skip("this host has no address besides loopback")
    c = FakeCoordinator(host=ip)
    try:
        srv = Server(*coordinator_args(c))
        try:
            reg = c.wait_for("register")[0]
            # The interface the host reaches the coordinator through.
            assert reg["body"]["ip"] == ip
            assert reg["body"]["instance_id"]            # the random --instance-id
            assert coord_status(srv)["advertise_ip"] == ip
        finally:
            stop_ok(srv)
    finally:
        c.close()


def test_coordinator_minted_id_is_used(coord):
    coord.minted = "mp-" + "ab" * 16
    srv = Server(*coordinator_args(coord))
    try:
        beats = coord.wait_for("heartbeat", 2)
        assert all(b["path"] == f"/instances/{coord.minted}/heartbeat" for b in beats)
        assert coord_status(srv)["instance_id"] == coord.minted
    finally:
        stop_ok(srv)
    assert [d["path"] for d in coord.of("delete")] == [f"/instances/{coord.minted}"]


def test_heartbeat_404_registers_again(coord):
    srv = Server(*coordinator_args(coord), "--instance-id", "mp-404")
    try:
        coord.wait_for("heartbeat", 2)
        coord.behaviour["heartbeat"] = "404"
        regs = coord.wait_for("register", 2)
        assert regs[1]["body"]["instance_id"] == "mp-404"
        coord.behaviour["heartbeat"] = "ok"
        n = len(coord.of("heartbeat"))
        coord.wait_for("heartbeat", n + 2)
        assert coord_status(srv)["registered"] is True
    finally:
        stop_ok(srv)


@pytest.mark.parametrize("mode", ["500", "garbage", "huge", "slow"])
def test_failing_heartbeats_keep_the_id(coord, mode):
    srv = Server(*coordinator_args(coord), "--instance-id", "mp-keep")
    try:
        coord.wait_for("heartbeat", 1)
        coord.behaviour["heartbeat"] = mode
        n = len(coord.of("heartbeat"))
        coord.wait_for("heartbeat", n + 3, timeout=15)
        for i in range(3):                       # the server keeps serving
            lookup_works(srv, seed=i + 10)
        st = coord_status(srv)
        assert st["registered"] is True and st["instance_id"] == "mp-keep"
        want = {"500": "HTTP 500", "garbage": "the reply is not",
                "huge": "reply larger than 65536 bytes", "slow": None}[mode]
        if want:
            assert want in st["last_error"], st
            assert st["request_failures"] >= 3
        else:
            assert st["last_error"] is None and st["request_failures"] == 0, st
        assert len(coord.of("register")) == 1   # no duplicate registration
        assert srv.alive()
    finally:
        coord.behaviour["heartbeat"] = "ok"
        stop_ok(srv)
    assert len(coord.of("register")) == 1
    assert [d["path"] for d in coord.of("delete")] == ["/instances/mp-keep"]


@pytest.mark.parametrize("mode", ["500", "garbage", "huge"])
def test_failed_registration_is_retried_at_the_heartbeat_cadence(coord, mode):
    coord.behaviour["register"] = mode
    srv = Server(*coordinator_args(coord))
    try:
        coord.wait_for("register", 3)
        lookup_works(srv)
        st = coord_status(srv)
        assert st["registered"] is False and st["last_error"]
        assert not coord.of("heartbeat")
        coord.behaviour["register"] = "ok"
        coord.wait_for("heartbeat", 1)
        assert coord_status(srv)["registered"] is True
    finally:
        stop_ok(srv)


def test_a_refused_token_names_the_flag_that_gives_it(coord):
    """A coordinator that wants a token this server was not given: the
    error in the log and in /status names the flag to set (issue 31)."""
    coord.behaviour["register"] = "401"
    srv = Server(*coordinator_args(coord))
    try:
        coord.wait_for("register", 2)
        hint = "--coordinator-auth-token"
        deadline = time.monotonic() + 5
        while hint not in (coord_status(srv)["last_error"] or "") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert hint in coord_status(srv)["last_error"], coord_status(srv)
        assert hint in srv.output()
    finally:
        stop_ok(srv)


def test_coordinator_absent():
    url = f"http://127.0.0.1:{free_port()}"        # nothing listens there
    t0 = time.monotonic()
    srv = Server("--coordinator-url", url, "--coordinator-heartbeat-interval", str(INTERVAL),
                 "--chunk-size", str(CS))
    try:
        assert time.monotonic() - t0 < 10
        lookup_works(srv)
        time.sleep(3 * INTERVAL)
        st = coord_status(srv)
        assert st["registered"] is False and st["instance_id"] is None
        assert st["request_failures"] >= 2 and st["last_error"].startswith("POST /instances")
        log = srv.output()
        # Repeated failures are not logged one by one.
        assert log.count("still failing") + log.count("POST /instances:") <= 3, log
    finally:
        t0 = time.monotonic()
        stop_ok(srv)
    assert time.monotonic() - t0 < 5


def test_sigterm_with_a_hanging_coordinator(coord):
    srv = Server(*coordinator_args(coord), "--instance-id", "mp-hang", "--coordinator-event-reporting",
                 "--coordinator-event-flush-interval", "0.2")
    coord.wait_for("heartbeat", 1)
    coord.behaviour.update(heartbeat="hang", delete="hang", events="hang")
    time.sleep(2 * INTERVAL)                       # a heartbeat is in flight now
    lookup_works(srv)
    t0 = time.monotonic()
    srv.proc.send_signal(signal.SIGTERM)
    srv.proc.wait(15)
    took = time.monotonic() - t0
    assert srv.stop() == 0, srv.output()
    assert took < 6, took
    assert [d["path"] for d in coord.of("delete")] == ["/instances/mp-hang"]


def test_coordinator_url_needs_the_http_frontend():
    r = run_lmcached("--l1-size-gb", "0.0625", "--eviction-policy", "LRU",
                     "--coordinator-url", "http://127.0.0.1:9",
                     "--no-http")
    assert r.returncode == 2, r.stderr
    line = r.stderr.strip().splitlines()[-1]
    assert "--coordinator-url" in line and "--no-http" in line


# ---- the cache-event stream -------------------------------------------------

def batches_of(coord):
    return [b for r in coord.of("events") for b in r["body"]["batches"]]


def test_event_stream(coord):
    t_start = int(time.time())
    srv = Server(*coordinator_args(coord), "--instance-id", "mp-ev", "--coordinator-event-reporting",
                 "--coordinator-event-flush-interval", "0.2")
    ws = []
    try:
        first = coord.wait_for("events")[0]["body"]["batches"]
        assert first[0]["event_type"] == "config"
        assert first[0] == {"instance_id": "mp-ev", "incarnation": first[0]["incarnation"],
                            "seq": 1, "event_type": "config", "tier": "l1", "backend": "dram",
                            "entries": [], "shared": False, "ts": first[0]["ts"],
                            "capacity_bytes": 64 << 20, "capacity_revision": 1}
        assert t_start - 1 <= first[0]["incarnation"] <= time.time()
        ws = [Worker(srv, 4001, 0), Worker(srv, 4002, 1)]
        toks = prompt(3)
        for w in ws:
            w.store(toks, 0, 4 * CS)
        sched = srv.dealer()
        assert lookup(sched, toks, "ev-r1") == 4
        for w in ws:
            assert w.retrieve(toks, 0, 4 * CS, "ev-r1") is not None
        sched.close()

        def stores():
            return [e for b in batches_of(coord) if b["event_type"] == "store" for e in b["entries"]]

        deadline = time.monotonic() + 10
        while len(stores()) < 8 and time.monotonic() < deadline:
            time.sleep(0.1)
        got = stores()
        assert len(got) == 8, batches_of(coord)
        # Each store carries its chunk's tokens and position (issue 35).
        assert all(e["size_bytes"] == OBJ and e["token_offset"] in (0, CS, 2 * CS, 3 * CS) and
                   e["token_ids"] == toks[e["token_offset"]:e["token_offset"] + CS]
                   for e in got), got
        keys = {(e["key"]["kv_rank"], e["key"]["chunk_hash_hex"]) for e in got}
        assert len(keys) == 8
        assert all(e["key"]["model_name"] == "m" and e["key"]["cache_salt"] == "" and
                   e["key"]["object_group_id"] == 0 and len(e["key"]["chunk_hash_hex"]) == 64
                   for e in got)
        st, _ = get_json(srv.http_port, "/status")
        conn = http.client.HTTPConnection("127.0.0.1", srv.http_port, timeout=10)
        conn.request("POST", "/cache/clear", body="{}", headers={"Content-Type": "application/json"})
        assert conn.getresponse().status == 200
        conn.close()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            deleted = [e for b in batches_of(coord) if b["event_type"] == "delete"
                       for e in b["entries"]]
            if len(deleted) >= 8:
                break
            time.sleep(0.1)
        assert {(e["key"]["kv_rank"], e["key"]["chunk_hash_hex"]) for e in deleted} == keys
        all_b = batches_of(coord)
        seqs = [b["seq"] for b in all_b]
        assert seqs == list(range(1, len(seqs) + 1))     # no gap while all posts succeed
        assert {b["incarnation"] for b in all_b} == {first[0]["incarnation"]}
        assert {b["instance_id"] for b in all_b} == {"mp-ev"}
        for b in all_b:
            assert b["tier"] == "l1"
            if b["event_type"] == "access":
                assert b["backend"] == ""
            elif b["event_type"] != "config":
                assert b["backend"] == "dram" and b["entries"]
        # Coalescing: the posts hold runs, not one batch per key.
        assert sum(1 for b in all_b if b["event_type"] == "store") < 8
        # Registration re-sends the declaration (the coordinator keeps it in memory).
        assert any(b["event_type"] == "config" for b in all_b)
        ev = coord_status(srv)
        assert ev["batches_sent"] == len(all_b) and ev["batches_dropped"] == 0
        assert ev["seq"] == seqs[-1]
        metrics = metric_values(srv)
        assert metrics["lmcache_mp_coordinator_event_batches_sent_total"] >= len(all_b)
        assert metrics["lmcache_mp_coordinator_event_entries_dropped_total"] == 0
    finally:
        for w in ws:
            w.close()
        stop_ok(srv)


def test_failing_events_posts_are_sent_again_and_refused_ones_make_a_gap(coord):
    """Issue 29: a post answered 5xx (the coordinator's 503 "not saved") is
    kept and sent again unchanged until it goes through, so no seq is
    lost; a post refused with a 4xx is dropped, a seq gap the coordinator
    sees.  Neither stalls the data path."""
    srv = Server(*coordinator_args(coord), "--instance-id", "mp-gap", "--coordinator-event-reporting",
                 "--coordinator-event-flush-interval", "0.2")
    ws = []
    seqs_of = lambda rs: [b["seq"] for r in rs for b in r["body"]["batches"]]  # noqa: E731
    try:
        coord.wait_for("events")
        coord.behaviour["events"] = "500"
        ws = [Worker(srv, 5001, 0), Worker(srv, 5002, 1)]
        for w in ws:
            w.store(prompt(4), 0, 4 * CS)
        # A re-registration while the posts fail: its declaration must
        # survive the failures and reach the coordinator afterwards.
        coord.behaviour["heartbeat"] = "404"
        coord.wait_for("register", 2)
        coord.behaviour["heartbeat"] = "ok"
        n_failed = len(coord.of("events"))
        coord.wait_for("events", n_failed + 2)
        for i in range(3):
            lookup_works(srv, seed=20 + i)      # never stalls
        st = coord_status(srv)
        assert st["batches_dropped"] == 0 and st["entries_dropped"] == 0, st
        assert st["events"]["retry_pending"] and st["events"]["posts_retried"] >= 1, st
        failed = [r for r in coord.of("events") if r["mode"] == "500"]
        assert len(failed) >= 2 and all(r["body"] == failed[0]["body"] for r in failed)
        coord.behaviour["events"] = "ok"
        recovered = lambda: [r for r in coord.of("events")[len(failed) + 1:]  # noqa: E731
                             if r["mode"] == "ok"]
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not any(
                b["event_type"] == "config" for r in recovered() for b in r["body"]["batches"]):
            time.sleep(0.1)
        delivered = [r for r in coord.of("events") if r["mode"] == "ok"]
        assert failed[0]["body"] in [r["body"] for r in delivered]   # sent again, unchanged
        assert any(b["event_type"] == "config" for r in recovered() for b in r["body"]["batches"])
        assert seqs_of(delivered) == list(range(1, max(seqs_of(delivered)) + 1))   # no gap
        st = coord_status(srv)
        assert st["batches_dropped"] == 0 and not st["events"]["retry_pending"], st

        # A 4xx: the coordinator will never take that body; dropped, a gap.
        coord.behaviour["events"] = "422"
        for w in ws:
            w.store(prompt(6), 0, 2 * CS)
        n_before = len(coord.of("events"))
        refused = coord.wait_for("events", n_before + 1)[n_before:]
        coord.behaviour["events"] = "ok"
        for w in ws:
            w.store(prompt(7), 0, 2 * CS)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not any(
                r["mode"] == "ok" for r in coord.of("events")[n_before + 1:]):
            time.sleep(0.1)
        after = [r for r in coord.of("events")[n_before + 1:] if r["mode"] == "ok"]
        assert after and all(r["mode"] == "422" for r in refused[:1])
        assert refused[0]["body"] not in [r["body"] for r in after]   # not sent again
        assert min(seqs_of(after)) == max(seqs_of(refused[:1])) + 1
        assert min(seqs_of(refused[:1])) == max(seqs_of(delivered)) + 1
        st = coord_status(srv)
        assert st["batches_dropped"] >= 1 and st["entries_dropped"] >= 4, st
        assert srv.alive()
    finally:
        for w in ws:
            w.close()
        stop_ok(srv)


def test_events_flushed_at_shutdown(coord):
    srv = Server(*coordinator_args(coord), "--instance-id", "mp-flush", "--coordinator-event-reporting",
                 "--coordinator-event-flush-interval", "30")
    ws = []
    try:
        coord.wait_for("events")                    # the declaration, at once
        ws = [Worker(srv, 6001, 0), Worker(srv, 6002, 1)]
        for w in ws:
            w.store(prompt(7), 0, 2 * CS)
        time.sleep(0.5)
        assert len(coord.of("events")) == 1         # the interval has not passed
    finally:
        for w in ws:
            w.close()
        stop_ok(srv)
    stores = [e for b in batches_of(coord) if b["event_type"] == "store" for e in b["entries"]]
    assert len(stores) == 4


def test_l2_events_and_usage_stream(coord, tmp_path):
    adapter = json.dumps({"type": "fs", "base_path": str(tmp_path), "shared": True})
    srv = Server(*coordinator_args(coord), "--instance-id", "mp-l2", "--coordinator-event-reporting",
                 "--coordinator-event-flush-interval", "0.2", "--coordinator-l2-event-reporting",
                 "--coordinator-l2-event-flush-interval", "0.2", "--l2-adapter", adapter)
    ws = []
    try:
        first = coord.wait_for("events")[0]["body"]["batches"]
        decl = [b for b in first if b["event_type"] == "config"]
        assert [(b["tier"], b["backend"], b["shared"]) for b in decl] == [
            ("l1", "dram", False), ("l2", "fs", True)]
        assert decl[1]["capacity_bytes"] == 0            # no max_capacity_gb: unlimited
        assert len({b["capacity_revision"] for b in decl}) == 1
        ws = [Worker(srv, 7001, 0), Worker(srv, 7002, 1)]
        for w in ws:
            w.store(prompt(8), 0, 2 * CS)
        deadline = time.monotonic() + 10
        l2_stores, usage = [], []
        while time.monotonic() < deadline:
            l2_stores = [e for b in batches_of(coord) if b["event_type"] == "store" and
                         b["tier"] == "l2" for e in b["entries"]]
            usage = [e for r in coord.of("l2_events") for e in r["body"]["events"]]
            if len(l2_stores) >= 4 and len(usage) >= 4:
                break
            time.sleep(0.1)
        assert len(l2_stores) == 4 and all(e["size_bytes"] == OBJ for e in l2_stores)
        l2_batches = [b for b in batches_of(coord) if b["tier"] == "l2" and b["event_type"] == "store"]
        assert all(b["backend"] == "fs" and b["shared"] is True for b in l2_batches)
        assert len(usage) == 4 and all(e["type"] == "store" and e["bytes"] == OBJ for e in usage)
        posts = coord.of("l2_events")
        assert [p["body"]["seq"] for p in posts] == list(range(1, len(posts) + 1))
        assert all(p["body"]["tier"] == "l2" and p["body"]["instance_id"] == "mp-l2"
                   for p in posts)
    finally:
        for w in ws:
            w.close()
        stop_ok(srv)


def test_l2_usage_posts_that_fail_are_dropped_and_counted(coord, tmp_path):
    """The L2 usage stream is best effort (docs/fleet.md): a post the
    coordinator does not take is dropped, never sent again, and counted in
    /status and /metrics; the next post carries only newer events and the
    next seq, and the data path never waits on it."""
    adapter = json.dumps({"type": "fs", "base_path": str(tmp_path)})
    srv = Server(*coordinator_args(coord), "--instance-id", "mp-l2-drop", "--coordinator-l2-event-reporting",
                 "--coordinator-l2-event-flush-interval", "0.2", "--l2-adapter", adapter)
    ws = []
    usage_of = lambda rs: [e for r in rs for e in r["body"]["events"]]  # noqa: E731
    try:
        coord.behaviour["l2_events"] = "404"
        ws = [Worker(srv, 7101, 0), Worker(srv, 7102, 1)]
        for w in ws:
            w.store(prompt(9), 0, 2 * CS)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and len(usage_of(coord.of("l2_events"))) < 4:
            time.sleep(0.05)
        failed = coord.of("l2_events")
        assert len(usage_of(failed)) == 4 and all(r["mode"] == "404" for r in failed)
        sched = srv.dealer()
        try:   # with an L2, a LOOKUP's answer waits for its L2 check: WAIT, not QUERY
            assert lookup(sched, prompt(31), "probe-31", wait=True) == 0
        finally:
            sched.close()
        st = coord_status(srv)["l2_usage_events"]
        assert st["batches_dropped"] == len(failed) and st["events_dropped"] == 4, st
        assert st["batches_sent"] == 0 and st["seq"] == len(failed), st
        m = metric_values(srv)
        assert m["lmcache_mp_coordinator_l2_events_dropped_total"] == 4, m

        coord.behaviour["l2_events"] = "ok"
        for w in ws:
            w.store(prompt(10), 0, 2 * CS)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and len(usage_of(coord.of("l2_events"))) < 8:
            time.sleep(0.05)
        later = coord.of("l2_events")[len(failed):]
        assert all(r["mode"] == "ok" for r in later)
        assert len(usage_of(later)) == 4                     # the dropped ones are not resent
        assert not any(r["body"] in [f["body"] for f in failed] for r in later)
        assert [r["body"]["seq"] for r in later] == list(
            range(len(failed) + 1, len(failed) + 1 + len(later)))
        st = coord_status(srv)["l2_usage_events"]
        assert st["batches_sent"] == len(later) and st["events_dropped"] == 4, st
    finally:
        for w in ws:
            w.close()
        stop_ok(srv)
