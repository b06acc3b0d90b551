"""P2P between cache servers when things go wrong (docs/p2p.md, "Failure
tests"): a peer killed in the middle of a load, peers that lie on the
ops or on the channel, a peer restarted over and over, the coordinator
going away; and the engines and readers the other files do not cover
(ucx over shared memory, a server-driven reader).  Real processes on
loopback throughout; the liars are tests/e2e/p2p_fakes.py."""
import os
import signal
import threading
import time

from lmc.client import lookup
from lmc.ops import CLEAR, NOOP
from lmc.server import free_port
from p2p_fakes import ChannelProxy, FakePeer, pattern
from paged_kv import PagedKV
from test_coordinator_api import Coordinator, start_coordinator  # noqa: F401 (fixture)
from test_lookup_engine_driven import CS, OBJ, Worker, chunk_bytes, prompt
from test_p2p_channel import BEAT, l2_status, p2p_args, p2p_status, wait_for
from test_server_driven import ZEROS, Engine, chunk_rows


def node_args(coord, name, chan_port, *extra, beat=BEAT, engine="tcp"):
    """A P2P node's flags: its engine, discovery through coord."""
    return (*p2p_args(coord, chan_port, engine), "--instance-id", name,
            "--coordinator-advertise-ip", "127.0.0.1",
            "--coordinator-heartbeat-interval", str(beat), *extra)


def noop_ok(s):
    d = s.dealer()
    try:
        return d.call(NOOP, timeout_ms=3000) is not None
    finally:
        d.close()


def timed_lookup(s, toks, rid):
    """(hits, seconds) of a LOOKUP on s waited for."""
    t0 = time.monotonic()
    hits = lookup(s, toks, rid, cs=CS, world_size=1, wait=True)
    return hits, time.monotonic() - t0


def check_prefix(got, toks, n):
    """A RETRIEVE's chunks are None (a miss) or the stored chunks' bytes,
    a leading run of them, never other bytes."""
    if got is None:
        return 0
    assert len(got) <= n and got == [chunk_bytes(0, toks, c) for c in range(len(got))]
    return len(got)


def lookup_until(s, toks, want, timeout):
    """LOOKUPs of toks on s, each as a new request, until one hits `want`
    chunks within timeout seconds; that one's request id."""
    deadline = time.monotonic() + timeout
    for i in range(10000):
        rid = f"until{i}"
        hits = lookup(s, toks, rid, cs=CS, world_size=1, wait=True)
        if hits == want:
            return rid
        assert time.monotonic() < deadline, f"{hits} hits, not {want}, after {timeout} s"
    raise AssertionError("unreachable")


def p2p_reader(s):
    """The /status of the one reader of the discovered peers' adapter."""
    peers = l2_status(s)["storage_manager"]["l2_adapters"][-1]["peers"]
    assert len(peers) == 1, peers
    return peers[0]


# ---- 1. a peer killed in the middle of a load --------------------------------

N_KILL = 16


