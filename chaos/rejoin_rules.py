"""The ``rejoin`` fault and its checker rule: a follower that comes back does not
depose a healthy leader (pre-vote, :mod:`synapse_ha.raft.prevote`).

The fault (:func:`play_rejoin`) takes one follower away for several election timeouts and
brings it back: either its process is killed and started again on its data directory
(``restart``), or it is cut off the network and the cut is healed (``isolate``). Its heal
waits (bounded) until the follower names the leader again and then :data:`SETTLE_S`
more, so the fault's record (``faults.jsonl``) spans the whole window in which a
disruptive election would happen.

``rejoin-term-change``
    From a ``rejoin`` fault's start to its end (the settle included), no replica the
    observer sampled (``leaders.jsonl``: each replica's role and term, as it changes)
    enters a term above the one the leader held at the start, and no other replica
    leads. Judged only when, at the start, one replica led and a majority of the
    replicas (the leader included) were in its term as leader or follower: a healthy
    leader with a majority connected. A fault that started otherwise (an election still
    under way after an earlier fault) is not judged.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import grpc

from chaos import ledger, net
from chaos.history import Violation
from chaos.nemesis import REJOIN
from synapse_ha.core.membership import ReplicaRole
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb

if TYPE_CHECKING:
    from chaos.cluster import ChaosCluster

# After the follower names the leader again: several election timeouts (0.4-0.8 s).
SETTLE_S = 3.0
# At most this long for the follower to name the leader again after the heal.
REJOIN_WAIT_S = 20.0
LEADER = ReplicaRole.LEADER
FOLLOWER = ReplicaRole.FOLLOWER


@dataclass(frozen=True, slots=True)
class RoleSample:
    """One observation of a replica (``leaders.jsonl``)."""

    replica: str
    role: str
    term: int
    mono_ns: int


@dataclass(frozen=True, slots=True)
class RejoinWindow:
    """A ``rejoin`` fault: its follower, start and end (the settle included)."""

    target: str
    start_ns: int
    end_ns: int


def load_rejoins(run_dir: Path) -> tuple[list[RejoinWindow], list[RoleSample]]:
    """The run's ``rejoin`` faults and every role sample."""
    windows = [
        RejoinWindow(str((r.get("targets") or [""])[0]), int(r["start_ns"]), int(r["end_ns"]))
        for r in ledger.read_records(run_dir / ledger.FAULTS)
        if r.get("kind") == REJOIN
    ]
    samples = [
        RoleSample(str(r["replica"]), str(r["role"]), int(r["term"]), int(r["mono_ns"]))
        for r in ledger.read_records(run_dir / ledger.LEADERS)
        if r.get("type") == "role"
    ]
    return windows, samples


def healthy_leader_at(samples: Iterable[RoleSample], at_ns: int) -> tuple[str, int] | None:
    """(leader, term) when, by the last sample of each replica before ``at_ns``, one
    replica led and a majority of the replicas were in its term; None otherwise."""
    replicas: set[str] = set()
    last: dict[str, RoleSample] = {}
    for s in sorted(samples, key=lambda s: s.mono_ns):
        replicas.add(s.replica)
        if s.mono_ns <= at_ns:
            last[s.replica] = s
    leaders = [s for s in last.values() if s.role == LEADER]
    if len(leaders) != 1:
        return None
    leader = leaders[0]
    with_it = [s for s in last.values() if s.term == leader.term and s.role in (LEADER, FOLLOWER)]
    if len(with_it) <= len(replicas) / 2:
        return None
    return leader.replica, leader.term


def check_rejoins(windows: list[RejoinWindow], samples: list[RoleSample]) -> list[Violation]:
    """``rejoin-term-change`` (see the module docstring)."""
    out: list[Violation] = []
    for w in windows:
        healthy = healthy_leader_at(samples, w.start_ns)
        if healthy is None:
            continue
        leader, term = healthy
        for s in sorted(samples, key=lambda s: s.mono_ns):
            if not w.start_ns < s.mono_ns <= w.end_ns:
                continue
            if s.term > term or (s.role == LEADER and s.replica != leader):
                out.append(
                    Violation(
                        "rejoin-term-change",
                        "",
                        f"while {w.target or 'a follower'} rejoined, {s.replica} was "
                        f"{s.role} in term {s.term} ({(s.mono_ns - w.start_ns) / 1e9:.2f} s "
                        f"after the fault started); {leader} led term {term} at the start",
                    )
                )
                break
    return out


def check_run_dir(run_dir: Path) -> list[Violation]:
    return check_rejoins(*load_rejoins(run_dir))


def play_rejoin(
    c: ChaosCluster, rng: random.Random, owner: str
) -> tuple[list[str], str, Callable[[], None]]:
    """Take a follower away (restart or isolate, chosen by ``rng``); the targets, what
    was done and the heal, which waits until the follower is back and settled."""
    target = rng.choice(c.followers())
    process = c.replicas[target]
    if rng.random() < 0.5:
        process.kill()
        detail = "killed and restarted on its data directory"

        def bring_back() -> None:
            c.restart(process)

    else:
        others = [h.address for h in c.hosts if h.name != target]
        net.set_blocked(net.cut([c.address(target)], others), owner)
        detail = "cut off the network, then healed"

        def bring_back() -> None:
            net.set_blocked([], owner)

    def heal() -> None:
        bring_back()
        _wait_rejoined(c, target)
        time.sleep(SETTLE_S)

    return [target], detail, heal


def _wait_rejoined(c: ChaosCluster, target: str) -> None:
    """Bounded: until ``target`` names a leader (it may not, if the cluster has none)."""
    deadline = time.monotonic() + REJOIN_WAIT_S
    while time.monotonic() < deadline:
        try:
            status = c.observer.scheduler(c.grpc[target]).GetClusterStatus(
                pb.GetClusterStatusRequest(local_only=True), timeout=0.5
            )
        except grpc.RpcError:
            status = None
        if status is not None and status.replicas and status.replicas[0].leader_id:
            return
        time.sleep(0.1)
