"""Queue quotas: what each queue uses, lends and may borrow (DESIGN §8). Pure.

Rules, stated once here and used by the scheduler (admission) and by ``apply``
(verification of a bind and of a reclaim):

* A queue's **usage** is the resources of its live attempts (an attempt being preempted
  still counts until its members are confirmed stopped). A fixed gang counts whole; an
  elastic gang (core/elastic.py) counts the members its attempt holds, those it gives
  back included until the attempt drops them (:func:`held_request`). The ``default``
  queue and any queue without a GPU quota (``gpu`` None) has no limit.
* A pending gang is **admitted** when its :func:`admission_request` fits: the whole gang,
  or an elastic gang's ``min`` (it starts with no more members than the quota allows,
  :func:`members_within`, and grows only within it).
* A queue **borrows** what it uses beyond its nominal GPUs; it **lends** at most
  ``min(lending_limit, max(0, nominal - usage))``.
* What a queue may still take: its idle nominal, plus what it may borrow: in a cohort
  of queues alone, ``min(borrowing_limit - borrowed, lendable of the other queues of
  its cohort - what every queue of the cohort already borrows)``; in a cohort tree, the
  same rule at every level up to the root (:mod:`synapse_ha.core.queues.cohort_tree`). A queue
  of cohort "" is a cohort of its own.
* CPU and memory quotas, when set, are caps within the nominal (nothing is borrowed).

All arithmetic is on integers; iteration is in queue-name order.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields

from synapse_ha.core.cluster_config import (
    DEFAULT_GRACE_MS,
    ClusterConfig,
    Cohort,
    PriorityClass,
    Queue,
)
from synapse_ha.core.model import Attempt, ClusterState, Job, JobSpec, JobState, Resources
from synapse_ha.core.queues.cohort_tree import CohortTree
from synapse_ha.core.reasons import Reason, ReasonCode, reason

ZERO = Resources()


def gang_request(spec: JobSpec) -> Resources:
    """What a whole gang of ``spec`` holds while it is live."""
    return spec.resources.times(spec.replicas)


def members_request(spec: JobSpec, members: int) -> Resources:
    """What ``members`` members of a gang of ``spec`` hold."""
    return spec.resources.times(members)


# From this format on an elastic gang is charged for the members its attempt holds.
# Below it (a release that reads format 15 runs elastic gangs too) it is charged for its
# max from the start, so a cluster in the middle of an upgrade applies one rule.
MEMBERS_CHARGED_FORMAT = 16


def charges_members(state: ClusterState) -> bool:
    """Whether ``state``'s replicas all charge an elastic gang for its members."""
    return state.format_floor >= MEMBERS_CHARGED_FORMAT


def admission_request(spec: JobSpec, *, by_members: bool = True) -> Resources:
    """What a pending gang of ``spec`` must fit its queue's quota to start: the whole
    gang, or an elastic gang's ``min`` (it starts with as many members as fit within
    the quota, :func:`members_within`). ``by_members`` False: the whole gang (below
    :data:`MEMBERS_CHARGED_FORMAT`)."""
    elastic = spec.elastic
    if elastic is None or not by_members:
        return gang_request(spec)
    return members_request(spec, elastic.min_replicas)


def placed_request(state: ClusterState, spec: JobSpec, members: int) -> Resources:
    """What ``members`` members of a gang of ``spec`` just placed are charged for."""
    if spec.elastic is None or not charges_members(state):
        return gang_request(spec)
    return members_request(spec, members)


def held_request(
    job: Job, attempt: Attempt, *, counting_leaving: bool = True, by_members: bool = True
) -> Resources:
    """What ``attempt`` of ``job`` is charged for: a fixed gang's whole size; an elastic
    gang's members, those it gives back (SHRINKING) included until the attempt drops them
    (``counting_leaving=False``: without them, what its queue keeps once they stop).
    ``by_members`` False: an elastic gang's max (below :data:`MEMBERS_CHARGED_FORMAT`)."""
    spec = job.spec
    if spec.elastic is None or not by_members:
        return gang_request(spec)
    members = len(attempt.members)
    if not counting_leaving:
        members -= sum(1 for v in attempt.vacancies if v.cause.code is ReasonCode.SHRINKING)
    return members_request(spec, members)


def shrinking_for(attempt: Attempt) -> str:
    """The gang ``attempt``'s members are being given back to ("" for none)."""
    for v in attempt.vacancies:
        if v.cause.code is ReasonCode.SHRINKING and v.cause.text("for_job"):
            return v.cause.text("for_job")
    return ""


