"""A worker's heartbeat, once, whichever way it arrives (a unary ``Heartbeat``, a
message on a heartbeat stream, or a batch a follower relays): :func:`heartbeat` checks
it, records the node as heard and proposes the commands it needs (GPU health, node
checks, member reports, in that order); :class:`DesiredMembers` is what the answer lists.
The transports convert the message to a :class:`HeartbeatIn` (:mod:`synapse_ha.rpc.heartbeat`),
check where the leader is, wait for the proposals (:mod:`synapse_ha.service.commit`) and
answer."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Sequence
from concurrent import futures
from dataclasses import dataclass

from synapse_ha.core import commands as cmd
from synapse_ha.core.codec.formats import format_needed
from synapse_ha.core.desired import DesiredMember
from synapse_ha.core.health.fitness import GpuFault, NodeCheck, conditions_differ, unhealthy_gpus
from synapse_ha.core.health.node_checks import check_node_checks
from synapse_ha.core.health.slowness import DEGRADED, PaceReport
from synapse_ha.core.model import ClusterState
from synapse_ha.core.spec import validation
from synapse_ha.core.views import desired_members
from synapse_ha.service.refusal import Refusal, invalid, node_not_found
from synapse_ha.service.replica import Replica


@dataclass(frozen=True, slots=True)
class HeartbeatIn:
    """What a worker says in a heartbeat: its node, the member events to record, the
    GPUs it finds unhealthy, the latest results of its checks and its members' paces."""

    node_id: str
    events: tuple[cmd.MemberEvent, ...] = ()
    faults: tuple[GpuFault, ...] = ()
    checks: tuple[NodeCheck, ...] = ()
    paces: tuple[PaceReport, ...] = ()


@dataclass(frozen=True, slots=True)
class HeartbeatOut:
    """A heartbeat taken: how many of its reports it carried (acknowledged once
    ``proposed`` commit), the commands it needed, proposed in order, and the state it
    was checked against."""

    acked_reports: int
    proposed: tuple[futures.Future[cmd.Result], ...]
    state: ClusterState


def heartbeat(
    replica: Replica,
    beat: HeartbeatIn,
    now_ms: int,
    heard_ms: int | None = None,
    state: ClusterState | None = None,
) -> HeartbeatOut | Refusal:
    """Check ``beat`` against the replica's state (a registered node, GPUs it has,
    well-formed checks), record the node as heard at ``heard_ms`` (default ``now_ms``:
    a relayed heartbeat was heard when the follower received it) and propose the
    commands it needs. The caller routes to the serving leader first and waits for
    ``proposed`` (:func:`synapse_ha.service.commit.settle`) before acknowledging.
    ``state``: the snapshot to check against (a batch reads one for all its
    heartbeats); default the replica's newest."""
    if state is None:
        state = replica.snapshot()
    node_id = beat.node_id
    node = state.nodes.get(node_id)
    if node is None:
        return node_not_found(node_id)
    if beat.paces:  # evidence for the leader's slow-node collector, never a command
        replica.note_paces(node_id, beat.paces, now_ms)
    if not (beat.events or beat.faults or beat.checks or node.conditions):
        # "Alive" and nothing more, the common case: no command to make.
        replica.heard(node_id, now_ms if heard_ms is None else heard_ms)
        return HeartbeatOut(0, (), state)
    violations = gpu_fault_problems(state, node_id, beat.faults) + check_problems(beat.checks)
    if violations:
        return invalid(violations)
    replica.heard(node_id, now_ms if heard_ms is None else heard_ms)
    commands = heartbeat_commands(state, node_id, beat.faults, beat.checks, beat.events, now_ms)
    return HeartbeatOut(len(beat.events), tuple(replica.propose(c) for c in commands), state)


def report_command(
    node_id: str, events: Sequence[cmd.MemberEvent], now_ms: int, floor: int
) -> cmd.ReportMembers | None:
    """The command that records ``events`` of ``node_id``'s members (None without any),
    with a fresh seed for the retry back-off jitter of the attempts they may end.
    Checkpoint marks are left out while not every replica reads them (the cluster's
    format ``floor``): the starts and exits must not be refused with them."""
    if floor < format_needed(cmd.MemberEventKind.CHECKPOINT):
        events = [e for e in events if e.kind is not cmd.MemberEventKind.CHECKPOINT]
    if not events:
        return None
    return cmd.ReportMembers(
        node_id=node_id,
        events=tuple(events),
        jitter_seed=uuid.uuid4().int & ((1 << 63) - 1),
        now_ms=now_ms,
    )


