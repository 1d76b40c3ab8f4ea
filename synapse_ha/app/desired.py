"""What each node should be running, for every node at once.

:func:`synapse_ha.core.views.desired_members` answers for one node by scanning every
job; heartbeats from thousands of nodes would repeat that scan for each of them. This
computes the same answer for all nodes in one pass over the live jobs, so the heartbeat
path can cache it per state version. Tests check both agree.
"""

from __future__ import annotations

from synapse_ha.core.model import ClusterState
from synapse_ha.core.views import DesiredMember


def desired_by_node(state: ClusterState) -> dict[str, list[DesiredMember]]:
    """``{node_id: desired_members(state, node_id)}`` for every node with members."""
    wanted: dict[str, list[DesiredMember]] = {}
    for job_id in sorted(state.jobs):
        job = state.jobs[job_id]
        attempt = job.live_attempt()
        if attempt is None:
            continue
        hosts = tuple(
            state.nodes[m.node_id].info.address if m.node_id in state.nodes else m.node_id
            for m in attempt.members
        )
        per_node: dict[str, int] = {}
        for member in attempt.members:
            per_node[member.node_id] = per_node.get(member.node_id, 0) + 1
        local_ranks: dict[str, int] = {}
        for member in attempt.members:
            local_rank = local_ranks.get(member.node_id, 0)
            local_ranks[member.node_id] = local_rank + 1
            wanted.setdefault(member.node_id, []).append(
                DesiredMember(
                    job_id=job_id,
                    attempt=attempt.number,
                    fencing_token=attempt.fencing_token,
                    rank=member.rank,
                    world_size=len(attempt.members),
                    local_rank=local_rank,
                    local_world_size=per_node[member.node_id],
                    gpus=member.gpus,
                    master_addr=hosts[0],
                    master_port=attempt.master_port,
                    member_hosts=hosts,
                    spec=job.spec,
                )
            )
    return wanted