def count_held(
    usage: dict[str, Resources],
    job: Job,
    *,
    counting_preempted: bool = True,
    by_members: bool = True,
) -> None:
    """Add what ``job``'s live attempt holds (:func:`held_request`) to its queue's entry
    of ``usage`` (nothing without a live attempt; with ``counting_preempted=False``,
    nothing for an attempt being preempted and nothing for the members an elastic gang
    is giving back): the one rule of what counts against a quota, for
    :meth:`QueueUsage.of` and for callers that read every job once for more than usage."""
    attempt = job.live_attempt()
    if attempt is None or (attempt.preempted_by and not counting_preempted):
        return
    q = job.spec.queue
    held = held_request(job, attempt, counting_leaving=counting_preempted, by_members=by_members)
    usage[q] = usage.get(q, ZERO) + held


def members_within(usage: QueueUsage | None, spec: JobSpec, *, by_members: bool = True) -> int:
    """The most members of a gang of ``spec`` its queue's quota admits now: ``replicas``
    for a fixed gang or without a limit; for an elastic gang, down to its ``min``
    (``by_members`` False: ``replicas``, the gang being charged for its max)."""
    elastic = spec.elastic
    n = spec.replicas
    if usage is None or elastic is None or not by_members:
        return n
    while n > elastic.min_replicas and usage.shortfall(spec.queue, members_request(spec, n)):
        n -= 1
    return n


def priority_class(config: ClusterConfig, name: str) -> PriorityClass | None:
    """The cluster's class named ``name``, or None ("" names no class)."""
    if not name:
        return None
    for cls in config.priority_classes:
        if cls.name == name:
            return cls
    return None


def grace_ms(config: ClusterConfig, spec: JobSpec) -> int:
    """How long a preempted gang of ``spec`` has between SIGTERM and SIGKILL."""
    cls = priority_class(config, spec.priority_class)
    return cls.grace_ms if cls is not None else DEFAULT_GRACE_MS


def waiting_preemptors(state: ClusterState) -> set[str]:
    """Pending gangs that preempted others whose attempts are still live (stopping), or
    that elastic gangs are giving members back to."""
    waiting: set[str] = set()
    for job in state.jobs.values():
        attempt = job.live_attempt()
        if attempt is None:
            continue
        for_job = attempt.preempted_by or (shrinking_for(attempt) if attempt.vacancies else "")
        if for_job:
            preemptor = state.jobs.get(for_job)
            if preemptor is not None and preemptor.state is JobState.PENDING:
                waiting.add(preemptor.job_id)
    return waiting


def growth_usage(state: ClusterState) -> QueueUsage | None:
    """The usage an elastic gang's growth must fit its queue's quota in (None: no queue
    limits anything), for the plan and for apply: what each queue keeps once the gangs
    being preempted or shrunk have stopped, plus the claims of the gangs waiting for them,
    so no growth takes the quota a reclaim is taking back."""
    if not has_quotas(state) or not charges_members(state):
        return None  # charged for its max, an elastic gang grows within what it holds
    return QueueUsage.kept_after_reclaims(state)


def has_quotas(state: ClusterState) -> bool:
    """Whether any queue limits anything (else quota bookkeeping can be skipped)."""
    return any(
        q.gpu is not None or q.cpu_milli is not None or q.memory_mib is not None
        for q in state.queues.values()
    )


@dataclass(frozen=True, slots=True)
class QuotaShortfall:
    """Why a gang does not fit its queue's quota, with the numbers (GPUs or, when
    ``resource`` says so, CPU millicores or memory MiB)."""

    queue: str
    resource: str  # "gpu", "cpu_milli" or "memory_mib"
    used: int
    nominal: int
    borrowing_limit: int | None
    borrowable: int
    need: int

    def reason(self) -> Reason:
        """``WAITING_QUOTA`` with a parameter per field (``resource`` named only when it
        is not GPUs)."""
        params = {f.name: getattr(self, f.name) for f in fields(self)}
        if self.resource == "gpu":
            params["resource"] = None
        return reason(ReasonCode.WAITING_QUOTA, **params)


