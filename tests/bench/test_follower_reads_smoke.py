"""The follower-reads benchmark's smoke run, so that it cannot rot."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "follower_reads.py"


@pytest.mark.integration
def test_follower_reads_benchmark_smoke_run_reports_its_figures() -> None:
    out = subprocess.run(
        [sys.executable, str(BENCH), "--smoke"], capture_output=True, text=True, timeout=180
    )
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    off, on = report["modes"]
    assert (off["follower_reads"], on["follower_reads"]) == (False, True)
    assert off["served_by_followers"] == 0.0  # without a token every read is the leader's
    assert off["misses"] == on["misses"] == 0  # every client reads its own writes
    assert on["reads"] > 0 and len(on["follower_cpu_s_per_1000_reads"]) == 2
