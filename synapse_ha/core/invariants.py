"""Invariants of the cluster state, checked after every apply in tests and chaos runs.

``check(state)`` returns a list of violations, each a sentence; empty means healthy.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from synapse_ha.core.job_predicates import gang_sizes
from synapse_ha.core.machine.apply_dependencies import Outcome, outcome_of
from synapse_ha.core.member_counts import MemberCounts
from synapse_ha.core.model import (
    Attempt,
    ClusterState,
    Job,
    JobState,
    LostAttempt,
    MemberPlacement,
    MemberState,
    NodeStatus,
    Resources,
    occupies_slot,
)
from synapse_ha.core.queues.cohort_tree import MAX_COHORT_DEPTH, ancestors
from synapse_ha.core.replacement import leaving
from synapse_ha.core.spec.member_limits import reserved_of
from synapse_ha.core.workflows.arrays import task_id
from synapse_ha.core.workflows.checkpoints import mark_problems


@dataclass(slots=True)
class _Holdings:
    """What the live attempts' members hold on each node, summed job by job, for the
    nodes' own accounting to be compared with."""

    resources: dict[str, Resources]
    gpus: dict[str, set[int]]
    master_ports: dict[str, list[int]]

    @classmethod
    def empty(cls, state: ClusterState) -> _Holdings:
        return cls(
            {node_id: Resources() for node_id in state.nodes},
            {node_id: set() for node_id in state.nodes},
            {node_id: [] for node_id in state.nodes},
        )


def check(state: ClusterState) -> list[str]:
    """The invariants ``state`` breaks, each a sentence, job by job then node by node."""
    problems: list[str] = []
    held = _Holdings.empty(state)
    tokens: list[tuple[int, str]] = []
    judged: dict[tuple[str, str], Outcome | None] = {}  # (kind, target): its outcome
    for job_id, job in sorted(state.jobs.items()):
        attempt = job.attempt
        if attempt is not None:
            tokens.append((attempt.fencing_token, job_id))
            problems += _attempt_problems(state, job_id, job, attempt)
        problems += _count_problems(job_id, job)
        if job.lost_attempt is not None:
            problems += _lost_attempt_problems(job_id, job, job.lost_attempt)
        if job.state.holds_resources:
            problems += _holding_problems(state, job_id, job, held)
        elif attempt is not None and attempt.ended_at_ms is None:
            problems.append(f"{job_id}: {job.state.value} but attempt {attempt.number} never ended")
        if attempt is not None and attempt.held:
            problems += _held_problems(state, job_id, job, held)
        if job.waiting_for:
            problems += _waiting_problems(state, job_id, job, judged)
        if job.array_id:
            problems += _task_problems(state, job_id, job)
    problems += _array_problems(state)
    problems += _token_problems(tokens)
    problems += _node_problems(state, held)
    problems += _bookkeeping_problems(state)
    problems += _cohort_problems(state)
    problems += _member_problems(state)
    return problems


def _waiting_problems(
    state: ClusterState, job_id: str, job: Job, judged: dict[tuple[str, str], Outcome | None]
) -> list[str]:
    """A job waits only while pending, and only for dependencies that may still be met,
    each on a job or array that lists it among its dependants (which is how it is
    resolved). ``judged``: outcomes already worked out, by (kind, job or array)."""
    if job.state is not JobState.PENDING:
        return [f"{job_id}: {job.state.value} but still waits for {job.waiting_for}"]
    problems = []
    for kind, other_id in job.waiting_for:
        other = state.jobs.get(other_id) or state.arrays.get(other_id)
        if (kind, other_id) not in judged:
            judged[kind, other_id] = outcome_of(state, kind, other_id)
        if other is None:
            problems.append(f"{job_id}: waits ({kind}) for {other_id}, which does not exist")
        elif job_id not in other.dependants:
            problems.append(f"{job_id}: waits ({kind}) for {other_id}, not among its dependants")
        elif judged[kind, other_id] is not Outcome.WAITING:
            problems.append(f"{job_id}: still waits ({kind}) for {other_id}, already decided")
    return problems


def _task_problems(state: ClusterState, job_id: str, job: Job) -> list[str]:
    """A task is named after its array and index, and its array exists and lists it."""
    array = state.arrays.get(job.array_id)
    if array is None:
        return [f"{job_id}: a task of {job.array_id}, which does not exist"]
    if job_id != task_id(job.array_id, job.array_index) or job.array_index not in array.indices:
        return [f"{job_id}: not task {job.array_index} of {job.array_id}"]
    return []