def health_command(
    state: ClusterState, node_id: str, faults: Sequence[GpuFault], now_ms: int
) -> cmd.ReportGpuHealth | None:
    """The command that records the GPUs ``node_id``'s worker finds unhealthy, when it
    names one the state does not have yet (None otherwise: a worker names its unhealthy
    GPUs in every heartbeat)."""
    node = state.nodes.get(node_id)
    if node is None or not faults:
        return None
    known = unhealthy_gpus(node.gpu_faults)
    if all(f.gpu in known for f in faults):
        return None
    return cmd.ReportGpuHealth(
        node_id=node_id,
        faults=tuple(faults),
        jitter_seed=uuid.uuid4().int & ((1 << 63) - 1),
        now_ms=now_ms,
    )


def gpu_fault_problems(
    state: ClusterState, node_id: str, faults: Sequence[GpuFault]
) -> list[validation.Violation]:
    """The rules a heartbeat's unhealthy GPUs break (none for a node not in the state)."""
    node = state.nodes.get(node_id)
    if node is None or not faults:
        return []
    return validation.check_gpu_faults(faults, node.info.capacity.gpu)


def checks_command(
    state: ClusterState, node_id: str, checks: Sequence[NodeCheck], now_ms: int
) -> cmd.ReportNodeChecks | None:
    """The command that records the results of ``node_id``'s checks, when they differ
    from the node's conditions (None otherwise: a worker reports them in every
    heartbeat), and once every replica reads it (until then the checks wait: the
    heartbeat itself must not be refused). A check a worker names ``degraded`` is left
    out: that condition is the leader's slow-node mark (leader/slow_nodes.py), which no
    worker may set or clear."""
    checks = [k for k in checks if k.name != DEGRADED]
    node = state.nodes.get(node_id)
    if node is None or not conditions_differ(node.conditions, tuple(checks)):
        return None
    command = cmd.ReportNodeChecks(node_id=node_id, checks=tuple(checks), now_ms=now_ms)
    return command if format_needed(command) <= state.format_floor else None


def check_problems(checks: Sequence[NodeCheck]) -> list[validation.Violation]:
    """The rules a heartbeat's node checks break."""
    return check_node_checks(checks)


def heartbeat_commands(
    state: ClusterState,
    node_id: str,
    faults: Sequence[GpuFault],
    checks: Sequence[NodeCheck],
    events: Sequence[cmd.MemberEvent],
    now_ms: int,
) -> list[cmd.Command]:
    """The commands a checked heartbeat of ``node_id`` needs, in the order they must be
    applied: health first (a member that died with its GPU is then the node's fault),
    then the node's checks, then its member reports."""
    made = (
        health_command(state, node_id, faults, now_ms),
        checks_command(state, node_id, checks, now_ms),
        report_command(node_id, events, now_ms, state.format_floor),
    )
    return [c for c in made if c is not None]


class DesiredMembers:
    """The members each node should run (:func:`desired_members`), remembered per node
    with the records they were computed from: the node's jobs and those jobs' nodes.
    Copy-on-write snapshots replace a record that a command changes, so an answer is
    reused, from any snapshot, for as long as every one of those records is the same
    object; a heartbeat costs its own node's jobs, and a version move elsewhere costs it
    nothing. A heartbeat holding an older snapshot than the one a node was last answered
    from gets that newer answer, never an older one."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # node id -> (state version, the records, the members)
        self._known: dict[str, tuple[int, tuple[object, ...], list[DesiredMember]]] = {}

    def of(self, state: ClusterState, node_id: str) -> list[DesiredMember]:
        version = state.applied_commands
        known = self._known.get(node_id)
        if known is not None and version <= known[0]:
            # Answered from this very state (or a newer one) already: the steady case,
            # a node heartbeating while nothing changed.
            return known[2]
        jobs, nodes = state.jobs, state.nodes
        key: list[object] = []
        for job_id in state.jobs_on_node(node_id):
            job = jobs[job_id]
            key.append(job)
            if job.attempt is not None:
                key.extend(nodes.get(m.node_id) for m in job.attempt.members)
        with self._lock:
            known = self._known.get(node_id)
            if known is not None:
                if version < known[0]:
                    return known[2]
                if _same(known[1], key):
                    self._known[node_id] = (version, known[1], known[2])
                    return known[2]
        members = desired_members(state, node_id)
        with self._lock:
            known = self._known.get(node_id)
            if known is not None and version < known[0]:
                return known[2]  # a newer answer was made meanwhile
            self._known[node_id] = (version, tuple(key), members)
        return members


def _same(old: tuple[object, ...], new: list[object]) -> bool:
    return len(old) == len(new) and all(a is b for a, b in zip(old, new, strict=True))
