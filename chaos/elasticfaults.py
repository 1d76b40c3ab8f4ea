"""The elastic kinds: faults that make an elastic gang (``replicas: {min, max}``, a share
of the workload's gangs, chaos/workload.py) grow or shrink while it runs.

* ``elastic-shrink``: a gang waits for room elastic gangs hold. The target is a running
  elastic gang above its ``min`` whose members plan (their ``start`` records say until
  when) to work on for :data:`LASTING_S` at least, looked for during :data:`FIND_S`.
  Without one, the nemesis submits an elastic gang of its own (:func:`own_gang`: as the
  workload's, of class ``low``, :data:`OWN_RANGE` members working :data:`OWN_MS`) once
  the nodes have room for more than its ``min`` (:func:`wait_for_room`, at most
  :data:`ROOM_WAIT_S`), and takes it, or any elastic gang, once it runs above its
  ``min``, waited for up to :data:`OWN_START_WAIT_S`.
  The nemesis then submits, as the workload does (recorded in
  ``submissions.jsonl``), a gang of class ``normal`` in the default queue (no quota)
  whose members ask an elastic member's memory (more than half a worker's) and no GPU,
  one member more than the ready nodes have room for (:func:`waiting_gang`): only a node
  holding an elastic member can gain that room, so the leader shrinks an elastic gang
  for it (the workload's are of class ``low``). Both gangs then run, and must complete,
  as every other.
* ``elastic-grow``: room appears and nobody waits for it. The submitter is stopped
  (SIGSTOP) so that the queue drains; the leader grows every running elastic gang below
  its ``max`` onto free room once no pending gang waits for room. The target is such a
  gang working on for :data:`LASTING_S` at least, looked for during :data:`GROW_FIND_S`;
  without one, a gang above its ``min`` (looked for during :data:`FIND_S`) is shrunk
  first as ``elastic-shrink`` does (once the waiting gang has its room and the queue has
  drained, it grows back); without either, the nemesis submits its own gang as
  ``elastic-shrink`` does and takes it (or any elastic gang) once it runs, shrunk first
  when the state gives it its ``max``. The heal resumes the submitter.

While the fault lasts (its duration, long enough for the leader to plan, commit and carry
out a resize, so that the schedule's time counts it) and after it for at most
:data:`RESIZED_WAIT_S`, the fault watches until the replicated state shows an elastic
gang resized the way the kind means (its attempt's members, same
fencing token, more or fewer than when the fault first saw it). The record
(``faults.jsonl``) holds the target (``elastic_gang``), the fault's own gang
(``elastic_own``: its job id, or the submission's outcome), the gang submitted to wait
(``elastic_waiting``) and its reasons while it waited (``elastic_waiting_reasons``), every
resize seen (``elastic_resized``: ``job/tN a -> b``) and
whether the kind's own one happened (``elastic_changed``); a run whose faults of a kind
never changed a gang says so (:func:`unchanged_kinds`).
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable
from pathlib import Path

import grpc

from chaos import ledger, nemesis
from chaos.cluster import ELASTIC_MEMORY_MIB, REPO, ChaosCluster
from chaos.workload import ELASTIC_ENV, ELASTIC_SIGNAL, submit_one
from synapse_ha.client.cluster import ClusterUnavailable
from synapse_ha.core.model import NodeStatus
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb
from synapse_ha.rpc.states import node_status

KINDS = nemesis.ELASTIC_FAULTS
# How long elastic-shrink looks for a workload's gang above min (and elastic-grow, after
# none below max) before it submits one of its own.
FIND_S = 1.0
# How long elastic-grow looks for a gang below max before it looks for one to shrink first.
GROW_FIND_S = 2.0
# How long the fault waits for room for more than its own gang's min before it submits it.
ROOM_WAIT_S = 4.0
# How long the fault waits for its own gang to run: a leader pass, the workers' next
# heartbeat and the members' start.
OWN_START_WAIT_S = 6.0
OWN_RANGE = (1, 3)  # its min and max: placed above min wherever two nodes have room
# How long its members work: placed, shrunk for the waiting gang and grown back once that
# one ran, within a fault.
OWN_MS = 8_000
OWN_CLASS = "low"  # as the workload's elastic gangs
# How long the target's members must still plan to work: a resize is planned at most once
# a second by the leader, committed, and told to the workers at their next heartbeat.
LASTING_S = 4.0
RESIZED_WAIT_S = 3.0
RUNNING_S = 0.6  # a member with a record this recent is running
POLL_S = 0.2
WAITING_MS = 1_500  # how long the shrink's gang works once placed
WAITING_CLASS = "normal"  # above the workload's elastic gangs (low)
RESERVE_MIB = 64  # more than a worker reserves per member beside what it asks

Attempt = tuple[str, int]  # (job, fencing token)
Heal = Callable[[], None]


def running_elastic(c: ChaosCluster, lasting_s: float) -> dict[Attempt, tuple[int, int, int]]:
    """Elastic attempts whose members run now and plan to work for ``lasting_s`` more ->
    (min, max, members running), by the members' records."""
    now = ledger.now_ns()
    since, lasting = now - int(RUNNING_S * 1e9), now + int(lasting_s * 1e9)
    ranks: dict[Attempt, set[int]] = {}
    ranges: dict[Attempt, tuple[int, int]] = {}
    short: set[Attempt] = set()
    for (job, token, rank, _), m in list(c.members_seen.members.items()):
        if not m.elastic or m.ended or m.last_ns < since:
            continue
        fewest, _, most = m.elastic.partition(":")
        ranges[(job, token)] = (int(fewest), int(most))
        ranks.setdefault((job, token), set()).add(rank)
        if m.until_ns < lasting:
            short.add((job, token))
    return {k: (*ranges[k], len(r)) for k, r in ranks.items() if k not in short}


