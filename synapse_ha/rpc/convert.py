"""Conversions between protobuf messages and core values. No I/O, no policy.

Conversion states no rule of its own: a spec or node description built here is checked
by :mod:`synapse_ha.core.validation`, the one rule set (the server before proposing, the
state machine again when applying).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

from synapse_ha.core import commands as cmd
from synapse_ha.core.admission import shown_request_id
from synapse_ha.core.cluster_config import DEFAULT_QUEUE, Limits, PriorityClass, Queue
from synapse_ha.core.dependencies import Dependencies
from synapse_ha.core.desired import DesiredMember
from synapse_ha.core.health import GpuFault, NodeCheck, NodeCondition
from synapse_ha.core.model import (
    ArrayJob,
    Attempt,
    Job,
    JobSpec,
    Node,
    NodeInfo,
    Resources,
    RetryPolicy,
    Token,
)
from synapse_ha.core.prestart import DEFAULT_PRESTART_TIMEOUT_MS, Prestart
from synapse_ha.core.progress import SOURCE_FILE, Progress
from synapse_ha.core.queue_usage import QueueUsage
from synapse_ha.core.reasons import render, withheld
from synapse_ha.core.spec import SpecError
from synapse_ha.core.views import host_of
from synapse_ha.rpc import states
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb

_INT32_MAX = 2**31 - 1


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
    spec = JobSpec(
        name=msg.name,
        replicas=msg.replicas,
        resources=Resources(
            cpu_milli=msg.resources.cpu_milli,
            memory_mib=msg.resources.memory_mib,
            gpu=msg.resources.gpu,
        ),
        command=command,
        shell=shell,
        env=tuple(zip(names, (e.value for e in msg.env), strict=True)),
        workdir=msg.workdir,
        priority=msg.priority,
        topology_required=msg.topology_required,
        topology_preferred=msg.topology_preferred,
        time_limit_ms=msg.time_limit_ms,
        image=msg.image,
        queue=msg.queue or DEFAULT_QUEUE,
        priority_class=msg.priority_class,
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
        begin_at_ms=msg.begin_at_ms,
        begin_delay_ms=msg.begin_delay_ms,
        deadline_at_ms=msg.deadline_at_ms,
        deadline_delay_ms=msg.deadline_delay_ms,
        array=msg.array,
        wait_for_nodes=msg.wait_for_nodes,
    )
    return spec


def dependencies_from_proto(msg: pb.Dependencies) -> Dependencies | None:
    """The dependencies a message names (None when it names no job)."""
    deps = Dependencies(
        after_ok=tuple(msg.after_ok),
        after_any=tuple(msg.after_any),
        after_not_ok=tuple(msg.after_not_ok),
        after=tuple(msg.after),
    )
    return deps if deps.pairs() else None


def dependencies_to_proto(deps: Dependencies) -> pb.Dependencies:
    return pb.Dependencies(
        after_ok=list(deps.after_ok),
        after_any=list(deps.after_any),
        after_not_ok=list(deps.after_not_ok),
        after=list(deps.after),
    )


def prestart_from_proto(msg: pb.Prestart) -> Prestart:
    """A pre-start check (not yet checked); a timeout left 0 is the default."""
    return Prestart(tuple(msg.command), msg.shell, msg.timeout_ms or DEFAULT_PRESTART_TIMEOUT_MS)


def spec_to_proto(spec: JobSpec) -> pb.JobSpec:
    msg = pb.JobSpec(
        name=spec.name,
        replicas=spec.replicas,
        resources=resources_to_proto(spec.resources),
        env=[pb.EnvVar(name=k, value=v) for k, v in spec.env],
        workdir=spec.workdir,
        priority=spec.priority,
        topology_required=spec.topology_required,
        topology_preferred=spec.topology_preferred,
        time_limit_ms=spec.time_limit_ms,
        image=spec.image,
        queue=spec.queue,
        priority_class=spec.priority_class,
        begin_at_ms=spec.begin_at_ms,
        begin_delay_ms=spec.begin_delay_ms,
        deadline_at_ms=spec.deadline_at_ms,
        deadline_delay_ms=spec.deadline_delay_ms,
        array=spec.array,
        wait_for_nodes=spec.wait_for_nodes,
        retries=pb.RetryPolicy(
            max=spec.retries.max_retries,
            backoff_ms=spec.retries.backoff_ms,
            max_backoff_ms=spec.retries.max_backoff_ms,
        ),
    )
    if spec.progress is not None:
        msg.progress.CopyFrom(
            pb.Progress(timeout_ms=spec.progress.timeout_ms, source=spec.progress.source)
        )
    if spec.prestart is not None:
        p = spec.prestart
        msg.prestart.CopyFrom(
            pb.Prestart(command=list(p.command), shell=p.shell, timeout_ms=p.timeout_ms)
        )
    if spec.dependencies is not None:
        msg.dependencies.CopyFrom(dependencies_to_proto(spec.dependencies))
    if spec.shell:
        msg.shell_command = spec.command[0] if spec.command else ""
    else:
        msg.argv.args.extend(spec.command)
    return msg


def resources_to_proto(r: Resources) -> pb.Resources:
    return pb.Resources(cpu_milli=r.cpu_milli, memory_mib=r.memory_mib, gpu=r.gpu)


# --------------------------------------------------------------------------- jobs


def attempt_to_proto(a: Attempt, redacted: bool = False) -> pb.Attempt:
    members = []
    marks = {m.rank: m for m in a.marks}
    for placement, status in zip(a.members, a.member_status, strict=False):
        member = pb.Member(
            rank=placement.rank,
            node_id=placement.node_id,
            gpus=list(placement.gpus),
            **states.member_state_fields(status.state),
            has_exit_code=status.exit_code is not None,
            exit_code=status.exit_code or 0,
        )
        mark = marks.get(placement.rank)
        if mark is not None:
            member.checkpoint.CopyFrom(checkpoint_to_proto(mark.at_ms, mark.step))
        members.append(member)
    msg = pb.Attempt(
        number=a.number,
        fencing_token=a.fencing_token,
        master_port=a.master_port,
        bound_at_ms=a.bound_at_ms,
        started_at_ms=a.started_at_ms,
        ended_at_ms=a.ended_at_ms,
        outcome=render(withheld(a.outcome) if redacted else a.outcome),
        members=members,
        preempted_by=a.preempted_by,
        preemption=str(a.preemption) if a.preemption is not None else "",
        preempt_deadline_ms=a.preempt_deadline_ms,
    )
    gang = a.mark()
    if gang is not None:
        msg.checkpoint.CopyFrom(checkpoint_to_proto(gang.at_ms, gang.step))
    return msg


def job_to_proto(job: Job, redacted: bool = False) -> pb.Job:
    """The job as the API shows it. ``redacted`` (a caller who may not manage the job;
    DESIGN §8) withholds everything the job's owner wrote that may carry a secret: the
    command and its arguments, the environment, the workdir, the image and the request
    id, and the job's text in its reasons (:func:`withheld`); ``redacted`` says so. The
    request id is shown as its owner gave it."""
    spec = spec_to_proto(job.spec)
    request_id = shown_request_id(job.owner, job.request_id)
    if redacted:
        _withhold(spec)
        request_id = ""
    msg = pb.Job(
        job_id=job.job_id,
        request_id=request_id,
        spec=spec,
        owner=job.owner,
        redacted=redacted,
        cancelled_by=job.cancelled_by,
        **states.job_state_fields(job.state),
        reason=render(withheld(job.reason) if redacted else job.reason),
        reason_code=str(job.reason.code),
        retries_used=job.retries_used,
        requeues=job.requeues,
        submitted_at_ms=job.submitted_at_ms,
        finished_at_ms=job.finished_at_ms,
        attempts_made=job.attempts_made,
        retry_not_before_ms=job.retry_not_before_ms,
        seq=job.seq,
    )
    if job.attempt is not None:
        msg.attempt.CopyFrom(attempt_to_proto(job.attempt, redacted))
    if job.waiting_for:
        msg.waiting_for.CopyFrom(dependencies_to_proto(Dependencies.of_pairs(job.waiting_for)))
    if job.array_id:
        msg.array_id = job.array_id
        msg.array_index = job.array_index
    if job.resume_step is not None:
        msg.resume_step = job.resume_step
    return msg


def _withhold(spec: pb.JobSpec) -> None:
    """Clear what an owner wrote in a spec that may carry a secret (see job_to_proto)."""
    spec.ClearField("command")
    del spec.env[:]
    spec.workdir = ""
    spec.image = ""
    if spec.HasField("prestart"):
        del spec.prestart.command[:]


def array_to_proto(array: ArrayJob, tasks: list[Job], redacted: bool = False) -> pb.ArraySummary:
    """An array as one summary: its spec (withheld as for a job when ``redacted``) and
    its tasks (those still kept) counted by state."""
    spec = spec_to_proto(array.spec)
    if redacted:
        _withhold(spec)
    counts: dict[str, int] = {}
    for task in tasks:
        counts[task.state.value] = counts.get(task.state.value, 0) + 1
    return pb.ArraySummary(
        array_id=array.array_id,
        spec=spec,
        owner=array.owner,
        submitted_at_ms=array.submitted_at_ms,
        seq=array.seq,
        tasks=len(tasks),
        throttle=array.throttle,
        task_states=counts,
        redacted=redacted,
        request_id="" if redacted else shown_request_id(array.owner, array.request_id),
    )


# -------------------------------------------------------------------------- nodes


def node_to_proto(node: Node, heartbeat_age_ms: int) -> pb.Node:
    return pb.Node(
        node_id=node.node_id,
        address=node.info.address,
        **states.node_status_fields(node.status),
        status_reason=node.status_reason,
        capacity=resources_to_proto(node.info.capacity),
        allocated=resources_to_proto(node.allocated),
        allocated_gpus=sorted(node.allocated_gpus),
        topology=[pb.TopologyLabel(level=k, value=v) for k, v in node.info.topology],
        gpu_model=node.info.gpu_model,
        registered_at_ms=node.registered_at_ms,
        last_heartbeat_age_ms=heartbeat_age_ms,
        members_run_as=node.info.members_run_as,
        member_isolation=node.info.member_isolation,
        gpu_faults=gpu_faults_to_proto(node.gpu_faults),
        unfit=[
            pb.NodeUnfit(owner=u.owner, detail=u.detail, until_ms=u.until_ms) for u in node.unfit
        ],
        conditions=conditions_to_proto(node.conditions),
    )


def conditions_to_proto(conditions: Iterable[NodeCondition]) -> list[pb.NodeCondition]:
    return [
        pb.NodeCondition(name=k.name, message=k.message, since_ms=k.since_ms) for k in conditions
    ]


def checks_to_proto(checks: Iterable[NodeCheck]) -> list[pb.NodeCheck]:
    return [pb.NodeCheck(name=k.name, failing=k.failing, message=k.message) for k in checks]


def checks_from_proto(msgs: Iterable[pb.NodeCheck]) -> tuple[NodeCheck, ...]:
    """A worker's node checks (not yet checked: :func:`node_checks.check_node_checks`)."""
    return tuple(NodeCheck(m.name, m.failing, m.message) for m in msgs)


