# IOP developer commands. `make run` serves the demo; `make test` runs every test.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: run test unit system lint proto package-check clean

$(STAMP): setup.cfg pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# compat-mode editable install: twistd's plugin scan sees twisted/plugins in this tree
	$(BIN)/python -m pip install -q -e '.[test,dev]' --config-settings editable_mode=compat
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/python -m iop.testing.demo

test: $(STAMP)
	$(BIN)/trial iop
	$(BIN)/pytest -q tests

unit: $(STAMP)
	$(BIN)/trial iop

system: $(STAMP)
	$(BIN)/pytest -q tests

lint: $(STAMP)
	$(BIN)/ruff check iop tests twisted
	$(BIN)/mypy

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
	rm -rf build dist *.egg-info _trial_temp .pytest_cache .mypy_cache .ruff_cache var
