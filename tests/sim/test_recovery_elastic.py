"""The ``elastic`` failure policies in the simulator: gangs start with their min when their
max does not fit, grow as room appears, give members back to a waiting gang, and pay a
restart from the checkpoint at every resize; on scenarios small enough to check by hand,
and a whole run that gives the same figures for the same seed."""

from __future__ import annotations

import math
from typing import Any

import pytest

from synapse_ha.core import invariants
from synapse_ha.core.model import JobState
from synapse_ha.core.spares import spare_nodes
from synapse_ha.sim.gpu_failures import LLAMA3_GPU_FAILURES_PER_1000_GPU_DAYS as LLAMA3
from synapse_ha.sim.gpu_failures import FailureModel
from synapse_ha.sim.recovery import Recovery, RecoveryModel, RecoveryRun, recovery_run
from synapse_ha.sim.recovery_elastic import Resize, elastic_min
from synapse_ha.sim.training import training
from synapse_ha.sim.workload import SimJob, Workload, synthetic_cluster
from tests.core.harness import job

H = 3_600_000
MIN = 60_000
CHECKPOINT_MS = 30 * MIN
OVERHEAD_MS = 60_000
NO_FAILURES: tuple[tuple[int, str, int], ...] = ()


def _run(jobs: list[SimJob], recovery: Recovery = Recovery.ELASTIC) -> RecoveryRun:
    """``jobs`` on one rack of four 8-GPU hosts, without failures."""
    workload = Workload("hand", synthetic_cluster(4), tuple(jobs), "hand")
    model = FailureModel(checkpoint_ms=CHECKPOINT_MS)
    run = recovery_run(workload, model, recovery, scripted=NO_FAILURES)
    run.run()
    assert invariants.check(run.state) == []
    assert all(j.state is JobState.SUCCEEDED for j in run.state.jobs.values())
    return run


def _job_id(run: RecoveryRun, name: str) -> str:
    return next(j.job_id for j in run.state.jobs.values() if j.spec.name == name)


def _figures(run: RecoveryRun) -> dict[str, Any]:
    out: dict[str, Any] = run.result(0.0).metrics["recovery"]
    return out


def _gpu_hours(gpu_ms: int) -> Any:
    return pytest.approx(gpu_ms / H, abs=1e-3)


def test_a_gang_starts_at_its_min_when_its_max_does_not_fit_and_grows_as_room_appears() -> None:
    # B and C hold one host each (2 h and 3 h); A (4 x 8 GPUs, 10 h) arrives at 1 s: two
    # hosts are free, its max does not fit, its min (2) does.
    jobs = [
        SimJob(0, job("b", gpu=8), 2 * H),
        SimJob(0, job("c", gpu=8), 3 * H),
        SimJob(1_000, job("a", gpu=8, replicas=4), 10 * H),
    ]
    run = _run(jobs)
    a = _job_id(run, "a")
    assert run.records[a].start_ms == 1_000 and run.started_small == 1
    assert run.resizes == [Resize(2 * H, a, 2, 3), Resize(3 * H, a, 3, 4)]
    # 2 members until 2 h: three checkpoints keep 90 min of work at half the rate (45
    # min at full size); 3 members until 3 h, from 2 h + the overhead: one checkpoint
    # keeps 30 min at 3/4 of the rate; then the 10 h less 67.5 min at full size.
    kept = 3 * CHECKPOINT_MS // 2 + CHECKPOINT_MS * 3 // 4
    end = 3 * H + OVERHEAD_MS + 10 * H - kept
    assert run.records[a].end_ms == end
    f = _figures(run)
    lost_work = 16 * (2 * H - 1_000 - 3 * CHECKPOINT_MS) + 24 * (H - OVERHEAD_MS - CHECKPOINT_MS)
    assert f["gpu_hours_lost_work"] == _gpu_hours(lost_work)
    assert f["gpu_hours_lost_restart_overhead"] == _gpu_hours((24 + 32) * OVERHEAD_MS)
    assert f["gpu_hours_lost_to_resizes"] == _gpu_hours(lost_work + (24 + 32) * OVERHEAD_MS)
    assert f["elastic"] == {
        "starts_below_max": 1,
        "grows": 2,
        "shrinks": 0,
        "members_added": 2,
        "members_given_back": 0,
    }
    # Held and not counted is exactly what the resizes cost; A's ETTR is its 10 h of
    # work at full size over its wall time.
    assert f["gpu_hours_held"] - f["goodput_gpu_hours"] == pytest.approx(
        f["gpu_hours_lost"], abs=2e-3
    )
    assert f["ettr"]["gangs_64_plus"]["n"] == 0 and f["ettr"]["all"]["min"] == pytest.approx(
        10 * H / (end - 1_000), abs=1e-5
    )
    # A fixed gang waits for its four hosts instead: until C ends, then 10 h.
    fixed = _run(jobs, Recovery.REPLACE)
    a = _job_id(fixed, "a")
    assert fixed.records[a].start_ms == 3 * H and fixed.records[a].end_ms == 13 * H
    assert fixed.resizes == [] and _figures(fixed)["gpu_hours_lost"] == 0