def _array_problems(state: ClusterState) -> list[str]:
    """An array keeps at least one task, and no more of them occupy a slot than its
    throttle allows."""
    problems = []
    for array_id, array in sorted(state.arrays.items()):
        tasks = [state.jobs[t] for t in array.task_ids() if t in state.jobs]
        if not tasks:
            problems.append(f"{array_id}: an array without tasks")
        busy = sum(1 for task in tasks if occupies_slot(task))
        if array.throttle and busy > array.throttle:
            problems.append(f"{array_id}: {busy} tasks occupy slots, throttle {array.throttle}")
    return problems


def _attempt_problems(state: ClusterState, job_id: str, job: Job, attempt: Attempt) -> list[str]:
    """A job's attempt against the job: its token, number, state and outcome."""
    problems = []
    if attempt.fencing_token > state.last_fencing_token:
        problems.append(f"{job_id}: token {attempt.fencing_token} is beyond the last issued")
    if attempt.number != job.attempts_made:
        problems.append(f"{job_id}: attempt {attempt.number} of {job.attempts_made} made")
    if attempt.state.live != (attempt.ended_at_ms is None):
        problems.append(
            f"{job_id}: attempt {attempt.number} is {attempt.state.value} but "
            f"{'has not ended' if attempt.ended_at_ms is None else 'has ended'}"
        )
    if attempt.state.live != job.state.holds_resources:
        problems.append(f"{job_id}: {job.state.value} with attempt {attempt.state.value}")
    if attempt.ended_at_ms is not None and attempt.outcome is None:
        problems.append(f"{job_id}: attempt {attempt.number} ended without an outcome")
    problems += [f"{job_id}: {p}" for p in mark_problems(attempt.marks, len(attempt.members))]
    if any(m.at_ms < attempt.bound_at_ms for m in attempt.marks):
        problems.append(f"{job_id}: a checkpoint mark older than attempt {attempt.number}")
    mark = attempt.mark()
    ended = attempt.ended_at_ms is not None
    if ended and mark is not None and mark.step is not None and job.resume_step != mark.step:
        problems.append(
            f"{job_id}: attempt {attempt.number} marked step {mark.step}, "
            f"resumes from {job.resume_step}"
        )
    if job.resume_step is not None and job.resume_step < 0:
        problems.append(f"{job_id}: resumes from step {job.resume_step}")
    return problems


def _count_problems(job_id: str, job: Job) -> list[str]:
    """Every ended attempt was retried, requeued or ended the job: never more of those
    than attempts made, and never more retries than the job allows."""
    problems = []
    if job.retries_used + job.requeues > job.attempts_made:
        problems.append(
            f"{job_id}: {job.retries_used} retries and {job.requeues} requeues "
            f"from {job.attempts_made} attempts"
        )
    if job.retries_used > job.spec.retries.max_retries:
        problems.append(
            f"{job_id}: {job.retries_used} retries used of {job.spec.retries.max_retries}"
        )
    return problems


def _lost_attempt_problems(job_id: str, job: Job, lost: LostAttempt) -> list[str]:
    """The attempt a node death ended, kept for late success reports: older than the
    job's latest, on a job not finished, its ranks that exited zero a proper subset."""
    problems = []
    if job.state.finished:
        problems.append(f"{job_id}: {job.state.value} but keeps a lost attempt")
    if lost.fencing_token > job.fencing_token or lost.number > job.attempts_made:
        problems.append(
            f"{job_id}: lost attempt {lost.number} (token {lost.fencing_token}) is "
            f"newer than attempt {job.attempts_made} (token {job.fencing_token})"
        )
    ranks = list(lost.exited_zero)
    if (
        ranks != sorted(set(ranks))
        or any(not 0 <= r < len(lost.nodes) for r in ranks)
        or len(ranks) >= len(lost.nodes)
        or not _size_ok(job, len(lost.nodes))
    ):
        problems.append(f"{job_id}: lost attempt ranks {ranks} of {len(lost.nodes)}")
    return problems


