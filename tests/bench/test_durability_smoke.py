"""The durability benchmark's smoke run (its tiny cost measurement), so that it cannot rot.
Its kill cycles run in tests/integration/test_durability.py, with and without fsync."""

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
            "--part",
            "cost",
            "--cost-out",
            str(tmp_path / "fsync_cost.json"),
        ],
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert out.returncode == 0, out.stderr[-4000:]
    report = json.loads(out.stdout)
    assert "cycles" not in report
    cost = report["cost"]
    assert json.loads((tmp_path / "fsync_cost.json").read_text()) == cost
    for mode in ("fsync_off", "fsync_on"):
        assert cost[mode]["concurrent"]["submissions"] == 40
        assert cost[mode]["concurrent"]["submissions_per_s"] > 0
        assert (
            cost[mode]["one_thread"]["latency_ms_p99"]
            >= cost[mode]["one_thread"]["latency_ms_p50"]
            > 0
        )
    assert cost["throughput_ratio_on_vs_off"] > 0
