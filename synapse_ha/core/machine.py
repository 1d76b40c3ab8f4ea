"""The cluster state machine: one ``apply(state, command)`` for every change.

Every replica applies the same commands in the same order and reaches byte-identical
state. ``apply`` validates a command completely before it changes anything, never reads
a clock (time comes in the command, clamped so it never runs backwards), draws
randomness only from seeds carried in the command, and never raises: a bad or stale
command becomes an error :class:`Result`, and an unexpected exception becomes an
``INTERNAL`` result so that a bug cannot wedge the replicated log.
"""

from __future__ import annotations

import bisect
import dataclasses
import random
from collections.abc import Callable, Iterable
from typing import Any

from synapse_ha.core import commands as cmd
from synapse_ha.core import lifecycle as lc
from synapse_ha.core.admission import check_limits, check_priority_allowance
from synapse_ha.core.commands import RejectCode, Rejection, Result, ResultCode, error, ok
from synapse_ha.core.fairshare import add_usage
from synapse_ha.core.lifecycle import ATTEMPT, JOB, MEMBER, NODE, move, transition
from synapse_ha.core.model import (
    DEFAULT_QUEUE,
    FEATURE_IMAGES,
    MAX_LOCALITY_WAIT_MS,
    MAX_REQUEUES_LIMIT,
    MAX_START_TIMEOUT_MS,
    MIN_START_TIMEOUT_MS,
    ZERO,
    Attempt,
    AttemptState,
    ClusterConfig,
    ClusterState,
    Job,
    JobSpec,
    JobState,
    LostAttempt,
    MemberState,
    MemberStatus,
    Node,
    NodeInfo,
    NodeStatus,
    PreemptionKind,
    PreemptionMode,
    Resources,
    Token,
    time_limit_deadline,
    topology_path,
    unconfirmed_members,
)
from synapse_ha.core.quota import QueueUsage, gang_request, grace_ms, priority_class
from synapse_ha.core.reasons import (
    FAILURE_CODES,
    REQUEUE_CODES,
    Reason,
    ReasonCode,
    ranks_text,
    reason,
)
from synapse_ha.core.topology import CLUSTER, domain_at
from synapse_ha.core.validation import (
    Violation,
    ViolationCode,
    check_job_queue,
    check_job_spec,
    check_node_info,
    check_priority_classes,
    check_queue,
    check_token,
    describe,
)


def apply(state: ClusterState, command: cmd.Command) -> Result:
    """Apply ``command`` to ``state`` in place and say what happened. Never raises."""
    handler = _HANDLERS.get(type(command))
    if handler is None:
        return error(ResultCode.INVALID, f"unknown command type {type(command).__name__}")
    try:
        now = max(command.now_ms, state.last_time_ms)
        result = handler(state, command, now)
    except Exception as exc:  # a bug; the log must keep moving on every replica alike
        return error(ResultCode.INTERNAL, f"{type(command).__name__}: {exc!r}")
    state.applied_commands += 1
    state.last_time_ms = now
    return result


# ---------------------------------------------------------------------- config/barrier


def _configure(state: ClusterState, c: cmd.Configure, now: int) -> Result:
    problems = c.config.timeouts.violations()
    levels = c.config.topology_levels
    if len(set(levels)) != len(levels) or "host" in levels or any(not lv for lv in levels):
        problems.append("topology_levels must be distinct, non-empty and not 'host'")
    if c.config.retention_ms < 0:
        problems.append("retention_ms must be >= 0")
    if (
        c.config.master_port_span < 1
        or not 1024 <= c.config.master_port_base <= 65535
        or c.config.master_port_base + c.config.master_port_span - 1 > 65535
    ):
        problems.append("master port range must lie within 1024..65535")
    if not 0 <= c.config.locality_wait_ms <= MAX_LOCALITY_WAIT_MS:
        problems.append(f"locality_wait_ms must be between 0 and {MAX_LOCALITY_WAIT_MS}")
    if not 0 <= c.config.max_requeues <= MAX_REQUEUES_LIMIT:
        problems.append(f"max_requeues must be between 0 and {MAX_REQUEUES_LIMIT}")
    if not MIN_START_TIMEOUT_MS <= c.config.start_timeout_ms <= MAX_START_TIMEOUT_MS:
        problems.append(
            f"start_timeout_ms must be between {MIN_START_TIMEOUT_MS} and {MAX_START_TIMEOUT_MS}"
        )
    problems.extend(str(v) for v in check_priority_classes(c.config.priority_classes))
    if c.config.fair_share_half_life_ms < 1:
        problems.append("fair_share_half_life_ms must be >= 1")
    problems.extend(str(v) for v in check_limits(c.config.limits))
    if problems:
        return error(ResultCode.INVALID, "; ".join(problems))
    orphaned = orphaned_levels(state, c.config)
    if orphaned:
        named = "; ".join(
            f"topology level {level!r} is used by {', '.join(jobs[:5])}"
            + (f" and {len(jobs) - 5} more" if len(jobs) > 5 else "")
            for level, jobs in orphaned
        )
        return error(
            ResultCode.CONFLICT,
            f"{named}; the new topology_levels would orphan it (let those jobs finish or "
            f"cancel them first)",
            details=tuple((level, ",".join(jobs)) for level, jobs in orphaned),
        )
    state.config = c.config
    return ok("configured")


def orphaned_levels(state: ClusterState, config: ClusterConfig) -> list[tuple[str, list[str]]]:
    """Topology levels that unfinished jobs name (``topology.required`` or ``preferred``)
    and ``config`` no longer has, each with those jobs in id order.

    Only jobs count: node labels for a level that goes away are merely ignored, and a
    level added later finds them again, so they never block a change.
    """
    known = {*config.levels_with_host(), CLUSTER}
    users: dict[str, list[str]] = {}
    for job_id in sorted(state.jobs):
        job = state.jobs[job_id]
        if job.state.finished:
            continue
        for level in (job.spec.topology_required, job.spec.topology_preferred):
            if level and level not in known:
                jobs = users.setdefault(level, [])
                if not jobs or jobs[-1] != job_id:
                    jobs.append(job_id)
    return sorted(users.items())


def _barrier(state: ClusterState, c: cmd.Barrier, now: int) -> Result:
    return ok(f"barrier {c.leader_id}".strip())


# ------------------------------------------------------------------------------ nodes


