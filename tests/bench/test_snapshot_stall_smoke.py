"""The snapshot stall benchmark's smoke run, so that it cannot rot."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "snapshot_stall.py"


def test_snapshot_stall_benchmark_smoke_run_reports_both_writers() -> None:
    out = subprocess.run(
        [sys.executable, str(BENCH), "--smoke"], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout)
    assert report["jobs"] == 200 and report["compact_state"] is True
    for mode in ("thread", "fork"):
        figures = report[mode]
        assert figures["file_mb"] > 0
        assert figures["ticks"] > 50  # a second of 5 ms ticks around the write
        assert figures["longest_gap_ms"] >= figures["gap_p99_ms"] > 0
    assert report["fork"]["fork_ms"] > 0
    assert report["full_collection_ms"] > 0 and report["full_collection_after_freeze_ms"] >= 0
