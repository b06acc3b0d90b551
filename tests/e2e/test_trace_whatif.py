"""`lmcache-cli trace info` and `trace whatif` (docs/cli.md, "trace";
docs/trace.md, "What-if") on traces written here with Python's msgpack in
upstream LMCache's format: the miss-ratio curve of a known working set,
the CSV and the SVG, and the refusal of a trace cut short or corrupted."""
import csv
import hashlib
import struct
import xml.etree.ElementTree as ET

import msgpack

from lmc.server import run_cli

PREFIX = "lmcache.v1.distributed.storage_manager.StorageManager."
MIB = 1 << 20
W = 8        # distinct objects: the working set is W MiB
ROUNDS = 5   # each object looked up (and stored) once per round, cyclically


def frame(obj):
    body = msgpack.packb(obj, use_bin_type=True)
    return struct.pack(">I", len(body)) + body


def header(schema=2):
    h = {"type": "header", "magic": b"LMCT", "format_version": 1, "level": "storage"}
    if schema == 1:
        h["lmcache_version"] = "0.4.0"
    else:
        h["trace_schema_version"] = schema
    h.update({"t_mono_start": 100.0, "t_wall_start": 1764936000.0,
              "sm_config_json": "{}", "sm_config_digest": hashlib.sha256(b"{}").hexdigest()})
    return frame(h)


def key(i, salt=""):
    return {"__t__": "ObjectKey",
            "v": {"chunk_hash": hashlib.sha256(b"%d" % i).digest(), "model_name": "m",
                  "kv_rank": 0x01000100, "object_group_id": 0, "cache_salt": salt}}


