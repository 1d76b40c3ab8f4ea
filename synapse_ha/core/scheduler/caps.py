"""The member caps as one scheduling pass applies them (core/spec/member_limits.py).

A pass reads each owner's members from the state's index (never changed by the pass) and
adds the gangs it places itself, so the caps hold across the gangs of one plan as the
state machine checks them when it binds the plan, gang after gang.

**Cost.** Per gang, a few dictionary look-ups: the owner's count in the cluster, and how
many of the gang's members each node may take under the per-node cap, which is worked
out only when the gang is larger than the cap or the owner's fullest node is that close
to it (:meth:`PassCaps.room`), and kept until the pass places another gang of that owner.
"""

from __future__ import annotations

from synapse_ha.core.member_counts import MemberCounts
from synapse_ha.core.model import ClusterState, Job, MemberPlacement, Resources
from synapse_ha.core.reasons import Reason
from synapse_ha.core.scheduler.placement import NO_CAP, NodeRoom
from synapse_ha.core.spec.member_limits import (
    NO_RULES,
    MemberCap,
    member_counts,
    node_cap_reason,
    rules_in_force,
    running_cap_reason,
)


class PassCaps:
    """The floors and caps in force for one pass, and each owner's members as the pass
    goes (the state's, plus what it placed)."""

    __slots__ = (
        "_added",
        "_added_on",
        "_caps",
        "_peaks",
        "_reserved",
        "_rooms",
        "base",
        "rules",
        "state",
    )

    def __init__(self, state: ClusterState) -> None:
        self.state = state
        self.rules = rules_in_force(state)
        self.base: MemberCounts | None = member_counts(state) if self.in_force else None
        self._added: dict[str, int] = {}
        self._added_on: dict[str, dict[str, int]] = {}
        self._peaks: dict[str, int] = {}  # owner -> its members on its fullest node
        self._caps: dict[str, tuple[MemberCap, MemberCap]] = {}  # by queue
        self._reserved: dict[Resources, Resources] = {}
        # (owner, per-node cap, gang size) -> how many of the gang each node may take
        self._rooms: dict[tuple[str, int, int], NodeRoom] = {}

    @property
    def in_force(self) -> bool:
        return self.rules is not NO_RULES

    def reserved(self, request: Resources) -> Resources:
        """What a node reserves per member of ``request`` (the same value for equal
        requests, so that what the pass keeps per gang shape is found again)."""
        found = self._reserved.get(request)
        if found is None:
            found = self._reserved[request] = self.rules.reserved(request)
        return found

    def caps(self, job: Job) -> tuple[MemberCap, MemberCap]:
        """The caps on running members in the cluster and per node for ``job``'s gang."""
        queue = job.spec.queue
        found = self._caps.get(queue)
        if found is None:
            found = self._caps[queue] = self.rules.caps(self.state.queues.get(queue))
        return found

    def running(self, owner: str) -> int:
        assert self.base is not None
        return self.base.running(owner) + self._added.get(owner, 0)

    def over_running_cap(self, job: Job) -> Reason | None:
        """Why ``job``'s gang may not start now under the cap on its owner's running
        members, or None when it may."""
        if self.base is None:
            return None
        cap = self.caps(job)[0]
        running, members = self.running(job.owner), job.spec.replicas
        if running + members <= cap.allowed:
            return None
        return running_cap_reason(cap, job.owner, running, members)

    def room(self, job: Job) -> NodeRoom:
        """How many members of ``job``'s gang each node may take under its owner's
        per-node cap (``NO_CAP``: as many as fit)."""
        if self.base is None:
            return NO_CAP
        owner, n = job.owner, job.spec.replicas
        cap = self.caps(job)[1].allowed
        if n <= cap and self._peak(owner) + n <= cap:
            return NO_CAP
        key = (owner, cap, n)
        found = self._rooms.get(key)
        if found is None:
            room = {
                node_id: max(cap - count, 0)
                for node_id, count in self._on_nodes(owner).items()
                if cap - count < n
            }
            found = self._rooms[key] = NodeRoom(min(cap, n), room)
        return found

    def over_node_cap(self, job: Job, room: NodeRoom) -> Reason:
        """Why ``job``'s gang waits when it would fit but for its owner's per-node cap
        (``room``: what that leaves it), with how many nodes the owner fills to the cap."""
        full = sum(1 for left in room.room.values() if left == 0)
        return node_cap_reason(self.caps(job)[1], job.owner, full, job.spec.replicas)

    def placed(self, owner: str, members: tuple[MemberPlacement, ...]) -> None:
        """Count a gang the pass placed."""
        if self.base is None:
            return
        self._added[owner] = self._added.get(owner, 0) + len(members)
        mine = self._added_on.setdefault(owner, {})
        peak = self._peak(owner)
        for m in members:
            mine[m.node_id] = mine.get(m.node_id, 0) + 1
            peak = max(peak, self.base.on(owner, m.node_id) + mine[m.node_id])
        self._peaks[owner] = peak
        for key in [k for k in self._rooms if k[0] == owner]:
            del self._rooms[key]

    def _on_nodes(self, owner: str) -> dict[str, int]:
        assert self.base is not None
        counts = dict(self.base.on_node.get(owner, {}))
        for node_id, more in self._added_on.get(owner, {}).items():
            counts[node_id] = counts.get(node_id, 0) + more
        return counts

    def _peak(self, owner: str) -> int:
        peak = self._peaks.get(owner)
        if peak is None:
            peak = self._peaks[owner] = max(self._on_nodes(owner).values(), default=0)
        return peak
