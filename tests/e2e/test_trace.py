"""The storage trace recorder (docs/trace.md): an engine-driven store and
retrieve with --trace-level storage, the file read back frame by frame by
a reader written here from the format and by upstream LMCache's own
decoders where the pinned package is installed, a trace cut short, and
the flags' refusals."""
import hashlib
import json
import os
import struct
import subprocess
import time
import urllib.request

import msgpack
import pytest

from lmc.client import unpack
from lmc.keys import ipc_key
from lmc.ops import FREE_LOOKUP_LOCKS, UNREGISTER_KV_CACHE_ENGINE_DRIVEN_CONTEXT
from lmc.server import ROOT, free_port, run_lmcached
from test_kv_events import SEED, chunk_hashes
from test_lookup_engine_driven import CS, OBJ, Worker, lookup, prompt

SERVER_ARGS = ("--chunk-size", str(CS), "--hash-algorithm", "sha256_cbor")
PREFIX = "lmcache.v1.distributed.storage_manager.StorageManager"
# The python of the pinned upstream package (docs/testing.md, "The tests'
# Python environment").
UPSTREAM_PYTHON = os.environ.get("LMC_UPSTREAM_PYTHON",
                                 os.path.join(ROOT, "build-tools", "venv", "bin", "python"))


def frames(data):
    """(frames, tail): each whole [u32 BE length][body], and the bytes of an
    incomplete last frame (b"" when the file ends on a frame boundary)."""
    out, at = [], 0
    while at + 4 <= len(data):
        (n,) = struct.unpack(">I", data[at:at + 4])
        if at + 4 + n > len(data):
            break
        out.append(data[at + 4:at + 4 + n])
        at += 4 + n
    return out, data[at:]


def decode(data):
    """(header, records) as plain maps; asserts the file is whole."""
    fs, tail = frames(data)
    assert tail == b"", f"{len(tail)} bytes of an incomplete frame at the end"
    header = msgpack.unpackb(fs[0], raw=False)
    return header, [msgpack.unpackb(f, raw=False) for f in fs[1:]]


def traced(start_server, tmp_path, *args):
    out = tmp_path / "t.lct"
    srv = start_server(*SERVER_ARGS, "--trace-level", "storage", "--trace-output", str(out),
                       *args, env={"PYTHONHASHSEED": SEED})
    return srv, out


def status(srv):
    with urllib.request.urlopen(f"http://127.0.0.1:{srv.http_port}/status", timeout=10) as r:
        return json.loads(r.read())


def store_and_retrieve(srv):
    toks = prompt(5)
    w = Worker(srv, 3001, 0, world_size=1)
    try:
        assert w.store(toks, 0, 64)["chunk_indices"] == [0, 1, 2, 3]
        sched = srv.dealer()
        assert lookup(sched, toks, "r1", world_size=1) == 4
        sched.close()
        assert len(w.retrieve(toks, 0, 64, "r1")) == 4
    finally:
        w.close()
    return toks


# What store_and_retrieve records: the STORE's reserve and publish, the
# LOOKUP's read leases, the RETRIEVE's copy out and its give-back
# (docs/trace.md, "What is recorded").
STORE_AND_RETRIEVE = [".reserve_write", ".finish_write", ".submit_prefetch_task",
                      ".read_prefetched_results.__enter__", ".read_prefetched_results.__exit__"]


def test_a_store_is_recorded_in_upstreams_format(start_server, tmp_path):
    srv, out = traced(start_server, tmp_path)
    toks = store_and_retrieve(srv)
    st = status(srv)["trace"]
    assert st["level"] == "storage" and st["output"] == str(out)
    assert srv.stop() == 0   # SIGTERM: the file is flushed and closed
    header, records = decode(out.read_bytes())
    assert header["type"] == "header" and header["magic"] == b"LMCT"
    assert header["format_version"] == 1 and header["trace_schema_version"] == 2
    assert header["level"] == "storage"
    cfg = header["sm_config_json"]
    assert header["sm_config_digest"] == hashlib.sha256(cfg.encode()).hexdigest()
    assert "l1_size_gb" in json.loads(cfg)
    assert isinstance(header["t_mono_start"], float) and header["t_wall_start"] > 1.7e9
    names = [r["qualname"] for r in records]
    assert names == [PREFIX + m for m in STORE_AND_RETRIEVE], names
    want = chunk_hashes(toks)
    for r in records:
        assert r["type"] == "record" and 0 <= r["t_mono"] < 600
        keys = r["args"]["keys"]
        assert all(k["__t__"] == "ObjectKey" for k in keys)
        assert [k["v"]["chunk_hash"] for k in keys] == want
        assert {k["v"]["model_name"] for k in keys} == {"m"}
        assert {k["v"]["cache_salt"] for k in keys} == {""}
    layout = {"__t__": "MemoryLayoutDesc", "v": {"shapes": [[OBJ]], "dtypes": ["torch.uint8"]}}
    assert records[0]["args"] == {"keys": records[0]["args"]["keys"], "layout_desc": layout}
    # The LOOKUP: upstream's submit_prefetch_task with its defaults applied.
    assert records[2]["args"] == {"keys": records[2]["args"]["keys"], "layout_desc": layout,
                                  "extra_count": 0, "external_request_id": "",
                                  "policy": {"__t__": "TrimPolicy", "v": "PREFIX"}}
    assert [sorted(r["args"]) for r in records[3:]] == [["keys"], ["keys"]]
    assert [r["t_mono"] for r in records] == sorted(r["t_mono"] for r in records)
    assert st["records_dropped"] == 0


