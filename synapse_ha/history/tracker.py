"""What each applied command did, as events and history records, derived from the state.

The replica hands every applied command to a :class:`Tracker` together with the job and
node ids the command may have touched (the superset :mod:`synapse_ha.core.snapshot`
notes for its copy-on-write snapshots) and the state after it. The tracker keeps a small
mark of every job and node it knows (its state, attempt number and attempt state; a
node's status and unhealthy GPUs) and compares the touched ones with the state, so a
command costs O(records it touched), never a scan.

Everything here is derived from applied commands and the replicated state alone: no
clock, no I/O, explicit orderings. Every replica that applies the same log, and a replica
whose tracker was rebuilt from a restored snapshot (:meth:`Tracker.reset`), derives the
same events with the same indexes and the same records.

Event index: ``applied_commands << 16 | k`` where ``applied_commands`` is the state's
counter after the command and ``k`` the event's position among that command's events.
Indexes therefore grow strictly along the log and are the same on every replica; they
are not contiguous.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import NamedTuple

from synapse_ha.core import commands as cmd
from synapse_ha.core.health.fitness import GpuFault, NodeCondition
from synapse_ha.core.model import (
    Attempt,
    AttemptState,
    ClusterState,
    Job,
    JobState,
    NodeStatus,
)
from synapse_ha.core.reasons import Reason, render
from synapse_ha.core.snapshot import AppliedCommand
from synapse_ha.history.submissions import Submissions

INDEX_SHIFT = 16
MAX_EVENTS_PER_COMMAND = (1 << INDEX_SHIFT) - 1
DEFAULT_QUEUE = "default"


class EventKind(enum.StrEnum):
    """What happened. Values are stable: clients may branch on them."""

    SUBMITTED = "submitted"  # a job was accepted
    BOUND = "bound"  # a new attempt of a gang was bound to nodes
    STARTED = "started"  # the attempt's first member reported running
    EXITED = "exited"  # every member exited 0: the attempt (and the job) succeeded
    FAILED = "failed"  # the attempt failed (the job retries, or failed for good)
    REQUEUED = "requeued"  # a disruption ended the attempt; the gang waits again
    PREEMPTED = "preempted"  # preemption began: its members are being stopped (DESIGN §8)
    CANCELLED = "cancelled"  # the job was cancelled
    NODE_REGISTERED = "node_registered"
    NODE_READY = "node_ready"  # back from cordoned, draining or dead
    NODE_CORDONED = "node_cordoned"
    NODE_DRAINING = "node_draining"
    NODE_DRAINED = "node_drained"  # a draining node emptied and is now cordoned
    NODE_DEAD = "node_dead"
    GPU_UNHEALTHY = "gpu_unhealthy"  # GPUs of a node were recorded unhealthy
    GPU_REPAIRED = "gpu_repaired"  # unhealthy GPUs of a node were repaired
    NODE_CHECK_FAILED = "node_check_failed"  # a check of a node fails (or says anew why)
    NODE_CHECK_PASSED = "node_check_passed"  # a failing check of a node passes again
    LEADER_CHANGED = "leader_changed"  # a new leader committed its term's barrier


@dataclass(frozen=True, slots=True)
class Event:
    index: int
    kind: EventKind
    time_ms: int
    job_id: str = ""
    job_name: str = ""
    owner: str = ""
    queue: str = ""
    attempt: int = 0
    nodes: tuple[str, ...] = ()
    node_id: str = ""
    reason_code: str = ""
    detail: str = ""  # operator text (a node's status reason, its GPUs' faults)
    leader_id: str = ""
    reason: Reason | None = None  # rendered only when read: most events never are

    @property
    def description(self) -> str:
        """The sentence for people: the reason's, else the operator's text."""
        return render(self.reason) if self.reason is not None else self.detail


@dataclass(frozen=True, slots=True)
class AttemptRecord:
    """One ended attempt of a job: what it held and for how long."""

    job_id: str
    number: int
    fencing_token: int
    name: str
    owner: str
    queue: str
    state: str  # AttemptState value
    nodes: tuple[str, ...]  # sorted, distinct
    gpus: int  # GPUs the attempt held (members x GPUs per member)
    bound_at_ms: int
    started_at_ms: int  # 0: never started
    ended_at_ms: int
    outcome_code: str
    outcome: Reason | None  # rendered by the writer, off the apply thread
    applied_index: int  # the state's applied_commands after the command that ended it
    account: str = ""  # the job's accounting label (sbatch --account)

    @property
    def gpu_ms(self) -> int:
        """GPU-milliseconds held: GPUs x (end - bind). Allocated time, as Slurm's
        AllocTRES x Elapsed: the GPUs were nobody else's from bind to end."""
        return self.gpus * max(0, self.ended_at_ms - self.bound_at_ms)


