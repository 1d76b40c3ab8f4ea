"""The cohort tree benchmark's smoke run, so that it cannot rot."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "cohort_tree.py"


def test_cohort_tree_benchmark_smoke_run_reports_both_shapes() -> None:
    out = subprocess.run(
        [sys.executable, str(BENCH), "--smoke"], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout)
    shapes = {s["shape"]: s for s in report["shapes"]}
    assert sorted(shapes) == ["flat", "tree"]
    assert shapes["flat"]["cohort_records"] == 0 and shapes["tree"]["cohort_records"] == 5
    for shape in shapes.values():
        assert shape["running_gangs"] > 0
        assert shape["pass_ms"] > 0 and shape["headroom_us"] > 0
