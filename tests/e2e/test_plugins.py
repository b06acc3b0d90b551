"""Runtime plugins end to end (docs/plugins.md): a .sh
and a .py plugin save the config they were given (a file: it outgrows one
log line), say so and sleep; their output reaches the server log with the
"[<path>] " prefix, and SIGTERM to the server ends them."""
import json
import os
import time

from lmc.server import Server

# Each plugin also writes the config to a file beside it: a log line is cut
# at 2 KiB (src/obs/log.c), and the whole configuration with this test's
# long paths comes close to that.
SH_PLUGIN = """\
echo "SHCONFIG $LMCACHE_RUNTIME_PLUGIN_CONFIG"
printf '%s' "$LMCACHE_RUNTIME_PLUGIN_CONFIG" > "$(dirname "$0")/sh.config"
echo "SHENV role=[$LMCACHE_RUNTIME_PLUGIN_ROLE] id=$LMCACHE_PLUGIN_WORKER_ID count=$LMCACHE_RUNTIME_PLUGIN_WORKER_COUNT" >&2
echo $$ > "$(dirname "$0")/sh.pid"
exec sleep 300
"""

PY_PLUGIN = """\
import json, os, sys, time
cfg = json.loads(os.environ["LMCACHE_RUNTIME_PLUGIN_CONFIG"])
print("PYCONFIG " + json.dumps(cfg))
with open(os.path.join(os.path.dirname(__file__), "py.config"), "w") as f:
    json.dump(cfg, f)
print("PYERR unbuffered=" + os.environ.get("PYTHONUNBUFFERED", ""), file=sys.stderr)
with open(os.path.join(os.path.dirname(__file__), "py.pid"), "w") as f:
    f.write(str(os.getpid()))
time.sleep(300)
"""


def wait_for(pred, timeout=15.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = pred()
        if value:
            return value
        time.sleep(0.1)
    return pred()


def log_line(server, marker):
    for line in server.output().splitlines():
        if marker in line:
            return line
    return None


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is gone for our purposes only once reaped: check /proc state
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_plugins_run_and_stop(tmp_path):
    pdir = tmp_path / "plugins"
    (pdir / "nested").mkdir(parents=True)
    sh = pdir / "hello.sh"
    sh.write_text(SH_PLUGIN)
    py = pdir / "nested" / "watch_0_py.py"
    py.write_text(PY_PLUGIN)
    (pdir / "other_1_worker.sh").write_text("echo SHOULD-NOT-RUN\n")
    (pdir / "README.txt").write_text("not a plugin\n")

    s = Server("--runtime-plugin-locations", str(pdir), str(tmp_path / "missing"),
               "--runtime-plugin-config", '{"plugin.frontend.heartbeat_url": "http://x"}')
    try:
        sh_line = wait_for(lambda: log_line(s, "SHCONFIG "))
        py_line = wait_for(lambda: log_line(s, "PYCONFIG "))
        assert sh_line and py_line, s.output()
        assert f"[{sh}] SHCONFIG " in sh_line
        assert f"[{py}] PYCONFIG " in py_line
        assert sh_line.split("SHCONFIG ", 1)[1].startswith('{"mp_config":{')
        assert py_line.split("PYCONFIG ", 1)[1].startswith('{"mp_config": {')
        for path in (pdir / "sh.config", pdir / "nested" / "py.config"):
            cfg = json.loads(wait_for(lambda: path.exists() and path.read_text()))
            assert cfg["mp_config"]["port"] == s.port
            assert cfg["http_config"]["http_port"] == s.http_port
            assert cfg["storage_manager_config"]["eviction_policy"] == "LRU"
            assert "obs_config" in cfg
            assert cfg["runtime_plugin_extra_config"] == {
                "plugin.frontend.heartbeat_url": "http://x"}
        # stderr is merged and logged too
        assert wait_for(lambda: log_line(s, f"[{sh}] SHENV role=[] id=0 count=1")), s.output()
        assert wait_for(lambda: log_line(s, f"[{py}] PYERR unbuffered=1")), s.output()
        out = s.output()
        assert "SHOULD-NOT-RUN" not in out
        assert "missing does not exist; skipped" in out
        sh_pid = int(wait_for(lambda: (pdir / "sh.pid").exists() and (pdir / "sh.pid").read_text()))
        py_pid = int(wait_for(lambda: (pdir / "nested" / "py.pid").exists()
                              and (pdir / "nested" / "py.pid").read_text()))
        assert alive(sh_pid) and alive(py_pid)
    finally:
        rc = s.stop()
    assert rc == 0, s.output()
    assert not alive(sh_pid)
    assert not alive(py_pid)
    out = s.output()
    assert f"runtime plugin {sh} terminated by signal 15" in out, out
    assert f"runtime plugin {py} terminated by signal 15" in out, out


def test_exit_code_logged(tmp_path):
    plugin = tmp_path / "quick.sh"
    plugin.write_text("echo done-quickly\nexit 3\n")
    s = Server("--runtime-plugin-locations", str(plugin))
    try:
        assert wait_for(lambda: log_line(s, f"runtime plugin {plugin} exited with code 3")), \
            s.output()
        assert log_line(s, f"[{plugin}] done-quickly")
    finally:
        assert s.stop() == 0, s.output()