@dataclass(frozen=True, slots=True)
class JobRecord:
    """A finished job as history keeps it."""

    job_id: str
    name: str
    owner: str
    queue: str
    state: str  # SUCCEEDED | FAILED | CANCELLED
    reason_code: str
    reason: Reason  # rendered by the writer, off the apply thread
    submitted_at_ms: int
    finished_at_ms: int
    attempts: int
    retries_used: int
    requeues: int
    gpus_per_attempt: int
    cancelled_by: str
    spec: object  # the JobSpec (stored as the core codec's plain form, or as below)
    applied_index: int
    # The last attempt's checkpoint mark (core/workflows/checkpoints.py): when (0: none) and its
    # step; and the step a next attempt would have resumed from.
    checkpoint_at_ms: int = 0
    checkpoint_step: int | None = None
    resume_step: int | None = None
    # The encoded SubmitJob command the job's spec came from, as the replica applied it
    # (b"": unknown, e.g. the job was restored from a snapshot). Stored in its place:
    # the spec is then never encoded again.
    submission: bytes = b""


@dataclass(slots=True)
class Step:
    """What one applied command produced."""

    events: list[Event] = field(default_factory=list)
    attempts: list[AttemptRecord] = field(default_factory=list)
    jobs: list[JobRecord] = field(default_factory=list)


class _JobMark(NamedTuple):
    """What the tracker remembers of a job (a tuple: made for every touched job)."""

    state: JobState
    attempts_made: int
    attempt_state: AttemptState | None
    started: bool
    preempted: bool  # its attempt is being preempted


class _NodeMark(NamedTuple):
    """What the tracker remembers of a node."""

    status: NodeStatus
    gpu_faults: tuple[GpuFault, ...]
    conditions: tuple[NodeCondition, ...] = ()


def _mark(job: Job) -> _JobMark:
    attempt = job.attempt
    if attempt is None:
        return _JobMark(job.state, job.attempts_made, None, False, False)
    return _JobMark(
        job.state,
        job.attempts_made,
        attempt.state,
        attempt.started_at_ms is not None,
        bool(attempt.preempted_by),
    )


def queue_of(job: Job) -> str:
    """The job's queue; ``default`` where specs carry none."""
    return str(getattr(job.spec, "queue", DEFAULT_QUEUE) or DEFAULT_QUEUE)


def attempt_nodes(attempt: Attempt) -> tuple[str, ...]:
    return tuple(sorted({m.node_id for m in attempt.members}))


def attempt_record(job: Job, applied_index: int) -> AttemptRecord | None:
    """The record of ``job``'s last attempt if it has ended, else None."""
    attempt = job.attempt
    if attempt is None or attempt.ended_at_ms is None:
        return None
    outcome = attempt.outcome
    return AttemptRecord(
        job_id=job.job_id,
        number=attempt.number,
        fencing_token=attempt.fencing_token,
        name=job.spec.name,
        owner=job.owner,
        queue=queue_of(job),
        state=str(attempt.state),
        nodes=attempt_nodes(attempt),
        gpus=len(attempt.members) * job.spec.resources.gpu,
        bound_at_ms=attempt.bound_at_ms,
        started_at_ms=attempt.started_at_ms or 0,
        ended_at_ms=attempt.ended_at_ms,
        outcome_code=str(outcome.code) if outcome is not None else "",
        outcome=outcome,
        applied_index=applied_index,
        account=job.spec.account,
    )


