"""The memory benchmark's smoke run, so that it cannot rot."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "memory.py"


def test_memory_benchmark_smoke_run_reports_its_figures() -> None:
    out = subprocess.run(
        [sys.executable, str(BENCH), "--smoke"], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout)
    attribution, replica = report["attribution"], report["replica"]
    assert attribution["live_jobs"] == attribution["jobs"] == 200
    assert attribution["traced_state_mb"] > attribution["traced_nodes_mb"] > 0
    assert attribution["encoded_state_mb"] > 0
    assert attribution["top_allocation_sites"]
    assert replica["live_jobs"] == 200
    started, loaded = replica["rss_started_mib"]["VmRSS"], replica["rss_with_jobs_mib"]["VmRSS"]
    assert loaded >= started > 0
    assert replica["encoded_state_mb"] > replica["encoded_state_nodes_only_mb"] > 0
    assert replica["encoded_bytes_per_job"] > 0 and replica["encoded_bytes_per_node"] > 0
