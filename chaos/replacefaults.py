"""The replacement kinds: faults aimed at a member of a running gang with
``on_node_failure: replace`` (a share of the workload's gangs, chaos/workload.py), whose
lost rank must be placed again while the rest of the gang runs on.

* ``kill-replace-worker``: the agent of a worker holding such a member is killed
  (SIGKILL) for longer than the dead timeout and then started again, as ``kill-worker``
  does. Its supervisors fence their members when the lease runs out; the leader declares
  the node dead, the members' ranks become vacancies known stopped, and the next pass
  places them on other workers in the next generation.
* ``gpu-xid-replace``: a fatal Xid on a GPU such a member holds (``gpu-xid``'s injection,
  chaos/gpufaults.py): the leader makes the rank a vacancy, the worker stops the member
  and reports its exit, and the rank is placed again. The heal restarts the worker and
  repairs the GPU, as ``gpu-xid``'s does.

The target is a worker of the lane's pool holding a member at work of such a gang that
also has a member at work on another worker, planning (its ``start`` record says until
when) to work on for :data:`LASTING_S` at least: losing the target leaves the gang running
until the lost rank can be placed again (a gang whose members left are all lost, or all
ended, is requeued whole). It is waited for up to
:data:`TARGET_WAIT_S`; without one the fault falls on a busy worker all the same and says
so. After the duration the fault waits (at most :data:`REPLACED_WAIT_S`) until each
member hit has a successor: a newer generation of its rank, or a newer attempt of its
gang (requeued whole: the vacancy was not filled in time, or the gang was being
preempted). The record (``faults.jsonl``) lists the members hit (``replace_members``:
``job/token rank r gN``) and what took each one's place (``replaced``: ``... -> gN+1`` or
``... -> requeued``; ``not_replaced``).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable

from chaos import gpufaults, ledger, nemesis
from chaos.cluster import ChaosCluster
from chaos.members_seen import Member

KINDS = nemesis.REPLACE_FAULTS
TARGET_WAIT_S = 12.0
# How long the rest of the gang must still plan to work when the fault comes, so that it
# still runs when the lost rank can be placed again: the dead timeout (4 s in the chaos
# cluster) and a pass for a killed agent, the Xid's report and the member's stop for a GPU.
LASTING_S = {nemesis.KILL_REPLACE_WORKER: 7.0, nemesis.GPU_XID_REPLACE: 3.0}
REPLACED_WAIT_S = 10.0
RUNNING_S = 0.6  # a member with a record this recent is running
POLL_S = 0.05

Heal = Callable[[], None]


def label(member: Member) -> str:
    job, token, rank, gen = member
    return f"{job}/t{token} rank {rank} g{gen}"


def targets(c: ChaosCluster, pool: list[str], lasting_s: float) -> dict[str, list[Member]]:
    """Workers of ``pool`` holding running members of replace gangs whose gang works on
    elsewhere for ``lasting_s`` at least -> those members."""
    now = ledger.now_ns()
    since, lasting = now - int(RUNNING_S * 1e9), now + int(lasting_s * 1e9)
    out: dict[str, list[Member]] = {}
    for worker in pool:
        if c.workers[worker].alive:
            found = c.members_seen.replace_members(worker, since, lasting)
            hits = [key for key, _ in found]
            if hits:
                out[worker] = hits
    return out


def choose(
    c: ChaosCluster, kind: str, pool: list[str], busy: list[str], pick: int
) -> tuple[str, list[Member]]:
    """The worker to fault and the replace members on it, waiting for one (bounded); a
    busy worker and no member when none came."""
    deadline = time.monotonic() + TARGET_WAIT_S
    while True:
        found = targets(c, pool, LASTING_S[kind])
        if found:
            worker = sorted(found)[pick % len(found)]
            return worker, found[worker]
        if time.monotonic() >= deadline:
            return busy[pick % len(busy)], []
        time.sleep(POLL_S)


def successor(c: ChaosCluster, member: Member) -> str:
    """What took ``member``'s place so far: ``gN`` (its rank placed again), ``requeued``
    (a newer attempt), or ""."""
    job, token, rank, _ = member
    if c.members_seen.newer_generation(member):
        return f"g{c.members_seen.newest_generation[(job, token, rank)]}"
    return "requeued" if c.newest_token.get(job, 0) > token else ""


def wait_for_successors(
    c: ChaosCluster, hits: list[Member], extra: dict[str, object]
) -> Callable[[], str]:
    """The fault's hold: wait until every member hit has a successor (bounded), record
    them, and say what happened."""

    def hold() -> str:
        started = time.monotonic()
        while time.monotonic() - started < REPLACED_WAIT_S:
            if all(successor(c, m) for m in hits):
                break
            time.sleep(POLL_S)
        done = {label(m): successor(c, m) for m in hits}
        replaced = sorted(f"{m} -> {s}" for m, s in done.items() if s)
        left = sorted(m for m, s in done.items() if not s)
        extra["replaced"], extra["not_replaced"] = replaced, left
        if not hits:
            return "no member of a replace gang was hit"
        text = f"waited {time.monotonic() - started:.1f} s: " + ", ".join(replaced)
        if left:
            text += f"; nothing took the place of {', '.join(left)} yet"
        return text

    return hold


def play(
    c: ChaosCluster,
    kind: str,
    pool: list[str],
    busy: list[str],
    pick: int,
    extra: dict[str, object],
) -> tuple[list[str], str, Callable[[], None] | None, Heal, Callable[[], str]]:
    """Start a replacement fault: its targets, a sentence, what to poll while it lasts
    (or None), the heal, and the hold (wait for the successors)."""
    worker, hits = choose(c, kind, pool, busy, pick)
    watch: Callable[[], None] | None = None
    if kind == nemesis.GPU_XID_REPLACE and hits:
        hits = hits[pick % len(hits) : pick % len(hits) + 1]  # the member whose GPU faults
    extra["replace_members"] = [label(m) for m in hits]
    hit = ", ".join(label(m) for m in hits) or "no member of a replace gang running there"
    if kind == nemesis.KILL_REPLACE_WORKER:
        killed = c.workers[worker]
        killed.kill()
        detail = f"agent killed past the dead timeout; members hit: {hit}"

        def heal() -> None:
            c.restart(killed)

    else:
        held = set(c.members_seen.members[hits[0]].gpus) if hits else None
        rng = random.Random(pick)
        xid, watch, heal = gpufaults.play_gpu_xid(c, worker, rng, extra, held)
        detail = f"{xid}; member hit: {hit}"
    return [worker], detail, watch, heal, wait_for_successors(c, hits, extra)
