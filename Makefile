# Quickstart: `make demo` then `make test`. Everything runs inside ./.venv.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: venv test lint typecheck layers unit unit-shuffled demo bench clean protos protos-check chaos soak soak-health browser nettools

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

# The unit suite in two passes. First, UNIT_WORKERS at a time (pytest-xdist; a file stays
# on one worker, so its module fixtures are set up once), the tests that hold under a busy
# machine: those that start no cluster and bind only port 0 (pure functions, the state
# machine's properties, in-process servers, the benchmarks' smoke runs that compute in one
# process), and the tests on clusters whose checks are counts, shapes and correctness, never
# a time or a heartbeat kept, and whose calls ride out an election (benchmark smoke runs,
# fuzzing with generous call timeouts, jobs run to their end with generous waits), and the
# Raft layer's tests. The pre-vote cluster test stays in the second pass: it reads every
# replica's connections at one instant, and a busy machine may not have opened them all
# yet. The long files come first, so that the workers end together. Then the rest, which
# starts clusters and times them, one test at a time. Both passes run; make fails if
# either does. Each prints its 60 slowest.
UNIT_WORKERS ?= 2
UNIT_PARALLEL := \
  $(addprefix tests/bench/test_,$(addsuffix _smoke.py,history_cost array_submit \
    security_cost vs_ray catchup durability gang_start fresh_client_failover \
    raft_channel follower_reads gpu_fault dependency_latency submit_batch memory \
    observe_cost snapshot_stall member_start grpc_floor cohort_tree format_gate \
    incremental jain_gaps lock_hold placement snapshot_decode synthetic_gap tenancy \
    sbatch_corpus srun_latency slow_nodes failure_policies quality reservation_variants)) \
  $(addprefix tests/raft/test_,$(addsuffix .py,fork_with_grpc prevote_processes \
    leader_loss journal restart_election_delay raft_channel journal_disk_full \
    snapshot_background replica_membership appendentries membership_pieces prevote_rules \
    raft_settings wire)) \
  $(addprefix tests/integration/test_,$(addsuffix .py,history checkpoints workflows arrays \
    node_fitness)) \
  tests/fuzz tests/test_leftovers.py tests/bench/test_compare.py \
  tests/core tests/sim tests/chaos tests/history tests/leader tests/rpc \
  tests/test_layout.py tests/test_design_citations.py
unit: $(STAMP) browser nettools
	@status=0; \
	echo "$(BIN)/pytest -n $(UNIT_WORKERS) --dist loadfile --durations=60 $(UNIT_PARALLEL)"; \
	$(BIN)/pytest -n $(UNIT_WORKERS) --dist loadfile --durations=60 $(UNIT_PARALLEL) \
	  || status=$$?; \
	echo "$(BIN)/pytest --durations=60 $(addprefix --ignore=,$(UNIT_PARALLEL))"; \
	$(BIN)/pytest --durations=60 $(addprefix --ignore=,$(UNIT_PARALLEL)) || status=$$?; \
	exit $$status

# The same suite in a random order (pytest-randomly: modules, then the tests in each). The
# seed is printed first; `make unit-shuffled SEED=<it>` replays that order.
SEED ?=
unit-shuffled: $(STAMP) browser nettools
	$(BIN)/pytest -p randomly $(if $(SEED),--randomly-seed=$(SEED))

# The failover benchmark's smoke test cuts a replica off with nftables (and ss finds its
# connections): as root (CI) nftables and iproute2 are installed when missing.
nettools:
	@if [ "$$(id -u)" = 0 ]; then \
	  (command -v nft >/dev/null && command -v ss >/dev/null) || \
	  (apt-get update && apt-get install -y nftables iproute2); fi

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

# The chaos suite: real partitions and packet loss (network namespaces + nftables), kill -9,
# SIGSTOP, whole-host freezes (cgroup v2), full disks (tmpfs) and wall-clock jumps against a
# real cluster, then the checker (docs/chaos.md). Needs root; installs nftables/iproute2
# when missing. CHAOS_SKIP_KINDS=kind,... leaves fault kinds out.
SEEDS ?= 1
DURATION ?= 280
CHAOS_SCENARIOS ?= targeted,random,broken-build,five-membership
CHAOS_SKIP_KINDS ?=
# make soak SOAK_MINUTES=60: random scenarios seed after seed (the targeted one every tenth
# seed) for that long, then the same summary line as CI. Outside CI. SOAK_LANES fault
# schedules play at once (one at the control plane, one per worker by default), each
# SOAK_DURATION long; `python -m chaos summary DIR...` sums soaks run at different times.
SOAK_MINUTES ?= 60
SOAK_FIRST_SEED ?= 1000
SOAK_OUT ?= chaos/runs
SOAK_LANES ?= 5
SOAK_DURATION ?= 900
chaos: $(STAMP)
	@if [ "$$(id -u)" = 0 ]; then \
	  (command -v nft >/dev/null && command -v ip >/dev/null) || \
	  (apt-get update && apt-get install -y nftables iproute2); fi
	$(BIN)/python -m chaos preflight
	$(BIN)/python -m chaos run --seeds $(SEEDS) --duration $(DURATION) \
	  --scenarios $(CHAOS_SCENARIOS) --skip-kinds "$(CHAOS_SKIP_KINDS)"

