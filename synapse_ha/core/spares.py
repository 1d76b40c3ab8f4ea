"""Hot spares: idle nodes kept out of normal placement, for member replacements.

With ``ClusterConfig.spares = N``, each domain at the spare level (:func:`spare_level`:
``ClusterConfig.spare_level``, by default the level named ``rack`` when the cluster has
one, else the whole cluster) keeps up to ``N`` of its *idle* nodes as spares: ready, no
unhealthy GPU, nothing allocated and no member bound or still stopping there
(:func:`idle`). Of a domain's idle nodes, the spares are the first ``N`` by
:func:`spare_key`: the largest first (GPUs, then CPU, then memory: a spare should hold
a member of any gang the domain holds), then by node id.

The set is a function of the state alone, so every replica and every pass agree on it,
and it stays put while nothing changes: normal placement never takes a spare, so a spare
stops being one only when a replacement takes it, its node leaves the ready state or
reports a GPU fault, the setting changes, or a larger node (or one of lower id) of its
domain becomes idle. Then another idle node of the domain, if any, becomes its spare.

The scheduling pass leaves spares out of its capacity table
(:mod:`synapse_ha.core.scheduler.capacity`), apply refuses a bind plan that puts a gang
on one (:mod:`synapse_ha.core.machine.binding`), and member replacement
(:mod:`synapse_ha.core.scheduler.replacement`) tries them first. With ``spares = 0`` (the
default) :func:`spare_nodes` answers after one test, without reading any node.
"""

from __future__ import annotations

from synapse_ha.core.cluster_config import MAX_SPARES, ClusterConfig
from synapse_ha.core.model import ZERO, ClusterState, MemberState, Node, NodeStatus, topology_path
from synapse_ha.core.spec.validation import Violation, invalid
from synapse_ha.core.topology import CLUSTER, domain_at

NONE: frozenset[str] = frozenset()
DEFAULT_SPARE_LEVEL = "rack"  # when the cluster has a level of that name


def spare_level(config: ClusterConfig) -> str:
    """The topology level whose domains each keep ``config.spares`` spares: the one the
    configuration names, else ``rack`` when the cluster has it, else ``cluster``."""
    if config.spare_level:
        return config.spare_level
    return DEFAULT_SPARE_LEVEL if DEFAULT_SPARE_LEVEL in config.topology_levels else CLUSTER


def check_spare_settings(config: ClusterConfig) -> list[Violation]:
    """Every rule the spare settings of ``config`` break: a count from 0 to
    :data:`~synapse_ha.core.cluster_config.MAX_SPARES`, and a level the cluster has (or
    ``cluster``; "" for the default)."""
    out: list[Violation] = []
    if not 0 <= config.spares <= MAX_SPARES:
        out.append(invalid("spares", f"must be between 0 and {MAX_SPARES} (nodes per domain)"))
    levels = config.topology_levels
    if config.spare_level and config.spare_level not in (*levels, CLUSTER):
        out.append(
            invalid(
                "spare_level",
                f"must be one of the topology levels ({', '.join(levels) or 'none'}) or "
                f"{CLUSTER!r}, got {config.spare_level!r}",
            )
        )
    return out


def spare_key(node: Node) -> tuple[int, int, int, str]:
    """The order in which a domain's idle nodes become its spares: the most GPUs, CPU
    and memory first, then the node id (unique, so the order is total)."""
    capacity = node.info.capacity
    return (-capacity.gpu, -capacity.cpu_milli, -capacity.memory_mib, node.node_id)


def idle(state: ClusterState, node: Node) -> bool:
    """Whether ``node`` may be a spare: ready, no unhealthy GPU, nothing allocated, and
    no member of any job bound, running or not yet known stopped there."""
    if node.status is not NodeStatus.READY or node.gpu_faults:
        return False
    if node.allocated != ZERO or node.allocated_gpus:
        return False
    node_id = node.node_id
    for job_id in state.jobs_on_node(node_id):
        job = state.jobs[job_id]
        if job.state.holds_resources:
            return False
        attempt = job.attempt
        if attempt is not None and any(
            m.node_id == node_id and s.state is not MemberState.EXITED
            for m, s in zip(attempt.members, attempt.member_status, strict=True)
        ):
            return False
    return True


def spares_by_domain(state: ClusterState) -> dict[tuple[str, ...], list[str]]:
    """Each domain at the spare level that has spares, with their ids in
    :func:`spare_key` order; domains in path order. Empty when no spares are configured."""
    config = state.config
    count = config.spares
    if not count:
        return {}
    levels = config.levels_with_host()
    level = spare_level(config)
    candidates: dict[tuple[str, ...], list[Node]] = {}
    for node in state.nodes.values():
        if idle(state, node):
            path = topology_path(node.info, config.topology_levels)
            candidates.setdefault(domain_at(path, levels, level), []).append(node)
    return {
        domain: [n.node_id for n in sorted(candidates[domain], key=spare_key)[:count]]
        for domain in sorted(candidates)
    }


def spare_nodes(state: ClusterState) -> frozenset[str]:
    """The ids of the nodes kept as spares now (see the module doc); :data:`NONE`, after
    one test, when the cluster keeps none."""
    if not state.config.spares:
        return NONE
    return frozenset(n for nodes in spares_by_domain(state).values() for n in nodes)