def _register_node(state: ClusterState, c: cmd.RegisterNode, now: int) -> Result:
    violations = check_node_info(c.info)
    if violations:
        return error(ResultCode.INVALID, describe(violations))
    info = _normalised(c.info)
    node = state.nodes.get(info.node_id)
    if node is None:
        state.nodes[info.node_id] = Node(info=info, status=NodeStatus.READY, registered_at_ms=now)
        return ok(f"node {info.node_id} registered")
    if not node.allocated.fits_in(info.capacity) or not node.allocated_gpus <= set(
        range(info.capacity.gpu)
    ):
        return error(
            ResultCode.CONFLICT,
            f"node {info.node_id}: new capacity {info.capacity.describe()} does not cover "
            f"what is bound to it ({node.allocated.describe()}); report its members' exits first",
        )
    node.info = info
    was_dead = node.status is NodeStatus.DEAD
    node.status = move(NODE, node.status, lc.NodeEvent.REGISTER)
    if was_dead:
        node.status_reason = ""
        node.registered_at_ms = now
        return ok(f"node {info.node_id} is back")
    return ok(f"node {info.node_id} updated")


def _normalised(info: NodeInfo) -> NodeInfo:
    """Fill in singleton NVLink islands when none were given; sort islands and labels."""
    islands = info.gpu_islands or tuple((i,) for i in range(info.capacity.gpu))
    islands = tuple(sorted(tuple(sorted(isl)) for isl in islands))
    return NodeInfo(
        node_id=info.node_id,
        address=info.address,
        capacity=info.capacity,
        gpu_islands=islands,
        gpu_model=info.gpu_model,
        topology=tuple(sorted(info.topology)),
        features=tuple(sorted(set(info.features))),
        members_run_as=info.members_run_as,
    )


def _set_node_status(state: ClusterState, c: cmd.SetNodeStatus, now: int) -> Result:
    node = state.nodes.get(c.node_id)
    if node is None:
        return error(ResultCode.NOT_FOUND, f"no node {c.node_id!r}")
    event = lc.NODE_EVENT_FOR_STATUS.get(c.status)
    if event is None:
        return error(ResultCode.INVALID, "use MarkNodeDead to declare a node dead")
    after = transition(NODE, node.status, event)
    if isinstance(after, lc.Refusal):
        return error(
            ResultCode.CONFLICT,
            f"node {c.node_id} is {node.status.value}; it must register again",
        )
    node.status = after
    node.status_reason = c.reason
    node.status_by = c.actor
    _settle_drained(state, (c.node_id,))
    return ok(f"node {c.node_id} is {node.status.value}")


def _mark_node_dead(state: ClusterState, c: cmd.MarkNodeDead, now: int) -> Result:
    node = state.nodes.get(c.node_id)
    if node is None:
        return error(ResultCode.NOT_FOUND, f"no node {c.node_id!r}")
    if node.status is NodeStatus.DEAD:
        return ok(f"node {c.node_id} was already dead")
    node.status = move(NODE, node.status, lc.NodeEvent.DIE)
    node.status_reason = c.reason or "declared dead"
    affected = sorted(
        job.job_id
        for job in state.jobs.values()
        if (attempt := job.live_attempt()) is not None
        and any(m.node_id == c.node_id for m in attempt.members)
    )
    outcome = reason(ReasonCode.NODE_DEAD, node=c.node_id, detail=node.status_reason)
    touched: set[str] = set()
    for job_id in affected:
        job = state.jobs[job_id]
        if job.attempt is not None:
            touched.update(m.node_id for m in job.attempt.members)
        if job.attempt is not None and job.attempt.preempted_by:
            # Its node's death confirms those members stopped; the gang was leaving anyway.
            # But they may have exited 0 by themselves first, reported late: kept as for
            # any attempt a node's death ends, unless a member is already known stopped.
            stopped = any(
                s.state is MemberState.EXITED and s.exit_code != 0
                for s in job.attempt.member_status
            )
            lost = None if stopped else _lost_attempt(job, c.node_id)
            _end_preempted(state, job, now)
            job.lost_attempt = lost
        else:
            lost = _lost_attempt(job, c.node_id)
            _end_attempt_for(state, job, outcome, c.jitter_seed, now)
            if not job.state.finished:
                job.lost_attempt = lost
    # Members on a dead node are gone: its worker fenced itself before the node was
    # declared dead (dead_timeout > lease_ttl + leader_step_down).
    for job_id in sorted(state.jobs):
        attempt = state.jobs[job_id].attempt
        if attempt is None or attempt.ended_at_ms is None:
            continue
        for member, status in zip(attempt.members, attempt.member_status, strict=True):
            if member.node_id == c.node_id and status.state is not MemberState.EXITED:
                status.state = move(MEMBER, status.state, lc.MemberEvent.EXIT)
                status.finished_at_ms = now
                touched.update(m.node_id for m in attempt.members)
    _settle_drained(state, sorted(touched))
    return ok(f"node {c.node_id} is dead; {len(affected)} gang(s) stopped", stopped=tuple(affected))


# ------------------------------------------------------------------------------- jobs


def _submit_job(state: ClusterState, c: cmd.SubmitJob, now: int) -> Result:
    if not c.request_id:
        return error(ResultCode.INVALID, "request_id: must not be empty")
    existing = state.request_ids.get(c.request_id)
    if existing is not None:
        return ok("duplicate request: returning the existing job", job_id=existing)
    violations = check_job_spec(c.spec, state.config.topology_levels)
    if violations:
        return error(ResultCode.INVALID, describe(violations))
    spec, problems = _resolve_queue_and_class(state, c.spec)
    if problems:
        return error(ResultCode.INVALID, describe(problems))
    seq = state.next_job_seq
    job_id = f"job-{seq:06d}"
    state.next_job_seq = seq + 1
    state.jobs[job_id] = Job(
        job_id=job_id,
        spec=spec,
        request_id=c.request_id,
        seq=seq,
        submitted_at_ms=now,
        owner=c.owner,
    )
    state.request_ids[c.request_id] = job_id
    return ok(f"submitted {job_id}", job_id=job_id, created=True)


def _resolve_queue_and_class(state: ClusterState, spec: JobSpec) -> tuple[JobSpec, list[Violation]]:
    """The spec as stored, once :func:`check_job_queue` finds nothing wrong with its queue
    and class: a class's value replaces ``priority``."""
    violations = check_job_queue(spec, state.queues, state.config.priority_classes)
    cls = priority_class(state.config, spec.priority_class) if spec.priority_class else None
    if violations or cls is None:
        return spec, violations
    return dataclasses.replace(spec, priority=cls.value), []


