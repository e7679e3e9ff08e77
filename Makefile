# entitlement-fleet: the two commands a new user runs are `make demo` and `make test`.
SHELL := /bin/bash
SWIFT ?= swift
PYTHON ?= python3
PG_BIN ?= $(shell ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)

.PHONY: deps build release test test-swift test-chart demo bench clean fuzz fuzz-short fuzz-build fuzz-seeds deps-differential

# Installs what is missing on a fresh Debian machine (run as root, as CI does).
deps:
	@missing=""; \
	for pkg in librdkafka-dev pkg-config kcat chromium openssl wrk; do dpkg -s $$pkg >/dev/null 2>&1 || missing="$$missing $$pkg"; done; \
	if [ -z "$(PG_BIN)" ] || [ ! -x "$(PG_BIN)/initdb" ]; then missing="$$missing postgresql"; fi; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	fi

deps-chart:
	@$(PYTHON) -m pip install -q --disable-pip-version-check -r charts/tests/requirements.txt

build: deps
	$(SWIFT) build

release: deps
	$(SWIFT) build -c release --product fleet

test: deps deps-chart deps-differential test-swift test-chart fuzz-short

# The differential check against Apple's app-store-server-library alone (installs it; a few seconds); `make test`
# installs the library too and runs the check with the other tests (README "Fuzzing and the differential check").
.PHONY: differential
differential: deps deps-differential
	$(SWIFT) build --build-tests
	$(SWIFT) test --skip-build --filter DifferentialTests
deps-differential:
	@$(PYTHON) -c "import appstoreserverlibrary" 2>/dev/null || $(PYTHON) -m pip install -q --disable-pip-version-check app-store-server-library \
	  || echo "WARNING: app-store-server-library could not be installed: DifferentialTests will skip"

test-swift:
	$(SWIFT) build --build-tests
	$(SWIFT) test --skip-build
	@echo "== the short chaos soak (one minute of faults under traffic; alone, so that its timing is its own)"
	FLEET_CHAOS_TEST=1 $(SWIFT) test --skip-build --filter ChaosCommandTests

test-chart:
	$(PYTHON) -m pytest -q charts/tests

demo: release
	.build/release/fleet demo

# The long chaos soak (`make chaos-short` runs a one-minute variant): faults under traffic, then nothing lost or applied twice.
.PHONY: chaos chaos-short
# The one-minute variant as a test on the debug build (`make test` runs it too, after the other tests).
chaos-short: deps
	$(SWIFT) build --build-tests
	FLEET_CHAOS_TEST=1 $(SWIFT) test --skip-build --filter ChaosCommandTests
CHAOS_MINUTES ?= 10
chaos: release
	.build/release/fleet bench chaos --minutes $(CHAOS_MINUTES)

# Coverage-guided fuzzing (libFuzzer + AddressSanitizer) of every parser: see README "Fuzzing". One binary,
# FLEET_FUZZ_TARGET picks the target; the sanitizer build has its own scratch path (.build-fuzz).
FUZZ_SECONDS ?= 60
FUZZ_SHORT_SECONDS ?= 4
FUZZ_TARGETS ?= jws base64 receipt event catalogue config ingest
# `--sanitize fuzzer --sanitize address` reach swiftc as two flags, and the second replaces the first: Swift code would
# get ASan but no coverage counters (libFuzzer would see only the C libraries). The explicit coverage flags restore it.
FUZZ_COVERAGE ?= -Xswiftc -sanitize-coverage=edge,inline-8bit-counters,pc-table,trace-cmp
fuzz-build:
	FLEET_FUZZ_BUILD=1 $(SWIFT) build --scratch-path .build-fuzz --sanitize fuzzer --sanitize address $(FUZZ_COVERAGE) --product fleet-fuzz
fuzz: fuzz-build
	FUZZ_SECONDS=$(FUZZ_SECONDS) FUZZ_TARGETS="$(FUZZ_TARGETS)" Fuzz/run-fuzz.sh
# The short pass of `make test`: a crash or invariant failure blocks landing.
fuzz-short: fuzz-build
	FUZZ_SECONDS=$(FUZZ_SHORT_SECONDS) FUZZ_TARGETS="$(FUZZ_TARGETS)" Fuzz/run-fuzz.sh
# New test roots and seed corpora (Fuzz/corpus, Sources/FleetFuzzing/FuzzRoots+Generated.swift); rebuild afterwards.
fuzz-seeds: fuzz-build
	FLEET_FUZZ_GENERATE=$(CURDIR) .build-fuzz/debug/fleet-fuzz

clean:
	rm -rf .build .build-fuzz
