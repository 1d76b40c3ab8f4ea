"""What a replica's Raft thread reports about itself: its role, term, indexes, leader
and quorum, read from pysyncobj's status on any thread."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from synapse_ha.raft.adapter import SafeSyncObj

_ROLES = {0: "follower", 1: "candidate", 2: "leader"}
# pysyncobj's state number of a leader.
LEADER_STATE = 2


@dataclass(frozen=True, slots=True)
class RaftStatus:
    role: str
    term: int
    commit_index: int
    last_applied: int
    leader: str  # raft address of the leader; empty when unknown
    has_quorum: bool
    ready: bool
    # How regularly the Raft thread runs (:mod:`synapse_ha.raft.tick_watch`).
    tick_stalls: int = 0
    longest_tick_interval_s: float = 0.0


def raw_status(sync: SafeSyncObj) -> dict[str, Any]:
    """pysyncobj's status, read from another thread: it iterates the member set,
    which a membership change on the Raft thread may resize mid-read; read again."""
    for _ in range(9):
        try:
            return dict(sync.getStatus())
        except RuntimeError:
            continue
    return dict(sync.getStatus())


def read_status(sync: SafeSyncObj) -> RaftStatus:
    """The replica's Raft status as of now."""
    leader = sync.leader_node()
    raw = raw_status(sync)
    return RaftStatus(
        role=_ROLES.get(int(raw["state"]), "unknown"),
        term=int(raw["raft_term"]),
        commit_index=int(raw["commit_idx"]),
        last_applied=int(raw["last_applied"]),
        leader=str(leader.address) if leader is not None else "",
        has_quorum=bool(raw["has_quorum"]),
        ready=bool(sync.isReady()),
        tick_stalls=sync.tick_watch.stalls,
        longest_tick_interval_s=sync.tick_watch.longest_interval_s,
    )
