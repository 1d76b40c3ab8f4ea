"""Fault schedules: seeded, complete, saved and loaded, with durations that cross the
thresholds they test."""

from __future__ import annotations

from pathlib import Path

import pytest

from chaos import nemesis
from chaos.__main__ import parse_scenarios, parse_seeds
from chaos.nemesis import FaultTimeouts


def test_the_targeted_schedule_has_every_fault_once_and_depends_only_on_the_seed() -> None:
    a = nemesis.targeted_schedule(7)
    assert sorted(s.kind for s in a) == sorted(nemesis.ALL_FAULTS)
    assert nemesis.targeted_schedule(7) == a
    orders = {tuple(s.kind for s in nemesis.targeted_schedule(seed)) for seed in range(10)}
    assert len(orders) > 1


def test_durations_cross_the_threshold_each_fault_tests() -> None:
    t = FaultTimeouts()
    for seed in range(30):
        for step in nemesis.targeted_schedule(seed, t):
            if step.kind in (nemesis.CUT_WORKER_FROM_LEADER, nemesis.PAUSE_WORKER):
                assert step.duration_s > t.lease_ttl_s
            if step.kind == nemesis.CUT_WORKER_FROM_REPLICAS:
                assert step.duration_s > t.dead_timeout_s
            if step.kind == nemesis.PAUSE_LEADER:
                assert step.duration_s > t.election_max_s + t.leader_step_down_s
            if step.kind == nemesis.ISOLATE_LEADER:
                assert step.duration_s > t.leader_step_down_s
            assert step.gap_before_s > 0


def test_a_random_schedule_fills_its_duration_without_exceeding_it() -> None:
    steps = nemesis.random_schedule(3, 60.0)
    assert steps == nemesis.random_schedule(3, 60.0)
    assert steps != nemesis.random_schedule(4, 60.0)
    assert len(steps) >= 5
    assert sum(s.gap_before_s + s.duration_s for s in steps) <= 60.0
    assert [s.index for s in steps] == list(range(len(steps)))
    # Even a duration shorter than one fault runs one fault.
    assert len(nemesis.random_schedule(3, 0.1)) == 1


def test_the_broken_build_scenario_outlasts_the_dead_timeout() -> None:
    t = FaultTimeouts()
    steps = nemesis.broken_build_schedule(t)
    assert {s.kind for s in steps} == {nemesis.CUT_WORKER_FROM_REPLICAS}
    assert all(s.duration_s > t.dead_timeout_s + 1 for s in steps)


def test_a_schedule_round_trips_through_its_file(tmp_path: Path) -> None:
    steps = nemesis.random_schedule(11, 40.0)
    path = tmp_path / "schedule.json"
    nemesis.save(steps, path, seed=11, scenario="random")
    assert nemesis.load(path) == steps


def test_seed_and_scenario_arguments() -> None:
    assert parse_seeds("1,3-5") == [1, 3, 4, 5]
    assert parse_scenarios("random,targeted") == ["random", "targeted"]
    with pytest.raises(Exception, match="'x' is not an integer"):
        parse_seeds("x")
    with pytest.raises(Exception, match="'nope' is not one of"):
        parse_scenarios("nope")
