"""Issue 31, the operator's first hour with lmcached-coordinator
(docs/coordinator.md): the older L2 usage stream (POST /l2/events) from a
real lmcached, the database's default place, /version and the process
metrics, the first log lines, the quota replies beside lmcached's, and
--config / --print-config."""
import json
import os
import subprocess
import time
import urllib.request

import pytest

from lmc.server import Server
from test_coordinator_api import COORDINATOR, P, Coordinator
from test_fleet import GIB, l2_listing, wait_for
from test_lookup_engine_driven import CS, Worker, prompt


@pytest.fixture
def started(tmp_path):
    """Calls start(kind, ...) and stops what it started at the end."""
    things = []

    def start(thing):
        things.append(thing)
        return thing

    yield start
    problems = []
    for t in reversed(things):
        if isinstance(t, Coordinator):
            p = t.teardown_problem()
        elif isinstance(t, Worker):
            t.close()
            p = None
        else:
            rc = t.stop() if t.alive() else t.proc.returncode
            p = None if rc == 0 else f"lmcached exited {rc}: {t.output()[-2000:]}"
        if p:
            problems.append(p)
    assert not problems, problems


def http_json(port, path):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
        return json.loads(r.read())


# ---- POST /l2/events ------------------------------------------------------------

def l2_usage_status(srv):
    return http_json(srv.http_port, "/status")["coordinator"]["l2_usage_events"]


def test_l2_usage_stream_from_lmcached(tmp_path, started):
    """lmcached with --coordinator-l2-event-reporting and an fs L2 posts its
    L2 stores to /l2/events: every batch is accepted (none dropped) and the
    coordinator's usage view and metrics show them."""
    coord = started(Coordinator(tmp_path / "coord.db", CHUNK_SIZE=str(CS)))
    l2 = tmp_path / "l2"
    l2.mkdir()
    spec = json.dumps({"type": "fs", "base_path": str(l2), "shared": True})
    srv = started(Server("--chunk-size", str(CS), "--instance-id", "node-a",
                         "--l2-adapter", spec,
                         "--coordinator-url", f"http://127.0.0.1:{coord.port}",
                         "--coordinator-heartbeat-interval", "0.3",
                         "--coordinator-l2-event-reporting",
                         "--coordinator-l2-event-flush-interval", "0.2"))
    ws = [started(Worker(srv, 3001, 0)), started(Worker(srv, 3002, 1))]
    for w in ws:
        ctx = w.store(prompt(5), 0, 64, rid="st5", salt="tenant-a")
        assert ctx["chunk_indices"] == [0, 1, 2, 3], ctx
    wait_for("8 objects in L2", lambda: len(l2_listing(srv)) >= 8)
    stored = sum(size for k, size in l2_listing(srv).items() if k[4] == "tenant-a")
    assert stored > 0

    def usage():
        st, r = coord.call("GET", "/quota/tenant-a?tier=l2")
        assert st == 200, r
        return round(r["usage_gb"] * GIB)
    wait_for("the coordinator's usage of tenant-a", lambda: usage() == stored)
    status = wait_for("a batch accepted", lambda: (lambda s: s if s["batches_sent"] >= 1
                                                   else None)(l2_usage_status(srv)))
    assert status["enabled"] is True
    assert status["batches_dropped"] == 0 and status["events_dropped"] == 0, status
    assert coord.metric("lmcache_mp_coordinator_l2_usage_posts_total") >= 1
    assert coord.metric("lmcache_mp_coordinator_l2_usage_events_total") >= 8
    assert "HTTP 404" not in srv.output()


def test_resync_from_a_server_without_l2_is_not_a_failure(tmp_path, started):
    """A server with no L2 answers the resync's listing 503 "no L2 adapters":
    nothing to backfill, said once at INFO, not a warning every second
    ("resync ... failed: a bad answer") until RESYNC_MAX_WAIT."""
    coord = started(Coordinator(tmp_path / "coord.db", ENABLE_STARTUP_RESYNC="true",
                                RESYNC_POLL_INTERVAL="0.2", RESYNC_MAX_WAIT="30"))
    srv = started(Server("--instance-id", "no-l2",
                         "--coordinator-url", f"http://127.0.0.1:{coord.port}",
                         "--coordinator-heartbeat-interval", "0.3"))
    wait_for("the resync's verdict", lambda: "nothing to resync" in coord.output())
    time.sleep(0.5)   # a retry, if there were one, would come within this
    log = coord.output()
    assert f"127.0.0.1:{srv.http_port} has no L2 adapter: nothing to resync" in log, log
    assert "resync from" not in log, log


