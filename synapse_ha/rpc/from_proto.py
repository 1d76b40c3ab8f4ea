"""Protobuf messages to core values: every conversion from the wire. No I/O, no policy.

Conversion states no rule of its own: a spec or node description built here is checked
by :mod:`synapse_ha.core.spec.validation`, the one rule set (the server before proposing, the
state machine again when applying). The fields a message and a core value name alike are
declared once, for both directions, in :mod:`synapse_ha.rpc.fields`; the other direction
is :mod:`synapse_ha.rpc.to_proto`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

from synapse_ha.core import commands as cmd
from synapse_ha.core.cluster_config import DEFAULT_QUEUE, Cohort, Limits, Queue
from synapse_ha.core.desired import DesiredMember, LaunchSpec, Preempting
from synapse_ha.core.elastic import ElasticPolicy
from synapse_ha.core.health.fitness import GpuFault, NodeCheck
from synapse_ha.core.health.prestart import DEFAULT_PRESTART_TIMEOUT_MS, Prestart
from synapse_ha.core.health.progress import SOURCE_FILE, Progress
from synapse_ha.core.health.slowness import PaceReport
from synapse_ha.core.model import JobSpec, NodeInfo, Resources, RetryPolicy
from synapse_ha.core.node_selector import NodeSelector
from synapse_ha.core.replacement import ReplacePolicy
from synapse_ha.core.spec.document import SpecError
from synapse_ha.core.workflows.dependencies import Dependencies
from synapse_ha.rpc import fields
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb

_new_spec = fields.constructor(JobSpec, msg=fields.JOB_SPEC)
_new_desired = fields.constructor(DesiredMember, d=fields.MEMBER)
_new_launch = fields.constructor(LaunchSpec, d=fields.LAUNCH)


# ----------------------------------------------------------------------- job spec


def spec_from_proto(msg: pb.JobSpec) -> JobSpec:
    """Build a core spec (not yet checked). A message with neither ``shell_command`` nor
    ``argv`` gets an empty command, which the rule set refuses."""
    which = msg.WhichOneof("command")
    command: tuple[str, ...] = ()
    shell = True
    if which == "shell_command":
        command = (msg.shell_command,)
    elif which == "argv":
        command = tuple(msg.argv.args)
        shell = False
    names = [e.name for e in msg.env]
    retries = msg.retries if msg.HasField("retries") else None
    defaults = RetryPolicy()
    spec = _new_spec(
        msg,
        resources=Resources(
            cpu_milli=msg.resources.cpu_milli,
            memory_mib=msg.resources.memory_mib,
            gpu=msg.resources.gpu,
        ),
        command=command,
        shell=shell,
        env=tuple(zip(names, (e.value for e in msg.env), strict=True)),
        queue=msg.queue or DEFAULT_QUEUE,
        progress=Progress(msg.progress.timeout_ms, msg.progress.source or SOURCE_FILE)
        if msg.HasField("progress")
        else None,
        retries=RetryPolicy(
            max_retries=retries.max,
            backoff_ms=retries.backoff_ms or defaults.backoff_ms,
            max_backoff_ms=retries.max_backoff_ms or defaults.max_backoff_ms,
        )
        if retries is not None
        else defaults,
        prestart=prestart_from_proto(msg.prestart) if msg.HasField("prestart") else None,
        dependencies=dependencies_from_proto(msg.dependencies)
        if msg.HasField("dependencies")
        else None,
        nodes=(fields.from_message(NodeSelector, msg.nodes) or None)
        if msg.HasField("nodes")
        else None,
        replace=fields.from_message(ReplacePolicy, msg.replace)
        if msg.HasField("replace")
        else None,
        elastic=fields.from_message(ElasticPolicy, msg.elastic)
        if msg.HasField("elastic")
        else None,
    )
    return spec


def dependencies_from_proto(msg: pb.Dependencies) -> Dependencies | None:
    """The dependencies a message names (None when it names no job)."""
    deps = Dependencies(
        after_ok=tuple(msg.after_ok),
        after_any=tuple(msg.after_any),
        after_not_ok=tuple(msg.after_not_ok),
        after=tuple(msg.after),
        singleton=msg.singleton,
    )
    return deps if deps.pairs() or deps.singleton else None


def prestart_from_proto(msg: pb.Prestart) -> Prestart:
    """A pre-start check (not yet checked); a timeout left 0 is the default."""
    return Prestart(tuple(msg.command), msg.shell, msg.timeout_ms or DEFAULT_PRESTART_TIMEOUT_MS)


def checks_from_proto(msgs: Iterable[pb.NodeCheck]) -> tuple[NodeCheck, ...]:
    """A worker's node checks (not yet checked: :func:`node_checks.check_node_checks`)."""
    return tuple(NodeCheck(m.name, m.failing, m.message) for m in msgs)


def paces_from_proto(msgs: Iterable[pb.MemberPace]) -> tuple[PaceReport, ...]:
    """A worker's members' paces (not yet checked: :meth:`PaceReport.error`)."""
    return tuple(
        PaceReport(m.job_id, m.fencing_token, m.rank, m.step_us, m.steps, m.peers) for m in msgs
    )


def gpu_faults_from_proto(msgs: Iterable[pb.GpuFault]) -> tuple[GpuFault, ...]:
    """A worker's unhealthy GPUs (not yet checked: :func:`validation.check_gpu_faults`);
    the time is the leader's to set."""
    return tuple(GpuFault(m.gpu, m.code, m.detail) for m in msgs)


