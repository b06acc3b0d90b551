"""L2 over Redis (resp) and an S3 endpoint, end to end through the
engine-driven path: write-behind, hits from L2 after L1 eviction, a restart
of lmcached over the same store, a Redis outage and an S3 outage that
degrade to L1-only and recover without restarting lmcached, and (issue 17)
usage accounting and L2 eviction against the real stores.

The S3 endpoint is moto_server as `make deps-test` installs it
(build-tools/venv/, tests/s3server/README.md), behind a proxy that
verifies SigV4 signatures.  A missing server fails the test under CI=true
and skips it elsewhere."""
import datetime
import hashlib
import hmac
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
import xml.etree.ElementTree as ET

import pytest

from lmc.server import ROOT, Server, free_port, l2_args
from redis_server import RedisExited, redis_pid, start_redis, start_redis_fresh
from lmc.ops import CLEAR
from test_l2_fs import SERVER_ARGS, close_all, status, store_all
from test_lookup_engine_driven import CS, OBJ, Worker, chunk_bytes, lookup, prompt

MOTO_SERVER = os.environ.get("LMC_MOTO_SERVER",
                             os.path.join(ROOT, "build-tools", "venv", "bin", "moto_server"))
BUCKET = "lmcache"


def missing(what):
    """A server the test needs is not installed: a failure under CI=true
    (where `make deps-test` must have installed it), a skip elsewhere."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"{what} is missing: `make deps-test` installs it")
    pytest.skip(f"{what} is missing (`make deps-test` installs it)")


def wait_port(port, proc, timeout=30):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args[0]} exited {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"port {port} never opened")


def stop(proc):
    proc.send_signal(signal.SIGKILL)
    proc.wait()


@pytest.fixture
def redis_port():
    if not shutil.which("redis-server"):
        missing("redis-server")
    port, proc = start_redis_fresh()
    yield port
    if proc.poll() is None:
        stop(proc)


class S3Server:
    """moto_server on a free port (S3 in memory), behind
    tests/s3server/sigv4_proxy.py, which verifies every request's SigV4
    signature (moto does not)."""

    def __init__(self):
        upstream = free_port()
        if not os.access(MOTO_SERVER, os.X_OK):
            missing(f"an S3 server ({MOTO_SERVER})")
        # moto takes any credentials; the proxy holds lmcached to these.
        self.access, self.secret = "lmc-test-key", "lmc-test-secret"
        self.proc = subprocess.Popen([MOTO_SERVER, "-H", "127.0.0.1", "-p", str(upstream)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_port(upstream, self.proc, timeout=60)
        self.upstream, self.port = upstream, free_port()
        self.start_endpoint()

    def start_endpoint(self):
        """The proxy, the endpoint lmcached talks to, on self.port."""
        self.proxy = subprocess.Popen(
            [sys.executable, os.path.join(ROOT, "tests", "s3server", "sigv4_proxy.py"),
             str(self.port), str(self.upstream), self.access, self.secret],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_port(self.port, self.proxy)

    def stop_endpoint(self):
        """An outage: the endpoint's process is gone and its port refuses
        connections.  moto behind it keeps the bucket and its objects, as
        S3 does through an outage (restarting moto would lose them)."""
        self.proxy.kill()
        self.proxy.wait()

    def spec(self, **extra):
        return {"type": "s3", "s3_endpoint": f"{BUCKET}.127.0.0.1:{self.port}",
                "disable_tls": True, "aws_access_key_id": self.access,
                "aws_secret_access_key": self.secret, "s3_create_bucket": True, **extra}

    def _get(self, path, query):
        """A SigV4-signed GET (the way lmcached signs: UNSIGNED-PAYLOAD)."""
        now = datetime.datetime.now(datetime.timezone.utc)
        amz, day = now.strftime("%Y%m%dT%H%M%SZ"), now.strftime("%Y%m%d")
        headers = {"host": f"127.0.0.1:{self.port}", "x-amz-content-sha256": "UNSIGNED-PAYLOAD",
                   "x-amz-date": amz}
        names = ";".join(sorted(headers))
        canonical = "\n".join(["GET", path, query,
                               "".join(f"{k}:{headers[k]}\n" for k in sorted(headers)), names,
                               "UNSIGNED-PAYLOAD"])
        scope = f"{day}/us-east-1/s3/aws4_request"
        to_sign = "\n".join(["AWS4-HMAC-SHA256", amz, scope,
                             hashlib.sha256(canonical.encode()).hexdigest()])
        key = ("AWS4" + self.secret).encode()
        for part in (day, "us-east-1", "s3", "aws4_request"):
            key = hmac.new(key, part.encode(), hashlib.sha256).digest()
        sig = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}?{query}", headers={
            "x-amz-content-sha256": "UNSIGNED-PAYLOAD", "x-amz-date": amz,
            "Authorization": f"AWS4-HMAC-SHA256 Credential={self.access}/{scope}, "
                             f"SignedHeaders={names}, Signature={sig}"})
        with urllib.request.urlopen(req, timeout=10) as r:
            return ET.fromstring(r.read())

    def objects(self):
        """{name: size} of every object in the bucket (ListObjectsV2, paged)."""
        out, token = {}, None
        while True:
            query = "list-type=2" if token is None else \
                f"continuation-token={urllib.parse.quote(token, safe='')}&list-type=2"
            root = self._get(f"/{BUCKET}/", query)
            ns = root.tag[:root.tag.index("}") + 1] if root.tag.startswith("{") else ""
            for c in root.iter(ns + "Contents"):
                out[c.find(ns + "Key").text] = int(c.find(ns + "Size").text)
            token = root.findtext(ns + "NextContinuationToken")
            if root.findtext(ns + "IsTruncated") != "true" or not token:
                return out

    def close(self):
        for p in (self.proxy, self.proc):
            p.terminate()
            p.wait()


@pytest.fixture
def s3_server():
    srv = S3Server()
    yield srv
    srv.close()


def wait_l2(srv, n_keys, timeout=20):
    """Waits until n_keys keys in all went to the adapter and none is still
    in flight.  The store controller picks each worker's commit up on its own,
    so an idle controller alone does not mean every rank's keys were seen."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        st = status(srv)
        sc = st["store_controller"]
        if sc["batches_in_flight"] == 0 and sc["keys_submitted"] >= n_keys:
            return st
        time.sleep(0.05)
    raise AssertionError(f"L2 store did not finish: {status(srv)}")