def _cancel_job(state: ClusterState, c: cmd.CancelJob, now: int) -> Result:
    job = state.jobs.get(c.job_id)
    if job is None:
        return error(ResultCode.NOT_FOUND, f"no job {c.job_id!r}")
    if job.state is JobState.CANCELLED:
        return ok(f"{c.job_id} was already cancelled", job_id=c.job_id)
    if job.state.finished:
        return error(ResultCode.CONFLICT, f"{c.job_id} already finished as {job.state.value}")
    attempt = job.live_attempt()
    if attempt is not None:
        _end_attempt(
            state, job, lc.AttemptEvent.STOP, reason(ReasonCode.CANCELLED_BY, text=c.reason), now
        )
    _finish(job, lc.JobEvent.CANCEL, reason(ReasonCode.CANCELLED, text=c.reason), now)
    job.cancelled_by = c.actor
    if attempt is not None:
        _settle_drained(state, sorted({m.node_id for m in attempt.members}))
    return ok(f"{c.job_id} cancelled", job_id=c.job_id)


# ----------------------------------------------------------------------------- binding


def _bind_plan(state: ClusterState, c: cmd.BindPlan, now: int) -> Result:
    bound: list[str] = []
    rejected: list[Rejection] = []
    usage = QueueUsage.of(state) if c.placements and _has_quotas(state) else None
    for placement in c.placements:
        problem = verify_placement(state, placement, now)
        if problem is None and usage is not None:
            problem = _verify_quota(state, usage, placement)
        if problem is not None:
            rejected.append(problem)
        else:
            _bind(state, placement, now)
            bound.append(placement.job_id)
            if usage is not None:
                spec = state.jobs[placement.job_id].spec
                usage.add(spec.queue, gang_request(spec))
    for job_id, why in c.reasons:
        job = state.jobs.get(job_id)
        if job is not None and job.state is JobState.PENDING:
            job.reason = why
    return ok(
        f"bound {len(bound)} gang(s), rejected {len(rejected)}",
        bound=tuple(bound),
        rejected=tuple(rejected),
    )


def verify_placement(state: ClusterState, p: cmd.GangPlacement, now: int) -> Rejection | None:
    """Why ``p`` cannot be bound to ``state`` now, or None when it can (whole gang)."""

    def no(code: RejectCode, message: str) -> Rejection:
        return Rejection(p.job_id, code, message)

    job = state.jobs.get(p.job_id)
    if job is None:
        return no(RejectCode.NO_JOB, "no such job")
    if job.state is not JobState.PENDING:
        return no(RejectCode.NOT_PENDING, f"job is {job.state.value}, not PENDING")
    if job.attempts_made != p.attempts_made:
        return no(RejectCode.STALE_PLAN, f"stale plan: planned for attempt {p.attempts_made + 1}")
    if now < job.retry_not_before_ms:
        return no(RejectCode.IN_BACKOFF, "job is still in its retry back-off")
    if unconfirmed_members(job):
        return no(
            RejectCode.UNCONFIRMED_MEMBERS,
            "members of the previous attempt have not been confirmed stopped",
        )
    spec = job.spec
    if len(p.members) != spec.replicas:
        return no(
            RejectCode.WRONG_SIZE, f"plan has {len(p.members)} members, job needs {spec.replicas}"
        )
    per_node: dict[str, Resources] = {}
    gpus_taken: dict[str, set[int]] = {}
    for rank, member in enumerate(p.members):
        if member.rank != rank:
            return no(
                RejectCode.WRONG_RANKS, f"member ranks must be 0..{spec.replicas - 1} in order"
            )
        node = state.nodes.get(member.node_id)
        if node is None:
            return no(RejectCode.NO_NODE, f"rank {rank}: no node {member.node_id!r}")
        if not node.schedulable():
            return no(
                RejectCode.NODE_UNSCHEDULABLE,
                f"rank {rank}: node {member.node_id} is {node.status.value}",
            )
        if spec.image and FEATURE_IMAGES not in node.info.features:
            return no(
                RejectCode.NO_IMAGES,
                f"rank {rank}: node {member.node_id} cannot run container images",
            )
        if len(member.gpus) != spec.resources.gpu:
            return no(
                RejectCode.WRONG_GPU_COUNT,
                f"rank {rank}: {len(member.gpus)} GPUs given, {spec.resources.gpu} needed",
            )
        taken = gpus_taken.setdefault(member.node_id, set())
        for gpu in member.gpus:
            if not 0 <= gpu < node.info.capacity.gpu:
                return no(
                    RejectCode.NO_SUCH_GPU, f"rank {rank}: node {member.node_id} has no GPU {gpu}"
                )
            if gpu in node.allocated_gpus or gpu in taken:
                return no(
                    RejectCode.GPU_IN_USE,
                    f"rank {rank}: GPU {gpu} on {member.node_id} is already in use",
                )
            taken.add(gpu)
        per_node[member.node_id] = per_node.get(member.node_id, Resources()) + spec.resources
    for node_id, request in sorted(per_node.items()):
        node = state.nodes[node_id]
        if not request.fits_in(node.free):
            return no(
                RejectCode.NO_ROOM,
                f"node {node_id} no longer fits: needs {request.describe()}, "
                f"has {node.free.describe()} free",
            )
    level = spec.topology_required
    if level:
        levels = state.config.levels_with_host()
        domains = {
            domain_at(
                topology_path(state.nodes[n].info, state.config.topology_levels), levels, level
            )
            for n in per_node
        }
        if len(domains) > 1:
            return no(
                RejectCode.TOPOLOGY_SPAN,
                f"members span {len(domains)} {level}s; the job requires one",
            )
    return None


def _has_quotas(state: ClusterState) -> bool:
    return any(
        q.gpu is not None or q.cpu_milli is not None or q.memory_mib is not None
        for q in state.queues.values()
    )


def _verify_quota(state: ClusterState, usage: QueueUsage, p: cmd.GangPlacement) -> Rejection | None:
    """A gang is bound only within what its queue may use now (nominal plus what it may
    borrow from idle cohort quota): the planner's decision, checked again."""
    spec = state.jobs[p.job_id].spec
    short = usage.shortfall(spec.queue, gang_request(spec))
    if short is None:
        return None
    return Rejection(
        p.job_id,
        RejectCode.OVER_QUOTA,
        f"queue {short.queue} uses {short.used}/{short.nominal} {short.resource}, "
        f"{short.borrowable} borrowable; this gang needs {short.need}",
    )


