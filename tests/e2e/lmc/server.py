"""Starting and ending the real lmcached binary (and running it and the
CLI to completion); conftest.py makes fixtures of it."""
import http.client
import json
import os
import signal
import socket
import subprocess
import time

import msgpack
import zmq

from lmc.client import Dealer
from lmc.ops import NOOP

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
LMCACHED = os.environ.get("LMCACHED_BIN", os.path.join(ROOT, "build", "lmcached"))
CLI = os.environ.get("LMCACHE_CLI_BIN", os.path.join(ROOT, "build", "lmcache-cli"))

# Small L1 so that tests never commit much memory.
BASE_ARGS = ["--l1-size-gb", "0.0625", "--eviction-policy", "LRU", "--log-level", "INFO"]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """lmcached on free loopback ports (ZMQ and HTTP), started with
    BASE_ARGS + args and ready once it answers NOOP.  env: variables set
    for it on top of this process's environment."""
    START_ATTEMPTS = 3

    def __init__(self, *extra_args, port=None, env=None):
        self.ctx = zmq.Context()
        self.env = {**os.environ, **env} if env else None
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
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT, env=self.env)

    def _wait_ready(self):
        d = self.dealer()
        try:
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"lmcached exited {self.proc.returncode}: {self.output()}")
                if d.call(NOOP, timeout_ms=200) is not None:
                    return
            raise RuntimeError("lmcached did not answer NOOP within 20 s")
        finally:
            d.close()

    def wait_l1_prefault(self, timeout=20):
        """Waits until the L1 pre-fault after start is over (docs/storage.md,
        "Pre-fault"): until then the L1's capacity grows as it commits.
        Returns the status document that saw it over."""
        deadline = time.monotonic() + timeout
        while True:
            conn = http.client.HTTPConnection("127.0.0.1", self.http_port, timeout=5)
            try:
                conn.request("GET", "/status")
                status = json.loads(conn.getresponse().read())
            finally:
                conn.close()
            if status["storage_manager"]["l1_arena"]["prefault"]["state"] != "running":
                return status
            if time.monotonic() > deadline:
                raise RuntimeError("the L1 pre-fault did not end within %s s" % timeout)
            time.sleep(0.02)

    def dealer(self, routing_id=None):
        return Dealer(self.ctx, self.url, routing_id)

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
    if not s.alive():
        # The test's own sockets may still be open: a context terminated at
        # exit would wait for them forever instead of failing the test.
        s.ctx.destroy(linger=0)
        raise AssertionError(f"lmcached died during the test (exit {s.proc.returncode}):\n" +
                             s.output()[-4000:])
    d = s.dealer()
    try:
        reply = d.call(NOOP, timeout_ms=5000)
    finally:
        d.close()
    assert reply is not None and reply[2] == msgpack.packb("OK"), \
        "lmcached stopped answering NOOP:\n" + s.output()[-4000:]
    rc = s.stop()
    assert rc == 0, s.output()


def answers_http(port, deadline_s=5.0):
    """Whether GET /healthcheck on port is answered (200 or 503) within
    deadline_s."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
        try:
            conn.request("GET", "/healthcheck")
            return conn.getresponse().status in (200, 503)
        except OSError:
            time.sleep(0.1)
        finally:
            conn.close()
    return False


def start_http(*args, env=None):
    """A Server whose HTTP frontend answers; a test that cannot get one
    fails with the server's output."""
    import pytest  # here: the rest of this module does not need pytest
    s = Server(*args, env=env)
    if not answers_http(s.http_port):
        s.stop()
        pytest.fail("lmcached does not answer HTTP: " + s.output())
    return s


def l2_args(spec):
    """The --l2-adapter flag of the L2 adapter spec (a dict)."""
    return ["--l2-adapter", json.dumps(spec)]


def l2_fs_args(path):
    """The --l2-adapter flag of an fs L2 at path."""
    return l2_args({"type": "fs", "base_path": str(path)})


def run_lmcached(*args, timeout=20, env=None):
    """Runs lmcached to completion (for flag errors); returns CompletedProcess."""
    return subprocess.run([LMCACHED, *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **env} if env else None)


def run_cli(*args, timeout=30):
    return subprocess.run([CLI, *args], capture_output=True, text=True, timeout=timeout)