def node_info_from_proto(msg: pb.RegisterNodeRequest) -> NodeInfo:
    """Build a node description (not yet checked). No NVLink islands stay no islands: the
    state machine decides what that means (each GPU on its own)."""
    return NodeInfo(
        node_id=msg.node_id,
        address=msg.address,
        capacity=Resources(msg.capacity.cpu_milli, msg.capacity.memory_mib, msg.capacity.gpu),
        gpu_islands=tuple(tuple(island.gpus) for island in msg.gpu_islands),
        gpu_model=msg.gpu_model,
        topology=tuple(sorted((label.level, label.value) for label in msg.topology)),
        features=tuple(sorted(set(msg.features))),
        members_run_as=msg.members_run_as,
        boot_id=msg.boot_id,
        member_isolation=msg.member_isolation,
    )


_EXIT_CAUSES = dict(fields.EXIT_CAUSES)
_EVENT_KINDS = dict(fields.REPORT_KINDS)


def member_events_from_proto(reports: list[pb.MemberReport]) -> tuple[cmd.MemberEvent, ...]:
    events = []
    for i, report in enumerate(reports):
        kind = _EVENT_KINDS.get(report.kind)
        if kind is None:
            raise SpecError(f"reports[{i}].kind", "must be STARTED, EXITED or CHECKPOINT")
        if not report.job_id:
            raise SpecError(f"reports[{i}].job_id", "is required")
        if report.rank < 0 or report.fencing_token <= 0:
            raise SpecError(f"reports[{i}]", "rank must be >= 0 and fencing_token > 0")
        if report.generation < 0:
            raise SpecError(f"reports[{i}].generation", "must be >= 0")
        step = report.checkpoint_step if report.HasField("checkpoint_step") else None
        if kind is cmd.MemberEventKind.CHECKPOINT and (
            report.checkpoint_seq <= 0 or (step is not None and step < 0)
        ):
            raise SpecError(
                f"reports[{i}]", "a checkpoint needs checkpoint_seq > 0 and checkpoint_step >= 0"
            )
        events.append(
            cmd.MemberEvent(
                job_id=report.job_id,
                fencing_token=report.fencing_token,
                rank=report.rank,
                kind=kind,
                exit_code=report.exit_code,
                detail=report.detail[:1024],
                cause=_EXIT_CAUSES.get(report.cause, cmd.ExitCause.PROGRAM),
                generation=report.generation,
                **_mark_fields(kind, step, report.checkpoint_seq),
            )
        )
    return tuple(events)


def _mark_fields(kind: cmd.MemberEventKind, step: int | None, seq: int) -> dict[str, Any]:
    """A checkpoint's step and number (only a CHECKPOINT event carries them)."""
    if kind is not cmd.MemberEventKind.CHECKPOINT:
        return {}
    return {"step": step, "mark_seq": seq}


def queue_from_proto(msg: pb.Queue) -> Queue:
    """Build a queue (not yet checked: :func:`synapse_ha.core.spec.validation.check_queue`).
    An unset limit stays None ("no limit")."""
    return fields.from_message(Queue, msg)


def limits_with(limits: Limits, values: Iterable[pb.LimitValue]) -> Limits:
    """``limits`` with the named ones replaced; raises :class:`SpecError` naming an
    unknown limit (the values themselves are checked by
    :func:`synapse_ha.core.identity.admission.check_limits`)."""
    known = {f.name for f in dataclasses.fields(Limits)}
    changes: dict[str, int] = {}
    for i, v in enumerate(values):
        if v.name not in known:
            raise SpecError(
                f"values[{i}].name", f"no limit {v.name!r} ({', '.join(sorted(known))})"
            )
        changes[v.name] = int(v.value)
    return dataclasses.replace(limits, **changes)


def cohort_from_proto(msg: pb.Cohort) -> Cohort:
    """Build a cohort (not yet checked: :func:`synapse_ha.core.queues.cohort_tree.check_cohort`).
    An unset limit stays None ("no limit"; for ``gpu``: nothing of its own)."""
    return fields.from_message(Cohort, msg)


def desired_from_proto(d: pb.DesiredMember) -> DesiredMember:
    """The desired member a heartbeat carries (the inverse of
    :func:`synapse_ha.rpc.to_proto.desired_to_proto`); its preemption travels apart
    (:func:`preemption_from_proto`)."""
    return _new_desired(
        d,
        gpus=tuple(d.gpus),
        master_addr=d.master_addr,
        member_hosts=tuple(d.member_hosts),
        spec=_new_launch(
            d,
            command=tuple(d.command),
            env=tuple((e.name, e.value) for e in d.env),
            resources=Resources(d.cpu_milli, d.memory_mib, len(d.gpus)),
            prestart=Prestart(tuple(d.prestart_command), d.prestart_shell, d.prestart_timeout_ms)
            if d.prestart_command
            else None,
        ),
        resume_step=d.resume_step if d.HasField("resume_step") else None,
    )


def preemption_from_proto(d: pb.DesiredMember) -> Preempting | None:
    """The preemption of a desired member (None: not preempted)."""
    if not d.preemption:
        return None
    return Preempting(d.preemption, d.preempted_by, d.preempt_grace_ms)


# A desired member, and its preemption (None: not preempted).
Wanted = tuple[DesiredMember, Preempting | None]


def desired_list_from_proto(desired: Iterable[pb.DesiredMember]) -> list[Wanted]:
    """A heartbeat answer's (or push's) desired list, as a worker reconciles on it."""
    return [(desired_from_proto(d), preemption_from_proto(d)) for d in desired]
