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
import random
from collections.abc import Callable
from typing import Any

from synapse_ha.core import commands as cmd
from synapse_ha.core.commands import Result, ResultCode, error, ok
from synapse_ha.core.model import (
    MAX_LOCALITY_WAIT_MS,
    Attempt,
    ClusterConfig,
    ClusterState,
    Job,
    JobSpec,
    JobState,
    MemberState,
    MemberStatus,
    Node,
    NodeInfo,
    NodeStatus,
    Resources,
    topology_path,
)
from synapse_ha.core.topology import domain_at
from synapse_ha.core.validation import check_job_spec, check_node_info, describe

FEATURE_IMAGES = "images"  # a node that can run jobs naming a container image


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
    if problems:
        return error(ResultCode.INVALID, "; ".join(problems))
    state.config = c.config
    return ok("configured")


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
    if node.status is NodeStatus.DEAD:
        node.status = NodeStatus.READY
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
    )


def _set_node_status(state: ClusterState, c: cmd.SetNodeStatus, now: int) -> Result:
    node = state.nodes.get(c.node_id)
    if node is None:
        return error(ResultCode.NOT_FOUND, f"no node {c.node_id!r}")
    if c.status is NodeStatus.DEAD:
        return error(ResultCode.INVALID, "use MarkNodeDead to declare a node dead")
    if node.status is NodeStatus.DEAD:
        return error(ResultCode.CONFLICT, f"node {c.node_id} is dead; it must register again")
    node.status = c.status
    node.status_reason = c.reason
    return ok(f"node {c.node_id} is {c.status.value}")


def _mark_node_dead(state: ClusterState, c: cmd.MarkNodeDead, now: int) -> Result:
    node = state.nodes.get(c.node_id)
    if node is None:
        return error(ResultCode.NOT_FOUND, f"no node {c.node_id!r}")
    if node.status is NodeStatus.DEAD:
        return ok(f"node {c.node_id} was already dead")
    node.status = NodeStatus.DEAD
    node.status_reason = c.reason or "declared dead"
    affected = sorted(
        job.job_id
        for job in state.jobs.values()
        if (attempt := job.live_attempt()) is not None
        and any(m.node_id == c.node_id for m in attempt.members)
    )
    for job_id in affected:
        _fail_attempt_and_retry(
            state,
            state.jobs[job_id],
            f"node {c.node_id} was declared dead ({node.status_reason})",
            c.jitter_seed,
            now,
        )
    # Members on a dead node are gone: its worker fenced itself before the node was
    # declared dead (dead_timeout > lease_ttl + leader_step_down).
    for job_id in sorted(state.jobs):
        attempt = state.jobs[job_id].attempt
        if attempt is None or attempt.ended_at_ms is None:
            continue
        for member, status in zip(attempt.members, attempt.member_status, strict=True):
            if member.node_id == c.node_id and status.state is not MemberState.EXITED:
                status.state = MemberState.EXITED
                status.finished_at_ms = now
    return ok(f"node {c.node_id} is dead; {len(affected)} gang(s) stopped", bound=tuple(affected))


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
    seq = state.next_job_seq
    job_id = f"job-{seq:06d}"
    state.next_job_seq = seq + 1
    state.jobs[job_id] = Job(
        job_id=job_id, spec=c.spec, request_id=c.request_id, seq=seq, submitted_at_ms=now
    )
    state.request_ids[c.request_id] = job_id
    return ok(f"submitted {job_id}", job_id=job_id, created=True)


def _cancel_job(state: ClusterState, c: cmd.CancelJob, now: int) -> Result:
    job = state.jobs.get(c.job_id)
    if job is None:
        return error(ResultCode.NOT_FOUND, f"no job {c.job_id!r}")
    if job.state is JobState.CANCELLED:
        return ok(f"{c.job_id} was already cancelled", job_id=c.job_id)
    if job.state.finished:
        return error(ResultCode.CONFLICT, f"{c.job_id} already finished as {job.state.value}")
    if job.live_attempt() is not None:
        _end_attempt(state, job, f"cancelled: {c.reason}", now)
    _finish(job, JobState.CANCELLED, c.reason, now)
    return ok(f"{c.job_id} cancelled", job_id=c.job_id)


# ----------------------------------------------------------------------------- binding


