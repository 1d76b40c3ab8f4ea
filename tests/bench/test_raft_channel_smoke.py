"""The Raft channel benchmark's smoke run, so that it cannot rot."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "raft_channel.py"


def test_raft_channel_benchmark_smoke_run_reports_both_channels() -> None:
    out = subprocess.run(
        [sys.executable, str(BENCH), "--smoke"], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout)
    assert report["smoke"] is True
    for channel in ("password", "tls"):
        assert report[channel]["log_entries"] > 0
        assert report[channel]["leader_cpu_us_per_entry"] > 0
