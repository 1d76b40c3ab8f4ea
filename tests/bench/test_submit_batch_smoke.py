"""The batched-submission benchmark's smoke run, so that it cannot rot."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "submit_batch.py"


def test_submit_batch_benchmark_smoke_run_reports_both_ways() -> None:
    out = subprocess.run(
        [sys.executable, str(BENCH), "--smoke"], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout)
    assert report["smoke"] is True and report["batch_size"] == 10
    assert (report["single"]["calls"], report["batch"]["calls"]) == (40, 4)
    for way in ("single", "batch"):
        assert report[way]["jobs"] == 40
        assert report[way]["acknowledged_per_s"] > 0
        assert report[way]["leader_cpu_us_per_job"] >= 0
    assert report["speedup"] > 0
