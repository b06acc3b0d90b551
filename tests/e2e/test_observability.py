"""Observability flags end to end (docs/observability.md):
the event bus and its metrics, --disable-metrics / --disable-observability /
--disable-logging, --event-bus-queue-size, --lookup-hash-log-dir, and OTLP
export to a tiny HTTP receiver."""
import http.client
import http.server
import json
import os
import threading
import time

import pytest

from lmc.client import unpack
from lmc.keys import ipc_key
from lmc.ops import (LOOKUP, NOOP, PING, QUERY_PREFETCH_STATUS, REPORT_BLOCK_ALLOCATION,
                     WAIT_PREFETCH_STATUS)
from lmc.server import Server, free_port

RECORDS = [{"req_id": "r1", "new_block_ids": [1, 2], "new_token_ids": [5, 6, 7]}]


def metrics_text(port):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", "/metrics")
        resp = conn.getresponse()
        assert resp.status == 200
        return resp.read().decode()
    finally:
        conn.close()


def families(text):
    return {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")}


def value(text, series):
    for line in text.splitlines():
        if line.startswith(series + " "):
            return float(line.rsplit(" ", 1)[1])
    raise KeyError(series)


def report_blocks(s, n):
    d = s.dealer()
    try:
        for i in range(n):
            assert d.call(REPORT_BLOCK_ALLOCATION, i, "m", RECORDS) is not None
    finally:
        d.close()


def wait_for(pred, timeout=10.0, step=0.05):
    """Polls pred until true; a KeyError (series not there yet) is false."""
    def check():
        try:
            return pred()
        except KeyError:
            return False

    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if check():
            return True
        time.sleep(step)
    return check()


def test_default_event_metrics(start_server):
    s = start_server()
    report_blocks(s, 3)
    series = 'lmcache_mp_events_total{event_type="REPORT_BLOCK_ALLOCATION"}'
    assert wait_for(lambda: value(metrics_text(s.http_port), series) == 3)
    text = metrics_text(s.http_port)
    fams = families(text)
    for name in ("lmcache_mp_event_bus_dropped_events_total",
                 "lmcache_mp_event_bus_drain_lag_seconds",
                 "lmcache_mp_event_bus_queue_depth", "lmcache_mp_lookups_total",
                 "lmcache_mp_lookup_hit_total", "lmcache_mp_num_finished_stores_total",
                 "lmcache_mp_l0_l1_load_throughput_gbs",
                 "lmcache_mp_l1_chunk_lifetime_seconds", "lmcache_mp_rpc_received_total",
                 "lmcache_mp_l1_used_bytes", "target_info"):
        assert name in fams, name
    assert value(text, "lmcache_mp_event_bus_dropped_events_total") == 0
    assert value(text, "lmcache_mp_event_bus_published_events_total") == 3


def test_disable_metrics_serves_process_metrics_only(start_server):
    s = start_server("--disable-metrics")
    report_blocks(s, 1)
    fams = families(metrics_text(s.http_port))
    assert "process_cpu_seconds_total" in fams
    assert "process_resident_memory_bytes" in fams
    extra = {f for f in fams if not f.startswith("process_")}
    assert extra == {"lmcache_mp_metrics_series_dropped_total"}, extra


def test_disable_observability_has_no_bus(start_server):
    s = start_server("--disable-observability", "--log-level", "DEBUG")
    report_blocks(s, 2)
    fams = families(metrics_text(s.http_port))
    assert "lmcache_mp_rpc_received_total" in fams       # other sources stay
    assert not any(f.startswith("lmcache_mp_event") for f in fams)
    assert "lmcache_mp_lookups_total" not in fams
    assert "event REPORT_BLOCK_ALLOCATION" not in s.output()


def test_logging_subscriber(start_server):
    s = start_server("--log-level", "DEBUG")
    report_blocks(s, 1)
    assert wait_for(lambda: "event REPORT_BLOCK_ALLOCATION session= t=" in s.output())
    line = next(l for l in s.output().splitlines() if "event REPORT_BLOCK_ALLOCATION" in l)
    assert "DEBUG" in line and '"model_name":"m"' in line
    quiet = start_server("--log-level", "DEBUG", "--disable-logging")
    report_blocks(quiet, 1)
    assert wait_for(lambda: value(metrics_text(quiet.http_port),
                                  "lmcache_mp_event_bus_delivered_events_total") == 1)
    assert "event REPORT_BLOCK_ALLOCATION" not in quiet.output()


def test_queue_size_bounds_and_counts(start_server):
    s = start_server("--event-bus-queue-size", "1", "--log-level", "DEBUG")
    report_blocks(s, 200)

    def settled():
        t = metrics_text(s.http_port)
        return value(t, "lmcache_mp_event_bus_queue_depth") == 0 and \
            value(t, "lmcache_mp_event_bus_published_events_total") == 200

    assert wait_for(settled)
    t = metrics_text(s.http_port)
    delivered = value(t, "lmcache_mp_event_bus_delivered_events_total")
    dropped = value(t, "lmcache_mp_event_bus_dropped_events_total")
    assert delivered + dropped == 200
    assert value(t, 'lmcache_mp_events_total{event_type="REPORT_BLOCK_ALLOCATION"}') == delivered


def test_lookup_hash_log_dir_is_created(start_server, tmp_path):
    d = tmp_path / "hashes" / "sub"
    s = start_server("--lookup-hash-log-dir", str(d), "--lookup-hash-log-max-files", "3")
    assert d.is_dir()
    assert "lookup hash log in" in s.output()


# ---- OTLP ------------------------------------------------------------------


class Receiver:
    """An OTLP/HTTP stand-in: records (path, headers, JSON body) of POSTs."""

    def __init__(self):
        self.posts = []
        self.lock = threading.Lock()
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with outer.lock:
                    outer.posts.append((self.path, dict(self.headers), json.loads(body)))
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, *args):
                pass

        self.port = free_port()
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def bodies(self, path):
        with self.lock:
            return [b for p, _, b in self.posts if p == path]

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def receiver():
    r = Receiver()
    yield r
    r.close()