def _holding_problems(state: ClusterState, job_id: str, job: Job, held: _Holdings) -> list[str]:
    """A job that holds resources: a whole gang on live nodes, no GPU booked twice, a
    consistent preemption; what its members hold is added to ``held``."""
    attempt = job.attempt
    if attempt is None:
        return [f"{job_id}: {job.state.value} without an attempt"]
    problems = []
    if not _size_ok(job, len(attempt.members)):
        problems.append(
            f"{job_id}: partial gang, {len(attempt.members)} of {job.spec.replicas} bound"
        )
    if len(attempt.member_status) != len(attempt.members):
        problems.append(f"{job_id}: member status does not match members")
    if any(m.generation > attempt.membership for m in attempt.members):
        problems.append(f"{job_id}: a member's generation is above the attempt's membership")
    if attempt.members and attempt.members[0].node_id in held.master_ports:
        held.master_ports[attempt.members[0].node_id].append(attempt.master_port)
    freed = {v.rank for v in attempt.vacancies if v.stopped}
    for member in attempt.members:
        if member.rank not in freed:  # a lost rank known stopped holds nothing
            problems += _book(state, job_id, job, member, held, "rank")
    problems += _vacancy_problems(job_id, job)
    if attempt.preempted_by and (attempt.preemption is None or attempt.preempt_deadline_ms <= 0):
        problems.append(f"{job_id}: preempted without a kind or a deadline")
    # Members of a preempted attempt may stop before any started, and so may the old
    # member of a rank given back or lost (a vacancy known stopped).
    if (
        job.state is JobState.SCHEDULED
        and not attempt.preempted_by
        and any(
            s.state is not MemberState.BOUND
            for rank, s in enumerate(attempt.member_status)
            if rank not in freed
        )
    ):
        problems.append(f"{job_id}: SCHEDULED but a member already started")
    return problems


def _size_ok(job: Job, members: int) -> bool:
    """Whether an attempt of ``job`` may have ``members`` members (core/elastic.py)."""
    fewest, most = gang_sizes(job.spec)
    return fewest <= members <= most


def _vacancy_problems(job_id: str, job: Job) -> list[str]:
    """Lost ranks of a live attempt: only with ``replace:``, sorted and distinct, ranks of
    the attempt; one known stopped has no member running."""
    attempt = job.attempt
    assert attempt is not None
    vacancies = attempt.vacancies
    if not vacancies:
        return []
    problems = []
    ranks = [v.rank for v in vacancies]
    gone = [v.rank for v in vacancies if leaving(v)]
    if job.spec.replace is None and len(gone) < len(ranks):
        problems.append(f"{job_id}: ranks {ranks} being placed again without replace:")
    if gone and (job.spec.elastic is None or gone != list(range(gone[0], len(attempt.members)))):
        problems.append(f"{job_id}: ranks {gone} given back, not the top ranks of an elastic gang")
    if ranks != sorted(set(ranks)) or not all(0 <= r < len(attempt.members) for r in ranks):
        problems.append(f"{job_id}: lost ranks {ranks} not sorted, distinct ranks of the gang")
        return problems
    for v in vacancies:
        if v.stopped and attempt.member_status[v.rank].state is not MemberState.EXITED:
            problems.append(f"{job_id}: rank {v.rank} known stopped but not exited")
    if len(vacancies) == len(attempt.members):
        problems.append(f"{job_id}: every rank lost, yet the attempt is live")
    return problems


def _held_problems(state: ClusterState, job_id: str, job: Job, held: _Holdings) -> list[str]:
    """An ended attempt's ranks still held (``hold_until_stopped``): members not yet
    confirmed stopped, on live nodes; what they hold is added to ``held``."""
    attempt = job.attempt
    assert attempt is not None
    if attempt.ended_at_ms is None:
        return [f"{job_id}: attempt {attempt.number} is live but holds ranks of an ended one"]
    problems = []
    if list(attempt.held) != sorted(set(attempt.held)):
        problems.append(f"{job_id}: held ranks {list(attempt.held)} not sorted and distinct")
    for rank in attempt.held:
        if not 0 <= rank < len(attempt.members):
            problems.append(f"{job_id}: held rank {rank} is not a rank of the attempt")
            continue
        if attempt.member_status[rank].state is MemberState.EXITED:
            problems.append(f"{job_id}: rank {rank} confirmed stopped but still held")
        problems += _book(state, job_id, job, attempt.members[rank], held, "held rank")
    return problems


def _book(
    state: ClusterState,
    job_id: str,
    job: Job,
    member: MemberPlacement,
    held: _Holdings,
    what: str,
) -> list[str]:
    """Add what ``member`` holds on its node to ``held``: a live node, no GPU twice."""
    node = state.nodes.get(member.node_id)
    if node is None or node.status is NodeStatus.DEAD:
        return [f"{job_id}: {what} {member.rank} is on a missing or dead node"]
    held.resources[member.node_id] = held.resources[member.node_id] + reserved_of(job)
    clash = held.gpus[member.node_id] & set(member.gpus)
    held.gpus[member.node_id].update(member.gpus)
    if clash:
        return [f"{job_id}: GPUs {sorted(clash)} on {member.node_id} double-booked"]
    return []