def job_record(job: Job, applied_index: int, submission: bytes = b"") -> JobRecord:
    mark = job.attempt.mark() if job.attempt is not None else None
    return JobRecord(
        job_id=job.job_id,
        name=job.spec.name,
        owner=job.owner,
        queue=queue_of(job),
        state=str(job.state),
        reason_code=str(job.reason.code),
        reason=job.reason,
        submitted_at_ms=job.submitted_at_ms,
        finished_at_ms=job.finished_at_ms,
        attempts=job.attempts_made,
        retries_used=job.retries_used,
        requeues=job.requeues,
        gpus_per_attempt=job.spec.replicas * job.spec.resources.gpu,
        cancelled_by=job.cancelled_by,
        spec=job.spec,
        applied_index=applied_index,
        checkpoint_at_ms=mark.at_ms if mark is not None else 0,
        checkpoint_step=mark.step if mark is not None else None,
        resume_step=job.resume_step,
        submission=submission,
    )


_NODE_KIND = {
    NodeStatus.READY: EventKind.NODE_READY,
    NodeStatus.CORDONED: EventKind.NODE_CORDONED,
    NodeStatus.DRAINING: EventKind.NODE_DRAINING,
    NodeStatus.DEAD: EventKind.NODE_DEAD,
}

_ENDED_KIND = {
    AttemptState.SUCCEEDED: EventKind.EXITED,
    AttemptState.FAILED: EventKind.FAILED,
    AttemptState.REQUEUED: EventKind.REQUEUED,
    AttemptState.STOPPED: EventKind.FAILED,  # a time limit; a cancel is told apart below
}


