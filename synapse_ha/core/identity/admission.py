"""What an identity may submit (DESIGN §8): per-identity limits, authorised priority and
request ids scoped to their owner. Pure rules; the replica that receives a SubmitJob
applies them before it proposes anything, so a refused submission changes nothing.

* **Sizes** (:func:`size_refusal`): a spec larger than ``Limits.spec_bytes`` (its
  encoding, as it would be replicated) or an environment larger than
  ``Limits.env_bytes`` (names and values, in UTF-8) is refused, whoever submits it.
* **Pending jobs** (:func:`pending_refusal`): a user or operator with
  ``Limits.pending_jobs_per_user`` pending jobs, or a queue with
  ``Limits.pending_jobs_per_queue``, takes no more until some start or end. Admins,
  replicas and workers are not limited (:func:`limited`).
* **Priority** (:func:`priority_refusal`): a class that preempts needs a queue that lists
  it *and* a credential allowed to use it (role admin or operator, or a token naming the
  class); a priority above the queue's ``max_priority`` (a number, or a class's value)
  needs role admin or operator, or a token whose ``max_priority`` reaches it.
* **Members** (:mod:`synapse_ha.core.spec.member_limits`): the floor and supervisor's share a
  node reserves per member, and the caps on one owner's running members, which the
  scheduler and the state machine apply to every owner.
* **Request ids** (:func:`scoped_request_id`): a user's idempotency key is stored as
  ``<owner>/<request id>``, so the same id from two users makes two jobs, and nobody can
  take over, or learn about, another user's submission by guessing its id. Owner names
  and request ids never contain ``/``, so scoped and unscoped ids (recorded by releases
  before scoping) never collide.

Each refusal is a value with the rule, the limit and the figure, for the API to turn
into RESOURCE_EXHAUSTED or PERMISSION_DENIED.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from synapse_ha.core import commands as cmd
from synapse_ha.core.cluster_config import Limits, PriorityClass, Queue
from synapse_ha.core.codec.versioned import encode_command
from synapse_ha.core.identity.access import (
    AccessRefusal,
    AccessRefusalCode,
    Identity,
    Kind,
    Role,
    describe_caller,
)
from synapse_ha.core.model import ClusterState, JobSpec, JobState
from synapse_ha.core.spec.validation import MAX_NAME, MAX_PRIORITY, NAME_PATTERN, Violation, invalid

REQUEST_SCOPE_SEPARATOR = "/"

# Upper bounds of the limits themselves: a spec must still fit a gRPC message, and the
# stream counts are threads of one replica.
MAX_SPEC_BYTES = 3 * 1024 * 1024
MAX_PENDING_JOBS = 10_000_000
MAX_SUBMIT_BURST = 1_000_000
MAX_SUBMIT_PER_S = 1_000_000
MAX_WATCH_STREAMS = 1_024
MAX_MEMBER_FLOOR_CPU_MILLI = 64_000  # a floor above a large node's CPU would fit nothing
MAX_MEMBER_FLOOR_MEMORY_MIB = 256 * 1024
MAX_MEMBERS = 10_000_000


class LimitName(enum.StrEnum):
    """A limit, by its name in ``synctl config set limits.<name>=`` and in refusals."""

    SPEC_BYTES = "spec_bytes"
    ENV_BYTES = "env_bytes"
    PENDING_JOBS_PER_USER = "pending_jobs_per_user"
    PENDING_JOBS_PER_QUEUE = "pending_jobs_per_queue"
    SUBMIT_BURST = "submit_burst"
    SUBMIT_PER_S = "submit_per_s"
    WATCH_STREAMS_PER_IDENTITY = "watch_streams_per_identity"
    WATCH_STREAMS_TOTAL = "watch_streams_total"
    MEMBER_MIN_CPU_MILLI = "member_min_cpu_milli"
    MEMBER_MIN_MEMORY_MIB = "member_min_memory_mib"
    MEMBER_OVERHEAD_MEMORY_MIB = "member_overhead_memory_mib"
    RUNNING_MEMBERS_PER_USER = "running_members_per_user"
    MEMBERS_PER_NODE_PER_USER = "members_per_node_per_user"


@dataclass(frozen=True, slots=True)
class LimitExceeded:
    """A refusal by a limit: which one, its value, the figure the request would reach
    (``actual``), and a sentence a person can act on."""

    limit: LimitName
    allowed: int
    actual: int
    message: str


def limited(identity: Identity) -> bool:
    """Whether the per-identity limits bind ``identity``: users and operators do;
    admins, replicas and workers do not."""
    return identity.kind is Kind.USER and identity.role is not Role.ADMIN


# ------------------------------------------------------------------------- sizes


def spec_bytes(spec: JobSpec) -> int:
    """The size of ``spec`` as the log replicates it (its canonical encoding)."""
    return len(encode_command(cmd.SubmitJob(spec=spec, request_id="")))


def env_bytes(spec: JobSpec) -> int:
    """The size of ``spec``'s environment: every name and value in UTF-8."""
    return sum(len(name.encode()) + len(value.encode()) for name, value in spec.env)