def round_trip(spec, rid_prefix):
    """Store, evict, hit from L2; then restart lmcached: still hits."""
    srv = Server(*SERVER_ARGS, *l2_args(spec))
    toks = prompt(201)
    try:
        ws = store_all(srv, toks)
        wait_l2(srv, 8)
        sched = srv.dealer()
        assert sched.call(CLEAR, False) is not None
        assert lookup(sched, toks, rid_prefix + "a", wait=True) == 4
        for w in ws:
            got = w.retrieve(toks, 0, 4 * CS, rid_prefix + "a")
            assert got == [chunk_bytes(w.rank, toks, c) for c in range(4)]
        close_all(ws, sched)
    finally:
        assert srv.stop() == 0, srv.output()
    srv = Server(*SERVER_ARGS, *l2_args(spec))  # a fresh server: only the L2 store remembers
    try:
        sched = srv.dealer()
        ws = [Worker(srv, 2001, 0), Worker(srv, 2002, 1)]  # registers the layout
        assert lookup(sched, toks, rid_prefix + "b", wait=True) == 4
        for w in ws:
            got = w.retrieve(toks, 0, 4 * CS, rid_prefix + "b")
            assert got == [chunk_bytes(w.rank, toks, c) for c in range(4)]
        close_all(ws, sched)
    finally:
        assert srv.stop() == 0, srv.output()


