"""The fair-sharing preemption benchmark's smoke run, so that it cannot rot."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "fair_preemption.py"


def test_the_smoke_run_reports_every_seed_under_blind_topology_and_fair() -> None:
    out = subprocess.run(
        [sys.executable, str(BENCH), "--smoke"], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout)
    (run,) = report["runs"]
    assert list(run["policies"]) == ["blind", "topology", "fair"]
    for figures in run["policies"].values():
        assert figures["preempt_commands_rejected"] == 0
        assert {"jain_backlogged", "delay_p50_s", "gpu_hours_lost"} <= set(figures)
    assert set(run["fair_jain_shortfall_split"]) == {
        "below_nominal_reclaimable",
        "below_nominal_unreclaimable",
        "below_nominal_gang_too_big",
        "unequal_borrowing",
        "while_arriving",
        "after_the_last_arrival",
        "cohort_full",
        "no_room",
    }
    target = report["summary"]["fair_jain_target"]
    assert len(target["per_seed"]) == 1 and isinstance(target["met"], bool)


def test_bad_options_are_refused_naming_them() -> None:
    out = subprocess.run(
        [sys.executable, str(BENCH), "--seeds", "0"], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 2 and "--seeds: at least 1, got 0" in out.stderr
    out = subprocess.run(
        [sys.executable, str(BENCH), "--half-life-h", "0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2 and "--half-life-h: a number above 0, got 0.0" in out.stderr
