"""Fixtures of the upstream-partner suite: the real lmcached, and upstream
LMCache's own client code from the pinned PyPI package
(tests/upstream/README.md).  Runs on build-tools/venv's python."""
import importlib.util
import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

# The e2e suite's server launcher and its CI rule (a skip is a failure
# under CI=true), shared rather than repeated; its conftest imports the
# protocol helper package tests/e2e/lmc.
sys.path.insert(0, os.path.join(ROOT, "tests", "e2e"))
_spec = importlib.util.spec_from_file_location("e2e_conftest",
                                               os.path.join(ROOT, "tests", "e2e", "conftest.py"))
e2e = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(e2e)
pytest_runtest_makereport = e2e.pytest_runtest_makereport
start_server = e2e.start_server
Server = e2e.Server
free_port = e2e.free_port

PINNED = "0.5.6"


def _import_upstream():
    """Upstream's package, or a failure that says why (a skip outside CI)."""
    try:
        import compat
        compat.prepare()
        import lmcache
    except (ImportError, RuntimeError, OSError) as e:
        why = f"upstream lmcache is not importable ({e}); `make deps-test` installs it"
        if os.environ.get("CI") == "true":
            pytest.fail(why)
        pytest.skip(why)
    assert lmcache.__version__ == PINNED, \
        f"lmcache {lmcache.__version__} is installed, tests/requirements.txt pins {PINNED}"
    return lmcache


@pytest.fixture(scope="session")
def upstream():
    return _import_upstream()


@pytest.fixture
def lmcached(upstream, start_server):
    """Starts lmcached servers (the e2e suite's start_server: each must
    still serve and exit cleanly at teardown, unless the test stopped it),
    once upstream's package is importable."""
    return start_server
