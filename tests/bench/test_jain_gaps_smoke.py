"""The Jain shortfall benchmark's smoke run, so that it cannot rot."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "jain_gaps.py"


def test_the_shortfall_is_split_into_categories_that_add_up_to_the_index() -> None:
    out = subprocess.run(
        [sys.executable, str(BENCH), "--smoke"], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-3000:]
    run = json.loads(out.stdout)["runs"][0]
    index = run["jain_backlogged"]
    # The same index as the simulator's own tenancy figures, from the same instants.
    assert index == run["jain_backlogged_tenancy_meter"]
    categories = run["categories"].values()
    assert abs(sum(c["share_of_shortfall"] for c in categories) - 1) < 0.01
    for c in categories:
        assert c["index_without_it"] >= index
        if c["share_of_shortfall"] > 0:
            assert c["gangs_over_the_mean"] and c["queues_under_the_mean"], c
    assert run["series"] and all("shares" in point for point in run["series"])
    # The phases split the whole shortfall; the causes split the gang-too-big part.
    assert abs(sum(run["by_phase"].values()) - 1) < 0.01
    too_big = run["categories"]["below_nominal_gang_too_big"]["share_of_shortfall"]
    assert abs(sum(run["gang_too_big_by_cause"].values()) - too_big) < 0.01