def size_refusal(limits: Limits, spec: JobSpec) -> LimitExceeded | None:
    """None when ``spec`` fits both size limits, else the first it exceeds."""
    env = env_bytes(spec)
    if env > limits.env_bytes:
        return LimitExceeded(
            LimitName.ENV_BYTES,
            limits.env_bytes,
            env,
            f"the job's environment is {env} bytes; limits.env_bytes allows {limits.env_bytes}"
            " (put large values in files the job reads)",
        )
    size = spec_bytes(spec)
    if size > limits.spec_bytes:
        return LimitExceeded(
            LimitName.SPEC_BYTES,
            limits.spec_bytes,
            size,
            f"the job spec is {size} bytes; limits.spec_bytes allows {limits.spec_bytes}",
        )
    return None


# ------------------------------------------------------------------ pending jobs


@dataclass(frozen=True, slots=True)
class PendingCounts:
    """Pending jobs of one owner and of one queue."""

    owner: int
    queue: int


def pending_counts(state: ClusterState, owner: str, queue: str) -> PendingCounts:
    """How many jobs ``owner`` has pending, and how many wait in ``queue``."""
    mine = in_queue = 0
    pending = JobState.PENDING
    for job in state.jobs.values():
        if job.state is not pending:
            continue
        if job.owner == owner:
            mine += 1
        if job.spec.queue == queue:
            in_queue += 1
    return PendingCounts(mine, in_queue)


def pending_refusal(
    limits: Limits, counts: PendingCounts, owner: str, queue: str, more: int = 1
) -> LimitExceeded | None:
    """None when ``more`` jobs may join the ``counts`` already pending, else which cap
    they would pass."""
    if counts.owner + more > limits.pending_jobs_per_user:
        return LimitExceeded(
            LimitName.PENDING_JOBS_PER_USER,
            limits.pending_jobs_per_user,
            counts.owner,
            f"user {owner} has {counts.owner} pending jobs; limits.pending_jobs_per_user "
            f"allows {limits.pending_jobs_per_user}: submit more once some have started or "
            "ended (or cancel some)",
        )
    if counts.queue + more > limits.pending_jobs_per_queue:
        return LimitExceeded(
            LimitName.PENDING_JOBS_PER_QUEUE,
            limits.pending_jobs_per_queue,
            counts.queue,
            f"queue {queue} has {counts.queue} pending jobs; limits.pending_jobs_per_queue "
            f"allows {limits.pending_jobs_per_queue}",
        )
    return None


# ------------------------------------------------------------------------ priority


@dataclass(frozen=True, slots=True)
class PriorityGrant:
    """What a credential allows beyond a queue's own rules: a token's
    ``priority_classes`` and ``max_priority`` (a certificate allows nothing more)."""

    classes: tuple[str, ...] = ()
    max_priority: int = 0


def effective_priority(spec: JobSpec, classes: Iterable[PriorityClass]) -> int:
    """The priority ``spec`` runs at: its class's value, else its number."""
    for c in classes:
        if c.name == spec.priority_class:
            return c.value
    return spec.priority


def priority_refusal(
    identity: Identity,
    spec: JobSpec,
    queue: Queue,
    classes: Sequence[PriorityClass],
    grant: PriorityGrant,
) -> AccessRefusal | None:
    """None when ``identity`` may submit ``spec`` at its priority to ``queue``, else a
    PERMISSION_DENIED naming the class or the figure and the rule. The class is assumed to
    exist (:func:`synapse_ha.core.queues.job_rules.check_job_queue` says when it does not)."""
    trusted = identity.kind is Kind.USER and identity.role in (Role.ADMIN, Role.OPERATOR)
    who = describe_caller(identity)
    cls = next((c for c in classes if c.name == spec.priority_class), None)
    if cls is not None and cls.preempts:
        if cls.name not in queue.priority_classes:
            return AccessRefusal(
                AccessRefusalCode.PERMISSION_DENIED,
                f"{who} may not use priority class {cls.name} in queue {queue.name}: a class "
                f"that preempts must be listed by the queue (synctl queue set {queue.name} "
                f"--priority-class {cls.name} ...)",
            )
        if not trusted and cls.name not in grant.classes:
            return AccessRefusal(
                AccessRefusalCode.PERMISSION_DENIED,
                f"{who} may not use priority class {cls.name}: it preempts other gangs, which "
                "needs role operator or admin, or a token allowing the class (synctl token "
                f"create --priority-class {cls.name})",
            )
        return None
    priority = effective_priority(spec, classes)
    if priority <= queue.max_priority or trusted or priority <= grant.max_priority:
        return None
    what = f"priority class {cls.name} (value {priority})" if cls else f"priority {priority}"
    return AccessRefusal(
        AccessRefusalCode.PERMISSION_DENIED,
        f"{who} may not submit {what} to queue {queue.name}: the queue allows up to "
        f"{queue.max_priority} (its max_priority); more needs role operator or admin, or a "
        f"token allowing it (synctl token create --max-priority {priority})",
    )


