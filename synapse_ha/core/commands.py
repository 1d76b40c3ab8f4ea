"""Commands: every change to the cluster state is one of these, applied by ``apply``.

Commands carry their own time (``now_ms``) and any randomness seed, so that applying
the same command on every replica gives the same result. Each command is a frozen
dataclass; the codec turns it into a versioned, canonical envelope.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from synapse_ha.core.cluster_config import ClusterConfig, Cohort, PreemptionKind, Queue
from synapse_ha.core.health.fitness import GpuFault, NodeCheck
from synapse_ha.core.identity.access import Role
from synapse_ha.core.model import JobSpec, MemberPlacement, NodeInfo, NodeStatus
from synapse_ha.core.reasons import Reason


@dataclass(frozen=True, slots=True)
class Configure:
    """Set the cluster configuration. Refused while it would orphan a topology level in use."""

    config: ClusterConfig
    now_ms: int = 0
    actor: str = ""  # who asked (audit), as "kind:name"


@dataclass(frozen=True, slots=True)
class Barrier:
    """No change; a new leader commits one to learn that its log is current."""

    leader_id: str = ""
    now_ms: int = 0


@dataclass(frozen=True, slots=True)
class RegisterNode:
    """Add a node or refresh its description. A dead node comes back ready and empty."""

    info: NodeInfo
    now_ms: int = 0


@dataclass(frozen=True, slots=True)
class SetNodeStatus:
    """Cordon, drain or uncordon (``status`` ready) a node. Not for marking it dead."""

    node_id: str
    status: NodeStatus
    reason: str = ""
    now_ms: int = 0
    actor: str = ""  # who asked (audit), recorded as Node.status_by


@dataclass(frozen=True, slots=True)
class MarkNodeDead:
    """Declare a node dead: every attempt with a member on it ends and its gang is requeued
    as a disruption (not counted against ``retries.max``; bounded by ``max_requeues``)."""

    node_id: str
    reason: str = ""
    jitter_seed: int = 0
    now_ms: int = 0


@dataclass(frozen=True, slots=True)
class ReportGpuHealth:
    """GPUs a node's worker finds unhealthy (the leader proposes it when a heartbeat
    names one the state does not have). Each new one is recorded since ``now_ms`` and no
    longer offered; a live attempt holding one is stopped and requeued as a disruption;
    a node with ``ClusterConfig.gpu_drain_threshold`` unhealthy GPUs is drained. GPUs
    already recorded keep their first fault: health clears only by :class:`RepairGpus`."""

    node_id: str
    faults: tuple[GpuFault, ...]
    jitter_seed: int = 0
    now_ms: int = 0


@dataclass(frozen=True, slots=True)
class RepairGpus:
    """An operator's word that a node's GPUs are fit again: their faults are cleared
    (``gpus`` empty: every GPU of the node)."""

    node_id: str
    gpus: tuple[int, ...] = ()
    now_ms: int = 0
    actor: str = ""


@dataclass(frozen=True, slots=True)
class RaiseFormat:
    """Every replica (``replicas``, as the leader heard them) reads format ``version``:
    commands may now use what it added (core/codec/formats.py). Never lowers the floor."""

    version: int
    replicas: tuple[str, ...] = ()
    now_ms: int = 0


@dataclass(frozen=True, slots=True)
class ReportNodeChecks:
    """What a node's worker reports of its checks (the leader proposes it when a
    heartbeat's checks differ from the node's conditions). A failing check is recorded as
    a condition and cordons a ready node (``status_by`` the check's identity,
    :data:`~synapse_ha.core.health.fitness.CHECK_ACTOR`); a passing one clears its condition, and
    the node is uncordoned once none is left, if that cordon was the check's own."""

    node_id: str
    checks: tuple[NodeCheck, ...]
    now_ms: int = 0


@dataclass(frozen=True, slots=True)
class MarkNodeDegraded:
    """The leader found a node consistently slower than the other members of its gangs
    (:mod:`synapse_ha.core.health.slowness`, from the pace its workers report). Recorded
    as the node's ``degraded`` condition with ``evidence`` (which gangs, how much slower),
    which cordons a ready node as a failing check does; every gang with
    ``on_node_failure: replace`` that has members there has them placed elsewhere, as a
    drain does. A node already degraded keeps its condition and moves nothing again."""

    node_id: str
    evidence: str
    now_ms: int = 0


@dataclass(frozen=True, slots=True)
class SubmitJob:
    """Add a job. Idempotent: the same ``request_id`` returns the existing job."""

    spec: JobSpec
    request_id: str
    now_ms: int = 0
    owner: str = ""  # the authenticated user submitting it


@dataclass(frozen=True, slots=True)
class CancelJob:
    job_id: str
    reason: str = "cancelled by user"
    now_ms: int = 0
    actor: str = ""  # who asked (audit), recorded as Job.cancelled_by


