"""Core values to protobuf messages: every conversion to the wire. No I/O, no policy.

The fields a message and a core value name alike are declared once, for both directions,
in :mod:`synapse_ha.rpc.fields`; the other direction is :mod:`synapse_ha.rpc.from_proto`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import TYPE_CHECKING

from synapse_ha.core import commands as cmd
from synapse_ha.core.cluster_config import Cohort, Limits, PriorityClass, Queue
from synapse_ha.core.desired import DesiredMember
from synapse_ha.core.health.fitness import GpuFault, NodeCheck, NodeCondition
from synapse_ha.core.health.prestart import Prestart
from synapse_ha.core.health.slowness import PaceReport
from synapse_ha.core.identity.admission import shown_request_id
from synapse_ha.core.model import (
    ArrayJob,
    Attempt,
    AttemptState,
    Job,
    JobSpec,
    JobState,
    Node,
    Resources,
    Token,
)
from synapse_ha.core.queues.usage import CohortUsage, QueueUsage
from synapse_ha.core.reasons import Reason, render, withheld
from synapse_ha.core.views import host_of
from synapse_ha.core.workflows.dependencies import Dependencies
from synapse_ha.rpc import fields, states
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb

if TYPE_CHECKING:  # only named in annotations: the worker and synctl never load history
    from synapse_ha.history.store import HistoryAttempt, HistoryJob, UsageRow
    from synapse_ha.history.tracker import Event

_INT32_MAX = 2**31 - 1
_new_spec = fields.constructor(pb.JobSpec, spec=fields.JOB_SPEC)
_new_desired = fields.constructor(pb.DesiredMember, d=fields.MEMBER, launch=fields.LAUNCH)


def dependencies_to_proto(deps: Dependencies) -> pb.Dependencies:
    return pb.Dependencies(
        after_ok=list(deps.after_ok),
        after_any=list(deps.after_any),
        after_not_ok=list(deps.after_not_ok),
        after=list(deps.after),
        singleton=deps.singleton,
    )


def spec_to_proto(spec: JobSpec) -> pb.JobSpec:
    msg = _new_spec(
        spec,
        resources=resources_to_proto(spec.resources),
        env=[pb.EnvVar(name=k, value=v) for k, v in spec.env],
        queue=spec.queue,
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
    if spec.nodes is not None:
        msg.nodes.CopyFrom(fields.to_message(pb.NodeSelector, spec.nodes))
    if spec.replace is not None:
        msg.replace.CopyFrom(fields.to_message(pb.ReplacePolicy, spec.replace))
    if spec.elastic is not None:
        msg.elastic.CopyFrom(fields.to_message(pb.ElasticPolicy, spec.elastic))
    if spec.shell:
        msg.shell_command = spec.command[0] if spec.command else ""
    else:
        msg.argv.args.extend(spec.command)
    return msg


def resources_to_proto(r: Resources) -> pb.Resources:
    return pb.Resources(cpu_milli=r.cpu_milli, memory_mib=r.memory_mib, gpu=r.gpu)


def attempt_to_proto(a: Attempt, redacted: bool = False) -> pb.Attempt:
    members = []
    marks = {m.rank: m for m in a.marks}
    lost = {v.rank for v in a.vacancies}
    for placement, status in zip(a.members, a.member_status, strict=False):
        member = pb.Member(
            rank=placement.rank,
            node_id=placement.node_id,
            gpus=list(placement.gpus),
            **states.member_state_fields(status.state),
            has_exit_code=status.exit_code is not None,
            exit_code=status.exit_code or 0,
            generation=placement.generation,
            lost=placement.rank in lost,
        )
        mark = marks.get(placement.rank)
        if mark is not None:
            member.checkpoint.CopyFrom(checkpoint_to_proto(mark.at_ms, mark.step))
        members.append(member)
    gang = a.mark()
    return fields.to_message(
        pb.Attempt,
        a,
        outcome=render(withheld(a.outcome) if redacted else a.outcome),
        members=members,
        preemption=str(a.preemption) if a.preemption is not None else "",
        checkpoint=checkpoint_to_proto(gang.at_ms, gang.step) if gang is not None else None,
    )


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
    waiting_for = Dependencies.of_pairs(job.waiting_for) if job.waiting_for else None
    return fields.to_message(
        pb.Job,
        job,
        request_id=request_id,
        spec=spec,
        redacted=redacted,
        **states.job_state_fields(job.state),
        reason=render(withheld(job.reason) if redacted else job.reason),
        reason_code=str(job.reason.code),
        attempt=attempt_to_proto(job.attempt, redacted) if job.attempt is not None else None,
        waiting_for=dependencies_to_proto(waiting_for) if waiting_for is not None else None,
    )


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


def node_to_proto(
    node: Node, heartbeat_age_ms: int, spare: bool = False, drain: Reason | None = None
) -> pb.Node:
    """``spare``: the node is kept as a hot spare (core/spares.py); ``drain``: the
    ``draining_for`` reason of a node a drain holds (core/scheduler/defrag.py)."""
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
        features=sorted(node.info.features),
        registered_at_ms=node.registered_at_ms,
        last_heartbeat_age_ms=heartbeat_age_ms,
        members_run_as=node.info.members_run_as,
        member_isolation=node.info.member_isolation,
        gpu_faults=gpu_faults_to_proto(node.gpu_faults),
        unfit=[
            pb.NodeUnfit(owner=u.owner, detail=u.detail, until_ms=u.until_ms) for u in node.unfit
        ],
        conditions=conditions_to_proto(node.conditions),
        spare=spare,
        draining_for=str(drain.get("job")) if drain is not None else "",
        draining_until_ms=int(drain.get("until_ms", 0)) if drain is not None else 0,
    )


def conditions_to_proto(conditions: Iterable[NodeCondition]) -> list[pb.NodeCondition]:
    return [
        pb.NodeCondition(name=k.name, message=k.message, since_ms=k.since_ms) for k in conditions
    ]


def checks_to_proto(checks: Iterable[NodeCheck]) -> list[pb.NodeCheck]:
    return [pb.NodeCheck(name=k.name, failing=k.failing, message=k.message) for k in checks]


def gpu_faults_to_proto(faults: Iterable[GpuFault]) -> list[pb.GpuFault]:
    return [
        pb.GpuFault(gpu=f.gpu, code=f.code, detail=f.detail, since_ms=f.since_ms) for f in faults
    ]


_REPORT_KINDS = {kind: wire for wire, kind in fields.REPORT_KINDS}
_REPORT_CAUSES = {cause: wire for wire, cause in fields.EXIT_CAUSES}


def member_event_to_proto(e: cmd.MemberEvent) -> pb.MemberReport:
    """A worker's report of one of its members (read back by
    :func:`synapse_ha.rpc.from_proto.member_events_from_proto`)."""
    msg = pb.MemberReport(
        job_id=e.job_id,
        fencing_token=e.fencing_token,
        rank=e.rank,
        kind=_REPORT_KINDS[e.kind],  # type: ignore[arg-type]
        exit_code=e.exit_code,
        detail=e.detail,
        cause=_REPORT_CAUSES[e.cause],  # type: ignore[arg-type]
        generation=e.generation,
    )
    if e.kind is cmd.MemberEventKind.CHECKPOINT:
        msg.checkpoint_seq = e.mark_seq
        if e.step is not None:
            msg.checkpoint_step = e.step
    return msg


def heartbeat_to_proto(
    node_id: str,
    reports: Iterable[cmd.MemberEvent],
    running: Iterable[cmd.MemberEvent],
    faults: Iterable[GpuFault],
    checks: Iterable[NodeCheck],
    paces: Iterable[PaceReport] = (),
) -> pb.HeartbeatRequest:
    """A worker's heartbeat: its reports not yet acknowledged, its running members, its
    unhealthy GPUs, its checks' latest results and its members' paces. With paces, in the
    embedded form (the only one that has them), which every replica reads first."""
    reported = [member_event_to_proto(r) for r in reports]
    members = [member_event_to_proto(r) for r in running]
    paced = [pace_to_proto(p) for p in paces]
    if paced:
        return pb.HeartbeatRequest(
            heartbeat=pb.Heartbeat(
                node_id=node_id,
                reports=reported,
                running=members,
                gpu_faults=gpu_faults_to_proto(faults),
                checks=checks_to_proto(checks),
                paces=paced,
            )
        )
    return pb.HeartbeatRequest(
        node_id=node_id,
        reports=reported,
        running=members,
        gpu_faults=gpu_faults_to_proto(faults),
        checks=checks_to_proto(checks),
    )


def pace_to_proto(p: PaceReport) -> pb.MemberPace:
    return pb.MemberPace(
        job_id=p.job_id,
        fencing_token=p.fencing_token,
        rank=p.rank,
        step_us=p.step_us,
        steps=p.steps,
        peers=p.peers,
    )


def checkpoint_to_proto(at_ms: int, step: int | None) -> pb.Checkpoint:
    """A checkpoint mark (a member's, or its attempt's) as the API shows it."""
    msg = pb.Checkpoint(at_ms=at_ms)
    if step is not None:
        msg.step = step
    return msg


def desired_to_proto(d: DesiredMember) -> pb.DesiredMember:
    launch = d.spec
    msg = _new_desired(
        d,
        launch,
        gpus=list(d.gpus),
        master_addr=host_of(d.master_addr),
        member_hosts=[host_of(h) for h in d.member_hosts],
        command=list(launch.command),
        env=[pb.EnvVar(name=k, value=v) for k, v in launch.env],
        cpu_milli=launch.resources.cpu_milli,
        memory_mib=launch.resources.memory_mib,
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


ENDED_ATTEMPT = "attempt-ended"


def clamp_int32(value: int) -> int:
    return max(-_INT32_MAX, min(_INT32_MAX, value))


def token_to_proto(token: Token) -> pb.TokenInfo:
    """A token as ``ListTokens`` shows it: never its secret or the secret's hash."""
    return fields.to_message(pb.TokenInfo, token, **states.user_role_fields(token.role))


