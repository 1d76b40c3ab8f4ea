"""The leader-fault rule: a frozen or cut-off leader ends no running gang attempt."""

from __future__ import annotations

from chaos.checker import check_history
from chaos.history import (
    AttemptHistory,
    FaultRecord,
    History,
    JobHistory,
    MemberRecord,
)
from chaos.leader_rules import check_leader_fault_gangs, undecided
from chaos.nemesis import KILL_WORKER, PAUSE_LEADER
from synapse_ha.core.model import AttemptState, JobState

S = 1_000_000_000  # one second in ns


def member(kind: str, token: int, rank: int, at_s: float, job: str = "j1") -> MemberRecord:
    return MemberRecord(kind, job, token, token, rank, f"w{rank + 1}", int(at_s * S), 100 + rank)


def gang_history(outcome: str, last_s: float, faults: list[FaultRecord]) -> History:
    """Attempt token 1 of j1 starts at 1 s and writes its last records at ``last_s``; it
    ended with ``outcome``; token 2 succeeded later."""
    history = History()
    history.members += [member("start", 1, r, 1.0) for r in range(2)]
    history.members += [member("heartbeat", 1, r, last_s) for r in range(2)]
    history.members += [member("start", 2, r, 40.0) for r in range(2)]
    history.members += [member("end", 2, r, 41.0) for r in range(2)]
    history.job_history = [
        JobHistory(
            "j1",
            JobState.SUCCEEDED,
            "all_exited_zero",
            requeues=1,
            retries_used=0,
            attempts=(
                AttemptHistory(1, 1, AttemptState.REQUEUED, 0, outcome, ("w1", "w2")),
                AttemptHistory(2, 2, AttemptState.SUCCEEDED, 0, "all_exited_zero", ("w1", "w2")),
            ),
        )
    ]
    history.faults = faults
    return history


PAUSE = FaultRecord(PAUSE_LEADER, ("r1",), start_ns=5 * S, end_ns=15 * S)


def test_a_gang_fenced_while_the_leader_was_paused_is_flagged() -> None:
    history = gang_history("member_fenced", 9.0, [PAUSE])
    (violation,) = check_leader_fault_gangs(history, None)
    assert violation.kind == "leader-fault-ended-gang"
    assert violation.job == "j1"
    assert "member_fenced" in violation.detail and "pause-leader" in violation.detail
    assert [v.kind for v in check_history(history)].count("leader-fault-ended-gang") == 1


def test_a_node_declared_dead_after_the_heal_is_still_the_faults() -> None:
    history = gang_history("node_dead", 20.0, [PAUSE])
    assert [v.job for v in check_leader_fault_gangs(history, None)] == ["j1"]


def test_a_gang_that_survived_or_ended_for_its_own_reasons_is_not_flagged() -> None:
    assert check_leader_fault_gangs(gang_history("member_exited", 9.0, [PAUSE]), None) == []
    # Ended long after the fault and its heal: not the fault's doing.
    assert check_leader_fault_gangs(gang_history("member_fenced", 35.0, [PAUSE]), None) == []
    # Started after the fault began: it was not running then.
    late = FaultRecord(PAUSE_LEADER, ("r1",), start_ns=S // 2, end_ns=3 * S)
    assert check_leader_fault_gangs(gang_history("member_fenced", 2.0, [late]), None) == []


def test_a_window_another_fault_overlaps_is_not_decided() -> None:
    other = FaultRecord(KILL_WORKER, ("w1",), start_ns=8 * S, end_ns=9 * S)
    history = gang_history("member_fenced", 9.0, [PAUSE, other])
    assert check_leader_fault_gangs(history, None) == []
    assert undecided(history) == 1
