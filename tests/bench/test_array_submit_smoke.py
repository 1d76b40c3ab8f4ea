"""The array submission benchmark's smoke run, so that it cannot rot."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "array_submit.py"


@pytest.mark.integration
def test_array_submit_benchmark_smoke_run_reports_its_figures() -> None:
    out = subprocess.run(
        [sys.executable, str(BENCH), "--smoke"], capture_output=True, text=True, timeout=180
    )
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["tasks"] == 20 and report["array"] == "0-19%10"
    cluster = report["cluster"]
    assert cluster["pending_jobs"] == 20
    assert cluster["array_id"] and len(cluster["ack_ms_each"]) == 1
    assert cluster["applied_commands"] >= 1 and cluster["one_job_applied_commands"] >= 1
    for key in ("ack_ms", "raft_entries", "rss_bytes_per_task", "elections"):
        assert isinstance(cluster[key], int | float)
    in_process = report["in_process"]
    assert in_process["traced_bytes_per_task"] > 0
    assert in_process["traced_bytes_per_task_after_first_pass"] > 0
    assert isinstance(in_process["history_tracker_bytes_per_task"], int)
    passes = report["schedule_pass"]
    assert passes["throttled"]["placed_by_the_pass"] == 10
    assert passes["unthrottled"]["placed_by_the_pass"] == 20
    assert isinstance(report["meets_ack_target"], bool)
    assert isinstance(report["meets_memory_target_state"], bool)
    assert isinstance(report["meets_memory_target_rss"], bool)