def _bind(state: ClusterState, p: cmd.GangPlacement, now: int) -> None:
    job = state.jobs[p.job_id]
    spec = job.spec
    state.last_fencing_token += 1
    token = state.last_fencing_token
    for member in p.members:
        node = state.nodes[member.node_id]
        node.allocated = node.allocated + spec.resources
        node.allocated_gpus.update(member.gpus)
    job.attempts_made += 1
    master = state.nodes[p.members[0].node_id]
    master_port = _choose_master_port(state.config, master, token)
    bisect.insort(master.master_ports, master_port)
    job.attempt = Attempt(
        number=job.attempts_made,
        fencing_token=token,
        members=p.members,
        master_port=master_port,
        bound_at_ms=now,
        member_status=[MemberStatus() for _ in p.members],
    )
    job.state = move(JOB, job.state, lc.JobEvent.BIND)
    hosts = len({m.node_id for m in p.members})
    job.reason = reason(ReasonCode.BOUND, attempt=job.attempts_made, hosts=hosts)


def _choose_master_port(config: ClusterConfig, master: Node, token: int) -> int:
    """A port for the rendezvous, not used by another live attempt on the same master node.

    Probing starts at the token's own slot, which is almost always free because tokens
    grow; each probe is a binary search of the node's sorted ports."""
    in_use = master.master_ports
    for step in range(config.master_port_span):
        port = config.master_port_base + (token + step) % config.master_port_span
        i = bisect.bisect_left(in_use, port)
        if i == len(in_use) or in_use[i] != port:
            return port
    return config.master_port_base + token % config.master_port_span


# ------------------------------------------------------------------------- lifecycle


def _report_members(state: ClusterState, c: cmd.ReportMembers, now: int) -> Result:
    if c.node_id not in state.nodes:
        return error(ResultCode.NOT_FOUND, f"no node {c.node_id!r}")
    accepted = stale = 0
    touched: set[str] = set()
    for event in c.events:
        job = state.jobs.get(event.job_id)
        late = job is not None and _count_late_exit(state, job, c.node_id, event, now, touched)
        if job is not None and (_confirm_stopped(job, c.node_id, event, now) or late):
            accepted += 1
            touched.add(c.node_id)
            continue
        attempt = job.live_attempt() if job is not None else None
        if (
            job is None
            or attempt is None
            or attempt.fencing_token != event.fencing_token
            or not 0 <= event.rank < len(attempt.members)
            or attempt.members[event.rank].node_id != c.node_id
        ):
            stale += 1
            continue
        accepted += 1
        status = attempt.member_status[event.rank]
        if status.state is MemberState.EXITED:
            continue  # already known; reports are at-least-once
        if attempt.preempted_by and event.kind is cmd.MemberEventKind.EXITED:
            # Any exit of a preempted member confirms it stopped; never the job's failure.
            status.state = move(MEMBER, status.state, lc.MemberEvent.EXIT)
            status.exit_code = _preempted_exit_code(event)
            status.finished_at_ms = now
            if all(s.state is MemberState.EXITED for s in attempt.member_status):
                if attempt.state is AttemptState.RUNNING and all(
                    s.exit_code == 0 for s in attempt.member_status
                ):
                    _succeed_before_preemption(job, attempt, now, state)
                else:
                    _end_preempted(state, job, now)
                touched.update(m.node_id for m in attempt.members)
            continue
        if status.started_at_ms is None:
            status.started_at_ms = now
        if attempt.started_at_ms is None:
            attempt.started_at_ms = now
        if attempt.state is AttemptState.BOUND:
            attempt.state = move(ATTEMPT, attempt.state, lc.AttemptEvent.START)
        if job.state is JobState.SCHEDULED:
            job.state = move(JOB, job.state, lc.JobEvent.START)
            job.reason = reason(ReasonCode.RUNNING, attempt=attempt.number)
        if event.kind is cmd.MemberEventKind.STARTED:
            status.state = move(MEMBER, status.state, lc.MemberEvent.START)
            continue
        status.state = move(MEMBER, status.state, lc.MemberEvent.EXIT)
        status.exit_code = event.exit_code
        status.finished_at_ms = now
        if event.cause.disruption or event.exit_code != 0:
            code = {
                cmd.ExitCause.PROGRAM: ReasonCode.MEMBER_EXITED,
                cmd.ExitCause.FENCED: ReasonCode.MEMBER_FENCED,
                cmd.ExitCause.LOST: ReasonCode.MEMBER_LOST,
            }[event.cause]
            outcome = reason(
                code,
                rank=event.rank,
                node=c.node_id,
                exit_code=event.exit_code,
                detail=event.detail or None,
            )
            _end_attempt_for(state, job, outcome, c.jitter_seed, now)
            touched.update(m.node_id for m in attempt.members)
        elif all(s.state is MemberState.EXITED and s.exit_code == 0 for s in attempt.member_status):
            _end_attempt(
                state,
                job,
                lc.AttemptEvent.SUCCEED,
                reason(ReasonCode.ALL_EXITED_ZERO, members=len(attempt.members)),
                now,
            )
            _finish(
                job,
                lc.JobEvent.SUCCEED,
                reason(ReasonCode.SUCCEEDED, members=len(attempt.members)),
                now,
            )
            touched.update(m.node_id for m in attempt.members)
    _settle_drained(state, sorted(touched))
    return ok(
        f"{accepted} event(s) accepted, {stale} stale", accepted_events=accepted, stale_events=stale
    )


# 128 + SIGTERM: the code a member stopped by its worker reports (worker/shim.py).
EXIT_STOPPED = 143


def _preempted_exit_code(event: cmd.MemberEvent) -> int:
    """The code recorded for a preempted member's exit. Only an exit 0 by the member's own
    program (cause ``PROGRAM``) is a success: a member its worker stopped never reports 0
    (its supervisor reports 143, DESIGN §4), so a disruption reported with code 0 is
    recorded as 143 and never counts as one."""
    if event.cause.disruption and event.exit_code == 0:
        return EXIT_STOPPED
    return event.exit_code


