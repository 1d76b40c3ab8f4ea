"""The cluster's replicated configuration: timeouts, limits, priority classes, queues
and the scheduling and preemption settings (``ClusterConfig``), changed only by
replicated commands. Re-exported by :mod:`synapse_ha.core.model`."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from synapse_ha.core.identity.access import DEFAULT_QUEUE_NAME

# --------------------------------------------------------------------------- config


DEFAULT_TOPOLOGY_LEVELS: tuple[str, ...] = ("zone", "block", "rack")
LOCALITY_WAIT_MS = 600_000  # see ClusterConfig.locality_wait_ms
MAX_LOCALITY_WAIT_MS = 86_400_000
MAX_REQUEUES = 5  # see ClusterConfig.max_requeues
MAX_REQUEUES_LIMIT = 1_000
START_TIMEOUT_MS = 60_000  # see ClusterConfig.start_timeout_ms
MIN_START_TIMEOUT_MS = 1_000
MAX_START_TIMEOUT_MS = 86_400_000
FAIR_SHARE_HALF_LIFE_MS = 7 * 86_400_000  # see ClusterConfig.fair_share_half_life_ms
DEFAULT_GRACE_MS = 30_000  # see PriorityClass.grace_ms
MAX_MIN_RUNTIME_MS = 7 * 86_400_000  # see PriorityClass.min_runtime_ms, Queue.min_runtime_ms
MAX_DEFAULT_TIME_LIMIT_MS = 366 * 86_400_000  # see Queue.default_time_limit_ms
RECLAIM_WAIT_MAX_MS = 600_000  # see ClusterConfig.reclaim_wait_max_ms
MAX_RECLAIM_WAIT_MS = 86_400_000
MAX_SPARES = 1_000  # see ClusterConfig.spares
MAX_RESERVATIONS_PER_PASS = 16  # see ClusterConfig.reservations_per_pass
DEFAULT_QUEUE = DEFAULT_QUEUE_NAME  # the built-in queue without a quota


class PreemptionMode(enum.StrEnum):
    """How the scheduler chooses preemption victims (DESIGN §8).

    ``TOPOLOGY``: the cheapest set of whole gangs whose removal gives the preemptor a
    placement that satisfies its topology. ``BLIND``: whole gangs, lowest priority first
    and newest first, until enough GPUs are free, wherever they are (the way Kueue and
    Volcano choose; kept as a baseline for the simulator). ``OFF``: never preempt.
    """

    TOPOLOGY = "topology"
    BLIND = "blind"
    OFF = "off"


class PreemptionKind(enum.StrEnum):
    """Why a gang is preempted: ``RECLAIM`` gives a queue below its nominal quota back
    what a borrowing queue of its cohort holds; ``PRIORITY`` lets a higher priority class
    evict a lower one within one queue, when its class allows; ``FAIR_SHARE`` lets a queue
    below its fair share take what a borrowing queue above it holds, where the cohort they
    meet in has ``fair_sharing_preemption`` on (:mod:`synapse_ha.core.queues.fair_preemption`)."""

    RECLAIM = "reclaim"
    PRIORITY = "priority"
    FAIR_SHARE = "fair_share"


@dataclass(frozen=True, slots=True)
class PriorityClass:
    """A named priority. ``value``: higher runs first. ``preempts``: a pending gang of this
    class may evict gangs of lower classes of its own queue. ``grace_ms``: how long a
    victim of this class has between SIGTERM and SIGKILL. ``min_runtime_ms``: how long
    a gang of this class runs, from the bind of its attempt, before it may be a victim
    (:mod:`synapse_ha.core.queues.victim_rules`; 0: at once)."""

    name: str
    value: int
    preempts: bool = False
    grace_ms: int = DEFAULT_GRACE_MS
    min_runtime_ms: int = 0


DEFAULT_PRIORITY_CLASSES: tuple[PriorityClass, ...] = (
    PriorityClass("low", -100),
    PriorityClass("normal", 0),
    PriorityClass("high", 100, preempts=True),
)


@dataclass(frozen=True, slots=True)
class Queue:
    """A queue of the replicated configuration (DESIGN §8).

    ``gpu``: nominal GPU quota; None means no quota at all (the built-in ``default``
    queue, so a cluster without queues behaves as one queue for everyone).
    ``cpu_milli`` / ``memory_mib``: optional nominal CPU and memory; None: not limited.
    ``cohort``: queues of one cohort lend each other idle nominal quota; "" is a cohort
    of its own. ``borrowing_limit_gpu``: how many GPUs beyond its nominal the queue may
    borrow (None: any idle cohort quota). ``lending_limit_gpu``: how many of its idle
    nominal GPUs others may borrow (None: all of them). ``priority_classes``: the classes
    its jobs may use (empty: every class that does not preempt; a class that preempts
    must be listed). ``max_priority``: the highest priority (a number, or a class's
    value) a user may give a job here without a token that allows more
    (:func:`synapse_ha.core.identity.access.priority_refusal`). ``min_runtime_ms``: the least
    time a gang of this queue runs before it may be a victim; the longer of this and
    its class's ``min_runtime_ms`` holds (:mod:`synapse_ha.core.queues.victim_rules`).
    ``running_members_per_user`` / ``members_per_node_per_user``: the member caps of
    :class:`Limits` for this queue's gangs (None: the cluster's).
    ``default_time_limit_ms``: how long a job of this queue without a ``time_limit`` is
    expected to run (Slurm's DefaultTime; 0: unknown); ``learned_estimates``: expect
    instead what the history of alike jobs says. Both are estimates for reservations and
    backfill only, never a limit a job is stopped at
    (:mod:`synapse_ha.core.queues.estimates`).
    """

    name: str
    gpu: int | None = None
    cpu_milli: int | None = None
    memory_mib: int | None = None
    cohort: str = ""
    borrowing_limit_gpu: int | None = None
    lending_limit_gpu: int | None = None
    priority_classes: tuple[str, ...] = ()
    max_priority: int = 0
    min_runtime_ms: int = 0
    running_members_per_user: int | None = None
    members_per_node_per_user: int | None = None
    default_time_limit_ms: int = 0
    learned_estimates: bool = False


@dataclass(frozen=True, slots=True)
class Cohort:
    """A cohort of the cohort tree (DESIGN §8, :mod:`synapse_ha.core.queues.cohort_tree`).

    ``parent``: the cohort it belongs to ("" : a root). ``gpu``: the cohort's own
    nominal GPUs, shared by the queues below it (None: none of its own).
    ``borrowing_limit_gpu``: how many GPUs its subtree may take from its parent's pool
    beyond what the subtree itself has (None: any). ``lending_limit_gpu``: how many of
    its subtree's idle GPUs its parent's other children may borrow (None: all of them).
    ``fair_sharing_preemption``: a queue below its fair share may preempt gangs of a
    borrowing queue above it when this is the cohort where the two queues meet (their
    nearest common cohort; :mod:`synapse_ha.core.queues.fair_preemption`). Off by default.
    A queue's ``cohort`` names the cohort it sits in; a name no record defines is a root
    cohort of its own, with no quota, limits or switches of its own.
    """

    name: str
    parent: str = ""
    gpu: int | None = None
    borrowing_limit_gpu: int | None = None
    lending_limit_gpu: int | None = None
    fair_sharing_preemption: bool = False


@dataclass(frozen=True, slots=True)
class QueueHistory:
    """A queue's past usage for fair share, decayed with ``fair_share_half_life_ms``:
    resource-milliseconds of its ended attempts (GPU-ms, CPU millicore-ms, MiB-ms), as
    of ``at_ms``. Integers only, so every replica holds the same bytes."""

    gpu_ms: int = 0
    cpu_milli_ms: int = 0
    memory_mib_ms: int = 0
    at_ms: int = 0


@dataclass(frozen=True, slots=True)
class Timeouts:
    """The timeouts that together guarantee no duplicate execution (DESIGN §4); their
    rules are :func:`synapse_ha.core.spec.validation.check_timeouts`."""

    heartbeat_interval_ms: int = 1_000
    lease_ttl_ms: int = 4_000
    leader_step_down_ms: int = 2_000
    dead_timeout_ms: int = 10_000
    safety_margin_ms: int = 1_000


@dataclass(frozen=True, slots=True)
class Limits:
    """What one identity may take of the control plane (DESIGN §8), part of the
    replicated configuration. The rules are :mod:`synapse_ha.core.identity.admission`.

    ``spec_bytes`` / ``env_bytes``: the size of a job spec and of its environment, for
    everyone (a spec is replicated to every replica and kept until the job is purged).
    The others bind users and operators; admins, replicas and workers are not limited by
    them: ``pending_jobs_per_user`` and ``pending_jobs_per_queue`` cap pending jobs;
    ``submit_burst`` / ``submit_per_s`` are a token bucket per identity on each replica
    (the replica that receives a SubmitJob, leader or not, charges it);
    ``watch_streams_per_identity`` / ``watch_streams_total``: open WatchEvents streams on
    one replica, each of which holds a server thread.

    What one user's members may take of the nodes (:mod:`synapse_ha.core.spec.member_limits`,
    in force once every replica reads its format): a node reserves for each member at
    least ``member_min_cpu_milli`` and ``member_min_memory_mib``, plus
    ``member_overhead_memory_mib`` for the member's supervisor, whatever the member asked
    (what it asked stays its cgroup limit); ``running_members_per_user`` and
    ``members_per_node_per_user`` cap the members of one owner's live attempts, in the
    cluster and on one node (a queue may set its own), for every owner, admins' too.
    """

    spec_bytes: int = 64 * 1024
    env_bytes: int = 32 * 1024
    pending_jobs_per_user: int = 10_000
    pending_jobs_per_queue: int = 100_000
    submit_burst: int = 200
    submit_per_s: int = 50
    watch_streams_per_identity: int = 4
    watch_streams_total: int = 32
    member_min_cpu_milli: int = 100
    member_min_memory_mib: int = 64
    member_overhead_memory_mib: int = 4
    running_members_per_user: int = 10_000
    members_per_node_per_user: int = 128


@dataclass(frozen=True, slots=True)
class ClusterConfig:
    """Cluster-wide settings, part of the replicated state.

    ``topology_levels`` are the named levels above a host, outermost first; the host
    itself is always the innermost level and is not listed.

    ``locality_wait_ms`` bounds how long a multi-member gang that could fit inside one
    domain of its preferred level (by default the innermost level, e.g. one rack) waits,
    counted from when it was queued, for such a domain to have room before it accepts
    a placement across domains; 0 places it across domains at once.

    ``max_requeues`` bounds how often one job is requeued by disruptions it did not cause
    (its node declared dead, its members fenced or lost by their worker); these do not
    count against the job's ``retries.max`` (DESIGN §4). A job disrupted once more fails.

    ``start_timeout_ms``: an attempt with a member not reported running this long after
    it was bound fails (the leader proposes :class:`~synapse_ha.core.commands.FailAttempt`);
    it counts against ``retries.max``, since a member that does not start is most often
    the job's own doing (an image that does not pull, a command that hangs before exec).

    ``compact_state``: the state (snapshots, ``GetReplicaState``, backups) is written
    as lists of field values, without trailing fields that hold their defaults: about
    40 % of the bytes (:mod:`synapse_ha.core.codec.versioned`). A release before the one that has
    this field cannot read such a state, so it is turned on only once every replica runs
    this release.

    ``reclaim_wait_max_ms``: a gang that reclaims its queue's nominal quota and has
    waited this long (since it was queued) may preempt gangs still within their minimum
    run time (:mod:`synapse_ha.core.queues.victim_rules`).
    """

    topology_levels: tuple[str, ...] = DEFAULT_TOPOLOGY_LEVELS
    timeouts: Timeouts = field(default_factory=Timeouts)
    retention_ms: int = 3_600_000
    master_port_base: int = 29_500
    master_port_span: int = 10_000
    locality_wait_ms: int = LOCALITY_WAIT_MS
    max_requeues: int = MAX_REQUEUES
    start_timeout_ms: int = START_TIMEOUT_MS
    priority_classes: tuple[PriorityClass, ...] = DEFAULT_PRIORITY_CLASSES
    fair_share_half_life_ms: int = FAIR_SHARE_HALF_LIFE_MS
    preemption: PreemptionMode = PreemptionMode.TOPOLOGY
    compact_state: bool = False
    limits: Limits = field(default_factory=Limits)
    # Drain a node once this many of its GPUs are unhealthy (0: never drain for that).
    gpu_drain_threshold: int = 0
    # A node that could not start an owner's member skips that owner's gangs this long,
    # and is cordoned after this many such failures in a row (0: never cordoned for it).
    unfit_backoff_ms: int = 600_000
    cordon_after_start_failures: int = 3
    # Keep an ended attempt's resources (and GPUs) reserved until each member is
    # confirmed stopped or its node is declared dead, instead of freeing them when the
    # attempt ends (DESIGN §4). Needs format 3 on every replica (core/codec/formats.py).
    hold_until_stopped: bool = False
    # A node whose worker registers from a new boot (NodeInfo.boot_id) has its GPU faults
    # cleared: its worker reports again what NVML still finds wrong after the reboot.
    clear_gpu_faults_on_reboot: bool = False
    reclaim_wait_max_ms: int = RECLAIM_WAIT_MAX_MS
    # Relayed heartbeats: followers terminate workers' heartbeat streams and forward them
    # to the leader in batches (synapse_ha/rpc/relay.py); needs format 8 on every replica.
    relay_heartbeats: bool = False
    # Hot spares (core/spares.py): this many idle nodes of each domain at ``spare_level``
    # ("": the level named "rack" when the cluster has one, else the whole cluster) are
    # kept out of normal placement, for member replacements. Needs format 14.
    spares: int = 0
    spare_level: str = ""
    # Defragmentation (core/scheduler/defrag.py): at most this percentage of the schedulable
    # nodes (rounded down) is held at once for gangs of starved queues that wait only
    # because free GPUs are scattered (0, the default: never). Needs format 17.
    defrag_share_pct: int = 0
    # Reservations per pass (core/scheduler/reservation.py): the first this many gangs that
    # cannot be placed each reserve nodes where they will start, and a later gang may use
    # reserved nodes only if it ends before every reservation holding them (Slurm's
    # ``bf_max_job_test``). 1, the default: the first gang only. Needs format 18.
    reservations_per_pass: int = 1

    def reservations_rule(self) -> str | None:
        """The rule ``reservations_per_pass`` breaks, or None."""
        if 1 <= self.reservations_per_pass <= MAX_RESERVATIONS_PER_PASS:
            return None
        return f"must be between 1 and {MAX_RESERVATIONS_PER_PASS}"

    def levels_with_host(self) -> tuple[str, ...]:
        return (*self.topology_levels, "host")
