"""The placement benchmark's smoke run, so that it cannot rot."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "placement.py"


def test_placement_benchmark_smoke_run_reports_its_figures() -> None:
    out = subprocess.run(
        [sys.executable, str(BENCH), "--smoke"], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["pending_gangs"] == 60
    assert report["gangs_placed"] > 0
    assert report["busy_gpus_before"] >= report["gpus"] // 2
    assert report["decision_ms_p99"] >= report["decision_ms_p50"] > 0
