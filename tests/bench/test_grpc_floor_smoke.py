"""The gRPC floor benchmark's smoke run, so that it cannot rot."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "grpc_floor.py"


def test_grpc_floor_smoke_run_reports_every_way_of_serving_it_was_asked_for() -> None:
    out = subprocess.run(
        [sys.executable, str(BENCH), "--smoke", "--kinds", "sync"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout)
    assert report["smoke"] is True
    assert {k for k in report if k.startswith(("sync_", "aio_"))} == {"sync_plaintext", "sync_tls"}
    for way in ("sync_plaintext", "sync_tls"):
        figures = report[way]
        assert figures["calls"] == 40 and figures["calls_per_s"] > 0
        assert figures["server_cpu_us_per_call"] > 0 and figures["client_cpu_us_per_call"] > 0
        bound = (
            1e6
            * report["cpus"]
            / (figures["server_cpu_us_per_call"] + figures["client_cpu_us_per_call"])
        )
        assert abs(figures["calls_per_s_bound_on_this_machine"] - bound) <= 0.01 * bound


def test_with_a_group_commit_every_call_waits_for_one_and_is_answered() -> None:
    out = subprocess.run(
        [sys.executable, str(BENCH), "--smoke", "--kinds", "sync,aio", "--commit-ms", "2"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout)
    assert report["commit_ms"] == 2.0
    for way in ("sync_plaintext", "sync_tls", "aio_plaintext", "aio_tls"):
        assert report[way]["calls"] == 40 and report[way]["calls_per_s"] > 0
