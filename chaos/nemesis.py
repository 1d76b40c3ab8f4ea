"""The fault schedule, generated up front from a seed and saved with the run.

A schedule is a list of :class:`Step` values: which fault, how long it lasts and how long
to wait before it. Targets that only exist at run time ("the leader", "a worker running a
gang") are resolved then, with ``pick`` choosing among candidates deterministically; the
run records what each step hit. Durations derive from the cluster's timeouts so that each
fault crosses the threshold it is meant to (lease, dead timeout, election timeout).
"""

from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass, replace
from pathlib import Path

ISOLATE_LEADER = "isolate-leader"
ISOLATE_FOLLOWER = "isolate-follower"
BRIDGE = "bridge"
CUT_WORKER_FROM_LEADER = "cut-worker-from-leader"
CUT_WORKER_FROM_REPLICAS = "cut-worker-from-replicas"
PARTITION_CLIENT = "partition-client"
KILL_LEADER = "kill-leader"
KILL_ALL_REPLICAS = "kill-all-replicas"
KILL_WORKER = "kill-worker"
PAUSE_WORKER = "pause-worker"
PAUSE_LEADER = "pause-leader"
# Loss, freeze, disk and clock faults (chaos/hosts.py, nftables numgen).
PACKET_LOSS = "packet-loss"
ONE_WAY_LOSS = "one-way-loss"
FREEZE_HOST = "freeze-host"
DISK_FULL_REPLICA = "disk-full-replica"
DISK_FULL_WORKER = "disk-full-worker"
CLOCK_JUMP_FORWARD = "clock-jump-forward"
CLOCK_JUMP_BACK = "clock-jump-back"
# A GPU of a worker turns unhealthy (a fatal Xid in the worker's mock fault file); the
# heal restarts the worker and repairs the GPU (chaos/gpufaults.py).
GPU_XID = "gpu-xid"
# A worker cannot start members for a reason of its own (restarted in owner mode, the
# jobs' owner without a local account); the heal restarts it as it was and uncordons it
# (chaos/nodefaults.py).
NODE_CANNOT_RUN = "node-cannot-run"
# A follower is taken away (restarted on its data directory, or cut off) for several
# election timeouts and comes back; the leader must keep its term (chaos/rejoin_rules.py).
REJOIN = "rejoin"
# A follower is cut off from the leader only (workers and the other follower still reach
# it): with relayed heartbeats, the workers whose streams it holds must move to another
# replica within their lease (docs/relay.md; chaos/leader_rules.py judges it).
CUT_RELAY = "cut-relay"
# Member replacement (chaos/replacefaults.py): the agent of a worker holding a member of a
# running gang with on_node_failure: replace is killed past the dead timeout, or a GPU
# under such a member reports a fatal Xid; the rank is placed again while its gang runs on.
KILL_REPLACE_WORKER = "kill-replace-worker"
GPU_XID_REPLACE = "gpu-xid-replace"
REPLACE_FAULTS = (KILL_REPLACE_WORKER, GPU_XID_REPLACE)
# Elastic gangs (chaos/elasticfaults.py): the submitter is stopped so that room appears
# and nobody waits for it (a gang below its max grows), or a gang that fits only in the
# room an elastic gang holds above its min is submitted (the gang shrinks).
ELASTIC_GROW = "elastic-grow"
ELASTIC_SHRINK = "elastic-shrink"
ELASTIC_FAULTS = (ELASTIC_GROW, ELASTIC_SHRINK)
# A slow node (chaos/slowfaults.py): the CPU of one member of a paced gang is throttled
# until the leader marks its node degraded; then it is let go and the node uncordoned.
SLOW_NODE = "slow-node"
# The chaos cluster's slow-node window (synapse-scheduler --slow-node-window): a few
# seconds, so that a node slow from its gang's start is marked (three windows) within
# about ten.
SLOW_NODE_WINDOW_S = 2.0
# Its threshold (synapse-scheduler --slow-node-threshold): a strike is a member twice as
# slow as its peer. A throttled member's step is 300-700 ms against 4 ms, so the fault is
# found as with 15 %; and the suite's "nodes" share two cores with all of its processes,
# where a healthy member's own times were seen 15-50 % apart from its peer's for windows
# on end under load (and its node marked). The simulator judges the 15 % of production.
SLOW_NODE_THRESHOLD_PCT = 100
# The kinds of node health, which ``soak --kinds`` can play alone.
HEALTH_FAULTS = (GPU_XID, NODE_CANNOT_RUN)
HOST_FAULTS = (
    PACKET_LOSS,
    ONE_WAY_LOSS,
    FREEZE_HOST,
    DISK_FULL_REPLICA,
    DISK_FULL_WORKER,
    CLOCK_JUMP_FORWARD,
    CLOCK_JUMP_BACK,
)
# How far a clock jump moves the leader's wall clock: far beyond every timeout it could
# make fire early (dead timeout, time limits, grace periods, retention windows in tests).
CLOCK_JUMP_S = (60.0, 600.0)
# A frozen host stays frozen at least its duration and then until a newer attempt of a
# gang it ran has started elsewhere, at most this long.
FREEZE_MAX_S = 15.0

