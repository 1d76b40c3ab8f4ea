"""The simulated cluster's shape and free room as the simulation loop measures it: which
rack and block each node is in, free GPUs per node kept in step with binds and
releases, and whether some rack could hold a whole gang."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence

from synapse_ha.core.model import ClusterState, Job, NodeInfo


class RackLayout:
    """The rack and block of every node (``-`` when its topology names none), the nodes
    of each rack in registration order, and the GPUs of the largest rack."""

    def __init__(self, nodes: Sequence[NodeInfo]) -> None:
        self.rack_of = {n.node_id: dict(n.topology).get("rack", "-") for n in nodes}
        self.block_of = {n.node_id: dict(n.topology).get("block", "-") for n in nodes}
        rack_gpus: dict[str, int] = {}
        for n in nodes:
            rack = self.rack_of[n.node_id]
            rack_gpus[rack] = rack_gpus.get(rack, 0) + n.capacity.gpu
        self.largest_rack = max(rack_gpus.values(), default=0)
        self.rack_nodes: dict[str, list[str]] = {}
        for n in nodes:
            self.rack_nodes.setdefault(self.rack_of[n.node_id], []).append(n.node_id)

    def some_rack_has_room(self, state: ClusterState, job_id: str) -> bool:
        """Whether one rack's free capacity could hold every member of the pending job
        now."""
        spec = state.jobs[job_id].spec
        req, n = spec.resources, spec.replicas
        for node_ids in self.rack_nodes.values():
            room = 0
            for node_id in node_ids:
                node = state.nodes[node_id]
                if not node.schedulable():
                    continue
                free = node.free
                fit = [
                    have // need
                    for have, need in (
                        (free.gpu, req.gpu),
                        (free.cpu_milli, req.cpu_milli),
                        (free.memory_mib, req.memory_mib),
                    )
                    if need
                ]
                room += min(fit, default=n)
                if room >= n:
                    return True
        return False


class FreeGpus:
    """Free GPUs per schedulable node, kept in step with binds and releases."""

    def __init__(self, state: ClusterState) -> None:
        self.by_node = {nid: n.free.gpu for nid, n in state.nodes.items() if n.schedulable()}
        self.count: Counter[int] = Counter(self.by_node.values())  # free GPUs -> nodes

    def update(self, state: ClusterState, job: Job) -> None:
        """Re-read the free GPUs of the nodes ``job``'s attempt was bound to."""
        attempt = job.attempt
        assert attempt is not None
        for node_id in {m.node_id for m in attempt.members}:
            old = self.by_node.get(node_id)
            if old is None:
                continue
            new = state.nodes[node_id].free.gpu
            self.count[old] -= 1
            self.count[new] += 1
            self.by_node[node_id] = new

    def unusable(self, waiting_gpus: Iterable[int]) -> int:
        """Free GPUs on nodes where no waiting gang could place even one member."""
        smallest = min((g for g in waiting_gpus if g > 0), default=0)
        return sum(free * nodes for free, nodes in self.count.items() if 0 < free < smallest)
