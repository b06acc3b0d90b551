"""Issue 17: what a client sends cannot make the server's answers
undecodable (docs/protocol.md, "Framing"): error frames are valid UTF-8."""
import msgpack
import pytest

NOOP = 24
ERROR_MARKER = b"LMCACHE_RPC_ERROR_V1"


def error_of(frames):
    """The {"error_type", "message"} of an error frame, decoded strictly."""
    assert frames is not None, "no reply"
    assert frames[2] == ERROR_MARKER, frames
    return msgpack.unpackb(frames[3], raw=False)


@pytest.mark.parametrize("op_frame", [
    msgpack.packb("x" + "\u00e9" * 40),          # cut at 64 bytes: mid-sequence
    msgpack.packb("\u20ac" * 30),                # 3-byte characters
    b"\xa4ab\xff\xfe",                          # not UTF-8 at all
    b"\xa2\xe2\x82",                            # a sequence cut short
], ids=["2-byte", "3-byte", "invalid", "cut-short"])
def test_error_frames_are_valid_utf8(start_server, op_frame):
    s = start_server("--rpc-error-frames")
    d = s.dealer()
    d.sock.send_multipart([msgpack.packb(5), op_frame])
    frames = d.recv()
    assert frames[:3] == [msgpack.packb(5), op_frame, ERROR_MARKER]
    err = error_of(frames)   # raw=False: strict UTF-8
    assert err["error_type"] == "ValueError"
    assert "no handler registered for request type" in err["message"]
    assert d.call(NOOP)[2] == b"\xa2OK"
    d.close()
