"""The elastic kinds: faults that make an elastic gang (``replicas: {min, max}``, a share
of the workload's gangs, chaos/workload.py) grow or shrink while it runs.

* ``elastic-grow``: room appears and nobody waits for it. The submitter is stopped
  (SIGSTOP) so that the queue drains; the leader grows every running elastic gang below
  its ``max`` onto the free room once no pending gang waits for room. The target is such a
  gang whose members plan (their ``start`` records say until when) to work on for
  :data:`LASTING_S` at least, waited for up to :data:`TARGET_WAIT_S` while the submitter
  is stopped. The heal resumes the submitter.
* ``elastic-shrink``: a gang waits for room an elastic gang holds. The target is a
  running elastic gang above its ``min`` whose members work on for :data:`LASTING_S` at
  least; the nemesis submits (as the workload does, recorded in ``submissions.jsonl``) a
  one-member gang of class ``normal`` in the default queue (no quota) asking one GPU more
  than the node with the most free GPUs has, as much as the target's node has free plus
  its members above ``min`` there when that is more: it does not fit now, and the leader
  shrinks an elastic gang of a lower priority (the workload's are ``low``) to make room.
  The gang runs, and must complete, as every other.

After the duration each fault waits (at most :data:`RESIZED_WAIT_S`) until the replicated
state shows an elastic gang resized the way the kind means (its attempt's members, same
fencing token, more or fewer than when the fault first saw it). The record
(``faults.jsonl``) holds the target (``elastic_gang``), every resize seen
(``elastic_resized``: ``job/tN a -> b``) and whether the kind's own one happened
(``elastic_changed``); a run whose faults of a kind never changed a gang fails
(:func:`unchanged_kinds`).
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable
from pathlib import Path

import grpc

from chaos import ledger, nemesis
from chaos.cluster import REPO, WORKER_GPUS, ChaosCluster
from chaos.workload import submit_one
from synapse_ha.client.cluster import ClusterUnavailable
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb

KINDS = nemesis.ELASTIC_FAULTS
TARGET_WAIT_S = 12.0
# How long the target's members must still plan to work: a resize is planned at most once
# a second by the leader, committed, and told to the workers at their next heartbeat.
LASTING_S = 4.0
RESIZED_WAIT_S = 10.0
RUNNING_S = 0.6  # a member with a record this recent is running
POLL_S = 0.2
WAITING_MS = 1_500  # how long the shrink's gang works once placed
WAITING_CLASS = "normal"  # above the workload's elastic gangs (low)

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


def choose(c: ChaosCluster, kind: str, pick: int) -> tuple[Attempt, tuple[int, int, int]] | None:
    """The gang to resize (below max to grow, above min to shrink), waiting for one
    (bounded); None when none came."""
    deadline = time.monotonic() + TARGET_WAIT_S
    while True:
        found = {
            key: sizes
            for key, sizes in running_elastic(c, LASTING_S).items()
            if (sizes[2] < sizes[1] if kind == nemesis.ELASTIC_GROW else sizes[2] > sizes[0])
        }
        if found:
            key = sorted(found)[pick % len(found)]
            return key, found[key]
        if time.monotonic() >= deadline:
            return None
        time.sleep(POLL_S)


class Resizes:
    """Every running elastic gang's size in the replicated state, from the first look at
    it, and each change seen (same attempt, more or fewer members)."""

    def __init__(self, c: ChaosCluster) -> None:
        self.c = c
        self.first: dict[Attempt, int] = {}
        self.last: dict[Attempt, int] = {}

    def look(self) -> None:
        for job in self.c.observer.list_jobs(states=["RUNNING"], allow_stale=True):
            if job.spec.HasField("elastic") and job.HasField("attempt"):
                key = (job.job_id, job.attempt.fencing_token)
                self.first.setdefault(key, len(job.attempt.members))
                self.last[key] = len(job.attempt.members)

    def changed(self, kind: str) -> list[str]:
        """``job/tN a -> b`` for each gang resized as ``kind`` means."""
        grow = kind == nemesis.ELASTIC_GROW
        return [
            f"{job}/t{token} {self.first[(job, token)]} -> {n}"
            for (job, token), n in sorted(self.last.items())
            if (n > self.first[(job, token)] if grow else n < self.first[(job, token)])
        ]


def waiting_gang(c: ChaosCluster, target: Attempt | None, index: int) -> pb.JobSpec:
    """The gang ``elastic-shrink`` submits: one member asking one GPU more than any node
    has free, or what the target's node has free plus its members above ``min`` there."""
    free: dict[str, int] = {}
    for n in c.observer.list_nodes():
        free[n.node_id] = n.capacity.gpu - len(n.allocated_gpus)
    gpu = max(free.values(), default=0) + 1
    if target is not None:
        surplus: dict[str, int] = {}
        for (job, token, rank, _), m in list(c.members_seen.members.items()):
            fewest = int(m.elastic.partition(":")[0] or 0) if m.elastic else 0
            if (job, token) == target and rank >= fewest and not m.ended:
                surplus[m.node] = surplus.get(m.node, 0) + len(m.gpus)
        gpu = max([gpu, *(free.get(node, 0) + n for node, n in surplus.items())])
    member = [sys.executable, "-m", "chaos.member", str(c.dir / ledger.LEDGER)]
    return pb.JobSpec(
        name=f"chaos-{c.cfg.seed}-elastic-shrink-{index}",
        priority_class=WAITING_CLASS,
        replicas=1,
        resources=pb.Resources(cpu_milli=500, memory_mib=256, gpu=min(gpu, WORKER_GPUS)),
        argv=pb.CommandArgs(args=[*member, c.sink_address, str(WAITING_MS)]),
        env=[pb.EnvVar(name="PYTHONPATH", value=str(REPO))],
        retries=pb.RetryPolicy(max=100, backoff_ms=200, max_backoff_ms=1000),
    )


