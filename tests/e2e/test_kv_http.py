"""KV transfer over HTTP (/api/kv/store, /retrieve, /lookup): whole-request
tensors [2, layers, tokens, world_size * hidden] split into the per-rank
chunk objects the engine-driven path uses, and gathered back."""
import http.client
import json
import random

import pytest

from lmc.client import unpack
from lmc.keys import ipc_key
from lmc.ops import LOOKUP, WAIT_PREFETCH_STATUS
from test_lookup_engine_driven import CS, HIDDEN, LAYERS, Worker

WS = 2
ROW = HIDDEN * 2                       # one rank's token row: float16


def post(port, path, body, headers=None):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("POST", path, body=body, headers=headers or {})
        r = conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        conn.close()


def tensor(n_tokens, seed):
    rng = random.Random(seed)
    return bytes(rng.randrange(256) for _ in range(2 * LAYERS * n_tokens * WS * ROW))


def chunk_of(whole, n_tokens, chunk, rank):
    """Rank `rank`'s object of chunk `chunk`: [2, L, CS, HIDDEN] from the whole."""
    out = bytearray()
    full_row = WS * ROW
    for kv_layer in range(2 * LAYERS):
        for t in range(chunk * CS, (chunk + 1) * CS):
            start = (kv_layer * n_tokens + t) * full_row + rank * ROW
            out += whole[start:start + ROW]
    return bytes(out)


def prefix_of(whole, n_tokens, keep):
    full_row = WS * ROW
    return b"".join(whole[(kl * n_tokens) * full_row:(kl * n_tokens + keep) * full_row]
                    for kl in range(2 * LAYERS))


SERVER_ARGS = ("--chunk-size", str(CS))      # the srv fixture's (conftest.py)


@pytest.fixture
def ranks(srv):
    ws = [Worker(srv, 7001, 0), Worker(srv, 7002, 1)]      # registers (m, world size 2)
    yield ws
    for w in ws:
        w.close()


def test_store_then_retrieve_lookup_and_engine_path(srv, ranks):
    s, ws = srv, ranks
    n = 2 * CS + 5                                     # 2 whole chunks + a partial one
    toks = [random.Random(1).randrange(50000) for _ in range(n)]
    whole = tensor(n, 7)
    hdrs = {"X-LMCache-Model-Name": "m", "X-LMCache-Tokens": ",".join(map(str, toks)),
            "Content-Type": "application/x-lmcache-kv; v=1"}
    st, _, body = post(s.http_port, "/api/kv/store", whole, hdrs)
    assert st == 200, body
    assert json.loads(body) == {"status": "ok", "total_tokens": n, "total_chunks": 2,
                                "stored_tokens": 2 * CS, "stored_chunks": 2}
    req = json.dumps({"model_name": "m", "tokens": toks, "cache_salt": ""})
    st, _, body = post(s.http_port, "/api/kv/lookup", req)
    assert st == 200 and json.loads(body) == {"total_tokens": n, "total_chunks": 2,
                                              "hit_tokens": 2 * CS, "hit_chunks": 2}
    st, h, body = post(s.http_port, "/api/kv/retrieve", req)
    assert st == 200 and h["content-type"].startswith("application/x-lmcache-kv")
    assert (h["x-lmcache-hit-tokens"], h["x-lmcache-hit-chunks"]) == (str(2 * CS), "2")
    assert (h["x-lmcache-total-tokens"], h["x-lmcache-total-chunks"]) == (str(n), "2")
    assert body == prefix_of(whole, n, 2 * CS)
    # The engine-driven path sees the same objects, split per rank.
    sched = s.dealer()
    assert sched.call(LOOKUP, ipc_key(toks, 0, 2 * CS, "kv1", world_size=2), 1) is not None
    assert unpack(sched.call(WAIT_PREFETCH_STATUS, "kv1", 5.0)) == 2
    for w in ws:
        assert w.retrieve(toks, 0, 2 * CS, "kv1") == [chunk_of(whole, n, c, w.rank) for c in (0, 1)]
    sched.close()
    # Storing again: already there, still reported stored.
    st, _, body = post(s.http_port, "/api/kv/store", whole, hdrs)
    assert st == 200 and json.loads(body)["stored_chunks"] == 2


def test_errors_and_misses(srv, ranks):
    s = srv
    toks = list(range(CS))
    ok_hdrs = {"X-LMCache-Model-Name": "m", "X-LMCache-Tokens": ",".join(map(str, toks))}
    whole = tensor(CS, 3)
    cases = [
        ({**ok_hdrs, "X-LMCache-Model-Name": "nope"}, whole, "not registered"),
        ({"X-LMCache-Tokens": "1,2"}, whole, "X-LMCache-Model-Name"),
        ({**ok_hdrs, "X-LMCache-Tokens": "1,x"}, whole, "X-LMCache-Tokens"),
        ({**ok_hdrs, "X-LMCache-Tokens": ""}, whole, "X-LMCache-Tokens"),
        (ok_hdrs, whole[:-1], "payload"),
        ({**ok_hdrs, "Content-Type": "text/plain"}, whole, "Content-Type"),
        ({**ok_hdrs, "X-LMCache-Cache-Salt": "a/b"}, whole, "cache_salt"),
    ]
    for hdrs, body, word in cases:
        st, _, reply = post(s.http_port, "/api/kv/store", body, hdrs)
        assert st == 400 and word in json.loads(reply)["detail"], (hdrs.keys(), reply)
    miss = json.dumps({"model_name": "m", "tokens": list(range(100, 100 + CS))})
    st, h, body = post(s.http_port, "/api/kv/retrieve", miss)
    assert st == 404 and body == b"" and h["x-lmcache-hit-chunks"] == "0"
    st, _, body = post(s.http_port, "/api/kv/lookup",
                       json.dumps({"model_name": "nope", "tokens": [1]}))
    assert st == 400 and "not registered" in json.loads(body)["detail"]
    for bad in ("{", "[]", '{"model_name": "m"}', '{"model_name": "m", "tokens": [-1]}'):
        assert post(s.http_port, "/api/kv/lookup", bad)[0] == 422
