"""The P2P transfer channel of a running server (docs/p2p.md, "Running
the channel"): with --p2p-advertise-url, lmcached lends its L1 arena at
the listen URL; a peer reads exactly the ranges leased to it with ops
29/30 and nothing else, in upstream's LMTCP001 framing (docs/p2p.md,
"Framing (tcp)"), read here by a client written from that table."""
import hmac
import json
import os
import socket
import threading
import time
import urllib.request

import pytest
import struct

from lmc.client import lookup
from lmc.ops import NOOP, P2P_UNLOCK_OBJECTS
from lmc.server import free_port, l2_fs_args, run_lmcached
from test_coordinator_api import start_coordinator  # noqa: F401 (fixture)
from test_lookup_engine_driven import CS, OBJ, Worker, chunk_bytes, prompt
from test_p2p_serve import lock, query, store_prompt


def recv_exact(sock, n):
    out = bytearray()
    while len(out) < n:
        got = sock.recv(n - len(out))
        assert got, "the channel closed mid-reply"
        out += got
    return bytes(out)


def prove_token(sock, token, holder):
    """The client's side of the channel's token handshake, written from
    the table of docs/p2p.md, "Trust model"."""
    cn = os.urandom(16)
    sock.sendall(b"LMP2PA01" + cn)
    answer = recv_exact(sock, 8 + 16 + 32)
    assert answer[:8] == b"LMP2PA01"
    sn = answer[8:24]
    key = token.encode()
    assert answer[24:] == hmac.new(key, b"lmcached p2p server" + cn + sn, "sha256").digest()
    named = bytes([len(holder)]) + holder
    sock.sendall(named + hmac.new(key, b"lmcached p2p client" + cn + sn + named,
                                  "sha256").digest())


