"""Plain data of the cluster: nodes, jobs, attempts, configuration and the whole state.

Everything here is standard-library Python with explicit, deterministic ordering. Times are
integer milliseconds supplied by commands (the core never reads a clock); CPU is in
millicores and memory in MiB so that all arithmetic is exact.

Values that travel in commands (``Resources``, ``JobSpec``, ``NodeInfo``...) are frozen.
The replicated ``ClusterState`` and its ``Node``/``Job``/``Attempt`` records are mutable:
only :func:`synapse_ha.core.machine.apply` changes them.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from synapse_ha.core.cluster_config import (
    DEFAULT_QUEUE,
    ClusterConfig,
    Cohort,
    PreemptionKind,
    Queue,
    QueueHistory,
)
from synapse_ha.core.elastic import ElasticPolicy
from synapse_ha.core.health.fitness import GpuFault, NodeCondition, Unfit
from synapse_ha.core.health.prestart import Prestart
from synapse_ha.core.health.progress import Progress
from synapse_ha.core.identity.tokens import Token as Token  # re-exported: the state holds tokens
from synapse_ha.core.member_counts import MemberCounts
from synapse_ha.core.node_index import NodeIndex
from synapse_ha.core.node_selector import NodeSelector
from synapse_ha.core.reasons import PENDING_FIRST_PASS, Reason
from synapse_ha.core.replacement import ReplacePolicy, Vacancy
from synapse_ha.core.workflows.checkpoints import AttemptMark, CheckpointMark, attempt_mark
from synapse_ha.core.workflows.dependencies import Dependencies

ADDED_IN = "format"  # the metadata key of a field's format (core/codec/formats.py)


def added_in(version: int) -> dict[str, int]:
    """The metadata of a field added in format ``version`` (core/codec/formats.py): left out
    while at its default; a command setting it needs that format (2 is never refused)."""
    return {ADDED_IN: version}


# --------------------------------------------------------------------------- enums


class NodeStatus(enum.StrEnum):
    READY = "ready"
    CORDONED = "cordoned"  # no new members; running members continue
    DRAINING = "draining"  # no new members; becomes cordoned once empty
    DEAD = "dead"  # declared dead by the leader; holds nothing


class JobState(enum.StrEnum):
    PENDING = "PENDING"
    SCHEDULED = "SCHEDULED"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"

    @property
    def finished(self) -> bool:
        return self in FINISHED_JOB_STATES

    @property
    def holds_resources(self) -> bool:
        return self in (JobState.SCHEDULED, JobState.RUNNING)


FINISHED_JOB_STATES = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})


class AttemptState(enum.StrEnum):
    BOUND = "bound"  # no member reported running yet
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"  # the job's own failure (counts against retries.max)
    REQUEUED = "requeued"  # ended by a disruption (counts against max_requeues)
    STOPPED = "stopped"  # cancelled or stopped at its time limit

    @property
    def live(self) -> bool:
        return self in (AttemptState.BOUND, AttemptState.RUNNING)


class MemberState(enum.StrEnum):
    BOUND = "bound"  # placed; the worker has not reported it started yet
    RUNNING = "running"
    EXITED = "exited"


# ----------------------------------------------------------------------- resources


@dataclass(frozen=True, slots=True, order=True)
class Resources:
    """A quantity of CPU (millicores), memory (MiB) and whole GPUs."""

    cpu_milli: int = 0
    memory_mib: int = 0
    gpu: int = 0

    def __add__(self, other: Resources) -> Resources:
        return Resources(
            self.cpu_milli + other.cpu_milli,
            self.memory_mib + other.memory_mib,
            self.gpu + other.gpu,
        )

    def __sub__(self, other: Resources) -> Resources:
        return Resources(
            self.cpu_milli - other.cpu_milli,
            self.memory_mib - other.memory_mib,
            self.gpu - other.gpu,
        )

    def times(self, n: int) -> Resources:
        return Resources(self.cpu_milli * n, self.memory_mib * n, self.gpu * n)

    def fits_in(self, other: Resources) -> bool:
        return (
            self.cpu_milli <= other.cpu_milli
            and self.memory_mib <= other.memory_mib
            and self.gpu <= other.gpu
        )

    def is_negative(self) -> bool:
        return self.cpu_milli < 0 or self.memory_mib < 0 or self.gpu < 0

    def describe(self) -> str:
        cpu = self.cpu_milli / 1000
        cpu_text = f"{cpu:g}"
        return f"{self.gpu} GPU, {cpu_text} CPU, {self.memory_mib} MiB"


ZERO = Resources()


# ---------------------------------------------------------------------------- nodes


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """What a worker reports about its machine when it registers."""

    node_id: str
    address: str
    capacity: Resources
    # GPU indices grouped by NVLink island; every index 0..gpu-1 in exactly one island.
    gpu_islands: tuple[tuple[int, ...], ...] = ()
    gpu_model: str = ""
    # Values for ClusterConfig.topology_levels, as (level, value) pairs sorted by level.
    topology: tuple[tuple[str, str], ...] = ()
    features: tuple[str, ...] = ()
    # Whose account members run under: "owner" when members run as their job's owner,
    # else "agent:<user>" (the worker agent's own account); "" when the node did not say.
    members_run_as: str = ""
    # The machine's boot id when its worker registered ("": not said): a new one is a reboot.
    boot_id: str = field(default="", metadata=added_in(3))
    # "pid-namespace" when each member runs in a PID namespace of its own, "shared" when
    # members share the node's; "" when the node did not say.
    member_isolation: str = field(default="", metadata=added_in(10))


@dataclass(slots=True)
class Node:
    info: NodeInfo
    status: NodeStatus
    registered_at_ms: int
    # Derived from bound attempts; kept for O(1) fit checks and verified by invariants.
    allocated: Resources = ZERO
    allocated_gpus: set[int] = field(default_factory=set)
    # Rendezvous ports of the live attempts whose rank 0 runs here, sorted; derived the
    # same way, so choosing a free port never scans every job.
    master_ports: list[int] = field(default_factory=list)
    status_reason: str = ""
    status_by: str = ""  # the identity that last cordoned, drained or uncordoned it (audit)
    # Unhealthy GPUs, by index (core/health/fitness.py): never placed on until repaired.
    gpu_faults: tuple[GpuFault, ...] = field(default=(), metadata=added_in(2))
    # Owners whose members this node could not start, for a back-off (core/health/fitness.py),
    # and how many members in a row it could not start.
    unfit: tuple[Unfit, ...] = field(default=(), metadata=added_in(2))
    start_failures: int = field(default=0, metadata=added_in(2))
    # Checks failing on the node (its worker's health-check program), by name.
    conditions: tuple[NodeCondition, ...] = field(default=(), metadata=added_in(2))

    @property
    def node_id(self) -> str:
        return self.info.node_id

    @property
    def free(self) -> Resources:
        """What a gang may still be given here: unhealthy GPUs are never free."""
        free = self.info.capacity - self.allocated
        if self.gpu_faults:
            idle = sum(1 for f in self.gpu_faults if f.gpu not in self.allocated_gpus)
            free = Resources(free.cpu_milli, free.memory_mib, free.gpu - idle)
        return free

    def schedulable(self) -> bool:
        return self.status is NodeStatus.READY


def topology_path(info: NodeInfo, levels: tuple[str, ...]) -> tuple[str, ...]:
    """The node's domain names from the outermost level down to the host.

    A level the node carries no label for is named ``"-"``: all unlabelled nodes share
    that domain, so a cluster without labels is one flat domain.
    """
    labels = dict(info.topology)
    return (*(labels.get(level, "-") for level in levels), info.node_id)


# ----------------------------------------------------------------------------- jobs


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    max_retries: int = 0
    backoff_ms: int = 10_000
    max_backoff_ms: int = 600_000


@dataclass(frozen=True, slots=True)
class JobSpec:
    """A validated job specification (DESIGN §6). Validation lives outside the core."""

    name: str
    replicas: int
    resources: Resources
    command: tuple[str, ...]
    shell: bool = True  # a string command runs under /bin/sh -c
    env: tuple[tuple[str, str], ...] = ()
    workdir: str = ""
    priority: int = 0
    topology_required: str = ""
    topology_preferred: str = ""
    time_limit_ms: int = 0  # 0 means no limit
    retries: RetryPolicy = field(default_factory=RetryPolicy)
    image: str = ""
    queue: str = field(default=DEFAULT_QUEUE, metadata=added_in(2))
    # "": no class; ``priority`` is then the number given.
    priority_class: str = field(default="", metadata=added_in(2))
    # None: no hang detection (core/health/progress.py).
    progress: Progress | None = field(default=None, metadata=added_in(3))
    # Run on each member's node before the member (core/health/prestart.py).
    prestart: Prestart | None = field(default=None, metadata=added_in(3))
    # None: starts as soon as it fits (core/workflows/dependencies.py).
    dependencies: Dependencies | None = field(default=None, metadata=added_in(4))
    # Its window (core/workflows/windows.py): not considered before ``begin``, cancelled if still
    # pending at ``deadline``; each a time (ms since the epoch) or a delay (ms), 0: not given.
    begin_at_ms: int = field(default=0, metadata=added_in(4))
    begin_delay_ms: int = field(default=0, metadata=added_in(4))
    deadline_at_ms: int = field(default=0, metadata=added_in(4))
    deadline_delay_ms: int = field(default=0, metadata=added_in(4))
    # ``array:`` as given (core/workflows/arrays.py): a task per index; "" is a single job.
    array: str = field(default="", metadata=added_in(5))
    # Accepted though no node could hold it yet (core/feasibility.py).
    wait_for_nodes: bool = field(default=False, metadata=added_in(9))
    # A stopped member's SIGTERM to SIGKILL (core/spec/fields.py); 0: its node's.
    stop_grace_ms: int = field(default=0, metadata=added_in(11))
    # An accounting label (core/spec/fields.py; sbatch --account); "" for none.
    account: str = field(default="", metadata=added_in(12))
    # Where its members may run (core/node_selector.py); None: on any node.
    nodes: NodeSelector | None = field(default=None, metadata=added_in(13))
    # A lost member is placed again while the gang runs on (core/replacement.py); None: requeue.
    replace: ReplacePolicy | None = field(default=None, metadata=added_in(14))
    elastic: ElasticPolicy | None = field(default=None, metadata=added_in(15))  # core/elastic.py


@dataclass(frozen=True, slots=True)
class MemberPlacement:
    rank: int
    node_id: str
    gpus: tuple[int, ...]
    generation: int = field(default=0, metadata=added_in(14))  # placed again this many times


@dataclass(slots=True)
class MemberStatus:
    state: MemberState = MemberState.BOUND
    exit_code: int | None = None
    started_at_ms: int | None = None
    finished_at_ms: int | None = None
    bound_at_ms: int | None = field(default=None, metadata=added_in(14))  # a replacement's bind


@dataclass(slots=True)
class Attempt:
    number: int
    fencing_token: int
    members: tuple[MemberPlacement, ...]
    master_port: int
    bound_at_ms: int
    member_status: list[MemberStatus]
    started_at_ms: int | None = None  # when the first member reported running
    ended_at_ms: int | None = None
    state: AttemptState = AttemptState.BOUND
    outcome: Reason | None = None  # None while live; how it ended otherwise
    # Set while the attempt is being preempted: the preemptor's job id, the kind, and
    # when its grace period ends (its members get SIGTERM at once, SIGKILL then).
    preempted_by: str = field(default="", metadata=added_in(2))
    preemption: PreemptionKind | None = field(default=None, metadata=added_in(2))
    preempt_deadline_ms: int = field(default=0, metadata=added_in(2))
    # Ranks of this ended attempt whose resources are still reserved on their nodes until
    # they are confirmed stopped (ClusterConfig.hold_until_stopped), in rank order.
    held: tuple[int, ...] = field(default=(), metadata=added_in(2))
    # The newest checkpoint mark of each member that marked one, in rank order
    # (core/workflows/checkpoints.py); the attempt's mark is derived from them.
    marks: tuple[CheckpointMark, ...] = field(default=(), metadata=added_in(5))
    # What each member's node reserves for it: its request raised to the cluster's floor,
    # plus its supervisor (core/spec/member_limits.py); None: the request as it is.
    reserved: Resources | None = field(default=None, metadata=added_in(10))
    # Lost ranks, or ranks an elastic gang gives back, and membership changes (core/elastic.py).
    vacancies: tuple[Vacancy, ...] = field(default=(), metadata=added_in(14))
    membership: int = field(default=0, metadata=added_in(14))

    def mark(self) -> AttemptMark | None:
        """The point the whole gang can resume from: None until every member marked."""
        return attempt_mark(self.marks, len(self.members))


@dataclass(frozen=True, slots=True)
class LostAttempt:
    """The most recent attempt of a job ended by its node's death, kept while the job is
    not final, so that members' exits reported late (their node was declared dead before
    the reports were committed) can still be counted.

    ``nodes``: the node of each rank. ``exited_zero``: the ranks known to have exited 0
    by their own program (sorted). When it holds every rank, the job has succeeded
    (DESIGN §4, "Success"). A failing exit of any rank (non-zero, fenced, lost) removes
    the record: the requeue was needed after all.
    """

    number: int
    fencing_token: int
    node_id: str  # the node whose death ended it
    nodes: tuple[str, ...]
    exited_zero: tuple[int, ...] = ()


@dataclass(slots=True)
class Job:
    job_id: str
    spec: JobSpec
    request_id: str
    seq: int  # submission order, cluster-wide
    submitted_at_ms: int
    state: JobState = JobState.PENDING
    reason: Reason = PENDING_FIRST_PASS
    attempt: Attempt | None = None  # current or last attempt
    attempts_made: int = 0
    # Attempts that failed and were retried (counted against retries.max), and attempts
    # ended by disruptions and requeued (counted against ClusterConfig.max_requeues).
    retries_used: int = 0
    requeues: int = 0
    retry_not_before_ms: int = 0
    finished_at_ms: int = 0
    owner: str = ""  # the user who submitted it (DESIGN §8); members run as this user
    cancelled_by: str = ""  # the identity that cancelled it (audit), as "kind:name"
    # The last attempt ended by its node's death while the job is not final (see
    # LostAttempt); None otherwise.
    lost_attempt: LostAttempt | None = field(default=None, metadata=added_in(2))
    # Dependencies not met yet, as (kind, job id) (core/workflows/dependencies.py): the job is not
    # considered for placement while any remain.
    waiting_for: tuple[tuple[str, str], ...] = field(default=(), metadata=added_in(2))
    # Jobs that named this one as a dependency when they were submitted, in order.
    dependants: tuple[str, ...] = field(default=(), metadata=added_in(2))
    # For a task of an array (core/workflows/arrays.py): the array's id and the task's index.
    array_id: str = field(default="", metadata=added_in(2))
    array_index: int = field(default=0, metadata=added_in(2))
    # The step of the newest attempt mark that carried one (core/workflows/checkpoints.py): its
    # next attempt's members get it as $SYNAPSE_RESUME_STEP. None: none yet.
    resume_step: int | None = field(default=None, metadata=added_in(5))

    @property
    def fencing_token(self) -> int:
        return self.attempt.fencing_token if self.attempt is not None else 0

    def live_attempt(self) -> Attempt | None:
        """The attempt that holds resources, if any."""
        if self.state.holds_resources:
            return self.attempt
        return None


@dataclass(slots=True)
class ArrayJob:
    """An array (core/workflows/arrays.py): what one submission made. Its tasks are the jobs
    ``<array_id>_<index>`` for each of ``indices`` (each shares ``spec``); ``throttle``
    bounds how many of them hold resources at once (0: no bound). It is purged with the
    last of its tasks."""

    array_id: str
    spec: JobSpec
    request_id: str
    seq: int
    submitted_at_ms: int
    indices: tuple[int, ...]
    throttle: int = 0
    owner: str = ""
    # Jobs that named the array as a dependency when they were submitted, in order.
    dependants: tuple[str, ...] = ()

    def task_ids(self) -> list[str]:
        return [f"{self.array_id}_{index}" for index in self.indices]


# ---------------------------------------------------------------------------- state


@dataclass(slots=True)
class ClusterState:
    """The whole replicated state. Change it only through ``apply``."""

    config: ClusterConfig = field(default_factory=ClusterConfig)
    nodes: dict[str, Node] = field(default_factory=dict)
    jobs: dict[str, Job] = field(default_factory=dict)
    # request_id -> job_id; a user's ids are scoped to it ("<owner>/<id>", see
    # synapse_ha.core.identity.admission.scoped_request_id), ids of older releases are not.
    request_ids: dict[str, str] = field(default_factory=dict)
    next_job_seq: int = 1
    last_fencing_token: int = 0
    applied_commands: int = 0
    last_time_ms: int = 0  # the newest command time seen; never goes backwards
    tokens: dict[str, Token] = field(default_factory=dict)  # token_id -> token
    queues: dict[str, Queue] = field(
        default_factory=lambda: {DEFAULT_QUEUE: Queue(DEFAULT_QUEUE)}, metadata=added_in(2)
    )
    # queue name -> decayed usage of its ended attempts (fair share); sorted by name.
    queue_history: dict[str, QueueHistory] = field(default_factory=dict, metadata=added_in(2))
    # The newest format every replica reads (core/codec/formats.py): what a command may use.
    format_floor: int = field(default=2, metadata=added_in(2))
    # Arrays by id (core/workflows/arrays.py); their tasks are in ``jobs``.
    arrays: dict[str, ArrayJob] = field(default_factory=dict, metadata=added_in(2))
    # The cohort tree (core/queues/cohort_tree.py): cohort records by name, sorted by name.
    cohorts: dict[str, Cohort] = field(default_factory=dict, metadata=added_in(2))
    # Derived, not replicated: the ids of the jobs holding resources, built on first use
    # by :meth:`live_jobs` and kept by :meth:`job_state_changed` after every change of a
    # job's state (None: not built yet).
    _live: set[str] | None = field(default=None, init=False, repr=False, compare=False)
    # Derived, not replicated, built on first use: the jobs on each node (:meth:`jobs_on_node`)
    # and each owner's members (core/spec/member_limits.py), kept by :meth:`job_state_changed`;
    # core/feasibility's summary of the nodes (shared).
    _nodes: NodeIndex | None = field(default=None, init=False, repr=False, compare=False)
    _members: MemberCounts | None = field(default=None, init=False, repr=False, compare=False)
    _fits: object = field(default=None, init=False, repr=False, compare=False)

    def pending_jobs(self) -> list[Job]:
        """Pending jobs in queue order: priority (higher first), then submission order
        (an array's tasks by index). Jobs still waiting for a dependency are left out, and
        tasks of an array beyond its throttle: nothing may place them."""
        return self.pending_and_throttled()[0]

    def pending_and_throttled(self) -> tuple[list[Job], list[Job]]:
        """:meth:`pending_jobs`, and the pending tasks its throttle leaves out (in the same
        order): of an array with ``n`` free slots (:meth:`array_slots`), the first ``n``
        pending tasks may be placed."""
        pending = [
            j for j in self.jobs.values() if j.state is JobState.PENDING and not j.waiting_for
        ]
        pending.sort(key=lambda j: (-j.spec.priority, j.seq, j.array_index))
        slots = self.array_slots() if self.arrays else {}
        if not slots:
            return pending, []
        eligible: list[Job] = []
        held: list[Job] = []
        for job in pending:
            free = slots.get(job.array_id) if job.array_id else None
            if free is None or free > 0:
                eligible.append(job)
                if free is not None:
                    slots[job.array_id] = free - 1
            else:
                held.append(job)
        return eligible, held

    def array_slots(self) -> dict[str, int]:
        """Per throttled array, how many more of its tasks may be bound now: its throttle
        less the tasks that occupy a slot (holding resources, or with members of an ended
        attempt not yet known to have stopped, see :func:`occupies_slot`)."""
        slots = {a.array_id: a.throttle for a in self.arrays.values() if a.throttle}
        if slots:
            for job in self.jobs.values():
                if job.array_id in slots and occupies_slot(job):
                    slots[job.array_id] -= 1
        return slots

    def live_jobs(self) -> list[Job]:
        """Jobs holding resources (scheduled or running), in job id order.

        Read from an index of their ids (:meth:`live_ids`), not from a scan: the leader
        calls this on every housekeeping step and in every pass that reserves, and there
        may be far more finished and pending jobs than live ones."""
        jobs = self.jobs
        return [jobs[job_id] for job_id in sorted(self.live_ids())]

    def live_ids(self) -> set[str]:
        """The ids of the jobs holding resources: the index itself, built on first use
        (a scan of every job) and kept by :meth:`job_state_changed`. Do not change it."""
        live = self._live
        if live is None:
            scheduled, running = JobState.SCHEDULED, JobState.RUNNING
            live = self._live = {
                job_id
                for job_id, j in self.jobs.items()
                if j.state is scheduled or j.state is running
            }
        return live

    def jobs_on_node(self, node_id: str) -> tuple[str, ...]:
        """The ids of the jobs whose current attempt has a member on ``node_id``, in job
        id order, unless the job is finished and every member of that attempt is known to
        have stopped: every job that may want a member there or may still have one
        running there. From an index kept by :meth:`job_state_changed` (core/node_index)."""
        return self._node_index().on_node.get(node_id, ())

    def node_index(self) -> dict[str, tuple[str, ...]]:
        """Node id -> :meth:`jobs_on_node`, for every node with jobs. Do not change it."""
        return self._node_index().on_node

    def _node_index(self) -> NodeIndex:
        if self._nodes is None:
            jobs = self.jobs
            self._nodes = NodeIndex.build((i, _attempt_nodes(jobs[i])) for i in sorted(jobs))
        return self._nodes

    def job_state_changed(self, job: Job) -> None:
        """Keep the indexes of :meth:`live_jobs`, :meth:`jobs_on_node` and the owners'
        member counts after ``job``'s state or attempt changed, a member of its attempt
        stopped, or it was removed from :attr:`jobs` (every change of a job's state, every
        new attempt and every member exit must call this)."""
        present = job.job_id in self.jobs
        live = self._live
        if live is not None:
            if job.state.holds_resources and present:
                live.add(job.job_id)
            else:
                live.discard(job.job_id)
        members = self._members
        if members is not None and not members.keep(
            job.job_id, job.owner, job.live_attempt() if present else None
        ):
            self._members = None  # a snapshot's copy: built anew on its next use
        index = self._nodes
        if index is not None and not index.keep(job.job_id, _attempt_nodes(job) if present else ()):
            self._nodes = None  # a snapshot's copy: built anew on its next use


def _attempt_nodes(job: Job) -> tuple[str, ...]:
    """The distinct nodes of ``job``'s current attempt, in rank order of their first
    member, while the job is not finished or a member of that attempt is not known to
    have stopped (none for a job never bound)."""
    attempt = job.attempt
    if attempt is None:
        return ()
    if job.state.finished and all(s.state is MemberState.EXITED for s in attempt.member_status):
        return ()
    return tuple(dict.fromkeys(m.node_id for m in attempt.members))


# ---------------------------------------------------------------- job predicates

FEATURE_IMAGES = "images"  # a node that can run jobs naming a container image


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


def occupies_slot(job: Job) -> bool:
    """Whether a task counts against its array's throttle: it holds resources, its ended
    attempt still holds some (``held``), or members of its ended attempt are not yet known
    to have stopped while it waits to run again."""
    attempt = job.attempt
    if job.state.holds_resources:
        return True
    if attempt is None:
        return False
    return bool(attempt.held) or (
        job.state is JobState.PENDING
        and attempt.ended_at_ms is not None
        and any(s.state is not MemberState.EXITED for s in attempt.member_status)
    )