def test_a_peer_killed_mid_load_is_a_miss_and_comes_back(start_server, start_coordinator):
    """A advertises a proxy in front of its channel; the proxy passes B's
    read up to half of its first item's bytes, and A is SIGKILLed there.
    B's LOOKUP finishes within its 1 s load timeout plus slack with no
    wrong bytes, B keeps serving with nothing left running, and once A is
    back under its instance id (same ports) B reads from it again."""
    coord = start_coordinator()
    a_chan = free_port()
    proxy = ChannelProxy(a_chan)
    a_args = node_args(coord, "node-a", proxy.port, "--p2p-listen-url", f"127.0.0.1:{a_chan}")
    a = start_server(*a_args)
    b = start_server(*node_args(coord, "node-b", free_port(), "--p2p-lookup-timeout", "1",
                                "--p2p-load-timeout", "1"))
    wa = Worker(a, 7001, 0, world_size=1)
    wb = Worker(b, 7002, 0, world_size=1)
    toks = prompt(21, N_KILL)
    wa.store(toks, 0, N_KILL * CS)
    wait_for(lambda st: st["p2p_peer_count"] == 1, lambda: p2p_status(b))

    proxy.cut = True
    result = {}
    t = threading.Thread(target=lambda: result.update(
        zip(("hits", "secs"), timed_lookup(b, toks, "r1"))))
    t.start()
    assert proxy.mid.wait(10), "B never read A's channel"
    a.stop(signal.SIGKILL)
    proxy.go.set()
    t.join(15)
    assert not t.is_alive(), "B's LOOKUP never finished"
    assert result["secs"] < 1 + 2, result            # the load timeout plus slack
    assert 0 <= result["hits"] < N_KILL
    got = wb.retrieve(toks, 0, N_KILL * CS, "r1", world_size=1)
    assert check_prefix(got, toks, N_KILL) == result["hits"]
    reader = p2p_reader(b)
    assert reader["load_failures"] >= N_KILL - result["hits"]
    assert noop_ok(b)
    st = l2_status(b)
    assert st["active_p2p_lookup_jobs"] == 0
    pc = st["storage_manager"]["prefetch_controller"]
    assert pc["queued"] == 0 and pc["submitted"] == pc["completed"], pc

    # A back under its instance id, on the same ports: B finds what it stores.
    a2 = start_server(*a_args, port=a.port)
    wa2 = Worker(a2, 7003, 0, world_size=1)
    toks2 = prompt(22, 4)
    wa2.store(toks2, 0, 4 * CS)
    rid = lookup_until(b, toks2, 4, timeout=15)
    assert wb.retrieve(toks2, 0, 4 * CS, rid, world_size=1) == \
        [chunk_bytes(0, toks2, c) for c in range(4)]
    wait_for(lambda st: st["leases_held"] == 0,
             lambda: l2_status(a2)["modules"]["p2p_serve"])
    proxy.close()
    for w in (wa, wb, wa2):
        w.close()


# ---- 2. a peer that lies ------------------------------------------------------

def fake_peer_node(start_server, coord, fake):
    """B, a real P2P node, and `fake` registered in the coordinator as
    the instance node-fake, discovered by B."""
    b = start_server(*node_args(coord, "node-b", free_port(), "--p2p-lookup-timeout", "0.5",
                                "--p2p-load-timeout", "1"))
    reg = {"instance_id": "node-fake", "ip": "127.0.0.1", "http_port": 1,
           "p2p_advertised_url": f"127.0.0.1:{fake.chan_port}", "mq_port": fake.mq_port}
    assert coord.call("POST", "/instances", reg)[0] == 200
    wait_for(lambda st: st["p2p_peer_count"] == 1, lambda: p2p_status(b))
    return b


def lie_on_the_ops(fake, lie):
    fake.op29_reply = None
    fake.lookup_reply = None
    if lie == "a shorter list":
        fake.lookup_reply = lambda ks: [{"offset": 0, "size": OBJ}] * (len(ks) - 1)
    elif lie == "a longer list":
        fake.lookup_reply = lambda ks: [{"offset": 0, "size": OBJ}] * (len(ks) + 1)
    elif lie == "no task id":
        fake.op29_reply = "task 1"
    elif lie == "negative offsets":
        fake.lookup_reply = lambda ks: [{"offset": -OBJ, "size": OBJ}] * len(ks)
    elif lie == "a size of another object":
        fake.lookup_reply = lambda ks: [{"offset": 0, "size": OBJ + 8}] + \
            [{"offset": (i + 1) * OBJ, "size": OBJ} for i in range(len(ks) - 1)]


