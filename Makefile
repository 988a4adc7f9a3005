# IOP developer commands. `make run` serves the demo; `make test` runs every test.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: run run-cluster test unit system system-cluster agents lint proto package-check clean

$(STAMP): setup.cfg pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# compat-mode editable install: twistd's plugin scan sees twisted/plugins in this tree
	$(BIN)/python -m pip install -q -e '.[test,dev]' --config-settings editable_mode=compat
	touch $(STAMP)

# The real coding-agent CLIs (Claude Code, Codex) the system suite drives, pinned in
# tests/agents/package-lock.json. Without npm their tests skip, saying why.
AGENTS := tests/agents/node_modules/.installed

$(AGENTS): tests/agents/package.json tests/agents/package-lock.json
	(cd tests/agents && npm ci --no-audit --no-fund --loglevel=error && touch node_modules/.installed) \
	  || echo "npm could not install the agent CLIs: their system tests will skip"

agents: $(AGENTS)

run: $(STAMP)
	$(BIN)/python -m iop.testing.demo

# The same demo as a cluster of two Edges on one host (needs redis-server).
run-cluster: $(STAMP)
	$(BIN)/python -m iop.testing.demo --cluster

test: $(STAMP) $(AGENTS)
	$(BIN)/trial iop
	$(BIN)/pytest -q --durations=15 tests
	IOP_TEST_CLUSTER=1 $(BIN)/pytest -q $(CLUSTER_TESTS)

unit: $(STAMP)
	$(BIN)/trial iop

system: $(STAMP) $(AGENTS)
	$(BIN)/pytest -q --durations=15 tests

# Single-Edge system tests again, every Edge in a cluster (a `cluster:` section on one shared
# redis-server): the lease table on Redis must change nothing a client sees. By default the
# suites that drive the pool hardest; `make system-cluster CLUSTER_TESTS=tests` runs them all.
CLUSTER_TESTS ?= tests/test_pool.py tests/test_ready_pump.py tests/test_refresh_under_load.py \
	tests/test_config_refresh.py tests/test_client_apis.py tests/test_tunnel.py \
	tests/test_provider_live.py
system-cluster: $(STAMP) $(AGENTS)
	IOP_TEST_CLUSTER=1 $(BIN)/pytest -q $(CLUSTER_TESTS)

lint: $(STAMP)
	$(BIN)/ruff check iop tests twisted bench
	$(BIN)/mypy
	$(BIN)/lint-imports --no-cache

proto: $(STAMP)
	$(BIN)/python -m iop.wire.codegen

# A plain (non-editable) install into a throwaway venv must expose both twistd plugins.
package-check:
	rm -rf build/pkgcheck && $(PYTHON) -m venv build/pkgcheck
	build/pkgcheck/bin/python -m pip install -q .
	cd build && pkgcheck/bin/twistd --help | grep -q 'iop-edge'
	cd build && pkgcheck/bin/twistd --help | grep -q 'iop-node'
	@echo "package-check: twistd lists iop-edge and iop-node"

clean:
	rm -rf build dist *.egg-info _trial_temp .pytest_cache .mypy_cache .ruff_cache var tests/agents/node_modules

# Benchmark: IOP vs the upstream called directly vs the LiteLLM proxy (1 and 2 workers), side by
# side (bench/): streamed and non-streamed answers of 32 and 64 tokens, then the scale scenario.
# LiteLLM lives in its own bench-only venv, created on first use (~2 min, ~750 MB). Pinned: the
# newest releases' proxy extra needs packages the registry does not serve yet.
BENCH_VENV      ?= bench/.venv-litellm
LITELLM_VERSION ?= 1.106.12
BENCH_ARGS      ?=

.PHONY: bench bench-smoke

$(BENCH_VENV)/.installed:
	test -x $(BENCH_VENV)/bin/python || $(PYTHON) -m venv $(BENCH_VENV)
	$(BENCH_VENV)/bin/python -m pip install -q --upgrade pip
	$(BENCH_VENV)/bin/python -m pip install -q 'litellm[proxy]==$(LITELLM_VERSION)'
	touch $@

bench: $(STAMP) $(BENCH_VENV)/.installed
	$(BIN)/python -m bench --litellm-venv $(BENCH_VENV) $(BENCH_ARGS)

# Under a minute: no LiteLLM, stream and non-stream, 32-token answers, levels 1 and 4, a handful
# of requests, a tiny scale scenario.
bench-smoke: $(STAMP)
	$(BIN)/python -m bench --smoke $(BENCH_ARGS)