def layout(nbytes):
    # Two float16 tensors of nbytes/4 elements each: nbytes in all.
    return {"__t__": "MemoryLayoutDesc",
            "v": {"shapes": [[nbytes // 8, 2], [nbytes // 4]],
                  "dtypes": ["torch.float16", "torch.float16"]}}


def record(t, method, **args):
    return frame({"type": "record", "t_mono": t, "t_wall": 1764936000.0 + t,
                  "qualname": PREFIX + method, "args": args})


def cyclic_trace(path):
    """ROUNDS rounds over W objects of 1 MiB: a lookup of the object, then
    its store (reserve_write + finish_write), as a client that stores what
    it computed; a store of a resident object is a no-op (NOT_WRITABLE)."""
    out, t = [header()], 0.0
    for _ in range(ROUNDS):
        for i in range(W):
            ks = [key(i)]
            out.append(record(t, "submit_prefetch_task", keys=ks, layout_desc=layout(MIB),
                              extra_count=0, external_request_id="r%d" % i,
                              policy={"__t__": "TrimPolicy", "v": "PREFIX"}))
            out.append(record(t + 0.001, "reserve_write", keys=ks, layout_desc=layout(MIB)))
            out.append(record(t + 0.002, "finish_write", keys=ks))
            out.append(record(t + 0.003, "read_prefetched_results.__enter__", keys=ks))
            out.append(record(t + 0.004, "read_prefetched_results.__exit__", keys=ks))
            t += 0.01
    data = b"".join(out)
    path.write_bytes(data)
    return data


def whatif(tmp_path, trace, sizes, policy="LRU,noop"):
    out_csv, out_svg = tmp_path / "curve.csv", tmp_path / "curve.svg"
    r = run_cli("trace", "whatif", str(trace), "--l1-size", sizes, "--policy", policy,
                "--csv", str(out_csv), "--svg", str(out_svg))
    assert r.returncode == 0, r.stderr
    with open(out_csv) as f:
        rows = list(csv.DictReader(f))
    return rows, out_svg


def test_info(tmp_path):
    trace = tmp_path / "t.lct"
    cyclic_trace(trace)
    r = run_cli("trace", "info", str(trace))
    assert r.returncode == 0, r.stderr
    lines = dict(line.strip().split(": ", 1) for line in r.stdout.splitlines())
    assert lines["format_version"] == "1"
    assert lines["trace_schema_version"] == "2"
    assert lines["level"] == "storage"
    assert lines["t_wall_start"].startswith("1764936000.000000 (2025-12-05T12:00:00Z)")
    assert lines["sm_config_digest"] == hashlib.sha256(b"{}").hexdigest()
    n = W * ROUNDS
    assert lines["records"] == str(5 * n)
    for op in ("submit_prefetch_task", "reserve_write", "finish_write",
               "read_prefetched_results.__enter__", "read_prefetched_results.__exit__"):
        assert lines[op] == str(n)
    assert lines["abort_write"] == "0" and lines["other"] == "0"
    assert abs(float(lines["time_span_s"]) - ((n - 1) * 0.01 + 0.004)) < 1e-6
    assert lines["distinct_keys"] == str(W)
    assert lines["distinct_bytes"] == str(W * MIB)


def test_info_schema_1_header(tmp_path):
    trace = tmp_path / "t.lct"
    trace.write_bytes(header(schema=1) + record(0.0, "finish_write", keys=[key(1)]))
    r = run_cli("trace", "info", str(trace))
    assert r.returncode == 0, r.stderr
    assert "trace_schema_version: 1" in r.stdout and "finish_write: 1" in r.stdout


def test_whatif_knee_at_the_working_set(tmp_path):
    """The exact expectations (docs/trace.md, "What-if"), with the server's
    default watermark 0.8 and ratio 0.2:
    - LRU below W MiB, where k = floor(size / 1 MiB) whole objects reach
      the watermark (k MiB >= 0.8 size): the controller makes room for
      every store, the L1 holds at most W-1 objects, always the most
      recently stored, and a cyclic lookup asks for the one stored W
      stores ago: no hit at all;
    - LRU below W MiB where k MiB < 0.8 size (1.5 MiB: one object is 67 %):
      the store that does not fit finds the L1 under the watermark, the
      controller does not evict and the L1 refuses the store, as lmcached
      does; the first k objects stay, as with noop;
    - LRU above W MiB / 0.8: the working set never reaches the watermark,
      nothing is evicted, every lookup after the first round hits:
      (ROUNDS-1)/ROUNDS;
    - noop never evicts: the first floor(size / 1 MiB) objects stay and
      the later stores are refused, so the hit ratio is
      (ROUNDS-1)/ROUNDS x min(W, floor(size / 1 MiB)) / W."""
    trace = tmp_path / "t.lct"
    cyclic_trace(trace)
    below = [MIB, 3 * MIB // 2, 3 * MIB, 5 * MIB, W * MIB - 1]
    above = [int(W * MIB / 0.8) + 1, 2 * W * MIB]
    sizes = below + [W * MIB] + above
    rows, svg = whatif(tmp_path, trace, ",".join(str(s) for s in sizes))
    assert [(r["policy"], int(r["l1_size_bytes"])) for r in rows] == \
        [("LRU", s) for s in sizes] + [("noop", s) for s in sizes]
    steady = (ROUNDS - 1) / ROUNDS
    for r in rows:
        size = int(r["l1_size_bytes"])
        assert int(r["lookups"]) == W * ROUNDS and int(r["lookup_keys"]) == W * ROUNDS
        hit = float(r["hit_ratio"])
        assert abs(hit - int(r["hit_keys"]) / (W * ROUNDS)) < 1e-6
        assert abs(hit + float(r["miss_ratio"]) - 1) < 1e-6
        k = min(W, size // MIB)
        stuck = size < W * MIB and k * MIB < 0.8 * size
        if r["policy"] == "noop" or stuck:
            assert abs(hit - steady * k / W) < 1e-6, r
            assert int(r["evictions"]) == 0
        elif size < W * MIB:
            assert int(r["hit_keys"]) == 0, r
            assert int(r["evictions"]) > 0
        elif size > W * MIB / 0.8:
            assert abs(hit - steady) < 1e-6, r
            assert int(r["evictions"]) == 0
        else:
            assert 0 <= hit <= steady
    root = ET.parse(svg).getroot()
    lines = root.findall("{http://www.w3.org/2000/svg}polyline")
    assert [p.get("data-policy") for p in lines] == ["LRU", "noop"]
    for p in lines:
        assert len(p.get("points").split()) == len(sizes)


def test_whatif_auto_sweep_reaches_the_knee(tmp_path):
    trace = tmp_path / "t.lct"
    cyclic_trace(trace)
    rows, svg = whatif(tmp_path, trace, "auto", policy="LRU")
    sizes = [int(r["l1_size_bytes"]) for r in rows]
    assert sizes[0] == MIB and W * MIB in sizes and sizes == sorted(sizes)
    assert sizes[-1] == int(W * MIB / 0.8) + 1
    assert abs(float(rows[-1]["hit_ratio"]) - (ROUNDS - 1) / ROUNDS) < 1e-6
    assert float(rows[0]["hit_ratio"]) == 0
    assert len(ET.parse(svg).getroot().findall("{http://www.w3.org/2000/svg}polyline")) == 1


def test_whatif_prefix_semantics_and_abort(tmp_path):
    """A lookup hits only the keys before the first one not readable; a
    staged (not finished) or aborted write is not readable."""
    trace = tmp_path / "t.lct"
    ks = [key(i) for i in range(4)]
    data = [header(),
            record(0.0, "reserve_write", keys=ks[:3], layout_desc=layout(MIB)),
            record(0.1, "finish_write", keys=[ks[0], ks[2]]),
            record(0.2, "abort_write", keys=[ks[1]]),
            record(0.3, "submit_prefetch_task", keys=ks, layout_desc=layout(MIB),
                   extra_count=0, external_request_id="r",
                   policy={"__t__": "TrimPolicy", "v": "PREFIX"})]
    trace.write_bytes(b"".join(data))
    rows, _ = whatif(tmp_path, trace, "1GiB", policy="LRU")
    assert (rows[0]["lookups"], rows[0]["lookup_keys"], rows[0]["hit_keys"]) == ("1", "4", "1")


def test_cut_short_and_corrupted_traces_are_refused(tmp_path):
    good = cyclic_trace(tmp_path / "t.lct")
    hdr = header()
    second = len(hdr) + len(record(0.0, "submit_prefetch_task", keys=[key(0)],
                                   layout_desc=layout(MIB), extra_count=0,
                                   external_request_id="r0",
                                   policy={"__t__": "TrimPolicy", "v": "PREFIX"}))
    cases = {
        # The body of the second record lacks its last byte.
        "cut": (good[:second + 10], "cut short at byte %d" % second),
        # Two bytes of the next length prefix only.
        "cut_prefix": (good[:second + 2], "cut short at byte %d" % second),
        # The first record's body: a msgpack map whose first key's type
        # byte is 0xc1 (never used).
        "corrupt": (good[:len(hdr) + 5] + b"\xc1" + good[len(hdr) + 6:],
                    "frame at byte %d does not decode" % len(hdr)),
        "bad_magic": (good.replace(b"LMCT", b"XXXX", 1), "bad header at byte 0"),
        "huge_frame": (hdr + b"\xff\xff\xff\xff", "frame at byte %d claims" % len(hdr)),
        "not_a_trace": (b"hello world", "at byte 0"),
    }
    for name, (data, why) in cases.items():
        path = tmp_path / (name + ".lct")
        path.write_bytes(data)
        for cmd in (["info", str(path)], ["whatif", str(path), "--l1-size", "1GiB"]):
            r = run_cli("trace", *cmd)
            assert r.returncode == 1, (name, cmd, r.stdout, r.stderr)
            assert why in r.stderr, (name, r.stderr)
            assert r.stdout == "", name


def test_whatif_refusals_name_the_flag(tmp_path):
    trace = tmp_path / "t.lct"
    cyclic_trace(trace)
    for args, flag in ((["--l1-size", "12XB"], "--l1-size"), (["--l1-size", "0"], "--l1-size"),
                       (["--l1-size", "1GiB", "--policy", "ARC"], "--policy"),
                       (["--l1-size", "1GiB", "--policy", "LRU,LRU"], "--policy"),
                       (["--l1-size", "1GiB", "--eviction-ratio", "2"], "--eviction-ratio"),
                       ([], "--l1-size")):
        r = run_cli("trace", "whatif", str(trace), *args)
        assert r.returncode == 2 and flag in r.stderr, (args, r.stderr)