def test_l2_events_body_checks_and_token(tmp_path, started):
    coord = started(Coordinator(tmp_path / "coord.db", AUTH_TOKEN="tok"))
    key = {"chunk_hash_hex": "ab" * 16, "model_name": "m", "kv_rank": 0,
           "object_group_id": 0, "cache_salt": "s"}
    good = {"instance_id": "n", "seq": 1, "tier": "l2",
            "events": [{"type": "store", "key": key, "bytes": 1 << 20},
                       {"type": "lookup", "key": key, "bytes": 0}]}
    st, r = coord.call("POST", "/l2/events", good)
    assert st == 401, r                                   # the token is required
    st, r = coord.call("POST", "/l2/events", good, token="tok")
    assert (st, r) == (200, {"recorded": 2})
    st, r = coord.call("POST", "/l2/events", good, token="tok")   # again: replaces
    assert (st, r) == (200, {"recorded": 2})
    st, r = coord.call("GET", "/quota/s", token="tok")
    assert r["usage_gb"] == pytest.approx(1 / 1024)
    bad = [
        (b"{", "JSON"),
        (b"[]", "body must be"),
        (json.dumps({**good, "events": {}}), "events must be a list"),
        (json.dumps({**good, "tier": "l1"}), "tier must be"),
        (json.dumps({k: v for k, v in good.items() if k != "instance_id"}), "instance_id"),
        (json.dumps({**good, "seq": -1}), "seq must be"),
        (json.dumps({**good, "events": [{"type": "delete", "key": key}]}),
         "events[0]: type must be"),
        (json.dumps({**good, "events": [{"type": "store", "key": key}]}),
         "events[0]: bytes must be"),
        (json.dumps({**good, "events": [{"type": "store", "key": {**key, "kv_rank": -1},
                                         "bytes": 1}]}), "events[0]: key: kv_rank"),
    ]
    for body, reason in bad:
        st, r = coord.call("POST", "/l2/events", raw=body, token="tok")
        assert st == 422 and reason in r["detail"], (body, st, r)
    st, r = coord.call("GET", "/quota/s", token="tok")
    assert r["usage_gb"] == pytest.approx(1 / 1024)        # nothing of those applied
    assert coord.metric("lmcache_mp_coordinator_l2_usage_posts_total") == 2
    assert coord.metric("lmcache_mp_coordinator_l2_usage_events_total") == 4
    # The usage from the stream is saved like the /events stream's.
    coord.stop()
    again = started(Coordinator(tmp_path / "coord.db", AUTH_TOKEN="tok"))
    st, r = again.call("GET", "/quota/s", token="tok")
    assert r["usage_gb"] == pytest.approx(1 / 1024)


# ---- the database's default place, the first log lines ---------------------------

