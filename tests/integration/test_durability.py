"""Durability cycles on real processes: SIGKILL of every replica at once under a stream
of submissions, restart, and no acknowledged submission lost (bench/durability.py runs
100 of them in ``make soak-durability``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.durability import run_cycles

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("fsync", [True, False], ids=["fsync", "no-fsync"])
def test_no_acknowledged_submission_is_lost_when_every_replica_is_killed(
    tmp_path: Path, fsync: bool
) -> None:
    report = run_cycles(tmp_path, 3 if fsync else 2, fsync=fsync, compaction_entries=50, seed=7)
    # The stream really ran into the kills: submissions were acknowledged in every cycle.
    assert all(cycle["acked"] > 0 for cycle in report["per_cycle"])
    assert report["acknowledged"] == sum(cycle["acked"] for cycle in report["per_cycle"])
    assert report["acknowledged_lost"] == 0, report["lost_examples"]
    assert report["cycles_with_diverged_states"] == 0
    assert report["invariant_violations"] == []
    final = report["per_cycle"][-1]
    assert final["jobs_in_state"] >= report["acknowledged"]
