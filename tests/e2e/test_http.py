"""HTTP frontend end to end: a real lmcached with --http-host/--http-port,
requests over plain sockets (docs/http.md).

"""
import http.client
import json
import os
import random
import socket
import subprocess
import time

import pytest

from lmc.ops import NOOP
from lmc.server import Server



def request(port, method, path, body=None, headers=None, timeout=10):
    """Returns (status, headers dict with lower-case names, body bytes)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        if isinstance(body, (dict, list)):
            body = json.dumps(body)
            headers = {"Content-Type": "application/json", **(headers or {})}
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def get_json(port, path, status=200):
    st, hdrs, body = request(port, "GET", path)
    assert st == status, (path, st, body)
    assert hdrs["content-type"].startswith("application/json"), hdrs
    return json.loads(body)


# ---- success shapes ------------------------------------------------------


def test_root(http_server):
    assert get_json(http_server.http_port, "/") == {"status": "ok", "service": "LMCache HTTP API"}
    st, hdrs, body = request(http_server.http_port, "GET", "/", headers={"Accept": "text/html"})
    assert st == 200 and hdrs["content-type"].startswith("text/html")
    assert b'href="/dashboard"' in body
    st, hdrs, body = request(http_server.http_port, "GET", "/dashboard")
    assert st == 200 and b"/api/status" in body and b"/api/healthcheck" in body


@pytest.mark.parametrize("path", ["/healthcheck", "/api/healthcheck"])
def test_healthcheck(http_server, path):
    assert get_json(http_server.http_port, path) == {"status": "healthy"}


@pytest.mark.parametrize("path", ["/status", "/api/status"])
def test_status(http_server, path):
    st = get_json(http_server.http_port, path)
    assert st["is_healthy"] is True
    assert st["chunk_size"] == 256
    assert isinstance(st["instance_id"], str) and st["instance_id"]
    l1 = st["storage_manager"]["l1_manager"]
    assert l1["capacity"] > 0 and 0 <= l1["used"] <= l1["capacity"]


def test_memory_pressure(http_server):
    snap = get_json(http_server.http_port, "/status/memory-pressure")
    status = get_json(http_server.http_port, "/status")
    assert snap["instance_id"] == status["instance_id"]
    assert isinstance(snap["timestamp_ms"], int)
    assert abs(snap["timestamp_ms"] / 1000 - time.time()) < 60
    assert snap["overall_level"] in ("normal", "high", "critical", "unknown")
    l1 = snap["tiers"][0]
    assert l1["tier"] == "l1" and l1["adapter_id"] is None
    assert l1["level"] == "normal" and snap["complete"] is True
    assert l1["capacity_bytes"] > 0 and 0 <= l1["used_ratio"] < 1
    assert l1["eviction_policy"] == "LRU" and l1["trigger_watermark"] == pytest.approx(0.8)
    for key in ("backend_type", "used_bytes", "health", "collection_errors"):
        assert key in l1


def checkout_commit():
    """The commit this tree is at (what CMake builds in), or "" outside git."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    r = subprocess.run(["git", "-C", root, "rev-parse", "--short=12", "HEAD"],
                       capture_output=True, text=True)
    return r.stdout.strip() if r.returncode == 0 else ""


def test_version(http_server):
    """/version is "<version>-<commit>", the commit the binary was built from
    (issue 31: it said "NA" even from a git checkout), and the first log
    line names version, commit and instance id."""
    port = http_server.http_port
    version, commit = get_json(port, "/lmc_version"), get_json(port, "/commit_id")
    assert version and get_json(port, "/version") == f"{version}-{commit or 'NA'}"
    assert commit == checkout_commit()
    first = http_server.output().splitlines()[0]
    assert f"lmcached {version} (commit {commit or 'NA'}), instance " in first, first


@pytest.mark.parametrize("path", ["/config", "/conf"])
def test_config(http_server, path):
    st, _, body = request(http_server.http_port, "GET", path)
    assert st == 200
    assert b'\n  "' in body  # pretty-printed, indent 2
    cfg = json.loads(body)
    for key in ("mp", "storage_manager", "observability", "http", "coordinator"):
        assert isinstance(cfg[key], dict), key
    assert cfg["http"]["http_port"] == http_server.http_port
    assert cfg["mp"]["port"] == http_server.port


