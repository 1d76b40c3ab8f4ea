"""The dependency latency benchmark's smoke run, so that it cannot rot."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "dependency_latency.py"


@pytest.mark.integration
def test_dependency_latency_benchmark_smoke_run_reports_its_figures() -> None:
    out = subprocess.run(
        [sys.executable, str(BENCH), "--smoke"], capture_output=True, text=True, timeout=180
    )
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["links"] == 2
    assert report["latency_ms_max"] >= report["latency_ms_p50"] >= 0
    assert isinstance(report["meets_target"], bool)
