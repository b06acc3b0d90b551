"""Every command of docs/deploy.md ("How this page is tested" there): the
`sh` blocks run, each `## ` section as one bash script, with the package's
binaries on the PATH, the well-known ports replaced by free ones and the
L1 made small; the engine blocks are checked against the server the page
starts; the `sh system` blocks' names are checked against the package and
the repository."""
import os
import re
import shlex
import signal
import subprocess

import yaml

from conftest import BUILD, ROOT, clean_env, run, version
from deploy_doc import (blocks, commands, flag, one_node_server, sglang_command, sglang_file,
                        vllm_config)
from lmc.server import free_port

PORTS = ("5555", "5556", "8080", "8081", "9300")
SMALL_L1 = "0.0625"


def localize(text, ports):
    text = re.sub(r"(?<![0-9])(%s)(?![0-9])" % "|".join(PORTS), lambda m: ports[m.group(1)], text)
    return re.sub(r"--l1-size-gb [0-9.]+", f"--l1-size-gb {SMALL_L1}", text)


def bash(script, cwd, env, timeout=45):
    """Runs script with bash in its own process group; whatever it left
    running is ended with it."""
    head = "set -euo pipefail\ntrap 'kill $(jobs -p) 2>/dev/null || true' EXIT\n"
    proc = subprocess.Popen(["bash", "-c", head + script], cwd=cwd, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        raise AssertionError(f"timed out after {timeout} s:\n{script}\n{out}")
    return proc.returncode, out


def deb_name():
    arch = run(["dpkg", "--print-architecture"]).stdout.strip()
    return f"lmcached_{version()}_{arch}.deb"


def test_the_engines_are_pointed_at_the_server_the_page_starts():
    host, port = one_node_server()
    cfg = vllm_config()
    assert cfg["kv_connector"] == "LMCacheMPConnector" and cfg["kv_role"] == "kv_both"
    extra = cfg["kv_connector_extra_config"]
    assert extra["lmcache.mp.host"] == f"tcp://{host}" and extra["lmcache.mp.port"] == port
    path, text = sglang_file()
    assert yaml.safe_load(text) == {"mp_host": host, "mp_port": port}
    cmd = sglang_command()
    assert "--enable-unified-lmcache" in cmd and flag(cmd, "--lmcache-config-file") == path


def test_the_sh_blocks_run(tmp_path):
    ports = {p: str(free_port()) for p in PORTS}
    dist = tmp_path / "dist"
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    env = clean_env(BUILD_DIR=BUILD, DIST_DIR=str(dist))
    # `make` as the page runs it in a clone, taking the build as it is
    # (ctest runs this beside tests that use the binaries).
    make = f'make() {{ command make -C {shlex.quote(ROOT)} -o build "$@"; }}\n'

    sections = {}
    for section, info, text in blocks():
        if info == "sh":
            sections.setdefault(section, []).append(localize(text, ports))
    build = [t for t in sections["One node"] if "make deb" in t]
    assert len(build) == 1
    rc, out = bash(make + build[0], scratch, env, timeout=300)
    assert rc == 0, out
    deb = dist / deb_name()
    assert deb.is_file(), out
    root = tmp_path / "root"
    assert run(["dpkg-deb", "-x", str(deb), str(root)]).returncode == 0
    env["PATH"] = f"{root}/usr/bin:{env['PATH']}"

    sections["One node"].remove(build[0])
    rc, out = bash("".join(sections.pop("One node")), scratch, env)
    assert rc == 0, out
    assert "OK" in out.splitlines() and '{"status":"healthy"}' in out, out

    rc, out = bash("".join(sections.pop("A fleet with the coordinator")), scratch, env)
    assert rc == 0, out
    assert out.count('"instance_id"') == 2, out
    assert (scratch / "state" / "coordinator.db").is_file()
    assert not sections, f"sections with `sh` blocks this test does not know: {list(sections)}"


def check_system(cmd, deb_root, makefile):
    """Whether what a command the page does not run names exists: the
    package file, a unit, a file in the package or the repository."""
    w = shlex.split(cmd.split(" #")[0])
    if w[0] == "sudo":
        w = w[1:]
    units = os.listdir(deb_root / "lib" / "systemd" / "system")
    if w[:2] == ["apt-get", "install"]:
        assert w[2] == f"./dist/{deb_name()}"
    elif w == ["make", "install"]:
        assert re.search(r"^install:", makefile, re.M)
    elif w[0] == "systemctl":
        names = w[w.index("--now") + 1:] if "--now" in w else w[2:]
        assert w[1] in ("enable", "restart", "daemon-reload")
        assert all(f"{n}.service" in units for n in names), names
    elif w[:2] == ["mkdir", "-p"]:
        assert re.fullmatch(r"/etc/systemd/system/(.*)\.d", w[2]).group(1) in units
    elif w[0] == "install":
        src, dst = w[-2], w[-1]
        assert (deb_root / src.lstrip("/")).is_file(), src
        assert os.path.dirname(dst)[len("/etc/systemd/system/"):-2] in units, dst
    elif w[:2] == ["docker", "build"]:
        assert os.path.isfile(os.path.join(ROOT, flag(w, "-f"))) and w[-1] == "."
    elif w[:2] == ["docker", "run"]:
        assert w[-1] == f"lmcached:{version()}"
        shm = next(a for a in w if a.startswith("--shm-size="))
        assert int(shm.split("=")[1].rstrip("g")) > 8    # the image's --l1-size-gb 8
    elif w[:2] == ["kubectl", "apply"]:
        assert os.path.isfile(os.path.join(ROOT, flag(w, "-f")))
    else:
        raise AssertionError(f"no check for this command of docs/deploy.md: {cmd}")


def test_the_system_blocks_name_what_is_there(deb_root):
    with open(os.path.join(ROOT, "Makefile")) as f:
        makefile = f.read()
    checked = 0
    for _, info, text in blocks():
        if info == "sh system":
            for cmd in commands(text):
                check_system(cmd, deb_root, makefile)
                checked += 1
    assert checked >= 10
    infos = {info for _, info, _ in blocks()}
    assert infos <= {"sh", "sh engine", "sh system", "yaml sglang"}, infos