def resizable(kind: str, sizes: tuple[int, int, int]) -> bool:
    """Whether a gang of (min, max, members running) can be resized as ``kind`` means:
    grown (below max), shrunk (above min), or either (any other ``kind``, "")."""
    fewest, most, running = sizes
    if kind == nemesis.ELASTIC_GROW:
        return running < most
    if kind == nemesis.ELASTIC_SHRINK:
        return running > fewest
    return fewest < most


def choose(
    c: ChaosCluster, kind: str, pick: int, wait_s: float
) -> tuple[Attempt, tuple[int, int, int]] | None:
    """The gang to resize as ``kind`` means (:func:`resizable`), waiting for one up to
    ``wait_s``; None when none came."""
    deadline = time.monotonic() + wait_s
    while True:
        found = {
            key: sizes
            for key, sizes in running_elastic(c, LASTING_S).items()
            if resizable(kind, sizes)
        }
        if found:
            key = sorted(found)[pick % len(found)]
            return key, found[key]
        if time.monotonic() >= deadline:
            return None
        time.sleep(POLL_S)


class Resizes:
    """Every running elastic gang's size in the replicated state, look after look, and
    each change seen (same attempt, more or fewer members than at the look before)."""

    def __init__(self, c: ChaosCluster) -> None:
        self.c = c
        self.last: dict[Attempt, int] = {}
        self.steps: list[tuple[Attempt, int, int]] = []  # (attempt, from, to)

    def look(self) -> None:
        for job in self.c.observer.list_jobs(states=["RUNNING"], allow_stale=True):
            if job.spec.HasField("elastic") and job.HasField("attempt"):
                key = (job.job_id, job.attempt.fencing_token)
                size = len(job.attempt.members)
                before = self.last.setdefault(key, size)
                if size != before:
                    self.steps.append((key, before, size))
                self.last[key] = size

    def changed(self, kind: str) -> list[str]:
        """``job/tN a -> b`` for each resize seen as ``kind`` means."""
        grow = kind == nemesis.ELASTIC_GROW
        return [
            f"{job}/t{token} {a} -> {b}"
            for (job, token), a, b in self.steps
            if (b > a if grow else b < a)
        ]