def test_status_and_metrics_count_what_was_written(start_server, tmp_path):
    srv, out = traced(start_server, tmp_path)
    store_and_retrieve(srv)
    # The writer thread drains within its poll interval (docs/trace.md).
    deadline = time.monotonic() + 10
    n = len(STORE_AND_RETRIEVE)
    while status(srv)["trace"]["records_written"] < n and time.monotonic() < deadline:
        time.sleep(0.05)
    st = status(srv)["trace"]
    assert st["records_written"] == n and st["records_dropped"] == 0
    assert st["bytes_written"] == out.stat().st_size
    with urllib.request.urlopen(f"http://127.0.0.1:{srv.http_port}/metrics", timeout=10) as r:
        text = r.read().decode()
    assert f"lmcache_mp_trace_records_written_total {n}" in text
    assert "lmcache_mp_trace_records_dropped_total 0" in text
    assert f"lmcache_mp_trace_bytes_written_total {st['bytes_written']}" in text


def test_an_aborted_store_is_recorded(start_server, tmp_path):
    """A PREPARE_STORE whose worker goes away: its write leases go back
    unpublished (abort_write)."""
    srv, out = traced(start_server, tmp_path)
    toks = prompt(6)
    w = Worker(srv, 3002, 0, world_size=1)
    w.store(toks, 0, 32, commit=False)
    unpack(w.d.call(UNREGISTER_KV_CACHE_ENGINE_DRIVEN_CONTEXT, w.id))
    w.close()
    assert srv.stop() == 0
    _, records = decode(out.read_bytes())
    names = [r["qualname"].rsplit(".", 1)[1] for r in records]
    assert names == ["reserve_write", "abort_write"], names
    assert [k["v"]["chunk_hash"] for k in records[1]["args"]["keys"]] == chunk_hashes(toks[:32])


UPSTREAM_READ = r"""
import importlib.util, json, os, struct, sys
import lmcache
# format.py alone: the package's __init__ wants torch, which the venv lacks.
path = os.path.join(os.path.dirname(lmcache.__file__), "v1", "mp_observability", "trace",
                    "format.py")
spec = importlib.util.spec_from_file_location("trace_format", path)
fmt = importlib.util.module_from_spec(spec)
sys.modules["trace_format"] = fmt   # msgspec resolves its annotations there
spec.loader.exec_module(fmt)
data = open(sys.argv[1], "rb").read()
at, frames = 0, []
while at < len(data):
    (n,) = struct.unpack(">I", data[at:at + 4])
    frames.append(data[at + 4:at + 4 + n])
    at += 4 + n
h = fmt.decode_header(frames[0])
out = {"magic": h.magic.decode(), "format_version": h.format_version, "level": h.level,
       "schema": h.trace_schema_version, "digest": h.sm_config_digest, "records": []}
for f in frames[1:]:
    r = fmt.decode_record(f)
    assert all(k["__t__"] == "ObjectKey" for k in r.args["keys"])
    out["records"].append({"qualname": r.qualname,
                           "hashes": [k["v"]["chunk_hash"].hex() for k in r.args["keys"]]})
print(json.dumps(out))
"""


