"""The ``node-cannot-run`` fault: a worker that cannot start members for a reason of its
own. The worker is restarted in owner mode (``--run-as owner``): members run as their
job's owner, and the jobs' owner (the suite submits as ``admin``) has no local account
on the machine. Should ``admin`` have one here, the owner is mapped
(``--user-map admin=<account>``) to an account name the machine does not know, so that
the node refuses for the same reason either way.

How it plays (:func:`play_node_cannot_run`):

* the target is a worker of the lane's pool that runs gangs (the step's ``pick``); its
  agent is killed and started again with the owner-mode flags (its gangs end as after
  ``kill-worker``);
* every member the leader places there afterwards is refused by the worker before it
  runs ("no account for user admin"), reported with cause ``NODE_CANNOT_RUN``; the leader
  requeues the gang as a disruption, marks the node unfit for ``admin`` for the cluster's
  unfit back-off (the chaos cluster's is :data:`chaos.cluster.UNFIT_BACKOFF_S`) and, after
  ``cordon_after_start_failures`` failures in a row, cordons it. While the fault lasts
  the nemesis polls the node list and notes every unfit entry (owner, ``until_ms``) and
  whether the node was cordoned;
* the heal, as an operator would fix it: the agent is restarted with its own flags
  again, and the node is uncordoned (``UncordonNode``) whenever it is seen cordoned until
  it has stayed ready for :data:`SETTLE_S` (a refusal the old agent recorded can still
  be reported by the new one and cordon it once more). The unfit entry is left to
  expire: the back-off is short in the chaos cluster.

The record (``faults.jsonl``) carries ``unfit_node`` (the worker), ``unfit_backoff_ms``,
``unfit_seen`` (``[owner, until_ms]`` per entry seen, leader clock), ``account_absent``
(the account the node looked for), ``cordoned`` and ``uncordons``.
:func:`uncordon_all` uncordons what is still cordoned at the end of a run (``meta.json``
``uncordons``).
"""

from __future__ import annotations

import contextlib
import pwd
import random
import time
from collections.abc import Callable, Sequence

import grpc

from chaos.cluster import UNFIT_BACKOFF_S, ChaosCluster
from synapse_ha.client.cluster import ClusterUnavailable
from synapse_ha.core.model import NodeStatus
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb
from synapse_ha.rpc.states import node_status
from synapse_ha.security.bundle import ADMIN_USER

# Accounts the user map may point the owner at when the owner has an account here.
ABSENT_ACCOUNTS = ("synapse-chaos-absent", "synapse-chaos-absent-2", "synapse-chaos-absent-3")
SETTLE_S = 1.0  # the healed node must stay ready (not cordoned) this long
HEAL_DEADLINE_S = 30.0
POLL_S = 0.1


def has_account(name: str) -> bool:
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


def owner_mode_flags(
    owner: str = ADMIN_USER, known: Callable[[str], bool] = has_account
) -> tuple[list[str], str]:
    """The worker flags that make it refuse ``owner``'s members, and the account name
    it will look for (and not find)."""
    if not known(owner):
        return ["--run-as", "owner"], owner
    account = next((a for a in ABSENT_ACCOUNTS if not known(a)), "")
    if not account:
        raise ValueError(f"accounts {', '.join(ABSENT_ACCOUNTS)} all exist on this machine")
    return ["--run-as", "owner", f"--user-map={owner}={account}"], account


def with_flags(argv: Sequence[str], flags: Sequence[str]) -> list[str]:
    """``argv`` with its ``--run-as`` option (the launcher puts ``--run-as agent``) and any
    ``--user-map`` replaced by ``flags``."""
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg in ("--run-as", "--user-map"):
            skip = True
            continue
        if arg.startswith(("--run-as=", "--user-map=")):
            continue
        out.append(arg)
    return [*out, *flags]


def node_of(c: ChaosCluster, worker: str) -> pb.Node | None:
    return next((n for n in c.observer.list_nodes() if n.node_id == worker), None)


class Seen:
    """What the nemesis saw of one node while the fault and its heal lasted."""

    def __init__(self, extra: dict[str, object]) -> None:
        self.unfit: list[list[object]] = []
        self.extra = extra
        extra["unfit_seen"] = self.unfit
        extra["cordoned"] = False
        extra["uncordons"] = 0

    def saw(self, node: pb.Node | None) -> None:
        if node is None:
            return
        for u in node.unfit:
            entry: list[object] = [u.owner, int(u.until_ms)]
            if entry not in self.unfit:
                self.unfit.append(entry)
        if node_status(node) is NodeStatus.CORDONED:
            self.extra["cordoned"] = True


def restart_with(c: ChaosCluster, worker: str, argv: list[str]) -> None:
    """Kill the worker's agent and start it again with ``argv``."""
    process = c.workers[worker]
    if process.alive:
        process.kill()
    process.argv = argv
    c.restart(process)


def settle(c: ChaosCluster, worker: str, seen: Seen) -> bool:
    """Uncordon ``worker`` whenever it is cordoned until it has stayed ready for
    :data:`SETTLE_S`; False when :data:`HEAL_DEADLINE_S` ran out first."""
    deadline = time.monotonic() + HEAL_DEADLINE_S
    ready_since: float | None = None
    while time.monotonic() < deadline:
        with contextlib.suppress(grpc.RpcError, ClusterUnavailable):
            node = node_of(c, worker)
            seen.saw(node)
            status = node_status(node) if node is not None else None
            if status is NodeStatus.CORDONED:
                c.observer.set_node_status(worker, "uncordon", "node-cannot-run healed")
                seen.extra["uncordons"] = int(str(seen.extra["uncordons"])) + 1
                ready_since = None
            elif status is NodeStatus.READY:
                ready_since = time.monotonic() if ready_since is None else ready_since
                if time.monotonic() - ready_since >= SETTLE_S:
                    return True
            else:
                ready_since = None
        time.sleep(POLL_S)
    return False


def play_node_cannot_run(
    c: ChaosCluster, worker: str, rng: random.Random, extra: dict[str, object]
) -> tuple[str, Callable[[], None], Callable[[], None]]:
    """Restart ``worker`` so that it cannot start members: a sentence, what to poll while
    it lasts, and the heal (its own flags again, uncordoned). Fills ``extra``."""
    del rng  # the target is the only choice, made by the step's pick
    flags, account = owner_mode_flags()
    process = c.workers[worker]
    own = list(process.argv)
    seen = Seen(extra)
    extra.update(
        unfit_node=worker,
        unfit_backoff_ms=int(UNFIT_BACKOFF_S * 1000),
        account_absent=account,
    )
    restart_with(c, worker, with_flags(own, flags))

    def watch() -> None:
        seen.saw(node_of(c, worker))

    def heal() -> None:
        with contextlib.suppress(grpc.RpcError, ClusterUnavailable):
            watch()
        restart_with(c, worker, own)
        extra["settled"] = settle(c, worker, seen)

    return f"restarted with {' '.join(flags)}: no account {account}", watch, heal


def uncordon_all(c: ChaosCluster) -> list[str]:
    """At the end of a run: every worker still cordoned (only start failures cordon a
    chaos node) is uncordoned; the names of those it was."""
    out = []
    for n in c.observer.list_nodes():
        if n.node_id in c.workers and node_status(n) is NodeStatus.CORDONED:
            c.observer.set_node_status(n.node_id, "uncordon", "end of the chaos run")
            out.append(n.node_id)
    return out
