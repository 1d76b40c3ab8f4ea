"""synctl's cluster document (``synctl cluster``: the replicas and the leader) and its
table (see :mod:`synapse_ha.cli.render` for the fields)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from synapse_ha.cli.render import Document, table
from synapse_ha.cli.terminal import terminal_safe
from synapse_ha.client.replicas import ClusterStatus


def cluster_document(status: ClusterStatus) -> Document:
    replicas = [
        {
            "id": r.replica_id,
            "role": r.role,
            "term": r.term,
            "commit_index": r.commit_index,
            "last_applied": r.last_applied,
            "leader": r.leader_id,
            "healthy": r.healthy,
            "grpc_address": r.grpc_address,
            "raft_address": r.raft_address,
            "error": r.error,
            "format_version": r.format_version,
            # Observability
            "metrics_url": r.metrics_url,
            "dashboard_url": r.dashboard_url,
        }
        for r in status.replicas
    ]
    healthy_count = sum(1 for r in replicas if r["healthy"])
    return {
        "healthy": bool(status.leader_id) and healthy_count > len(replicas) // 2,
        "leader": status.leader_id,
        "leader_address": status.leader_address,
        "answered_by": status.answered_by,
        "nodes": status.nodes,
        "jobs": status.jobs,
        "pending_jobs": status.pending_jobs,
        "running_jobs": status.running_jobs,
        "format_floor": status.format_floor,
        "replicas": replicas,
    }


def cluster_table(doc: Mapping[str, Any]) -> str:
    leader = doc["leader"] or "none"
    if doc["leader_address"]:
        leader += f" ({doc['leader_address']})"
    head = [
        f"health:  {'healthy' if doc['healthy'] else 'UNHEALTHY'}",
        f"leader:  {terminal_safe(leader)}",
        f"nodes:   {doc['nodes']}    jobs: {doc['jobs']} "
        f"({doc['pending_jobs']} pending, {doc['running_jobs']} running)",
        *_format_line(doc),
        "",
    ]
    rows = [
        [
            r["id"],
            r["role"],
            r["term"],
            r["commit_index"],
            r["last_applied"],
            "yes" if r["healthy"] else "no",
            r["grpc_address"],
            r["metrics_url"] or "-",
            r["dashboard_url"] or "-",
            r["error"],
        ]
        for r in doc["replicas"]
    ]
    headers = ["REPLICA", "ROLE", "TERM", "COMMIT", "APPLIED", "HEALTHY", "ADDRESS"]
    headers += ["METRICS", "DASHBOARD", "ERROR"]
    return "\n".join(head) + table(rows, headers)


def _format_line(doc: Mapping[str, Any]) -> list[str]:
    """The cluster's format, and the replicas that hold it back when they read older."""
    floor = doc.get("format_floor") or 0
    if not floor:
        return []
    newest = max((r["format_version"] for r in doc["replicas"]), default=floor)
    if newest <= floor:
        return [f"format:  {floor} (every replica reads it)"]
    behind = [r["id"] for r in doc["replicas"] if r["format_version"] < newest]
    waits = (
        f"waits for {terminal_safe(', '.join(behind))}"
        if behind
        else "the leader raises it shortly"
    )
    return [f"format:  {floor}; format {newest} {waits}"]
