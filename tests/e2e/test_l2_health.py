"""The health of the L2 adapters (docs/l2.md, "Health"): each adapter's
`is_healthy` in /status is a real probe of its backend, with the reason in
`health_reason`; /healthcheck stays 200 unless --health-requires-l2 is
given, and then answers 503 naming the adapter and why.  Backends: a Redis
port nothing listens on, a real redis-server stopped and restarted, an fs
base_path that is a regular file, and S3 (moto) with a good bucket, a
missing one and a dead endpoint."""
import shutil
import time

import pytest

from lmc.server import Server, free_port, l2_args, run_lmcached
from redis_server import start_redis, start_redis_fresh
from test_l2_fs import http_json, metric
from test_l2_resp_s3 import BUCKET, S3Server, missing, stop

FAST = ("--l2-health-interval-s", "0.2")


def get(srv, path):
    return http_json(srv, "GET", path)


def adapters(srv):
    return get(srv, "/status")[1]["storage_manager"]["l2_adapters"]


def wait_health(srv, healthy, index=0, timeout=5):
    """Adapter index's status once its is_healthy is `healthy`."""
    deadline = time.monotonic() + timeout
    while True:
        ad = adapters(srv)[index]
        if ad["is_healthy"] is healthy or time.monotonic() > deadline:
            assert ad["is_healthy"] is healthy, ad
            return ad
        time.sleep(0.05)


@pytest.fixture
def servers():
    """Starts servers and stops them all at the end (each must exit 0)."""
    started = []

    def start(*args):
        srv = Server(*args)
        started.append(srv)
        return srv
    yield start
    for srv in started:
        assert srv.stop() == 0, srv.output()


def test_refused_redis_is_unhealthy_and_healthcheck_follows_the_flag(servers):
    spec = {"type": "resp", "host": "127.0.0.1", "port": free_port()}  # nothing listens
    srv = servers(*l2_args(spec))
    ad = adapters(srv)[0]
    assert ad["is_healthy"] is False, ad
    assert "refused" in ad["health_reason"].lower(), ad
    assert ad["health_since_ms"] > 0, ad
    st = get(srv, "/status")[1]
    assert st["is_healthy"] is False                   # AND over the storage's parts
    # Not asked to fail: still serving (200), but it says what is wrong.
    code, body = get(srv, "/healthcheck")
    assert code == 200 and body["status"] == "degraded", body
    assert body["reason"].startswith("L2 adapter 0 (resp) unhealthy: "), body
    assert body["reasons"] == [body["reason"]] and len(body["l2_adapters"]) == 1, body
    assert metric(srv, 'lmcache_mp_l2_adapter_healthy{adapter="0",l2_name="resp"}') == 0
    log = srv.output()
    assert f"L2 adapter 0 (resp) unhealthy: 127.0.0.1:{spec['port']}: connect: " \
           "Connection refused" in log, log
    assert "counted 0 objects" not in log, log

    strict = servers("--health-requires-l2", *l2_args(spec))
    code, body = get(strict, "/healthcheck")
    assert code == 503, body
    assert body["status"] == "unhealthy", body
    assert body["reason"].startswith("L2 adapter 0 (resp) unhealthy: "), body
    assert "refused" in body["reason"].lower(), body
    assert [(a["index"], a["type_name"]) for a in body["l2_adapters"]] == [(0, "resp")], body


def test_fs_base_path_that_is_a_file_is_unhealthy(servers, tmp_path):
    good, bad = tmp_path / "l2", tmp_path / "a-file"
    bad.write_text("not a directory")
    srv = servers("--health-requires-l2", *l2_args({"type": "fs", "base_path": str(good)}),
                  *l2_args({"type": "fs", "base_path": str(bad)}))
    ok, broken = adapters(srv)
    assert ok["is_healthy"] is True and ok["health_reason"] is None, ok
    assert broken["is_healthy"] is False, broken
    assert broken["health_reason"] == f"base_path {bad} is not a directory", broken
    code, body = get(srv, "/healthcheck")
    assert code == 503 and [a["index"] for a in body["l2_adapters"]] == [1], body
    assert metric(srv, 'lmcache_mp_l2_adapter_healthy{adapter="0",l2_name="fs"}') == 1
    assert metric(srv, 'lmcache_mp_l2_adapter_healthy{adapter="1",l2_name="fs"}') == 0


def test_redis_stopped_then_restarted(servers):
    if not shutil.which("redis-server"):
        missing("redis-server")
    port, redis = start_redis_fresh()
    try:
        srv = servers(*FAST, "--health-requires-l2",
                      *l2_args({"type": "resp", "host": "127.0.0.1", "port": port,
                                "timeout_ms": 500}))
        ad = adapters(srv)[0]
        assert ad["is_healthy"] is True and ad["health_reason"] is None, ad
        assert get(srv, "/healthcheck") == (200, {"status": "healthy"})
        stop(redis)
        ad = wait_health(srv, False)
        assert "refused" in ad["health_reason"].lower(), ad
        assert get(srv, "/healthcheck")[0] == 503
        redis = start_redis(port)
        wait_health(srv, True)
        assert get(srv, "/healthcheck") == (200, {"status": "healthy"})
        assert "L2 adapter 0 (resp) healthy again" in srv.output()
    finally:
        if redis.poll() is None:
            stop(redis)


@pytest.fixture(scope="module")
def s3():
    srv = S3Server()
    yield srv
    srv.close()


def test_s3_health(servers, s3):
    missing_bucket = {**s3.spec(), "s3_endpoint": f"no-such-bucket.127.0.0.1:{s3.port}",
                      "s3_create_bucket": False}
    dead = {**s3.spec(), "s3_endpoint": f"{BUCKET}.127.0.0.1:{free_port()}"}
    srv = servers(*l2_args(s3.spec()), *l2_args(missing_bucket), *l2_args(dead))
    good, nobucket, down = adapters(srv)
    assert good["is_healthy"] is True and good["health_reason"] is None, good
    assert nobucket["is_healthy"] is False, nobucket
    assert "no-such-bucket" in nobucket["health_reason"], nobucket
    assert "HTTP 404" in nobucket["health_reason"], nobucket
    assert down["is_healthy"] is False, down
    assert "connect" in down["health_reason"].lower(), down


def test_s3_endpoint_outage_and_return(servers, s3):
    srv = servers(*FAST, *l2_args(s3.spec()))
    wait_health(srv, True)
    s3.stop_endpoint()
    try:
        ad = wait_health(srv, False)
        assert "connect" in ad["health_reason"].lower(), ad
        code, body = get(srv, "/healthcheck")           # not asked to fail: degraded
        assert code == 200 and body["status"] == "degraded", body
    finally:
        s3.start_endpoint()
    wait_health(srv, True)


@pytest.mark.parametrize("value,why", [("0", "must be finite and > 0, got 0"),
                                       ("-1", "must be finite and > 0, got -1"),
                                       ("nan", "must be finite and > 0, got nan"),
                                       ("inf", "must be finite and > 0, got inf"),
                                       ("soon", "invalid float value 'soon'")])
def test_health_interval_must_be_a_positive_number(value, why):
    r = run_lmcached("--l2-health-interval-s", value)
    assert r.returncode == 2
    assert f"--l2-health-interval-s: {why}" in r.stderr, r.stderr
