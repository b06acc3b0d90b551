"""What an operator sets up first (issue 31): --config FILE and --print-config,
--log-format and the log's timestamps, a --help that reads in a terminal,
the token file's permissions, one line per listening frontend."""
import json
import os
import re
import urllib.request

from lmc.server import BASE_ARGS, Server, run_lmcached

ISO = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}[+-]\d\d:\d\d"


def write_json(tmp_path, name, obj):
    path = tmp_path / name
    path.write_text(json.dumps(obj) if not isinstance(obj, str) else obj)
    return str(path)


def print_config(*args, env=None):
    r = run_lmcached(*args, "--print-config", env=env)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_config_file_fills_what_flags_and_environment_do_not(tmp_path):
    path = write_json(tmp_path, "lmcached.json", {
        "l1_size_gb": 0.5, "eviction-policy": "LRU", "port": 5601, "max-workers": 3,
        "http": False, "l2-adapter": [{"type": "fs", "base_path": str(tmp_path)}],
        "log-level": "warning"})
    got = print_config("--config", path)
    assert got["l1-size-gb"] == 0.5 and got["eviction-policy"] == "LRU"
    assert got["port"] == 5601 and got["http"] is False and got["log-level"] == "WARNING"
    assert got["max-cpu-workers"] == 3, "derived defaults follow the file's value"
    assert got["l2-adapter"] == [{"type": "fs", "base_path": str(tmp_path)}]
    # A flag overrides the file; so does an environment variable.
    got = print_config("--config", path, "--port", "5700",
                       env={"LMCACHE_LOG_LEVEL": "DEBUG"})
    assert got["port"] == 5700 and got["log-level"] == "DEBUG"


def test_print_config_redacts_secrets_and_loads_back(tmp_path):
    got = print_config(*BASE_ARGS, "--http-auth-token", "hunter2",
                       "--coordinator-auth-token", "tok-coord")
    text = json.dumps(got)
    assert "hunter2" not in text and "tok-coord" not in text
    assert got["http-auth-token"] == "***" and got["coordinator-auth-token"] == "***"
    assert got["instance-id"] is None, "a random instance id is not pinned into a file"
    # Without secrets, the printed configuration is a --config file as it is.
    plain = print_config(*BASE_ARGS, "--chunk-size", "128")
    path = write_json(tmp_path, "printed.json", plain)
    assert print_config("--config", path) == plain
    # The placeholder itself is refused: the operator must put the secret back.
    r = run_lmcached("--config", write_json(tmp_path, "redacted.json", got))
    assert r.returncode == 2 and "'***'" in r.stderr and "http-auth-token" in r.stderr


