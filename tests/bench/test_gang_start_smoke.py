"""The gang start benchmark's smoke run, so that it cannot rot."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "gang_start.py"


@pytest.mark.integration
def test_gang_start_benchmark_smoke_run_reports_its_figures() -> None:
    out = subprocess.run(
        [sys.executable, str(BENCH), "--smoke"], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["gangs"] == 5
    assert report["latency_ms_p99"] >= report["latency_ms_p50"] > 0
    production = report["production"]
    assert report["production_heartbeat_interval"] == "1s"
    assert production == report["by_heartbeat_interval"]["1s"]
    assert production["latency_ms_max"] >= production["latency_ms_p50"] > 0
    assert isinstance(report["meets_target"], bool)
