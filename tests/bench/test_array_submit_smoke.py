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


# Runs in a process of its own with the repository as its first path: under pytest the
# name ``bench`` is this test package.
_RETRIES = """
import grpc
import bench.array_submit as bench

class Refused(grpc.RpcError):
    def __init__(self, code):
        self._code = code
    def code(self):
        return self._code
    def details(self):
        return "not the leader; the leader is r1 at 127.0.0.1:1"

roots, failures = [], []

def cluster_run(root, tasks, repeat):
    roots.append(root)
    if failures:
        raise Refused(failures.pop())
    return {"ack_ms": 1.0}

bench.cluster_run = cluster_run
failures[:] = [grpc.StatusCode.FAILED_PRECONDITION]
assert bench.measured_cluster_run(20, 1) == {"ack_ms": 1.0, "runs_discarded_by_an_election": 1}
assert len(roots) == 2 and roots[0] != roots[1], roots
for code, tries in ((grpc.StatusCode.UNAVAILABLE, 3), (grpc.StatusCode.FAILED_PRECONDITION, 2)):
    failures[:] = [code] * tries  # not retried; nor is the last try
    roots.clear()
    try:
        bench.measured_cluster_run(20, 1, tries=tries)
    except grpc.RpcError as error:
        assert error.code() is code
        assert len(roots) == (1 if code is grpc.StatusCode.UNAVAILABLE else tries), roots
    else:
        raise AssertionError("no error")
print("ok")
"""


def test_a_run_cut_short_by_an_election_is_run_again_on_a_new_cluster() -> None:
    out = subprocess.run(
        [sys.executable, "-c", _RETRIES],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=BENCH.parents[1],
    )
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
