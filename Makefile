# entitlement-fleet: the two commands a new user runs are `make demo` and `make test`.
SHELL := /bin/bash
SWIFT ?= swift
PYTHON ?= python3
PG_BIN ?= $(shell ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)

.PHONY: deps build release test test-swift test-chart demo bench clean

# Installs what is missing on a fresh Debian machine (run as root, as CI does).
deps:
	@if ! pkg-config --exists rdkafka 2>/dev/null; then \
	  echo "installing librdkafka-dev and kcat"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq librdkafka-dev kcat >/dev/null; \
	fi
	@if ! command -v kcat >/dev/null 2>&1; then \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq kcat >/dev/null || echo "kcat not installed: bench kafka will skip its reference"; \
	fi
	@if [ -z "$(PG_BIN)" ] || [ ! -x "$(PG_BIN)/initdb" ]; then \
	  echo "installing postgresql"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null; \
	fi

deps-chart:
	@$(PYTHON) -m pip install -q --disable-pip-version-check -r charts/tests/requirements.txt

build: deps
	$(SWIFT) build

release: deps
	$(SWIFT) build -c release --product fleet

test: deps deps-chart test-swift test-chart

test-swift:
	$(SWIFT) build --build-tests
	$(SWIFT) test --skip-build --parallel --num-workers 2

test-chart:
	$(PYTHON) -m pytest -q charts/tests

demo: release
	.build/release/fleet demo

clean:
	rm -rf .build