def test_a_lying_peer_is_a_miss(start_server, start_coordinator):
    """A fake peer (p2p_fakes.FakePeer) discovered through the coordinator
    answers ops 29/30 or the channel with one lie at a time: every lie is
    a miss on B, counted, with no byte of it served as a hit, and B keeps
    serving. The same fake telling the truth is a hit, so the misses are
    the lies'."""
    coord = start_coordinator()
    fake = FakePeer(OBJ)
    b = fake_peer_node(start_server, coord, fake)
    wb = Worker(b, 7101, 0, world_size=1)
    seed = iter(range(100, 200))

    def ask(rid):
        toks = prompt(next(seed), 4)
        hits, secs = timed_lookup(b, toks, rid)
        got = wb.retrieve(toks, 0, 4 * CS, rid, world_size=1)
        assert noop_ok(b)
        return hits, secs, got

    def lied(lie, limit):
        """B's reader before and after a lie that must be a miss within
        limit seconds, and the unlocks the fake had before it."""
        before, unlocked = p2p_reader(b), len(fake.unlocked)
        hits, secs, got = ask(lie)
        assert (hits, got) == (0, None), lie
        assert secs < limit, (lie, secs)
        return before, p2p_reader(b), unlocked

    # The ops: a result that is not one address per key, or no task id,
    # fails the lookup; negative offsets are the wire's misses; an object
    # of another size is not taken, and its lease is given back at once.
    for lie, failure in [("a shorter list", 1), ("a longer list", 1), ("no task id", 1),
                         ("negative offsets", 0), ("a size of another object", 0)]:
        lie_on_the_ops(fake, lie)
        before, after, unlocked = lied(lie, 0.5 + 2)    # the lookup timeout plus slack
        assert after["lookups"] == before["lookups"] + 1, lie
        assert after["lookup_failures"] == before["lookup_failures"] + failure, lie
        assert after["hits"] == before["hits"] and after["loads"] == before["loads"], lie
        if lie == "a size of another object":
            wait_for(lambda n: n >= unlocked + 1, lambda: len(fake.unlocked))
    lie_on_the_ops(fake, None)

    # The channel: the lookup's addresses are right, the bytes never come.
    for lie in ["bad_magic", "wrong_id", "short_then_stall", "mask_then_close"]:
        fake.channel = lie
        before, after, unlocked = lied(lie, 1 + 2)      # the load timeout plus slack
        assert after["hits"] == before["hits"] + 4, lie
        assert after["load_failures"] == before["load_failures"] + 4, lie
        assert after["loaded_bytes"] == before["loaded_bytes"], lie
        # B gives the leases back though nothing arrived.
        wait_for(lambda n: n == unlocked + 4, lambda: len(fake.unlocked))

    fake.channel = "honest"
    hits, secs, got = ask("honest")
    assert hits == 4 and got == [pattern(c * OBJ, OBJ) for c in range(4)]
    assert fake.requests[-1] == [(c * OBJ, OBJ) for c in range(4)]
    assert p2p_reader(b)["loaded_bytes"] == 4 * OBJ
    wb.close()
    fake.close()


def test_leases_of_objects_b_does_not_take_are_given_back(start_server, start_coordinator):
    """A and B run the same model name with objects of different sizes: A
    leases its four hits to B's lookup, B takes none (docs/p2p.md,
    "Requesting side": "Keys the peer leased but that are not taken here
    (another size) are unlocked at once"), so A holds no lease after it."""
    coord = start_coordinator()
    a = start_server(*node_args(coord, "node-a", free_port()))
    b = start_server(*node_args(coord, "node-b", free_port()))
    wa = Worker(a, 7201, 0, world_size=1)
    wb = Worker(b, 7202, 0, world_size=1, hidden=16)     # objects of 2 x OBJ bytes
    toks = prompt(31, 4)
    wa.store(toks, 0, 4 * CS)
    wait_for(lambda st: st["p2p_peer_count"] == 1, lambda: p2p_status(b))
    assert lookup(b, toks, "r1", cs=CS, world_size=1, wait=True) == 0
    served = l2_status(a)["modules"]["p2p_serve"]
    assert served["hits"] == 4                    # A leased all four
    wait_for(lambda st: st["leases_held"] == 0,
             lambda: l2_status(a)["modules"]["p2p_serve"], timeout=5)
    wa.close()
    wb.close()


