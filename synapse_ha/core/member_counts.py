"""How many members each owner runs, in the cluster and on each node: an index of the
state that apply keeps (like :mod:`synapse_ha.core.node_index`), so the member caps of
:mod:`synapse_ha.core.spec.member_limits` cost a look-up per decision, never a scan of the jobs.

A job counts while it holds resources (scheduled or running): every member of its
current attempt once, on that member's node, whether or not the member has exited yet
(its attempt still holds its share). Which jobs hold resources is the state's rule
(:meth:`ClusterState.job_state_changed <synapse_ha.core.model.ClusterState.job_state_changed>`
calls :meth:`MemberCounts.keep`); this module only counts. Derived, never replicated or
encoded: a plain class, not a state dataclass.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol


class _Member(Protocol):
    @property
    def node_id(self) -> str: ...


class _Attempt(Protocol):
    @property
    def members(self) -> Sequence[_Member]: ...


class MemberCounts:
    """``total``: owner -> members of its live attempts; ``on_node``: owner -> node id ->
    its members there; ``counted``: job id -> (owner, each member's node) as counted, or
    None for a snapshot's copy, which cannot be kept up to date (:meth:`keep` says so).
    Owners and nodes with no member are left out."""

    __slots__ = ("counted", "on_node", "total")

    def __init__(self) -> None:
        self.total: dict[str, int] = {}
        self.on_node: dict[str, dict[str, int]] = {}
        self.counted: dict[str, tuple[str, tuple[str, ...]]] | None = {}

    def copy(self) -> MemberCounts:
        """A copy that shares nothing mutable with this index."""
        copied = self.snapshot()
        copied.counted = dict(self.counted) if self.counted is not None else None
        return copied

    def snapshot(self) -> MemberCounts:
        """A copy for a snapshot: the counts (each owner's own), not what was counted per
        job, which only keeping the index needs (a cost of the live jobs per snapshot)."""
        copied = MemberCounts()
        copied.total = dict(self.total)
        copied.on_node = {owner: dict(nodes) for owner, nodes in self.on_node.items()}
        copied.counted = None
        return copied

    @classmethod
    def build(cls, jobs: Iterable[tuple[str, str, _Attempt]]) -> MemberCounts:
        """The index of ``(job id, owner, live attempt)`` triples."""
        counts = cls()
        for job_id, owner, attempt in jobs:
            counts.keep(job_id, owner, attempt)
        return counts

    def keep(self, job_id: str, owner: str, live: _Attempt | None) -> bool:
        """Count ``job_id`` as ``owner``'s with the members of ``live``, its live attempt
        (None: it holds nothing, or it was removed); False when this index cannot be kept
        (a snapshot's copy), and must be built anew."""
        counted = self.counted
        if counted is None:
            return False
        nodes = tuple(m.node_id for m in live.members) if live is not None else ()
        old = counted.get(job_id)
        if old is not None:
            if old[0] == owner and old[1] == nodes:
                return True
            del counted[job_id]
            self._count(*old, -1)
        if nodes:
            counted[job_id] = (owner, nodes)
            self._count(owner, nodes, +1)
        return True

    def _count(self, owner: str, nodes: tuple[str, ...], sign: int) -> None:
        left = self.total.get(owner, 0) + sign * len(nodes)
        mine = self.on_node.setdefault(owner, {})
        for node_id in nodes:
            here = mine.get(node_id, 0) + sign
            if here:
                mine[node_id] = here
            else:
                del mine[node_id]
        if left:
            self.total[owner] = left
        else:
            del self.total[owner], self.on_node[owner]

    def running(self, owner: str) -> int:
        """The members ``owner``'s live attempts have, in the cluster."""
        return self.total.get(owner, 0)

    def on(self, owner: str, node_id: str) -> int:
        """The members ``owner``'s live attempts have on ``node_id``."""
        mine = self.on_node.get(owner)
        return mine.get(node_id, 0) if mine is not None else 0
