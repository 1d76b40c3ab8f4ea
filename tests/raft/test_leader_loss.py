"""A follower whose connection to its leader closes stands for election at once (the
survivors in address order, ``leader_loss_stagger_s`` apart) instead of waiting for its
election timeout; without the stagger it waits for the timeout, as pysyncobj does."""

from __future__ import annotations

import time
from contextlib import AbstractContextManager
from pathlib import Path

import pytest

from synapse_ha.local.waiting import wait_until
from synapse_ha.raft.adapter import leader_loss_delay
from synapse_ha.raft.replica import RaftReplica, RaftTiming
from tests.raft.in_process import replicas_of

# Election timeouts far longer than the waits below: a new leader within them can only
# come from the leader-loss rule.
LONG_TIMEOUT_S = 60.0


def test_the_survivors_take_turns_in_address_order() -> None:
    members = ["10.0.0.3:7001", "10.0.0.1:7001", "10.0.0.2:7001", "10.0.0.4:7001"]
    lost = "10.0.0.2:7001"
    delays = {m: leader_loss_delay(m, members, lost, 0.1) for m in members if m != lost}
    assert delays == pytest.approx(
        {"10.0.0.1:7001": 0.0, "10.0.0.3:7001": 0.1, "10.0.0.4:7001": 0.2}
    )


def test_a_member_not_among_the_members_is_refused() -> None:
    with pytest.raises(ValueError, match="not in list"):
        leader_loss_delay("10.0.0.9:7001", ["10.0.0.1:7001", "10.0.0.2:7001"], "10.0.0.1:7001", 0.1)


def _three(tmp_path: Path, stagger_s: float | None) -> AbstractContextManager[list[RaftReplica]]:
    timing = RaftTiming(
        election_min_s=LONG_TIMEOUT_S,
        election_max_s=2 * LONG_TIMEOUT_S,
        leader_loss_stagger_s=stagger_s,
    )
    return replicas_of(tmp_path, [timing] * 3)


def _elect(replicas: list[RaftReplica], index: int) -> RaftReplica:
    """Make ``replicas[index]`` stand for election now (the timeouts are a minute)."""
    wait_until(
        "every replica connected",
        lambda: all(len(r._sync._SyncObj__connectedNodes) == 2 for r in replicas),
        15.0,
    )
    replicas[index]._sync._SyncObj__raftElectionDeadline = 0
    wait_until(
        "a leader every replica names",
        lambda: all(r.leader_address() == replicas[index]._sync.selfNode.address for r in replicas),
        15.0,
    )
    return replicas[index]


def _survivors_after_stopping(
    replicas: list[RaftReplica], leader: RaftReplica
) -> list[RaftReplica]:
    survivors = [r for r in replicas if r is not leader]
    leader.stop()
    wait_until(
        "the old leader's Raft thread to end", lambda: not leader._sync.tick_thread_alive(), 15.0
    )
    return survivors


def test_a_survivor_leads_soon_after_the_leader_stops(tmp_path: Path) -> None:
    """The election timeouts are a minute: a leader within the wait comes from the rule.
    The first survivor by address stands first (the turns are checked above); which one
    wins is not asserted: with pre-vote, a survivor that has not yet seen the leader's
    connection close refuses the first one's pre-vote, and under load the second's turn
    can come first."""
    with _three(tmp_path, stagger_s=0.2) as replicas:
        ordered = sorted(replicas, key=lambda r: r._sync.selfNode.address)
        leader = _elect(replicas, replicas.index(ordered[1]))
        survivors = _survivors_after_stopping(replicas, leader)
        new = wait_until(
            "a survivor to lead",
            lambda: next((r for r in survivors if r.is_leader()), None),
            15.0,
        )
        wait_until(
            "both survivors to name the new leader",
            lambda: all(r.leader_address() == new._sync.selfNode.address for r in survivors),
            15.0,
        )


def test_without_the_rule_the_survivors_wait_for_their_timeouts(tmp_path: Path) -> None:
    with _three(tmp_path, stagger_s=None) as replicas:
        leader = _elect(replicas, 0)
        survivors = _survivors_after_stopping(replicas, leader)
        time.sleep(3.0)  # far longer than the rule's turns: nobody stands within the minute
        assert not any(r.is_leader() for r in survivors)
        assert all(
            r._sync._SyncObj__raftElectionDeadline > time.monotonic() + 30 for r in survivors
        )
