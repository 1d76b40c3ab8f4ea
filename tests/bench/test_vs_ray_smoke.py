"""The Ray comparison's smoke runs, so that it cannot rot."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "vs_ray.py"


def _run(*args: str) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, str(BENCH), "--smoke", *args],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-4000:]
    report: dict[str, Any] = json.loads(out.stdout)
    return report


def _check_side(side: dict[str, Any]) -> None:
    for shape in ("2x8gpu", "4x2gpu"):
        assert side[shape]["n"] == 3
        assert side[shape]["p99_ms"] >= side[shape]["p50_ms"] > 0
    assert side["start_5_gangs_ms"] > 0


@pytest.mark.integration
def test_our_side_of_the_ray_comparison_reports_its_figures() -> None:
    report = _run("--no-ray")
    _check_side(report["synapse_ha"])
    assert report["synapse_ha"]["replicas"] == 3
    assert report["ray"] == {"skipped": "not requested (--no-ray)"}
    assert "ours_over_ray" not in report
    assert report["read_fairly"]["synapse_ha"] and report["read_fairly"]["ray"]


@pytest.mark.integration
@pytest.mark.skipif(
    importlib.util.find_spec("ray") is None,
    reason="Ray is an optional bench dependency (pip install -e '.[ray]'); without it "
    "only our side is measured, which the test above covers",
)
def test_both_sides_of_the_ray_comparison_report_figures_and_ratios() -> None:
    report = _run()
    _check_side(report["synapse_ha"])
    _check_side(report["ray"])
    ratios = report["ours_over_ray"]
    assert ratios["2x8gpu_p50_ms"] == pytest.approx(
        report["synapse_ha"]["2x8gpu"]["p50_ms"] / report["ray"]["2x8gpu"]["p50_ms"], rel=0.01
    )
