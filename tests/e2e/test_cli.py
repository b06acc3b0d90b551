"""End-to-end: lmcache-cli against the real server, and against none."""
import os
import re
import subprocess
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



def test_cli_version_names_version_and_commit():
    """lmcache-cli --version (issue 31): the version and the commit it was
    built from, as lmcached's /version reports them."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    git = subprocess.run(["git", "-C", root, "rev-parse", "--short=12", "HEAD"],
                         capture_output=True, text=True)
    commit = git.stdout.strip() if git.returncode == 0 else "NA"
    r = run_cli("--version")
    assert r.returncode == 0, r.stderr
    assert re.fullmatch(r"lmcache-cli \d+\.\d+\.\d+ \(commit %s\)\n" % re.escape(commit),
                        r.stdout), r.stdout
