"""What the reliability scenarios (run.py) and the soak (soak.py) share:
the e2e fixtures' server and DEALER (tests/e2e/conftest.py), the
engine-driven worker of tests/e2e/test_lookup_engine_driven.py, and
readers of the server's /status, /metrics and /proc entries."""
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tests", "e2e"))

from conftest import LMCACHED, Dealer, Server, free_port  # noqa: E402,F401
# Ready only once the Redis on the port is this one (tests/e2e/redis_server.py).
from redis_server import start_redis, start_redis_fresh  # noqa: E402,F401
from lmc.ops import (CLEAR, COMMIT_RETRIEVE, COMMIT_STORE, END_SESSION,  # noqa: E402,F401
                     LOOKUP, NOOP, PING, PREPARE_RETRIEVE, PREPARE_STORE,
                     QUERY_PREFETCH_STATUS, REGISTER_KV_CACHE_ENGINE_DRIVEN_CONTEXT,
                     WAIT_PREFETCH_STATUS)
from test_lookup_engine_driven import (CS, OBJ, Worker, chunk_bytes, key,  # noqa: E402,F401
                                       payload, prompt, unpack)


class Broken(AssertionError):
    """A promise a scenario checks did not hold."""


def check(cond, what):
    if not cond:
        raise Broken(what)


# ---- the server's own view ---------------------------------------------------

def http(srv, method, path, body=None, headers=None, timeout=10):
    """(status, body bytes) of one request to srv's HTTP frontend."""
    if isinstance(body, (dict, list)):
        body = json.dumps(body).encode()
        headers = {"Content-Type": "application/json", **(headers or {})}
    req = urllib.request.Request(f"http://127.0.0.1:{srv.http_port}{path}", data=body,
                                 method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def status(srv):
    code, body = http(srv, "GET", "/status")
    check(code == 200, f"/status answered {code}: {body[:200]!r}")
    return json.loads(body)


def l1(st):
    return st["storage_manager"]["l1_manager"]


class BooksWatch:
    """Reads of the L1 books check (docs/storage.md, "Invariants"): each
    /status read runs it; `books_checks` counts the runs."""

    def __init__(self):
        self.reads = 0
        self.first_checks = None
        self.last_checks = None
        self.violations = 0
        self.unhealthy = 0
        self.not_growing = 0

    def read(self, srv):
        st = status(srv)
        m = l1(st)
        self.reads += 1
        checks = m["books_checks"]
        if self.last_checks is not None and checks <= self.last_checks:
            self.not_growing += 1
        if self.first_checks is None:
            self.first_checks = checks
        self.last_checks = checks
        self.violations = max(self.violations, m["invariant_violations"])
        # An L2 server killed on purpose makes its adapter, and so /status,
        # unhealthy (docs/l2.md, "Health"); the books are what this watches.
        l2_down = any(a.get("is_healthy") is False
                      for a in st.get("storage_manager", {}).get("l2_adapters", []))
        self.unhealthy += not ((st["is_healthy"] or l2_down) and m["is_healthy"])
        return st

    def assert_ok(self):
        check(self.reads > 0, "the L1 books were never read")
        check(self.violations == 0, f"{self.violations} L1 invariant violations")
        check(self.unhealthy == 0, f"{self.unhealthy} /status reads said unhealthy")
        check(self.not_growing == 0, f"books_checks did not grow in {self.not_growing} reads")

    def summary(self):
        return (f"{self.reads} reads, books_checks {self.first_checks}->{self.last_checks}, "
                f"violations {self.violations}")


def metrics(srv):
    """{series: value} of /metrics."""
    code, body = http(srv, "GET", "/metrics")
    check(code == 200, f"/metrics answered {code}")
    out = {}
    for line in body.decode().splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            try:
                out[name] = float(value)
            except ValueError:
                pass
    return out


def alive(srv):
    """The server answers a NOOP on a fresh DEALER and /healthcheck."""
    if not srv.alive():
        return False
    d = srv.dealer()
    try:
        r = d.call(NOOP, timeout_ms=5000)
    finally:
        d.close()
    return r is not None and r[2] == b"\xa2OK" and http(srv, "GET", "/healthcheck")[0] == 200


# ---- the process, from outside -----------------------------------------------

def rss_kib(pid, field="VmRSS"):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def fd_count(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


def thread_count(pid):
    return len(os.listdir(f"/proc/{pid}/task"))


# ---- round trips through the engine-driven path --------------------------------

def round_trip(srv, seed, instance_id=4242, world_size=1):
    """Stores a fresh 4-chunk prompt, looks it up and retrieves it on a new
    worker; raises Broken unless every byte comes back."""
    w = Worker(srv, instance_id, 0, world_size=world_size)
    sched = srv.dealer()
    try:
        toks = prompt(seed)
        ctx = w.store(toks, 0, len(toks))
        check(len(ctx["slots"]) in (0, 4), f"PREPARE_STORE gave {len(ctx['slots'])} slots")
        rid = f"rt-{seed}"
        check(sched.call(LOOKUP, key(toks, 0, len(toks), rid, world_size=world_size), 1)
              is not None, "LOOKUP got no reply")
        hits = unpack(sched.call(WAIT_PREFETCH_STATUS, rid, 10.0, timeout_ms=15000))
        check(hits == 4, f"round trip: {hits} hits of 4")
        got = w.retrieve(toks, 0, len(toks), rid)
        check(got == [chunk_bytes(0, toks, c) for c in range(4)], "round trip: wrong bytes back")
        sched.call(END_SESSION, rid)
    finally:
        w.close()
        sched.close()


# ---- real servers the scenarios start ------------------------------------------

def git_commit():
    """The short hash of HEAD, with "+" when the tree differs from it."""
    try:
        head = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", ROOT, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True).stdout.strip()
        return head + ("+" if dirty else "") if head else "unknown"
    except OSError:
        return "unknown"


def ci():
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def have_redis():
    return shutil.which("redis-server") is not None


def kill(proc):
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
    proc.wait()
