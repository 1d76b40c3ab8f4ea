"""The fields a message and a core value name alike, declared once for both directions of
conversion (:mod:`synapse_ha.rpc.to_proto`, :mod:`synapse_ha.rpc.from_proto`).

Each field table lists the scalar fields copied as they are between a message and a core
value; a field that needs more (a default for 0, a nested message, a oneof) is converted
by hand in both modules. A job-spec field that is one scalar is added to :data:`JOB_SPEC`,
and to :data:`LAUNCH` when the worker launches its members with it. The enum tables pair
a message's values with the core's.
"""

from __future__ import annotations

from collections.abc import Callable
from operator import attrgetter
from typing import Any

from synapse_ha.core import commands as cmd
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb

# pb.JobSpec and core.model.JobSpec.
JOB_SPEC: tuple[str, ...] = (
    "name",
    "replicas",
    "workdir",
    "priority",
    "topology_required",
    "topology_preferred",
    "time_limit_ms",
    "image",
    "priority_class",
    "begin_at_ms",
    "begin_delay_ms",
    "deadline_at_ms",
    "deadline_delay_ms",
    "array",
    "wait_for_nodes",
    "stop_grace_ms",
)
# pb.DesiredMember and core.desired.DesiredMember (the member's place in its gang).
MEMBER: tuple[str, ...] = (
    "job_id",
    "attempt",
    "fencing_token",
    "rank",
    "world_size",
    "local_rank",
    "local_world_size",
    "master_port",
    "owner",
)
# pb.DesiredMember and core.desired.LaunchSpec (what the member is launched with).
LAUNCH: tuple[str, ...] = (
    "shell",
    "workdir",
    "time_limit_ms",
    "image",
    "progress_timeout_ms",
    "progress_source",
    "stop_grace_ms",
)

# pb.MemberReport's kinds and causes and core.commands' (a worker's reports of its members).
REPORT_KINDS: tuple[tuple[int, cmd.MemberEventKind], ...] = (
    (pb.MemberReport.STARTED, cmd.MemberEventKind.STARTED),
    (pb.MemberReport.EXITED, cmd.MemberEventKind.EXITED),
    (pb.MemberReport.CHECKPOINT, cmd.MemberEventKind.CHECKPOINT),
)
EXIT_CAUSES: tuple[tuple[int, cmd.ExitCause], ...] = (
    (pb.MemberReport.PROGRAM, cmd.ExitCause.PROGRAM),
    (pb.MemberReport.FENCED, cmd.ExitCause.FENCED),
    (pb.MemberReport.LOST, cmd.ExitCause.LOST),
    (pb.MemberReport.NODE_CANNOT_RUN, cmd.ExitCause.NODE_CANNOT_RUN),
    (pb.MemberReport.HUNG, cmd.ExitCause.HUNG),
)


def copier(names: tuple[str, ...]) -> Callable[[Any], dict[str, Any]]:
    """A function giving ``{name: value}`` of ``names`` read from any object (one C-level
    attribute fetch for all of them)."""
    get = attrgetter(*names)
    return lambda value: dict(zip(names, get(value), strict=True))
