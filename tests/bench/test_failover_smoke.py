"""The failover benchmark's smoke run, so that it cannot rot."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "failover.py"


def test_failover_benchmark_smoke_run_reports_its_figures() -> None:
    out = subprocess.run(
        [sys.executable, str(BENCH), "--smoke"], capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout)
    assert report["smoke"] is True
    assert report["kills"] == 1
    assert len(report["failover_to_next_bind_s"]) == 1
    assert report["failover_to_next_bind_s_max"] >= report["failover_to_next_bind_s_p50"] > 0
    assert report["failover_to_first_write_s_p50"] > 0
    assert report["failover_to_leader_s_p50"] > 0
    assert report["kill_free_acknowledged_writes"] > 0
    assert report["kill_free_elections"] >= 0
    assert report["elections_per_kill_max"] >= 1  # a kill of the leader costs an election
    assert sorted(report["faults"]) == ["freeze", "kill", "partition"]
    for kind, figures in report["faults"].items():
        assert figures["faults"] == 1, kind
        assert figures["failover_to_next_bind_s_p50"] > 0, kind
        assert figures["elections_per_fault_max"] >= 1, kind
    # The gang running on the two real workers outlives every fault.
    assert report["gangs_survived"] == "3/3", report["faults"]
