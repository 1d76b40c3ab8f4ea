# Quickstart: `make demo` then `make test`. Everything runs inside ./.venv.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: venv test lint typecheck layers unit demo bench clean protos protos-check

venv: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy

layers: $(STAMP)
	$(BIN)/lint-imports

unit: $(STAMP)
	$(BIN)/pytest

protos: $(STAMP)
	PYTHON=$(BIN)/python scripts/gen_protos.sh

protos-check: $(STAMP)
	PYTHON=$(BIN)/python scripts/gen_protos.sh --check

test: lint typecheck layers protos-check unit

demo: $(STAMP)
	$(BIN)/python -m synapse_ha.demo

bench: $(STAMP)
	mkdir -p bench/results
	$(BIN)/python bench/placement.py | tee bench/results/placement.json
	$(BIN)/python bench/quorum.py | tee bench/results/quorum.json

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