def gpu_faults_to_proto(faults: Iterable[GpuFault]) -> list[pb.GpuFault]:
    return [
        pb.GpuFault(gpu=f.gpu, code=f.code, detail=f.detail, since_ms=f.since_ms) for f in faults
    ]


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


# ---------------------------------------------------------------------- heartbeats


_EXIT_CAUSES = {
    pb.MemberReport.PROGRAM: cmd.ExitCause.PROGRAM,
    pb.MemberReport.FENCED: cmd.ExitCause.FENCED,
    pb.MemberReport.LOST: cmd.ExitCause.LOST,
    pb.MemberReport.NODE_CANNOT_RUN: cmd.ExitCause.NODE_CANNOT_RUN,
    pb.MemberReport.HUNG: cmd.ExitCause.HUNG,
}


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
                **_mark_fields(kind, step, report.checkpoint_seq),
            )
        )
    return tuple(events)


_EVENT_KINDS = {
    pb.MemberReport.STARTED: cmd.MemberEventKind.STARTED,
    pb.MemberReport.EXITED: cmd.MemberEventKind.EXITED,
    pb.MemberReport.CHECKPOINT: cmd.MemberEventKind.CHECKPOINT,
}


def _mark_fields(kind: cmd.MemberEventKind, step: int | None, seq: int) -> dict[str, Any]:
    """A checkpoint's step and number (only a CHECKPOINT event carries them)."""
    if kind is not cmd.MemberEventKind.CHECKPOINT:
        return {}
    return {"step": step, "mark_seq": seq}


