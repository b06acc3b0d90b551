"""End-to-end: lmcache-cli against the real server, and against none."""
import time

from lmc.server import free_port, run_cli


def test_cli_commands(server):
    port = str(server.port)
    base = ["--host", "127.0.0.1", "--port", port]
    r = run_cli(*base, "noop")
    assert r.returncode == 0 and r.stdout.strip() == "OK"
    r = run_cli("get-chunk-size", *base)
    assert r.returncode == 0 and r.stdout.strip() == "256"
    r = run_cli(*base, "ping")
    assert r.returncode == 0 and r.stdout.strip() == "true"
    r = run_cli(*base, "clear")
    assert r.returncode == 0 and "Cache cleared successfully." in r.stdout
    r = run_cli(*base, "end-session", "req-1")
    assert r.returncode == 0 and "Session req-1 ended." in r.stdout


def test_cli_without_server_times_out_with_exit_1():
    start = time.monotonic()
    r = run_cli("--host", "127.0.0.1", "--port", str(free_port()), "noop")
    elapsed = time.monotonic() - start
    assert r.returncode == 1
    assert "no reply" in r.stderr
    assert 4.0 <= elapsed < 9.0


def test_cli_usage_errors():
    assert run_cli().returncode == 2
    assert run_cli("bogus").returncode == 2
    assert run_cli("end-session").returncode == 2
    assert run_cli("--port", "0", "noop").returncode == 2
    r = run_cli("--help")
    assert r.returncode == 0 and "end-session" in r.stdout
