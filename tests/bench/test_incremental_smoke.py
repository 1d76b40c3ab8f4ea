"""The incremental planning benchmark's smoke run, so that it cannot rot."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "incremental.py"


def test_incremental_benchmark_smoke_run_keeps_and_extends_plans() -> None:
    out = subprocess.run(
        [sys.executable, str(BENCH), "--smoke"], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout)
    assert report["benchmark"] == "incremental" and report["timed"] is False
    # Each round: one pass with nothing changed, one after a submission that comes last.
    assert report["plans_by_kind"] == {"kept": 3, "extended": 3}
    for figure in ("unchanged_ms", "one_submission_ms", "full_pass_ms", "cold_pass_s"):
        assert report[figure] > 0
    assert isinstance(report["meets_targets"], bool)


def test_with_time_limits_the_reservation_counts_down_in_kept_plans() -> None:
    out = subprocess.run(
        [sys.executable, str(BENCH), "--smoke", "--timed"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout)
    assert report["timed"] is True
    assert sum(report["plans_by_kind"].values()) == 6  # 3 rounds of 2 passes