def checkpoint_to_proto(at_ms: int, step: int | None) -> pb.Checkpoint:
    """A checkpoint mark (a member's, or its attempt's) as the API shows it."""
    msg = pb.Checkpoint(at_ms=at_ms)
    if step is not None:
        msg.step = step
    return msg


def desired_to_proto(d: DesiredMember) -> pb.DesiredMember:
    msg = pb.DesiredMember(
        job_id=d.job_id,
        fencing_token=d.fencing_token,
        attempt=d.attempt,
        rank=d.rank,
        world_size=d.world_size,
        gpus=list(d.gpus),
        master_addr=host_of(d.master_addr),
        master_port=d.master_port,
        member_hosts=[host_of(h) for h in d.member_hosts],
        local_rank=d.local_rank,
        local_world_size=d.local_world_size,
        command=list(d.spec.command),
        shell=d.spec.shell,
        env=[pb.EnvVar(name=k, value=v) for k, v in d.spec.env],
        workdir=d.spec.workdir,
        time_limit_ms=d.spec.time_limit_ms,
        image=d.spec.image,
        cpu_milli=d.spec.resources.cpu_milli,
        memory_mib=d.spec.resources.memory_mib,
        owner=d.owner,
        progress_timeout_ms=d.spec.progress_timeout_ms,
        progress_source=d.spec.progress_source,
        # A member of an ended attempt never reported running travels as preempted with
        # no grace: the worker never starts it and confirms with an immediate exit.
        preemption=ENDED_ATTEMPT if d.ended else "",
    )
    if d.resume_step is not None:
        msg.resume_step = d.resume_step
    return _with_prestart(msg, d.spec.prestart)