def _succeed_before_preemption(job: Job, attempt: Attempt, now: int, state: ClusterState) -> None:
    """Every member of a preempted attempt exited 0 by itself: the gang finished before
    the preemption reached it (its exits were reported after the preemption was decided).
    The job succeeds instead of running again; the preemptor gets the GPUs as it would
    have, once the next pass places it."""
    members = len(attempt.members)
    _end_attempt(
        state,
        job,
        lc.AttemptEvent.SUCCEED,
        reason(ReasonCode.ALL_EXITED_ZERO, members=members),
        now,
    )
    _finish(
        job,
        lc.JobEvent.SUCCEED,
        reason(
            ReasonCode.SUCCEEDED_BEFORE_PREEMPTION,
            attempt=attempt.number,
            members=members,
            preemptor=attempt.preempted_by,
        ),
        now,
    )


def _confirm_stopped(job: Job, node_id: str, event: cmd.MemberEvent, now: int) -> bool:
    """Record that a member of the job's ended attempt has stopped; False if not such."""
    attempt = job.attempt
    if (
        attempt is None
        or attempt.ended_at_ms is None
        or event.kind is not cmd.MemberEventKind.EXITED
        or attempt.fencing_token != event.fencing_token
        or not 0 <= event.rank < len(attempt.members)
        or attempt.members[event.rank].node_id != node_id
    ):
        return False
    status = attempt.member_status[event.rank]
    if status.state is not MemberState.EXITED:
        status.state = move(MEMBER, status.state, lc.MemberEvent.EXIT)
        status.exit_code = event.exit_code
        status.finished_at_ms = now
    return True


# ------------------------------------------------- late success reports after node death


def _lost_attempt(job: Job, node_id: str) -> LostAttempt:
    """The record kept of the live attempt about to be ended by ``node_id``'s death: its
    ranks' nodes and the ranks already known to have exited 0 (a live attempt's exited
    members all exited 0 by their own program, or it would have ended already)."""
    attempt = job.attempt
    assert attempt is not None
    return LostAttempt(
        number=attempt.number,
        fencing_token=attempt.fencing_token,
        node_id=node_id,
        nodes=tuple(m.node_id for m in attempt.members),
        exited_zero=tuple(
            rank
            for rank, s in enumerate(attempt.member_status)
            if s.state is MemberState.EXITED and s.exit_code == 0
        ),
    )


def _count_late_exit(
    state: ClusterState,
    job: Job,
    node_id: str,
    event: cmd.MemberEvent,
    now: int,
    touched: set[str],
) -> bool:
    """Count an exit of the job's attempt that was ended by its node's death
    (``job.lost_attempt``); False when ``event`` is not such an exit.

    An exit 0 by the member's own program (cause ``PROGRAM``) adds its rank; once every
    rank has one, the attempt had succeeded after all: a newer attempt, bound or running,
    is stopped (its members are no longer desired, its resources are released) and the
    job ends ``SUCCEEDED`` (``late_success``), so it never runs again. Any other exit
    (non-zero, fenced, lost) drops the record: the requeue was needed. Duplicates change
    nothing (reports are at-least-once).
    """
    lost = job.lost_attempt
    if (
        lost is None
        or event.kind is not cmd.MemberEventKind.EXITED
        or event.fencing_token != lost.fencing_token
        or not 0 <= event.rank < len(lost.nodes)
        or lost.nodes[event.rank] != node_id
    ):
        return False
    if event.cause is not cmd.ExitCause.PROGRAM or event.exit_code != 0:
        job.lost_attempt = None
        return True
    if event.rank in lost.exited_zero:
        return True
    ranks = tuple(sorted((*lost.exited_zero, event.rank)))
    if len(ranks) < len(lost.nodes):
        job.lost_attempt = dataclasses.replace(lost, exited_zero=ranks)
        return True
    live = job.live_attempt()
    if live is not None:
        touched.update(m.node_id for m in live.members)
        _end_attempt(
            state,
            job,
            lc.AttemptEvent.STOP,
            reason(
                ReasonCode.EARLIER_ATTEMPT_SUCCEEDED,
                attempt=lost.number,
                fencing_token=lost.fencing_token,
            ),
            now,
        )
    _finish(
        job,
        lc.JobEvent.LATE_SUCCESS,
        reason(
            ReasonCode.SUCCEEDED_AFTER_NODE_DEATH,
            attempt=lost.number,
            fencing_token=lost.fencing_token,
            members=len(lost.nodes),
            node=lost.node_id,
        ),
        now,
    )
    return True


def _fail_attempt(state: ClusterState, c: cmd.FailAttempt, now: int) -> Result:
    job = state.jobs.get(c.job_id)
    if job is None:
        return error(ResultCode.NOT_FOUND, f"no job {c.job_id!r}")
    attempt = job.live_attempt()
    if attempt is None or attempt.fencing_token != c.fencing_token:
        return error(ResultCode.CONFLICT, f"{c.job_id}: token {c.fencing_token} is not current")
    if attempt.preempted_by:
        if c.reason.code is ReasonCode.START_TIMEOUT:
            return error(
                ResultCode.CONFLICT,
                f"{c.job_id} is being preempted; its members stop within their grace period",
            )
        # The attempt was leaving anyway: it ends as preempted, not as a failure.
        _end_preempted(state, job, now)
        _settle_drained(state, sorted({m.node_id for m in attempt.members}))
        return ok(f"{c.job_id} attempt {attempt.number} ended (preempted)", job_id=c.job_id)
    if c.reason.code is ReasonCode.START_TIMEOUT:
        late = not_started_members(job)
        if not late:
            return error(ResultCode.CONFLICT, f"{c.job_id}: every member has started")
        if now < attempt.bound_at_ms + state.config.start_timeout_ms:
            return error(ResultCode.CONFLICT, f"{c.job_id} has not reached its start timeout")
    _end_attempt_for(state, job, c.reason, c.jitter_seed, now)
    _settle_drained(state, sorted({m.node_id for m in attempt.members}))
    return ok(f"{c.job_id} attempt {attempt.number} failed", job_id=c.job_id)


def not_started_members(job: Job) -> list[int]:
    """Ranks of the job's live attempt not reported running (nor exited) yet."""
    attempt = job.live_attempt()
    if attempt is None:
        return []
    return [r for r, s in enumerate(attempt.member_status) if s.state is MemberState.BOUND]


def start_timeout_reason(state: ClusterState, job: Job) -> Reason:
    """The ``START_TIMEOUT`` outcome naming the live attempt's members not yet running."""
    attempt = job.live_attempt()
    late = not_started_members(job)
    nodes = sorted({attempt.members[r].node_id for r in late}) if attempt is not None else []
    return reason(
        ReasonCode.START_TIMEOUT,
        ranks=ranks_text(late),
        nodes=", ".join(nodes[:8]) + (", ..." if len(nodes) > 8 else ""),
        timeout_ms=state.config.start_timeout_ms,
    )