def check_priority_allowance(classes: Sequence[str], max_priority: int) -> list[Violation]:
    """The rules for a token's ``priority_classes`` and ``max_priority`` and a queue's
    ``max_priority``: known to nothing but their own range (classes may be defined later)."""
    out = []
    if not -MAX_PRIORITY <= max_priority <= MAX_PRIORITY:
        out.append(invalid("max_priority", f"must be between -{MAX_PRIORITY} and {MAX_PRIORITY}"))
    if len(set(classes)) != len(classes):
        out.append(invalid("priority_classes", "must not repeat a class"))
    for i, name in enumerate(classes):
        if not NAME_PATTERN.match(name) or len(name) > MAX_NAME:
            out.append(
                invalid(f"priority_classes[{i}]", "lowercase letters, digits and -, at most 63")
            )
    return out


# --------------------------------------------------------------------- request ids


def scoped_request_id(owner: str, request_id: str) -> str:
    """The idempotency key ``owner``'s ``request_id`` is stored under."""
    return f"{owner}{REQUEST_SCOPE_SEPARATOR}{request_id}"


def shown_request_id(owner: str, stored: str) -> str:
    """The request id as ``owner`` gave it (``stored`` scoped or not)."""
    prefix = f"{owner}{REQUEST_SCOPE_SEPARATOR}"
    return stored[len(prefix) :] if stored.startswith(prefix) else stored


def request_key(state: ClusterState, owner: str, request_id: str) -> str:
    """The key to propose for ``owner``'s ``request_id``: the scoped one, unless a job of
    ``owner`` was recorded under the bare id by a release before scoping (then that, so
    the retry finds it)."""
    legacy = state.request_ids.get(request_id)
    if legacy is not None:
        job = state.jobs.get(legacy)
        if job is not None and job.owner == owner:
            return request_id
    return scoped_request_id(owner, request_id)


# ------------------------------------------------------------------------ the limits


def check_limits(limits: Limits) -> list[Violation]:
    """Every rule ``limits`` breaks, each field named ``limits.<name>``."""
    bounds = {
        LimitName.SPEC_BYTES: (1024, MAX_SPEC_BYTES),
        LimitName.ENV_BYTES: (0, MAX_SPEC_BYTES),
        LimitName.PENDING_JOBS_PER_USER: (1, MAX_PENDING_JOBS),
        LimitName.PENDING_JOBS_PER_QUEUE: (1, MAX_PENDING_JOBS),
        LimitName.SUBMIT_BURST: (1, MAX_SUBMIT_BURST),
        LimitName.SUBMIT_PER_S: (1, MAX_SUBMIT_PER_S),
        LimitName.WATCH_STREAMS_PER_IDENTITY: (1, MAX_WATCH_STREAMS),
        LimitName.WATCH_STREAMS_TOTAL: (1, MAX_WATCH_STREAMS),
        LimitName.MEMBER_MIN_CPU_MILLI: (0, MAX_MEMBER_FLOOR_CPU_MILLI),
        LimitName.MEMBER_MIN_MEMORY_MIB: (0, MAX_MEMBER_FLOOR_MEMORY_MIB),
        LimitName.MEMBER_OVERHEAD_MEMORY_MIB: (0, MAX_MEMBER_FLOOR_MEMORY_MIB),
        LimitName.RUNNING_MEMBERS_PER_USER: (1, MAX_MEMBERS),
        LimitName.MEMBERS_PER_NODE_PER_USER: (1, MAX_MEMBERS),
    }
    out = []
    for name, (low, high) in bounds.items():
        value = getattr(limits, name.value)
        if type(value) is not int or not low <= value <= high:
            out.append(invalid(f"limits.{name}", f"must be a whole number from {low} to {high}"))
    if not out and limits.env_bytes > limits.spec_bytes:
        out.append(invalid("limits.env_bytes", "must not exceed limits.spec_bytes"))
    if not out and limits.watch_streams_per_identity > limits.watch_streams_total:
        out.append(
            invalid(
                "limits.watch_streams_per_identity", "must not exceed limits.watch_streams_total"
            )
        )
    return out
