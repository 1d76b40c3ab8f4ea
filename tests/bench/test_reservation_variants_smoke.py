"""The reservation variants benchmark's smoke run: each variant changes what it says
(no reservation at all, fewer passes that keep one), and its ratios are to FIFO's run on
the same jobs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "reservation_variants.py"


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(BENCH), "--smoke", *args], capture_output=True, text=True, timeout=180
    )


def test_every_variant_changes_the_reservations_and_is_judged_against_fifo() -> None:
    out = run()
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout)
    assert set(report["per_seed"]) == {"1", "2"}
    for seed in report["per_seed"].values():
        fifo, runs = seed["fifo"], seed["variants"]
        assert runs["shipped"]["reserving_passes"] > 0
        assert runs["none"]["reserving_passes"] == 0
        assert runs["after:3600"]["reserving_passes"] < runs["shipped"]["reserving_passes"]
        for r in runs.values():
            assert r["mean_over_fifo"] == round(r["mean"] / fifo["mean"], 3)
            assert r["mean_met"] is (r["mean"] <= 1.2 * fifo["mean"])
            assert r["big_max_met"] is (r["big_max"] <= fifo["big_max"])
    assert set(report["summary"]) == set(report["per_seed"]["1"]["variants"])


def test_an_unknown_variant_is_refused_before_any_run() -> None:
    out = run("--variants", "shipped,sometimes")
    assert out.returncode != 0
    assert "unknown variant 'sometimes'" in out.stderr
    assert out.stdout == ""


def test_without_topology_fifo_and_ours_see_the_same_jobs() -> None:
    out = run("--no-topology", "--variants", "none")
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout)
    assert report["workload"].endswith("without topology or locality wait")
    assert set(report["summary"]) == {"none"}