def otlp_metrics(body):
    rm = body["resourceMetrics"][0]
    attrs = {a["key"]: a["value"]["stringValue"] for a in rm["resource"]["attributes"]}
    metrics = {m["name"]: m for m in rm["scopeMetrics"][0]["metrics"]}
    return attrs, metrics


def test_otlp_metrics_export(start_server, receiver, monkeypatch):
    monkeypatch.setenv("OTEL_METRIC_EXPORT_INTERVAL", "200")
    s = start_server("--otlp-endpoint", f"http://127.0.0.1:{receiver.port}/",
                     "--instance-id", "otlp-test-1")
    d = s.dealer()
    try:
        for _ in range(5):
            assert d.call(NOOP) is not None
    finally:
        d.close()
    report_blocks(s, 2)

    def rx_seen():
        # The last export must carry everything checked below: the events
        # reach their counter through the event bus, which may take another
        # export interval (seen under ASan).
        bodies = receiver.bodies("/v1/metrics")
        if not bodies:
            return False
        metrics = otlp_metrics(bodies[-1])[1]
        m = metrics.get("lmcache_mp.rpc_received")
        ev = metrics.get("lmcache_mp.events", {}).get("sum", {}).get("dataPoints", [])
        return (m is not None and m["sum"]["dataPoints"][0]["asDouble"] >= 5 and
                any(p["asDouble"] == 2 for p in ev) and
                "lmcache_mp.l1_chunk_lifetime_seconds" in metrics)

    assert wait_for(rx_seen, timeout=15), receiver.posts[-1:] or s.output()
    with receiver.lock:
        _, headers, _ = next(p for p in receiver.posts if p[0] == "/v1/metrics")
    assert headers["Content-Type"] == "application/json"
    attrs, metrics = otlp_metrics(receiver.bodies("/v1/metrics")[-1])
    assert attrs == {"service.name": "lmcached", "service.instance.id": "otlp-test-1"}
    rx = metrics["lmcache_mp.rpc_received"]["sum"]
    assert rx["isMonotonic"] is True and rx["aggregationTemporality"] == 2
    point = rx["dataPoints"][0]
    assert int(point["timeUnixNano"]) >= int(point["startTimeUnixNano"]) > 0
    assert "gauge" in metrics["process_resident_memory_bytes"]
    ev = metrics["lmcache_mp.events"]["sum"]["dataPoints"]
    assert any(p["attributes"] == [{"key": "event_type", "value":
                                    {"stringValue": "REPORT_BLOCK_ALLOCATION"}}] and
               p["asDouble"] == 2 for p in ev)
    hist = metrics["lmcache_mp.l1_chunk_lifetime_seconds"]["histogram"]
    assert hist["aggregationTemporality"] == 2
    # The final export at shutdown, and the export counter on /metrics.
    n = len(receiver.bodies("/v1/metrics"))
    text = metrics_text(s.http_port)
    assert value(text, 'lmcache_mp_otlp_exports_total{signal="metrics",result="success"}') >= 1
    assert s.stop() == 0, s.output()
    assert len(receiver.bodies("/v1/metrics")) > n


