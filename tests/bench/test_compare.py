"""bench/compare.py: figures read from made-up reports, medians, ratios and verdicts, the
table, the arguments, and runs of small scripts in a tree of their own (timeouts, missing
flags, result files put back, descendants ended)."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench" / "compare.py"


def _compare() -> ModuleType:
    """bench/compare.py, loaded from its file (bench/ is a directory of scripts)."""
    name = "compare_bench"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, BENCH)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


cmp = _compare()

FANIN = {
    "runs": [
        {"nodes": 1000, "mode": "stream", "leader_cpu_us_per_heartbeat": 556.3},
        {"nodes": 1000, "mode": "relay", "leader_cpu_us_per_heartbeat": 120.9},
        {"nodes": 3000, "mode": "stream", "leader_cpu_us_per_heartbeat": 369.6},
        {"nodes": 3000, "mode": "relay", "leader_cpu_us_per_heartbeat": 51.9},
    ],
    "leader_changed": False,
    "gangs_survived": "3/3",
    "read_calls": {"ExplainJob": 812, "GetJob": 790},
}


def test_a_path_follows_keys_indexes_and_selectors_to_a_number() -> None:
    assert cmp.extract(FANIN, "read_calls.ExplainJob") == 812.0
    assert cmp.extract(FANIN, "runs[0].leader_cpu_us_per_heartbeat") == 556.3
    assert cmp.extract(FANIN, "runs[-1].nodes") == 3000.0
    # A selector takes the last element that matches (the largest size).
    assert cmp.extract(FANIN, "runs[mode=relay].leader_cpu_us_per_heartbeat") == 51.9
    assert cmp.extract(FANIN, "runs[mode=relay,nodes=1000].leader_cpu_us_per_heartbeat") == 120.9
    assert cmp.extract(FANIN, "leader_changed") == 0.0  # a boolean counts 0 or 1


@pytest.mark.parametrize(
    "path",
    [
        "read_calls.ListJobs",  # no such key
        "runs[4].nodes",  # past the end
        "runs[mode=unary].nodes",  # no element matches
        "gangs_survived",  # not a number
        "read_calls.ExplainJob.count",  # below a number
        "runs.nodes",  # a key on a list
    ],
)
def test_a_path_that_leads_nowhere_or_to_no_number_is_missing(path: str) -> None:
    assert cmp.extract(FANIN, path) is None
    assert cmp.extract(None, path) is None


@pytest.mark.parametrize(
    ("direction", "base", "head", "expected"),
    [
        (cmp.LOWER, 100.0, 115.0, "worse"),  # 15 % more time
        (cmp.LOWER, 100.0, 85.0, "better"),
        (cmp.LOWER, 100.0, 110.0, "same"),  # exactly 10 % is not more than 10 %
        (cmp.LOWER, 100.0, 110.5, "worse"),
        (cmp.HIGHER, 2000.0, 1700.0, "worse"),  # 15 % fewer submissions/s
        (cmp.HIGHER, 2000.0, 2300.0, "better"),
        (cmp.HIGHER, 2000.0, 1850.0, "same"),
        (cmp.LOWER, 0.0, 0.0, "same"),  # no election on either
        (cmp.LOWER, 0.0, 1.0, "worse"),  # an election where there was none
        (cmp.HIGHER, 1.0, 0.0, "worse"),  # the leader lost its term
        (cmp.LOWER, None, 3.0, "missing on BASE"),
        (cmp.HIGHER, 3.0, None, "missing on HEAD"),
        (cmp.HIGHER, None, None, "missing"),
    ],
)
def test_verdict_is_more_than_ten_percent_in_the_figures_direction(
    direction: str, base: float | None, head: float | None, expected: str
) -> None:
    assert cmp.verdict(direction, base, head) == expected


def test_median_and_ratio_skip_what_is_missing() -> None:
    assert cmp.median([3.0, None, 1.0, 2.0]) == 2.0
    assert cmp.median([None, None]) is None
    assert cmp.ratio(2.0, 3.0) == 1.5
    assert cmp.ratio(0.0, 3.0) is None
    assert cmp.ratio(None, 3.0) is None


def test_the_trees_take_turns_going_first() -> None:
    assert [cmp.round_order(n) for n in range(3)] == [
        ("base", "head"),
        ("head", "base"),
        ("base", "head"),
    ]


def _run(bench: str, tree: str, round_: int, report: Any, status: str = "ok") -> dict[str, Any]:
    return {"benchmark": bench, "tree": tree, "round": round_, "status": status, "report": report}


def test_summary_takes_medians_over_rounds_and_marks_a_figure_missing_on_base() -> None:
    cold = cmp.Figure("cold pass s", "incremental", "cold_pass_s", cmp.LOWER)
    relay = cmp.Figure("relay", "fanin-relay", "runs[mode=relay].heartbeats_per_s", cmp.HIGHER)
    runs = [
        *(
            _run("incremental", "base", n + 1, {"cold_pass_s": v})
            for n, v in enumerate([1, 1.1, 0.9])
        ),
        *(
            _run("incremental", "head", n + 1, {"cold_pass_s": v})
            for n, v in enumerate([1.2, 2, 1.18])
        ),
        *(_run("fanin-relay", "base", n, None, "missing") for n in (1, 2, 3)),
        *(
            _run("fanin-relay", "head", n, {"runs": [{"mode": "relay", "heartbeats_per_s": v}]})
            for n, v in ((1, 2900.0), (2, 2950.0), (3, 2800.0))
        ),
    ]
    first, second = cmp.summarise([cold, relay], runs)
    assert first["base"] == [1.0, 1.1, 0.9] and first["head"] == [1.2, 2.0, 1.18]
    assert first["base_median"] == 1.0 and first["head_median"] == 1.2
    assert first["ratio"] == pytest.approx(1.2)
    assert first["verdict"] == "worse"
    assert second["base"] == [None, None, None] and second["base_status"] == ["missing"] * 3
    assert second["head_median"] == 2900.0
    assert second["ratio"] is None and second["verdict"] == "missing on BASE"
    table = cmp.render_table([first, second], use_tabulate=False)
    lines = table.splitlines()
    assert lines[0].split() == ["figure", "better", "BASE", "HEAD", "HEAD/BASE", "verdict"]
    columns = [re.split(r"\s{2,}", line) for line in lines[2:]]
    assert columns[0] == ["cold pass s", "lower", "1, 1.1, 0.9", "1.2, 2, 1.18", "1.20", "worse"]
    assert columns[1] == ["relay", "higher", "missing", "2900, 2950, 2800", "-", "missing on BASE"]


def test_a_failed_run_counts_as_a_missing_value_in_its_round() -> None:
    figure = cmp.Figure("calls", "read-storm", "read_calls.ExplainJob", cmp.HIGHER)
    runs = [
        _run("read-storm", "base", 1, {"read_calls": {"ExplainJob": 100}}),
        _run("read-storm", "base", 2, None, "failed"),
        _run("read-storm", "head", 1, {"read_calls": {"ExplainJob": 80}}),
        _run("read-storm", "head", 2, {"read_calls": {"ExplainJob": 86}}),
    ]
    (row,) = cmp.summarise([figure], runs)
    assert row["base"] == [100.0, None] and row["base_status"] == ["ok", "failed"]
    assert row["head_median"] == 83.0 and row["verdict"] == "worse"


@pytest.mark.skipif(importlib.util.find_spec("tabulate") is None, reason="tabulate missing")
def test_the_table_is_drawn_by_tabulate_when_it_is_installed() -> None:
    figure = cmp.Figure("calls", "read-storm", "read_calls.ExplainJob", cmp.HIGHER)
    runs = [
        _run("read-storm", "base", 1, {"read_calls": {"ExplainJob": 100}}),
        _run("read-storm", "head", 1, {"read_calls": {"ExplainJob": 120}}),
    ]
    table = cmp.render_table(cmp.summarise([figure], runs), use_tabulate=True)
    assert table.splitlines()[2].replace(" ", "") == "|calls|higher|100|120|1.20|better|"


def test_options_a_script_accepts_are_read_from_its_help() -> None:
    parser = argparse.ArgumentParser(description="Mentions --profile in passing.")
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--faults", type=int)
    parser.add_argument("-o", "--out", help="see also --elsewhere")
    parser.add_argument("--a-very-long-option-name-that-wraps", help="a help text")
    flags = cmp.help_flags(parser.format_help())
    assert flags == {
        "--help",
        "--smoke",
        "--faults",
        "--out",
        "--a-very-long-option-name-that-wraps",
    }
    # The first alternative whose options the script has: --fault is not --faults.
    variants = (("--smoke", "--fault", "kill"), ("--smoke", "--faults=1"))
    assert cmp.pick_variant(variants, flags) == ("--smoke", "--faults=1")
    assert cmp.pick_variant(variants[:1], flags) is None


def test_only_takes_benchmarks_groups_and_figures() -> None:
    options = cmp.parse_args(["bd86c1d", "--only", "throughput,incremental", "--smoke"])
    assert [b.name for b in options.benchmarks] == [
        "throughput-a",
        "throughput-b",
        "throughput-a-batch",
        "throughput-b-batch",
        "incremental",
    ]
    assert options.rounds == 1 and options.smoke and not options.keep
    assert options.out == ROOT / "bench" / "results" / "compare_smoke.json"
    options = cmp.parse_args(["main", "--only", "members bound/s,failover-kill", "--keep"])
    assert [b.name for b in options.benchmarks] == ["throughput-b", "failover-kill"]
    assert options.rounds == 3 and options.keep and not options.smoke
    assert options.out == ROOT / "bench" / "results" / "compare.json"
    assert len(cmp.parse_args(["HEAD~1", "--rounds", "5"]).benchmarks) == len(cmp.BENCHMARKS)
    for bad in (["x", "--only", "nope"], ["x", "--rounds", "0"], []):
        with pytest.raises(SystemExit):
            cmp.parse_args(bad)


def test_an_error_keeps_the_last_traceback_ahead_of_the_logs_after_it() -> None:
    stderr = "early\nTraceback (most recent call last):\n  boom\nRuntimeError: x\n" + "log\n" * 2000
    tail = cmp.error_tail(stderr, chars=400)
    assert tail.startswith("Traceback (most recent call last):\n  boom\nRuntimeError: x")
    assert tail.endswith("log\n") and "[...]" in tail and len(tail) < 420
    assert cmp.error_tail("short\n") == "short\n"


def test_a_report_is_found_after_other_output() -> None:
    assert cmp.last_json('{"a": 1}\n') == {"a": 1}
    assert cmp.last_json('starting\n{"a": {"b": 2}}\ndone\n') == {"a": {"b": 2}}
    assert cmp.last_json("no report\n") is None


def test_the_figure_table_names_known_benchmarks_and_paths_found_in_saved_results() -> None:
    names = [b.name for b in cmp.BENCHMARKS]
    assert len(set(names)) == len(names)
    assert len({f.name for f in cmp.FIGURES}) == len(cmp.FIGURES)
    assert {f.benchmark for f in cmp.FIGURES} == set(names)  # every benchmark has figures
    assert {f.direction for f in cmp.FIGURES} == {cmp.HIGHER, cmp.LOWER}
    for b in cmp.BENCHMARKS:
        assert (ROOT / b.script).exists(), b.script
    # Each path is found in one of the script's results committed under bench/results
    # (as committed: a benchmark run in this tree rewrites its own).
    for figure in cmp.FIGURES:
        script = next(b.script for b in cmp.BENCHMARKS if b.name == figure.benchmark)
        stem = Path(script).stem
        if stem == "read_storm":  # prints its figures only
            continue
        reports = [json.loads(_git("show", f"HEAD:{name}")) for name in _committed(stem)]
        assert reports, stem
        assert any(cmp.extract(r, figure.path) is not None for r in reports), figure


def _git(*args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout


def _committed(stem: str) -> list[str]:
    names = _git("ls-files", "bench/results").split()
    return [n for n in names if Path(n).stem.startswith(stem) and n.endswith(".json")]


# A run in a tree of its own: a process of its own runs these (it becomes the subreaper of
# what they start, as the comparison does), with stand-in scripts for benchmarks.
_DRIVER = """
import json, sys, importlib.util
from pathlib import Path
spec = importlib.util.spec_from_file_location("compare_driver", sys.argv[1])
cmp = importlib.util.module_from_spec(spec)
sys.modules["compare_driver"] = cmp
spec.loader.exec_module(cmp)
cmp._become_subreaper()
cmp.STOP_GRACE_S = 1.0
tree = cmp.Tree("base", Path(sys.argv[2]), "0" * 40)
records = []
for name, script, variants, writes in [
    ("ok", "bench/ok.py", (("--fast",),), ("bench/results/ok.json",)),
    ("hang", "bench/hang.py", ((),), ()),
    ("crash", "bench/crash.py", ((),), ()),
    ("new-flag", "bench/ok.py", (("--fast", "--new"),), ()),
    ("absent", "bench/absent.py", ((),), ()),
    ("leak", "bench/leak.py", ((),), ()),
]:
    bench = cmp.Benchmark(name, script, args=variants, smoke=variants, timeout_s=2,
                          smoke_timeout_s=2, writes=writes)
    records.append(cmp.run_one(tree, bench, True, 0))
