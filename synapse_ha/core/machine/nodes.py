"""Node commands: registration (and re-registration after death), cordon, drain and
uncordon, and a node's death, which ends the attempts that had members on it."""

from __future__ import annotations

import dataclasses

from synapse_ha.core import commands as cmd
from synapse_ha.core import lifecycle as lc
from synapse_ha.core.commands import Result, ResultCode, error, ok
from synapse_ha.core.feasibility import note_registered
from synapse_ha.core.health.fitness import GpuFault, describe_faults
from synapse_ha.core.lifecycle import MEMBER, NODE, move, transition
from synapse_ha.core.machine.attempts import (
    end_attempt_for,
    end_preempted,
    lost_attempt,
    release_held,
    settle_drained,
)
from synapse_ha.core.machine.changes import Changes, Handling, job_and_its_nodes
from synapse_ha.core.machine.replacement import (
    confirm_on_dead_node,
    loses_only_leaving,
    move_off,
    replaceable,
    vacate,
)
from synapse_ha.core.machine.reports import succeed_when_shrunk
from synapse_ha.core.model import ClusterState, Job, MemberState, Node, NodeInfo, NodeStatus
from synapse_ha.core.reasons import Reason, ReasonCode, reason
from synapse_ha.core.spec.validation import check_node_info, describe


def _register_node(state: ClusterState, c: cmd.RegisterNode, now: int) -> Result:
    violations = check_node_info(c.info)
    if violations:
        return error(ResultCode.INVALID, describe(violations))
    info = _normalised(c.info)
    node = state.nodes.get(info.node_id)
    if node is None:
        state.nodes[info.node_id] = Node(info=info, status=NodeStatus.READY, registered_at_ms=now)
        note_registered(state, info.node_id, None)
        return ok(f"node {info.node_id} registered")
    if not node.allocated.fits_in(info.capacity) or not node.allocated_gpus <= set(
        range(info.capacity.gpu)
    ):
        return error(
            ResultCode.CONFLICT,
            f"node {info.node_id}: new capacity {info.capacity.describe()} does not cover "
            f"what is bound to it ({node.allocated.describe()}); report its members' exits first",
        )
    rebooted = bool(node.info.boot_id and info.boot_id and node.info.boot_id != info.boot_id)
    before, node.info = node.info, info
    note_registered(state, info.node_id, before)
    # GPU faults stay (health clears only by a repair, or by a reboot when the cluster
    # says so), except of GPUs the node lost.
    cleared = node.gpu_faults if rebooted and state.config.clear_gpu_faults_on_reboot else ()
    node.gpu_faults = tuple(
        f for f in node.gpu_faults if f.gpu < info.capacity.gpu and f not in cleared
    )
    was_dead = node.status is NodeStatus.DEAD
    node.status = move(NODE, node.status, lc.NodeEvent.REGISTER)
    if was_dead:
        node.status_reason = ""
        node.conditions = ()  # its worker reports its checks afresh
        node.registered_at_ms = now
        return ok(f"node {info.node_id} is back{_after_reboot(cleared)}")
    return ok(f"node {info.node_id} updated{_after_reboot(cleared)}")


def _after_reboot(cleared: tuple[GpuFault, ...]) -> str:
    return f"; rebooted: {describe_faults(cleared)} cleared" if cleared else ""


def _normalised(info: NodeInfo) -> NodeInfo:
    """Fill in singleton NVLink islands when none were given; sort islands and labels."""
    islands = info.gpu_islands or tuple((i,) for i in range(info.capacity.gpu))
    islands = tuple(sorted(tuple(sorted(isl)) for isl in islands))
    return dataclasses.replace(
        info,
        gpu_islands=islands,
        topology=tuple(sorted(info.topology)),
        features=tuple(sorted(set(info.features))),
    )


def _set_node_status(state: ClusterState, c: cmd.SetNodeStatus, now: int) -> Result:
    node = state.nodes.get(c.node_id)
    if node is None:
        return error(ResultCode.NOT_FOUND, f"no node {c.node_id!r}")
    event = lc.NODE_EVENT_FOR_STATUS.get(c.status)
    if event is None:
        return error(ResultCode.INVALID, "use MarkNodeDead to declare a node dead")
    after = transition(NODE, node.status, event)
    if isinstance(after, lc.Refusal):
        return error(
            ResultCode.CONFLICT, f"node {c.node_id} is {node.status.value}; it must register again"
        )
    node.status = after
    node.status_reason = c.reason
    node.status_by = c.actor
    moving = _drain_replaced(state, c, now) if after is NodeStatus.DRAINING else ()
    settle_drained(state, (c.node_id,))
    said = f"node {c.node_id} is {node.status.value}"
    if moving:
        said += f"; {len(moving)} gang(s) will have their members here placed elsewhere"
    return ok(said, replacing=moving)


