# lmcached — top-level entry points.  `make run` and `make test` do all set-up
# on a fresh Debian 12 machine (packages are installed with apt-get on demand).

BUILD_DIR  ?= build
BUILD_TYPE ?= RelWithDebInfo
JOBS       ?= $(shell nproc)
# `make run`: RUN_DEFAULTS (a 1 GiB L1 with LRU eviction, ZMQ on
# localhost:5555), then the operator's RUN_ARGS, which the server reads
# last, so a flag given in both takes RUN_ARGS's value (issue 31).
RUN_DEFAULTS ?= --l1-size-gb 1 --eviction-policy LRU
RUN_ARGS     ?=

# What building and running need...
DEB_BUILD := build-essential cmake pkg-config libzmq3-dev libmsgpack-dev \
	libjansson-dev libmicrohttpd-dev libssl-dev libcurl4-openssl-dev libsqlite3-dev \
	librust-blake3-dev libcmocka-dev libucx-dev
# What the packaging tests use (tests/packaging/, docs/deploy.md):
# dpkg's tools and lintian for the .deb, help2man for its manual pages,
# systemd-analyze (and man, which it runs for Documentation=) for the
# units, yamllint and PyYAML for the manifests, curl for the page's commands.
DEB_PACKAGING_TEST := dpkg-dev help2man lintian systemd man-db yamllint python3-yaml curl git
# ...and what the tests and benchmarks start or drive (real servers, a browser;
# CPU torch for the GPU check's own plumbing, tests/gpu/README.md, and for
# upstream's clients, tests/upstream/README.md; python3-venv for the
# environment of the tests' PyPI packages, below).
DEB_TEST := python3 python3-zmq python3-msgpack python3-pytest python3-attr \
	python3-prometheus-client python3-websocket python3-torch python3-venv \
	b3sum chromium redis-server redis-tools wrk \
	$(DEB_PACKAGING_TEST)

SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: all deps deps-test configure build run test unit e2e bench bench-upstream asan tsan \
	sanitize alloc-fault fuzz soak clean

all: build

# Installs only what is missing; silent when everything is present.
define install_missing
	@missing=$$(for p in $(1); do \
	    dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q '^install ok installed' || echo $$p; \
	  done); \
	if [ -n "$$missing" ]; then \
	  echo "Installing Debian packages:" $$missing; \
	  $(SUDO) apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq $$missing >/dev/null; \
	fi
endef

deps:
	$(call install_missing,$(DEB_BUILD))

# The tests' PyPI packages (tests/requirements.txt: moto_server, the S3 server
# of the L2 tests, and upstream LMCache, the partner of tests/upstream/), pinned
# with their hashes, in the git-ignored virtual environment build-tools/venv.
# Debian's site packages stay visible there (torch, numpy, zmq, pytest).  It is
# rebuilt only when the requirements change, and silent otherwise.
TEST_VENV := build-tools/venv

deps-test: deps
	$(call install_missing,$(DEB_TEST))
	@if ! cmp -s tests/requirements.txt $(TEST_VENV)/requirements.txt; then \
	  echo "Installing the tests' PyPI packages (tests/requirements.txt) into $(TEST_VENV)"; \
	  rm -rf $(TEST_VENV) && \
	  /usr/bin/python3 -m venv --system-site-packages $(TEST_VENV) && \
	  $(TEST_VENV)/bin/pip install -q --disable-pip-version-check --no-deps \
	    --require-hashes --only-binary :all: -r tests/requirements.txt && \
	  cp tests/requirements.txt $(TEST_VENV)/requirements.txt; \
	fi

$(BUILD_DIR)/CMakeCache.txt: | deps
	cmake -S . -B $(BUILD_DIR) -DCMAKE_BUILD_TYPE=$(BUILD_TYPE)

configure: deps $(BUILD_DIR)/CMakeCache.txt

build: configure
	cmake --build $(BUILD_DIR) -j $(JOBS)

run: build
	./$(BUILD_DIR)/lmcached $(RUN_DEFAULTS) $(RUN_ARGS)