def test_a_gang_gives_its_members_above_min_to_a_waiting_gang_and_takes_them_back() -> None:
    # A runs on all four hosts; W (elastic too: 1 to 2 x 8 GPUs, 1 h of work) arrives at
    # 1 h: A gives back only what W's min needs (its top rank), W starts on that host at
    # half its size (so its hour takes two); once W ends A grows back.
    jobs = [
        SimJob(0, job("a", gpu=8, replicas=4), 10 * H),
        SimJob(H, job("w", gpu=8, replicas=2), H),
    ]
    run = _run(jobs)
    a, w = _job_id(run, "a"), _job_id(run, "w")
    assert run.resizes == [Resize(H, a, 4, 3, w), Resize(3 * H, a, 3, 4)]
    assert run.records[w].start_ms == H and run.records[w].end_ms == 3 * H
    attempt = run.state.jobs[a].attempt
    assert attempt is not None and attempt.number == 1 and attempt.membership == 2
    # The first hour at full size is checkpointed whole; of the next two, at three
    # quarters of the rate from 1 h + the overhead, three checkpoints (90 min of running).
    done = H + 3 * CHECKPOINT_MS * 3 // 4
    assert run.records[a].end_ms == 3 * H + OVERHEAD_MS + 10 * H - done
    f = _figures(run)
    assert f["elastic"]["shrinks"] == 1 and f["elastic"]["members_given_back"] == 1
    assert f["queue_delay_s"]["max"] == 0
    assert run.allocated == 0 and run.holding == {}


def test_a_run_of_the_training_workload_gives_the_same_figures_for_a_seed() -> None:
    # Seed 4 at 2,000 x the Llama 3 rate on 16 hosts: gangs start small, grow, shrink
    # and lose ranks to failures.
    workload = training(seed=4, nodes=16, days=0.5, load=0.95)
    model = FailureModel(per_1000_gpu_days=2_000 * LLAMA3, checkpoint_ms=CHECKPOINT_MS, seed=4)

    def once() -> tuple[RecoveryRun, dict[str, Any]]:
        run = recovery_run(workload, model, Recovery.ELASTIC, pass_interval_ms=500)
        run.run()
        return run, _figures(run)

    run, f = once()
    assert once()[1] == f
    elastic = f["elastic"]
    assert elastic["starts_below_max"] > 0 and elastic["grows"] > 0 and elastic["shrinks"] > 0
    assert f["gangs_hit"] > 0 and f["ranks_replaced"] > 0
    assert all(j.state.finished for j in run.state.jobs.values())
    assert invariants.check(run.state) == []
    assert run.allocated == 0 and run.waiting == set() and run.holding == {}
    not_counted = f["gpu_hours_held"] - f["goodput_gpu_hours"]
    assert not_counted == pytest.approx(f["gpu_hours_lost"], abs=0.01)


def test_elastic_with_spares_starts_a_gang_on_what_fits_but_not_on_a_spare() -> None:
    # One host of four is a spare: A's max does not fit, the pass places as many members
    # as fit (3), never on the spare, and nothing grows it later.
    jobs = [SimJob(0, job("a", gpu=8, replicas=4), 2 * H)]
    run = _run(jobs, Recovery.ELASTIC_SPARES)
    a = _job_id(run, "a")
    assert run.resizes == []
    assert run.records[a].end_ms == 2 * H * 4 // 3
    attempt = run.state.jobs[a].attempt
    assert attempt is not None and len(attempt.members) == 3
    assert not {m.node_id for m in attempt.members} & spare_nodes(run.state)


def test_the_min_share_is_checked_and_rounds_down_to_at_least_one() -> None:
    assert [elastic_min(n, 0.5) for n in (2, 3, 4, 32)] == [1, 1, 2, 16]
    assert elastic_min(4, 0.1) == 1 and elastic_min(10, 0.99) == 9
    for share in (0.0, 1.0, -0.5, math.nan, math.inf):
        with pytest.raises(ValueError, match="elastic_min_share: more than 0 and less than 1"):
            RecoveryModel(elastic_min_share=share).check()