def elastic_room(nodes: list[pb.Node], gpu: int) -> int:
    """How many of ``nodes`` are ready with room for an elastic member (its memory, more
    than half a worker's) and ``gpu`` GPUs."""
    room = 0
    for n in nodes:
        free = n.capacity.memory_mib - n.allocated.memory_mib
        gpus = n.capacity.gpu - n.allocated.gpu
        ready = node_status(n) is NodeStatus.READY
        room += ready and free >= ELASTIC_MEMORY_MIB + RESERVE_MIB and gpus >= gpu
    return room


def wait_for_room(c: ChaosCluster, wait_s: float) -> int:
    """Wait up to ``wait_s`` until the nodes have room for more than :data:`OWN_RANGE`'s
    min of the fault's own gang's members (placed with fewer, it would run at its min and
    could not be shrunk); the nodes with room last seen."""
    deadline = time.monotonic() + wait_s
    while True:
        room = 0
        with contextlib.suppress(grpc.RpcError, ClusterUnavailable):
            room = elastic_room(list(c.observer.list_nodes()), gpu=1)
        if room > OWN_RANGE[0] or time.monotonic() >= deadline:
            return room
        time.sleep(POLL_S)


def waiting_gang(c: ChaosCluster, index: int) -> pb.JobSpec:
    """The gang that waits for room elastic gangs hold above their ``min``: members that
    ask an elastic member's memory (more than half a worker's, so one a node) and no GPU,
    one more than the ready nodes have room for now. Only a node that holds an elastic
    member can gain that room, whatever other gangs come and go, so it fits once an
    elastic gang gives a rank back (the leader shrinks one for it: the workload's are of
    class ``low``) or one ends. Not pinned with ``nodes.names``: the leader's shrink plan
    does not narrow a gang to its node selector, so it would take a gang that fits
    elsewhere only for one it can place now and never shrink for it."""
    room = elastic_room(c.observer.list_nodes(), gpu=0)
    member = [sys.executable, "-m", "chaos.member", str(c.dir / ledger.LEDGER)]
    return pb.JobSpec(
        name=f"chaos-{c.cfg.seed}-elastic-{index}",
        priority_class=WAITING_CLASS,
        replicas=room + 1,
        resources=pb.Resources(cpu_milli=500, memory_mib=ELASTIC_MEMORY_MIB, gpu=0),
        argv=pb.CommandArgs(args=[*member, c.sink_address, str(WAITING_MS)]),
        env=[pb.EnvVar(name="PYTHONPATH", value=str(REPO))],
        retries=pb.RetryPolicy(max=100, backoff_ms=200, max_backoff_ms=1000),
    )


def submit_waiting(c: ChaosCluster, index: int, extra: dict[str, object]) -> str:
    """Submit :func:`waiting_gang` as the workload submits (``submissions.jsonl``); a
    sentence."""
    spec = waiting_gang(c, index)
    with ledger.Appender(c.dir / ledger.SUBMISSIONS) as out:
        outcome, job_id = submit_one(c.observer, spec, out, 5.0)
    extra["elastic_waiting"] = job_id or outcome
    return (
        f"submitted {job_id or outcome} ({spec.replicas} members of "
        f"{spec.resources.memory_mib} MiB, class {WAITING_CLASS})"
    )