test: build deps-test
	cd $(BUILD_DIR) && ctest --output-on-failure -j $(JOBS)

unit: build deps-test
	cd $(BUILD_DIR) && ctest --output-on-failure -j $(JOBS) -E '^e2e$$'

e2e: build deps-test
	cd $(BUILD_DIR) && ctest --output-on-failure -R '^e2e$$'

# Every benchmark prints its own same-run baseline; see BENCHMARKS.md.
bench: build deps-test
	./bench/run.sh $(BUILD_DIR)
	./$(BUILD_DIR)/hash_bench
	./$(BUILD_DIR)/decode_bench
	./$(BUILD_DIR)/transfer_bench --chunks 128 --iters 500
	./$(BUILD_DIR)/transfer_bench --chunks 128 --iters 500 --server-process
	./$(BUILD_DIR)/l1_meta_bench
	./$(BUILD_DIR)/sd_transfer_bench --chunks 256 --iters 1000
	./$(BUILD_DIR)/l2_bench --dir $(BUILD_DIR)/l2_bench.dir
	./$(BUILD_DIR)/l2_bench --dir $(BUILD_DIR)/l2_bench.dir --odirect
	./$(BUILD_DIR)/l2_lookup_bench --dir $(BUILD_DIR)/l2_lookup_bench.dir
	./bench/l2_net_bench.sh 3 $(BUILD_DIR)/l2_bench
	./$(BUILD_DIR)/p2p_chan_bench --chunks 256 --rounds 10
	./$(BUILD_DIR)/blend_match_bench
	./$(BUILD_DIR)/blend_lookup_bench
	LMCACHED_BIN=$(BUILD_DIR)/lmcached LMCACHED_COORDINATOR_BIN=$(BUILD_DIR)/lmcached-coordinator \
	  /usr/bin/python3 bench/p2p_lookup_bench.py

# lmcached beside upstream LMCache's own server, one workload, one run
# (bench/upstream_bench.py, BENCHMARKS.md).  Upstream's server needs PyPI's
# CUDA torch: its environment, build-tools/upstream-venv, is about 3 GiB to
# download and is made only here, only when bench/upstream-requirements.txt
# changed.
UPSTREAM_VENV := build-tools/upstream-venv

bench-upstream: build deps-test
	@if ! cmp -s bench/upstream-requirements.txt $(UPSTREAM_VENV)/requirements.txt; then \
	  echo "Installing upstream LMCache 0.5.6 and its dependencies into $(UPSTREAM_VENV)"; \
	  rm -rf $(UPSTREAM_VENV) && /usr/bin/python3 -m venv $(UPSTREAM_VENV) && \
	  $(UPSTREAM_VENV)/bin/pip install -q --disable-pip-version-check --no-deps \
	    -r bench/upstream-requirements.txt && \
	  cp bench/upstream-requirements.txt $(UPSTREAM_VENV)/requirements.txt; \
	fi
	$(UPSTREAM_VENV)/bin/python bench/upstream_bench.py --build $(BUILD_DIR)

# Sanitizer builds: ASan+UBSan and TSan, each in its own build tree.
asan: deps-test
	cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DLMC_SANITIZE=address
	cmake --build build-asan -j $(JOBS)
	cd build-asan && ctest --output-on-failure -j $(JOBS)

tsan: deps-test
	cmake -S . -B build-tsan -DCMAKE_BUILD_TYPE=Debug -DLMC_SANITIZE=thread
	cmake --build build-tsan -j $(JOBS)
	cd build-tsan && ctest --output-on-failure -j $(JOBS)

sanitize: asan tsan

# Allocation-failure tests: every allocation of a scenario made to fail in
# turn, under ASan+UBSan, in their own tree (docs/testing.md).  Builds only
# the test binaries and the libraries they link.
alloc-fault: deps
	cmake -S . -B build-fault -DCMAKE_BUILD_TYPE=Debug -DLMC_SANITIZE=address -DLMC_ALLOC_FAULT=ON
	cmake --build build-fault -j $(JOBS) --target alloc_fault
	cd build-fault && ctest --output-on-failure -j $(JOBS) -R '^alloc_fault\.'
	@grep -h '^alloc_fault: .* allocations[;,]' build-fault/Testing/Temporary/LastTest.log || true

