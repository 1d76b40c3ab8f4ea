"""Structural checks of what reaches the state machine.

The user-facing edge (job spec parsing, gRPC request conversion) gives friendlier
messages first; these checks make sure nothing malformed is ever applied, whatever
sent the command. Each returns a list of problems, empty when all is well.
"""

from __future__ import annotations

import re

from synapse_ha.core.model import JobSpec, NodeInfo

NAME_RE = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
MAX_REPLICAS = 10_000
MAX_PRIORITY = 1_000_000
MAX_GPUS_PER_NODE = 64


def check_job_spec(spec: JobSpec, levels_with_host: tuple[str, ...]) -> list[str]:
    problems: list[str] = []
    if not NAME_RE.match(spec.name):
        problems.append(
            "name: must be 1-63 characters of [a-z0-9-], starting and ending alphanumeric"
        )
    if not 1 <= spec.replicas <= MAX_REPLICAS:
        problems.append(f"replicas: must be between 1 and {MAX_REPLICAS}")
    if spec.resources.is_negative():
        problems.append("resources: must not be negative")
    if spec.resources.gpu > MAX_GPUS_PER_NODE:
        problems.append(f"resources.gpu: at most {MAX_GPUS_PER_NODE} per member")
    if not spec.command or any(not part for part in spec.command[:1]):
        problems.append("command: must not be empty")
    if spec.shell and len(spec.command) != 1:
        problems.append("command: a shell command is a single string")
    if not -MAX_PRIORITY <= spec.priority <= MAX_PRIORITY:
        problems.append(f"priority: must be between -{MAX_PRIORITY} and {MAX_PRIORITY}")
    for field_name, level in (
        ("topology.required", spec.topology_required),
        ("topology.preferred", spec.topology_preferred),
    ):
        if level and level not in levels_with_host:
            problems.append(f"{field_name}: {level!r} is not one of {', '.join(levels_with_host)}")
    if spec.time_limit_ms < 0:
        problems.append("time_limit: must not be negative")
    retries = spec.retries
    if retries.max_retries < 0 or retries.backoff_ms < 0 or retries.max_backoff_ms < 0:
        problems.append("retries: values must not be negative")
    if len({k for k, _ in spec.env}) != len(spec.env):
        problems.append("env: duplicate variable names")
    return problems


def check_node_info(info: NodeInfo) -> list[str]:
    problems: list[str] = []
    if not info.node_id or len(info.node_id) > 253:
        problems.append("node_id: must be 1-253 characters")
    if not info.address:
        problems.append("address: must not be empty")
    if info.capacity.is_negative():
        problems.append("capacity: must not be negative")
    if info.capacity.gpu > MAX_GPUS_PER_NODE:
        problems.append(f"capacity.gpu: at most {MAX_GPUS_PER_NODE}")
    if info.gpu_islands:
        indices = sorted(i for island in info.gpu_islands for i in island)
        if indices != list(range(info.capacity.gpu)):
            problems.append(
                f"gpu_islands: must cover GPU indices 0..{info.capacity.gpu - 1} exactly once"
            )
    if len({level for level, _ in info.topology}) != len(info.topology):
        problems.append("topology: a level is labelled twice")
    return problems