@dataclass(frozen=True, slots=True)
class RequeueJob:
    """Stop the live attempt of ``job_id`` (every live task of an array) and queue the
    job again, keeping its place in line (``scontrol requeue``): the next attempt binds
    once every member of this one is confirmed stopped, as after a disruption; it uses
    neither a retry nor one of ``max_requeues``."""

    job_id: str
    reason: str = "requeued by user"
    now_ms: int = 0
    actor: str = ""  # who asked (audit)


@dataclass(frozen=True, slots=True)
class GangPlacement:
    """One gang's whole placement: every member of ``job_id`` with its node and GPUs.

    ``attempts_made`` is the number of attempts the planner saw; a placement planned
    against an older view of the job is stale and rejected.
    """

    job_id: str
    attempts_made: int
    members: tuple[MemberPlacement, ...]


@dataclass(frozen=True, slots=True)
class BindPlan:
    """The result of one scheduling pass.

    Each gang is verified against the state at apply time and bound all-or-nothing;
    a stale gang is rejected whole without affecting the others. ``reasons`` updates the
    pending reason of jobs left waiting.
    """

    placements: tuple[GangPlacement, ...] = ()
    reasons: tuple[tuple[str, Reason], ...] = ()
    now_ms: int = 0


@dataclass(frozen=True, slots=True)
class MemberReplacement:
    """One lost rank of a live attempt placed again: ``member`` carries the rank, its new
    node and GPUs, and the next generation (core/replacement.py)."""

    job_id: str
    fencing_token: int
    member: MemberPlacement


@dataclass(frozen=True, slots=True)
class ReplaceMembers:
    """Place lost ranks of running gangs again (the leader's replacement plan). Each is
    verified at apply like a gang's placement (node, GPUs, room, topology, selector) and
    needs its rank's old member known stopped; a refused one changes nothing and the
    others still apply."""

    replacements: tuple[MemberReplacement, ...]
    now_ms: int = 0


@dataclass(frozen=True, slots=True)
class MemberGrowth:
    """New top ranks for a running elastic gang (core/elastic.py): ``members`` continue
    its ranks in order, on free nodes of its required domain, each with the generation
    the attempt's ``membership`` will have once they join, above any generation a rank of
    the attempt ever had (a rank given back and grown again is a member of its own)."""

    job_id: str
    fencing_token: int
    members: tuple[MemberPlacement, ...]


@dataclass(frozen=True, slots=True)
class GrowMembers:
    """Grow running elastic gangs (the leader's growth plan). Each growth is verified at
    apply like a replacement, all its members or none; a refused one changes nothing and
    the others still apply."""

    growths: tuple[MemberGrowth, ...]
    now_ms: int = 0


@dataclass(frozen=True, slots=True)
class ShrinkMembers:
    """Shrink a running elastic gang to ``size`` members (never below its min): its
    ranks from ``size`` up stop, and each one's share of its node is freed once it is
    confirmed stopped. ``for_job``: the waiting gang the room is taken back for ("" for
    none)."""

    job_id: str
    fencing_token: int
    size: int
    for_job: str = ""
    now_ms: int = 0


class MemberEventKind(enum.StrEnum):
    STARTED = "started"
    EXITED = "exited"
    # The member marked a checkpoint (core/workflows/checkpoints.py): ``step`` and ``mark_seq``.
    CHECKPOINT = "checkpoint"


class ExitCause(enum.StrEnum):
    """Why a member exited, as its worker knows it.

    ``PROGRAM``: the member's own exit (its code is the job's doing). ``FENCED``: its
    worker killed it because the lease ran out or the leader forgot the node. ``LOST``:
    its worker killed or lost it for a reason of its own (agent restart or shutdown, its
    supervisor gone). ``HUNG``: its worker stopped it because it made no progress for
    its job's ``progress.timeout`` (:mod:`synapse_ha.core.health.progress`). Only ``PROGRAM``
    and ``HUNG`` exits count against ``retries.max``; the others are disruptions and
    requeue the gang (DESIGN §4).
    """

    PROGRAM = "program"
    FENCED = "fenced"
    LOST = "lost"
    # The node could not start it (no account for the owner, runtime or image missing,
    # cgroup setup failed, a GPU it cannot see): the node's fault, never the job's.
    NODE_CANNOT_RUN = "node_cannot_run"
    # No progress for the job's progress timeout: the program's failure, not a disruption.
    HUNG = "hung"

    @property
    def disruption(self) -> bool:
        return self is not ExitCause.PROGRAM and self is not ExitCause.HUNG


