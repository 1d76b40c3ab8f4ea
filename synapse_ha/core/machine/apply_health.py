"""GPU health commands (a worker's report of unhealthy GPUs, and an operator's repair),
and what a node learns when it cannot start a member.

A GPU recorded unhealthy is never placed on (the capacity table and the plan check both
leave it out); a live attempt holding it is stopped and requeued as a disruption, since
the node's fault is never the job's (DESIGN §4); and the node is drained once
``ClusterConfig.gpu_drain_threshold`` of its GPUs are unhealthy. Health clears only by
:class:`~synapse_ha.core.commands.RepairGpus`.
"""

from __future__ import annotations

from synapse_ha.core import commands as cmd
from synapse_ha.core import lifecycle as lc
from synapse_ha.core.commands import Result, ResultCode, error, ok
from synapse_ha.core.health.fitness import GpuFault, Unfit, describe_faults, unhealthy_gpus
from synapse_ha.core.lifecycle import NODE, transition
from synapse_ha.core.machine.attempts import end_attempt_for, settle_drained
from synapse_ha.core.machine.changes import Changes, Handling, job_and_its_nodes
from synapse_ha.core.machine.replacement import loses_only_leaving, replaceable, vacate
from synapse_ha.core.model import ClusterState, Job, Node, NodeStatus
from synapse_ha.core.reasons import Reason, ReasonCode, reason
from synapse_ha.core.spec.validation import check_gpu_faults, describe


def _report_gpu_health(state: ClusterState, c: cmd.ReportGpuHealth, now: int) -> Result:
    node = state.nodes.get(c.node_id)
    if node is None:
        return error(ResultCode.NOT_FOUND, f"no node {c.node_id!r}")
    violations = check_gpu_faults(c.faults, node.info.capacity.gpu)
    if violations:
        return error(ResultCode.INVALID, describe(violations))
    known = unhealthy_gpus(node.gpu_faults)
    new = tuple(
        GpuFault(f.gpu, f.code, f.detail, now) for f in sorted(c.faults) if f.gpu not in known
    )
    if not new:
        return ok(f"node {c.node_id}: no new unhealthy GPU")
    node.gpu_faults = tuple(sorted(node.gpu_faults + new))
    stopped = _requeue_holders(state, node, new, c.jitter_seed, now)
    drained = _drain_if_needed(state, node)
    message = f"node {c.node_id}: {describe_faults(new)} unhealthy"
    if stopped:
        message += f"; {len(stopped)} gang(s) requeued"
    if drained:
        message += "; node draining"
    return ok(message, stopped=tuple(stopped))


def _requeue_holders(
    state: ClusterState, node: Node, new: tuple[GpuFault, ...], seed: int, now: int
) -> list[str]:
    """Stop and requeue every live attempt holding one of ``new`` on ``node``. A gang
    already being preempted is left to end as its preemption says."""
    sick = unhealthy_gpus(new)
    stopped = []
    for job in sorted(_holders(state, node.node_id, sick), key=lambda j: j.job_id):
        attempt = job.attempt
        assert attempt is not None
        held = sorted(
            g for m in attempt.members if m.node_id == node.node_id for g in m.gpus if g in sick
        )
        codes = sorted({f.code for f in new if f.gpu in held})
        outcome = reason(
            ReasonCode.GPU_UNHEALTHY,
            node=node.node_id,
            gpus=",".join(str(g) for g in held),
            code=",".join(codes),
        )
        if _vacated(state, job, node.node_id, sick, outcome, now):
            continue  # its other members run on; the lost ones are placed again
        end_attempt_for(state, job, outcome, seed, now)
        stopped.append(job.job_id)
    settle_drained(state, (node.node_id,))
    return stopped


def _vacated(
    state: ClusterState, job: Job, node_id: str, sick: frozenset[int], outcome: Reason, now: int
) -> bool:
    """A gang with ``replace:`` loses only its members on the faulty GPUs; their worker,
    no longer asked to run them, stops them and reports it before they are placed again."""
    attempt = job.live_attempt()
    if attempt is None:
        return False
    ranks = [m.rank for m in attempt.members if m.node_id == node_id and sick.intersection(m.gpus)]
    if replaceable(job) is None:
        # An elastic gang giving back only these ranks runs on: they are stopping anyway.
        return loses_only_leaving(job, ranks) is not None
    return vacate(state, job, ranks, outcome, now, stopped=False)