# libFuzzer over every fuzz/ target, FUZZ_SECONDS each, starting from a copy
# of the checked-in corpus (docs/fuzzing.md).  Findings land in build-fuzz/.
FUZZ_SECONDS ?= 60
FUZZ_TARGETS := ipc_key msgpack object_key l2_json config_file rpc http pickle kv_geometry coord_events p2p_wire trace blend_wire coord_blend
fuzz: deps
	$(call install_missing,clang libclang-rt-14-dev)
	cmake -S . -B build-fuzz -DCMAKE_C_COMPILER=clang -DLMC_FUZZ=ON
	cmake --build build-fuzz -j $(JOBS) $(addprefix --target fuzz_,$(FUZZ_TARGETS))
	@set -e; for t in $(FUZZ_TARGETS); do \
	  rm -rf build-fuzz/corpus-$$t && cp -r fuzz/corpus/$$t build-fuzz/corpus-$$t; \
	  echo "== fuzz_$$t ($(FUZZ_SECONDS) s)"; \
	  ./build-fuzz/fuzz_$$t -max_total_time=$(FUZZ_SECONDS) -max_len=4096 \
	    -artifact_prefix=build-fuzz/$$t- build-fuzz/corpus-$$t > build-fuzz/$$t.log 2>&1 \
	    || { tail -n 40 build-fuzz/$$t.log; echo "fuzz_$$t: finding in build-fuzz/"; exit 1; }; \
	  tail -n 1 build-fuzz/$$t.log; \
	done

# A bounded soak on loopback: the real server with an fs L2 under a mixed
# workload for SOAK_SECONDS, its RSS and fds sampled; fails on growth after
# the warm-up or on any data check (tests/reliability/soak.py,
# docs/RELIABILITY.md).
SOAK_SECONDS ?= 600
soak: build deps-test
	SOAK_SECONDS=$(SOAK_SECONDS) LMCACHED_BIN=$(abspath $(BUILD_DIR))/lmcached \
	  /usr/bin/python3 tests/reliability/soak.py

clean:
	rm -rf $(BUILD_DIR) build-asan build-tsan build-fault build-fuzz

# ---- Installing and packaging (docs/deploy.md) ---------------------------
# `make install` puts the build's binaries, their man pages (help2man, from
# each binary's --help), the systemd units and their settings files under
# DESTDIR/PREFIX.  lmcached itself goes to LIBDIR/lmcached/ with a link in
# BINDIR, so that liblmcached_cuda.so, where the build made one, sits
# beside the executable, where lmcached looks for it (docs/configuration.md).
# `make deb` makes DIST_DIR/lmcached_VERSION_ARCH.deb from the same files
# with dpkg's own tools (packaging/debian/build-deb.sh).
PREFIX           ?= /usr/local
DESTDIR          ?=
BINDIR           ?= $(PREFIX)/bin
LIBDIR           ?= $(PREFIX)/lib
MANDIR           ?= $(PREFIX)/share/man
DOCDIR           ?= $(PREFIX)/share/doc/lmcached
SYSCONFDIR       ?= $(if $(filter /usr,$(PREFIX)),/etc,$(PREFIX)/etc)
SYSTEMD_UNIT_DIR ?= $(PREFIX)/lib/systemd/system
INSTALL_STRIP    ?=
DIST_DIR         ?= dist
VERSION          := $(shell sed -n 's/^project.lmcached VERSION \([0-9.]*\).*/\1/p' CMakeLists.txt)
SOURCE_DATE_EPOCH ?= $(shell git log -1 --format=%ct 2>/dev/null || date +%s)
export SOURCE_DATE_EPOCH
DEB_PACKAGING := dpkg-dev help2man
MAN_NAMES := lmcached="LMCache multiprocess KV-cache server" \
	lmcached-coordinator="fleet coordinator of lmcached servers" \
	lmcache-cli="command-line client of lmcached"