@dataclass(frozen=True, slots=True)
class MemberEvent:
    job_id: str
    fencing_token: int
    rank: int
    kind: MemberEventKind
    exit_code: int = 0
    detail: str = ""
    cause: ExitCause = ExitCause.PROGRAM
    # For CHECKPOINT: the step the mark carried (None: none), and the mark's number
    # among that member's marks on its worker (1, 2, ...).
    step: int | None = None
    mark_seq: int = 0
    # The member's generation (core/desired.MemberKey): a report of an earlier
    # generation of a rank that was placed again is stale.
    generation: int = 0


@dataclass(frozen=True, slots=True)
class ReportMembers:
    """What a worker observed since its last report (started and exited members, and
    checkpoint marks: the newest of a member, recorded at the command's ``now_ms``).

    Events whose fencing token is not the job's current one, or whose member is not
    bound to ``node_id``, are ignored and counted as stale.
    """

    node_id: str
    events: tuple[MemberEvent, ...]
    jitter_seed: int = 0
    now_ms: int = 0


@dataclass(frozen=True, slots=True)
class FailAttempt:
    """Fail the current attempt of a job (for example members that never started).

    The failure counts against ``retries.max``, unless ``reason`` is a disruption
    (``NODE_DEAD``, ``MEMBER_FENCED``, ``MEMBER_LOST``), which requeues the gang. A
    ``START_TIMEOUT`` is refused while every member has reported running or before
    ``start_timeout_ms`` has passed since the bind.
    """

    job_id: str
    fencing_token: int
    reason: Reason
    jitter_seed: int = 0
    now_ms: int = 0


@dataclass(frozen=True, slots=True)
class ExpireTimeLimit:
    """Stop a job whose attempt ran past its ``time_limit``; it ends FAILED, not retried."""

    job_id: str
    fencing_token: int
    now_ms: int = 0


@dataclass(frozen=True, slots=True)
class ExpireDeadline:
    """Cancel a job still pending at its ``deadline`` (core/workflows/windows.py)."""

    job_id: str
    now_ms: int = 0


@dataclass(frozen=True, slots=True)
class PurgeFinished:
    """Remove finished jobs older than the retention window from the replicated state."""

    now_ms: int = 0


@dataclass(frozen=True, slots=True)
class CreateToken:
    """Add a user's bearer token. Only the secret's SHA-256 travels: the secret itself is
    made by the replica that handles the request (or, for the first admin token, by the
    replica's bootstrap with ``actor="bootstrap"``) and never enters the log. The token
    id must be new; ``expires_at_ms`` 0 means never."""

    token_id: str
    user: str
    role: Role
    secret_sha256: str
    queues: tuple[str, ...] = ()
    expires_at_ms: int = 0
    now_ms: int = 0
    actor: str = ""  # recorded as Token.created_by
    priority_classes: tuple[str, ...] = ()  # Token.priority_classes
    max_priority: int = 0  # Token.max_priority


@dataclass(frozen=True, slots=True)
class RevokeToken:
    """Revoke a token from now on. Revoking a revoked token changes nothing."""

    token_id: str
    now_ms: int = 0
    actor: str = ""  # recorded as Token.revoked_by


@dataclass(frozen=True, slots=True)
class SetQueue:
    """Add a queue or replace its settings (admin). Validated like any command: the
    limits must be non-negative, the classes must exist."""

    queue: Queue
    now_ms: int = 0
    actor: str = ""  # who asked (audit)


@dataclass(frozen=True, slots=True)
class DeleteQueue:
    """Remove a queue. Refused for ``default`` and while an unfinished job names it."""

    name: str
    now_ms: int = 0
    actor: str = ""  # who asked (audit)


@dataclass(frozen=True, slots=True)
class SetCohort:
    """Add a cohort to the cohort tree or replace its settings (admin). Validated like
    any command: names, a parent that exists, no cycle, a bounded depth, limits >= 0
    (:func:`synapse_ha.core.queues.cohort_tree.check_cohort`)."""

    cohort: Cohort
    now_ms: int = 0
    actor: str = ""  # who asked (audit)


@dataclass(frozen=True, slots=True)
class DeleteCohort:
    """Remove a cohort record. Refused while another cohort names it as its parent;
    queues that name it form a cohort of their own again."""

    name: str
    now_ms: int = 0
    actor: str = ""  # who asked (audit)


@dataclass(frozen=True, slots=True)
class Victim:
    """A gang to preempt, named by its job and the fencing token of its live attempt
    (a victim whose attempt changed since the plan is stale)."""

    job_id: str
    fencing_token: int


@dataclass(frozen=True, slots=True)
class Preempt:
    """Begin preempting ``victims`` (whole gangs) so that ``preemptor`` can be placed.

    Verified at apply: the preemptor is pending and planned against its current attempt
    count, every victim is live with the named token, and the rule of ``kind`` allows it.
    Victims keep their resources until every member is confirmed stopped; then they are
    requeued as a disruption, keeping their submission order.
    """

    preemptor: str
    preemptor_attempts_made: int
    victims: tuple[Victim, ...]
    kind: PreemptionKind
    now_ms: int = 0