def test_bad_config_files_are_refused_naming_file_and_key(tmp_path):
    cases = [
        ({"l1-sise-gb": 1}, 'no such flag (did you mean "l1-size-gb"?)'),
        ({"l1-size-gb": True}, "expected a string or a number"),
        ({"http": "yes"}, "expected true or false"),
        ({"port": 70000}, "--config"),
        ([1, 2], "must hold one JSON object"),
        ('{"port": 1,', "line 1"),
        ('{"port": 1, "port": 2}', "duplicate"),
    ]
    for i, (content, message) in enumerate(cases):
        path = write_json(tmp_path, f"bad{i}.json", content)
        r = run_lmcached("--config", path)
        assert r.returncode == 2, (content, r.stderr)
        lines = [line for line in r.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and path in lines[0] and message in lines[0], (content, r.stderr)
    r = run_lmcached("--config", str(tmp_path / "missing.json"))
    assert r.returncode == 2 and "No such file" in r.stderr


def test_config_file_starts_a_server(tmp_path):
    path = write_json(tmp_path, "lmcached.json", {"chunk-size": 64, "hash-memo-mb": 0})
    s = Server("--config", path)
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{s.http_port}/status", timeout=5) as r:
            assert json.load(r)["chunk_size"] == 64
    finally:
        assert s.stop() == 0


def test_log_lines_carry_iso_timestamps_with_offset_in_both_formats():
    s = Server(env={"TZ": "Asia/Kolkata"})
    try:
        first = s.output().splitlines()[0]
        assert re.match(r"\[" + ISO + r"\] INFO ", first), first
        assert "+05:30]" in first and "lmcached " in first and "instance " in first
        # The HTTP frontend says where it listens once, not twice.
        listening = [line for line in s.output().splitlines() if "HTTP frontend" in line
                     and f":{s.http_port}" in line and "listening" in line]
        assert len(listening) == 1, s.output()
        assert sum(f":{s.http_port}" in line for line in s.output().splitlines()
                   if "INFO" in line) == 1, s.output()
    finally:
        assert s.stop() == 0
    s = Server("--log-format", "json")
    try:
        lines = s.output().splitlines()
        records = [json.loads(line) for line in lines]  # every line is one object
        assert set(records[0]) == {"time", "level", "source", "message"}
        assert re.fullmatch(ISO, records[0]["time"]) and records[0]["level"] == "INFO"
        assert records[0]["message"].startswith("lmcached ") and "(commit " in records[0]["message"]
        assert re.fullmatch(r"[a-z_]+\.c:\d+", records[0]["source"])
    finally:
        assert s.stop() == 0
    r = run_lmcached(*BASE_ARGS, "--log-format", "xml")
    assert r.returncode == 2 and "--log-format" in r.stderr and "text, json" in r.stderr


def test_json_log_escapes_what_a_client_sends(tmp_path):
    """A quote or a control byte in a value from outside stays inside one JSON
    string (the escaping of docs/observability.md, then JSON's own)."""
    path = tmp_path / 'tok"en'
    path.write_text("abc\n")
    os.chmod(path, 0o644)
    s = Server("--log-format", "json", "--http-auth-token-file", str(path))
    try:
        records = [json.loads(line) for line in s.output().splitlines()]
        warn = [r for r in records if "--http-auth-token-file" in r["message"]]
        assert warn and warn[0]["level"] == "WARNING" and 'tok"en' in warn[0]["message"]
    finally:
        assert s.stop() == 0


def test_token_file_readable_by_others_is_warned_about(tmp_path):
    path = tmp_path / "token"
    path.write_text("s3cret-token\n")
    for mode, warned in ((0o644, True), (0o640, True), (0o600, False), (0o400, False)):
        os.chmod(path, mode)
        s = Server("--http-auth-token-file", str(path))
        try:
            lines = [line for line in s.output().splitlines() if "WARNING" in line
                     and "--http-auth-token-file" in line]
            assert bool(lines) == warned, (oct(mode), s.output())
            if warned:
                assert f"mode {mode:04o}" in lines[0] and "chmod 600" in lines[0]
                assert "s3cret-token" not in s.output()
        finally:
            assert s.stop() == 0


def test_help_fits_a_terminal_and_says_which_flags_are_refused():
    r = run_lmcached("--help")
    assert r.returncode == 0
    lines = r.stdout.splitlines()
    assert max(len(line) for line in lines) <= 79, max(lines, key=len)
    blocks = {}  # usage line's first flag -> its description, joined
    for line in lines:
        if line.startswith("  --"):
            flag = line.split()[0].rstrip(",")
            blocks[flag] = ""
        elif line.startswith("        ") and blocks:
            blocks[flag] += " " + line.strip()
    for flag in ("--enable-extra-logging", "--script-allowed-imports"):
        assert "refused at start" in blocks[flag], (flag, blocks[flag])
    # Both trace levels are built (docs/trace.md).
    assert "refused" not in blocks["--trace-level"], blocks["--trace-level"]
    assert "'events' the cache-event stream" in blocks["--trace-level"], blocks["--trace-level"]
    # CacheBlend is built (docs/cacheblend.md).
    assert "refused" not in blocks["--engine-type"], blocks["--engine-type"]
    assert "blend_legacy" in blocks["--engine-type"], blocks["--engine-type"]
    notifier = blocks["--periodic-notifier-interval-ms"]
    assert "no effect" in notifier and "Tick period" not in notifier
    for flag in ("--config", "--print-config", "--log-format", "--l1-shm-reserve-mb"):
        assert flag in blocks, flag