def _expire_time_limit(state: ClusterState, c: cmd.ExpireTimeLimit, now: int) -> Result:
    job = state.jobs.get(c.job_id)
    if job is None:
        return error(ResultCode.NOT_FOUND, f"no job {c.job_id!r}")
    attempt = job.live_attempt()
    if attempt is None or attempt.fencing_token != c.fencing_token:
        return error(ResultCode.CONFLICT, f"{c.job_id}: token {c.fencing_token} is not current")
    deadline = time_limit_deadline(job)
    if deadline is None or now < deadline:
        return error(ResultCode.CONFLICT, f"{c.job_id} has not reached its time limit")
    limit = job.spec.time_limit_ms
    nodes = sorted({m.node_id for m in attempt.members})
    _end_attempt(
        state, job, lc.AttemptEvent.STOP, reason(ReasonCode.TIME_LIMIT, limit_ms=limit), now
    )
    _finish(job, lc.JobEvent.FAIL, reason(ReasonCode.FAILED_TIME_LIMIT, limit_ms=limit), now)
    _settle_drained(state, nodes)
    return ok(f"{c.job_id} stopped at its time limit", job_id=c.job_id)


def _purge_finished(state: ClusterState, c: cmd.PurgeFinished, now: int) -> Result:
    horizon = now - state.config.retention_ms
    gone = sorted(
        job.job_id
        for job in state.jobs.values()
        if job.state.finished and job.finished_at_ms <= horizon
    )
    for job_id in gone:
        job = state.jobs.pop(job_id)
        if state.request_ids.get(job.request_id) == job_id:
            del state.request_ids[job.request_id]
    return ok(f"purged {len(gone)} finished job(s)", purged=tuple(gone))


# ------------------------------------------------------------------------------ helpers


def _end_attempt(
    state: ClusterState, job: Job, event: lc.AttemptEvent, outcome: Reason, now: int
) -> None:
    """Release everything the live attempt holds and record how it ended."""
    attempt = job.attempt
    assert attempt is not None
    attempt.state = move(ATTEMPT, attempt.state, event)
    for member in attempt.members:
        node = state.nodes.get(member.node_id)
        if node is not None:
            node.allocated = node.allocated - job.spec.resources
            node.allocated_gpus.difference_update(member.gpus)
    master = state.nodes.get(attempt.members[0].node_id)
    if master is not None:
        ports = master.master_ports
        i = bisect.bisect_left(ports, attempt.master_port)
        if i < len(ports) and ports[i] == attempt.master_port:
            del ports[i]
    attempt.ended_at_ms = now
    attempt.outcome = outcome
    # Fair share: the queue's decayed usage grows by what this attempt held, for as long.
    queue = job.spec.queue
    new = queue not in state.queue_history
    state.queue_history[queue] = add_usage(
        state.queue_history.get(queue),
        gang_request(job.spec),
        now - attempt.bound_at_ms,
        now,
        state.config.fair_share_half_life_ms,
    )
    if new:
        state.queue_history = dict(sorted(state.queue_history.items()))


def _finish(job: Job, event: lc.JobEvent, why: Reason, now: int) -> None:
    job.state = move(JOB, job.state, event)
    job.reason = why
    job.finished_at_ms = now
    job.lost_attempt = None  # kept only while the job is not final


def retry_delay_ms(spec: JobSpec, attempt_number: int, seed: int, job_id: str) -> int:
    """Exponential back-off with full jitter, deterministic for a given seed."""
    policy = spec.retries
    cap = min(policy.max_backoff_ms, policy.backoff_ms * 2 ** min(attempt_number - 1, 40))
    return random.Random(f"{seed}:{job_id}:{attempt_number}").randint(0, max(cap, 0))


def _end_attempt_for(state: ClusterState, job: Job, outcome: Reason, seed: int, now: int) -> None:
    """End the live attempt as ``outcome`` says: a disruption requeues the gang, anything
    else is the job's own failure and retries it."""
    if outcome.code in REQUEUE_CODES:
        _requeue_attempt(state, job, outcome, now)
    else:
        _fail_attempt_and_retry(state, job, outcome, seed, now)


def _requeue_attempt(state: ClusterState, job: Job, cause: Reason, now: int) -> None:
    """Stop the whole gang after a disruption it did not cause (node death, fencing, a
    lost member; later preemption) and queue it again as a new attempt.

    The requeue does not touch ``retries.max`` and has no back-off: the gang keeps its
    place in line (its submission order) and may bind again at the next pass, once every
    member of this attempt is confirmed stopped (the fencing rule of
    :func:`unconfirmed_members`). Its locality wait counts from the requeue. A job
    already requeued ``max_requeues`` times fails instead: something about it keeps
    taking its nodes down.
    """
    attempt = job.attempt
    assert attempt is not None
    _end_attempt(state, job, lc.AttemptEvent.REQUEUE, cause, now)
    limit = state.config.max_requeues
    if job.requeues >= limit:
        _finish(
            job,
            lc.JobEvent.FAIL,
            reason(
                ReasonCode.FAILED_MAX_REQUEUES,
                cause,
                attempt=attempt.number,
                requeues=job.requeues,
                max_requeues=limit,
            ),
            now,
        )
        return
    job.requeues += 1
    job.state = move(JOB, job.state, lc.JobEvent.REQUEUE)
    job.retry_not_before_ms = now
    job.reason = reason(
        REQUEUE_CODES[cause.code],
        cause,
        attempt=attempt.number,
        requeue=job.requeues,
        max_requeues=limit,
    )


def _end_preempted(state: ClusterState, job: Job, now: int) -> None:
    """End a preempted attempt whose members are confirmed stopped (or whose node died):
    its resources are released only now, and the gang goes back to PENDING keeping its
    submission order, counted against neither ``retries.max`` nor ``max_requeues``."""
    attempt = job.attempt
    assert attempt is not None and attempt.preemption is not None
    outcome = reason(
        ReasonCode.PREEMPTED, preemptor=attempt.preempted_by, kind=attempt.preemption.value
    )
    _end_attempt(state, job, lc.AttemptEvent.REQUEUE, outcome, now)
    job.state = move(JOB, job.state, lc.JobEvent.REQUEUE)
    job.retry_not_before_ms = now
    job.reason = reason(
        ReasonCode.REQUEUED_PREEMPTED,
        outcome,
        attempt=attempt.number,
        preemptor=attempt.preempted_by,
        kind=attempt.preemption.value,
    )