Command = (
    Configure
    | Barrier
    | RegisterNode
    | SetNodeStatus
    | MarkNodeDead
    | ReportGpuHealth
    | RepairGpus
    | RaiseFormat
    | ReportNodeChecks
    | MarkNodeDegraded
    | SubmitJob
    | CancelJob
    | RequeueJob
    | BindPlan
    | ReportMembers
    | FailAttempt
    | ExpireTimeLimit
    | ExpireDeadline
    | PurgeFinished
    | CreateToken
    | RevokeToken
    | SetQueue
    | DeleteQueue
    | Preempt
    | SetCohort
    | DeleteCohort
    | ReplaceMembers
    | GrowMembers
    | ShrinkMembers
)

COMMAND_TYPES: tuple[type, ...] = (
    Configure,
    Barrier,
    RegisterNode,
    SetNodeStatus,
    MarkNodeDead,
    ReportGpuHealth,
    RepairGpus,
    RaiseFormat,
    ReportNodeChecks,
    MarkNodeDegraded,
    SubmitJob,
    CancelJob,
    RequeueJob,
    BindPlan,
    ReportMembers,
    FailAttempt,
    ExpireTimeLimit,
    ExpireDeadline,
    PurgeFinished,
    CreateToken,
    RevokeToken,
    SetQueue,
    DeleteQueue,
    Preempt,
    SetCohort,
    DeleteCohort,
    ReplaceMembers,
    GrowMembers,
    ShrinkMembers,
)


class RejectCode(enum.StrEnum):
    """Why one gang of a :class:`BindPlan` was not bound."""

    NO_JOB = "no_job"
    NOT_PENDING = "not_pending"
    STALE_PLAN = "stale_plan"
    IN_BACKOFF = "in_backoff"
    UNCONFIRMED_MEMBERS = "unconfirmed_members"
    WRONG_SIZE = "wrong_size"
    WRONG_RANKS = "wrong_ranks"
    NO_NODE = "no_node"
    NODE_UNSCHEDULABLE = "node_unschedulable"
    NO_IMAGES = "no_images"
    WRONG_GPU_COUNT = "wrong_gpu_count"
    NO_SUCH_GPU = "no_such_gpu"
    GPU_IN_USE = "gpu_in_use"
    GPU_UNHEALTHY = "gpu_unhealthy"
    NODE_UNFIT = "node_unfit"
    NO_ROOM = "no_room"
    TOPOLOGY_SPAN = "topology_span"
    OVER_QUOTA = "over_quota"
    ARRAY_THROTTLE = "array_throttle"
    MEMBER_CAP = "member_cap"
    NODE_SELECTOR = "node_selector"  # a node the job's selector does not allow
    SPARE_NODE = "spare_node"  # a node kept as a hot spare (core/spares.py)


@dataclass(frozen=True, slots=True)
class Rejection:
    """One gang of a plan that was not bound: the code, and a sentence for people."""

    job_id: str
    code: RejectCode
    message: str


class ResultCode(enum.StrEnum):
    OK = "ok"
    INVALID = "invalid"  # the command itself is malformed
    NOT_FOUND = "not_found"
    CONFLICT = "conflict"  # valid, but not in the current state (stale, wrong status)
    INTERNAL = "internal"  # a bug: apply caught an unexpected error


@dataclass(frozen=True, slots=True)
class Result:
    """What applying a command did. ``apply`` returns one; it never raises."""

    code: ResultCode
    message: str = ""
    job_id: str = ""
    # SubmitJob: True when this command added the job, False when its request id was
    # already known (the existing job's id is returned).
    created: bool = False
    # BindPlan: job ids bound, and the gangs rejected (GrowMembers: gangs grown, growths
    # rejected). ReportMembers: counts.
    bound: tuple[str, ...] = ()
    rejected: tuple[Rejection, ...] = ()
    # MarkNodeDead: jobs whose attempt it stopped. PurgeFinished: jobs removed.
    stopped: tuple[str, ...] = ()
    # MarkNodeDead, ReportGpuHealth: gangs kept running with ranks to place again.
    # ReplaceMembers: "<job id> rank <r>" of each rank placed again.
    replacing: tuple[str, ...] = ()
    purged: tuple[str, ...] = ()
    accepted_events: int = 0
    stale_events: int = 0
    details: tuple[tuple[str, str], ...] = field(default_factory=tuple)

    @property
    def ok(self) -> bool:
        return self.code is ResultCode.OK


def ok(message: str = "", **kwargs: object) -> Result:
    return Result(ResultCode.OK, message, **kwargs)  # type: ignore[arg-type]


def error(code: ResultCode, message: str, **kwargs: object) -> Result:
    return Result(code, message, **kwargs)  # type: ignore[arg-type]
