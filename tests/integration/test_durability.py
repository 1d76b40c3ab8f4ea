"""Durability cycles on real processes: SIGKILL of every replica at once under a stream
of submissions, restart, and no acknowledged submission lost (bench/durability.py runs
100 of them in ``make soak-durability``)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

pytestmark = pytest.mark.integration

BENCH = Path(__file__).resolve().parents[2] / "bench" / "durability.py"


def _bench() -> ModuleType:
    """bench/durability.py, loaded from its file (bench/ is a directory of scripts)."""
    name = "durability_bench"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, BENCH)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


@pytest.mark.parametrize("fsync", [True, False], ids=["fsync", "no-fsync"])
def test_no_acknowledged_submission_is_lost_when_every_replica_is_killed(
    tmp_path: Path, fsync: bool
) -> None:
    report = _bench().run_cycles(tmp_path, 2, fsync=fsync, compaction_entries=50, seed=7)
    # The stream really ran into the kills: submissions were acknowledged in every cycle.
    assert all(cycle["acked"] > 0 for cycle in report["per_cycle"])
    assert report["cycles_with_diverged_states"] == 0
    assert report["invariant_violations"] == []
    # No acknowledged job is missing or held under another job's name (an id handed out
    # twice means the first job was lost).
    assert report["acknowledged_lost"] == 0, report["lost_examples"]
    assert report["job_ids_handed_out_twice"] == []
    # ... every acknowledgement a distinct job, plus one marker job per cycle.
    streamed = sum(cycle["acked"] for cycle in report["per_cycle"])
    assert report["acknowledged"] == streamed + report["cycles"]
    final = report["per_cycle"][-1]
    assert final["jobs_in_state"] >= report["acknowledged"]