.PHONY: man install deb man-pages install-files deb-package

# man, install and deb build first; man-pages, install-files and
# deb-package take the build as it is (the packaging tests use them, so
# that a test never rebuilds binaries other tests are running).
man: build
	@$(MAKE) --no-print-directory man-pages
install: build
	@$(MAKE) --no-print-directory install-files
deb: build
	@$(MAKE) --no-print-directory deb-package

man-pages:
	$(call install_missing,help2man)
	@mkdir -p $(BUILD_DIR)/man
	@for entry in $(MAN_NAMES); do \
	  prog=$${entry%%=*}; name=$${entry#*=}; \
	  help2man --no-info --no-discard-stderr --section=1 --name="$$name" \
	    --output=$(BUILD_DIR)/man/$$prog.1 $(abspath $(BUILD_DIR))/$$prog || exit 1; \
	done

install-files: man-pages
	install -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(LIBDIR)/lmcached $(DESTDIR)$(MANDIR)/man1 \
	  $(DESTDIR)$(SYSTEMD_UNIT_DIR) $(DESTDIR)$(SYSCONFDIR)/default $(DESTDIR)$(DOCDIR)/examples
	install -m 0755 $(INSTALL_STRIP) $(BUILD_DIR)/lmcached $(DESTDIR)$(LIBDIR)/lmcached/lmcached
	if [ -f $(BUILD_DIR)/liblmcached_cuda.so ]; then \
	  install -m 0644 $(INSTALL_STRIP) $(BUILD_DIR)/liblmcached_cuda.so $(DESTDIR)$(LIBDIR)/lmcached/; fi
	ln -sfn $$(realpath -m --relative-to=$(BINDIR) $(LIBDIR)/lmcached/lmcached) \
	  $(DESTDIR)$(BINDIR)/lmcached
	install -m 0755 $(INSTALL_STRIP) $(BUILD_DIR)/lmcached-coordinator $(BUILD_DIR)/lmcache-cli \
	  $(DESTDIR)$(BINDIR)/
	for p in lmcached lmcached-coordinator lmcache-cli; do \
	  gzip -9n < $(BUILD_DIR)/man/$$p.1 > $(DESTDIR)$(MANDIR)/man1/$$p.1.gz; done
	for u in lmcached lmcached-coordinator; do \
	  sed -e 's|@BINDIR@|$(BINDIR)|g' -e 's|@SYSCONFDIR@|$(SYSCONFDIR)|g' -e 's|@DOCDIR@|$(DOCDIR)|g' \
	    packaging/systemd/$$u.service.in > $(DESTDIR)$(SYSTEMD_UNIT_DIR)/$$u.service; \
	  chmod 0644 $(DESTDIR)$(SYSTEMD_UNIT_DIR)/$$u.service; \
	  [ -e $(DESTDIR)$(SYSCONFDIR)/default/$$u ] || \
	    install -m 0644 packaging/default/$$u $(DESTDIR)$(SYSCONFDIR)/default/$$u; \
	done
	install -m 0644 README.md docs/deploy.md $(DESTDIR)$(DOCDIR)/
	install -m 0644 packaging/systemd/lmcached-same-user.conf $(DESTDIR)$(DOCDIR)/examples/

deb-package:
	$(call install_missing,$(DEB_PACKAGING))
	rm -rf $(BUILD_DIR)/deb && mkdir -p $(BUILD_DIR)/deb/debian
	$(MAKE) --no-print-directory install-files BUILD_DIR=$(BUILD_DIR) \
	  DESTDIR=$(abspath $(BUILD_DIR))/deb/debian/lmcached \
	  PREFIX=/usr SYSCONFDIR=/etc SYSTEMD_UNIT_DIR=/lib/systemd/system
	packaging/debian/build-deb.sh $(BUILD_DIR)/deb $(VERSION) $(DIST_DIR)
