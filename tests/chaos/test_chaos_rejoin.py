"""The ``rejoin`` fault's schedule and its checker rule, ``rejoin-term-change``."""

from __future__ import annotations

import json
from pathlib import Path

from chaos import ledger, nemesis
from chaos.nemesis import FaultTimeouts
from chaos.rejoin_rules import (
    RejoinWindow,
    RoleSample,
    check_rejoins,
    check_run_dir,
    healthy_leader_at,
)

S = 1_000_000_000  # one second in ns


def _steady(term: int = 3) -> list[RoleSample]:
    return [
        RoleSample("r1", "leader", term, 1 * S),
        RoleSample("r2", "follower", term, 1 * S),
        RoleSample("r3", "follower", term, 1 * S),
    ]


WINDOW = RejoinWindow("r3", 10 * S, 20 * S)


def test_every_schedule_holds_a_rejoin_longer_than_several_election_timeouts() -> None:
    t = FaultTimeouts()
    for seed in range(10):
        steps = [s for s in nemesis.targeted_schedule(seed, t) if s.kind == nemesis.REJOIN]
        assert len(steps) == 1
        assert steps[0].duration_s >= 4 * t.election_max_s
    assert nemesis.REJOIN in nemesis.CONTROL_FAULTS


def test_a_rejoin_under_the_same_leader_and_term_passes() -> None:
    samples = [
        *_steady(),
        RoleSample("r3", "down", 0, 11 * S),
        RoleSample("r3", "follower", 3, 15 * S),
    ]
    assert check_rejoins([WINDOW], samples) == []


def test_a_higher_term_during_the_rejoin_is_a_violation() -> None:
    samples = [*_steady(), RoleSample("r3", "candidate", 4, 16 * S)]
    (v,) = check_rejoins([WINDOW], samples)
    assert v.kind == "rejoin-term-change"
    assert "r3 was candidate in term 4" in v.detail
    assert "r1 led term 3" in v.detail


def test_another_leader_during_the_rejoin_is_a_violation() -> None:
    samples = [*_steady(), RoleSample("r2", "leader", 3, 12 * S)]
    assert [v.kind for v in check_rejoins([WINDOW], samples)] == ["rejoin-term-change"]


def test_changes_outside_the_window_are_not_judged() -> None:
    samples = [*_steady(), RoleSample("r2", "leader", 4, 21 * S)]
    assert check_rejoins([WINDOW], samples) == []


def test_a_rejoin_that_starts_without_a_healthy_leader_is_not_judged() -> None:
    electing = [
        RoleSample("r1", "candidate", 3, 1 * S),
        RoleSample("r2", "follower", 3, 1 * S),
        RoleSample("r3", "follower", 2, 1 * S),
    ]
    assert healthy_leader_at(electing, 10 * S) is None
    assert check_rejoins([WINDOW], [*electing, RoleSample("r1", "leader", 4, 12 * S)]) == []
    minority = [
        RoleSample("r1", "leader", 3, 1 * S),
        RoleSample("r2", "unreachable", 0, 1 * S),
        RoleSample("r3", "down", 0, 1 * S),
    ]
    assert healthy_leader_at(minority, 10 * S) is None
    assert healthy_leader_at(_steady(), 10 * S) == ("r1", 3)


def test_the_rule_reads_the_run_directory(tmp_path: Path) -> None:
    faults = {"type": "fault", "kind": "rejoin", "targets": ["r3"], "start_ns": 10 * S}
    lines = [json.dumps({**faults, "end_ns": 20 * S})]
    (tmp_path / ledger.FAULTS).write_text("\n".join(lines) + "\n")
    roles = [
        {"type": "role", "replica": s.replica, "role": s.role, "term": s.term, "mono_ns": s.mono_ns}
        for s in [*_steady(), RoleSample("r3", "leader", 5, 13 * S)]
    ]
    (tmp_path / ledger.LEADERS).write_text("".join(json.dumps(r) + "\n" for r in roles))
    assert [v.kind for v in check_run_dir(tmp_path)] == ["rejoin-term-change"]