def own_gang(c: ChaosCluster, index: int) -> pb.JobSpec:
    """The fault's own elastic gang, for when the workload runs none to resize: as the
    workload's (chaos/workload.py), :data:`OWN_RANGE` members of one mock GPU and an
    elastic member's memory (so one a node), of class ``low``, ``SIGUSR1`` as the
    membership signal and ``CHAOS_ELASTIC`` in their environment, working for
    :data:`OWN_MS`; in the default queue (no quota: only room decides where it runs)."""
    fewest, most = OWN_RANGE
    ledger_path = str(c.dir / ledger.LEDGER)
    member = [sys.executable, "-m", "chaos.member", ledger_path, c.sink_address, str(OWN_MS)]
    return pb.JobSpec(
        name=f"chaos-{c.cfg.seed}-elastic-{index}-own",
        priority_class=OWN_CLASS,
        replicas=most,
        resources=pb.Resources(cpu_milli=500, memory_mib=ELASTIC_MEMORY_MIB, gpu=1),
        argv=pb.CommandArgs(args=member),
        env=[
            pb.EnvVar(name="PYTHONPATH", value=str(REPO)),
            pb.EnvVar(name=ELASTIC_ENV, value=f"{fewest}:{most}"),
        ],
        retries=pb.RetryPolicy(max=100, backoff_ms=200, max_backoff_ms=1000),
        elastic=pb.ElasticPolicy(min_replicas=fewest, signal=ELASTIC_SIGNAL),
    )


def submit_own(c: ChaosCluster, index: int, extra: dict[str, object]) -> str:
    """Submit :func:`own_gang` as the workload submits (``submissions.jsonl``, so the
    checker holds it to every rule); its job id ("" when not acknowledged)."""
    spec = own_gang(c, index)
    with ledger.Appender(c.dir / ledger.SUBMISSIONS) as out:
        outcome, job_id = submit_one(c.observer, spec, out, 5.0)
    extra["elastic_own"] = job_id or outcome
    return job_id


Chosen = tuple[Attempt, tuple[int, int, int]]


def find_target(
    c: ChaosCluster, kind: str, index: int, pick: int, extra: dict[str, object], parts: list[str]
) -> tuple[Chosen | None, bool]:
    """The gang to resize and whether to shrink it, each step of the search said in
    ``parts``. A workload's gang first (elastic-grow: one below max, else one above min
    to shrink first; it grows back once its rank's room is free again and nobody waits);
    without one, the fault's own (:func:`submit_own`) once it runs (above min to shrink;
    to grow, at any size, shrunk first when at max), waited for up to
    :data:`OWN_START_WAIT_S`."""
    grow = kind == nemesis.ELASTIC_GROW
    chosen = choose(c, kind, pick, GROW_FIND_S if grow else FIND_S)
    if grow and chosen is None:
        chosen = choose(c, nemesis.ELASTIC_SHRINK, pick, FIND_S)
        if chosen is not None:
            parts.append("none below max")
            return say(chosen, True, parts), True
    if chosen is not None:
        return say(chosen, False, parts), not grow
    looked = time.monotonic()
    room = wait_for_room(c, ROOM_WAIT_S)
    looked = time.monotonic() - looked
    job = ""
    with contextlib.suppress(grpc.RpcError, ClusterUnavailable):
        job = submit_own(c, index, extra)
    fewest, most = OWN_RANGE
    parts.append(
        f"no elastic gang {'to grow or shrink' if grow else 'above min'}: submitted "
        f"{job or extra.get('elastic_own', 'nothing')} ({most} members of 1 GPU, min "
        f"{fewest}, class {OWN_CLASS}; {room} nodes with room after {looked:.1f} s)"
    )
    # Its own gang, or one of the workload's meanwhile.
    chosen = choose(c, "" if grow else kind, pick, OWN_START_WAIT_S) if job else None
    if chosen is None:
        above = "" if grow else " above min"
        parts.append(f"none running{above} within {OWN_START_WAIT_S:.0f} s")
        return None, False
    # To grow, shrunk first when the state gives it max members (some may not run yet).
    at_max = grow and placed(c, chosen[0][0], chosen[1][2]) >= chosen[1][1]
    return say(chosen, at_max, parts), at_max or not grow