def test_upstreams_decoders_read_the_file(start_server, tmp_path):
    """LMCache's own typed Header/Record decoders (its format.py, msgspec),
    run in the pinned upstream package's python, read every frame.  (Its
    codecs and TraceReader need torch, which that venv lacks; the pinned
    TraceReader also expects schema 1 where ours is 2, whose ObjectKey
    carries cache_salt: docs/trace.md.)"""
    if not os.path.exists(UPSTREAM_PYTHON):
        if os.environ.get("CI") == "true":
            pytest.fail(f"no pinned upstream package: {UPSTREAM_PYTHON} (make deps-test)")
        pytest.skip(f"no pinned upstream package: {UPSTREAM_PYTHON} (make deps-test)")
    srv, out = traced(start_server, tmp_path)
    toks = store_and_retrieve(srv)
    assert srv.stop() == 0
    r = subprocess.run([UPSTREAM_PYTHON, "-c", UPSTREAM_READ, str(out)], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert got["magic"] == "LMCT" and got["format_version"] == 1 and got["schema"] == 2
    want = [h.hex() for h in chunk_hashes(toks)]
    assert got["records"] == [{"qualname": PREFIX + m, "hashes": want}
                              for m in STORE_AND_RETRIEVE]


def test_a_trace_cut_short_ends_in_an_incomplete_frame(start_server, tmp_path):
    srv, out = traced(start_server, tmp_path)
    store_and_retrieve(srv)
    assert srv.stop() == 0
    data = out.read_bytes()
    whole, _ = frames(data)
    cut = data[:-5]
    fs, tail = frames(cut)
    assert len(fs) == len(whole) - 1 and 0 < len(tail) < len(whole[-1]) + 4
    with pytest.raises(AssertionError, match="incomplete frame"):
        decode(cut)


L1 = ("--l1-size-gb", "0.0625", "--eviction-policy", "LRU")


def test_bad_level_and_unwritable_output_are_refused(tmp_path):
    r = run_lmcached(*L1, "--trace-level", "gpu")
    assert r.returncode == 2 and "--trace-level" in r.stderr, r.stderr
    bad = tmp_path / "no-such-dir" / "t.lct"
    r = run_lmcached(*L1, "--port", str(free_port()), "--no-http", "--trace-level", "storage",
                     "--trace-output", str(bad))
    assert r.returncode != 0
    assert "--trace-output" in r.stderr and str(bad) in r.stderr, r.stderr


def test_default_output_is_under_tmpdir(start_server, tmp_path):
    srv = start_server(*SERVER_ARGS, "--trace-level", "storage",
                       env={"PYTHONHASHSEED": SEED, "TMPDIR": str(tmp_path)})
    made = list(tmp_path.glob(f"lmcache-trace-{srv.proc.pid}-*.lct"))
    assert len(made) == 1, list(tmp_path.iterdir())
    stamp = made[0].name.split("-", 3)[3][:-len(".lct")]
    assert len(stamp) == 15 and stamp[8] == "-" and stamp.replace("-", "").isdigit(), stamp
    assert status(srv)["trace"]["output"] == str(made[0])
    assert (made[0].stat().st_mode & 0o777) == 0o600


def test_freed_lookup_locks_are_recorded(start_server, tmp_path):
    """A LOOKUP nobody retrieves, its read locks freed by FREE_LOOKUP_LOCKS:
    submit_prefetch_task, then finish_read_prefetched of the freed keys,
    which upstream's decoders read as well."""
    srv, out = traced(start_server, tmp_path)
    toks = prompt(7)
    w = Worker(srv, 3003, 0, world_size=1)
    w.store(toks, 0, 64)
    w.close()
    sched = srv.dealer()
    assert lookup(sched, toks, "r2", world_size=1) == 4
    assert sched.call(FREE_LOOKUP_LOCKS, ipc_key(toks, 0, 32, "r2"), 1) is not None
    sched.close()
    assert srv.stop() == 0
    _, records = decode(out.read_bytes())
    names = [r["qualname"].rsplit(".", 1)[1] for r in records]
    assert names == ["reserve_write", "finish_write", "submit_prefetch_task",
                     "finish_read_prefetched"], names
    freed = records[3]["args"]
    assert [k["v"]["chunk_hash"] for k in freed["keys"]] == chunk_hashes(toks)[:2]
    assert freed["extra_count"] == 0 and sorted(freed) == ["extra_count", "keys"]
    if os.path.exists(UPSTREAM_PYTHON):
        r = subprocess.run([UPSTREAM_PYTHON, "-c", UPSTREAM_READ, str(out)],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        assert [x["qualname"] for x in json.loads(r.stdout)["records"]][3] == \
            PREFIX + ".finish_read_prefetched"


def test_output_without_level_records_nothing_and_says_so(start_server, tmp_path):
    out = tmp_path / "t.lct"
    srv = start_server(*SERVER_ARGS, "--trace-output", str(out))
    store_and_retrieve(srv)
    st = status(srv)["trace"]
    assert st["level"] is None and st["output"] is None and st["records_written"] == 0
    assert not out.exists()
    assert "--trace-output is ignored without --trace-level" in srv.output()
