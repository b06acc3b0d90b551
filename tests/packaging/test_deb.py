"""The .deb (docs/deploy.md, "The package"): what it holds and depends on,
its binaries started from a scratch root where `dpkg -x` unpacked it, and
lintian's verdict."""
import gzip
import json
import os
import signal
import subprocess
import time
import urllib.request

import msgpack
import zmq

from conftest import ROOT, need, run, version
from lmc.client import Dealer
from lmc.ops import NOOP
from lmc.server import free_port

BINARIES = ("lmcached", "lmcached-coordinator", "lmcache-cli")


def field(deb, name):
    return run(["dpkg-deb", "-f", deb, name]).stdout.strip()


def test_control_names_the_version_and_the_libraries_the_binaries_need(deb):
    assert os.path.basename(deb) == \
        f"lmcached_{version()}_{run(['dpkg', '--print-architecture']).stdout.strip()}.deb"
    assert field(deb, "Package") == "lmcached"
    assert field(deb, "Version") == version()
    depends = {d.split()[0] for d in field(deb, "Depends").split(", ")}
    # dpkg-shlibdeps' answer for the libraries CMakeLists.txt links.
    assert {"libc6", "libzmq5", "libmsgpackc2", "libjansson4", "libmicrohttpd12", "libcurl4",
            "libssl3", "libsqlite3-0"} <= depends, depends


def test_files_are_where_docs_deploy_md_says(deb, deb_root):
    usr = deb_root / "usr"
    assert os.readlink(usr / "bin" / "lmcached") == "../lib/lmcached/lmcached"
    for b in BINARIES:
        out = run([str(usr / "bin" / b), "--version"]).stdout
        assert out.startswith(f"{b} {version()}"), out
        with gzip.open(usr / "share" / "man" / "man1" / f"{b}.1.gz", "rt") as f:
            page = f.read()
        assert f'.TH {b.upper()} "1"' in page, page[:300]
    with gzip.open(usr / "share" / "man" / "man1" / "lmcached.1.gz", "rt") as f:
        assert "l1\\-size\\-gb" in f.read()      # from --help
    for unit in ("lmcached", "lmcached-coordinator"):
        assert (deb_root / "lib" / "systemd" / "system" / f"{unit}.service").is_file()
        assert (deb_root / "etc" / "default" / unit).is_file()
    conffiles = run(["dpkg-deb", "-I", deb, "conffiles"]).stdout.split()
    assert sorted(conffiles) == ["/etc/default/lmcached", "/etc/default/lmcached-coordinator"]
    doc = usr / "share" / "doc" / "lmcached"
    for name in ("copyright", "changelog.gz", "deploy.md", "examples/lmcached-same-user.conf"):
        assert (doc / name).is_file(), name


def test_installed_server_answers_noop_and_stops_on_sigterm(deb_root, tmp_path):
    """The binary the package installs, started from the scratch root: it
    serves NOOP over ZMQ (and lmcache-cli from the package reaches it),
    then SIGTERM ends it with status 0."""
    port, http_port = free_port(), free_port()
    log = open(tmp_path / "lmcached.log", "w+b")
    proc = subprocess.Popen([str(deb_root / "usr" / "bin" / "lmcached"), "--host", "127.0.0.1",
                             "--port", str(port), "--http-host", "127.0.0.1",
                             "--http-port", str(http_port), "--l1-size-gb", "0.0625",
                             "--eviction-policy", "LRU"], stdout=log, stderr=subprocess.STDOUT)
    ctx = zmq.Context()
    d = Dealer(ctx, f"tcp://127.0.0.1:{port}")
    try:
        reply, deadline = None, time.monotonic() + 20
        while reply is None and time.monotonic() < deadline and proc.poll() is None:
            reply = d.call(NOOP, timeout_ms=200)
        log.seek(0)
        assert reply is not None and reply[2] == msgpack.packb("OK"), log.read()
        cli = run([str(deb_root / "usr" / "bin" / "lmcache-cli"), "--port", str(port), "noop"])
        assert cli.stdout.strip() == "OK", cli.stderr
    finally:
        d.sock.close()
        ctx.term()
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(20)
    log.seek(0)
    assert rc == 0, log.read()


def test_installed_coordinator_serves_and_stops_on_sigterm(deb_root, tmp_path):
    port = free_port()
    env = {**os.environ, "LMCACHE_MP_COORDINATOR_HOST": "127.0.0.1",
           "LMCACHE_MP_COORDINATOR_PORT": str(port),
           "LMCACHE_MP_COORDINATOR_DB_PATH": str(tmp_path / "coordinator.db")}
    proc = subprocess.Popen([str(deb_root / "usr" / "bin" / "lmcached-coordinator")], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        body, deadline = None, time.monotonic() + 20
        while body is None and time.monotonic() < deadline and proc.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthcheck", timeout=1) as r:
                    body = json.load(r)
            except OSError:
                time.sleep(0.1)
        assert body == {"status": "healthy", "instances": 0}, proc.poll()
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=20)
    assert proc.returncode == 0, out
    assert (tmp_path / "coordinator.db").is_file()


def overrides():
    """The tags packaging/debian/lintian-overrides overrides, with their
    context, as lintian prints them."""
    with open(os.path.join(ROOT, "packaging", "debian", "lintian-overrides")) as f:
        return {line.split(": ", 1)[1].strip() for line in f
                if line.strip() and not line.startswith("#")}


def test_lintian_finds_no_error_and_no_warning_but_the_explained_overrides(deb):
    """Errors and warnings fail; so does an override that matches nothing
    (each stays only with its reason, docs/deploy.md "The package")."""
    lintian = need("lintian")
    r = run([lintian, "--pedantic", "-I", "-E", "--show-overrides", deb], timeout=300)
    lines = [ln for ln in r.stdout.splitlines() if ln[:2] in ("E:", "W:", "I:", "X:", "P:", "O:")]
    bad = [ln for ln in lines if ln[:2] in ("E:", "W:") or
           "unused-override" in ln or "mismatched-override" in ln]
    assert not bad, "\n".join(bad) + "\n" + r.stderr
    shown = {ln.split(": ", 2)[2] for ln in lines if ln.startswith("O:")}
    assert overrides() == shown, (overrides(), shown)