def test_lookup_span_reaches_the_otlp_receiver(receiver, monkeypatch):
    """With --enable-tracing a LOOKUP opens (LOOKUP_START) and closes
    (LOOKUP_END) an mp.lookup_prefetch span, exported to /v1/traces with
    the lookup's facts as attributes."""
    from test_lookup_engine_driven import CS, Worker, prompt
    monkeypatch.setenv("OTEL_METRIC_EXPORT_INTERVAL", "200")
    s = Server("--chunk-size", str(CS), "--otlp-endpoint", f"http://127.0.0.1:{receiver.port}",
               "--enable-tracing")
    try:
        toks = prompt(411)
        ws = [Worker(s, 6001, 0), Worker(s, 6002, 1)]
        for w in ws:
            w.store(toks, 0, 3 * CS)
        sched = s.dealer()
        assert sched.call(LOOKUP, ipc_key(toks, 0, 4 * CS, "span-1", world_size=2), 1) is not None
        assert unpack(sched.call(QUERY_PREFETCH_STATUS, "span-1")) == 3
        # The lookup module counts what was asked as well as what hit, so a
        # hit rate has its denominator in /status (issue 31).
        c = http.client.HTTPConnection("127.0.0.1", s.http_port, timeout=10)
        c.request("GET", "/status")
        lookup_status = json.loads(c.getresponse().read())["modules"]["lookup"]
        c.close()
        assert (lookup_status["requested_chunks"], lookup_status["hit_chunks"]) == (4, 3)

        def lookup_span():
            for body in receiver.bodies("/v1/traces"):
                for rs in body["resourceSpans"]:
                    for ss in rs["scopeSpans"]:
                        for sp in ss["spans"]:
                            attrs = {a["key"]: a["value"]["stringValue"]
                                     for a in sp["attributes"]}
                            if sp["name"] == "mp.lookup_prefetch" and \
                                    attrs.get("session_id") == "span-1":
                                return sp, attrs
            return None

        assert wait_for(lambda: lookup_span() is not None, timeout=15), \
            receiver.bodies("/v1/traces")[-1:] or s.output()
        span, attrs = lookup_span()
        assert attrs["hit_chunks"] == "3" and attrs["requested_chunks"] == "4"
        assert attrs["model_name"] == "m" and attrs["request_id"] == "span-1"
        assert "lmc.unpaired" not in attrs  # opened by the LOOKUP_START
        assert int(span["endTimeUnixNano"]) >= int(span["startTimeUnixNano"]) > 0
        for w in ws:
            w.close()
        sched.close()
    finally:
        assert s.stop() == 0, s.output()


