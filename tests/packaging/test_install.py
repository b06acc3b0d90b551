"""`make install` (PREFIX, DESTDIR) and the systemd units it installs
(docs/deploy.md, "Build and install" and "The systemd units"): the files
under the prefix, the units' paths, their hardening, and
`systemd-analyze verify` on them."""
import os
import re

import pytest

from conftest import BUILD, ROOT, clean_env, need, run, version

PREFIX = "/opt/lmc"


@pytest.fixture(scope="module")
def staged(tmp_path_factory):
    need("help2man")
    dest = tmp_path_factory.mktemp("destdir")
    r = run(["make", "--no-print-directory", "install-files", f"BUILD_DIR={BUILD}",
             f"DESTDIR={dest}", f"PREFIX={PREFIX}"], cwd=ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    return dest


def unit(path):
    """A unit file's settings: {section: {key: [values]}} (a key may repeat)."""
    out = {}
    section = None
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            if line.startswith("["):
                section = out.setdefault(line.strip("[]"), {})
                continue
            key, value = line.split("=", 1)
            section.setdefault(key, []).append(value)
    return out


def test_install_puts_the_files_under_destdir_and_prefix(staged):
    top = staged / PREFIX.lstrip("/")
    assert os.readlink(top / "bin" / "lmcached") == "../lib/lmcached/lmcached"
    for b in ("lmcached", "lmcached-coordinator", "lmcache-cli"):
        assert run([str(top / "bin" / b), "--version"]).stdout.startswith(f"{b} {version()}")
        assert (top / "share" / "man" / "man1" / f"{b}.1.gz").is_file()
    svc = unit(top / "lib" / "systemd" / "system" / "lmcached.service")["Service"]
    assert svc["ExecStart"] == [f"{PREFIX}/bin/lmcached $LMCACHED_ARGS"]
    assert svc["EnvironmentFile"] == [f"-{PREFIX}/etc/default/lmcached"]
    coord = unit(top / "lib" / "systemd" / "system" / "lmcached-coordinator.service")["Service"]
    assert coord["ExecStart"] == [f"{PREFIX}/bin/lmcached-coordinator"]
    assert (top / "etc" / "default" / "lmcached").is_file()
    assert (top / "share" / "doc" / "lmcached" / "deploy.md").is_file()


def test_install_again_keeps_the_administrators_settings(staged):
    settings = staged / PREFIX.lstrip("/") / "etc" / "default" / "lmcached"
    settings.write_text('LMCACHED_ARGS="--l1-size-gb 64 --eviction-policy ARC"\n')
    r = run(["make", "--no-print-directory", "install-files", f"BUILD_DIR={BUILD}",
             f"DESTDIR={staged}", f"PREFIX={PREFIX}"], cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert "--l1-size-gb 64" in settings.read_text()


def test_server_unit_hardening_and_gpu_limits(deb_root):
    svc = unit(deb_root / "lib" / "systemd" / "system" / "lmcached.service")["Service"]
    expected = {"DynamicUser": "yes", "ProtectSystem": "strict", "ProtectHome": "yes",
                "PrivateTmp": "yes", "NoNewPrivileges": "yes", "LimitMEMLOCK": "infinity",
                "CapabilityBoundingSet": "", "KillSignal": "SIGTERM", "StateDirectory": "lmcached"}
    for key, value in expected.items():
        assert svc.get(key) == [value], key
    # /dev/shm holds the pool and the GPU path opens /dev/nvidia*: no
    # private /dev (docs/deploy.md, "The systemd units").
    assert "PrivateDevices" not in svc and "PrivateIPC" not in svc
    assert svc["Environment"] == ['"LMCACHED_ARGS=--l1-size-gb 8 --eviction-policy LRU"']


def test_coordinator_unit_keeps_its_database_in_its_state_directory(deb_root):
    svc = unit(deb_root / "lib" / "systemd" / "system" / "lmcached-coordinator.service")["Service"]
    assert svc["StateDirectory"] == ["lmcached-coordinator"]
    assert svc["Environment"] == [
        "LMCACHE_MP_COORDINATOR_DB_PATH=%S/lmcached-coordinator/coordinator.db"]
    assert svc["DynamicUser"] == ["yes"] and svc["ProtectSystem"] == ["strict"]


def rooted_units(deb_root, tmp_path):
    """The package's units with their /usr/bin paths pointing into the
    scratch root, so that systemd-analyze finds the binaries."""
    paths = []
    for name in ("lmcached.service", "lmcached-coordinator.service"):
        text = (deb_root / "lib" / "systemd" / "system" / name).read_text()
        path = tmp_path / name
        path.write_text(text.replace("/usr/bin/", f"{deb_root}/usr/bin/"))
        paths.append(str(path))
    return paths


def test_units_pass_systemd_analyze_verify(deb_root, tmp_path):
    """verify: every directive known, the binaries there, the man pages of
    Documentation= found (MANPATH: the package's)."""
    analyze = need("systemd-analyze")
    env = clean_env(MANPATH=str(deb_root / "usr" / "share" / "man"))
    units = rooted_units(deb_root, tmp_path)
    r = run([analyze, "verify", *units], env=env)
    assert r.returncode == 0 and not (r.stdout + r.stderr).strip(), r.stdout + r.stderr
    # A directive systemd does not know is only a message (status 0), which
    # the check above counts as a failure.
    bad = tmp_path / "bad" / "lmcached.service"
    bad.parent.mkdir()
    bad.write_text(open(units[0]).read().replace("ProtectClock=", "ProtectClocks="))
    r = run([analyze, "verify", str(bad)], env=env)
    assert "Unknown key 'ProtectClocks'" in r.stdout + r.stderr, r.stdout + r.stderr


def test_units_exposure_is_what_the_docs_say(deb_root, tmp_path):
    """systemd-analyze security's rating of each unit is the one
    docs/deploy.md gives ("The systemd units"), and "OK"."""
    analyze = need("systemd-analyze")
    with open(os.path.join(ROOT, "docs", "deploy.md")) as f:
        doc = re.search(r"rates them ([0-9.]+) \(lmcached\) and ([0-9.]+) \(the coordinator\)",
                        " ".join(f.read().split()))
    for path, documented in zip(rooted_units(deb_root, tmp_path), doc.groups()):
        r = run([analyze, "security", "--offline=yes", path])
        last = r.stdout.strip().splitlines()[-1]
        assert re.search(rf"Overall exposure level for \S+: {re.escape(documented)} OK", last), \
            (path, last)
