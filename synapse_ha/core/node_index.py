"""Which jobs have members on each node: an index of the state that apply keeps, so a
heartbeat's desired members and a node's death cost that node's jobs, not every job's.

The index maps each node id to the ids of its jobs (sorted) and each job id to its nodes.
Which nodes a job is under is the state's rule (:meth:`ClusterState.jobs_on_node
<synapse_ha.core.model.ClusterState.jobs_on_node>`); this module only keeps the two
mappings in step. A node's tuple is replaced, never changed in place, so a snapshot's
copy of the first mapping shares them.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable


class NodeIndex:
    """``on_node``: node id -> job ids, sorted; ``nodes_of``: job id -> node ids, or
    None for a snapshot's copy, which cannot be kept up to date (:meth:`keep` says so).
    Derived, never replicated or encoded: a plain class, not a state dataclass."""

    __slots__ = ("nodes_of", "on_node")

    def __init__(
        self, on_node: dict[str, tuple[str, ...]], nodes_of: dict[str, tuple[str, ...]] | None
    ) -> None:
        self.on_node = on_node
        self.nodes_of = nodes_of

    def copy(self) -> NodeIndex:
        """A copy that shares nothing mutable with this index (the tuples are immutable)."""
        nodes_of = self.nodes_of
        return NodeIndex(dict(self.on_node), dict(nodes_of) if nodes_of is not None else None)

    @classmethod
    def build(cls, jobs: Iterable[tuple[str, tuple[str, ...]]]) -> NodeIndex:
        """The index of ``(job id, its nodes)`` pairs given in job id order."""
        nodes_of: dict[str, tuple[str, ...]] = {}
        members: dict[str, list[str]] = {}
        for job_id, nodes in jobs:
            if nodes:
                nodes_of[job_id] = nodes
                for node_id in nodes:
                    members.setdefault(node_id, []).append(job_id)
        return cls({node_id: tuple(ids) for node_id, ids in members.items()}, nodes_of)

    def snapshot(self) -> NodeIndex:
        """A copy for a snapshot: its own first mapping (sharing the tuples), no second."""
        return NodeIndex(dict(self.on_node), None)

    def keep(self, job_id: str, nodes: tuple[str, ...]) -> bool:
        """Put ``job_id`` under ``nodes`` (none: under no node any more); False when
        this index cannot be kept (a snapshot's copy), and must be built anew."""
        nodes_of, on_node = self.nodes_of, self.on_node
        if nodes_of is None:
            return False
        old = nodes_of.get(job_id, ())
        if old == nodes:
            return True
        for node_id in old:
            if node_id not in nodes:
                left = tuple(i for i in on_node[node_id] if i != job_id)
                if left:
                    on_node[node_id] = left
                else:
                    del on_node[node_id]
        for node_id in nodes:
            if node_id not in old:
                ids = on_node.get(node_id, ())
                at = bisect.bisect_left(ids, job_id)
                on_node[node_id] = (*ids[:at], job_id, *ids[at:])
        if nodes:
            nodes_of[job_id] = nodes
        else:
            nodes_of.pop(job_id, None)
        return True