class QueueUsage:
    """Per-queue usage with the quota questions answered from it. A plain object a
    caller owns for one pass or one apply; :meth:`add` and :meth:`remove` keep it
    current as gangs are placed or leave (and are the only way to change it: what a
    queue may borrow is kept until the next change, since a pass asks it for every
    pending gang and the tree's answer walks every queue of the cohorts above)."""

    def __init__(
        self,
        queues: Mapping[str, Queue],
        usage: dict[str, Resources],
        cohorts: Mapping[str, Cohort] | None = None,
    ) -> None:
        self.queues = queues
        self.usage = usage
        self.tree = CohortTree(queues, cohorts or {}, lambda name: self.used(name).gpu)
        self._borrowable: dict[str, int] = {}  # queue -> the tree's answer for this usage
        self.version = 0  # counts the changes (add, remove): answers kept are for one

    @classmethod
    def of(cls, state: ClusterState, *, counting_preempted: bool = True) -> QueueUsage:
        """Usage of every queue in ``state``. ``counting_preempted=False`` leaves out
        attempts already being preempted (what a queue keeps once they stop)."""
        usage: dict[str, Resources] = {}
        by_members = charges_members(state)
        for job in state.jobs.values():
            count_held(usage, job, counting_preempted=counting_preempted, by_members=by_members)
        return cls(state.queues, usage, state.cohorts)

    @classmethod
    def kept_after_reclaims(cls, state: ClusterState, *, besides: str = "") -> QueueUsage:
        """What each queue keeps once the gangs being preempted have stopped, plus what
        the pending gangs still waiting for those victims will take: the usage a reclaim
        is judged against, by the planner choosing victims and by the state machine
        verifying them. ``besides``: a waiting gang left out (the one being judged)."""
        keeps = cls.of(state, counting_preempted=False)
        for job_id in sorted(waiting_preemptors(state)):
            if job_id != besides:
                spec = state.jobs[job_id].spec
                keeps.add(spec.queue, gang_request(spec))
        return keeps

    def add(self, queue: str, request: Resources) -> None:
        self.usage[queue] = self.usage.get(queue, ZERO) + request
        self._borrowable.clear()
        self.version += 1

    def remove(self, queue: str, request: Resources) -> None:
        self.usage[queue] = self.usage.get(queue, ZERO) - request
        self._borrowable.clear()
        self.version += 1

    def used(self, queue: str) -> Resources:
        return self.usage.get(queue, ZERO)

    def borrowed(self, queue: str) -> int:
        """GPUs ``queue`` uses beyond its nominal (0 without a quota)."""
        q = self.queues.get(queue)
        if q is None or q.gpu is None:
            return 0
        return max(0, self.used(queue).gpu - q.gpu)

    def lendable(self, queue: str) -> int:
        q = self.queues.get(queue)
        if q is None or q.gpu is None:
            return 0
        idle = max(0, q.gpu - self.used(queue).gpu)
        return idle if q.lending_limit_gpu is None else min(idle, q.lending_limit_gpu)

    def borrowable(self, queue: str) -> int:
        """GPUs ``queue`` may borrow now beyond what it already borrows, through its
        cohort and the cohorts above it (:mod:`synapse_ha.core.queues.cohort_tree`)."""
        answer = self._borrowable.get(queue)
        if answer is None:
            answer = self._borrowable[queue] = self.tree.borrowable(queue)
        return answer

    def headroom_gpu(self, queue: str) -> int | None:
        """GPUs ``queue`` may still take (idle nominal + borrowable); None: no limit."""
        q = self.queues.get(queue)
        if q is None or q.gpu is None:
            return None
        return max(0, q.gpu - self.used(queue).gpu) + self.borrowable(queue)

    def shortfall(self, queue: str, request: Resources) -> QuotaShortfall | None:
        """Why a gang holding ``request`` does not fit ``queue`` now; None if it does."""
        q = self.queues.get(queue)
        if q is None:
            return None
        used = self.used(queue)
        if q.gpu is not None and request.gpu:
            headroom = self.headroom_gpu(queue)
            if headroom is not None and request.gpu > headroom:
                return QuotaShortfall(
                    queue,
                    "gpu",
                    used.gpu,
                    q.gpu,
                    q.borrowing_limit_gpu,
                    self.borrowable(queue),
                    request.gpu,
                )
        for name, cap, have, need in (
            ("cpu_milli", q.cpu_milli, used.cpu_milli, request.cpu_milli),
            ("memory_mib", q.memory_mib, used.memory_mib, request.memory_mib),
        ):
            if cap is not None and need and have + need > cap:
                return QuotaShortfall(queue, name, have, cap, 0, 0, need)
        return None

    def within_nominal(self, queue: str, extra: int) -> bool:
        """Would ``queue`` stay within its nominal GPUs after taking ``extra`` more?"""
        q = self.queues.get(queue)
        return q is not None and q.gpu is not None and self.used(queue).gpu + extra <= q.gpu

    def above_nominal(self, queue: str) -> int:
        """GPUs a reclaim may take from ``queue`` without taking it below nominal."""
        return self.borrowed(queue)