def test_resp_round_trip_and_restart(redis_port):
    round_trip({"type": "resp", "host": "127.0.0.1", "port": redis_port, "num_workers": 2}, "r")


def test_s3_round_trip_and_restart(s3_server):
    round_trip(s3_server.spec(), "s")


def test_a_taken_port_is_not_taken_for_a_ready_redis():
    """The Redis helper's own promise (issue 29): a redis-server that cannot
    bind, because another Redis holds its port, fails the start as soon as
    it exits; the Redis that answers there is never taken for it."""
    if not shutil.which("redis-server"):
        missing("redis-server")
    port, other = start_redis_fresh()
    try:
        t0 = time.monotonic()
        with pytest.raises(RedisExited):
            start_redis(port)
        assert time.monotonic() - t0 < 10              # at its exit, not the deadline
        assert redis_pid(port) == other.pid            # the other one is untouched
    finally:
        stop(other)


def test_redis_outage_degrades_then_recovers():
    if not shutil.which("redis-server"):
        missing("redis-server")
    port, redis = start_redis_fresh()
    srv = Server(*SERVER_ARGS, *l2_args({"type": "resp", "host": "127.0.0.1", "port": port,
                                         "num_workers": 2, "timeout_ms": 500}))
    try:
        ws = [Worker(srv, 3001, 0), Worker(srv, 3002, 1)]
        sched = srv.dealer()
        stop(redis)                                   # Redis goes away mid-run
        toks = prompt(202)
        for w in ws:
            w.store(toks, 0, len(toks))
        assert lookup(sched, toks, "o1", wait=True) == 4    # still served from L1
        st = wait_l2(srv, 8)                          # all 8 keys tried, and failed
        assert st["store_controller"]["stores_failed"] >= 1, st
        assert st["l2_adapters"][0]["counters"]["stores_ok"] == 0, st
        assert srv.alive()
        redis = start_redis(port)                     # back, same port
        toks2 = prompt(203)
        for w in ws:
            w.store(toks2, 0, len(toks2))
        st = wait_l2(srv, 16)                         # new chunks reach Redis again
        assert st["l2_adapters"][0]["counters"]["stores_ok"] >= 1, st
        assert sched.call(CLEAR, False) is not None
        assert lookup(sched, toks2, "o2", wait=True) == 4   # from Redis
        close_all(ws, sched)
    finally:
        assert srv.stop() == 0, srv.output()
        if redis.poll() is None:
            stop(redis)


def healthcheck(srv):
    url = f"http://127.0.0.1:{srv.http_port}/healthcheck"
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.status, json.loads(r.read())