class Channel:
    """A tcp-engine client: handshake, then (offset, length) requests."""

    def __init__(self, port, token=None, holder=b""):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        if token is not None:
            prove_token(self.sock, token, holder)
        self.sock.sendall(b"LMTCP001")
        assert recv_exact(self.sock, 8) == b"LMTCP001"
        self.rid = 0

    def read(self, items):
        """One request; per item its bytes, or None when refused."""
        self.rid += 1
        req = struct.pack("<III", 1, self.rid, len(items))
        req += b"".join(struct.pack("<qq", off, ln) for off, ln in items)
        self.sock.sendall(req)
        typ, rid, n, mlen = struct.unpack("<IIII", recv_exact(self.sock, 16))
        assert (typ, rid, n, mlen) == (2, self.rid, len(items), (len(items) + 7) // 8)
        mask = recv_exact(self.sock, mlen)
        return [recv_exact(self.sock, ln) if mask[i // 8] >> (i % 8) & 1 else None
                for i, (_, ln) in enumerate(items)]

    def close(self):
        self.sock.close()


def p2p_args(coord, port, engine="tcp"):
    return ("--p2p-advertise-url", f"127.0.0.1:{port}", "--p2p-transfer-engine", engine,
            "--coordinator-url", f"http://127.0.0.1:{coord.port}", "--chunk-size", str(CS))


def test_channel_serves_leased_ranges_only(start_server, start_coordinator, tmp_path):
    coord = start_coordinator()
    port = free_port()
    s = start_server(*p2p_args(coord, port), *l2_fs_args(tmp_path))
    assert "P2P transfer channel (tcp) on 127.0.0.1:" in s.output()
    w, toks, keys = store_prompt(s, tmp_path, 1, n_chunks=2)
    d = s.dealer()
    addrs = query(d, lock(d, keys[:1]))
    ch = Channel(port)
    leased = (addrs[0]["offset"], OBJ)
    # keys[1] is stored but not leased: its bytes are refused.
    other = chunk1_offset(w, toks)
    assert ch.read([leased]) == [chunk_bytes(0, toks, 0)]
    got = ch.read([leased, (other, OBJ), (leased[0], OBJ // 2), (1 << 62, 8)])
    assert got == [chunk_bytes(0, toks, 0), None, chunk_bytes(0, toks, 0)[:OBJ // 2], None]
    assert d.call(P2P_UNLOCK_OBJECTS, keys[:1]) is not None
    assert ch.read([leased]) == [None]                 # unlocked: refused
    ch.close()
    d.close()
    w.close()


def chunk1_offset(w, toks):
    """The arena offset of chunk 1 of toks, found in the worker's view of
    the SHM pool (the same arena the channel lends)."""
    body = chunk_bytes(0, toks, 1)
    off = bytes(w.pool).find(body)
    assert off >= 0
    return off


def test_unservable_engine_values_are_refused_naming_the_flag(start_coordinator):
    coord = start_coordinator()
    base = ("--l1-size-gb", "0.0625", "--eviction-policy", "LRU", "--port", str(free_port()),
            "--http-port", str(free_port()))
    for extra, flag in [
        (("--p2p-transfer-engine", "rdma9"), "--p2p-transfer-engine"),
        (("--p2p-transfer-engine", "verbs", "--p2p-rdma-device", "mlx5_0",
          "--p2p-rdma-gid-index", "3"), "--p2p-rdma-gid-index"),
        (("--p2p-transfer-engine", "verbs", "--p2p-rdma-device", "mlx5_0",
          "--p2p-rdma-queue-depth", "64"), "--p2p-rdma-queue-depth"),
    ]:
        args = p2p_args(coord, free_port())[:2] + extra + p2p_args(coord, 0)[4:]
        r = run_lmcached(*base, *args)
        assert r.returncode == 1 and flag in r.stderr, (extra, r.returncode, r.stderr)
    # verbs' device and port become UCX_NET_DEVICES; an environment that
    # names other devices is refused rather than overridden.
    r = run_lmcached(*base, *p2p_args(coord, free_port())[:2], "--p2p-transfer-engine", "verbs",
                     "--p2p-rdma-device", "mlx5_0", *p2p_args(coord, 0)[4:],
                     env={"UCX_NET_DEVICES": "eth9"})
    assert r.returncode == 1 and "--p2p-rdma-device" in r.stderr and "mlx5_0:1" in r.stderr, \
        r.stderr
    # A listen URL that is taken fails the start, naming the flag.
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        r = run_lmcached(*base, *p2p_args(coord, busy.getsockname()[1]))
        assert r.returncode == 1 and "--p2p-listen-url" in r.stderr, r.stderr


def test_nixl_is_served_by_the_ucx_engine(start_server, start_coordinator):
    """Upstream's default engine name runs the ucx engine: a connection to
    the listen URL gets its bootstrap (docs/p2p.md, "Bootstrap (ucx)")."""
    coord = start_coordinator()
    port = free_port()
    s = start_server(*p2p_args(coord, port, engine="nixl"),
                     env={"UCX_TLS": "tcp", "UCX_MEM_MMAP_HOOK_MODE": "none"})
    out = s.output()
    assert "--p2p-transfer-engine nixl: served by the ucx engine" in out
    assert "P2P transfer channel (ucx) on 127.0.0.1:" in out
    with socket.create_connection(("127.0.0.1", port), timeout=10) as c:
        assert recv_exact(c, 8) == b"LMUCX001"


# ---- discovery (docs/p2p.md, "Discovery") ------------------------------------

BEAT = 0.2


def p2p_status(s):
    with urllib.request.urlopen(f"http://127.0.0.1:{s.http_port}/status", timeout=5) as r:
        st = json.loads(r.read())
    return {k: v for k, v in st.items() if k.startswith("p2p_")}


def wait_for(what, probe, timeout=15):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = probe()
        if what(got):
            return got
        time.sleep(0.05)
    raise AssertionError(f"never happened; last: {got}")


UCX_ENV = {"UCX_TLS": "tcp", "UCX_MEM_MMAP_HOOK_MODE": "none"}


def p2p_node(start_server, coord, name, engine="tcp", *extra):
    port = free_port()
    return start_server(*p2p_args(coord, port, engine), "--instance-id", name,
                        "--coordinator-advertise-ip", "127.0.0.1",
                        "--coordinator-heartbeat-interval", str(BEAT), *extra,
                        env=None if engine == "tcp" else UCX_ENV), port


def test_two_servers_discover_each_other(start_server, start_coordinator):
    coord = start_coordinator()
    a, a_port = p2p_node(start_server, coord, "node-a")
    b, b_port = p2p_node(start_server, coord, "node-b")
    st = wait_for(lambda st: st["p2p_peer_count"] == 1, lambda: p2p_status(a))
    assert st["p2p_enabled"] is True and st["p2p_state"] == "registered"
    peer = st["p2p_peers"][0]
    assert peer == {"instance_id": "node-b", "ip": "127.0.0.1", "mq_port": b.port,
                    "p2p_advertised_url": f"127.0.0.1:{b_port}", "misses": 0}
    wait_for(lambda st: st["p2p_peers"] and st["p2p_peers"][0]["instance_id"] == "node-a",
             lambda: p2p_status(b))
    # A registration that changes its address replaces the peer; one
    # without a channel URL or mq port is no peer.
    fake = {"instance_id": "node-c", "ip": "127.0.0.9", "http_port": 1,
            "p2p_advertised_url": "127.0.0.9:1", "mq_port": 7}
    assert coord.call("POST", "/instances", fake)[0] == 200
    wait_for(lambda st: st["p2p_peer_count"] == 2, lambda: p2p_status(a))
    assert coord.call("POST", "/instances", dict(fake, mq_port=8))[0] == 200
    st = wait_for(lambda st: st["p2p_discovery"]["peers_replaced"] == 1, lambda: p2p_status(a))
    assert {p["instance_id"]: p["mq_port"] for p in st["p2p_peers"]} == {"node-b": b.port,
                                                                        "node-c": 8}
    assert coord.call("POST", "/instances", dict(fake, instance_id="node-d", mq_port=0))[0] == 200
    # A peer gone from the list is dropped after more than 3 polls miss it.
    assert coord.call("DELETE", "/instances/node-c")[0] == 204
    t0 = time.monotonic()
    st = wait_for(lambda st: st["p2p_peer_count"] == 1, lambda: p2p_status(a))
    assert time.monotonic() - t0 >= 3 * BEAT
    assert st["p2p_discovery"]["peers_removed"] == 1
    assert [p["instance_id"] for p in st["p2p_peers"]] == ["node-b"]
    # node-c's two readers (replaced, then dropped) held no lease: both are
    # gone, not kept until shutdown.
    pool = l2_status(a)["storage_manager"]["l2_adapters"][-1]
    assert (pool["retired_peers"], pool["retired_peers_freed"]) == (0, 2)


def test_status_without_p2p(start_server):
    st = p2p_status(start_server())
    assert st == {"p2p_enabled": False, "p2p_state": "disabled", "p2p_peer_count": 0,
                  "p2p_peers": []}


# ---- the requesting side: a `p2p` L2 adapter (docs/p2p.md, "Requesting side") --

def p2p_adapter_args(a, a_chan_port, **extra):
    spec = {"type": "p2p", "peer_mq_server_url": f"tcp://127.0.0.1:{a.port}",
            "peer_transfer_channel_server_url": f"127.0.0.1:{a_chan_port}",
            "lookup_timeout": 3, "load_timeout": 3, **extra}
    return ("--l2-adapter", json.dumps(spec))


def l2_status(s):
    with urllib.request.urlopen(f"http://127.0.0.1:{s.http_port}/status", timeout=5) as r:
        return json.loads(r.read())


def test_lookup_and_retrieve_on_b_read_a_s_l1(start_server, start_coordinator):
    coord = start_coordinator()
    a_chan = free_port()
    a = start_server(*p2p_args(coord, a_chan))
    b = start_server("--chunk-size", str(CS), *p2p_adapter_args(a, a_chan))
    wa = Worker(a, 3001, 0, world_size=1)
    toks = prompt(5)
    wa.store(toks, 0, 4 * CS)
    wb = Worker(b, 3002, 0, world_size=1)
    assert lookup(b, toks, "r1", cs=CS, world_size=1, wait=True) == 4
    assert wb.retrieve(toks, 0, 4 * CS, "r1", world_size=1) == \
        [chunk_bytes(0, toks, c) for c in range(4)]
    # The leases on A went back once B's load was done.
    wait_for(lambda st: st["leases_held"] == 0,
             lambda: l2_status(a)["modules"]["p2p_serve"])
    # What only B's L1 now holds is B's own: a lookup of a prompt A never
    # stored misses on both.
    assert lookup(b, prompt(6), "r2", cs=CS, world_size=1, wait=True) == 0
    wa.close()
    wb.close()


def test_a_peer_that_is_down_is_a_miss(start_server):
    b = start_server("--chunk-size", str(CS),
                     *p2p_adapter_args(type("A", (), {"port": free_port()}), free_port(),
                                       lookup_timeout=0.5))
    assert lookup(b, prompt(7), "r1", cs=CS, world_size=1, wait=True) == 0
    d = b.dealer()
    assert d.call(NOOP) is not None
    d.close()


def b_reads_what_a_stored(a, b, seed, worker_id):
    """A stores 4 chunks; B, once it lists A, finds all 4 and retrieves A's
    bytes.  Returns the two workers."""
    wa = Worker(a, worker_id, 0, world_size=1)
    toks = prompt(seed)
    wa.store(toks, 0, 4 * CS)
    wb = Worker(b, worker_id + 1, 0, world_size=1)
    wait_for(lambda st: st["p2p_peer_count"] == 1, lambda: p2p_status(b))
    assert lookup(b, toks, "r1", cs=CS, world_size=1, wait=True) == 4
    assert wb.retrieve(toks, 0, 4 * CS, "r1", world_size=1) == \
        [chunk_bytes(0, toks, c) for c in range(4)]
    return wa, wb


@pytest.mark.parametrize("engine", ["tcp", "nixl"])
def test_discovered_peers_are_read_from(start_server, start_coordinator, engine):
    """No --l2-adapter: B finds A through the coordinator and reads A's L1,
    over the engine both run (nixl: the ucx engine)."""
    coord = start_coordinator()
    a, _ = p2p_node(start_server, coord, "node-a", engine)
    b, _ = p2p_node(start_server, coord, "node-b", engine)
    wa, wb = b_reads_what_a_stored(a, b, 8, 4001)
    wait_for(lambda st: st["leases_held"] == 0,
             lambda: l2_status(a)["modules"]["p2p_serve"])
    peers = l2_status(b)["storage_manager"]["l2_adapters"][-1]
    assert peers["type_name"] == "p2p" and peers["peers"][0]["instance_id"] == "node-a"
    assert peers["peers"][0]["hits"] >= 4
    assert peers["peers"][0]["transfer_engine"] == ("tcp" if engine == "tcp" else "ucx")
    m = metrics_text(b)
    assert f'lmcache_mp_p2p_peer_hits_total{{peer="node-a"}} {peers["peers"][0]["hits"]}' in m
    assert f'lmcache_mp_p2p_peer_read_bytes_total{{peer="node-a"}} {4 * OBJ}' in m
    assert 'lmcache_mp_p2p_peer_load_failures_total{peer="node-a"} 0' in m
    wa.close()
    wb.close()


def test_the_p2p_adapter_reports_no_l2_placements(start_server, start_coordinator):
    """Its 0-byte stores hold nothing: the coordinator's directory must not
    list this server's keys in a "p2p" L2 (docs/p2p.md, "Requesting side")."""
    coord = start_coordinator()
    b = start_server(*p2p_args(coord, free_port()), "--instance-id", "node-b",
                     "--coordinator-event-reporting", "--coordinator-event-flush-interval",
                     "0.1", "--coordinator-heartbeat-interval", str(BEAT))
    w = Worker(b, 5001, 0, world_size=1)
    w.store(prompt(9), 0, 2 * CS)
    l1 = wait_for(lambda r: r[1]["total"] == 2,
                  lambda: coord.call("GET", "/directory/keys?tier=l1&instance_id=node-b"))
    assert l1[0] == 200
    time.sleep(0.5)                       # a later batch would carry the L2 placements
    assert coord.call("GET", "/directory/keys?tier=l2")[1]["total"] == 0
    w.close()


def test_a_discovered_peer_that_is_down_is_a_miss(start_server, start_coordinator):
    """A listed peer whose mq port answers nothing costs a lookup the 3 s
    RPC deadline, counted in active_p2p_lookup_jobs meanwhile, then misses."""
    coord = start_coordinator()
    b, _ = p2p_node(start_server, coord, "node-b")
    dead = {"instance_id": "node-dead", "ip": "127.0.0.1", "http_port": 1,
            "p2p_advertised_url": f"127.0.0.1:{free_port()}", "mq_port": free_port()}
    assert coord.call("POST", "/instances", dead)[0] == 200
    wait_for(lambda st: st["p2p_peer_count"] == 1, lambda: p2p_status(b))
    assert l2_status(b)["active_p2p_lookup_jobs"] == 0
    wb = Worker(b, 6001, 0, world_size=1)     # a lookup reaches L2 with a layout only
    result = {}
    t = threading.Thread(target=lambda: result.update(
        hits=lookup(b, prompt(10), "r1", cs=CS, world_size=1, wait=True)))
    t0 = time.monotonic()
    t.start()
    wait_for(lambda st: st["active_p2p_lookup_jobs"] == 1, lambda: l2_status(b), timeout=5)
    t.join(15)
    assert result == {"hits": 0} and 2.5 <= time.monotonic() - t0 < 10
    assert l2_status(b)["active_p2p_lookup_jobs"] == 0
    # The silent peer is now in its backoff: the next lookup does not ask
    # it, and misses at once.
    t0 = time.monotonic()
    assert lookup(b, prompt(12), "r2", cs=CS, world_size=1, wait=True) == 0
    assert time.monotonic() - t0 < 1.0
    peer = l2_status(b)["storage_manager"]["l2_adapters"][-1]["peers"][0]
    assert peer["instance_id"] == "node-dead"
    assert (peer["lookup_timeouts"], peer["lookups_skipped"]) == (1, 1)
    assert 0 < peer["backoff_ms"] <= 1000
    m = metrics_text(b)
    assert 'lmcache_mp_p2p_peer_lookup_timeouts_total{peer="node-dead"} 1' in m
    assert 'lmcache_mp_p2p_peer_lookups_skipped_total{peer="node-dead"} 1' in m
    assert "lmcache_mp_p2p_peers 1" in m
    wb.close()


def metrics_text(s):
    with urllib.request.urlopen(f"http://127.0.0.1:{s.http_port}/metrics", timeout=5) as r:
        return r.read().decode()


@pytest.mark.parametrize("engine", ["tcp", "nixl"])
def test_the_channel_wants_the_coordinator_token(start_server, start_coordinator, engine):
    """With --coordinator-auth-token the channel serves only connections
    that prove the token (docs/p2p.md, "Trust model"): the fleet's nodes
    read each other; a client without it gets nothing, not even the
    handshake (tcp) or the bootstrap with the remote key (ucx)."""
    coord = start_coordinator(AUTH_TOKEN="fleet-tok")
    tok = ("--coordinator-auth-token", "fleet-tok")
    a, a_port = p2p_node(start_server, coord, "node-a", engine, *tok)
    b, _ = p2p_node(start_server, coord, "node-b", engine, *tok)
    assert "requires the token" in a.output()
    wa, wb = b_reads_what_a_stored(a, b, 11, 7001)
    # A client that knows no token: upstream's plain handshake (tcp), or
    # a bare connect waiting for the bootstrap (ucx).
    sock = socket.create_connection(("127.0.0.1", a_port), timeout=10)
    if engine == "tcp":
        sock.sendall(b"LMTCP001")
    assert sock.recv(64) == b""
    sock.close()
    wa.close()
    wb.close()


def test_with_the_token_a_peer_reads_only_its_own_leases(start_server, start_coordinator,
                                                        tmp_path):
    """With the token, the holder a connection names (the routing id of the
    message-queue connection that took the leases) is checked: a range
    leased to peer X is served to X, refused to Y and to a connection that
    names no holder, which holds nothing (docs/p2p.md, "Trust model")."""
    coord = start_coordinator(AUTH_TOKEN="fleet-tok")
    port = free_port()
    s = start_server(*p2p_args(coord, port), *l2_fs_args(tmp_path),
                     "--coordinator-auth-token", "fleet-tok")
    w, toks, keys = store_prompt(s, tmp_path, 2, n_chunks=2)
    dx = s.dealer(routing_id=b"peer-x")
    dy = s.dealer(routing_id=b"peer-y")
    x_range = (query(dx, lock(dx, keys[:1]))[0]["offset"], OBJ)
    y_range = (query(dy, lock(dy, keys[1:2]))[0]["offset"], OBJ)
    as_x = Channel(port, "fleet-tok", b"peer-x")
    as_y = Channel(port, "fleet-tok", b"peer-y")
    nobody = Channel(port, "fleet-tok")
    assert as_x.read([x_range, y_range]) == [chunk_bytes(0, toks, 0), None]
    assert as_y.read([x_range, y_range]) == [None, chunk_bytes(0, toks, 1)]
    assert nobody.read([x_range, y_range]) == [None, None]
    # Y cannot give back X's lease either: X's range stays readable to X.
    assert dy.call(P2P_UNLOCK_OBJECTS, keys[:1]) is not None
    assert as_x.read([x_range]) == [chunk_bytes(0, toks, 0)]
    for c in (as_x, as_y, nobody):
        c.close()
    dx.close()
    dy.close()
    w.close()


def test_a_lookup_sent_to_a_dead_peer_is_not_delivered_when_it_returns(start_server):
    """ZMQ would hold a lookup sent while the peer is down and deliver it
    when the peer comes back, leasing objects no one unlocks; the reader
    drops it by redialling after the silence (docs/p2p.md, "Requesting
    side")."""
    import zmq
    mq_port = free_port()
    ctx = zmq.Context.instance()

    def peer():
        sock = ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.bind(f"tcp://127.0.0.1:{mq_port}")
        return sock

    f = peer()                                   # up, so that B's socket connects
    b = start_server("--chunk-size", str(CS),
                     *p2p_adapter_args(type("A", (), {"port": mq_port}), free_port(),
                                       lookup_timeout=0.5))
    wb = Worker(b, 8001, 0, world_size=1)
    time.sleep(0.3)
    f.close()                                    # the peer dies
    assert lookup(b, prompt(13), "r1", cs=CS, world_size=1, wait=True) == 0
    f = peer()                                   # and comes back on its port
    seen = []
    deadline = time.monotonic() + 2.0            # B's own reconnect takes up to 1 s
    while time.monotonic() < deadline:
        if f.poll(50):
            seen.append(f.recv_multipart())
    f.close()
    assert seen == []
    wb.close()