def placed(c: ChaosCluster, job: str, running: int) -> int:
    """How many members the replicated state gives ``job``'s attempt (``running``, the
    members seen running, when the cluster cannot say)."""
    with contextlib.suppress(grpc.RpcError, ClusterUnavailable):
        found = c.observer.get_job(job, allow_stale=True)
        if found.HasField("attempt"):
            return max(running, len(found.attempt.members))
    return running


def say(chosen: Chosen, first: bool, parts: list[str]) -> Chosen:
    """``chosen``, its size said in ``parts`` (``first``: shrunk before it grows)."""
    (job, token), (fewest, most, running) = chosen
    then = ", shrinking it first" if first else ""
    parts.append(f"{job}/t{token} runs {running} of {fewest}-{most} members{then}")
    return chosen


def play(
    c: ChaosCluster, kind: str, index: int, pick: int, extra: dict[str, object]
) -> tuple[list[str], str, Callable[[], None], Heal, Callable[[], str]]:
    """Start an elastic fault: its targets, a sentence, what to poll while it lasts, the
    heal, and the hold (wait for the resize)."""
    resizes = Resizes(c)
    with contextlib.suppress(grpc.RpcError, ClusterUnavailable):
        resizes.look()
    heal: Heal = lambda: None  # noqa: E731
    grow = kind == nemesis.ELASTIC_GROW
    parts: list[str] = []
    chosen, shrink = find_target(c, kind, index, pick, extra, parts)
    with contextlib.suppress(grpc.RpcError, ClusterUnavailable):
        resizes.look()  # the size of a gang the fault submitted, before the waiting gang
    if chosen is not None and shrink:
        with contextlib.suppress(grpc.RpcError, ClusterUnavailable):
            parts.append(submit_waiting(c, index, extra))
    if grow:
        # Once the target is chosen: new gangs could have been it.
        c.submitter.pause()
        heal = c.submitter.resume
        parts.append("submitter stopped")
    target = chosen[0] if chosen else None
    extra["elastic_gang"] = f"{target[0]}/t{target[1]}" if target else ""

    reasons: list[str] = []  # the waiting gang's reasons while the fault waits, in order

    def note_waiting() -> None:
        resizes.look()
        waiting = str(extra.get("elastic_waiting", ""))
        if waiting.startswith("job-"):
            code = c.observer.get_job(waiting, allow_stale=True).reason_code
            if not reasons or reasons[-1] != code:
                reasons.append(code)
                extra["elastic_waiting_reasons"] = list(reasons)

    def hold() -> str:
        started = time.monotonic()
        while time.monotonic() - started < RESIZED_WAIT_S and not resizes.changed(kind):
            with contextlib.suppress(grpc.RpcError, ClusterUnavailable):
                note_waiting()
            time.sleep(POLL_S)
        seen = [f"{j}/t{t} {a} -> {b}" for (j, t), a, b in resizes.steps]
        extra["elastic_resized"] = seen
        extra["elastic_changed"] = bool(resizes.changed(kind))
        waited = f"waited {time.monotonic() - started:.1f} s"
        return f"{waited}: {', '.join(seen)}" if seen else f"{waited}: no gang resized"

    return [target[0] if target else "none"], "; ".join(parts), note_waiting, heal, hold


def unchanged_kinds(fault_files: list[Path]) -> list[str]:
    """The elastic kinds played in these ``faults.jsonl`` files that never resized a
    gang, each with how often it was played."""
    played: dict[str, int] = {}
    changed: set[str] = set()
    for path in fault_files:
        for r in ledger.read_records(path) if path.exists() else []:
            kind = str(r.get("kind", ""))
            if kind in KINDS:
                played[kind] = played.get(kind, 0) + 1
                if r.get("elastic_changed"):
                    changed.add(kind)
    return [
        f"{k}: played {n} times, no gang resized" for k, n in played.items() if k not in changed
    ]
