# Quickstart: `make demo` then `make test`. Everything runs inside ./.venv.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: venv test lint typecheck layers unit demo bench clean protos protos-check chaos browser

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

unit: $(STAMP) browser
	$(BIN)/pytest

# The dashboard test drives Debian's chromium (Playwright cannot download its own
# browser here). As root (CI, .ci/run) it is installed when missing.
browser:
	@if [ ! -x /usr/bin/chromium ]; then \
	  if [ "$$(id -u)" = 0 ]; then apt-get update && apt-get install -y chromium; \
	  else echo "the dashboard test needs /usr/bin/chromium: sudo apt-get install chromium"; fi; fi

protos: $(STAMP)
	PYTHON=$(BIN)/python scripts/gen_protos.sh

protos-check: $(STAMP)
	PYTHON=$(BIN)/python scripts/gen_protos.sh --check

test: lint typecheck layers protos-check unit chaos

# The chaos suite: real partitions (network namespaces + nftables), kill -9 and SIGSTOP
# against a real cluster, then the checker. Needs root; installs nftables/iproute2 when
# missing. Soak: make chaos SEEDS=1-20 DURATION=120 CHAOS_SCENARIOS=random
SEEDS ?= 1
DURATION ?= 60
CHAOS_SCENARIOS ?= targeted,random,broken-build,five-membership
chaos: $(STAMP)
	@if [ "$$(id -u)" = 0 ]; then \
	  (command -v nft >/dev/null && command -v ip >/dev/null) || \
	  (apt-get update && apt-get install -y nftables iproute2); fi
	$(BIN)/python -m chaos preflight
	$(BIN)/python -m chaos run --seeds $(SEEDS) --duration $(DURATION) --scenarios $(CHAOS_SCENARIOS)

demo: $(STAMP)
	$(BIN)/python -m synapse_ha.local.demo

# Each benchmark writes bench/results/<name>.json and prints it; the simulator also prints
# its side-by-side table and writes PNG plots to bench/results/sim/. Ray is optional:
# without a wheel for this platform, vs_ray measures synapse_ha only and says so.
bench: $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[bench]'
	$(BIN)/python -m pip install --quiet -e '.[ray]' || echo "bench: Ray not installable here"
	mkdir -p bench/results
	$(BIN)/python bench/placement.py > bench/results/placement.json
	cat bench/results/placement.json
	$(BIN)/python bench/lock_hold.py > bench/results/lock_hold.json
	cat bench/results/lock_hold.json
	$(BIN)/python bench/read_storm.py > bench/results/read_storm.json
	cat bench/results/read_storm.json
	$(BIN)/python bench/quorum.py > bench/results/quorum.json
	cat bench/results/quorum.json
	$(BIN)/python bench/gang_start.py > bench/results/gang_start.json
	cat bench/results/gang_start.json
	$(BIN)/python bench/security_cost.py
	$(BIN)/synapse-sim --workload synthetic --jobs 20000 --nodes 2000 \
	  --out bench/results/sim > bench/results/simulator.json
	$(BIN)/python bench/tenancy.py > /dev/null
	cat bench/results/tenancy.json
	$(BIN)/python bench/vs_ray.py > bench/results/vs_ray.json
	cat bench/results/vs_ray.json

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis

# Fuzzing (issue 17): `make test` runs tests/fuzz with small example counts; this runs the
# same properties with FUZZ_EXAMPLES examples each and writes the counts (examples,
# requests sent, accepted, rejected, crashes) to bench/results/fuzz.json.
FUZZ_EXAMPLES ?= 300
.PHONY: soak-fuzz
soak-fuzz: $(STAMP)
	mkdir -p bench/results
	rm -f bench/results/fuzz.json
	SYNAPSE_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) SYNAPSE_FUZZ_RESULTS=bench/results/fuzz.json \
	  $(BIN)/pytest -q -p no:cacheprovider tests/fuzz
	cat bench/results/fuzz.json
