"""Stand-ins for a P2P peer that misbehaves (docs/p2p.md): FakePeer answers
ops 29-31 on a ZMQ ROUTER and serves a transfer channel in the LMTCP001
framing, each the way the test says (honestly, or with one lie);
ChannelProxy sits between a requester and a real server's channel and
can cut a reply in the middle, so that a test can kill the server there."""
import socket
import struct
import threading

import msgpack
import zmq

from lmc.ops import P2P_LOOKUP_AND_LOCK, P2P_QUERY_LOOKUP_RESULTS, P2P_UNLOCK_OBJECTS
from lmc.server import free_port

MAGIC = b"LMTCP001"


def recv_exact(sock, n):
    """n bytes, or None when the peer closed first."""
    out = bytearray()
    while len(out) < n:
        got = sock.recv(n - len(out))
        if not got:
            return None
        out += got
    return bytes(out)


def read_request(sock):
    """(request id, [(offset, length)]) of one channel request, or None."""
    hdr = recv_exact(sock, 12)
    if hdr is None:
        return None
    typ, rid, n = struct.unpack("<III", hdr)
    body = recv_exact(sock, 16 * n)
    if typ != 1 or body is None:
        return None
    return rid, [struct.unpack_from("<qq", body, 16 * i) for i in range(n)]


