"""The member start benchmark's smoke run, so that it cannot rot."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "member_start.py"


@pytest.mark.integration
def test_member_start_benchmark_smoke_run_reports_both_ways() -> None:
    out = subprocess.run(
        [sys.executable, str(BENCH), "--smoke"], capture_output=True, text=True, timeout=180
    )
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["members"] == 4
    for way in ("fork_server", "interpreter_per_member"):
        figures = report[way]
        assert figures["agent_cpu_ms_per_member"] >= 0
        assert figures["supervisor_and_member_cpu_ms_per_member"] > 0
        assert figures["all_started_ms"] > 0
