"""The read-storm benchmark's smoke run (three real replicas), so that it cannot rot."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "read_storm.py"


@pytest.mark.integration
def test_read_storm_benchmark_smoke_run_reports_its_figures() -> None:
    out = subprocess.run(
        [sys.executable, str(BENCH), "--smoke"], capture_output=True, text=True, timeout=240
    )
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert min(report["read_calls"].values()) > 0
    assert report["heartbeat_rtt_during_storm"]["count"] > 0
    assert report["gangs_requeued_or_failed"] == 0
    assert report["leader_kept_its_term"] is True
