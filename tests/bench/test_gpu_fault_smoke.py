"""The GPU fault benchmark's smoke run, so that it cannot rot."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "gpu_fault.py"


@pytest.mark.integration
def test_gpu_fault_benchmark_smoke_run_reports_its_figures() -> None:
    out = subprocess.run(
        [sys.executable, str(BENCH), "--smoke"], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert (report["benchmark"], report["workers"], report["faults"]) == ("gpu_fault", 2, 2)
    for what in ("recorded", "requeued"):
        assert report[f"{what}_ms_max"] >= report[f"{what}_ms_p50"] > 0
    assert report["replaced_off_the_gpu"] == 2
    assert report["target"] == {"p50_ms": 5000, "max_ms": 15000}
    assert isinstance(report["meets_target"], bool)