def play(
    c: ChaosCluster, kind: str, index: int, pick: int, extra: dict[str, object]
) -> tuple[list[str], str, Callable[[], None], Heal, Callable[[], str]]:
    """Start an elastic fault: its targets, a sentence, what to poll while it lasts, the
    heal, and the hold (wait for the resize)."""
    resizes = Resizes(c)
    with contextlib.suppress(grpc.RpcError, ClusterUnavailable):
        resizes.look()
    heal: Heal = lambda: None  # noqa: E731
    if kind == nemesis.ELASTIC_GROW:
        c.submitter.pause()
        heal = c.submitter.resume
    chosen = choose(c, kind, pick)
    target = chosen[0] if chosen else None
    extra["elastic_gang"] = f"{target[0]}/t{target[1]}" if target else ""
    if chosen is None:
        detail = f"no elastic gang {'below max' if kind == nemesis.ELASTIC_GROW else 'above min'}"
    else:
        (job, token), (fewest, most, running) = chosen
        detail = f"{job}/t{token} runs {running} of {fewest}-{most} members"
    if kind == nemesis.ELASTIC_GROW:
        detail += "; submitter stopped"
    else:
        spec = waiting_gang(c, target, index)
        with ledger.Appender(c.dir / ledger.SUBMISSIONS) as out:
            outcome, job_id = submit_one(c.observer, spec, out, 5.0)
        extra["elastic_waiting"] = job_id or outcome
        detail += f"; submitted {job_id or outcome}, {spec.resources.gpu} GPU(s), class normal"

    def hold() -> str:
        started = time.monotonic()
        while time.monotonic() - started < RESIZED_WAIT_S and not resizes.changed(kind):
            with contextlib.suppress(grpc.RpcError, ClusterUnavailable):
                resizes.look()
            time.sleep(POLL_S)
        seen = resizes.changed(nemesis.ELASTIC_GROW) + resizes.changed(nemesis.ELASTIC_SHRINK)
        extra["elastic_resized"] = seen
        extra["elastic_changed"] = bool(resizes.changed(kind))
        waited = f"waited {time.monotonic() - started:.1f} s"
        return f"{waited}: {', '.join(seen)}" if seen else f"{waited}: no gang resized"

    return [target[0] if target else "none"], detail, resizes.look, heal, hold


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