def reply_header(rid, n):
    return struct.pack("<IIII", 2, rid, n, (n + 7) // 8)


def full_mask(n):
    return bytes([0xFF] * ((n + 7) // 8))


class _Listener:
    """A TCP listener on loopback, one thread per connection running
    serve(sock); every socket is closed by close()."""

    def __init__(self, serve):
        self.serve = serve
        self.srv = socket.create_server(("127.0.0.1", 0))
        self.port = self.srv.getsockname()[1]
        self.socks = []
        self.closing = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while not self.closing:
            try:
                c, _ = self.srv.accept()
            except OSError:
                return
            self.socks.append(c)
            threading.Thread(target=self._run, args=(c,), daemon=True).start()

    def _run(self, c):
        try:
            self.serve(c)
        except OSError:
            pass
        finally:
            c.close()

    def close(self):
        self.closing = True
        self.srv.close()
        for c in self.socks:
            c.close()


def pattern(offset, length):
    """The bytes the fake peer's arena holds at [offset, offset + length)."""
    return bytes((offset + i) * 7 % 251 for i in range(length))


class FakePeer:
    """A peer lmcached as far as a requester can see: ops 29-31 on
    tcp://127.0.0.1:mq_port and a tcp-engine channel on chan_port.

    lookup_reply(keys) -> the address list op 30 answers (default: every
    key a hit of `size` bytes, one after another); op29_reply: what op 29
    answers instead of a task id, if set.  channel: "honest" (serves
    pattern() bytes), "bad_magic", "wrong_id", "short_then_stall" (header,
    mask and half the first item, then silence), "mask_then_close" (header
    and a mask claiming every item, a few bytes, then the connection
    closes)."""

    def __init__(self, size):
        self.size = size
        self.lookup_reply = None
        self.op29_reply = None
        self.channel = "honest"
        self.unlocked = []            # the keys op 31 gave back, in order
        self.requests = []            # channel requests: [(offset, length)]
        self.mq_port = free_port()
        self.ctx = zmq.Context()
        self.router = self.ctx.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.LINGER, 0)
        self.router.bind(f"tcp://127.0.0.1:{self.mq_port}")
        self.stopping = threading.Event()
        self.tasks = {}
        self.last_task = 0
        self.mq_thread = threading.Thread(target=self._serve_mq, daemon=True)
        self.mq_thread.start()
        self.chan = _Listener(self._serve_chan)
        self.chan_port = self.chan.port

    def _answer(self, op, args):
        if op == P2P_LOOKUP_AND_LOCK:
            if self.op29_reply is not None:
                return self.op29_reply
            self.last_task += 1
            task = self.last_task
            keys = args[0]
            self.tasks[task] = (self.lookup_reply or (lambda ks: [
                {"offset": i * self.size, "size": self.size} for i in range(len(ks))]))(keys)
            return task
        if op == P2P_QUERY_LOOKUP_RESULTS:
            return self.tasks.pop(args[0], None)
        if op == P2P_UNLOCK_OBJECTS:
            self.unlocked += args[0]
            return None
        return None

    def _serve_mq(self):
        poller = zmq.Poller()
        poller.register(self.router, zmq.POLLIN)
        while not self.stopping.is_set():
            if not poller.poll(50):
                continue
            frames = self.router.recv_multipart()
            rid, uid, op = frames[0], frames[1], msgpack.unpackb(frames[2])
            args = [msgpack.unpackb(f, raw=False) for f in frames[3:]]
            out = self._answer(op, args)
            reply = [rid, uid, frames[2]]
            if out is not None:
                reply.append(msgpack.packb(out, use_bin_type=True))
            self.router.send_multipart(reply)

    def _serve_chan(self, c):
        mode = self.channel
        if recv_exact(c, 8) != MAGIC:
            return
        if mode == "bad_magic":
            c.sendall(b"LMTCP999")
            recv_exact(c, 1)                  # until the requester hangs up
            return
        c.sendall(MAGIC)
        while True:
            req = read_request(c)
            if req is None:
                return
            rid, items = req
            self.requests.append(items)
            n = len(items)
            if mode == "honest":
                c.sendall(reply_header(rid, n) + full_mask(n) +
                          b"".join(pattern(off, ln) for off, ln in items))
            elif mode == "wrong_id":
                c.sendall(reply_header(rid + 1, n) + full_mask(n) +
                          b"".join(pattern(off, ln) for off, ln in items))
            elif mode == "short_then_stall":
                off, ln = items[0]
                c.sendall(reply_header(rid, n) + full_mask(n) + pattern(off, ln // 2))
                recv_exact(c, 1)              # until the requester hangs up
                return
            elif mode == "mask_then_close":
                c.sendall(reply_header(rid, n) + full_mask(n) + b"\0" * 5)
                return

    def close(self):
        self.stopping.set()
        self.mq_thread.join(5)
        self.router.close(0)
        self.ctx.term()
        self.chan.close()


class ChannelProxy:
    """Forwards a requester's channel connections to a server's channel
    port.  With cut set, the next request's reply is forwarded only up to
    its header, mask and half its first item; then `mid` is set, the proxy
    waits for `go` (the test kills the server meanwhile) and closes both
    sides, as a server that died mid-reply does."""

    def __init__(self, upstream_port):
        self.upstream = upstream_port
        self.cut = False
        self.mid = threading.Event()
        self.go = threading.Event()
        self.listener = _Listener(self._serve)
        self.port = self.listener.port

    def _serve(self, c):
        up = socket.create_connection(("127.0.0.1", self.upstream), timeout=10)
        try:
            hello = recv_exact(c, 8)
            up.sendall(hello)
            c.sendall(recv_exact(up, 8))
            while True:
                hdr = recv_exact(c, 12)
                if hdr is None:
                    return
                n = struct.unpack("<III", hdr)[2]
                body = recv_exact(c, 16 * n)
                up.sendall(hdr + body)
                lengths = [struct.unpack_from("<qq", body, 16 * i)[1] for i in range(n)]
                head = recv_exact(up, 16 + (n + 7) // 8)
                mask = head[16:]
                served = [ln for i, ln in enumerate(lengths) if mask[i // 8] >> (i % 8) & 1]
                if self.cut and served:
                    self.cut = False
                    c.sendall(head + recv_exact(up, served[0] // 2))
                    self.mid.set()
                    self.go.wait(20)
                    return
                c.sendall(head + recv_exact(up, sum(served)))
        finally:
            up.close()

    def close(self):
        self.go.set()
        self.listener.close()
