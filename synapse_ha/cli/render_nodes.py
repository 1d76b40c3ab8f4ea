"""synctl's node documents (``synctl nodes``) and their table; the topology of a node
as a document, outermost level first (see :mod:`synapse_ha.cli.render` for the fields)."""

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
)
from synapse_ha.core.model import DEFAULT_TOPOLOGY_LEVELS
from synapse_ha.rpc import states
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb


def ordered_levels(labels: Iterable[str]) -> list[str]:
    """Topology levels from the outermost down: the default levels in their order, then
    any others alphabetically."""
    present = set(labels)
    known = [level for level in DEFAULT_TOPOLOGY_LEVELS if level in present]
    return known + sorted(present - set(known))


def topology_document(labels: Iterable[pb.TopologyLabel]) -> dict[str, str]:
    by_level = {label.level: label.value for label in labels}
    return {level: by_level[level] for level in ordered_levels(by_level)}


def topology_path(topology: Mapping[str, str]) -> str:
    return "/".join(topology.values()) or "-"


def node_document(node: pb.Node) -> Document:
    topology = topology_document(node.topology)
    return {
        "id": node.node_id,
        "address": node.address,
        "status": states.shown_node_status(node),
        "status_reason": node.status_reason,
        "topology": topology,
        "topology_path": topology_path(topology),
        "capacity": resources_document(node.capacity),
        "allocated": resources_document(node.allocated),
        "free_gpus": node.capacity.gpu - len(node.allocated_gpus),
        "allocated_gpus": list(node.allocated_gpus),
        "gpu_model": node.gpu_model,
        "registered_at_ms": node.registered_at_ms,
        "last_heartbeat_age_ms": (
            node.last_heartbeat_age_ms if node.last_heartbeat_age_ms >= 0 else None
        ),
        "members_run_as": node.members_run_as,
    }


def nodes_table(docs: Sequence[Mapping[str, Any]]) -> str:
    rows = [
        [
            d["id"],
            d["status"],
            d["topology_path"],
            f"{d['free_gpus']}/{d['capacity']['gpu']}",
            f"{cpu_text(d['allocated']['cpu_milli'])}/{cpu_text(d['capacity']['cpu_milli'])}",
            f"{memory_text(d['allocated']['memory_mib'])}/"
            f"{memory_text(d['capacity']['memory_mib'])}",
            duration_text(d["last_heartbeat_age_ms"]) + " ago"
            if d["last_heartbeat_age_ms"] is not None
            else None,
            d["address"],
            d["members_run_as"] or None,
        ]
        for d in docs
    ]
    headers = ["NODE", "STATUS", "TOPOLOGY", "FREE GPU", "CPU USED", "MEMORY USED"]
    return table(rows, [*headers, "HEARTBEAT", "ADDRESS", "RUNS AS"])