def queue_to_proto(queue: Queue) -> pb.Queue:
    """A queue; a limit of None ("no limit") is left unset."""
    return fields.to_message(pb.Queue, queue)


def queue_usage_to_proto(usage: QueueUsage) -> pb.QueueUsage:
    return fields.to_message(pb.QueueUsage, usage)


def priority_class_to_proto(c: PriorityClass) -> pb.PriorityClass:
    return fields.to_message(pb.PriorityClass, c)


def preemption_to_desired(msg: pb.DesiredMember, attempt: Attempt, now_ms: int) -> None:
    """Tell a worker its member is being preempted: the kind, the preemptor and the grace
    left before SIGKILL, computed from the attempt's deadline (leader clock) at ``now_ms``
    so that the worker's own clock never matters. Nothing for an attempt not preempted."""
    if not attempt.preempted_by or attempt.preemption is None:
        return
    msg.preemption = str(attempt.preemption)
    msg.preempted_by = attempt.preempted_by
    msg.preempt_grace_ms = max(0, attempt.preempt_deadline_ms - now_ms)


def limits_to_proto(limits: Limits) -> pb.Limits:
    return pb.Limits(**dataclasses.asdict(limits))


# ------------------------------------------------------------------------ cohorts


def cohort_to_proto(cohort: Cohort) -> pb.Cohort:
    """A cohort; a limit of None ("no limit") is left unset."""
    return fields.to_message(pb.Cohort, cohort)


