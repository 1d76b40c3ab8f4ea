"""The quality report's smoke run, so that it cannot rot."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parents[2] / "bench" / "quality.py"
MODES = {"ours/off", "ours/blind", "ours/topology", "ours/fair"}
BASELINES = {"naive", "fifo-first-fit"}


def _run(*flags: str, timeout: int = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(BENCH), *flags], capture_output=True, text=True, timeout=timeout
    )


def _report(*flags: str) -> dict[str, Any]:
    out = _run(*flags)
    assert out.returncode == 0, out.stderr[-3000:]
    report: dict[str, Any] = json.loads(out.stdout)
    return report


def test_the_smoke_run_tables_every_workload_under_every_policy(tmp_path: Path) -> None:
    report = _report("--smoke", "--out", str(tmp_path))
    parts = report["workloads"]
    assert list(parts) == ["synthetic", "multi-tenant", "trace"]
    assert set(parts["synthetic"]["policies"]) == {"ours"} | BASELINES
    assert set(parts["multi-tenant"]["policies"]) == MODES | BASELINES
    assert set(parts["trace"]["policies"]) == MODES | BASELINES
    assert "openb" in parts["trace"]["workload"]
    synthetic = parts["synthetic"]["policies"]["ours"]["figures"]
    assert synthetic["delay_mean_s"]["n"] == 2  # one per seed
    assert synthetic["jain_backlogged"]["n"] == 0  # no queues, no tenancy figures
    off = parts["multi-tenant"]["policies"]["ours/off"]["figures"]
    assert off["gpu_hours_lost"] == {"n": 2, "mean": 0.0, "min": 0.0, "max": 0.0}
    assert parts["trace"]["policies"]["ours/off"]["figures"]["gpu_allocation"]["n"] == 1
    for part in parts.values():
        for summary in part["policies"].values():
            cdf = summary["delay_cdf_s"]
            points = [cdf[k] for k in ("p10", "p25", "p50", "p75", "p90", "p95", "p99", "max")]
            assert points == sorted(points)
            mean = summary["figures"]["delay_mean_s"]
            assert mean["min"] <= mean["mean"] <= mean["max"]
    assert json.loads((tmp_path / "quality.json").read_text()) == report
    table = (tmp_path / "quality.md").read_text().splitlines()
    assert len([line for line in table if line.startswith("| ")]) == 1 + 3 + 6 + 6
    if importlib.util.find_spec("matplotlib") is not None:
        for part in parts:
            assert (tmp_path / "quality" / part / "delay_cdf.png").stat().st_size > 0


def test_a_trace_file_runs_on_the_hosts_given(tmp_path: Path) -> None:
    trace = tmp_path / "jobs.csv"
    trace.write_text(
        "submit_s,queue,members,gpus_per_member,duration_s\n"
        "0,team-a,2,8,600\n"
        "10,team-b,1,8,300\n"
        "20,team-b,1,8,300\n"
    )
    out = tmp_path / "out"
    report = _report(
        "--parts", "trace", "--trace-file", str(trace), "--trace-hosts", "2", "--out", str(out)
    )
    table = (out / "quality.md").read_text().splitlines()
    assert sum(1 for line in table if line.startswith("| trace |")) == 6
    part = report["workloads"]["trace"]
    assert part["workload"].startswith("jobs.csv: 3 jobs on 2 nodes, queues team-a, team-b")
    ours = part["policies"]["ours/off"]
    assert ours["delay_cdf_s"]["n"] == 3
    # Two hosts: the 2-member gang holds both, so team-b's jobs wait for it to end.
    assert ours["delay_cdf_s"]["max"] >= 580


def test_trace_estimates_let_a_short_job_backfill_before_a_reservation(tmp_path: Path) -> None:
    trace = tmp_path / "jobs.csv"
    # Two hosts, the built-in queue (no quota): ``big`` (2 x 8 GPUs) waits for the two
    # limited jobs and reserves both hosts from 1,000 s; ``small`` (4 GPUs, no limit) fits
    # beside ``half`` but may use a reserved host only if its estimate ends by then.
    trace.write_text(
        "submit_s,queue,members,gpus_per_member,duration_s,time_limit_s,name\n"
        "0,default,1,8,1000,1000,hold\n"
        "0,default,1,4,500,600,half\n"
        "10,default,2,8,100,,big\n"
        "20,default,1,4,100,,small\n"
    )
    waits = {}
    for estimates in ("none", "default:500"):
        report = _report(
            "--parts", "trace", "--trace-file", str(trace), "--trace-hosts", "2",
            "--trace-estimates", estimates, "--out", str(tmp_path / estimates),
        )  # fmt: skip
        part = report["workloads"]["trace"]
        assert ("estimates default:500" in part["workload"]) == (estimates != "none")
        ours = next(iter(part["policies"].values()))  # ours (none), ours/off (a queue set)
        waits[estimates] = ours["delay_cdf_s"]["max"]
    assert waits["none"] == 1_080  # small waits for big (990 s) and its 100 s run
    assert waits["default:500"] == 990  # big's wait; small backfilled at once


def test_bad_options_are_refused_naming_the_option(tmp_path: Path) -> None:
    for flags, message in (
        (("--parts", "synthetic,nope"), "--parts: unknown nope"),
        (("--trace-speedup", "0"), "--trace-speedup: a number above 0"),
        (("--seeds", "0"), "--seeds: at least 1"),
        (("--trace-estimates", "psychic"), "--trace-estimates: estimates: none, learned"),
        (("--trace-estimates", "default:0"), "S in default:S must be seconds"),
        (("--reservations", "0"), "--reservations: from 1 to 16 per pass, got 0"),
        (("--parts", "trace", "--trace-file", str(tmp_path / "none.csv")), "none.csv"),
    ):
        out = _run(*flags, "--out", str(tmp_path))
        assert out.returncode == 2, out.stderr
        assert message in out.stderr
    assert list(tmp_path.iterdir()) == []