ALL_FAULTS = (
    ISOLATE_LEADER,
    ISOLATE_FOLLOWER,
    BRIDGE,
    CUT_WORKER_FROM_LEADER,
    CUT_WORKER_FROM_REPLICAS,
    PARTITION_CLIENT,
    KILL_LEADER,
    KILL_ALL_REPLICAS,
    KILL_WORKER,
    PAUSE_WORKER,
    PAUSE_LEADER,
    *HOST_FAULTS,
    GPU_XID,
    NODE_CANNOT_RUN,
    REJOIN,
    CUT_RELAY,
    *REPLACE_FAULTS,
    *ELASTIC_FAULTS,
    SLOW_NODE,
)

# Lanes: a soak can play several schedules at once (Jepsen's composed nemeses), one per
# lane. Lane 0 aims at the control plane (replicas, the client, the leader's clock and
# disk, loss); every further lane aims at worker hosts only, each at a pool of workers of
# its own, so that no two lanes ever hold the same worker (or the same replica).
WORKER_FAULTS = (
    CUT_WORKER_FROM_LEADER,
    CUT_WORKER_FROM_REPLICAS,
    KILL_WORKER,
    PAUSE_WORKER,
    FREEZE_HOST,
    DISK_FULL_WORKER,
    GPU_XID,
    NODE_CANNOT_RUN,
    *REPLACE_FAULTS,
)
CONTROL_FAULTS = tuple(k for k in ALL_FAULTS if k not in WORKER_FAULTS)
MAX_LANES = 5


@dataclass(frozen=True, slots=True)
class FaultTimeouts:
    """The chaos cluster's timeouts in seconds (they shape fault durations)."""

    heartbeat_s: float = 0.2
    lease_ttl_s: float = 1.5
    leader_step_down_s: float = 1.0
    dead_timeout_s: float = 4.0
    election_max_s: float = 0.8


@dataclass(frozen=True, slots=True)
class Step:
    index: int
    kind: str
    gap_before_s: float  # wait this long (and until gangs run) before the fault
    duration_s: float  # how long the fault lasts (partition, pause, downtime)
    pick: int  # chooses among run-time candidates (followers, workers)
    lane: int = 0  # which of the concurrent schedules plays it (see WORKER_FAULTS)


