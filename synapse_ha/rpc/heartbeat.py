"""A worker's heartbeat, once, for the two ways it arrives (a unary ``Heartbeat`` of
``NodeAgentService`` and a message on a ``NodeStreamService`` stream): the member
reports to propose, and the answer (the node's status, the timeouts it must keep and
the members it should run) built from one snapshot. The adapters convert, check who is
calling and where the leader is, and send."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Sequence
from typing import Any

from synapse_ha.core import commands as cmd
from synapse_ha.core import validation
from synapse_ha.core.desired import DesiredMember
from synapse_ha.core.formats import format_needed
from synapse_ha.core.health import GpuFault, NodeCheck, conditions_differ, unhealthy_gpus
from synapse_ha.core.model import ClusterState, NodeStatus
from synapse_ha.core.node_checks import check_node_checks
from synapse_ha.core.views import desired_members
from synapse_ha.rpc import convert, states
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb


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
    heartbeat itself must not be refused)."""
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
        jobs, nodes = state.jobs, state.nodes
        version = state.applied_commands
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


def answer_fields(state: ClusterState, node_id: str) -> dict[str, Any]:
    """What every heartbeat answer says besides the desired members: the node's status
    (``dead`` once it is gone from the state) and the timeouts the worker keeps."""
    node = state.nodes.get(node_id)
    timeouts = state.config.timeouts
    return {
        **states.lease_status_fields(node.status if node else NodeStatus.DEAD),
        "lease_ttl_ms": timeouts.lease_ttl_ms,
        "heartbeat_interval_ms": timeouts.heartbeat_interval_ms,
    }


def desired_message(state: ClusterState, d: DesiredMember, now_ms: int) -> pb.DesiredMember:
    """A desired member, with the grace left before SIGKILL when its gang is being
    preempted (the attempt's deadline is the leader's clock; the worker gets a duration)."""
    msg = convert.desired_to_proto(d)
    job = state.jobs.get(d.job_id)
    attempt = job.attempt if job is not None else None
    if attempt is not None and attempt.fencing_token == d.fencing_token:
        convert.preemption_to_desired(msg, attempt, now_ms)
    return msg
