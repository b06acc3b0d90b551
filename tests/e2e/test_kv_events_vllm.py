"""vLLM block hashes on the KV event publisher (docs/kv_events.md, "vLLM
block hashes"): with --kv-events-block-size the BlockStored and
BlockRemoved events a subscriber written from vLLM's format hears carry
the hashes vLLM's sha256_cbor prefix caching gives the same tokens,
computed here independently with the cbor2 package vLLM itself uses and
hashlib (tests/requirements.txt), chained across chunks and stores; and
the refusals at start."""
import json
import os
import subprocess

import pytest

from lmc.ops import CLEAR
from lmc.server import BASE_ARGS, LMCACHED, ROOT, free_port
from test_kv_events import CS, SEED, one_rank, prompt, start, status
from test_kv_events_publisher import pub_args, receive, refused, stored_count, subscriber

VBS = 4                  # vLLM's --block-size here: 4 blocks per 16-token chunk
VLLM_SEED = "vllm-seed"  # not the chunk hasher's PYTHONHASHSEED (SEED)
# The python of the pinned test packages (docs/testing.md, "The tests'
# Python environment"), which has cbor2.
VENV_PYTHON = os.environ.get("LMC_TEST_VENV_PYTHON",
                             os.path.join(ROOT, "build-tools", "venv", "bin", "python"))

# vLLM's hash_block_tokens with --prefix-caching-hash-algo sha256_cbor and
# no extra keys, NONE_HASH from the seed, and its int of an event's hash
# (maybe_convert_block_hash): docs/compatibility.md, "KV event publisher".
REFERENCE = r"""
import cbor2, hashlib, json, sys
def sha256_cbor(x):
    return hashlib.sha256(cbor2.dumps(x, canonical=True)).digest()
a = json.load(sys.stdin)
t, bs = a["tokens"], a["block_size"]
prev, out = sha256_cbor(a["seed"]), []
for i in range(0, len(t) - len(t) % bs, bs):
    prev = sha256_cbor((prev, tuple(t[i:i + bs]), None))
    out.append(int.from_bytes(prev, "big") & (2**64 - 1))
json.dump(out, sys.stdout)
"""


def vllm_hashes(tokens, seed):
    """The int hash of every whole VBS-token block of tokens, as vLLM has them."""
    if not os.access(VENV_PYTHON, os.X_OK):
        pytest.skip(f"{VENV_PYTHON} missing: make deps-test")
    r = subprocess.run([VENV_PYTHON, "-c", REFERENCE], capture_output=True, text=True,
                       timeout=60, input=json.dumps({"tokens": tokens, "seed": seed,
                                                     "block_size": VBS}))
    if "No module named 'cbor2'" in r.stderr:
        pytest.skip("cbor2 missing from the test venv: make deps-test")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def assert_vllm_chain(events, toks, want):
    per = CS // VBS
    assert [e["type"] for e in events] == ["BlockStored"] * (len(want) // per)
    for c, e in enumerate(events):
        assert e["block_hashes"] == want[c * per:(c + 1) * per]
        assert e["parent_block_hash"] == (want[c * per - 1] if c else None)
        assert e["token_ids"] == toks[c * CS:(c + 1) * CS]
        assert (e["block_size"], e["medium"], e["lora_id"]) == (VBS, "CPU", None)


def test_published_hashes_are_vllms_chained_across_chunks_and_removed(start_server):
    pub_port = free_port()
    srv = start(start_server, *pub_args(pub_port, "--kv-events-block-size", str(VBS),
                                        "--kv-events-hash-seed", VLLM_SEED))
    sub = subscriber(srv, pub_port)
    toks = prompt(5)
    want = vllm_hashes(toks[:4 * CS], VLLM_SEED)
    w = one_rank(srv)
    w.store(toks, 0, 2 * CS)
    w.store(toks, 2 * CS, 4 * CS)   # chunk 2's first block chains onto chunk 1's last
    _, events = receive(sub, stored_count(4))
    assert_vllm_chain(events, toks, want)
    d = srv.dealer()
    assert d.call(CLEAR, False) is not None
    _, events = receive(sub, lambda ev: sum(len(e["block_hashes"]) for e in ev
                                            if e["type"] == "BlockRemoved") >= len(want))
    gone = [h for e in events if e["type"] == "BlockRemoved" for h in e["block_hashes"]]
    assert sorted(gone) == sorted(want)
    st = status(srv)["publisher"]["vllm_hashes"]
    assert st == {"block_size": VBS, "chunks_remembered": 4, "unchained_skipped": 0,
                  "unknown_removed": 0}
    d.close()
    w.close()
    sub.close()


def test_seed_defaults_to_pythonhashseed(start_server):
    # start() sets PYTHONHASHSEED=SEED for the chunk hasher; vLLM reads it too.
    pub_port = free_port()
    srv = start(start_server, *pub_args(pub_port, "--kv-events-block-size", str(VBS)))
    sub = subscriber(srv, pub_port)
    toks = prompt(6)
    w = one_rank(srv)
    w.store(toks, 0, CS)
    _, events = receive(sub, stored_count(1))
    assert_vllm_chain(events, toks, vllm_hashes(toks[:CS], SEED))
    w.close()
    sub.close()


def test_block_size_refusals_name_the_flag():
    ep = pub_args(free_port())
    err = refused(*ep, "--kv-events-block-size", "5", "--kv-events-hash-seed", "0")
    assert "--kv-events-block-size" in err and "--chunk-size" in err, err
    err = refused(*ep, "--kv-events-block-size", "-1", "--kv-events-hash-seed", "0")
    assert "--kv-events-block-size" in err, err
    err = refused("--kv-events-block-size", "16", "--kv-events-hash-seed", "0")
    assert "--kv-events-block-size" in err and "--kv-events-publish-endpoint" in err, err
    err = refused(*ep, "--kv-events-hash-seed", "0")
    assert "--kv-events-hash-seed" in err and "--kv-events-block-size" in err, err


def test_block_size_without_a_seed_is_refused():
    env = {k: v for k, v in os.environ.items() if k != "PYTHONHASHSEED"}
    r = subprocess.run([LMCACHED, *BASE_ARGS, "--host", "127.0.0.1", "--port", str(free_port()),
                        "--http-host", "127.0.0.1", "--http-port", str(free_port()),
                        *pub_args(free_port()), "--kv-events-block-size", "16"],
                       capture_output=True, text=True, timeout=20, env=env)
    assert r.returncode != 0
    assert "--kv-events-hash-seed" in r.stderr and "PYTHONHASHSEED" in r.stderr, r.stderr