def duration_for(kind: str, rng: random.Random, t: FaultTimeouts) -> float:
    """A duration that makes ``kind`` cross the threshold it exists to test."""
    ranges = {
        ISOLATE_LEADER: (t.leader_step_down_s + 1.5, t.leader_step_down_s + 3.0),
        ISOLATE_FOLLOWER: (2.0, 3.5),
        BRIDGE: (3.0, 5.0),
        CUT_WORKER_FROM_LEADER: (t.lease_ttl_s + 0.5, t.lease_ttl_s + 1.5),
        CUT_WORKER_FROM_REPLICAS: (t.dead_timeout_s + 1.0, t.dead_timeout_s + 2.5),
        PARTITION_CLIENT: (2.0, 4.0),
        KILL_LEADER: (1.0, 3.0),
        KILL_ALL_REPLICAS: (0.5, 2.0),
        KILL_WORKER: (0.5, 2.0),
        PAUSE_WORKER: (t.lease_ttl_s + 0.5, t.lease_ttl_s + 1.5),
        PAUSE_LEADER: (
            t.election_max_s + t.leader_step_down_s + 0.5,
            t.election_max_s + t.leader_step_down_s + 1.5,
        ),
        PACKET_LOSS: (2.0, 4.0),
        ONE_WAY_LOSS: (2.0, 4.0),
        # Long enough for the leader to declare the frozen node dead and re-place its gangs.
        FREEZE_HOST: (t.dead_timeout_s + 1.0, t.dead_timeout_s + 2.0),
        DISK_FULL_REPLICA: (2.0, 4.0),
        DISK_FULL_WORKER: (2.0, 4.0),
        CLOCK_JUMP_FORWARD: (2.0, 4.0),
        CLOCK_JUMP_BACK: (2.0, 4.0),
        # Long enough for the worker to read the fault (within 1 s), report it in a
        # heartbeat and the leader to requeue the gangs holding the GPU.
        GPU_XID: (3.0, 5.0),
        # Long enough for the leader to place gangs on the restarted worker, see them
        # refused and mark it unfit, and (with a back-off of 2 s) place there again.
        NODE_CANNOT_RUN: (4.0, 6.0),
        # Several election timeouts away: a follower without pre-vote would stand.
        REJOIN: (4 * t.election_max_s, 4 * t.election_max_s + 2.0),
        # Past the lease: a worker left on the cut follower would fence itself.
        CUT_RELAY: (2 * t.lease_ttl_s, 2 * t.lease_ttl_s + 1.5),
        # Down past the dead timeout, so that the node is declared dead and its members'
        # ranks placed again (the fault then waits for their replacements, bounded).
        KILL_REPLACE_WORKER: (t.dead_timeout_s + 0.5, t.dead_timeout_s + 1.5),
        # The worker reads the Xid within a second, the leader makes the rank a vacancy,
        # the worker stops the member and reports it; then the rank is placed again.
        GPU_XID_REPLACE: (3.0, 5.0),
        # The leader plans growth and shrinks once a second, a shrink waits for the ranks'
        # stop and a growth for its nodes' heartbeat: the duration holds the resize, so the
        # schedule's time counts it (the fault then waits a little more, bounded).
        ELASTIC_GROW: (5.0, 7.0),
        ELASTIC_SHRINK: (5.0, 7.0),
        # The fault then waits for the mark (bounded), which comes 7-11 s after the
        # throttle (three windows of 2 s once the member's median turned).
        SLOW_NODE: (6.0, 7.0),
    }
    low, high = ranges[kind]
    return round(rng.uniform(low, high), 3)


def clock_jump_s(kind: str, pick: int) -> float:
    """The signed offset a clock-jump step applies to the leader's wall clock."""
    low, high = CLOCK_JUMP_S
    size = round(random.Random(pick).uniform(low, high), 3)
    return size if kind == CLOCK_JUMP_FORWARD else -size


def targeted_schedule(
    seed: int, t: FaultTimeouts | None = None, kinds: tuple[str, ...] = ALL_FAULTS
) -> list[Step]:
    """Every fault kind of ``kinds`` once, in an order shuffled by ``seed``."""
    t = t or FaultTimeouts()
    rng = random.Random(f"targeted-{seed}")
    order = [k for k in ALL_FAULTS if k in kinds]
    rng.shuffle(order)
    return [
        Step(
            i,
            kind,
            round(rng.uniform(0.3, 1.2), 3),
            duration_for(kind, rng, t),
            rng.randrange(1 << 16),
        )
        for i, kind in enumerate(order)
    ]


