#!/bin/sh
# The cost of the coordinator's cache-event stream on the request path
# (docs/fleet.md, "Cost on the request path"): runs bench/fleet_overhead.py
# against the built lmcached.  Extra arguments go to the script
# (--rounds R --iters N --chunks C).
set -e
cd "$(dirname "$0")/.."
LMCACHED_BIN="${LMCACHED_BIN:-build/lmcached}" exec /usr/bin/python3 bench/fleet_overhead.py "$@"
