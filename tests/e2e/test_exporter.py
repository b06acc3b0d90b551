"""The standalone Prometheus exporter (docs/http.md, "Standalone Prometheus exporter"): with
--no-http, /metrics alone is served on --prometheus-port and the HTTP
frontend's port is not bound."""
import http.client
import socket

from prometheus_client.parser import text_string_to_metric_families

from lmc.server import Server, free_port


def get(port, path):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.getheader("Content-Type"), resp.read()
    finally:
        conn.close()


def bound(port):
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) == 0


def exporter(start_server):
    """A server with --no-http: its exporter on s.prom_port."""
    prom = free_port()
    s = start_server("--no-http", "--prometheus-port", str(prom))
    s.prom_port = prom
    return s


def test_metrics_on_prometheus_port(start_server):
    s = exporter(start_server)
    st, ctype, body = get(s.prom_port, "/metrics")
    assert st == 200, body
    assert ctype.startswith("text/plain; version=0.0.4")
    families = {f.name: f for f in text_string_to_metric_families(body.decode())}
    assert "lmcache_mp_rpc_received" in families  # counters lose _total in the parser
    assert "lmcache_mp_l1_capacity_bytes" in families
    cap = families["lmcache_mp_l1_capacity_bytes"].samples[0].value
    assert cap == 0.0625 * (1 << 30)
    target = families["target_info"].samples[0]
    assert target.labels["service_instance_id"]
    assert "Prometheus exporter on http://127.0.0.1:%d/metrics" % s.prom_port in s.output()


def test_only_metrics_is_served(start_server):
    s = exporter(start_server)
    for path in ("/", "/status", "/healthcheck", "/dashboard", "/config"):
        st, _, _ = get(s.prom_port, path)
        assert st == 404, path
    assert not bound(s.http_port)


def test_http_mode_has_no_exporter():
    prom = free_port()
    s = Server("--prometheus-port", str(prom))
    try:
        assert not bound(prom)
        st, _, _ = get(s.http_port, "/metrics")
        assert st == 200
    finally:
        assert s.stop() == 0, s.output()


def test_busy_exporter_port_is_a_warning():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        s = Server("--no-http", "--prometheus-port", str(port))
        try:
            assert s.alive()
            assert "Prometheus exporter not started" in s.output()
        finally:
            assert s.stop() == 0, s.output()


def test_disable_metrics_has_no_exporter():
    prom = free_port()
    s = Server("--no-http", "--disable-metrics", "--prometheus-port", str(prom))
    try:
        assert not bound(prom)
    finally:
        assert s.stop() == 0, s.output()
