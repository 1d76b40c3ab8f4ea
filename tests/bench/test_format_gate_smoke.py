"""The format gate benchmark's smoke run, so that it cannot rot."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "format_gate.py"


def test_format_gate_benchmark_smoke_run_reports_its_figures() -> None:
    out = subprocess.run(
        [sys.executable, str(BENCH), "--smoke"], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["benchmark"] == "format_gate"
    assert set(report["commands"]) == {"submit_job", "bind_plan_4_gangs", "report_64_exits"}
    for figures in report["commands"].values():
        assert figures["format_needed_us"] > 0 and figures["encode_us"] > 0
    assert isinstance(report["meets_target"], bool)
