"""The synthetic-workload gap benchmark's smoke run, so that it cannot rot."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "synthetic_gap.py"


def test_synthetic_gap_smoke_run_compares_every_run_with_fifo_on_the_same_jobs() -> None:
    out = subprocess.run(
        [sys.executable, str(BENCH), "--smoke"], capture_output=True, text=True, timeout=180
    )
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout)
    assert set(report["per_seed"]) == {"1", "2"}
    for seed in report["per_seed"].values():
        runs, over = seed["runs"], seed["over_fifo"]
        assert set(over) == {name for name in runs if "ours" in name}
        for name, ratio in over.items():
            fifo = runs["limited_fifo" if name.startswith("limited") else "fifo"]
            if fifo["mean"]:
                assert ratio["mean"] == round(runs[name]["mean"] / fifo["mean"], 3)
            assert ratio["big_max_met"] is (runs[name]["big_max"] <= fifo["big_max"])
    assert all(v.endswith("/2") for v in report["summary"]["ours"].values() if isinstance(v, str))