def test_config_adapters(http_server):
    assert get_json(http_server.http_port, "/config/adapters") == {"adapters": []}


def test_threads(http_server):
    threads = get_json(http_server.http_port, "/threads")
    assert len(threads) >= 3
    for t in threads:
        assert set(t) >= {"thread_id", "name", "state", "function_name", "cpu_time",
                          "memory_usage"}
    ids = {t["thread_id"] for t in threads}
    assert http_server.proc.pid in ids
    one = get_json(http_server.http_port, f"/threads?thread_id={http_server.proc.pid}")
    assert [t["thread_id"] for t in one] == [http_server.proc.pid]
    none = get_json(http_server.http_port, "/threads?name=no-such-thread")
    assert [t["name"] for t in none] == ["MainThread"]
    get_json(http_server.http_port, "/threads?thread_id=abc", status=422)


def test_cache_clear(http_server):
    ok = {"status": "ok", "cleared": {"tier": "l1"}}
    st, _, body = request(http_server.http_port, "POST", "/cache/clear")
    assert st == 200 and json.loads(body) == ok
    st, _, body = request(http_server.http_port, "POST", "/cache/clear", {"tier": "l1", "force": True})
    assert st == 200 and json.loads(body) == ok
    st, _, body = request(http_server.http_port, "POST", "/clear-cache")
    assert st == 200 and json.loads(body) == {"status": "ok"}
    st, _, body = request(http_server.http_port, "POST", "/cache/clear", {"tier": "l2"})
    assert st == 400 and json.loads(body) == {"detail": "tier 'l2' not supported; only 'l1'"}


def test_a_prefetch_shorter_than_a_chunk_is_a_noop(http_server):
    """docs/http.md: fewer tokens than one chunk is {"chunks": 0, "status":
    "noop"}, whether or not a worker registered the model's layout yet
    (there is nothing to look up either way; issue 31)."""
    st, _, body = request(http_server.http_port, "POST", "/cache/prefetches",
                          {"model_name": "never-registered", "world_size": 1, "token_ids": [1, 2, 3]})
    assert (st, json.loads(body)) == (202, {"chunks": 0, "status": "noop"}), body


# ---- errors ------------------------------------------------------------------


def test_errors(http_server):
    p = http_server.http_port
    st, _, body = request(p, "GET", "/no/such/path")
    assert st == 404 and json.loads(body) == {"detail": "Not Found"}
    st, _, _ = request(p, "POST", "/run_script", body="result = 1")
    assert st == 404
    st, hdrs, body = request(p, "GET", "/cache/clear")
    assert st == 405 and "POST" in hdrs["allow"]
    assert json.loads(body) == {"detail": "Method Not Allowed"}
    st, _, body = request(p, "POST", "/cache/clear", body="{not json",
                          headers={"Content-Type": "application/json"})
    assert st == 422 and json.loads(body)["detail"][0]["type"] == "json_invalid"
    st, _, body = request(p, "POST", "/coordinator/command", body="{oops")
    assert st == 400 and json.loads(body) == {"error": "invalid JSON body"}
    st, _, body = request(p, "GET", "/cache/objects")          # no L2 adapters here
    assert st == 503 and "no L2 adapters" in json.loads(body)["detail"]
    st, _, body = request(p, "GET", "/cache/prefetches/none")   # unknown request id
    assert st == 404 and "detail" in json.loads(body)
    for method, path in [("GET", "/config/policies")]:
        st, _, body = request(p, method, path, body="{}")
        assert st == 501, (method, path, st)
        assert "not available in this build" in json.loads(body)["detail"]
    st, _, body = request(p, "POST", "/cache/checksums", body="{}")    # no block_ids
    assert st == 400 and "block_ids" in json.loads(body)["detail"]
    st, _, body = request(p, "GET", "/kvcache/check?block_ids=1,[3&chunk_size=1")
    assert st == 400 and "block_ids" in json.loads(body)["error"]


