"""Shared fixtures: start the real lmcached binary and talk to it over ZMQ
the way upstream's DEALER clients do."""
import os
import signal
import socket
import subprocess
import time

import msgpack
import pytest
import zmq

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LMCACHED = os.environ.get("LMCACHED_BIN", os.path.join(ROOT, "build", "lmcached"))
CLI = os.environ.get("LMCACHE_CLI_BIN", os.path.join(ROOT, "build", "lmcache-cli"))

# Small L1 so that tests never commit much memory.
BASE_ARGS = ["--l1-size-gb", "0.0625", "--eviction-policy", "LRU", "--log-level", "INFO"]


# A skip is not a pass: under CI=true a test that skips (a real server or
# tool missing, a privilege lacking) fails the run instead, so CI never goes
# green on a check that did not run (docs/testing.md).
@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if os.environ.get("CI") == "true" and report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        report.outcome = "failed"
        report.longrepr = f"skipped under CI=true, which counts as a failure: {reason}"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Dealer:
    """A DEALER socket speaking the MP framing: [uid, op, payload...]."""

    def __init__(self, ctx, url):
        self.sock = ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(url)
        self.uid = 0

    def send(self, op, *payload, raw=None):
        """Sends op (int id or str name) with msgpack-encoded payload
        frames, or with `raw` pre-encoded frames.  Returns the uid used."""
        uid = self.uid
        self.uid += 1
        frames = [msgpack.packb(uid), msgpack.packb(op)]
        frames += raw if raw is not None else [msgpack.packb(p, use_bin_type=True) for p in payload]
        self.sock.send_multipart(frames)
        return uid

    def recv(self, timeout_ms=5000):
        if not self.sock.poll(timeout_ms):
            return None
        return self.sock.recv_multipart()

    def call(self, op, *payload, timeout_ms=5000, raw=None):
        """Returns the reply frames for this request, or None on timeout."""
        uid = self.send(op, *payload, raw=raw)
        deadline = time.monotonic() + timeout_ms / 1000
        while True:
            left = int((deadline - time.monotonic()) * 1000)
            if left <= 0:
                return None
            frames = self.recv(left)
            if frames is None:
                return None
            try:
                if msgpack.unpackb(frames[0]) == uid:
                    return frames
            except ValueError:
                pass  # a reply to a garbage request whose uid was not msgpack

    def close(self):
        self.sock.close(0)


class Server:
    START_ATTEMPTS = 3

    def __init__(self, *extra_args, port=None):
        self.ctx = zmq.Context()
        for attempt in range(self.START_ATTEMPTS):
            self._spawn(extra_args, port)
            try:
                self._wait_ready()
                return
            except RuntimeError:
                # free_port() can only say a port was free a moment ago: under
                # ctest -j another test may bind it first. Try fresh ports.
                if (attempt + 1 == self.START_ATTEMPTS or self.proc.poll() is None or
                        "Address already in use" not in self.output()):
                    raise
                self.log.close()

    def _spawn(self, extra_args, port):
        self.port = port or free_port()
        self.http_port = free_port()
        self.url = f"tcp://127.0.0.1:{self.port}"
        args = [LMCACHED, "--host", "127.0.0.1", "--port", str(self.port),
                "--http-host", "127.0.0.1", "--http-port", str(self.http_port)]
        args += BASE_ARGS + list(extra_args)  # a later --host wins
        self.log_path = f"/tmp/lmcached-e2e-{self.port}.log"
        self.log = open(self.log_path, "w+b")
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT)

    def _wait_ready(self):
        d = self.dealer()
        try:
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"lmcached exited {self.proc.returncode}: {self.output()}")
                if d.call(24, timeout_ms=200) is not None:
                    return
            raise RuntimeError("lmcached did not answer NOOP within 20 s")
        finally:
            d.close()

    def dealer(self):
        return Dealer(self.ctx, self.url)

    def output(self):
        if not self.log.closed:
            self.log.flush()
        with open(self.log_path, "rb") as f:
            return f.read().decode(errors="replace")

    def alive(self):
        return self.proc.poll() is None

    def stop(self, sig=signal.SIGTERM, timeout=20):
        self.stopped = True   # by the test itself: the fixture accepts any exit
        if self.proc.poll() is None:
            # The signal a test stopped it with, for fixtures that check at
            # teardown that nothing else ended it (test_fleet.py).
            self.stop_signal = getattr(self, "stop_signal", None) or sig
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if not self.log.closed:
            self.ctx.destroy(linger=0)
            self.log.close()
        return self.proc.returncode


def finish(s):
    """Ends a server a fixture started: unless the test stopped it itself,
    it must still be running (a crash never passes), answer NOOP, and exit 0
    on SIGTERM (no sanitizer report, no leak of its own)."""
    if getattr(s, "stopped", False):
        s.stop()
        return
    assert s.alive(), f"lmcached died during the test (exit {s.proc.returncode}):\n" + \
        s.output()[-4000:]
    d = s.dealer()
    try:
        reply = d.call(24, timeout_ms=5000)
    finally:
        d.close()
    assert reply is not None and reply[2] == msgpack.packb("OK"), \
        "lmcached stopped answering NOOP:\n" + s.output()[-4000:]
    rc = s.stop()
    assert rc == 0, s.output()


@pytest.fixture
def server():
    s = Server()
    yield s
    finish(s)


@pytest.fixture
def start_server():
    started = []

    def start(*args, **kw):
        s = Server(*args, **kw)
        started.append(s)
        return s

    yield start
    for s in started:
        finish(s)


def run_lmcached(*args, timeout=20):
    """Runs lmcached to completion (for flag errors); returns CompletedProcess."""
    return subprocess.run([LMCACHED, *args], capture_output=True, text=True, timeout=timeout)


def run_cli(*args, timeout=30):
    return subprocess.run([CLI, *args], capture_output=True, text=True, timeout=timeout)


# /dev/shm segments the tests create (paged_kv.py registers each one): the
# ones a test leaves are unlinked after it, so a test that fails before its
# close() does not leave them in /dev/shm (270 MB for the largest), and a
# test that passed but left any fails, so leaking ones do not go unseen.
@pytest.fixture(autouse=True)
def _dev_shm_segments_unlinked(request):
    failed_before = request.session.testsfailed
    yield
    import sys  # here, to keep this block apart from the rest of the file
    paged_kv = sys.modules.get("paged_kv")     # not imported: nothing created
    left = paged_kv.unlink_leftovers() if paged_kv else []
    # The call's report is counted before the teardown: a failed test is
    # not blamed twice for what its failure left.
    if left and request.session.testsfailed == failed_before:
        pytest.fail(f"the test left {len(left)} /dev/shm segment(s) it created: "
                    f"{', '.join(left)}")
