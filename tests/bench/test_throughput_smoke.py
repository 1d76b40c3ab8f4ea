"""The throughput benchmark's smoke run (so that it cannot rot), and its profile summary."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench" / "throughput.py"


@pytest.mark.integration
def test_throughput_smoke_run_measures_submissions_and_binds(tmp_path: Path) -> None:
    out = tmp_path / "throughput.json"
    run = subprocess.run(
        [sys.executable, str(BENCH), "--smoke", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert run.returncode == 0, run.stderr[-4000:]
    report = json.loads(run.stdout)
    assert json.loads(out.read_text()) == report
    submit = report["submit"]
    # Every submission acknowledged once, each a job of its own, from 2 processes.
    assert submit["generator_processes"] == 2
    assert submit["acknowledged"] == submit["distinct_jobs"] == submit["submissions"] == 200
    assert submit["submissions_per_s"] > 0 and submit["leader_cpu_us_per_submission"] > 0
    # Every replica's /metrics was read: the Raft threads' tick intervals, before and after.
    assert set(submit["raft_tick_stalls"]) == {"leader", "followers"}
    assert 0 < submit["raft_longest_tick_interval_s"]["leader"] < 60
    bind = report["bind"]
    assert bind["gangs"] == 40 and bind["members_bound"] == 40 * 4
    assert bind["members_bound_per_s"] > 0 and bind["seconds_submit_to_all_bound"] > 0


@pytest.mark.integration
def test_throughput_smoke_binds_with_nodes_heartbeating_on_streams() -> None:
    run = subprocess.run(
        [sys.executable, str(BENCH), "--smoke", "--only", "b", "--heartbeats", "stream"],
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert run.returncode == 0, run.stderr[-4000:]
    bind = json.loads(run.stdout)["bind"]
    assert bind["heartbeats"] == "stream"
    assert bind["gangs"] == 40 and bind["members_bound"] == 40 * 4
    assert bind["nodes_dead_at_end"] == 0 and bind["gang_requeues"] == 0


def test_profile_summary_counts_self_and_total_samples_per_function(tmp_path: Path) -> None:
    collapsed = tmp_path / "profile.txt"
    collapsed.write_text(
        "\n".join(
            [
                "thread (11): grpc_3;run (a.py:1);SubmitJob (s.py:2);decode (c.py:3) 6",
                "thread (12): grpc_17;run (a.py:1);SubmitJob (s.py:2) 2",
                "thread (13): leader-loop;run (a.py:1);plan (p.py:9) 4",
                "not a sample line",
            ]
        )
    )
    run = subprocess.run(
        [sys.executable, str(BENCH), "--summarise", str(collapsed), "--per", "4"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr[-4000:]
    summary = json.loads(run.stdout)
    assert summary["busy_samples"] == 12
    assert summary["busy_samples_per_1000_units"] == 3000.0
    assert summary["by_thread"] == {"grpc": 8, "leader-loop": 4}
    assert summary["top_self"][:2] == [["decode (c.py:3)", 6], ["plan (p.py:9)", 4]]
    assert summary["top_total"][:2] == [["run (a.py:1)", 12], ["SubmitJob (s.py:2)", 8]]
