"""redis-server for the tests that start their own (test_l2_resp_s3.py,
tests/reliability/), ready only once it answers as itself.

Connecting to the port is not enough: a redis-server that cannot bind,
because another test took the port since it was picked, exits, and the
port still answers (another test's Redis).  Readiness asks the Redis on
the port for its process id (INFO's process_id) and fails as soon as the
child has exited."""
import socket
import subprocess
import time

from lmc.server import free_port


class RedisExited(RuntimeError):
    """The redis-server exited before it served (its port was taken)."""


def redis_pid(port, timeout=0.5):
    """The process id of the Redis answering on port, or None."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            s.sendall(b"*2\r\n$4\r\nINFO\r\n$6\r\nserver\r\n")
            buf = b""
            while b"\r\n" not in buf:
                got = s.recv(4096)
                if not got:
                    return None
                buf += got
            head, _, body = buf.partition(b"\r\n")
            if not head.startswith(b"$"):
                return None                     # an error reply, or not Redis
            size = int(head[1:])
            if size < 0:
                return None
            while len(body) < size:
                got = s.recv(65536)
                if not got:
                    return None
                body += got
    except (OSError, ValueError):
        return None
    for line in body[:size].decode(errors="replace").splitlines():
        if line.startswith("process_id:"):
            return int(line.split(":", 1)[1])
    return None


def start_redis(port, timeout=30):
    """redis-server on port, once the Redis there is this process.  Raises
    RedisExited when it exits first."""
    proc = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1",
                             "--save", "", "--appendonly", "no"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RedisExited(f"redis-server on port {port} exited {proc.returncode}")
        if redis_pid(port) == proc.pid:
            return proc
        time.sleep(0.05)
    proc.kill()
    proc.wait()
    raise RuntimeError(f"redis-server on port {port} did not answer within {timeout} s")


def start_redis_fresh(attempts=5):
    """(port, proc): a Redis on a free port, on another one when the port
    was taken between the pick and Redis's bind."""
    for attempt in range(attempts):
        port = free_port()
        try:
            return port, start_redis(port)
        except RedisExited:
            if attempt + 1 == attempts:
                raise