soak: $(STAMP)
	@if [ "$$(id -u)" = 0 ]; then \
	  (command -v nft >/dev/null && command -v ip >/dev/null) || \
	  (apt-get update && apt-get install -y nftables iproute2); fi
	$(BIN)/python -m chaos preflight
	$(BIN)/python -m chaos soak --minutes $(SOAK_MINUTES) --first-seed $(SOAK_FIRST_SEED) \
	  --duration $(SOAK_DURATION) --skip-kinds "$(CHAOS_SKIP_KINDS)" --out $(SOAK_OUT) \
	  --lanes $(SOAK_LANES)

# make soak-health: only the node-health kinds (gpu-xid, node-cannot-run), random scenarios
# seed after seed until HEALTH_FAULTS faults of them have played (at most SOAK_MINUTES),
# HEALTH_LANES schedules at once (the control-plane lane has nothing to play), each
# HEALTH_DURATION long; then the same summary line. Outside CI.
HEALTH_FAULTS ?= 100
HEALTH_LANES ?= 3
HEALTH_DURATION ?= 400
soak-health: $(STAMP)
	@if [ "$$(id -u)" = 0 ]; then \
	  (command -v nft >/dev/null && command -v ip >/dev/null) || \
	  (apt-get update && apt-get install -y nftables iproute2); fi
	$(BIN)/python -m chaos preflight
	$(BIN)/python -m chaos soak --kinds gpu-xid,node-cannot-run --faults $(HEALTH_FAULTS) \
	  --minutes $(SOAK_MINUTES) --first-seed $(SOAK_FIRST_SEED) --duration $(HEALTH_DURATION) \
	  --lanes $(HEALTH_LANES) --out $(SOAK_OUT)

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
	$(BIN)/python bench/incremental.py > bench/results/incremental.json
	cat bench/results/incremental.json
	$(BIN)/python bench/lock_hold.py > bench/results/lock_hold.json
	cat bench/results/lock_hold.json
	$(BIN)/python bench/read_storm.py > bench/results/read_storm.json
	cat bench/results/read_storm.json
	$(BIN)/python bench/quorum.py > bench/results/quorum.json
	cat bench/results/quorum.json
	$(BIN)/python bench/gang_start.py > bench/results/gang_start.json
	cat bench/results/gang_start.json
	$(BIN)/python bench/dependency_latency.py > bench/results/dependency_latency.json
	cat bench/results/dependency_latency.json
	$(BIN)/python bench/array_submit.py --out bench/results/array_submit.json > /dev/null
	$(BIN)/python bench/security_cost.py
	$(BIN)/python bench/raft_channel.py > /dev/null
	cat bench/results/raft_channel.json
	$(BIN)/python bench/abuse.py > /dev/null
	cat bench/results/abuse.json
	$(BIN)/synapse-sim --workload synthetic --jobs 20000 --nodes 2000 \
	  --out bench/results/sim > bench/results/simulator.json
	$(BIN)/python bench/tenancy.py > /dev/null
	cat bench/results/tenancy.json
	$(BIN)/python bench/quality.py --parts synthetic,multi-tenant > /dev/null
	cat bench/results/quality.md
	$(BIN)/python bench/vs_ray.py > bench/results/vs_ray.json
	cat bench/results/vs_ray.json
	$(BIN)/python bench/throughput.py > /dev/null
	cat bench/results/throughput.json
	$(BIN)/python bench/heartbeat_fanin.py > /dev/null
	cat bench/results/heartbeat_fanin.json
	$(BIN)/python bench/member_start.py > bench/results/member_start.json
	cat bench/results/member_start.json
	$(BIN)/python bench/snapshot_stall.py --out bench/results/snapshot_stall.json
	$(BIN)/python bench/failover.py --kills 20 --quiet-s 60 --streams 2 --out bench/results/failover.json
	$(BIN)/python bench/catchup.py --entries 100000 --replay 10000 --down-s 10 --replica-arg=--compact-state --out bench/results/catchup.json
	$(BIN)/python bench/memory.py --out bench/results/memory.json
	$(BIN)/python bench/durability.py --part cost
	$(BIN)/python bench/format_gate.py > bench/results/format_gate.json
	cat bench/results/format_gate.json
	$(BIN)/python bench/cohort_tree.py > bench/results/cohort_tree.json
	cat bench/results/cohort_tree.json

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis

# Durability cycles (outside CI): DURABILITY_CYCLES times SIGKILL of every replica at a
# random moment under a stream of submissions, restart, check that no acknowledged
# submission is lost and the replicas are byte-identical; bench/results/durability.json.
# `make test` runs 3 cycles (tests/integration/test_durability.py) and the bench smoke.
.PHONY: soak-durability
DURABILITY_CYCLES ?= 100
soak-durability: $(STAMP)
	$(BIN)/python bench/durability.py --part cycles --cycles $(DURABILITY_CYCLES)

# Fuzzing: `make test` runs tests/fuzz with small example counts; this runs the
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

# Every long run outside CI, one after another: the chaos soak, the fuzzing soak and the
# durability cycles.
.PHONY: soak-all
soak-all: soak soak-fuzz soak-durability