def random_schedule(
    seed: int,
    duration_s: float,
    t: FaultTimeouts | None = None,
    kinds: tuple[str, ...] = ALL_FAULTS,
    lanes: int = 1,
) -> list[Step]:
    """Faults drawn at random (with replacement) from ``kinds`` until they fill
    ``duration_s`` (the sum of gaps and durations; waits for gangs come on top).

    With ``lanes`` > 1 each lane fills ``duration_s`` on its own, lane 0 with the
    control-plane kinds and the others with the worker kinds (:data:`WORKER_FAULTS`); the
    steps are numbered in the order they are planned to start. One lane is the classic
    schedule, step for step."""
    if not 1 <= lanes <= MAX_LANES:
        raise ValueError(f"lanes: {lanes} is not between 1 and {MAX_LANES}")
    t = t or FaultTimeouts()
    if lanes == 1:
        return _fill(random.Random(f"random-{seed}"), duration_s, t, kinds, 0)
    planned: list[tuple[float, Step]] = []
    for lane in range(lanes):
        pool = CONTROL_FAULTS if lane == 0 else WORKER_FAULTS
        choices = tuple(k for k in kinds if k in pool)
        if not choices:
            continue
        at = 0.0
        for step in _fill(random.Random(f"random-{seed}-lane{lane}"), duration_s, t, choices, lane):
            at += step.gap_before_s
            planned.append((at, step))
            at += step.duration_s
    planned.sort(key=lambda p: (p[0], p[1].lane))
    return [replace(step, index=i) for i, (_, step) in enumerate(planned)]


def _fill(
    rng: random.Random, duration_s: float, t: FaultTimeouts, kinds: tuple[str, ...], lane: int
) -> list[Step]:
    choices = tuple(k for k in ALL_FAULTS if k in kinds)
    steps: list[Step] = []
    used = 0.0
    while True:
        kind = rng.choice(choices)
        gap = round(rng.uniform(0.2, 1.2), 3)
        length = duration_for(kind, rng, t)
        if steps and used + gap + length > duration_s:
            break
        steps.append(Step(len(steps), kind, gap, length, rng.randrange(1 << 16), lane))
        used += gap + length
    return steps


def lanes_of(steps: list[Step]) -> int:
    """How many lanes a schedule plays at once."""
    return 1 + max((s.lane for s in steps), default=0)


def worker_pool(workers: list[str], lane: int, lanes: int) -> list[str]:
    """The workers a lane may aim at: all of them with one lane; lane 0 of several aims at
    the control plane (and may pick any worker for loss); worker lane k of n-1 gets the
    k-th contiguous share of ``workers``, so no two lanes share a worker."""
    if lanes == 1 or lane == 0:
        return list(workers)
    shares = lanes - 1
    k = lane - 1
    size, extra = divmod(len(workers), shares)
    start = k * size + min(k, extra)
    return list(workers[start : start + size + (1 if k < extra else 0)])


def broken_build_schedule(t: FaultTimeouts | None = None) -> list[Step]:
    """The scenario that must catch a build without self-fencing: cut a worker running a
    gang from every replica for longer than the dead timeout, three times."""
    t = t or FaultTimeouts()
    length = t.dead_timeout_s + 3.0
    return [Step(i, CUT_WORKER_FROM_REPLICAS, 1.5, length, i) for i in range(3)]


def save(steps: list[Step], path: Path, **meta: object) -> None:
    doc = {**meta, "steps": [asdict(s) for s in steps]}
    path.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")


def load(path: Path) -> list[Step]:
    doc = json.loads(path.read_text(encoding="utf-8"))
    return [Step(**s) for s in doc["steps"]]