class Tracker:
    """Marks of the jobs and nodes of one replica's state; see the module docstring.

    Not thread-safe: the replica calls it on the thread that applies commands."""

    def __init__(self) -> None:
        self._jobs: dict[str, _JobMark] = {}
        self._nodes: dict[str, _NodeMark] = {}
        # The encoded SubmitJob command of unfinished jobs whose spec is the one that
        # command carried.
        self.submissions = Submissions()

    def reset(self, state: ClusterState) -> Step:
        """Forget everything and mark ``state`` (a restored snapshot). Returns the
        records ``state`` still holds (finished jobs, ended attempts) so that history
        that was not written before a crash is written now (writing is idempotent)."""
        self._jobs = {job_id: _mark(job) for job_id, job in state.jobs.items()}
        self.submissions.clear()
        self._nodes = {
            node_id: _NodeMark(node.status, node.gpu_faults, node.conditions)
            for node_id, node in state.nodes.items()
        }
        step = Step()
        for job in sorted(state.jobs.values(), key=lambda j: j.seq):
            record = attempt_record(job, 0)
            if record is not None:
                step.attempts.append(record)
            if job.state.finished:
                step.jobs.append(job_record(job, 0))
        return step

    def step(self, entry: AppliedCommand) -> Step:
        """Events and records of one applied command."""
        command, result, state = entry.command, entry.result, entry.state
        job_ids, node_ids, encoded = entry.job_ids, entry.node_ids, entry.encoded
        out = Step()
        applied = state.applied_commands
        now = state.last_time_ms
        events: list[tuple[EventKind, dict[str, object]]] = []
        if isinstance(command, cmd.Barrier) and result.ok:
            events.append((EventKind.LEADER_CHANGED, {"leader_id": command.leader_id}))
        if node_ids is None:
            nodes: Iterable[str] = sorted(set(self._nodes) | set(state.nodes))
        else:
            nodes = sorted(set(node_ids)) if node_ids else ()  # most commands touch none
        for node_id in nodes:
            self._node_events(command, node_id, state, events)
        ids = set(self._jobs) | set(state.jobs) if job_ids is None else job_ids
        changed: list[tuple[int, str, _JobMark | None, _JobMark, Job]] = []
        for job_id in ids:  # most touched jobs (a pass's new reasons) did not change
            job = state.jobs.get(job_id)
            if job is None:  # purged: history already has it
                self._jobs.pop(job_id, None)
                self.submissions.take(job_id)
                continue
            before = self._jobs.get(job_id)
            after = _mark(job)
            if after != before:
                self._jobs[job_id] = after
                changed.append((job.seq, job_id, before, after, job))
        if len(changed) > 1:
            changed.sort(key=lambda c: (c[0], c[1]))
        arrays: set[str] = set()  # arrays whose submission is told (once, not per task)
        if encoded and isinstance(command, cmd.SubmitJob):
            spec = command.spec
            fresh = [c[1] for c in changed if c[2] is None and c[4].spec is spec]
            if fresh:
                self.submissions.keep(fresh, encoded)
        for _, _, before, after, job in changed:
            if before is None and job.array_id:
                if job.array_id not in arrays:
                    arrays.add(job.array_id)
                    events.append(_array_submitted(job, state))
                before = _SUBMITTED
            self._job_events(before, after, job, applied, events, out)
        if len(events) > MAX_EVENTS_PER_COMMAND:
            events = events[:MAX_EVENTS_PER_COMMAND]
        for k, (kind, values) in enumerate(events):
            out.events.append(
                Event(index=(applied << INDEX_SHIFT) | k, kind=kind, time_ms=now, **values)  # type: ignore[arg-type]
            )
        return out

    def _node_events(
        self,
        command: cmd.Command,
        node_id: str,
        state: ClusterState,
        events: list[tuple[EventKind, dict[str, object]]],
    ) -> None:
        known = self._nodes.get(node_id)
        node = state.nodes.get(node_id)
        if node is None:
            self._nodes.pop(node_id, None)
            return
        after = node.status
        self._nodes[node_id] = _NodeMark(after, node.gpu_faults, node.conditions)
        if known is not None and known.gpu_faults != node.gpu_faults:
            _health_events(node_id, known.gpu_faults, node.gpu_faults, events)
        if known is not None and known.conditions != node.conditions:
            _check_events(node_id, known.conditions, node.conditions, events)
        before = known.status if known is not None else None
        if before == after:
            return
        about: dict[str, object] = {"node_id": node_id, "detail": node.status_reason}
        if before is None:
            kind = EventKind.NODE_REGISTERED
        elif before is NodeStatus.DRAINING and after is NodeStatus.CORDONED:
            kind = EventKind.NODE_DRAINED
        elif (
            isinstance(command, cmd.SetNodeStatus)
            and command.status is NodeStatus.DRAINING
            and after is NodeStatus.CORDONED
        ):  # drained as soon as it was asked to drain: it held nothing
            events.append((EventKind.NODE_DRAINING, about))
            kind = EventKind.NODE_DRAINED
        else:
            kind = _NODE_KIND[after]
        events.append((kind, about))

    def _job_events(
        self,
        before: _JobMark | None,
        after: _JobMark,
        job: Job,
        applied: int,
        events: list[tuple[EventKind, dict[str, object]]],
        out: Step,
    ) -> None:
        job_id = job.job_id
        about: dict[str, object] = {
            "job_id": job_id,
            "job_name": job.spec.name,
            "owner": job.owner,
            "queue": queue_of(job),
        }
        if before is None:
            events.append((EventKind.SUBMITTED, about))
            before = _SUBMITTED
        attempt = job.attempt
        if attempt is not None:
            with_attempt = {**about, "attempt": attempt.number, "nodes": attempt_nodes(attempt)}
            new_attempt = after.attempts_made > before.attempts_made
            if new_attempt:
                events.append((EventKind.BOUND, with_attempt))
            if after.started and (new_attempt or not before.started):
                events.append((EventKind.STARTED, with_attempt))
            if after.preempted and (new_attempt or not before.preempted):
                events.append(
                    (
                        EventKind.PREEMPTED,
                        {**with_attempt, "reason_code": str(job.reason.code), "reason": job.reason},
                    )
                )
            was_live = new_attempt or (
                before.attempt_state is not None and before.attempt_state.live
            )
            if was_live and not attempt.state.live:
                record = attempt_record(job, applied)
                if record is not None:
                    out.attempts.append(record)
                # An attempt state this table does not know yet ends as a failure.
                kind = _ENDED_KIND.get(attempt.state, EventKind.FAILED)
                if job.state is JobState.CANCELLED:
                    kind = EventKind.CANCELLED
                elif kind is EventKind.REQUEUED and job.state.finished:
                    kind = EventKind.FAILED
                events.append((kind, {**with_attempt, **_why(job, attempt.outcome)}))
            elif job.state is JobState.CANCELLED and not before.state.finished:
                events.append((EventKind.CANCELLED, {**about, **_why(job, job.reason)}))
        elif job.state is JobState.CANCELLED and not before.state.finished:
            events.append((EventKind.CANCELLED, {**about, **_why(job, job.reason)}))
        if job.state.finished and not before.state.finished:
            out.jobs.append(job_record(job, applied, self.submissions.take(job_id)))


