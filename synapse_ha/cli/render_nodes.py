"""synctl's node documents (``synctl nodes``) and their table; the topology of a node
as a document, outermost level first; a node's unhealthy GPUs, its failing checks and
the owners it may not run members of (see :mod:`synapse_ha.cli.render` for the fields)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from synapse_ha.cli.render import (
    Document,
    cpu_text,
    duration_text,
    memory_text,
    resources_document,
    table,
    time_text,
)
from synapse_ha.cli.terminal import terminal_safe
from synapse_ha.client.nodes import NodeView, Repaired
from synapse_ha.core.cluster_config import DEFAULT_TOPOLOGY_LEVELS
from synapse_ha.core.health.fitness import GpuFault, NodeCondition, Unfit


def ordered_levels(labels: Iterable[str]) -> list[str]:
    """Topology levels from the outermost down: the default levels in their order, then
    any others alphabetically."""
    present = set(labels)
    known = [level for level in DEFAULT_TOPOLOGY_LEVELS if level in present]
    return known + sorted(present - set(known))


def topology_document(labels: Iterable[tuple[str, str]]) -> dict[str, str]:
    """``{level: value}`` from (level, value) pairs, the outermost level first."""
    by_level = dict(labels)
    return {level: by_level[level] for level in ordered_levels(by_level)}


def topology_path(topology: Mapping[str, str]) -> str:
    return "/".join(topology.values()) or "-"


def gpu_faults_document(faults: Iterable[GpuFault]) -> list[Document]:
    """``[{gpu, code, detail, since_ms}]`` by GPU."""
    return [
        {"gpu": f.gpu, "code": f.code, "detail": f.detail, "since_ms": f.since_ms}
        for f in sorted(faults, key=lambda f: f.gpu)
    ]


def unfit_document(unfit: Iterable[Unfit], now_ms: int) -> list[Document]:
    """``[{owner, detail, until_ms}]`` of the entries still in force at ``now_ms``, by
    owner (an expired entry no longer keeps anything off the node)."""
    return [
        {"owner": u.owner, "detail": u.detail, "until_ms": u.until_ms}
        for u in sorted(unfit, key=lambda u: u.owner)
        if u.until_ms > now_ms
    ]


def conditions_document(conditions: Iterable[NodeCondition]) -> list[Document]:
    """``[{name, message, since_ms}]`` of the checks failing on the node, by name."""
    return [
        {"name": k.name, "message": k.message, "since_ms": k.since_ms}
        for k in sorted(conditions, key=lambda k: k.name)
    ]


def faults_text(faults: Sequence[Mapping[str, Any]]) -> str:
    """``3:xid-79,5:ecc-dbe``; "" when every GPU is healthy."""
    return ",".join(f"{f['gpu']}:{f['code']}" for f in faults)


def node_document(node: NodeView, now_ms: int = 0) -> Document:
    """The node as ``synctl nodes`` shows it; ``now_ms`` (ms since the epoch) decides
    which :attr:`unfit` entries are still in force. ``free_gpus`` counts neither
    allocated nor unhealthy GPUs: only those the scheduler may place on."""
    topology = topology_document(node.topology)
    unusable = set(node.allocated_gpus) | {f.gpu for f in node.gpu_faults}
    return {
        "id": node.node_id,
        "address": node.address,
        "status": node.status,
        "status_reason": node.status_reason,
        "topology": topology,
        "topology_path": topology_path(topology),
        "capacity": resources_document(node.capacity),
        "allocated": resources_document(node.allocated),
        "free_gpus": max(0, node.capacity.gpu - len(unusable)),
        "allocated_gpus": list(node.allocated_gpus),
        "gpu_model": node.gpu_model,
        "features": list(node.features),
        "registered_at_ms": node.registered_at_ms,
        "last_heartbeat_age_ms": node.last_heartbeat_age_ms,
        "members_run_as": node.members_run_as,
        "member_isolation": node.member_isolation,
        "gpu_faults": gpu_faults_document(node.gpu_faults),
        "unfit": unfit_document(node.unfit, now_ms),
        "conditions": conditions_document(node.conditions),
        "spare": node.spare,
        "draining_for": node.draining_for or None,
        "draining_until_ms": node.draining_until_ms or None,
    }


def runs_as_text(document: Mapping[str, Any]) -> str:
    """Whose account members run under, and whether they share the node's processes:
    ``owner``, ``owner (shared PIDs)``, ``agent:svc``; "" when the node said neither."""
    shared = " (shared PIDs)" if document.get("member_isolation") == "shared" else ""
    return f"{document['members_run_as']}{shared}".strip()


def nodes_table(docs: Sequence[Mapping[str, Any]]) -> str:
    rows = [
        [
            d["id"],
            d["status"],
            "spare" if d.get("spare") else None,
            d["topology_path"],
            f"{d['free_gpus']}/{d['capacity']['gpu']}",
            faults_text(d["gpu_faults"]) or None,
            ",".join(k["name"] for k in d["conditions"]) or None,
            f"{cpu_text(d['allocated']['cpu_milli'])}/{cpu_text(d['capacity']['cpu_milli'])}",
            f"{memory_text(d['allocated']['memory_mib'])}/"
            f"{memory_text(d['capacity']['memory_mib'])}",
            duration_text(d["last_heartbeat_age_ms"]) + " ago"
            if d["last_heartbeat_age_ms"] is not None
            else None,
            d["address"],
            runs_as_text(d) or None,
            ",".join(u["owner"] for u in d["unfit"]) or None,
            d.get("draining_for"),
        ]
        for d in docs
    ]
    headers = ["NODE", "STATUS", "SPARE", "TOPOLOGY", "FREE GPU", "UNHEALTHY", "FAILING"]
    more = ["CPU USED", "MEMORY USED", "HEARTBEAT", "ADDRESS", "RUNS AS", "UNFIT FOR"]
    more.append("DRAINING FOR")
    return table(rows, [*headers, *more])


def repair_document(node_id: str, answer: Repaired) -> Document:
    """``synctl nodes repair``: ``{id, message, gpu_faults}`` (the faults left)."""
    return {
        "id": node_id,
        "message": answer.message,
        "gpu_faults": gpu_faults_document(answer.gpu_faults),
    }


def repair_text(document: Mapping[str, Any]) -> str:
    """The cluster's answer, then each fault left (or that none is)."""
    left = document["gpu_faults"]
    lines = [document["message"]]
    if not left:
        lines.append(f"node {document['id']}: every GPU healthy")
    for f in left:
        detail = f" ({f['detail']})" if f["detail"] else ""
        lines.append(
            f"still unhealthy: GPU {f['gpu']} {f['code']}{detail} since {time_text(f['since_ms'])}"
        )
    return "\n".join(terminal_safe(line) for line in lines)
