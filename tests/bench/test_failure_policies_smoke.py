"""The failure policies benchmark's smoke run, so that it cannot rot."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "failure_policies.py"


def test_failure_policies_benchmark_smoke_run_reports_every_policy_and_the_targets() -> None:
    out = subprocess.run(
        [sys.executable, str(BENCH), "--smoke"], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout)
    run = report["smoke"]
    policies = ["requeue", "replace", "replace+spares", "elastic", "elastic+spares"]
    assert list(run["figures"]) == policies
    for figures in run["figures"].values():
        assert figures["gpu_failures"] > 0 and figures["gangs_hit"] > 0
        assert figures["ettr"]["all"]["n"] > 0
    assert run["figures"]["replace"]["ranks_replaced"] > 0
    assert run["figures"]["replace+spares"]["spares_idle_gpu_hours"] > 0
    assert set(run["targets"]) == {"ettr_gangs_64_plus", "restart_delay_p50"}
    assert all(isinstance(t["met"], bool) for t in run["targets"].values())
    elastic = run["figures"]["elastic"]["elastic"]
    assert elastic["grows"] > 0 and elastic["shrinks"] > 0
    assert run["figures"]["requeue"]["elastic"]["grows"] == 0