def cohort_status_to_proto(usage: CohortUsage) -> pb.CohortStatus:
    return fields.to_message(pb.CohortStatus, usage, cohort=cohort_to_proto(usage.cohort))


# -------------------------------------------------------- history rows and events


def history_attempt_to_proto(a: HistoryAttempt) -> pb.HistoryAttempt:
    return fields.to_message(
        pb.HistoryAttempt,
        a,
        number=clamp_int32(a.number),
        **states.attempt_state_fields(AttemptState(a.state)),
    )


def history_job_to_proto(j: HistoryJob) -> pb.HistoryJob:
    return fields.to_message(
        pb.HistoryJob,
        j,
        **states.job_state_fields(JobState(j.state)),
        attempts=clamp_int32(j.attempts),
        retries_used=clamp_int32(j.retries_used),
        requeues=clamp_int32(j.requeues),
        spec=spec_to_proto(j.spec),
        attempt_list=[history_attempt_to_proto(a) for a in j.attempt_list],
        checkpoint=checkpoint_to_proto(j.checkpoint_at_ms, j.checkpoint_step)
        if j.checkpoint_at_ms
        else None,
    )


def usage_row_to_proto(r: UsageRow) -> pb.UsageRow:
    return fields.to_message(pb.UsageRow, r, attempts=clamp_int32(r.attempts))


def event_to_proto(e: Event, redacted: bool = False) -> pb.Event:
    """The event as the API shows it; ``redacted`` withholds the text its job controls
    (:func:`synapse_ha.core.reasons.withheld`) from a caller who may not manage the job."""
    detail = e.description
    if redacted and e.reason is not None:
        detail = render(withheld(e.reason))
    return fields.to_message(
        pb.Event, e, kind=str(e.kind), attempt=clamp_int32(e.attempt), detail=detail
    )