def _fail_attempt_and_retry(
    state: ClusterState, job: Job, why: Reason, seed: int, now: int
) -> None:
    """Stop the whole gang; retry it as a new attempt later, or fail the job for good."""
    _end_attempt(state, job, lc.AttemptEvent.FAIL, why, now)
    number = job.attempts_made
    if job.retries_used < job.spec.retries.max_retries:
        delay = retry_delay_ms(job.spec, number, seed, job.job_id)
        job.retries_used += 1
        job.state = move(JOB, job.state, lc.JobEvent.RETRY)
        job.retry_not_before_ms = now + delay
        job.reason = reason(
            ReasonCode.RETRY_BACKOFF,
            why,
            attempt=number,
            retry=job.retries_used,
            retries=job.spec.retries.max_retries,
            backoff_ms=delay,
        )
    else:
        code = FAILURE_CODES.get(why.code, ReasonCode.FAILED_ATTEMPT)
        _finish(
            job, lc.JobEvent.FAIL, reason(code, why, attempt=number, retries=job.retries_used), now
        )


def _settle_drained(state: ClusterState, node_ids: Iterable[str]) -> None:
    """Draining nodes among ``node_ids`` that hold no members any more become cordoned.

    A node holds members while a live attempt has one on it, or an ended attempt has one
    on it not yet confirmed stopped. Called wherever members leave a node.
    """
    for node_id in node_ids:
        node = state.nodes.get(node_id)
        if node is None or node.status is not NodeStatus.DRAINING:
            continue
        if node.allocated != ZERO or node.allocated_gpus or _has_unconfirmed(state, node_id):
            continue
        node.status = move(NODE, node.status, lc.NodeEvent.EMPTIED)


def _has_unconfirmed(state: ClusterState, node_id: str) -> bool:
    for job in state.jobs.values():
        attempt = job.attempt
        if attempt is None or attempt.ended_at_ms is None:
            continue
        for member, status in zip(attempt.members, attempt.member_status, strict=True):
            if member.node_id == node_id and status.state is not MemberState.EXITED:
                return True
    return False


# ----------------------------------------------------------------------------- tokens


def _create_token(state: ClusterState, c: cmd.CreateToken, now: int) -> Result:
    violations = check_token(c.token_id, c.user, c.role, c.queues, c.secret_sha256, c.expires_at_ms)
    violations += check_priority_allowance(c.priority_classes, c.max_priority)
    if not c.token_id:
        violations.insert(0, Violation(ViolationCode.REQUIRED, "token_id", "is required"))
    if violations:
        return error(ResultCode.INVALID, describe(violations))
    if c.token_id in state.tokens:
        return error(ResultCode.CONFLICT, f"token {c.token_id} exists already")
    if c.expires_at_ms and c.expires_at_ms <= now:
        return error(ResultCode.INVALID, "expires_at_ms: must be later than now")
    state.tokens[c.token_id] = Token(
        token_id=c.token_id,
        user=c.user,
        role=c.role,
        secret_sha256=c.secret_sha256,
        created_at_ms=now,
        created_by=c.actor,
        queues=tuple(c.queues),
        expires_at_ms=c.expires_at_ms,
        priority_classes=tuple(c.priority_classes),
        max_priority=c.max_priority,
    )
    return ok(f"token {c.token_id} created for {c.user} (role {c.role})")


def _revoke_token(state: ClusterState, c: cmd.RevokeToken, now: int) -> Result:
    token = state.tokens.get(c.token_id)
    if token is None:
        return error(ResultCode.NOT_FOUND, f"no token {c.token_id!r}")
    if token.revoked_at_ms:
        return ok(f"token {c.token_id} was already revoked")
    # 0 means live, so a revocation at time 0 (only ever in tests) is recorded as 1.
    revoked = dataclasses.replace(token, revoked_at_ms=max(now, 1), revoked_by=c.actor)
    state.tokens[c.token_id] = revoked
    return ok(f"token {c.token_id} revoked")


# ----------------------------------------------------------------------------- queues


def _set_queue(state: ClusterState, c: cmd.SetQueue, now: int) -> Result:
    violations = check_queue(c.queue, state.config.priority_classes)
    violations += check_priority_allowance((), c.queue.max_priority)
    if c.queue.name == DEFAULT_QUEUE and c.queue.cohort:
        violations.append(Violation(ViolationCode.INVALID_FIELD, "cohort", "not for default"))
    if violations:
        return error(ResultCode.INVALID, describe(violations))
    existed = c.queue.name in state.queues
    state.queues[c.queue.name] = c.queue
    state.queues = dict(sorted(state.queues.items()))
    return ok(f"queue {c.queue.name} {'updated' if existed else 'created'}")


def _delete_queue(state: ClusterState, c: cmd.DeleteQueue, now: int) -> Result:
    if c.name == DEFAULT_QUEUE:
        return error(ResultCode.CONFLICT, "the default queue cannot be deleted")
    if c.name not in state.queues:
        return error(ResultCode.NOT_FOUND, f"no queue {c.name!r}")
    using = sorted(
        job.job_id
        for job in state.jobs.values()
        if not job.state.finished and job.spec.queue == c.name
    )
    if using:
        shown = ", ".join(using[:5]) + (" ..." if len(using) > 5 else "")
        return error(
            ResultCode.CONFLICT,
            f"queue {c.name} still has {len(using)} unfinished job(s): {shown}",
        )
    del state.queues[c.name]
    return ok(f"queue {c.name} deleted")


# --------------------------------------------------------------------------- preemption