def _holders(state: ClusterState, node_id: str, gpus: frozenset[int]) -> list[Job]:
    out = []
    for job_id in state.jobs_on_node(node_id):  # the node's jobs, not every job
        job = state.jobs[job_id]
        attempt = job.live_attempt()
        if attempt is None or attempt.preempted_by:
            continue
        if any(m.node_id == node_id and gpus.intersection(m.gpus) for m in attempt.members):
            out.append(job)
    return out


def _drain_if_needed(state: ClusterState, node: Node) -> bool:
    threshold = state.config.gpu_drain_threshold
    if threshold <= 0 or len(node.gpu_faults) < threshold:
        return False
    if node.status is not NodeStatus.READY and node.status is not NodeStatus.CORDONED:
        return False
    after = transition(NODE, node.status, lc.NodeEvent.DRAIN)
    if isinstance(after, lc.Refusal):
        return False
    node.status = after
    node.status_reason = (
        f"{len(node.gpu_faults)} unhealthy GPUs (drain threshold {threshold}): "
        f"{describe_faults(node.gpu_faults)}"
    )
    node.status_by = "gpu-health"
    settle_drained(state, (node.node_id,))
    return True


def _repair_gpus(state: ClusterState, c: cmd.RepairGpus, now: int) -> Result:
    node = state.nodes.get(c.node_id)
    if node is None:
        return error(ResultCode.NOT_FOUND, f"no node {c.node_id!r}")
    wanted = set(c.gpus) if c.gpus else unhealthy_gpus(node.gpu_faults)
    outside = sorted(g for g in wanted if not 0 <= g < node.info.capacity.gpu)
    if outside:
        return error(ResultCode.INVALID, f"gpus: node {c.node_id} has no GPU {outside[0]}")
    cleared = tuple(f for f in node.gpu_faults if f.gpu in wanted)
    if not cleared:
        return ok(f"node {c.node_id}: nothing to repair")
    node.gpu_faults = tuple(f for f in node.gpu_faults if f.gpu not in wanted)
    return ok(f"node {c.node_id}: {describe_faults(cleared)} repaired")


def mark_unfit(state: ClusterState, node_id: str, owner: str, detail: str, now: int) -> None:
    """``node_id`` could not start a member of ``owner``'s: it skips that owner's gangs
    for ``unfit_backoff_ms``, and is cordoned after ``cordon_after_start_failures`` such
    failures in a row (an operator uncordons it once it is fixed)."""
    node = state.nodes.get(node_id)
    if node is None:
        return
    config = state.config
    kept = tuple(u for u in node.unfit if u.until_ms > now and u.owner != owner)
    node.unfit = tuple(sorted((*kept, Unfit(owner, detail[:256], now + config.unfit_backoff_ms))))
    node.start_failures += 1
    limit = config.cordon_after_start_failures
    if limit <= 0 or node.start_failures < limit or node.status is not NodeStatus.READY:
        return
    after = transition(NODE, node.status, lc.NodeEvent.CORDON)
    if isinstance(after, lc.Refusal):
        return
    node.status = after
    node.status_reason = f"{node.start_failures} members in a row could not start here: {detail}"
    node.status_by = "start-failures"


def started_here(state: ClusterState, node_id: str) -> None:
    """A member started on ``node_id``: its run of start failures is over."""
    node = state.nodes.get(node_id)
    if node is not None and node.start_failures:
        node.start_failures = 0


def _touches_health(state: ClusterState, c: cmd.ReportGpuHealth, changes: Changes) -> None:
    changes.nodes.add(c.node_id)
    for job_id in state.jobs_on_node(c.node_id):  # every job that may hold a GPU there
        job_and_its_nodes(state, job_id, changes)


def _touches_repair(state: ClusterState, c: cmd.RepairGpus, changes: Changes) -> None:
    changes.nodes.add(c.node_id)


HANDLERS: dict[type, Handling] = {
    cmd.ReportGpuHealth: Handling(_report_gpu_health, _touches_health),
    cmd.RepairGpus: Handling(_repair_gpus, _touches_repair),
}