def test_s3_outage_degrades_then_recovers(s3_server):
    """docs/l2.md, "s3": the endpoint goes away mid-run and comes back on
    the same port.  Meanwhile stores fail and are counted, lookups (and so
    loads) of what only S3 holds are misses, L1 still serves, and lmcached
    stays up and answers /healthcheck 200; once the endpoint is back the same lmcached
    stores to it and loads from it again, the objects stored before the
    outage included."""
    srv = Server(*SERVER_ARGS, *l2_args(s3_server.spec(num_workers=2)))
    try:
        ws = [Worker(srv, 4001, 0), Worker(srv, 4002, 1)]
        sched = srv.dealer()
        before, during, after = prompt(204), prompt(205), prompt(206)
        for w in ws:
            w.store(before, 0, len(before))
        st = wait_l2(srv, 8)                          # in S3 before the outage
        ad = st["l2_adapters"][0]
        assert ad["counters"]["stores_failed"] == 0 and ad["http_errors"] == 0, ad
        ok_before = ad["counters"]["stores_ok"]
        assert ok_before >= 1, ad

        s3_server.stop_endpoint()                     # S3 goes away mid-run
        for w in ws:
            w.store(during, 0, len(during))
        assert lookup(sched, during, "s1", wait=True) == 4  # still served from L1
        st = wait_l2(srv, 16)                         # all 16 keys tried
        ad = st["l2_adapters"][0]
        assert st["store_controller"]["stores_failed"] >= 1, st["store_controller"]
        assert ad["counters"]["stores_failed"] >= 1, ad
        assert ad["counters"]["stores_ok"] == ok_before, ad
        assert ad["put_errors"] >= 1 and ad["http_errors"] >= 1, ad
        assert sched.call(CLEAR, False) is not None   # `before` is now only in S3
        assert lookup(sched, before, "s2", wait=True) == 0  # unreachable: a miss, no error
        ad2 = status(srv)["l2_adapters"][0]
        assert ad2["http_errors"] > ad["http_errors"], ad2   # the lookup's HEADs
        assert srv.alive()
        # docs/l2.md, "Health": without --health-requires-l2 an L2 outage
        # leaves /healthcheck 200, "degraded" once the probe has seen it;
        # the adapter's is_healthy follows its probe (test_l2_health.py).
        code, body = healthcheck(srv)
        assert code == 200 and body["status"] in ("healthy", "degraded"), body

        s3_server.start_endpoint()                    # back, same port, same objects
        for w in ws:
            w.store(after, 0, len(after))
        st = wait_l2(srv, 24)
        assert st["l2_adapters"][0]["counters"]["stores_ok"] > ok_before, st["l2_adapters"][0]
        assert sched.call(CLEAR, False) is not None
        for toks, rid in ((before, "s3"), (after, "s4")):
            assert lookup(sched, toks, rid, wait=True) == 4  # loaded from S3 again
            for w in ws:
                got = w.retrieve(toks, 0, 4 * CS, rid)
                assert got == [chunk_bytes(w.rank, toks, c) for c in range(4)]
        close_all(ws, sched)
    finally:
        assert srv.stop() == 0, srv.output()


# ---- usage accounting and L2 eviction against the real stores (issue 17) ----

class RedisStore:
    def __init__(self):
        if not shutil.which("redis-server") or not shutil.which("redis-cli"):
            missing("redis-server / redis-cli")
        self.port, self.proc = start_redis_fresh()

    def spec(self, **extra):
        return {"type": "resp", "host": "127.0.0.1", "port": self.port, "num_workers": 2,
                **extra}

    def objects(self):
        """{name: STRLEN} of every key (this Redis holds lmcached's alone)."""
        script = ("local r = {} for _, k in ipairs(redis.call('KEYS', '*')) do "
                  "r[#r + 1] = k r[#r + 1] = redis.call('STRLEN', k) end return r")
        out = subprocess.run(["redis-cli", "-p", str(self.port), "EVAL", script, "0"],
                             capture_output=True, text=True, check=True, timeout=10).stdout
        lines = out.splitlines()
        return {lines[i]: int(lines[i + 1]) for i in range(0, len(lines) - 1, 2)}

    def close(self):
        stop(self.proc)


@pytest.fixture(params=["resp", "s3"])
def store(request):
    st = RedisStore() if request.param == "resp" else S3Server()
    yield st
    st.close()


EVICTION = {"eviction_policy": "LRU", "trigger_watermark": 0.5, "eviction_ratio": 0.25}
PERIOD = 1.0  # the L2 eviction controller's cycle (docs/l2.md)


def l2_status(srv):
    st = status(srv)
    return st["l2_adapters"][0], st["l2_eviction_controller"]["adapters"][0]


def stable_count(store, cycles=3, timeout=30):
    """The store's object count once it stayed the same for `cycles`
    eviction cycles."""
    deadline = time.monotonic() + timeout
    last, since = None, time.monotonic()
    while True:
        n = len(store.objects())
        if n != last:
            last, since = n, time.monotonic()
        elif time.monotonic() - since >= cycles * PERIOD + 0.2:
            return n
        assert time.monotonic() < deadline, f"the store never settled: {n} objects"
        time.sleep(0.2)


