"""The srun latency benchmark's smoke run, so that it cannot rot."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "srun_latency.py"


def test_srun_latency_smoke_run_reports_every_step() -> None:
    out = subprocess.run(
        [sys.executable, str(BENCH), "--smoke"], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout)
    assert (report["steps"], report["nodes"], report["tasks_per_node"]) == (2, 2, 2)
    first, last = report["first_task_started_s"], report["last_task_started_s"]
    assert 0 < first["p50"] <= last["p50"] <= report["srun_whole_s"]["p50"]