def bare_env(tmp_path, **extra):
    """The environment without any coordinator setting, HOME under tmp_path."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(P) and k not in ("STATE_DIRECTORY", "XDG_STATE_HOME")}
    env.update(HOME=str(tmp_path / "home"), **extra)
    return env


def run_until_healthy(args, env, cwd, port, reads=()):
    """Starts the coordinator, waits for /healthcheck, GETs each of reads,
    stops it: its log and the bodies read (text)."""
    log = cwd / "coord.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([COORDINATOR, *args], env=env, cwd=cwd, stdout=out,
                                stderr=subprocess.STDOUT)
        try:
            wait_for("the coordinator's health", lambda: answers(port), timeout=10)
            bodies = [urllib.request.urlopen(f"http://127.0.0.1:{port}{path}",
                                             timeout=10).read().decode() for path in reads]
        finally:
            proc.terminate()
            assert proc.wait(20) == 0
    return log.read_text(), bodies


def answers(port):
    try:
        return http_json(port, "/healthcheck")["status"] == "healthy"
    except OSError:
        return False


def test_default_database_is_not_in_the_working_directory(tmp_path):
    """Issue 31: without DB_PATH the database went to ./lmcached-coordinator.db
    of wherever the command ran.  Now: $XDG_STATE_HOME/lmcached, else
    ~/.local/state/lmcached (made 0700), or systemd's $STATE_DIRECTORY; the
    path is logged at start."""
    from lmc.server import free_port
    cwd = tmp_path / "checkout"
    cwd.mkdir()
    port = free_port()
    env = bare_env(tmp_path, **{P + "PORT": str(port), P + "HOST": "127.0.0.1",
                                P + "ENABLE_STARTUP_RESYNC": "false"})
    log, _ = run_until_healthy([], env, cwd, port)
    assert os.listdir(cwd) == ["coord.log"], os.listdir(cwd)
    state = tmp_path / "home" / ".local" / "state" / "lmcached"
    assert (state / "coordinator.db").is_file(), log
    assert (os.stat(state).st_mode & 0o777) == 0o700
    assert f"database {state / 'coordinator.db'} (from $HOME/.local/state)" in log
    env["XDG_STATE_HOME"] = str(tmp_path / "xdg")
    log, _ = run_until_healthy([], env, cwd, port)
    assert (tmp_path / "xdg" / "lmcached" / "coordinator.db").is_file(), log
    (tmp_path / "systemd").mkdir()
    env["STATE_DIRECTORY"] = str(tmp_path / "systemd")
    log, _ = run_until_healthy([], env, cwd, port)
    assert (tmp_path / "systemd" / "coordinator.db").is_file(), log
    env[P + "DB_PATH"] = str(tmp_path / "named.db")
    log, _ = run_until_healthy([], env, cwd, port)
    assert (tmp_path / "named.db").is_file(), log
    assert os.listdir(cwd) == ["coord.log"], os.listdir(cwd)


def test_version_process_metrics_and_first_log_lines(tmp_path):
    """Issue 31: /version, /lmc_version and /commit_id as lmcached answers
    them, process_* metrics, a first log line with version and commit, and
    one "listening" line."""
    from lmc.server import free_port
    port = free_port()
    env = bare_env(tmp_path, **{P + "PORT": str(port), P + "HOST": "127.0.0.1",
                                P + "DB_PATH": str(tmp_path / "c.db"),
                                P + "ENABLE_STARTUP_RESYNC": "false"})
    before = time.time()
    log, (version, commit, metrics) = run_until_healthy(
        [], env, tmp_path, port, ("/version", "/commit_id", "/metrics"))
    version, commit = json.loads(version), json.loads(commit)
    cli = subprocess.run([COORDINATOR, "--version"], capture_output=True, text=True, timeout=10)
    # "lmcached-coordinator 0.1.0 (commit abc123def456)"
    ver, com = cli.stdout.split()[1], cli.stdout.split()[3].rstrip(")")
    assert version == f"{ver}-{com}" and commit == ("" if com == "NA" else com), (version, cli)
    lines = log.splitlines()
    assert f"lmcached-coordinator {ver} (commit {com}), database {tmp_path / 'c.db'}" in lines[0]
    listening = [line for line in lines if "listening" in line]
    assert len(listening) == 1 and f"http://127.0.0.1:{port}" in listening[0], lines
    values = {line.split()[0]: float(line.split()[1]) for line in metrics.splitlines()
              if line.startswith("process_")}
    assert values["process_resident_memory_bytes"] > 1 << 20, values
    assert 0 <= values["process_cpu_seconds_total"] < 60
    assert 3 <= values["process_open_fds"] <= values["process_max_fds"]
    assert before - 5 <= values["process_start_time_seconds"] <= time.time() + 1


def test_json_log_lines_and_bad_logging_variables(tmp_path):
    """Issue 31: LMCACHE_LOG_FORMAT=json as lmcached writes it, ISO-8601 times
    with the zone's offset in both formats; a bad level or format refuses the
    start, naming the variable."""
    import re
    from lmc.server import free_port
    iso = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}[+-]\d\d:\d\d"
    port = free_port()
    env = bare_env(tmp_path, **{P + "PORT": str(port), P + "HOST": "127.0.0.1",
                                P + "DB_PATH": str(tmp_path / "c.db"), "TZ": "America/New_York",
                                P + "ENABLE_STARTUP_RESYNC": "false", "LMCACHE_LOG_FORMAT": "json"})
    log, _ = run_until_healthy([], env, tmp_path, port)
    records = [json.loads(line) for line in log.splitlines()]
    assert records[0]["message"].startswith("lmcached-coordinator ")
    assert all(re.fullmatch(iso, r["time"]) and r["time"][-6:] in ("-05:00", "-04:00")
               for r in records), records
    env.pop("LMCACHE_LOG_FORMAT")
    log, _ = run_until_healthy([], env, tmp_path, port)
    assert re.match(r"\[" + iso + r"\] INFO ", log.splitlines()[0]), log
    for name, value in (("LMCACHE_LOG_FORMAT", "xml"), ("LMCACHE_LOG_LEVEL", "loud")):
        r = subprocess.run([COORDINATOR], env={**env, name: value}, capture_output=True,
                           text=True, timeout=10)
        assert r.returncode == 2 and f"{name}={value}" in r.stderr, r


# ---- --config and --print-config ----------------------------------------------------

def test_config_file_and_print_config(tmp_path):
    from lmc.server import free_port
    port = free_port()
    conf = tmp_path / "coord.json"
    conf.write_text(json.dumps({"port": port, "host": "127.0.0.1", "db_path": str(tmp_path / "f.db"),
                                "auth_token": "s3cret", "eviction_ratio": 0.5,
                                "enable_startup_resync": False}))
    env = bare_env(tmp_path, **{P + "EVICTION_RATIO": "0.25"})
    r = subprocess.run([COORDINATOR, "--config", str(conf), "--print-config"], env=env,
                       capture_output=True, text=True, timeout=10)
    assert r.returncode == 0, r.stderr
    printed = json.loads(r.stdout)
    assert printed["port"] == port and printed["eviction_ratio"] == 0.25   # env over file
    assert printed["auth_token"] == "***" and "s3cret" not in r.stdout
    assert printed["db_path"] == str(tmp_path / "f.db")
    assert not (tmp_path / "f.db").exists()                 # printing starts nothing
    assert set(printed) >= {"host", "instance_timeout", "chunk_size", "hash_algorithm",
                            "max_keys", "max_buffered_mb", "server_auth_token", "metrics_enabled"}
    log, _ = run_until_healthy(["--config", str(conf)], env, tmp_path, port)
    assert (tmp_path / "f.db").is_file()
    assert f"settings from --config {conf}" in log.splitlines()[0]
    # Refusals name the file and the key; exit 1, one line.
    for text, why in (('{"prot": 1}', 'unknown key "prot"'),
                      ('{"port": "9300"}', '"port" must be an integer'),
                      ('{"port": 70000}', "port=70000 is not an integer in 0..65535"),
                      ('{"metrics_enabled": "yes"}', '"metrics_enabled" must be a boolean'),
                      ('{"port": 1,', "--config")):
        conf.write_text(text)
        r = subprocess.run([COORDINATOR, "--config", str(conf)], env=env, capture_output=True,
                           text=True, timeout=10)
        assert r.returncode == 1 and str(conf) in r.stderr and why in r.stderr, (text, r.stderr)
        assert len(r.stderr.splitlines()) == 1, r.stderr
    r = subprocess.run([COORDINATOR, "--config"], env=env, capture_output=True, text=True,
                       timeout=10)
    assert r.returncode == 2 and "--config needs a FILE" in r.stderr


# ---- the quota replies beside lmcached's ---------------------------------------------

def test_quota_replies_carry_lmcached_field_names(tmp_path, started):
    """Issue 31: lmcached's and the coordinator's /quota replies named the
    same facts differently.  The coordinator keeps upstream's coordinator
    names and carries lmcached's beside them, with the same values: every
    field lmcached answers on a path, the coordinator answers too."""
    import http.client
    from lmc.server import start_http
    srv = started(start_http())
    coord = started(Coordinator(tmp_path / "coord.db"))

    def server(method, path, body=None):
        c = http.client.HTTPConnection("127.0.0.1", srv.http_port, timeout=10)
        c.request(method, path, body=json.dumps(body) if body is not None else None)
        r = c.getresponse()
        out = (r.status, json.loads(r.read()))
        c.close()
        return out

    calls = [("PUT", "/quota/tenant-a", {"limit_gb": 2}),
             ("PUT", "/quota/_default", {"limit_gb": 0.5}),
             ("GET", "/quota/tenant-a", None), ("GET", "/quota/_default", None),
             ("GET", "/quota/nobody", None), ("GET", "/quota", None),
             ("DELETE", "/quota/tenant-a", None), ("DELETE", "/quota/tenant-a", None)]
    for method, path, body in calls:
        (s1, mine), (s2, theirs) = server(method, path, body), coord.call(method, path, body)
        assert s1 == s2 == 200, (path, mine, theirs)
        missing = set(mine) - set(theirs)
        assert not missing, (method, path, missing, mine, theirs)
        for k in mine:
            if k == "users":
                assert theirs[k] == mine[k], (path, mine, theirs)
            elif k != "enforced":   # lmcached: an IsolatedLRU adapter; here: the loop
                assert theirs[k] == mine[k], (method, path, k, mine, theirs)
    st, r = coord.call("GET", "/quota/_default")
    assert (r["quota_limit_gb"], r["quota_exists"], r["usage_gb"]) == (0.5, True, 0.0)
    st, r = coord.call("PUT", "/quota/x", {"limit_gb": 1})
    assert r["enforced"] is True                        # EVICTION_CHECK_INTERVAL > 0
