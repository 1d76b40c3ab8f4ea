"""Pre-vote on three in-process replicas: a follower cut off from the others (every
message to or from it dropped, the connections kept) for several election timeouts
rejoins under the same leader in the same term; without pre-vote it raises its term
while cut off and deposes the leader when the cut heals."""

from __future__ import annotations

import queue
import threading
import time
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from pysyncobj import FAIL_REASON

from synapse_ha.local.waiting import wait_until
from synapse_ha.raft.replica import RaftReplica, RaftTiming
from tests.raft.in_process import replicas_of

CUT_S = 3.0  # several election timeouts (0.4-0.8 s)
SETTLE_S = 2.0  # long enough for a rejoined follower to have stood, had it done so


def _three(tmp_path: Path, pre_vote: bool) -> AbstractContextManager[list[RaftReplica]]:
    return replicas_of(tmp_path, [RaftTiming(pre_vote=pre_vote)] * 3)


class Cut:
    """Drops every Raft message to or from ``member`` while set: each replica's message
    hook (:class:`~synapse_ha.raft.adapter.SafeSyncObj`) consumes them unseen."""

    def __init__(self, replicas: list[RaftReplica], member: RaftReplica) -> None:
        self.active = threading.Event()
        address = member._sync.selfNode.address
        for replica in replicas:
            cut_off = replica is member
            original = replica._sync._pre_vote_message

            def hook(
                node: Any, message: Any, cut_off: bool = cut_off, original: Any = original
            ) -> bool:
                if self.active.is_set() and (cut_off or node.address == address):
                    return True
                return bool(original(node, message))

            replica._sync._pre_vote_message = hook  # type: ignore[method-assign]


def _agreed(replicas: list[RaftReplica]) -> RaftReplica | None:
    """The one leader every replica names, or None."""
    leaders = [r for r in replicas if r.is_leader()]
    if len(leaders) != 1:
        return None
    address = leaders[0].self_address
    return leaders[0] if all(r.leader_address() == address for r in replicas) else None


def _leader(replicas: list[RaftReplica]) -> RaftReplica:
    return wait_until("a leader every replica names", lambda: _agreed(replicas), 15.0)


def _term(replica: RaftReplica) -> int:
    return int(replica.status().term)


def _cut_and_heal(replicas: list[RaftReplica]) -> tuple[RaftReplica, int]:
    """Cut a follower off for CUT_S, heal, let it settle; the leader and term before."""
    leader = _leader(replicas)
    term = _term(leader)
    follower = next(r for r in replicas if r is not leader)
    cut = Cut(replicas, follower)
    cut.active.set()
    time.sleep(CUT_S)
    cut.active.clear()
    time.sleep(SETTLE_S)
    return leader, term


def test_a_cut_off_follower_rejoins_without_a_new_term(tmp_path: Path) -> None:
    with _three(tmp_path, pre_vote=True) as replicas:
        leader, term = _cut_and_heal(replicas)
        assert _leader(replicas) is leader
        assert [_term(r) for r in replicas] == [term] * 3


def test_without_pre_vote_the_rejoining_follower_deposes_the_leader(tmp_path: Path) -> None:
    with _three(tmp_path, pre_vote=False) as replicas:
        _leader_before, term = _cut_and_heal(replicas)
        _leader(replicas)
        assert all(_term(r) > term for r in replicas)


def _mixed(tmp_path: Path, pre_votes: list[bool]) -> AbstractContextManager[list[RaftReplica]]:
    """Replicas with and without pre-vote: one without stands for an earlier release
    (pysyncobj's handler ignores ``pre_vote``, as the earlier release's does)."""
    timings = [RaftTiming(pre_vote=p, election_min_s=0.4, election_max_s=0.8) for p in pre_votes]
    return replicas_of(tmp_path, timings)


def test_in_a_rolling_upgrade_the_earlier_replicas_elect_among_themselves(tmp_path: Path) -> None:
    with _mixed(tmp_path, [True, False, False]) as replicas:
        upgraded = replicas[0]
        # Its pre-votes go unanswered: it never stands, while the earlier two elect.
        leader = _leader(replicas)
        assert leader is not upgraded
        assert upgraded.status().term == leader.status().term
        # The unknown message type closed no connection.
        assert all(len(r._sync._SyncObj__connectedNodes) == 2 for r in replicas)


def _transfer(leader: RaftReplica, target: RaftReplica) -> None:
    """Ask ``leader`` to hand over to ``target`` until the request is sent. pysyncobj
    denies a transfer while the leader's match index for the target trails its log (an
    entry appended after the target caught up); a denied request sends nothing, so asking
    again cannot start a second election."""
    address = target.self_address
    sync = leader._sync
    outcomes: queue.Queue[Any] = queue.Queue()

    def ask() -> None:
        sync.transferLeadership(node=address, callback=lambda _r, error: outcomes.put(error))

    def sent() -> bool:
        leader._membership._call_on_raft_thread(ask)
        return bool(outcomes.get(timeout=5.0) == FAIL_REASON.SUCCESS)

    wait_until("the leader to send the transfer", sent, 15.0, retry_on=(queue.Empty,))


def test_a_leadership_transfer_wins_despite_stickiness(tmp_path: Path) -> None:
    """Five replicas: the target needs the votes of followers that still hear the old
    leader; its announced transfer election gets them, in the next term."""
    with _mixed(tmp_path, [True] * 5) as replicas:
        leader = _leader(replicas)
        term = _term(leader)
        target = next(r for r in replicas if r is not leader)
        wait_until(
            "the target to hold every entry",
            lambda: target.status().last_applied >= leader.status().last_applied,
            15.0,
        )
        _transfer(leader, target)
        wait_until("the target to lead", lambda: _agreed(replicas) is target, 15.0)
        assert _term(target) == term + 1