def test_otlp_unreachable_endpoint_keeps_serving(start_server, monkeypatch):
    monkeypatch.setenv("OTEL_METRIC_EXPORT_INTERVAL", "100")
    s = start_server("--otlp-endpoint", f"http://127.0.0.1:{free_port()}",
                     "--enable-tracing")
    assert wait_for(lambda: 'result="failure"' in metrics_text(s.http_port), timeout=10)
    report_blocks(s, 1)
    assert s.alive()


def test_lookups_feed_metrics_and_the_hash_log(tmp_path):
    """A real store + LOOKUP moves the lookup counters (labelled by model and
    salt) and writes the prompt's chunk hashes to the lookup hash log."""
    from test_lookup_engine_driven import CS, Worker, prompt
    logdir = tmp_path / "hashes"
    s = Server("--chunk-size", str(CS), "--lookup-hash-log-dir", str(logdir))
    try:
        toks = prompt(301)
        ws = [Worker(s, 5001, 0), Worker(s, 5002, 1)]
        for w in ws:
            w.store(toks, 0, 2 * CS)                      # 2 of the 4 chunks stored
        sched = s.dealer()
        assert sched.call(LOOKUP, ipc_key(toks, 0, 4 * CS, "obs-1", world_size=2), 1) is not None
        assert unpack(sched.call(WAIT_PREFETCH_STATUS, "obs-1", 5.0)) == 2
        labels = 'model_name="m",cache_salt=""'
        assert wait_for(lambda: value(metrics_text(s.http_port),
                                      f"lmcache_mp_lookup_requested_total{{{labels}}}") == 4 * CS)
        text = metrics_text(s.http_port)
        assert value(text, f"lmcache_mp_lookup_hit_total{{{labels}}}") == 2 * CS
        assert value(text, f"lmcache_mp_lookups_total{{{labels}}}") == 1
        assert wait_for(lambda: any(logdir.iterdir()))
        files = sorted(logdir.iterdir())
        assert wait_for(lambda: files[0].read_text().strip() != "")
        rec = json.loads(files[0].read_text().splitlines()[0])
        assert rec["request_id"] == "obs-1" and len(rec["hashes"]) == 4
        assert all(len(h) == 64 for h in rec["hashes"])
        # Engine-driven transfers feed the store/retrieve families.
        for w in ws:
            assert w.retrieve(toks, 0, 2 * CS, "obs-1") is not None
        text = metrics_text(s.http_port)
        assert value(text, 'lmcache_mp_num_finished_stores_total{device="cpu"}') == 2
        assert wait_for(lambda: value(metrics_text(s.http_port),
                                      'lmcache_mp_num_finished_retrieves_total{device="cpu"}') == 2)
        text = metrics_text(s.http_port)
        for rank in (0, 1):
            assert value(text, f'lmcache_mp_num_chunks_loaded_total{{worker_id="{rank}",'
                               f'{labels}}}') == 2
        for w in ws:
            w.close()
        sched.close()
    finally:
        assert s.stop() == 0, s.output()


