"""The history cost benchmark's smoke run, so that it cannot rot."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "history_cost.py"


@pytest.mark.integration
def test_history_cost_smoke_run_measures_both_modes(tmp_path: Path) -> None:
    out = tmp_path / "history_cost.json"
    run = subprocess.run(
        [sys.executable, str(BENCH), "--smoke", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert run.returncode == 0, run.stderr[-4000:]
    report = json.loads(run.stdout)
    assert json.loads(out.read_text()) == report
    for workload in ("submit", "submit_cancel"):
        side = report[workload]
        for mode in ("history_off", "history_on"):
            (only,) = side["rounds"][mode]
            assert only["submissions"] == 100 and only["submissions_per_s"] > 0
        best = side["best_submissions_per_s"]
        assert side["history_on_over_off"] == pytest.approx(
            best["history_on"] / best["history_off"], abs=0.001
        )
    # The 'on' cluster recorded every cancelled job (100 measured + 4 warm-up) everywhere.
    (on,) = report["submit_cancel"]["rounds"]["history_on"]
    assert on["history_rows_per_replica"] == [104, 104, 104]
