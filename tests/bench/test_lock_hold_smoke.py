"""The lock-hold benchmark's smoke run, so that it cannot rot."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "lock_hold.py"


def test_lock_hold_benchmark_smoke_run_reports_its_figures() -> None:
    out = subprocess.run(
        [sys.executable, str(BENCH), "--smoke"], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["passes"] == 3
    assert report["gangs_bound"] > 0
    assert report["explain_calls"] > 0
    assert report["pass_lock_hold_ms_max"] >= report["pass_lock_hold_ms_median"] > 0
