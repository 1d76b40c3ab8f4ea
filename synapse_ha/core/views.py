"""Read-only questions the control plane asks of the state: what should run where,
and which time limits and start timeouts are due. Pure functions of a snapshot."""

from __future__ import annotations

from operator import attrgetter

from synapse_ha.core.commands import ExpireDeadline, ExpireTimeLimit, FailAttempt
from synapse_ha.core.desired import DesiredMember, LaunchSpec
from synapse_ha.core.job_predicates import membership_signal, time_limit_deadline
from synapse_ha.core.model import (
    Attempt,
    ClusterState,
    Job,
    JobState,
    MemberState,
    unconfirmed_members,
)
from synapse_ha.core.reasons import Reason, ReasonCode, ranks_text, reason
from synapse_ha.core.replacement import leaving
from synapse_ha.core.workflows.windows import resolved


def not_started_members(job: Job, now_ms: int | None = None, timeout_ms: int = 0) -> list[int]:
    """Ranks of the job's live attempt not reported running (nor exited) yet, leaving out
    ranks being placed again; with ``now_ms``, only those bound ``timeout_ms`` or more
    before it (a rank placed again counts from its own bind)."""
    attempt = job.live_attempt()
    if attempt is None:
        return []
    vacant = {v.rank for v in attempt.vacancies} if attempt.vacancies else ()
    return [
        r
        for r, s in enumerate(attempt.member_status)
        if s.state is MemberState.BOUND
        and r not in vacant
        and (
            now_ms is None
            or now_ms
            >= (attempt.bound_at_ms if s.bound_at_ms is None else s.bound_at_ms) + timeout_ms
        )
    ]


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


def desired_by_node(state: ClusterState) -> dict[str, list[DesiredMember]]:
    """What every node should be running: ``{node_id: members}`` for each node with
    members of a live attempt, each list ordered by (job id, rank). One pass over every
    job: a heartbeat asks :func:`desired_members` instead, which reads its node's jobs
    from the state's index."""
    wanted: dict[str, list[DesiredMember]] = {}
    for job_id in sorted(state.jobs):
        for member in job_desired(state, state.jobs[job_id]):
            wanted.setdefault(member.node_id, []).append(member.desired)
    return wanted


def desired_members(state: ClusterState, node_id: str) -> list[DesiredMember]:
    """Members ``node_id`` should run (of live attempts, and ended ones not yet known to
    have stopped), ordered by (job id, rank): ``desired_by_node(state)[node_id]``, at
    the cost of the node's own jobs (:meth:`ClusterState.jobs_on_node`)."""
    jobs = state.jobs
    return [
        member.desired
        for job_id in state.jobs_on_node(node_id)
        for member in job_desired(state, jobs[job_id], node_id)
    ]


class Placed:
    """A desired member and the node it is for."""

    __slots__ = ("desired", "node_id")

    def __init__(self, node_id: str, desired: DesiredMember) -> None:
        self.node_id = node_id
        self.desired = desired


def job_desired(state: ClusterState, job: Job, node_id: str | None = None) -> list[Placed]:
    """The members ``job`` wants run, in rank order, on ``node_id`` alone when given: every
    member of its live attempt, or (without one) the members of its ended attempt never
    reported running nor exited, marked ``ended``: without them in its desired list, a
    worker that never started such a member would never report it stopped, and the job
    would wait for it forever."""
    attempt = job.live_attempt()
    ended = attempt is None
    ending: set[int] = set()  # ranks wanted only to be confirmed stopped
    if ended:
        attempt = job.attempt
        ranks = unconfirmed_members(job)
        if attempt is None or not ranks:
            return []
        # Reported running: its worker knows it and reports its exit.
        picked = [r for r in ranks if attempt.member_status[r].state is MemberState.BOUND]
    else:
        assert attempt is not None
        picked = list(range(len(attempt.members)))
        if attempt.vacancies:  # a lost member is no longer wanted where it was
            vacant = {v.rank for v in attempt.vacancies}
            # ... but one never reported running stays, marked ended: its worker may
            # never have seen it, and must report it stopped (as for an ended attempt).
            status = attempt.member_status
            ending = {
                v.rank
                for v in attempt.vacancies
                if not v.stopped and status[v.rank].state is MemberState.BOUND
            }
            picked = [r for r in picked if r not in vacant or r in ending]
    members = attempt.members
    if node_id is not None:
        picked = [r for r in picked if members[r].node_id == node_id]
    if not picked:
        return []
    nodes = state.nodes
    hosts = tuple(
        nodes[m.node_id].info.address if m.node_id in nodes else m.node_id for m in members
    )
    launch = LaunchSpec.of(job.spec)  # shared by every member of the gang
    signal = membership_signal(job.spec)
    per_node: dict[str, int] = {}
    local_rank_of: list[int] = []
    for member in members:
        seen = per_node.get(member.node_id, 0)
        local_rank_of.append(seen)
        per_node[member.node_id] = seen + 1
    out = []
    for rank in picked:
        member = members[rank]
        gone = ended or rank in ending
        out.append(
            Placed(
                member.node_id,
                DesiredMember(
                    job_id=job.job_id,
                    attempt=attempt.number,
                    fencing_token=attempt.fencing_token,
                    rank=member.rank,
                    world_size=len(members),
                    local_rank=0 if gone else local_rank_of[rank],
                    local_world_size=1 if gone else per_node[member.node_id],
                    gpus=member.gpus,
                    master_addr=hosts[0],
                    master_port=attempt.master_port,
                    member_hosts=hosts,
                    spec=launch,
                    owner=job.owner,
                    preempt_deadline_ms=0 if gone else attempt.preempt_deadline_ms,
                    resume_step=None if gone else _resume_step(job, attempt, rank),
                    ended=gone,
                    generation=member.generation,
                    membership=attempt.membership,
                    membership_signal=signal,
                ),
            )
        )
    return out