def assert_usage_is_the_store(srv, store):
    """The adapter's reported usage is the bytes the store really holds, and
    the eviction tracks every object in it."""
    objs = store.objects()
    ad, ev = l2_status(srv)
    assert (ad["used_bytes"], ad["num_keys"]) == (sum(objs.values()), len(objs)), (ad, objs)
    assert (ev["tracked_keys"], ev["tracked_bytes"]) == (len(objs), sum(objs.values())), ev


def test_l2_eviction_stops_under_the_watermark(store):
    """Capacity 20 objects, watermark 0.5: overwrites do not count twice, and
    crossing the watermark evicts down to just under it, then nothing more."""
    srv = Server(*SERVER_ARGS,
                 *l2_args(store.spec(max_capacity_gb=20 * OBJ / 2**30, eviction=EVICTION)))
    try:
        a, b = prompt(301), prompt(302)
        ws = store_all(srv, a)                        # 8 objects: 0.4 of capacity
        wait_l2(srv, 8)
        sched = srv.dealer()
        assert sched.call(CLEAR, False) is not None
        for w in ws:                                  # the same 8 again: overwrites
            w.store(a, 0, len(a))
        wait_l2(srv, 16)
        assert stable_count(store) == 8               # nothing under the watermark goes
        assert l2_status(srv)[1]["evicted_keys"] == 0
        assert_usage_is_the_store(srv, store)
        for w in ws:                                  # 16 objects: 0.8 of capacity
            w.store(b, 0, len(b))
        wait_l2(srv, 24)
        n = stable_count(store)
        # 25 % of the tracked keys per cycle until under 10 objects; how many
        # cycles depends on when each rank's store landed: 7..9 stay.
        assert 7 <= n <= 9, n
        ad, ev = l2_status(srv)
        assert ev["evicted_keys"] == 16 - n and ad["used_bytes"] < 0.5 * ad["capacity_bytes"]
        assert_usage_is_the_store(srv, store)
        assert sched.call(CLEAR, False) is not None   # the older prompt went first:
        assert lookup(sched, b, "e1", wait=True) == 4       # the newer one is whole
        for w in ws:
            assert w.retrieve(b, 0, 4 * CS, "e1") == [chunk_bytes(w.rank, b, c) for c in range(4)]
        close_all(ws, sched)
    finally:
        assert srv.stop() == 0, srv.output()


def test_usage_rebuilt_from_the_store_at_start(store):
    roomy = store.spec(max_capacity_gb=100 * OBJ / 2**30, eviction=EVICTION)
    srv = Server(*SERVER_ARGS, *l2_args(roomy))
    try:
        ws = store_all(srv, prompt(311))
        wait_l2(srv, 8)
        for w in ws:
            w.store(prompt(312), 0, len(prompt(312)))
        wait_l2(srv, 16)
        close_all(ws, srv.dealer())
    finally:
        assert srv.stop() == 0, srv.output()
    assert len(store.objects()) == 16
    srv = Server(*SERVER_ARGS, *l2_args(roomy))                                # 16 of 100 objects: kept
    try:
        ad, ev = l2_status(srv)
        assert (ad["used_bytes"], ad["num_keys"], ev["recovered_keys"]) == (16 * OBJ, 16, 16), \
            (ad, ev)
        assert_usage_is_the_store(srv, store)
    finally:
        assert srv.stop() == 0, srv.output()
    srv = Server(*SERVER_ARGS,
                 *l2_args(store.spec(max_capacity_gb=20 * OBJ / 2**30, eviction=EVICTION)))
    try:                                              # 16 of 20: 16 -> 12 -> 9
        assert stable_count(store) == 9
        assert l2_status(srv)[1]["evicted_keys"] == 7
        assert_usage_is_the_store(srv, store)
    finally:
        assert srv.stop() == 0, srv.output()