def _token_problems(tokens: list[tuple[int, str]]) -> list[str]:
    """No fencing token used by two jobs' attempts."""
    return [
        f"fencing token {a} used by both {ja} and {jb}"
        for (a, ja), (b, jb) in itertools.pairwise(sorted(tokens))
        if a == b
    ]


def _node_problems(state: ClusterState, held: _Holdings) -> list[str]:
    """Each node's accounting against what its members hold, its capacity and status."""
    unconfirmed_on = {
        m.node_id
        for job in state.jobs.values()
        if job.attempt is not None and job.attempt.ended_at_ms is not None
        for m, st in zip(job.attempt.members, job.attempt.member_status, strict=True)
        if st.state is not MemberState.EXITED
    }
    problems = []
    for node_id, node in sorted(state.nodes.items()):
        expected = held.resources[node_id]
        if node.allocated != expected:
            problems.append(
                f"node {node_id}: allocated {node.allocated} but its members hold {expected}"
            )
        if node.allocated_gpus != held.gpus[node_id]:
            problems.append(f"node {node_id}: allocated GPUs disagree with its members")
        ports = sorted(held.master_ports[node_id])
        if node.master_ports != ports:
            problems.append(
                f"node {node_id}: master ports {node.master_ports} but its rank-0 members "
                f"use {ports}"
            )
        sick = [f.gpu for f in node.gpu_faults]
        if sick != sorted(set(sick)) or any(not 0 <= g < node.info.capacity.gpu for g in sick):
            problems.append(f"node {node_id}: GPU faults {sick} not one per GPU of the node")
        checks = [k.name for k in node.conditions]
        if checks != sorted(set(checks)):
            problems.append(f"node {node_id}: conditions {checks} not one per check, by name")
        if not node.allocated.fits_in(node.info.capacity) or node.allocated.is_negative():
            problems.append(
                f"node {node_id}: over-committed ({node.allocated} of {node.info.capacity})"
            )
        if node.status is NodeStatus.DEAD and node.allocated != Resources():
            problems.append(f"node {node_id}: dead but holds resources")
        if (
            node.status is NodeStatus.DRAINING
            and node.allocated == Resources()
            and node_id not in unconfirmed_on
        ):
            problems.append(f"node {node_id}: draining but holds no members (should be cordoned)")
    return problems


def _bookkeeping_problems(state: ClusterState) -> list[str]:
    """Request ids point at the jobs or arrays they made; sequence numbers stay below the
    next."""
    problems = []
    for request_id, job_id in sorted(state.request_ids.items()):
        owner = state.jobs.get(job_id) or state.arrays.get(job_id)
        if owner is None or owner.request_id != request_id:
            problems.append(f"request id {request_id!r} points at a missing job {job_id}")
    if state.jobs and max(j.seq for j in state.jobs.values()) >= state.next_job_seq:
        problems.append("a job's sequence number is not below next_job_seq")
    return problems


def _cohort_problems(state: ClusterState) -> list[str]:
    """The cohort tree is a tree: every parent exists, no cohort is above itself, no
    way up is longer than the bound (core/queues/cohort_tree.py)."""
    problems = []
    for name, record in sorted(state.cohorts.items()):
        if record.name != name:
            problems.append(f"cohort {name} is recorded as {record.name}")
        if record.parent and record.parent not in state.cohorts:
            problems.append(f"cohort {name}: its parent {record.parent} does not exist")
        up = ancestors(name, state.cohorts)
        if len(up) > MAX_COHORT_DEPTH or state.cohorts.get(up[-1], record).parent:
            problems.append(f"cohort {name}: its way up ({' -> '.join(up)}) has no root")
    return problems


def _member_problems(state: ClusterState) -> list[str]:
    """What an attempt reserves per member is at least what it asked, GPUs alike; the
    owners' member counts, once built, are those of the live attempts
    (core/spec/member_limits.py)."""
    problems = []
    for job_id, job in sorted(state.jobs.items()):
        attempt = job.attempt
        reserved = attempt.reserved if attempt is not None else None
        asked = job.spec.resources
        if reserved is not None and (reserved.gpu != asked.gpu or not asked.fits_in(reserved)):
            problems.append(f"{job_id}: reserves {reserved} per member, less than {asked}")
    counts = state._members
    if counts is not None:
        recount = MemberCounts.build(
            (job.job_id, job.owner, attempt)
            for job in state.jobs.values()
            if (attempt := job.live_attempt()) is not None
        )
        if (counts.total, counts.on_node) != (recount.total, recount.on_node):
            problems.append(
                f"owners' member counts {counts.total} disagree with their live attempts' "
                f"{recount.total}"
            )
    return problems
