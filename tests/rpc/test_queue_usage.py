"""The per-queue numbers ``synctl queues`` shows (synapse_ha.core.queues.usage): used,
borrowed, lent (within a cohort, lending limits honoured), running and pending."""

from __future__ import annotations

import dataclasses

from synapse_ha.core import commands as cmd
from synapse_ha.core.cluster_config import DEFAULT_QUEUE, Queue
from synapse_ha.core.identity import access
from synapse_ha.core.machine import apply
from synapse_ha.core.model import ClusterState
from synapse_ha.core.queues.usage import queue_usage
from tests.core.harness import job, node

NOW = 1_000


def _state(*queues: Queue) -> ClusterState:
    state = ClusterState()
    for q in queues:
        assert apply(state, cmd.SetQueue(q, NOW)).ok
    for n in ("n1", "n2"):
        assert apply(state, cmd.RegisterNode(node(n, gpus=8), NOW)).ok
    return state


def _run(state: ClusterState, queue: str, gpus_per_member: int, members: int, on: str) -> str:
    spec = job(f"j{len(state.jobs)}", replicas=members, gpu=gpus_per_member)
    spec = dataclasses.replace(spec, queue=queue)
    submitted = apply(state, cmd.SubmitJob(spec, f"r{len(state.jobs)}", NOW))
    assert submitted.ok
    free = [g for g in range(8) if g not in state.nodes[on].allocated_gpus]
    placements = []
    for rank in range(members):
        gpus = tuple(free[rank * gpus_per_member : (rank + 1) * gpus_per_member])
        placements.append(cmd.MemberPlacement(rank, on, gpus))
    bound = apply(
        state,
        cmd.BindPlan((cmd.GangPlacement(submitted.job_id, 0, tuple(placements)),), now_ms=NOW),
    )
    assert bound.ok and bound.bound == (submitted.job_id,), bound
    return submitted.job_id


def test_the_default_queue_name_is_the_models() -> None:
    assert access.DEFAULT_QUEUE_NAME == DEFAULT_QUEUE


def test_borrowing_is_covered_by_the_cohorts_lenders_in_name_order() -> None:
    state = _state(
        Queue("a", gpu=4, cohort="lab", lending_limit_gpu=1),
        Queue("b", gpu=4, cohort="lab"),
        Queue("c", gpu=2, cohort="lab"),
        Queue("solo", gpu=2),
    )
    _run(state, "c", 3, 2, "n1")  # c uses 6 of its 2: borrows 4
    _run(state, "solo", 2, 1, "n2")  # all of its quota; no cohort to lend to
    usage = queue_usage(state)
    assert (usage["c"].used_gpu, usage["c"].borrowed_gpu) == (6, 4)
    assert usage["a"].lent_gpu == 1  # its lending limit
    assert usage["b"].lent_gpu == 3  # the rest
    assert usage["c"].lent_gpu == 0
    assert (usage["solo"].used_gpu, usage["solo"].borrowed_gpu, usage["solo"].lent_gpu) == (2, 0, 0)
    assert usage["c"].running_jobs == 1 and usage["c"].pending_jobs == 0
    assert usage[DEFAULT_QUEUE].used_gpu == 0


def test_pending_jobs_and_their_gpus_are_counted_per_queue() -> None:
    state = _state(Queue("a", gpu=4))
    for i, queue in enumerate(("a", "a", DEFAULT_QUEUE)):
        spec = dataclasses.replace(job(f"p{i}", replicas=2, gpu=3), queue=queue)
        assert apply(state, cmd.SubmitJob(spec, f"p{i}", NOW)).ok
    usage = queue_usage(state)
    assert (usage["a"].pending_jobs, usage["a"].pending_gpu) == (2, 12)
    assert (usage[DEFAULT_QUEUE].pending_jobs, usage[DEFAULT_QUEUE].pending_gpu) == (1, 6)
    assert usage["a"].used_gpu == 0