# ---- 3. churn ------------------------------------------------------------------

class Reader(threading.Thread):
    """B's engine in a loop: for each prompt of prompts() it drops B's
    own copies (CLEAR), LOOKUPs and RETRIEVEs it, checking that every byte
    retrieved is a stored byte; counts the chunks read per prompt."""

    def __init__(self, b, w, prompts):
        super().__init__(daemon=True)
        self.b, self.w, self.prompts = b, w, prompts
        self.stop = threading.Event()
        self.read = {}
        self.error = None
        self.rounds = 0

    def run(self):
        d = self.b.dealer()
        try:
            while not self.stop.is_set():
                for seed, toks in self.prompts():
                    self.rounds += 1
                    rid = f"churn{self.rounds}"
                    assert d.call(CLEAR, False) is not None
                    hits = lookup(d, toks, rid, cs=CS, world_size=1, wait=True)
                    got = self.w.retrieve(toks, 0, len(toks), rid, world_size=1)
                    n = check_prefix(got, toks, len(toks) // CS)
                    assert n == hits, (n, hits)
                    self.read[seed] = self.read.get(seed, 0) + n
        except BaseException as e:          # noqa: B902 (reported by the test)
            self.error = e
        finally:
            d.close()


def test_churn_of_a_peer(start_server, start_coordinator):
    """C is stopped (SIGTERM, SIGKILL alternately) and started again on
    new ports four times while B reads prompts stored on A and on C: B
    reads each incarnation of C, never a wrong byte, and afterwards no
    lease is left anywhere and B lists A and the last C."""
    coord = start_coordinator()
    a = start_server(*node_args(coord, "node-a", free_port()))
    b = start_server(*node_args(coord, "node-b", free_port(), "--p2p-lookup-timeout", "1",
                                "--p2p-load-timeout", "1"))
    wa = Worker(a, 7301, 0, world_size=1)
    wb = Worker(b, 7302, 0, world_size=1)
    a_toks = prompt(41, 4)
    wa.store(a_toks, 0, 4 * CS)
    current = {}

    def start_c(seed):
        c = start_server(*node_args(coord, "node-c", free_port()))
        w = Worker(c, 7303 + seed, 0, world_size=1)
        toks = prompt(seed, 3)
        w.store(toks, 0, 3 * CS)
        current.update(c=c, w=w, seed=seed, toks=toks)

    start_c(50)
    wait_for(lambda st: st["p2p_peer_count"] == 2, lambda: p2p_status(b))
    reader = Reader(b, wb, lambda: [(41, a_toks), (current["seed"], current["toks"])])
    reader.start()
    try:
        for i in range(5):
            wait_for(lambda r: r.get(current["seed"], 0) > 0 or reader.error,
                     lambda: reader.read, timeout=15)
            assert reader.error is None, reader.error
            if i == 4:
                break
            current["w"].close()
            current["c"].stop(signal.SIGTERM if i % 2 == 0 else signal.SIGKILL)
            start_c(51 + i)
    finally:
        reader.stop.set()
        reader.join(20)
    assert not reader.is_alive() and reader.error is None, reader.error
    assert reader.read[41] > 0 and all(reader.read[s] > 0 for s in range(50, 55))
    c = current["c"]
    for s in (a, b, c):
        assert s.alive()
        wait_for(lambda st: st["leases_held"] == 0,
                 lambda: l2_status(s)["modules"]["p2p_serve"])
    st = wait_for(lambda st: {p["instance_id"]: p["mq_port"] for p in st["p2p_peers"]} ==
                  {"node-a": a.port, "node-c": c.port}, lambda: p2p_status(b))
    assert st["p2p_state"] == "registered"
    peers = l2_status(b)["storage_manager"]["l2_adapters"][-1]
    assert {p["instance_id"]: p["peer_mq_server_url"] for p in peers["peers"]} == \
        {"node-a": a.url, "node-c": c.url}
    for p in peers["peers"]:
        assert p["load_failures"] <= p["hits"] <= p["lookups"] * 4, p
        assert p["loaded_bytes"] % OBJ == 0 and p["loaded_bytes"] // OBJ <= p["hits"], p
    # Each replaced C's reader went with its last use: none is kept.
    pool = wait_for(lambda p: p["retired_peers"] == 0,
                    lambda: l2_status(b)["storage_manager"]["l2_adapters"][-1])
    assert pool["retired_peers_freed"] >= 4
    assert l2_status(b)["active_p2p_lookup_jobs"] == 0
    for w in (wa, wb, current["w"]):
        w.close()


# ---- 4. the coordinator goes away ---------------------------------------------

SLOW_BEAT = 0.5


def test_peers_outlive_the_coordinator_for_three_polls(start_server, start_coordinator,
                                                       tmp_path):
    """docs/p2p.md, "Discovery": a poll that times out (the coordinator
    stopped) is "disconnected", one refused (killed) "unregistered", and
    each counts a miss against every peer; a peer is dropped after more
    than 3 misses in a row. Until then B reads A as fast as before; after
    it B asks no one; a coordinator back on the same port lists both again."""
    coord = start_coordinator()
    a = start_server(*node_args(coord, "node-a", free_port(), beat=SLOW_BEAT))
    b = start_server(*node_args(coord, "node-b", free_port(), beat=SLOW_BEAT))
    wa = Worker(a, 7401, 0, world_size=1)
    wb = Worker(b, 7402, 0, world_size=1)
    toks = [prompt(s, 4) for s in range(61, 65)]
    for t in toks:
        wa.store(t, 0, 4 * CS)
    wait_for(lambda st: st["p2p_peer_count"] == 1, lambda: p2p_status(b))
    hits, before = timed_lookup(b, toks[0], "r0")
    assert hits == 4 and before < 1

    seen = []                      # (state, misses) of each poll's outcome

    def observe():
        st = p2p_status(b)
        peer = st["p2p_peers"][0]["misses"] if st["p2p_peers"] else None
        if not seen or seen[-1] != (st["p2p_state"], peer):
            seen.append((st["p2p_state"], peer))
        return st

    os.kill(coord.proc.pid, signal.SIGSTOP)        # polls time out
    try:
        wait_for(lambda st: st["p2p_state"] == "disconnected", observe, timeout=10)
        hits, during = timed_lookup(b, toks[1], "r1")
        st = observe()
    finally:
        coord.stop(signal.SIGKILL)                 # polls are refused
    assert hits == 4 and during < 1, (hits, during)
    assert st["p2p_peer_count"] == 1, st
    wait_for(lambda st: st["p2p_peer_count"] == 0, observe, timeout=15)
    assert ("disconnected", 1) in seen and ("unregistered", 3) in seen, seen
    assert all(m is None or m <= 3 for _, m in seen), seen
    assert seen[-1] == ("unregistered", None), seen
    assert p2p_status(b)["p2p_discovery"]["peers_removed"] == 1
    assert p2p_status(a)["p2p_state"] == "unregistered"
    hits, after = timed_lookup(b, toks[2], "r2")
    assert hits == 0 and after < 1, (hits, after)        # no peer asked
    assert wb.retrieve(toks[1], 0, 4 * CS, "r1", world_size=1) == \
        [chunk_bytes(0, toks[1], c) for c in range(4)]

    # Back on the same port: the servers re-register and list each other.
    again = Coordinator(tmp_path / "again.db", port=coord.port)
    try:
        st = wait_for(lambda st: st["p2p_peer_count"] == 1 and st["p2p_state"] == "registered",
                      lambda: p2p_status(b), timeout=15)
        assert st["p2p_peers"][0]["instance_id"] == "node-a"
        assert lookup(b, toks[3], "r3", cs=CS, world_size=1, wait=True) == 4
    finally:
        problem = again.teardown_problem()
    assert problem is None, problem
    wa.close()
    wb.close()


# ---- 5. ucx over shared memory -------------------------------------------------

SHM_ENV = {"UCX_TLS": "shm,self", "UCX_MEM_MMAP_HOOK_MODE": "none"}


def test_ucx_over_shared_memory(start_server, start_coordinator):
    """docs/p2p.md, "UCX environment": two servers of one host with
    UCX_TLS=shm,self, B discovering A and reading its L1 with the ucx
    engine over UCX's shared-memory transports (no tcp transport allowed)."""
    coord = start_coordinator()
    a = start_server(*node_args(coord, "node-a", free_port(), engine="ucx"),
                     env=SHM_ENV)
    b = start_server(*node_args(coord, "node-b", free_port(), engine="ucx"),
                     env=SHM_ENV)
    assert "P2P transfer channel (ucx) on 127.0.0.1:" in a.output()
    wa = Worker(a, 7501, 0, world_size=1)
    wb = Worker(b, 7502, 0, world_size=1)
    toks = prompt(71, 4)
    wa.store(toks, 0, 4 * CS)
    wait_for(lambda st: st["p2p_peer_count"] == 1, lambda: p2p_status(b))
    assert lookup(b, toks, "r1", cs=CS, world_size=1, wait=True) == 4
    assert wb.retrieve(toks, 0, 4 * CS, "r1", world_size=1) == \
        [chunk_bytes(0, toks, c) for c in range(4)]
    reader = p2p_reader(b)
    assert reader["transfer_engine"] == "ucx" and reader["loaded_bytes"] == 4 * OBJ, reader
    # UCX's line for shared-memory transports (docs/p2p.md, "Failure detection").
    assert "no peer failure handler" in b.output()
    wait_for(lambda st: st["leases_held"] == 0,
             lambda: l2_status(a)["modules"]["p2p_serve"])
    wa.close()
    wb.close()


# ---- 6. a server-driven reader -------------------------------------------------

def test_a_server_driven_reader_gets_a_s_bytes(start_server, start_coordinator):
    """B's engine is server-driven (docs/protocol.md, "Server-driven
    transfer ops", CPU shared tensors): its RETRIEVE of what only A's L1
    holds writes A's bytes into its paged KV blocks."""
    coord = start_coordinator()
    a = start_server(*node_args(coord, "node-a", free_port()))
    b = start_server(*node_args(coord, "node-b", free_port()))
    wa = Worker(a, 7601, 0, world_size=1)
    toks = prompt(81, 3)
    wa.store(toks, 0, 3 * CS)
    # [2, layers, cs, heads x head size] = the engine-driven worker's objects.
    g = PagedKV("p2p_sd", "fa_hnd", nl=2, nb=16, bs=16, nh=2, hs=4)
    e = Engine(b, 7602, [g])
    untouched = g.block_bytes(15)
    wait_for(lambda st: st["p2p_peer_count"] == 1, lambda: p2p_status(b))
    assert lookup(b, toks, "r1", cs=CS, world_size=1, wait=True) == 3
    dst = [9, 4, 7]
    assert e.retrieve(toks, 0, 3 * CS, [dst], "r1", skip=0) == [ZEROS, True]
    for c in range(3):
        assert b"".join(chunk_rows(g, dst, c, cs=CS)) == chunk_bytes(0, toks, c), c
    assert g.block_bytes(15) == untouched
    assert p2p_reader(b)["loaded_bytes"] == 3 * OBJ
    e.close()
    wa.close()