def _with_prestart(msg: pb.DesiredMember, prestart: Prestart | None) -> pb.DesiredMember:
    if prestart is not None:
        msg.prestart_command.extend(prestart.command)
        msg.prestart_shell = prestart.shell
        msg.prestart_timeout_ms = prestart.timeout_ms
    return msg


# The ``DesiredMember.preemption`` kind of a member whose attempt has ended.
ENDED_ATTEMPT = "attempt-ended"


def clamp_int32(value: int) -> int:
    return max(-_INT32_MAX, min(_INT32_MAX, value))


# ------------------------------------------------------------------------- tokens


def token_to_proto(token: Token) -> pb.TokenInfo:
    """A token as ``ListTokens`` shows it: never its secret or the secret's hash."""
    return pb.TokenInfo(
        token_id=token.token_id,
        user=token.user,
        **states.user_role_fields(token.role),
        queues=list(token.queues),
        created_at_ms=token.created_at_ms,
        created_by=token.created_by,
        expires_at_ms=token.expires_at_ms,
        revoked_at_ms=token.revoked_at_ms,
        revoked_by=token.revoked_by,
        priority_classes=list(token.priority_classes),
        max_priority=token.max_priority,
    )


# ------------------------------------------------------- queues and preemption


def queue_from_proto(msg: pb.Queue) -> Queue:
    """Build a queue (not yet checked: :func:`synapse_ha.core.validation.check_queue`).
    An unset limit stays None ("no limit")."""

    def opt(name: str) -> int | None:
        return int(getattr(msg, name)) if msg.HasField(name) else None

    return Queue(
        name=msg.name,
        gpu=opt("gpu"),
        cpu_milli=opt("cpu_milli"),
        memory_mib=opt("memory_mib"),
        cohort=msg.cohort,
        borrowing_limit_gpu=opt("borrowing_limit_gpu"),
        lending_limit_gpu=opt("lending_limit_gpu"),
        priority_classes=tuple(msg.priority_classes),
        max_priority=msg.max_priority,
        min_runtime_ms=msg.min_runtime_ms,
        running_members_per_user=opt("running_members_per_user"),
        members_per_node_per_user=opt("members_per_node_per_user"),
    )