def _drain_replaced(state: ClusterState, c: cmd.SetNodeStatus, now: int) -> tuple[str, ...]:
    """A drain moves the members of gangs with ``replace:`` off the node, so the drain
    ends without waiting for those gangs to finish."""
    cause = reason(ReasonCode.NODE_DRAINED, node=c.node_id, detail=c.reason)
    return move_off(state, c.node_id, cause, now)


def _mark_node_dead(state: ClusterState, c: cmd.MarkNodeDead, now: int) -> Result:
    node = state.nodes.get(c.node_id)
    if node is None:
        return error(ResultCode.NOT_FOUND, f"no node {c.node_id!r}")
    if node.status is NodeStatus.DEAD:
        return ok(f"node {c.node_id} was already dead")
    node.status = move(NODE, node.status, lc.NodeEvent.DIE)
    node.status_reason = c.reason or "declared dead"
    on_node = state.jobs_on_node(c.node_id)  # in job id order
    affected = [
        job_id
        for job_id in on_node
        if (attempt := state.jobs[job_id].live_attempt()) is not None
        and any(m.node_id == c.node_id for m in attempt.members)
    ]
    outcome = reason(ReasonCode.NODE_DEAD, node=c.node_id, detail=node.status_reason)
    touched: set[str] = set()
    kept: list[str] = []
    for job_id in affected:
        job = state.jobs[job_id]
        if job.attempt is not None:
            touched.update(m.node_id for m in job.attempt.members)
        if _vacated(state, job, c.node_id, outcome, now):
            kept.append(job_id)  # its other members run on; the lost ones are placed again
        elif job.attempt is not None and job.attempt.preempted_by:
            # Its node's death confirms those members stopped; the gang was leaving anyway.
            # But they may have exited 0 by themselves first, reported late: kept as for
            # any attempt a node's death ends, unless a member is already known stopped.
            stopped = any(
                s.state is MemberState.EXITED and s.exit_code != 0
                for s in job.attempt.member_status
            )
            lost = None if stopped else lost_attempt(job, c.node_id)
            end_preempted(state, job, now)
            job.lost_attempt = lost
        else:
            lost = lost_attempt(job, c.node_id)
            end_attempt_for(state, job, outcome, c.jitter_seed, now)
            if not job.state.finished:
                job.lost_attempt = lost
    # Members on a dead node are gone: its worker fenced itself before the node was
    # declared dead (dead_timeout > lease_ttl + leader_step_down).
    for job_id in on_node:
        job = state.jobs[job_id]
        attempt = job.attempt
        if attempt is None or attempt.ended_at_ms is None:
            continue
        for member, status in zip(attempt.members, attempt.member_status, strict=True):
            if member.node_id == c.node_id and status.state is not MemberState.EXITED:
                status.state = move(MEMBER, status.state, lc.MemberEvent.EXIT)
                status.finished_at_ms = now
                release_held(state, job, member.rank)
                touched.update(m.node_id for m in attempt.members)
        state.job_state_changed(job)
    settle_drained(state, sorted(touched))
    ended = tuple(j for j in affected if j not in kept)
    said = f"node {c.node_id} is dead; {len(ended)} gang(s) stopped"
    if kept:
        said += f", {len(kept)} kept running with members to place again"
    return ok(said, stopped=ended, replacing=tuple(kept))


def _vacated(state: ClusterState, job: Job, node_id: str, outcome: Reason, now: int) -> bool:
    """A gang with ``replace:`` loses only its members on the dead node, known stopped
    (the node's worker fenced itself before it was declared dead)."""
    live = job.live_attempt()
    if live is None:
        return False
    ranks = [m.rank for m in live.members if m.node_id == node_id]
    if replaceable(job) is None:
        if loses_only_leaving(job, ranks) is None:
            return False  # an elastic gang giving back only these ranks runs on
    elif not vacate(state, job, ranks, outcome, now, stopped=True):
        return False
    confirm_on_dead_node(state, job, node_id, now)
    succeed_when_shrunk(state, job, now)
    return True


def _touches_registration(state: ClusterState, c: cmd.RegisterNode, changes: Changes) -> None:
    changes.nodes.add(c.info.node_id)


def _touches_node(state: ClusterState, c: cmd.SetNodeStatus, changes: Changes) -> None:
    changes.nodes.add(c.node_id)
    if c.status is NodeStatus.DRAINING:  # gangs with replace: lose their members there
        for job_id in state.jobs_on_node(c.node_id):
            job_and_its_nodes(state, job_id, changes)


def _touches_death(state: ClusterState, c: cmd.MarkNodeDead, changes: Changes) -> None:
    changes.nodes.add(c.node_id)
    for job_id in state.jobs_on_node(c.node_id):
        job_and_its_nodes(state, job_id, changes)


HANDLERS: dict[type, Handling] = {
    cmd.RegisterNode: Handling(_register_node, _touches_registration),
    cmd.SetNodeStatus: Handling(_set_node_status, _touches_node),
    cmd.MarkNodeDead: Handling(_mark_node_dead, _touches_death),
}
