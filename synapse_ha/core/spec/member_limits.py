"""Floors and caps on members, so that one user cannot swamp a node with tiny tasks.

Every member runs under a supervisor of its own on its node, and a member that asks for
almost nothing still costs its node a process tree and some memory. So, once every
replica reads :data:`MEMBER_LIMITS_FORMAT` (before, none of this is in force: a replica
of an older release would account differently), three rules of
:class:`~synapse_ha.core.cluster_config.Limits` hold:

* **Floor.** A node reserves for each member at least ``member_min_cpu_milli`` and
  ``member_min_memory_mib``, whatever it asked (:meth:`MemberRules.reserved`), so ``N``
  tiny members fit only where ``N`` times the floor does. What a member asked stays what
  it is limited to: a member that asks for no CPU or memory is still not put under a
  CPU or memory limit (its spec is unchanged, and the worker reads its spec).
* **Supervisor.** A node also reserves ``member_overhead_memory_mib`` per member for the
  member's supervisor, which runs outside the member's own limits.
* **Caps.** One owner's live attempts have at most ``running_members_per_user`` members
  in the cluster and ``members_per_node_per_user`` on one node; a queue may set either
  for its own gangs (``Queue.running_members_per_user``, ...), replacing the cluster's.
  The count is every member of the owner's live attempts, in any queue
  (:mod:`synapse_ha.core.member_counts`), so an array counts task by task. A gang the
  caps do not admit waits with a reason naming the cap and its value
  (``WAITING_MEMBER_CAP``); the state machine checks the caps again when it binds.

What a member reserves is fixed when its attempt is bound (``Attempt.reserved``): a
later change of the floor changes what new attempts reserve, never what a bound one
frees. Queue quotas and fair share count what members ask, not what their nodes reserve.
"""

from __future__ import annotations

from dataclasses import dataclass

from synapse_ha.core.cluster_config import Queue
from synapse_ha.core.identity.admission import LimitName
from synapse_ha.core.member_counts import MemberCounts
from synapse_ha.core.model import ClusterState, Job, Resources
from synapse_ha.core.reasons import Reason, ReasonCode, reason

MEMBER_LIMITS_FORMAT = 10  # the format from which the floors and caps are in force
UNCAPPED = 1 << 62


@dataclass(frozen=True, slots=True)
class MemberRules:
    """The floors and caps in force (see the module's docstring); the defaults are none."""

    min_cpu_milli: int = 0
    min_memory_mib: int = 0
    overhead_memory_mib: int = 0
    running_per_user: int = UNCAPPED
    per_node_per_user: int = UNCAPPED

    def reserved(self, request: Resources) -> Resources:
        """What a node reserves for one member that asks for ``request`` (``request``
        itself when the rules add nothing to it)."""
        cpu = max(request.cpu_milli, self.min_cpu_milli)
        memory = max(request.memory_mib, self.min_memory_mib) + self.overhead_memory_mib
        if cpu == request.cpu_milli and memory == request.memory_mib:
            return request
        return Resources(cpu, memory, request.gpu)

    def caps(self, queue: Queue | None) -> tuple[MemberCap, MemberCap]:
        """The caps on running members in the cluster and on one node for a gang of
        ``queue``: the queue's own where it sets one, else the cluster's."""
        if self is NO_RULES or queue is None:
            return (
                MemberCap(LimitName.RUNNING_MEMBERS_PER_USER, self.running_per_user),
                MemberCap(LimitName.MEMBERS_PER_NODE_PER_USER, self.per_node_per_user),
            )
        running, per_node = queue.running_members_per_user, queue.members_per_node_per_user
        return (
            MemberCap(LimitName.RUNNING_MEMBERS_PER_USER, self.running_per_user)
            if running is None
            else MemberCap(LimitName.RUNNING_MEMBERS_PER_USER, running, queue.name),
            MemberCap(LimitName.MEMBERS_PER_NODE_PER_USER, self.per_node_per_user)
            if per_node is None
            else MemberCap(LimitName.MEMBERS_PER_NODE_PER_USER, per_node, queue.name),
        )