def queue_to_proto(queue: Queue) -> pb.Queue:
    msg = pb.Queue(
        name=queue.name,
        cohort=queue.cohort,
        priority_classes=list(queue.priority_classes),
        max_priority=queue.max_priority,
        min_runtime_ms=queue.min_runtime_ms,
    )
    for name in (
        "gpu",
        "cpu_milli",
        "memory_mib",
        "borrowing_limit_gpu",
        "lending_limit_gpu",
        "running_members_per_user",
        "members_per_node_per_user",
    ):
        value = getattr(queue, name)
        if value is not None:
            setattr(msg, name, value)
    return msg


def queue_usage_to_proto(usage: QueueUsage) -> pb.QueueUsage:
    return pb.QueueUsage(
        used_gpu=usage.used_gpu,
        used_cpu_milli=usage.used_cpu_milli,
        used_memory_mib=usage.used_memory_mib,
        borrowed_gpu=usage.borrowed_gpu,
        lent_gpu=usage.lent_gpu,
        running_jobs=usage.running_jobs,
        pending_jobs=usage.pending_jobs,
        pending_gpu=usage.pending_gpu,
        preempting_jobs=usage.preempting_jobs,
    )


def priority_class_to_proto(c: PriorityClass) -> pb.PriorityClass:
    return pb.PriorityClass(
        name=c.name,
        value=c.value,
        preempts=c.preempts,
        grace_ms=c.grace_ms,
        min_runtime_ms=c.min_runtime_ms,
    )


def preemption_to_desired(msg: pb.DesiredMember, attempt: Attempt, now_ms: int) -> None:
    """Tell a worker its member is being preempted: the kind, the preemptor and the grace
    left before SIGKILL, computed from the attempt's deadline (leader clock) at ``now_ms``
    so that the worker's own clock never matters. Nothing for an attempt not preempted."""
    if not attempt.preempted_by or attempt.preemption is None:
        return
    msg.preemption = str(attempt.preemption)
    msg.preempted_by = attempt.preempted_by
    msg.preempt_grace_ms = max(0, attempt.preempt_deadline_ms - now_ms)


# --------------------------------------------------------------- per-identity limits


def limits_to_proto(limits: Limits) -> pb.Limits:
    return pb.Limits(**dataclasses.asdict(limits))


def limits_with(limits: Limits, values: Iterable[pb.LimitValue]) -> Limits:
    """``limits`` with the named ones replaced; raises :class:`SpecError` naming an
    unknown limit (the values themselves are checked by
    :func:`synapse_ha.core.admission.check_limits`)."""
    known = {f.name for f in dataclasses.fields(Limits)}
    changes: dict[str, int] = {}
    for i, v in enumerate(values):
        if v.name not in known:
            raise SpecError(
                f"values[{i}].name", f"no limit {v.name!r} ({', '.join(sorted(known))})"
            )
        changes[v.name] = int(v.value)
    return dataclasses.replace(limits, **changes)
