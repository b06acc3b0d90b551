"""Shared fixtures: start the real lmcached binary (lmc/server.py) and
talk to it over ZMQ the way upstream's DEALER clients do (lmc/client.py).
The names below lmc's are imported here too, for the code outside
tests/e2e that takes them from conftest (tests/reliability/rel_common.py)."""
import os

import pytest

from lmc.client import Dealer  # noqa: F401
from lmc.server import (BASE_ARGS, CLI, LMCACHED, ROOT, Server, finish,  # noqa: F401
                        free_port, run_cli, run_lmcached, start_http)


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


@pytest.fixture
def server():
    s = Server()
    yield s
    finish(s)


@pytest.fixture
def start_server():
    """start_server(*args, **kw): a Server, finished after the test."""
    started = []

    def start(*args, **kw):
        s = Server(*args, **kw)
        started.append(s)
        return s

    yield start
    for s in started:
        finish(s)


def _module_server(request, start_server, *more):
    m = request.module
    env = m.server_env() if hasattr(m, "server_env") else None
    return start_server(*getattr(m, "SERVER_ARGS", ()), *more, env=env)


@pytest.fixture
def srv(request, start_server):
    """The server of the test's module: started with the module's
    SERVER_ARGS, and the environment variables its server_env() returns
    where it has one (which may skip the test)."""
    return _module_server(request, start_server)


@pytest.fixture
def hint_srv(request, start_server):
    """srv, reading vLLM tensors by the registration's layout hint."""
    return _module_server(request, start_server, "--cpu-kv-layout", "hint")


@pytest.fixture(scope="module")
def module_server():
    """module_server(*args, env=None): a Server whose HTTP frontend
    answers, shared by the module's tests that ask for the same args and
    env, finished after the module."""
    started = {}

    def start(*args, env=None):
        k = (args, tuple(sorted((env or {}).items())))
        if k not in started:
            started[k] = start_http(*args, env=env)
        return started[k]

    yield start
    for s in started.values():
        finish(s)


@pytest.fixture(scope="module")
def http_server(module_server):
    """The module's plain server, its HTTP frontend answering."""
    return module_server()


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
