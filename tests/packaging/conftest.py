"""Fixtures of the packaging tests (docs/deploy.md): the .deb the
Makefile makes from the build as it is (`make deb-package`), unpacked into
a scratch root with `dpkg -x`, and the tools the checks need.  ctest runs
them as `packaging`, with LMC_BUILD_DIR naming the build."""
import importlib.util
import os
import re
import shutil
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
BUILD = os.path.abspath(os.environ.get("LMC_BUILD_DIR", os.path.join(ROOT, "build")))

# The e2e suite's protocol helper (tests/e2e/lmc) and its CI rule: a skip
# is a failure under CI=true (docs/testing.md).
sys.path.insert(0, os.path.join(ROOT, "tests", "e2e"))
_spec = importlib.util.spec_from_file_location("e2e_conftest",
                                               os.path.join(ROOT, "tests", "e2e", "conftest.py"))
_e2e = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_e2e)
pytest_runtest_makereport = _e2e.pytest_runtest_makereport


def version():
    """CMake's project version, the package's version."""
    with open(os.path.join(ROOT, "CMakeLists.txt")) as f:
        return re.search(r"^project\(lmcached VERSION ([0-9.]+)", f.read(), re.M).group(1)


def need(tool):
    """The path of a tool the check needs; a skip (a failure under CI)
    without it.  `make deps-test` installs every one (Makefile DEB_TEST)."""
    path = shutil.which(tool)
    if not path:
        pytest.skip(f"{tool} is not installed; `make deps-test` installs it")
    return path


def clean_env(**more):
    """This environment without what an outer `make test` passes to the
    makes the tests run (its command-line variables, its jobserver)."""
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    return {**env, **more}


def run(args, timeout=120, **kw):
    kw.setdefault("env", clean_env())
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, **kw)


@pytest.fixture(scope="session")
def deb(tmp_path_factory):
    """The .deb `make deb-package` makes from the build (the path it prints
    last), in a scratch DIST_DIR."""
    for tool in ("dpkg-deb", "dpkg-shlibdeps", "dpkg-gencontrol", "help2man"):
        need(tool)
    dist = tmp_path_factory.mktemp("dist")
    r = run(["make", "--no-print-directory", "deb-package", f"BUILD_DIR={BUILD}",
             f"DIST_DIR={dist}"], cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    path = r.stdout.strip().splitlines()[-1]
    assert os.path.dirname(path) == str(dist), r.stdout
    return path


@pytest.fixture(scope="session")
def deb_root(deb, tmp_path_factory):
    """The package unpacked into a scratch root (`dpkg -x`)."""
    root = tmp_path_factory.mktemp("root")
    r = run(["dpkg-deb", "-x", deb, str(root)])
    assert r.returncode == 0, r.stderr
    return root