NO_RULES = MemberRules()


@dataclass(frozen=True, slots=True)
class MemberCap:
    """One cap: which (``limit``), its value (``allowed``) and the queue that set it
    ("": the cluster's ``limits``)."""

    limit: LimitName
    allowed: int
    queue: str = ""

    def named(self) -> str:
        """``limits.running_members_per_user`` or ``queue q's running_members_per_user``."""
        return f"queue {self.queue}'s {self.limit}" if self.queue else f"limits.{self.limit}"


def rules_in_force(state: ClusterState) -> MemberRules:
    """The floors and caps of ``state``'s configuration, or none while not every replica
    reads :data:`MEMBER_LIMITS_FORMAT`."""
    if state.format_floor < MEMBER_LIMITS_FORMAT:
        return NO_RULES
    limits = state.config.limits
    return MemberRules(
        limits.member_min_cpu_milli,
        limits.member_min_memory_mib,
        limits.member_overhead_memory_mib,
        limits.running_members_per_user,
        limits.members_per_node_per_user,
    )


def reserved_of(job: Job) -> Resources:
    """What each member of ``job``'s current (or last) attempt reserves on its node."""
    attempt = job.attempt
    if attempt is None or attempt.reserved is None:
        return job.spec.resources
    return attempt.reserved


def member_counts(state: ClusterState) -> MemberCounts:
    """Each owner's members, in the cluster and per node: the index itself, built on
    first use (from the live jobs) and kept by ``job_state_changed``. Do not change it."""
    counts = state._members
    if counts is None:
        jobs = state.jobs
        counts = state._members = MemberCounts.build(
            (job_id, job.owner, attempt)
            for job_id in state.live_ids()
            if (attempt := (job := jobs[job_id]).attempt) is not None
        )
    return counts


# ------------------------------------------------------------------------- refusals


def cap_reason(cap: MemberCap, owner: str, members: int, **counted: int) -> Reason:
    """Why a gang of ``members`` members of ``owner`` waits at ``cap``, with what was
    counted: ``running`` (its owner's running members, which with its own would pass the
    cluster's cap) or ``nodes`` (the nodes its owner's members fill to ``cap``: each lacks
    room under the cap for the whole gang, which would fit but for them)."""
    return reason(
        ReasonCode.WAITING_MEMBER_CAP,
        limit=str(cap.limit),
        allowed=cap.allowed,
        queue=cap.queue or None,
        user=owner,
        members=members,
        **counted,
    )


def running_cap_reason(cap: MemberCap, owner: str, running: int, members: int) -> Reason:
    """A gang whose owner's running members and its own would pass ``cap``."""
    return cap_reason(cap, owner, members, running=running)


def node_cap_reason(cap: MemberCap, owner: str, nodes: int, members: int) -> Reason:
    """A gang that would fit but for the ``nodes`` nodes its owner's members fill to
    ``cap``."""
    return cap_reason(cap, owner, members, nodes=nodes)


def cap_refusal(
    rules: MemberRules, queue: Queue | None, counts: MemberCounts, owner: str, nodes: list[str]
) -> str | None:
    """Why a gang of ``owner`` whose members go to ``nodes`` (one entry per member) may
    not be bound under the caps of ``rules`` for ``queue``, or None when it may."""
    if rules is NO_RULES:
        return None
    running_cap, node_cap = rules.caps(queue)
    running = counts.running(owner)
    if running + len(nodes) > running_cap.allowed:
        return (
            f"user {owner} runs {running} member(s) and this gang has {len(nodes)}; "
            f"{running_cap.named()} allows {running_cap.allowed}"
        )
    here: dict[str, int] = {}
    for node_id in nodes:
        here[node_id] = here.get(node_id, 0) + 1
    for node_id, count in sorted(here.items()):
        on = counts.on(owner, node_id)
        if on + count > node_cap.allowed:
            return (
                f"user {owner} runs {on} member(s) on node {node_id} and this gang puts "
                f"{count} there; {node_cap.named()} allows {node_cap.allowed}"
            )
    return None
