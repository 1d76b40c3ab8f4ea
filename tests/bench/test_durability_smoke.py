"""The durability benchmark's smoke run (one kill cycle and a tiny cost measurement), so
that it cannot rot."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "durability.py"


@pytest.mark.integration
def test_durability_benchmark_smoke_run_reports_its_figures(tmp_path: Path) -> None:
    out = subprocess.run(
        [
            sys.executable,
            str(BENCH),
            "--smoke",
            "--out",
            str(tmp_path / "durability.json"),
            "--cost-out",
            str(tmp_path / "fsync_cost.json"),
        ],
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert out.returncode == 0, out.stderr[-4000:]
    report = json.loads(out.stdout)
    cycles, cost = report["cycles"], report["cost"]
    assert json.loads((tmp_path / "durability.json").read_text()) == cycles
    assert json.loads((tmp_path / "fsync_cost.json").read_text()) == cost
    assert (cycles["cycles"], len(cycles["per_cycle"])) == (1, 1)
    assert cycles["acknowledged"] > 0
    assert cycles["acknowledged_lost"] == 0
    for mode in ("fsync_off", "fsync_on"):
        assert cost[mode]["concurrent"]["submissions"] == 40
        assert cost[mode]["concurrent"]["submissions_per_s"] > 0
        assert (
            cost[mode]["one_thread"]["latency_ms_p99"]
            >= cost[mode]["one_thread"]["latency_ms_p50"]
            > 0
        )
    assert cost["throughput_ratio_on_vs_off"] > 0
