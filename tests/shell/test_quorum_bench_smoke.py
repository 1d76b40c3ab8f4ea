"""The quorum benchmark's smoke run, so that it cannot rot."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "quorum.py"


@pytest.mark.integration
def test_quorum_benchmark_smoke_run_reports_its_figures() -> None:
    out = subprocess.run(
        [sys.executable, str(BENCH), "--smoke"], capture_output=True, text=True, timeout=240
    )
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout)
    assert report["submit"]["submissions_per_s"] > 0
    assert report["bind"]["members_bound"] == 200
    assert report["failover"]["acknowledged_writes_lost"] == 0
    assert report["failover"]["failover_to_first_write_s_max"] > 0