def _preempt(state: ClusterState, c: cmd.Preempt, now: int) -> Result:
    """Mark every victim's live attempt as preempted for ``c.preemptor``, or nothing.

    Verified whole: preemption is on; the preemptor is pending and planned against its
    current attempt count; each victim is named once, is live with the named fencing
    token and not already being preempted; and ``c.kind`` allows each victim:

    * ``PRIORITY``: the preemptor's class ``preempts``; every victim is of the same queue
      and of strictly lower priority.
    * ``RECLAIM``: the preemptor's queue has a quota and a cohort and stays within its
      nominal after taking the gang (counting its other gangs waiting for victims); every
      victim is of another queue of that cohort, which is above its nominal and stays at
      or above it once every victim of this command and earlier ones has stopped.

    These rules make thrashing impossible: a victim is always of strictly lower
    priority, or of a queue that is borrowing, and a reclaim never takes the preemptor's
    queue above nominal, so a reclaimed gang can never reclaim back.
    """
    if state.config.preemption is PreemptionMode.OFF:
        return error(ResultCode.CONFLICT, "preemption is off in the cluster configuration")
    preemptor = state.jobs.get(c.preemptor)
    if preemptor is None:
        return error(ResultCode.NOT_FOUND, f"no job {c.preemptor!r}")
    if preemptor.state is not JobState.PENDING:
        return error(ResultCode.CONFLICT, f"{c.preemptor} is {preemptor.state.value}, not PENDING")
    if preemptor.attempts_made != c.preemptor_attempts_made:
        return error(ResultCode.CONFLICT, f"{c.preemptor}: stale plan")
    if not c.victims:
        return error(ResultCode.INVALID, "victims: at least one is needed")
    names = [v.job_id for v in c.victims]
    if len(set(names)) != len(names):
        return error(ResultCode.INVALID, "victims: a job appears twice")
    if c.preemptor in names:
        return error(ResultCode.INVALID, "victims: the preemptor cannot be its own victim")
    victims: list[Job] = []
    for v in c.victims:
        job = state.jobs.get(v.job_id)
        attempt = job.live_attempt() if job is not None else None
        if job is None or attempt is None or attempt.fencing_token != v.fencing_token:
            return error(
                ResultCode.CONFLICT, f"victim {v.job_id}: token {v.fencing_token} is not live"
            )
        if attempt.preempted_by:
            return error(
                ResultCode.CONFLICT,
                f"victim {v.job_id} is already being preempted by {attempt.preempted_by}",
            )
        victims.append(job)
    spec = preemptor.spec
    if c.kind is PreemptionKind.PRIORITY:
        cls = priority_class(state.config, spec.priority_class)
        if cls is None or not cls.preempts:
            return error(
                ResultCode.CONFLICT,
                f"{c.preemptor}: its priority class {spec.priority_class or '(none)'} "
                f"does not preempt",
            )
        for job in victims:
            if job.spec.queue != spec.queue:
                return error(
                    ResultCode.CONFLICT,
                    f"victim {job.job_id} is in queue {job.spec.queue}, not {spec.queue}: "
                    f"priority preemption stays within one queue",
                )
            if job.spec.priority >= spec.priority:
                return error(
                    ResultCode.CONFLICT,
                    f"victim {job.job_id} has priority {job.spec.priority}, "
                    f"not below {spec.priority}",
                )
    else:
        problem = _reclaim_problem(state, preemptor, victims)
        if problem:
            return error(ResultCode.CONFLICT, problem)
    for job in victims:
        attempt = job.attempt
        assert attempt is not None
        grace = grace_ms(state.config, job.spec)
        attempt.preempted_by = c.preemptor
        attempt.preemption = c.kind
        attempt.preempt_deadline_ms = now + grace
        job.reason = reason(
            ReasonCode.PREEMPTING,
            preemptor=c.preemptor,
            kind=c.kind.value,
            grace_ms=grace,
            deadline_ms=now + grace,
        )
    preemptor.reason = reason(
        ReasonCode.WAITING_FOR_VICTIMS,
        count=len(victims),
        kind=c.kind.value,
        victims=", ".join(names),
    )
    return ok(
        f"{c.preemptor} preempts {len(victims)} gang(s) ({c.kind.value})",
        job_id=c.preemptor,
        stopped=tuple(names),
    )


def _reclaim_problem(state: ClusterState, preemptor: Job, victims: list[Job]) -> str:
    """Why a reclaim of ``victims`` for ``preemptor`` breaks the rules; "" if it does not."""
    spec = preemptor.spec
    queue = state.queues.get(spec.queue)
    if queue is None or queue.gpu is None or not queue.cohort:
        return f"queue {spec.queue} has no quota in a cohort: it cannot reclaim"
    # What each queue keeps once the gangs already being preempted have stopped, plus
    # what the other gangs waiting for their victims will take.
    keeps = QueueUsage.of(state, counting_preempted=False)
    claimed: set[str] = set()
    for job in state.jobs.values():
        attempt = job.live_attempt()
        if attempt is not None and attempt.preempted_by and attempt.preempted_by not in claimed:
            claimed.add(attempt.preempted_by)
            waiting = state.jobs.get(attempt.preempted_by)
            if (
                waiting is not None
                and waiting.state is JobState.PENDING
                and waiting is not preemptor
            ):
                keeps.add(waiting.spec.queue, gang_request(waiting.spec))
    need = gang_request(spec).gpu
    if not keeps.within_nominal(spec.queue, need):
        return (
            f"queue {spec.queue} would use {keeps.used(spec.queue).gpu + need} of its "
            f"{queue.gpu} nominal GPUs: a reclaim must keep it within its nominal quota"
        )
    for job in victims:
        other = state.queues.get(job.spec.queue)
        if job.spec.queue == spec.queue or other is None or other.cohort != queue.cohort:
            return f"victim {job.job_id} is not in another queue of cohort {queue.cohort}"
        keeps.remove(job.spec.queue, gang_request(job.spec))
    for name in sorted({job.spec.queue for job in victims}):
        nominal = state.queues[name].gpu
        if nominal is None or keeps.used(name).gpu < nominal:
            return (
                f"queue {name} would fall below its nominal quota: a reclaim takes only "
                f"what a queue borrows"
            )
    return ""


_HANDLERS: dict[type, Callable[[ClusterState, Any, int], Result]] = {
    cmd.Configure: _configure,
    cmd.Barrier: _barrier,
    cmd.RegisterNode: _register_node,
    cmd.SetNodeStatus: _set_node_status,
    cmd.MarkNodeDead: _mark_node_dead,
    cmd.SubmitJob: _submit_job,
    cmd.CancelJob: _cancel_job,
    cmd.BindPlan: _bind_plan,
    cmd.ReportMembers: _report_members,
    cmd.FailAttempt: _fail_attempt,
    cmd.ExpireTimeLimit: _expire_time_limit,
    cmd.PurgeFinished: _purge_finished,
    cmd.CreateToken: _create_token,
    cmd.RevokeToken: _revoke_token,
    cmd.SetQueue: _set_queue,
    cmd.DeleteQueue: _delete_queue,
    cmd.Preempt: _preempt,
}
