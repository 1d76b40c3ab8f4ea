"""The catch-up benchmark's smoke run, so that it cannot rot."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "catchup.py"


def test_catchup_benchmark_smoke_run_reports_its_figures() -> None:
    out = subprocess.run(
        # A snapshot every 400 entries, and the restarted replica has 100 entries past
        # its own to replay: the restart loads a snapshot and applies a journal.
        [
            sys.executable,
            str(BENCH),
            "--smoke",
            "--replay=100",
            "--replica-arg=--compaction-entries=400",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout)
    assert report["smoke"] is True
    assert report["commit_index_after_fill"] >= report["log_entries_target"]
    assert report["commit_index_at_restart"] > report["commit_index_after_fill"]
    assert report["victim_applied_when_serving"] >= report["commit_index_at_restart"]
    assert report["restart_to_serving_s"] > 0
    assert report["victim_journal_bytes"] > 0
    assert report["victim_entries_past_snapshot_at_kill"] >= 100
    assert report["snapshot_index_restored"] > 0  # a snapshot (every ~400 entries) was loaded
    assert report["entries_applied_until_serving"] >= 100
