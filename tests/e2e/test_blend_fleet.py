"""CacheBlend across a fleet (issue 35; docs/cacheblend.md, "Coordinator
directory"): two `--engine-type blend` servers report to one coordinator.
Server A stores documents; server B, asked for a prompt that holds them
reordered, gets its matches from the coordinator's fragment index (its
own matcher never saw them), loads the chunks in the lookup's sparse leg
(from a shared fs L2, or from A's L1 over P2P), and scatters them
re-rotated into B's worker's blocks."""
import pytest

import blend_client as bc
from lmc.client import unpack
from lmc.keys import ipc_key
from test_blend import (CS, DST, EXPECTED, HS, MAX_POSITION, NB, NEW_PROMPT, NH, NL, NO_EVENT,
                        Worker, check_found, check_scattered, status, store_documents)
from test_fleet import Fleet, wait_for, wait_l2_written
from test_p2p_channel import p2p_args
from lmc.server import Server, free_port
from paged_kv import PagedKV

BLEND = ("--engine-type", "blend", "--cpu-kv-layout", "hint", "--rpc-error-frames")


@pytest.fixture
def blend_fleet(tmp_path):
    f = Fleet(tmp_path, ENABLE_BLEND_LOOKUP="true")
    yield f
    f.close()


def worker(srv, instance, tag):
    g = PagedKV(tag, "fa_nhd", nl=NL, nb=NB, bs=8, nh=NH, hs=HS, dtype="bfloat16")
    w = Worker(srv, instance, g)
    w.cache = bc.RopeCache(tag, MAX_POSITION, HS)
    assert len(bc.register_rope(w.d, instance, [w.cache], HS, True)) == 2
    return w


def p2p_server(f, name):
    """A blend server without L2 that reads its peers' L1 over the tcp
    channel (docs/p2p.md, "Running two nodes")."""
    srv = Server(*p2p_args(f.coord, free_port()), "--instance-id", name,
                 "--coordinator-advertise-ip", "127.0.0.1",
                 "--coordinator-heartbeat-interval", "0.3", "--coordinator-event-reporting",
                 "--coordinator-event-flush-interval", "0.2", *BLEND)
    f.servers[name] = srv
    return srv


@pytest.mark.parametrize("via", ["shared L2", "P2P"])
def test_a_document_stored_on_one_server_is_found_through_the_directory_by_the_other(
        blend_fleet, via):
    f = blend_fleet
    if via == "P2P":
        a, b = p2p_server(f, "blend-a"), p2p_server(f, "blend-b")
        wait_for("b lists a as its peer", lambda: status(b)["p2p_peer_count"] == 1)
    else:
        a, b = f.start("blend-a", *BLEND), f.start("blend-b", *BLEND)
    wa, wb = worker(a, 5, "fleet-a"), worker(b, 6, "fleet-b")
    try:
        store_documents(wa)
        if via == "shared L2":
            wait_l2_written(a, 12)      # 4 documents x 3 chunks, in the shared L2

        def fleet_matches():
            st, r = f.coord.call("POST", "/directory/blend-lookup", {
                "token_ids": NEW_PROMPT, "model_name": "m", "world_size": 1, "cache_salt": ""})
            assert st == 200, r
            return [(m["old_st"], m["cur_st"]) for m in r["matches"]]
        # B's matches come from the coordinator: wait until its index has
        # the documents (the cache-event stream is flushed every 0.2 s).
        # Every stored chunk is in the index, the preambles too: preamble 0
        # matches at position 0.
        want = [(0, 0)] + [(o, c) for _, o, c in EXPECTED]
        wait_for("the documents in the fleet's index", lambda: fleet_matches() == want)
        assert status(b)["modules"]["blend"]["registered_chunks"] == 0   # B stored nothing
        result = bc.unified_lookup(wb.d, NEW_PROMPT, "fleet", CS, timeout_s=20)
        # Preamble 0 is a prefix hit from the shared L2 or the peer; the
        # fleet's match of it at 0 lies inside that prefix and is dropped.
        found = check_found(result)
        st = status(b)["modules"]["blend"]
        assert st["coordinator"] and st["counts"]["coordinator_matches"] == len(want), st
        assert st["counts"]["l2_loads"] >= len(EXPECTED), st
        key = ipc_key(NEW_PROMPT, 0, len(NEW_PROMPT), "fleet", worker_id=0)
        reply = unpack(wb.d.call(bc.CB_RETRIEVE_PRE_COMPUTED, key, found, [DST], 6, b""))
        assert reply == [NO_EVENT, True], b.output()[-3000:]
        check_scattered(wb.g, found, DST, wa.cache, True, HS, src_g=wa.g)
        if via == "P2P":
            peers = status(b)["storage_manager"]["l2_adapters"][-1]["peers"]
            assert peers[0]["instance_id"] == "blend-a" and peers[0]["hits"] >= len(EXPECTED)
    finally:
        for w in (wa, wb):
            w.cache.close()
            w.close()
