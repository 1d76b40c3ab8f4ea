"""Whether a change of the replica set may start now: one rule, no I/O.

Raft (as pysyncobj implements it) changes membership one replica at a time, without
joint consensus: each change is one log entry that takes effect on every replica as soon
as it is appended. The rules here keep the cluster able to commit across the change:

* one change at a time: while a membership entry is not yet applied, the next change is
  refused (``CHANGE_IN_FLIGHT``);
* a change must leave a quorum that can commit at once. A replica counts as *live* when
  the leader reaches it and its log is caught up (see :class:`MemberView`); the leader
  itself is live. Adding a replica to ``n`` members needs the live members to
  form a majority of ``n + 1`` already (the new replica may take a while to catch
  up, and it may never start) — except a cluster of one, which can grow only by
  waiting for its second replica (start that one first); removing one needs the live
  members *other than* the removed one to form a majority of ``n - 1``
  (``WOULD_LOSE_QUORUM``). Removing a dead replica is therefore always allowed while a
  majority of the others is live; removing a live one while another is down is refused;
* an id or address already in use is refused (``REPLICA_EXISTS``); removing an unknown
  replica is ``REPLICA_NOT_FOUND``; the last replica cannot be removed.

Every refusal is a :class:`MembershipRefusal`: a code for programs and a sentence for
people.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass


class ReplicaRole(enum.StrEnum):
    """What a replica is in the Raft group, as a replica reports it (``UNREACHABLE``: it
    did not answer the replica asking)."""

    LEADER = "leader"
    FOLLOWER = "follower"
    CANDIDATE = "candidate"
    UNREACHABLE = "unreachable"


class MembershipCode(enum.StrEnum):
    CHANGE_IN_FLIGHT = "change_in_flight"
    WOULD_LOSE_QUORUM = "would_lose_quorum"
    REPLICA_EXISTS = "replica_exists"
    REPLICA_NOT_FOUND = "replica_not_found"
    LAST_REPLICA = "last_replica"
    IS_LEADER = "is_leader"  # the leader cannot remove itself: it hands leadership over


@dataclass(frozen=True, slots=True)
class MemberView:
    """One member as the leader sees it. ``live``: the leader reaches it and its log is
    caught up (for the leader itself: always)."""

    replica_id: str
    raft: str
    grpc: str
    live: bool


@dataclass(frozen=True, slots=True)
class MembershipRefusal:
    code: MembershipCode
    message: str


def majority(members: int) -> int:
    """The smallest number of replicas that forms a quorum of ``members``."""
    return members // 2 + 1


def _names(members: Sequence[MemberView]) -> str:
    return ", ".join(sorted(m.replica_id for m in members)) or "none"


def check_add(
    members: Sequence[MemberView], replica_id: str, raft: str, grpc: str, in_flight: bool
) -> MembershipRefusal | None:
    """None when ``replica_id`` at ``raft``/``grpc`` may be added now."""
    if in_flight:
        return _in_flight()
    for m in members:
        if m.replica_id == replica_id or m.raft == raft or (grpc and m.grpc == grpc):
            return MembershipRefusal(
                MembershipCode.REPLICA_EXISTS,
                f"replica {m.replica_id} (raft {m.raft}, grpc {m.grpc}) already uses "
                f"the id or an address of {replica_id} (raft {raft}, grpc {grpc})",
            )
    live = [m for m in members if m.live]
    need = majority(len(members) + 1)
    # One replica can only grow by waiting for the second to catch up: allowed.
    if len(live) < need and len(members) > 1:
        down = [m for m in members if not m.live]
        return MembershipRefusal(
            MembershipCode.WOULD_LOSE_QUORUM,
            f"adding {replica_id} makes {len(members) + 1} replicas, which need {need} "
            f"live to commit, and only {len(live)} are live ({_names(live)}; down or "
            f"behind: {_names(down)}); remove or repair those first",
        )
    return None


def check_remove(
    members: Sequence[MemberView], replica_id: str, in_flight: bool
) -> MembershipRefusal | None:
    """None when ``replica_id`` may be removed now."""
    if in_flight:
        return _in_flight()
    target = next((m for m in members if m.replica_id == replica_id), None)
    if target is None:
        return MembershipRefusal(
            MembershipCode.REPLICA_NOT_FOUND,
            f"no replica {replica_id!r} in the cluster (members: {_names(members)})",
        )
    if len(members) == 1:
        return MembershipRefusal(
            MembershipCode.LAST_REPLICA, f"{replica_id} is the last replica of the cluster"
        )
    rest = [m for m in members if m.replica_id != replica_id]
    live = [m for m in rest if m.live]
    need = majority(len(rest))
    if len(live) < need:
        down = [m for m in rest if not m.live]
        return MembershipRefusal(
            MembershipCode.WOULD_LOSE_QUORUM,
            f"removing {replica_id} leaves {len(rest)} replicas, which need {need} live to "
            f"commit, and only {len(live)} of them are live ({_names(live)}; down or "
            f"behind: {_names(down)}); remove a replica that is down instead, or repair "
            "it first",
        )
    return None


def _in_flight() -> MembershipRefusal:
    return MembershipRefusal(
        MembershipCode.CHANGE_IN_FLIGHT,
        "another membership change is not committed yet; changes go one at a time, retry "
        "when it is",
    )
