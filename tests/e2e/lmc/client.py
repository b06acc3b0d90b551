"""A DEALER client speaking the MP framing, and the calls many tests make
with it (unpacking a reply, a LOOKUP and its hit count)."""
import time

import msgpack
import zmq

from lmc.keys import ipc_key
from lmc.ops import LOOKUP, QUERY_PREFETCH_STATUS, WAIT_PREFETCH_STATUS


class Dealer:
    """A DEALER socket speaking the MP framing: [uid, op, payload...]."""

    def __init__(self, ctx, url, routing_id=None):
        self.sock = ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        if routing_id is not None:
            self.sock.setsockopt(zmq.ROUTING_ID, routing_id)
        self.sock.connect(url)
        self.uid = 0

    def send(self, op, *payload, raw=None):
        """Sends op (int id or str name) with msgpack-encoded payload
        frames, or with `raw` pre-encoded frames.  Returns the uid used."""
        uid = self.uid
        self.uid += 1
        frames = [msgpack.packb(uid), msgpack.packb(op)]
        frames += raw if raw is not None else [msgpack.packb(p, use_bin_type=True) for p in payload]
        self.sock.send_multipart(frames)
        return uid

    def recv(self, timeout_ms=5000):
        if not self.sock.poll(timeout_ms):
            return None
        return self.sock.recv_multipart()

    def call(self, op, *payload, timeout_ms=5000, raw=None):
        """Returns the reply frames for this request, or None on timeout."""
        uid = self.send(op, *payload, raw=raw)
        deadline = time.monotonic() + timeout_ms / 1000
        while True:
            left = int((deadline - time.monotonic()) * 1000)
            if left <= 0:
                return None
            frames = self.recv(left)
            if frames is None:
                return None
            try:
                if msgpack.unpackb(frames[0]) == uid:
                    return frames
            except ValueError:
                pass  # a reply to a garbage request whose uid was not msgpack

    def close(self):
        self.sock.close(0)


def unpack(frames):
    """The decoded response frame of a reply, None for a void reply."""
    assert frames is not None, "no reply"
    return msgpack.unpackb(frames[2]) if len(frames) > 2 else None


def lookup(d, tokens, rid, *, cs, end=None, wait=False, **key_fields):
    """LOOKUP of tokens[:end] (every whole chunk of cs tokens by default)
    as request rid, then its hit count: QUERY_PREFETCH_STATUS once, or with
    wait=True WAIT_PREFETCH_STATUS (up to 10 s).  d is a Dealer, or a Server
    to open one on for the two calls.  key_fields go to ipc_key."""
    if hasattr(d, "dealer"):
        own = d.dealer()
        try:
            return lookup(own, tokens, rid, cs=cs, end=end, wait=wait, **key_fields)
        finally:
            own.close()
    if end is None:
        end = len(tokens) // cs * cs
    assert d.call(LOOKUP, ipc_key(tokens, 0, end, rid, **key_fields), 1) is not None
    if wait:
        return unpack(d.call(WAIT_PREFETCH_STATUS, rid, 10.0, timeout_ms=15000))
    return unpack(d.call(QUERY_PREFETCH_STATUS, rid))
