"""Issue 35: the coordinator's fleet CacheBlend fragment index
(docs/coordinator.md, "Blend lookup"): fed by the token-bearing STORE
entries of the cache-event stream, asked with POST
/directory/blend-lookup for stored chunks found anywhere in a prompt; and
a real lmcached reporting the tokens of what it stores (docs/fleet.md)."""
import base64
import struct

from lmc.keys import coord_key
from test_coordinator_api import batch, post_events, start_coordinator  # noqa: F401
from test_fleet import fleet, wait_for  # noqa: F401
from test_lookup_engine_driven import CS, prompt

K = 4


def ws_rank(world_size, rank=0):
    """The packed kv_rank lmcached sends (docs/storage.md)."""
    return world_size << 24 | rank << 16 | world_size << 8 | rank


def store(h, tokens, offset, model="m", salt="", world_size=1, rank=0):
    k = coord_key(h, salt=salt, model=model, rank=ws_rank(world_size, rank))
    return {"key": k, "size_bytes": 100, "token_ids": list(tokens), "token_offset": offset}


def store_batch(seq, entries, inst="a", etype="store"):
    b = batch(inst, 1, seq, etype, [])
    b["entries"] = entries
    return b


def b64(tokens):
    return base64.b64encode(struct.pack(f"<{len(tokens)}I", *tokens)).decode()


def lookup(c, tokens, model="m", world_size=1, salt="", form="b64"):
    body = {"model_name": model, "world_size": world_size, "cache_salt": salt}
    if form == "b64":
        body["tokens_b64"] = b64(tokens)
    else:
        body["token_ids"] = list(tokens)
    st, r = c.call("POST", "/directory/blend-lookup", body)
    assert st == 200, r
    return [(m["chunk_hash"], m["old_st"], m["cur_st"]) for m in r["matches"]]


def hexh(h):
    return f"{h:064x}"


def test_disabled_answers_no_match_and_old_routes_501(start_coordinator):
    c = start_coordinator(CHUNK_SIZE=str(K))
    assert post_events(c, store_batch(1, [store(1, [1, 2, 3, 4], 0)]))[0] == 200
    assert lookup(c, [9, 1, 2, 3, 4]) == []          # upstream: [] while disabled
    assert c.call("GET", "/directory/stats")[1]["blend"] == {"enabled": False}
    st, r = c.call("POST", "/blend/match", {})
    assert st == 501 and "/directory/blend-lookup" in r["detail"], r
    assert c.call("GET", "/directory/blend-lookup")[0] == 405


def test_matches_anywhere_namespaces_and_removal(start_coordinator):
    c = start_coordinator(CHUNK_SIZE=str(K), ENABLE_BLEND_LOOKUP="true")
    a, b = [1, 2, 3, 4], [5, 6, 7, 8]
    entries = [store(0xA, a, 0), store(0xB, b, 4),
               store(0xC, a, 8, model="other"),            # same text, another model
               store(0xD, [1, 2, 3], 0),                   # not a whole chunk: ignored
               store(0xE, [7, 7, 7, 7], -1)]               # position unknown: ignored
    st, r = post_events(c, store_batch(1, entries))
    assert st == 200 and r["applied"] == 1, r
    q = [9, 5, 6, 7, 8, 0, 1, 2, 3, 4, 7, 7, 7, 7]
    assert lookup(c, q) == [(hexh(0xB), 4, 1), (hexh(0xA), 0, 6)]
    assert lookup(c, q, form="ids") == [(hexh(0xB), 4, 1), (hexh(0xA), 0, 6)]
    assert lookup(c, q, model="other") == [(hexh(0xC), 8, 6)]
    assert lookup(c, q, salt="t") == [] and lookup(c, q, world_size=2) == []
    assert lookup(c, [1, 2, 3, 4, 1, 2, 3, 4]) == [(hexh(0xA), 0, 0)]   # once per chunk
    stats = c.call("GET", "/directory/stats")[1]["blend"]
    assert stats["enabled"] and stats["contents"] == 2 and stats["chunks"] == 3, stats
    # The chunk's last placement going takes it out of the index.
    assert post_events(c, store_batch(2, [store(0xA, a, 0)], etype="delete"))[0] == 200
    assert lookup(c, q) == [(hexh(0xB), 4, 1)]
    assert lookup(c, q, model="other") == [(hexh(0xC), 8, 6)]


def test_bound_probe_stride_and_bad_bodies(start_coordinator):
    c = start_coordinator(CHUNK_SIZE=str(K), ENABLE_BLEND_LOOKUP="1", MAX_BLEND_CHUNKS="2",
                          BLEND_PROBE_STRIDE="2")
    entries = [store(i + 1, [10 * i + j for j in range(K)], 4 * i) for i in range(3)]
    assert post_events(c, store_batch(1, entries))[0] == 200
    stats = c.call("GET", "/directory/stats")[1]["blend"]
    assert stats["chunks"] == 2 and stats["refused"] == 1, stats
    assert c.metric("lmcache_mp_coordinator_blend_refused_total") == 1
    assert c.metric("lmcache_mp_coordinator_blend_chunks") == 2
    # Probed at even positions only: the chunk at position 1 is not seen.
    assert lookup(c, [0, 1, 2, 3, 9]) == [(hexh(1), 0, 0)]
    assert lookup(c, [9, 0, 1, 2, 3]) == []
    good = {"model_name": "m", "world_size": 1, "tokens_b64": b64([1, 2, 3, 4])}
    for field, bad in [("model_name", None), ("world_size", 0), ("world_size", "1"),
                       ("cache_salt", 5), ("tokens_b64", "a"), ("tokens_b64", "AAA=")]:
        st, r = c.call("POST", "/directory/blend-lookup", {**good, field: bad})
        assert st == 400 and field in r["detail"], (field, bad, st, r)
    body = {k: v for k, v in good.items() if k != "tokens_b64"}
    st, r = c.call("POST", "/directory/blend-lookup", {**body, "token_ids": [1, -1]})
    assert st == 400 and "token_ids[1]" in r["detail"], r
    st, r = c.call("POST", "/directory/blend-lookup", raw=b"[1]")
    assert st == 400 and "JSON object" in r["detail"], r


def test_fleet_finds_a_servers_chunks_at_shifted_positions(fleet):
    """A real lmcached reports the tokens and positions of the chunks it
    stores; the coordinator then finds them inside another prompt."""
    f = fleet(ENABLE_BLEND_LOOKUP="true")
    srv = f.start("a")
    w = f.workers_of(srv, 100)[0]
    toks = prompt(3)                                   # 4 chunks of CS tokens
    assert w.store(toks, 0, 4 * CS, rid="s1")["chunk_indices"] == [0, 1, 2, 3]
    query = [7] * 5 + toks[2 * CS:3 * CS] + [8] * 3 + toks[CS:2 * CS]

    def found():
        return lookup(f.coord, query, world_size=2)
    got = wait_for("the chunks in the blend index", lambda: len(found()) == 2 and found())
    assert [(old, cur) for _, old, cur in got] == [(2 * CS, 5), (CS, 5 + CS + 3)], got
    assert lookup(f.coord, query, world_size=1) == []