def _bind_plan(state: ClusterState, c: cmd.BindPlan, now: int) -> Result:
    bound: list[str] = []
    rejected: list[tuple[str, str]] = []
    for placement in c.placements:
        problem = verify_placement(state, placement, now)
        if problem:
            rejected.append((placement.job_id, problem))
        else:
            _bind(state, placement, now)
            bound.append(placement.job_id)
    for job_id, reason in c.reasons:
        job = state.jobs.get(job_id)
        if job is not None and job.state is JobState.PENDING:
            job.reason = reason
    return ok(
        f"bound {len(bound)} gang(s), rejected {len(rejected)}",
        bound=tuple(bound),
        rejected=tuple(rejected),
    )


def verify_placement(state: ClusterState, p: cmd.GangPlacement, now: int) -> str:
    """Why ``p`` cannot be bound to ``state`` now, or ``""`` when it can (whole gang)."""
    job = state.jobs.get(p.job_id)
    if job is None:
        return "no such job"
    if job.state is not JobState.PENDING:
        return f"job is {job.state.value}, not PENDING"
    if job.attempts_made != p.attempts_made:
        return f"stale plan: planned for attempt {p.attempts_made + 1}"
    if now < job.retry_not_before_ms:
        return "job is still in its retry back-off"
    if unconfirmed_members(job):
        return "members of the previous attempt have not been confirmed stopped"
    spec = job.spec
    if len(p.members) != spec.replicas:
        return f"plan has {len(p.members)} members, job needs {spec.replicas}"
    per_node: dict[str, Resources] = {}
    gpus_taken: dict[str, set[int]] = {}
    for rank, member in enumerate(p.members):
        if member.rank != rank:
            return f"member ranks must be 0..{spec.replicas - 1} in order"
        node = state.nodes.get(member.node_id)
        if node is None:
            return f"rank {rank}: no node {member.node_id!r}"
        if not node.schedulable():
            return f"rank {rank}: node {member.node_id} is {node.status.value}"
        if spec.image and FEATURE_IMAGES not in node.info.features:
            return f"rank {rank}: node {member.node_id} cannot run container images"
        if len(member.gpus) != spec.resources.gpu:
            return f"rank {rank}: {len(member.gpus)} GPUs given, {spec.resources.gpu} needed"
        taken = gpus_taken.setdefault(member.node_id, set())
        for gpu in member.gpus:
            if not 0 <= gpu < node.info.capacity.gpu:
                return f"rank {rank}: node {member.node_id} has no GPU {gpu}"
            if gpu in node.allocated_gpus or gpu in taken:
                return f"rank {rank}: GPU {gpu} on {member.node_id} is already in use"
            taken.add(gpu)
        per_node[member.node_id] = per_node.get(member.node_id, Resources()) + spec.resources
    for node_id, request in sorted(per_node.items()):
        node = state.nodes[node_id]
        if not request.fits_in(node.free):
            return (
                f"node {node_id} no longer fits: needs {request.describe()}, "
                f"has {node.free.describe()} free"
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
            return f"members span {len(domains)} {level}s; the job requires one"
    return ""


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
    job.state = JobState.SCHEDULED
    hosts = len({m.node_id for m in p.members})
    job.reason = (
        f"attempt {job.attempts_made} bound to {hosts} node(s); waiting for members to start"
    )


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
    for event in c.events:
        job = state.jobs.get(event.job_id)
        if job is not None and _confirm_stopped(job, c.node_id, event, now):
            accepted += 1
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
        if status.started_at_ms is None:
            status.started_at_ms = now
        if attempt.started_at_ms is None:
            attempt.started_at_ms = now
        if job.state is JobState.SCHEDULED:
            job.state = JobState.RUNNING
            job.reason = f"attempt {attempt.number} running"
        if event.kind is cmd.MemberEventKind.STARTED:
            status.state = MemberState.RUNNING
            continue
        status.state = MemberState.EXITED
        status.exit_code = event.exit_code
        status.finished_at_ms = now
        if event.exit_code != 0:
            detail = f": {event.detail}" if event.detail else ""
            _fail_attempt_and_retry(
                state,
                job,
                f"rank {event.rank} on {c.node_id} exited with code {event.exit_code}{detail}",
                c.jitter_seed,
                now,
            )
        elif all(s.state is MemberState.EXITED and s.exit_code == 0 for s in attempt.member_status):
            _end_attempt(state, job, "succeeded", now)
            _finish(job, JobState.SUCCEEDED, f"all {len(attempt.members)} members exited 0", now)
    return ok(
        f"{accepted} event(s) accepted, {stale} stale", accepted_events=accepted, stale_events=stale
    )


def unconfirmed_members(job: Job) -> list[int]:
    """Ranks of the job's ended attempt not yet known to have stopped.

    A job whose attempt failed is not bound again until every member of that attempt
    has reported its exit or its node was declared dead (which happens only after the
    node's lease has run out and its worker fenced itself). Otherwise a member still
    being stopped on one node could overlap the next attempt on another.
    """
    attempt = job.attempt
    if attempt is None or attempt.ended_at_ms is None or job.state.finished:
        return []
    return [
        rank for rank, s in enumerate(attempt.member_status) if s.state is not MemberState.EXITED
    ]


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
        status.state = MemberState.EXITED
        status.exit_code = event.exit_code
        status.finished_at_ms = now
    return True


def _fail_attempt(state: ClusterState, c: cmd.FailAttempt, now: int) -> Result:
    job = state.jobs.get(c.job_id)
    if job is None:
        return error(ResultCode.NOT_FOUND, f"no job {c.job_id!r}")
    attempt = job.live_attempt()
    if attempt is None or attempt.fencing_token != c.fencing_token:
        return error(ResultCode.CONFLICT, f"{c.job_id}: token {c.fencing_token} is not current")
    _fail_attempt_and_retry(state, job, c.reason, c.jitter_seed, now)
    return ok(f"{c.job_id} attempt {attempt.number} failed", job_id=c.job_id)


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
    limit_s = job.spec.time_limit_ms // 1000
    _end_attempt(state, job, "time limit exceeded", now)
    _finish(job, JobState.FAILED, f"time limit of {limit_s}s exceeded", now)
    return ok(f"{c.job_id} stopped at its time limit", job_id=c.job_id)


def time_limit_deadline(job: Job) -> int | None:
    """When the live attempt of ``job`` must be stopped, or None without a limit."""
    attempt = job.live_attempt()
    if attempt is None or job.spec.time_limit_ms <= 0:
        return None
    start = attempt.bound_at_ms if attempt.started_at_ms is None else attempt.started_at_ms
    return start + job.spec.time_limit_ms


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
    return ok(f"purged {len(gone)} finished job(s)", bound=tuple(gone))


# ------------------------------------------------------------------------------ helpers


def _end_attempt(state: ClusterState, job: Job, outcome: str, now: int) -> None:
    """Release everything the live attempt holds and record how it ended."""
    attempt = job.attempt
    assert attempt is not None
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


def _finish(job: Job, final: JobState, reason: str, now: int) -> None:
    job.state = final
    job.reason = reason
    job.finished_at_ms = now


def retry_delay_ms(spec: JobSpec, attempt_number: int, seed: int, job_id: str) -> int:
    """Exponential back-off with full jitter, deterministic for a given seed."""
    policy = spec.retries
    cap = min(policy.max_backoff_ms, policy.backoff_ms * 2 ** min(attempt_number - 1, 40))
    return random.Random(f"{seed}:{job_id}:{attempt_number}").randint(0, max(cap, 0))


def _fail_attempt_and_retry(state: ClusterState, job: Job, why: str, seed: int, now: int) -> None:
    """Stop the whole gang; retry it as a new attempt later, or fail the job for good."""
    _end_attempt(state, job, f"failed: {why}", now)
    number = job.attempts_made
    retries_used = number - 1
    if retries_used < job.spec.retries.max_retries:
        delay = retry_delay_ms(job.spec, number, seed, job.job_id)
        job.state = JobState.PENDING
        job.retry_not_before_ms = now + delay
        job.reason = (
            f"attempt {number} failed ({why}); retry {retries_used + 1} of "
            f"{job.spec.retries.max_retries} after a {delay / 1000:.1f}s back-off"
        )
    else:
        retries = job.spec.retries.max_retries
        _finish(
            job, JobState.FAILED, f"attempt {number} failed ({why}); {retries} retries used", now
        )


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
}