def raw_status(port, data):
    """Sends raw bytes, returns the status code of the reply (0 if none)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(data)
        reply = b""
        while b"\r\n" not in reply:
            chunk = s.recv(4096)
            if not chunk:
                break
            reply += chunk
    parts = reply.split(b" ", 2)
    return int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0


def test_body_too_large(http_server):
    # Declared too large: answered from the headers alone.
    head = (b"POST /cache/clear HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % (2 << 20))
    assert raw_status(http_server.http_port, head) == 413
    # Chunked past 1 MiB: read and discarded, then answered.
    chunk = b" " * 65536
    body = b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for _ in range(20)) + b"0\r\n\r\n"
    head = b"POST /cache/clear HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    assert raw_status(http_server.http_port, head + body) == 413
    assert get_json(http_server.http_port, "/healthcheck") == {"status": "healthy"}


# ---- metrics -----------------------------------------------------------------


def scrape(port):
    from prometheus_client import parser
    st, hdrs, body = request(port, "GET", "/metrics")
    assert st == 200 and hdrs["content-type"].startswith("text/plain")
    return {f.name: f for f in parser.text_string_to_metric_families(body.decode())}


def sample(families, name, **labels):
    fam_name = name[:-len("_total")] if name.endswith("_total") else name
    for s in families[fam_name].samples:
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
            return s.value
    raise KeyError(name)


def test_metrics_parse(http_server):
    fams = scrape(http_server.http_port)
    for name in ("process_cpu_seconds", "process_resident_memory_bytes", "process_open_fds",
                 "process_start_time_seconds", "lmcache_mp_rpc_received"):
        assert name in fams, sorted(fams)
    assert fams["process_cpu_seconds"].type == "counter"
    assert fams["lmcache_mp_rpc_received"].type == "counter"
    assert sample(fams, "process_resident_memory_bytes") > 0
    assert abs(sample(fams, "process_start_time_seconds") - time.time()) < 3600


def test_metrics_counters_move(http_server):
    before = sample(scrape(http_server.http_port), "lmcache_mp_rpc_received_total")
    d = http_server.dealer()
    try:
        for _ in range(5):
            assert d.call(NOOP) is not None
    finally:
        d.close()
    after = sample(scrape(http_server.http_port), "lmcache_mp_rpc_received_total")
    assert after >= before + 5


# ---- robustness ------------------------------------------------------------


def raw_exchange(port, data, read=True):
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        try:
            s.sendall(data)
            if read:
                s.settimeout(1)
                while s.recv(65536):
                    pass
        except OSError:
            pass


def test_fuzz_keeps_serving(http_server):
    p = http_server.http_port
    rng = random.Random(1234)
    cases = [
        b"GARBAGE\r\n\r\n",
        b"GET / HTTP/9.9\r\n\r\n",
        b"GET /status HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n",
        b"GET /" + b"a" * 100000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET / HTTP/1.1\r\n" + b"X-Big: " + b"b" * 200000 + b"\r\n\r\n",
        b"POST /cache/clear HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        b"POST /cache/clear HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n{\xff\xfe",
    ]
    cases += [bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 2000))) + b"\r\n\r\n"
              for _ in range(30)]
    for data in cases:
        raw_exchange(p, data)
    for _ in range(20):  # half requests, hung up at once
        raw_exchange(p, b"POST /cache/clear HTTP/1.1\r\nContent-Length: 50\r\n\r\n{", read=False)
    for body in ("[]", "null", "1e999999", '{"tier": null}', '{"tier": ["l1"]}', '"\\ud800"',
                 "[" * 10000):
        st, _, _ = request(p, "POST", "/cache/clear", body=body,
                           headers={"Content-Type": "application/json"})
        assert st in (200, 400, 422), (body[:20], st)
    assert http_server.alive(), http_server.output()
    assert get_json(p, "/healthcheck") == {"status": "healthy"}
    d = http_server.dealer()
    try:
        assert d.call(NOOP) is not None
    finally:
        d.close()


def test_http_port_in_use_fails_cleanly(http_server, start_server):
    """A busy --http-port is a start-up error (needs `http_server`: only once integrated)."""
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        with pytest.raises(RuntimeError) as e:
            start_server("--http-host", "127.0.0.1", "--http-port", str(port))
    # lmcached itself refused: exit 1 with the reason, not a crash.
    assert "lmcached exited 1" in str(e.value), str(e.value)
    assert f"cannot listen on http://127.0.0.1:{port}: Address already in use" in str(e.value)


def test_quota_api(http_server):
    p = http_server.http_port
    for base in ("/quota", "/api/quota"):
        st, _, body = request(p, "PUT", base + "/tenant-a", body={"limit_gb": 1.5})
        # No L2 adapter runs IsolatedLRU here: the limit is kept, the reply
        # and the log say it is not enforced (issue 31).
        assert st == 200 and json.loads(body) == {"cache_salt": "tenant-a", "limit_gb": 1.5,
                                                  "status": "ok", "enforced": False}
        assert "limited to 1.5 GB, but no L2 adapter runs IsolatedLRU" in http_server.output()
        got = get_json(p, base + "/tenant-a")
        assert got == {"cache_salt": "tenant-a", "limit_gb": 1.5, "current_usage_gb": 0.0,
                       "exists": True}
        st, _, body = request(p, "PUT", base + "/_default", body={"limit_gb": 0})
        assert st == 200 and json.loads(body)["cache_salt"] == ""      # the empty salt
        users = get_json(p, base)["users"]
        assert users["tenant-a"]["limit_gb"] == 1.5 and users[""]["limit_gb"] == 0
        for bad in ("{not json", "[]", "{}", '{"limit_gb": "1"}', '{"limit_gb": -1}',
                    '{"limit_gb": 1e999}'):
            st, _, body = request(p, "PUT", base + "/x", body=bad,
                                  headers={"Content-Type": "application/json"})
            assert st == 400 and "detail" in json.loads(body), (bad, st)
        st, _, body = request(p, "DELETE", base + "/tenant-a")
        assert json.loads(body) == {"cache_salt": "tenant-a", "status": "removed"}
        st, _, body = request(p, "DELETE", base + "/tenant-a")
        assert json.loads(body) == {"cache_salt": "tenant-a", "status": "not_found"}
        assert get_json(p, base + "/tenant-a")["exists"] is False
        request(p, "DELETE", base + "/_default")


def test_quota_limit_bounds(http_server):
    """limit_gb is kept in bytes as a signed 64-bit integer: 1e300 once
    wrapped to a negative limit (issue 17)."""
    p = http_server.http_port
    for base in ("/quota", "/api/quota"):
        for bad in ("1e300", "8589934592", "1.7976931348623157e308", "-1e-300"):
            st, _, body = request(p, "PUT", base + "/big", body='{"limit_gb": %s}' % bad,
                                  headers={"Content-Type": "application/json"})
            assert st == 400, (bad, st, body)
            assert "below 8589934592" in json.loads(body)["detail"], body
        assert get_json(p, base + "/big")["exists"] is False
        st, _, body = request(p, "PUT", base + "/big", body={"limit_gb": 8589934591})
        assert st == 200, body
        got = get_json(p, base + "/big")
        assert got["exists"] is True and got["limit_gb"] == 8589934591.0
        assert request(p, "DELETE", base + "/big")[0] == 200


def test_stop_is_prompt_with_the_connection_limit_reached():
    """SIGTERM while the frontend holds its share of 256 connections, half
    of them in the middle of a request line: the server exits at once, not
    when the idle connections time out 30 s later."""
    s = Server()
    held = []
    try:
        for i in range(240):
            c = socket.create_connection(("127.0.0.1", s.http_port), timeout=5)
            if i % 2:
                c.sendall(b"GET /sta")
            held.append(c)
        time.sleep(1)
        t = time.monotonic()
        assert s.stop(timeout=10) == 0, s.output()
        assert time.monotonic() - t < 5
    finally:
        for c in held:
            c.close()
        s.stop()
