"""The tenancy benchmark's smoke run, so that it cannot rot."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parents[2] / "bench" / "tenancy.py"


def _report(*flags: str, timeout: int = 120) -> dict[str, Any]:
    """The benchmark's JSON report, run with ``flags``."""
    out = subprocess.run(
        [sys.executable, str(BENCH), *flags], capture_output=True, text=True, timeout=timeout
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout)


def test_tenancy_benchmark_smoke_run_reports_each_seed_and_the_spread() -> None:
    report = _report("--smoke")
    assert set(report["per_seed"]) == {"1", "2"}
    for seed in report["per_seed"].values():
        assert set(seed["modes"]) == {"off", "blind", "topology"}
        assert seed["modes"]["off"]["gpu_hours_lost"] == 0
        assert all(m["checkpoint_marks"] > 0 for m in seed["modes"].values())
    modes = report["summary"]["modes"]
    lost = modes["blind"]["gpu_hours_lost"]
    assert lost["n"] == 2 and lost["min"] <= lost["mean"] <= lost["max"]
    assert lost["stdev"] >= 0
    assert set(report["summary"]["targets_met_in_seeds"]) >= {"gpu_hours_lost_vs_blind"}
    assert all(v.endswith("/2") for v in report["summary"]["targets_met_in_seeds"].values())


def test_the_heavy_tailed_smoke_run_reports_every_mode() -> None:
    report = _report("--heavy", "--smoke", "--seeds", "1", timeout=300)
    assert report["workload"].startswith("heavy-tailed, 12 h of arrivals on 16 x 8 GPUs")
    assert set(report["summary"]["modes"]) == {"off", "blind", "topology"}
    assert "quota_back_within_pass_plus_grace" in report["per_seed"]["1"]["targets"]


def test_the_tree_smoke_run_puts_the_queues_in_two_organisations() -> None:
    report = _report("--tree", "--smoke", "--seeds", "1")
    assert report["workload"].startswith("multi-tenant in a cohort tree of 2 organisations")
    notes = report["per_seed"]["1"]["workload"]
    assert "org-1 under research: team-a, team-c" in notes
    assert "org-2 under research: team-b, team-d" in notes
    assert set(report["summary"]["modes"]) == {"off", "blind", "topology"}