print(json.dumps(records))
"""

_OK = """
import argparse, json
from pathlib import Path
parser = argparse.ArgumentParser()
parser.add_argument("--fast", action="store_true")
args = parser.parse_args()
report = {"fast": args.fast, "value": 42}
print("warming up")
print(json.dumps(report, indent=2))
Path("bench/results/ok.json").write_text(json.dumps(report, indent=2) + "\\n")
"""

_HANG = """
import signal, subprocess, sys, time
from pathlib import Path
signal.signal(signal.SIGINT, signal.SIG_IGN)  # only SIGKILL ends it
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"],
                         start_new_session=True)
Path("child.pid").write_text(str(child.pid))
print("hanging", file=sys.stderr, flush=True)
time.sleep(120)
"""


_LEAK = """
import json, subprocess, sys
from pathlib import Path
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"],
                         start_new_session=True)
Path("leaked.pid").write_text(str(child.pid))
print(json.dumps({"value": 7}))
"""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def test_runs_in_a_tree_time_out_miss_flags_and_put_result_files_back(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    (tree / ".venv" / "bin").mkdir(parents=True)
    (tree / ".venv" / "bin" / "python").symlink_to(sys.executable)
    (tree / "bench" / "results").mkdir(parents=True)
    (tree / "bench" / "ok.py").write_text(_OK)
    (tree / "bench" / "hang.py").write_text(_HANG)
    (tree / "bench" / "crash.py").write_text("raise SystemExit('no cluster today')\n")
    (tree / "bench" / "leak.py").write_text(_LEAK)
    saved = tree / "bench" / "results" / "ok.json"
    saved.write_text('{"value": 1}\n')
    done = subprocess.run(
        [sys.executable, "-c", _DRIVER, str(BENCH), str(tree)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    ok, hang, crash, new_flag, absent, leak = json.loads(done.stdout)
    assert ok["status"] == "ok" and ok["argv"] == ["bench/ok.py", "--fast"]
    assert ok["leftover_processes"] == 0
    assert ok["report"] == {"fast": True, "value": 42}
    assert saved.read_text() == '{"value": 1}\n'  # the run's own write undone
    assert hang["status"] == "timeout" and "hanging" in hang["error"]
    assert 2 <= hang["seconds"] < 30
    child = int((tree / "child.pid").read_text())
    assert not _alive(child)  # in a session of its own, ended all the same
    assert crash["status"] == "failed" and crash["returncode"] == 1
    assert "no cluster today" in crash["error"]
    assert new_flag["status"] == "missing" and "--new" in new_flag["error"]
    assert absent["status"] == "missing" and "bench/absent.py" in absent["error"]
    # A process a run leaves behind (a replica it did not close) is ended after it.
    assert leak["status"] == "ok" and leak["report"] == {"value": 7}
    assert leak["leftover_processes"] == 1
    assert not _alive(int((tree / "leaked.pid").read_text()))
    assert {r["tree"] for r in (ok, hang, crash, new_flag, absent, leak)} == {"base"}


@pytest.mark.skipif(
    os.environ.get("SYNAPSE_COMPARE_E2E") != "1",
    reason="builds a venv for BASE (minutes); SYNAPSE_COMPARE_E2E=1 runs it",
)
def test_head_against_its_own_commit_compares_the_incremental_figures(tmp_path: Path) -> None:
    out = tmp_path / "compare.json"
    env = {**os.environ, "SYNAPSE_COMPARE_CACHE": str(tmp_path / "cache")}  # no cached tree
    run = subprocess.run(
        [sys.executable, str(BENCH), "HEAD", "--smoke", "--only", "incremental", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=1200,
        cwd=ROOT,
        env=env,
    )
    assert run.returncode == 0, run.stderr[-4000:]
    result = json.loads(out.read_text())
    sha = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()
    assert result["base"]["sha"] == result["head"]["sha"] == sha
    assert result["base"]["cached"] is False
    assert [(r["tree"], r["status"]) for r in result["runs"]] == [("base", "ok"), ("head", "ok")]
    assert [f["name"] for f in result["figures"]] == [
        "cold pass s",
        "unchanged pass ms",
        "one-submission pass ms",
    ]
    for figure in result["figures"]:
        assert figure["base"][0] > 0 and figure["head"][0] > 0
        assert figure["verdict"] in ("same", "better", "worse")
    assert "cold pass s" in run.stdout
    worktrees = subprocess.run(
        ["git", "worktree", "list"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    assert "synapse-compare-" not in worktrees
