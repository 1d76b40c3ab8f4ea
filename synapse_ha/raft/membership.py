"""The replica set's membership as Raft holds it, and its online changes.

:class:`MembershipChanges` lists the members (who is live, on the leader) and, on the
leader, adds or removes one replica at a time under the rules of
:mod:`synapse_ha.core.membership`; the change is a Raft entry, and its future settles
once that entry is committed. Each member is a pysyncobj node that carries the
replica's id and gRPC address next to its Raft address (:func:`tcp_node`), so every
replica knows every member's gRPC address, snapshots included (:func:`member_of`).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from pysyncobj.config import FAIL_REASON
from pysyncobj.node import TCPNode

from synapse_ha.core.membership import (
    MembershipCode,
    MembershipRefusal,
    MemberView,
    check_add,
    check_remove,
)
from synapse_ha.raft.adapter import SafeSyncObj
from synapse_ha.raft.proposals import fail_text, proposal_failure
from synapse_ha.raft.snapshot_file import SnapshotMember
from synapse_ha.raft.status import LEADER_STATE, raw_status

log = logging.getLogger(__name__)

# A member whose log is this many entries behind the commit index is not counted as
# live when deciding a membership change (a replica still receiving a snapshot is).
CATCH_UP_SLACK = 5_000
# A membership change whose callback never came (leadership moved) stops blocking the
# next one after this long.
CHANGE_FORGET_S = 10.0


class MembershipChanges:
    """The membership of the replica whose Raft node is ``sync``, at ``self_address``.

    At most one change is in flight at a time; one whose callback never came (leadership
    moved) stops blocking the next after :data:`CHANGE_FORGET_S`. Work that must run on
    the Raft thread waits for :meth:`run_raft_thread_calls`, called at every tick."""

    def __init__(self, sync: SafeSyncObj, self_address: str) -> None:
        self._sync = sync
        self.self_address = self_address
        self._change_lock = threading.Lock()
        self._change_started: float | None = None  # monotonic; None: no change in flight
        self._raft_thread_calls: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()

    def members(self) -> list[MemberView]:
        """Every member of the replica set as this replica knows it, itself included,
        sorted by replica id. ``live`` is meaningful on the leader: the member is
        connected and its log is within :data:`CATCH_UP_SLACK` entries of the commit
        index; elsewhere it only says whether this replica is connected to it."""
        sync = self._sync
        raw = raw_status(sync)
        leading = int(raw["state"]) == LEADER_STATE
        commit = int(raw["commit_idx"])
        views = [member_view(sync.selfNode, live=True)]
        for node in sync.otherNodes:
            connected = raw.get(f"partner_node_status_server_{node.id}") == 2
            match = int(raw.get(f"match_idx_server_{node.id}") or 0)
            caught_up = match >= commit - CATCH_UP_SLACK if leading else True
            views.append(member_view(node, live=connected and caught_up))
        return sorted(views, key=lambda v: (v.replica_id, v.raft))

    def member_addresses(self) -> list[SnapshotMember]:
        """The members (this replica included), without asking who is live."""
        sync = self._sync
        nodes = [sync.selfNode, *sync.otherNodes]
        return sorted((member_of(n) for n in nodes), key=lambda m: (m.replica_id, m.raft))

    def change_in_flight(self) -> bool:
        with self._change_lock:
            return self._in_flight_locked()

    def _in_flight_locked(self) -> bool:
        started = self._change_started
        if started is not None and time.monotonic() - started > CHANGE_FORGET_S:
            self._change_started = started = None  # its callback never came (leader moved)
        return started is not None

    def add_member(
        self, replica_id: str, raft_address: str, grpc_address: str
    ) -> MembershipRefusal | Future[None]:
        """Start adding a replica (on the leader). Returns the refusal when the change may
        not start now (:mod:`synapse_ha.core.membership`), else a future that resolves
        once the membership entry is committed (or fails with :class:`ProposalError`).
        The new replica then catches up from the leader (a snapshot when the log was
        compacted) while the cluster keeps committing."""
        with self._change_lock:
            refusal = check_add(
                self.members(), replica_id, raft_address, grpc_address, self._in_flight_locked()
            )
            if refusal is not None:
                return refusal
            self._change_started = time.monotonic()
        future = self._change_future()
        node = tcp_node(raft_address, replica_id, grpc_address)
        self._sync.addNodeToCluster(node, callback=self._change_done(future))
        log.info("adding replica %s (raft %s, grpc %s)", replica_id, raft_address, grpc_address)
        return future

    def remove_member(self, replica_id: str) -> MembershipRefusal | Future[None]:
        """Start removing a replica (on the leader); as :meth:`add_member`. The leader
        cannot remove itself: asked to, it hands leadership to its most caught-up peer
        and refuses with ``IS_LEADER`` (the caller retries; the new leader removes it)."""
        with self._change_lock:
            members = self.members()
            refusal = check_remove(members, replica_id, self._in_flight_locked())
            if refusal is not None:
                return refusal
            target = next(m for m in members if m.replica_id == replica_id)
            if target.raft == self.self_address:
                self._call_on_raft_thread(self._hand_over_leadership)
                return MembershipRefusal(
                    MembershipCode.IS_LEADER,
                    f"{replica_id} is the leader; it is handing leadership to another "
                    "replica: retry, and the new leader removes it",
                )
            self._change_started = time.monotonic()
        future = self._change_future()
        self._sync.removeNodeFromCluster(target.raft, callback=self._change_done(future))
        log.info("removing replica %s (raft %s)", replica_id, target.raft)
        return future

    @staticmethod
    def _change_future() -> Future[None]:
        future: Future[None] = Future()
        future.set_running_or_notify_cancel()
        return future

    def _change_done(self, future: Future[None]) -> Callable[[Any, int], None]:
        def done(result: Any, error: int) -> None:
            with self._change_lock:
                self._change_started = None
            if future.done():
                return
            if error == FAIL_REASON.SUCCESS:
                future.set_result(None)
            else:
                future.set_exception(proposal_failure(error))

        return done

    def _hand_over_leadership(self) -> None:
        def done(result: Any, error: int) -> None:
            if error != FAIL_REASON.SUCCESS:
                log.info("leadership hand-over not possible now: %s", fail_text(error))

        self._sync.transferLeadership(callback=done)

    def _call_on_raft_thread(self, fn: Callable[[], None]) -> None:
        self._raft_thread_calls.put(fn)

    def run_raft_thread_calls(self) -> None:
        """Runs on the Raft thread: the calls queued for it, in order."""
        while True:
            try:
                fn = self._raft_thread_calls.get_nowait()
            except queue.Empty:
                break
            try:
                fn()
            except Exception:
                log.exception("raft-thread call failed")


def tcp_node(raft_address: str, replica_id: str, grpc_address: str) -> TCPNode:
    return TCPNode(raft_address, replica_id=replica_id, grpc=grpc_address)


def member_of(node: Any) -> SnapshotMember:
    """A pysyncobj node as a snapshot member. Nodes made here carry ``replica_id`` and
    ``grpc``; a node from a replica of an earlier release carries only its address."""
    address = str(node.id)
    return SnapshotMember(
        raft=address,
        replica_id=str(getattr(node, "replica_id", address)),
        grpc=str(getattr(node, "grpc", "")),
    )


def member_view(node: Any, live: bool) -> MemberView:
    m = member_of(node)
    return MemberView(replica_id=m.replica_id, raft=m.raft, grpc=m.grpc, live=live)