def _resume_step(job: Job, attempt: Attempt, rank: int) -> int | None:
    """The step a member resumes from: a rank placed again or added to a running elastic
    gang (bound after its gang), from its gang's newest mark of this attempt when there is
    one; any other, from its job's newest attempt mark."""
    if attempt.member_status[rank].bound_at_ms is not None:
        mark = attempt.mark()
        if mark is not None and mark.step is not None:
            return mark.step
    return job.resume_step


def due_time_limits(state: ClusterState, now_ms: int) -> list[ExpireTimeLimit]:
    """Commands stopping every live attempt whose time limit has passed at ``now_ms``."""
    due = []
    for job in state.live_jobs():  # in job id order
        deadline = time_limit_deadline(job)
        if deadline is not None and now_ms >= deadline:
            due.append(ExpireTimeLimit(job.job_id, job.fencing_token, now_ms))
    return due


def due_replacement_timeouts(state: ClusterState, now_ms: int) -> list[FailAttempt]:
    """Commands requeueing every live attempt with a rank lost longer ago than its
    ``replace.timeout`` and still not placed again, in job id order (``jitter_seed`` 0)."""
    due = []
    for job in state.live_jobs():  # in job id order
        attempt = job.attempt
        if attempt is None or not attempt.vacancies or job.spec.replace is None:
            continue
        late = replace_timeout_reason(job, now_ms)
        if late is not None:
            due.append(FailAttempt(job.job_id, attempt.fencing_token, late, 0, now_ms))
    return due


def replace_timeout_reason(job: Job, now_ms: int) -> Reason | None:
    """The ``REPLACE_TIMEOUT`` outcome for the live attempt's ranks lost at least
    ``replace.timeout`` before ``now_ms``, or None when there is none."""
    attempt = job.live_attempt()
    policy = job.spec.replace
    if attempt is None or policy is None:
        return None
    late = [
        v for v in attempt.vacancies if now_ms >= v.since_ms + policy.timeout_ms and not leaving(v)
    ]
    if not late:
        return None
    return reason(
        ReasonCode.REPLACE_TIMEOUT,
        late[0].cause,
        ranks=ranks_text([v.rank for v in late]),
        timeout_ms=policy.timeout_ms,
    )


def due_deadlines(state: ClusterState, now_ms: int) -> list[ExpireDeadline]:
    """Commands cancelling every pending job whose deadline has passed at ``now_ms``."""
    due = []
    for job in state.jobs.values():
        spec = job.spec
        if (spec.deadline_at_ms or spec.deadline_delay_ms) and job.state is JobState.PENDING:
            deadline = resolved(spec.deadline_at_ms, spec.deadline_delay_ms, job.submitted_at_ms)
            if now_ms >= deadline:
                due.append(ExpireDeadline(job.job_id, now_ms))
    return sorted(due, key=attrgetter("job_id"))


def due_start_timeouts(state: ClusterState, now_ms: int) -> list[FailAttempt]:
    """Commands failing every live attempt with a member not reported running
    ``start_timeout_ms`` after the attempt was bound, in job id order. Each names the
    late ranks and their nodes; ``jitter_seed`` is 0 (the proposer fills in its own)."""
    timeout = state.config.start_timeout_ms
    due = []
    for job in state.live_jobs():  # in job id order
        attempt = job.attempt
        if attempt is None or now_ms < attempt.bound_at_ms + timeout or attempt.preempted_by:
            continue  # a preempted attempt stops within its grace period instead
        if not not_started_members(job, now_ms, timeout):
            continue
        due.append(
            FailAttempt(
                job.job_id, attempt.fencing_token, start_timeout_reason(state, job), 0, now_ms
            )
        )
    return due


def host_of(address: str) -> str:
    """The host part of ``host:port`` (``[v6]:port`` too); the address itself otherwise."""
    if address.startswith("["):
        return address[1 : address.find("]")] if "]" in address else address
    host, sep, port = address.rpartition(":")
    return host if sep and port.isdigit() else address