_SUBMITTED = _JobMark(JobState.PENDING, 0, None, False, False)  # a new job, told


def _array_submitted(task: Job, state: ClusterState) -> tuple[EventKind, dict[str, object]]:
    """The one ``submitted`` event of an array (its tasks are not told one by one)."""
    array = state.arrays.get(task.array_id)
    tasks = len(array.indices) if array is not None else 0
    about: dict[str, object] = {
        "job_id": task.array_id,
        "job_name": task.spec.name,
        "owner": task.owner,
        "queue": queue_of(task),
        "detail": f"an array of {tasks} task(s): {task.array_id}_<index>",
    }
    return EventKind.SUBMITTED, about


def _health_events(
    node_id: str,
    before: tuple[GpuFault, ...],
    after: tuple[GpuFault, ...],
    events: list[tuple[EventKind, dict[str, object]]],
) -> None:
    """``gpu_repaired`` for the GPUs cleared since ``before`` (who repaired them is in
    the leader's audit log, as for a cordon), ``gpu_unhealthy`` for those recorded since;
    before any status event of the same command, since a drain follows from the faults."""
    was = {f.gpu for f in before}
    now = {f.gpu for f in after}
    cleared = tuple(f for f in before if f.gpu not in now)
    new = tuple(f for f in after if f.gpu not in was)
    if cleared:
        detail = faults_text(cleared, with_detail=False) + " repaired"
        events.append((EventKind.GPU_REPAIRED, {"node_id": node_id, "detail": detail}))
    if new:
        events.append((EventKind.GPU_UNHEALTHY, {"node_id": node_id, "detail": faults_text(new)}))


def _check_events(
    node_id: str,
    before: tuple[NodeCondition, ...],
    after: tuple[NodeCondition, ...],
    events: list[tuple[EventKind, dict[str, object]]],
) -> None:
    """``node_check_passed`` for each check no longer failing, ``node_check_failed`` for
    each failing since ``before`` or with a new message; before any status event of the
    same command, since a cordon follows from the checks."""
    was = {k.name: k.message for k in before}
    now = {k.name for k in after}
    for k in before:
        if k.name not in now:
            about: dict[str, object] = {"node_id": node_id, "detail": f"{k.name} passes"}
            events.append((EventKind.NODE_CHECK_PASSED, about))
    for k in after:
        if was.get(k.name) != k.message or k.name not in was:
            failed: dict[str, object] = {"node_id": node_id, "detail": f"{k.name}: {k.message}"}
            events.append((EventKind.NODE_CHECK_FAILED, failed))


def faults_text(faults: tuple[GpuFault, ...], with_detail: bool = True) -> str:
    """``GPU 3 xid-79 (fell off the bus), GPU 5 ecc-dbe``: each fault, its worker's
    sentence in parentheses when it gave one and ``with_detail``."""
    return ", ".join(
        f"GPU {f.gpu} {f.code}" + (f" ({f.detail})" if with_detail and f.detail else "")
        for f in faults
    )


def _why(job: Job, outcome: Reason | None) -> dict[str, object]:
    """The reason code and sentence an ending event carries: the job's own reason once it
    finished or waits again (it names the outcome as its cause), else the outcome."""
    chosen = job.reason if job.state.finished or job.state is JobState.PENDING else outcome
    if chosen is None:
        return {}
    return {"reason_code": str(chosen.code), "reason": chosen}
