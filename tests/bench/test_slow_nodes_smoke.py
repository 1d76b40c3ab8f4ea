"""The slow-node benchmark's smoke run, so that it cannot rot."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "slow_nodes.py"


def test_slow_node_benchmark_smoke_run_reports_its_figures_and_targets() -> None:
    out = subprocess.run(
        [sys.executable, str(BENCH), "--smoke"], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout)
    assert report["benchmark"] == "slow_nodes"
    headline = report["headline"]
    figures = headline["figures"]
    assert figures["slow_spells_counted"] > 0
    assert 0 <= figures["marked_within_3_gangs"] <= figures["slow_spells_counted"]
    assert figures["gpu_hours_lost_to_slow_nodes"] <= figures["gpu_hours_lost_without_detector"]
    targets = headline["targets"]
    assert set(targets) == {"recall_within_3_gangs", "healthy_marked_share"}
    assert report["targets_met"] == all(t["met"] for t in targets.values())
    assert report["sweep"] and all("targets" in v for v in report["sweep"].values())
    assert "met" in out.stderr or "MISSED" in out.stderr
