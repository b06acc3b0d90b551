"""What the e2e tests share to speak to lmcached: the op ids (ops.py), the
key builders (keys.py), starting and ending the real binaries
(server.py) and the DEALER client with its lookup (client.py).
conftest.py turns server.py into fixtures."""