def test_storage_families_follow_the_data_path():
    """Stores, a lookup and retrieves move l1_write/l1_read, the sm_*
    counters and (every key sampled) the reuse-gap histogram; a retrieve
    without the lookup's locks counts as an L1 read failure."""
    from test_lookup_engine_driven import CS, Worker, prompt
    s = Server("--chunk-size", str(CS), "--metrics-sample-rate", "1")
    try:
        toks = prompt(302)
        ws = [Worker(s, 5101, 0), Worker(s, 5102, 1)]
        for w in ws:
            w.store(toks, 0, 4 * CS)
        assert ws[0].retrieve(toks, 0, 4 * CS, "no-lock") is None   # no lookup lock
        sched = s.dealer()
        assert sched.call(LOOKUP, ipc_key(toks, 0, 4 * CS, "st-1", world_size=2), 1) is not None
        assert unpack(sched.call(WAIT_PREFETCH_STATUS, "st-1", 5.0)) == 4
        for w in ws:
            assert w.retrieve(toks, 0, 4 * CS, "st-1") is not None
        salt = '{cache_salt=""}'
        assert wait_for(lambda: value(metrics_text(s.http_port), "lmcache_mp_l1_read_total") == 8)
        text = metrics_text(s.http_port)
        assert value(text, "lmcache_mp_l1_write_total") == 8        # 4 chunks x 2 ranks
        assert value(text, "lmcache_mp_sm_write_requests_total" + salt) == 2
        assert value(text, "lmcache_mp_sm_write_succeed_keys_total" + salt) == 8
        assert value(text, "lmcache_mp_sm_write_failed_keys_total" + salt) == 0
        assert value(text, "lmcache_mp_sm_read_requests_total" + salt) == 1
        assert value(text, "lmcache_mp_sm_read_succeed_keys_total" + salt) == 8
        assert value(text, 'lmcache_mp_l1_read_failure_total{during="l1_retrieve",'
                           'reason="not_found",model_name="m"}') == 4
        # The lookup's read locks touched each key once; the ~1 Hz eviction
        # cycle publishes the gaps and samples the usage ratio.
        assert wait_for(lambda: value(metrics_text(s.http_port),
                                      "lmcache_mp_l1_chunk_reuse_gap_seconds_count") == 8)
        text = metrics_text(s.http_port)
        assert value(text, "lmcache_mp_l1_usage_ratio_count") >= 1
        assert value(text, 'lmcache_mp_l1_usage_ratio_bucket{le="+Inf"}') >= 1
        for w in ws:
            w.close()
        sched.close()
    finally:
        assert s.stop() == 0, s.output()


def test_eviction_feeds_the_lifecycle_histograms():
    """An eviction loop that evicts everything (a tiny watermark) observes
    each chunk's lifetime and idle time; writing the chunks again closes
    their evict -> reuse gaps."""
    from test_lookup_engine_driven import CS, Worker, prompt
    s = Server("--chunk-size", str(CS), "--metrics-sample-rate", "1",
               "--eviction-trigger-watermark", "0.000001", "--eviction-ratio", "1")
    try:
        toks = prompt(303)
        ws = [Worker(s, 5201, 0), Worker(s, 5202, 1)]
        for w in ws:
            w.store(toks, 0, 4 * CS)
        assert wait_for(lambda: value(metrics_text(s.http_port),
                                      "lmcache_mp_l1_chunk_lifetime_seconds_count") == 8)
        text = metrics_text(s.http_port)
        assert value(text, "lmcache_mp_l1_chunk_idle_before_evict_seconds_count") == 8
        assert value(text, "lmcache_mp_l1_evicted_total") == 8
        for w in ws:
            w.store(toks, 0, 4 * CS)
        assert wait_for(lambda: value(metrics_text(s.http_port),
                                      "lmcache_mp_l1_chunk_evict_reuse_gap_seconds_count") == 8)
        for w in ws:
            w.close()
    finally:
        assert s.stop() == 0, s.output()


def test_rpc_requests_by_op(start_server):
    s = start_server()
    d = s.dealer()
    for _ in range(3):
        assert d.call(NOOP) is not None
    assert d.call(PING, "not-an-id", timeout_ms=300) is None   # a bad id: dropped
    text = metrics_text(s.http_port)
    assert value(text, 'lmcache_mp_rpc_requests_total{op="noop",result="ok"}') >= 3
    assert value(text, 'lmcache_mp_rpc_requests_total{op="ping",result="failed"}') == 1
    d.close()
