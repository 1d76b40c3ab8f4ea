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
from typing import Any, TypeVar

from synapse_ha.core import commands as cmd
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb

_T = TypeVar("_T")

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


def constructor(cls: Callable[..., _T], **tables: tuple[str, ...]) -> Callable[..., _T]:
    """``new(*sources, **rest)``: ``cls(**rest)`` with every field of each table read from
    the positional argument named after it, e.g. ``constructor(pb.JobSpec,
    spec=JOB_SPEC)(spec, env=...)``. Compiled once, as :mod:`dataclasses` compiles an
    ``__init__``, so a conversion through a table costs what one written out does: the
    heartbeat answer's ``desired_to_proto`` is one."""
    for names in tables.values():
        assert all(name.isidentifier() for name in names), names
    reads = ", ".join(f"{n}={source}.{n}" for source, names in tables.items() for n in names)
    code = f"def new({', '.join(tables)}, **rest):\n    return cls({reads}, **rest)\n"
    namespace: dict[str, Any] = {"cls": cls}
    exec(code, namespace)
    new: Callable[..., _T] = namespace["new"]
    return new
