"""The five-replica scenario: membership changes under faults.

Five replicas, and besides the usual faults, steps that change the replica set while
something else is wrong, through the same admin API an operator uses
(``RemoveReplica``/``AddReplica``):

* ``replace-under-isolation``: one follower is cut off the network while another follower
  is replaced by a fresh machine at the same addresses (removed, its process killed and
  its data gone, a new one started with ``--join`` on an empty data directory, added);
* ``replace-leader``: the leader itself is replaced the same way (removing it makes it
  hand leadership over first);
* ``kill-two-replicas``: the leader and a follower are killed with SIGKILL at once (five
  replicas keep a quorum) and restarted after the fault.

A membership call that cannot be made now (``CHANGE_IN_FLIGHT``, ``WOULD_LOSE_QUORUM``,
no leader) is retried until a deadline; one whose outcome was unknown and that did take
effect answers ``REPLICA_NOT_FOUND`` / ``REPLICA_EXISTS`` on the retry, which counts as
done. The checker then demands what it always does: no overlap, nothing lost, and all
five replicas (the replaced ones included) converged to one state.
"""

from __future__ import annotations

import dataclasses
import logging
import random
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import grpc

from chaos import net
from chaos.nemesis import (
    ISOLATE_LEADER,
    KILL_LEADER,
    KILL_WORKER,
    PAUSE_LEADER,
    FaultTimeouts,
    Step,
    duration_for,
)
from synapse_ha.client.cluster import ClusterClient, ClusterUnavailable
from synapse_ha.local.process import Replica
from synapse_ha.rpc.errors import Reason, failure_of
from synapse_ha.security.tls import Transport

if TYPE_CHECKING:
    from chaos.cluster import ChaosCluster

log = logging.getLogger("chaos")

REPLACE_UNDER_ISOLATION = "replace-under-isolation"
REPLACE_LEADER = "replace-leader"
KILL_TWO_REPLICAS = "kill-two-replicas"
KINDS = (REPLACE_UNDER_ISOLATION, REPLACE_LEADER, KILL_TWO_REPLICAS)

SCENARIO = "five-membership"
REPLICAS = 5
CHANGE_DEADLINE_S = 40.0

# Done-on-retry answers: the change had already taken effect.
_ALREADY = {"remove": Reason.REPLICA_NOT_FOUND, "add": Reason.REPLICA_EXISTS}


def schedule(seed: int, t: FaultTimeouts | None = None) -> list[Step]:
    """Each membership step once and a few classic faults, in an order shuffled by
    ``seed``; kept short (about a minute of faults) for CI."""
    t = t or FaultTimeouts()
    rng = random.Random(f"{SCENARIO}-{seed}")
    kinds = [*KINDS, KILL_LEADER, ISOLATE_LEADER, PAUSE_LEADER, KILL_WORKER]
    rng.shuffle(kinds)
    steps = []
    for i, kind in enumerate(kinds):
        length = round(rng.uniform(2.0, 3.5), 3) if kind in KINDS else duration_for(kind, rng, t)
        steps.append(Step(i, kind, round(rng.uniform(1.0, 2.5), 3), length, rng.randrange(1 << 16)))
    return steps


def play(
    c: ChaosCluster, step: Step, leader: str, rng: random.Random
) -> tuple[list[str], str, Callable[[], None]]:
    """Start the membership fault ``step``: its targets, a sentence, and how to heal."""
    if step.kind == KILL_TWO_REPLICAS:
        follower = rng.choice(c.followers())
        victims = [c.replicas[leader], c.replicas[follower]]
        for p in victims:
            p.kill()

        def restart() -> None:
            for p in victims:
                c.restart(p)

        return [leader, follower], "killed together (SIGKILL)", restart
    if step.kind == REPLACE_LEADER:
        replace(c, leader)
        return [leader], "replaced by a fresh replica at the same addresses", lambda: None
    if step.kind == REPLACE_UNDER_ISOLATION:
        isolated, replaced = rng.sample(c.followers(), 2)
        others = [h.address for h in c.hosts if h.name != isolated]
        net.set_blocked(net.cut([c.address(isolated)], others))
        replace(c, replaced)
        detail = f"{replaced} replaced while {isolated} was cut off"
        return [isolated, replaced], detail, lambda: net.set_blocked([])
    raise ValueError(f"unknown membership fault {step.kind!r}")


def replace(c: ChaosCluster, name: str) -> None:
    """Remove replica ``name``, kill it, and add a fresh one at its addresses: the
    two-command replacement of deploy/README.md, with an empty data directory."""
    old = c.replicas[name]
    with ClusterClient(
        list(c.grpc.values()),
        timeout_s=10.0,
        per_try_timeout_s=2.0,
        channel_factory=Transport(c.admin_tls).channel,
    ) as client:
        _change(lambda: client.remove_replica(name, timeout_s=10.0), "remove", name)
        old.kill()
        fresh = _fresh(old)
        c.replicas[name] = fresh
        c.launcher.start(fresh)
        _change(lambda: client.add_replica(name, old.raft, old.grpc, timeout_s=10.0), "add", name)
    log.info("replica %s replaced (new data in %s)", name, fresh.data_dir)


def _fresh(old: Replica) -> Replica:
    """The same replica on a new, empty data directory, joining the running cluster."""
    generation = 1
    while (old.data_dir.parent / f"{old.replica_id}-{generation}").exists():
        generation += 1
    data_dir = old.data_dir.parent / f"{old.replica_id}-{generation}"
    data_dir.mkdir()
    argv = list(old.argv)
    argv[argv.index("--data-dir") + 1] = str(data_dir)
    return dataclasses.replace(
        old,
        argv=[*argv, "--join"],
        log_path=old.log_path.with_name(f"{old.replica_id}-{generation}.log"),
        data_dir=data_dir,
        process=None,
        paused=False,
        expect_running=True,
    )


def _change(call: Callable[[], object], what: str, name: str) -> None:
    deadline = time.monotonic() + CHANGE_DEADLINE_S
    last = ""
    while time.monotonic() < deadline:
        try:
            call()
            return
        except ClusterUnavailable as exc:
            last = str(exc)
        except grpc.RpcError as exc:
            failure = failure_of(exc)
            if failure.reason is _ALREADY[what]:
                return
            last = failure.describe()
        time.sleep(0.5)
    raise TimeoutError(f"could not {what} replica {name} within {CHANGE_DEADLINE_S:g} s: {last}")
