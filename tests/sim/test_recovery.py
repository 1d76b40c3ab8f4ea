"""The failure policies in the simulator (requeue, replace, replace+spares) on a scenario
small enough to check by hand, their figures, and the CLI that runs them side by side
(the elastic ones: test_recovery_elastic.py)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from synapse_ha.core import invariants
from synapse_ha.core.model import JobState
from synapse_ha.sim.cli import main
from synapse_ha.sim.gpu_failures import LLAMA3_GPU_FAILURES_PER_1000_GPU_DAYS as LLAMA3
from synapse_ha.sim.gpu_failures import FailureModel
from synapse_ha.sim.recovery import Recovery, RecoveryModel, RecoveryRun, recovery_run
from synapse_ha.sim.recovery_figures import LossTally, Outcome, figures
from synapse_ha.sim.recovery_report import parse_recoveries, targets
from synapse_ha.sim.training import training
from synapse_ha.sim.workload import SimJob, Workload, synthetic_cluster
from tests.core.harness import job

H = 3_600_000
MIN = 60_000
# One rack of four 8-GPU hosts. A (2 x 8 GPUs, 10 h) is bound first; B and C (8 GPUs,
# 20 h each) fill the other two hosts, unless a host is kept as a spare (then C waits).
# GPU 0 under A's rank 0 fails 1 h 15 min 3 s in: A has checkpointed at 30 and 60 min.
FAILURE_AT = H + 15 * MIN + 3_000
LOST_SINCE_CHECKPOINT_MS = 15 * MIN + 3_000
OVERHEAD_MS = 60_000
REPAIR_MS = 5 * H


def _workload(with_c: bool = True) -> Workload:
    jobs = [
        SimJob(0, job("a", gpu=8, replicas=2), 10 * H),
        SimJob(1_000, job("b", gpu=8), 20 * H),
    ]
    if with_c:
        jobs.append(SimJob(2_000, job("c", gpu=8), 20 * H))
    return Workload("hand", synthetic_cluster(4), tuple(jobs), "hand")


def _run(recovery: Recovery, with_c: bool = True) -> RecoveryRun:
    # Under replace+spares the spare is node 0 (the first idle node): A is on nodes 1, 2.
    node = "node-00001" if recovery is Recovery.REPLACE_SPARES else "node-00000"
    model = FailureModel(repair_ms=REPAIR_MS, checkpoint_ms=30 * MIN)
    run = recovery_run(_workload(with_c), model, recovery, scripted=((FAILURE_AT, node, 0),))
    run.run()
    return run


def _figures(run: RecoveryRun) -> dict[str, Any]:
    out: dict[str, Any] = run.result(0.0).metrics["recovery"]
    return out


def _job(run: RecoveryRun, name: str) -> Any:
    return next(j for j in run.state.jobs.values() if j.spec.name == name)


def _gpu_hours(gpus: int, ms: int) -> Any:
    """GPU-hours as the figures round them (to 0.001)."""
    return pytest.approx(gpus * ms / H, abs=1e-3)


def _ends_after_restart(restart_at: int) -> int:
    """A's end: the restart overhead, then the 9 h its checkpoint did not keep."""
    return restart_at + OVERHEAD_MS + 9 * H


def test_requeue_loses_the_work_since_the_checkpoint_and_waits_for_all_its_nodes() -> None:
    run = _run(Recovery.REQUEUE)
    f = _figures(run)
    a = _job(run, "a")
    # A's other host is free, but the failed one has 7 GPUs: A needs two whole hosts,
    # B and C hold the others, so A waits for the repair.
    assert f["gangs_hit"] == 1 and a.requeues == 1
    assert f["restart_delay_s"]["p50"] == pytest.approx(REPAIR_MS / 1000)
    assert run.records[a.job_id].end_ms == _ends_after_restart(FAILURE_AT + REPAIR_MS)
    assert f["gpu_hours_lost_work"] == _gpu_hours(16, LOST_SINCE_CHECKPOINT_MS)
    assert f["gpu_hours_lost_restart_overhead"] == _gpu_hours(16, OVERHEAD_MS)
    assert f["gpu_hours_lost_waiting_for_replacement"] == 0
    # Held and not counted is exactly the work lost, by cause.
    assert f["gpu_hours_held"] - f["goodput_gpu_hours"] == pytest.approx(
        f["gpu_hours_lost"], abs=2e-3
    )
    end = run.records[a.job_id].end_ms
    assert end is not None
    assert f["ettr"]["hit"]["mean"] == pytest.approx(10 * H / end, abs=1e-5)
    assert f["ettr"]["all"]["n"] == 3 and f["ettr"]["all"]["p50"] == 1.0
    assert f["ranks_replaced"] == 0 and f["spares_idle_gpu_hours"] == 0


def test_replace_without_room_holds_the_survivor_until_the_timeout_then_requeues() -> None:
    run = _run(Recovery.REPLACE)
    f = _figures(run)
    a = _job(run, "a")
    # No host can take the lost rank: the survivor holds its 8 GPUs for the 5-minute
    # timeout, then the gang is requeued whole and waits for the repair as under requeue.
    assert f["replace_timeouts"] == 1 and f["ranks_replaced"] == 0
    assert f["gpu_hours_lost_waiting_for_replacement"] == _gpu_hours(8, 5 * MIN)
    assert f["restart_delay_s"]["p50"] == pytest.approx(REPAIR_MS / 1000)
    assert run.records[a.job_id].end_ms == _ends_after_restart(FAILURE_AT + REPAIR_MS)
    assert f["gpu_hours_held"] - f["goodput_gpu_hours"] == pytest.approx(
        f["gpu_hours_lost"], abs=2e-3
    )
    assert a.state is JobState.SUCCEEDED


def test_a_failure_on_the_host_a_lost_rank_left_does_not_hit_the_gang_again() -> None:
    model = FailureModel(repair_ms=REPAIR_MS, checkpoint_ms=30 * MIN)
    script = ((FAILURE_AT, "node-00000", 0), (FAILURE_AT + MIN, "node-00000", 1))
    run = recovery_run(_workload(), model, Recovery.REPLACE, scripted=script)
    run.run()
    a = _job(run, "a")
    # The second GPU fails while rank 0 waits to be placed again: nothing of A is there.
    assert run.faults.failures == 2
    assert run.faults.gangs_killed == 1 and run.hits[a.job_id] == 1
    assert _figures(run)["gpu_hours_lost_work"] == _gpu_hours(16, LOST_SINCE_CHECKPOINT_MS)


def test_replace_places_the_lost_rank_on_a_free_host_and_keeps_the_survivor() -> None:
    run = _run(Recovery.REPLACE, with_c=False)
    f = _figures(run)
    a = _job(run, "a")
    assert f["ranks_replaced"] == 1 and f["ranks_replaced_on_spares"] == 0
    assert f["restart_delay_s"]["max"] == 0
    members = {m.rank: (m.node_id, m.generation) for m in a.attempt.members}
    assert members == {0: ("node-00003", 1), 1: ("node-00001", 0)}  # rank 1 never moved
    assert a.requeues == 0 and a.attempt.number == 1
    assert run.records[a.job_id].end_ms == _ends_after_restart(FAILURE_AT)
    assert f["gpu_hours_lost_restart_overhead"] == _gpu_hours(16, OVERHEAD_MS)


def test_replace_with_spares_takes_the_spare_at_once_and_counts_its_idle_time() -> None:
    run = _run(Recovery.REPLACE_SPARES)
    f = _figures(run)
    a, c = _job(run, "a"), _job(run, "c")
    assert f["ranks_replaced"] == f["ranks_replaced_on_spares"] == 1
    assert f["restart_delay_s"]["max"] == 0
    assert a.attempt.members[0].node_id == "node-00000"
    assert run.records[a.job_id].end_ms == _ends_after_restart(FAILURE_AT)
    assert f["ettr"]["hit"]["mean"] > 0.97
    # The price: C never runs on the spare, it waits for A's end; the spare's 8 GPUs
    # idled until the failure at least.
    assert run.records[c.job_id].start_ms == run.records[a.job_id].end_ms
    assert f["spares_idle_gpu_hours"] >= 8 * FAILURE_AT / H


def test_many_failures_leave_every_job_ended_and_the_state_consistent() -> None:
    # Seed 4 at 2,000 x the Llama 3 rate on 16 hosts: ranks placed again, and gangs
    # requeued after the timeout, some hit again while a rank waits.
    workload = training(seed=4, nodes=16, days=0.5, load=0.95)
    model = FailureModel(per_1000_gpu_days=2_000 * LLAMA3, checkpoint_ms=30 * MIN, seed=4)
    run = recovery_run(workload, model, Recovery.REPLACE, pass_interval_ms=500)
    run.run()
    assert run.replaced > 0 and run.replace_timeouts > 0
    assert all(j.state.finished for j in run.state.jobs.values())
    assert invariants.check(run.state) == []
    assert run.allocated == 0 and run.waiting == set() and run.holding == {}
    f = _figures(run)
    not_counted = f["gpu_hours_held"] - f["goodput_gpu_hours"]
    assert not_counted == pytest.approx(f["gpu_hours_lost"], abs=0.01)


def test_outcomes_merge_over_seeds_and_give_the_figures() -> None:
    one = Outcome("replace", jobs=[(64, True, 9 * H, 10 * H), (8, False, H, H)], runs=1)
    one.delays_s = [0.0, 10.0]
    one.lost = LossTally(work=H, overhead=2, waiting=3, abandoned=4)
    two = Outcome("replace", jobs=[(128, False, 5 * H, 5 * H)], delays_s=[100.0], runs=1)
    one.add(two)
    f = figures(one)
    assert f["runs"] == 2 and f["gangs_hit"] == 1
    assert f["ettr"]["gangs_64_plus"] == {"n": 2, "mean": 0.95, "p50": 1.0, "min": 0.9}
    assert f["ettr"]["all"]["n"] == 3 and f["ettr"]["hit"]["mean"] == 0.9
    # 64 x 9 + 8 x 1 + 128 x 5 useful against 64 x 10 + 8 + 128 x 5 wall.
    assert f["ettr"]["gpu_weighted"] == pytest.approx(1224 / 1288, abs=1e-5)
    assert f["restart_delay_s"]["p50"] == 10.0 and f["restart_delay_s"]["max"] == 100.0
    assert f["gpu_hours_lost"] == pytest.approx(1.0, abs=1e-3)
    assert f["goodput_gpu_hours"] == 64 * 9 + 8 + 128 * 5


def test_targets_are_judged_on_replace_with_spares() -> None:
    def fig(ettr: float | None, p50: float | None) -> dict[str, Any]:
        return {"ettr": {"gangs_64_plus": {"mean": ettr}}, "restart_delay_s": {"p50": p50}}

    met = targets({"requeue": fig(0.90, 900.0), "replace+spares": fig(0.975, 0.5)})
    assert met["ettr_gangs_64_plus"]["met"] is True
    assert met["ettr_gangs_64_plus"]["by_policy"] == {"requeue": 0.90, "replace+spares": 0.975}
    assert met["restart_delay_p50"]["met"] is True
    missed = targets({"requeue": fig(0.99, 0.0), "replace+spares": fig(0.96, 61.0)})
    assert missed["ettr_gangs_64_plus"]["met"] is False
    assert missed["restart_delay_p50"]["met"] is False
    assert targets({"requeue": fig(0.99, 0.0)})["ettr_gangs_64_plus"]["met"] is None


def test_policy_names_are_checked() -> None:
    assert parse_recoveries("replace+spares, requeue") == (
        Recovery.REPLACE_SPARES,
        Recovery.REQUEUE,
    )
    assert parse_recoveries("elastic,elastic+spares") == (
        Recovery.ELASTIC,
        Recovery.ELASTIC_SPARES,
    )
    with pytest.raises(
        ValueError,
        match=r"unknown shrink; choose from requeue, replace, replace\+spares, elastic, "
        r"elastic\+spares",
    ):
        parse_recoveries("requeue,shrink")
    with pytest.raises(ValueError, match="restart_overhead_ms: between 0"):
        RecoveryModel(restart_overhead_ms=-1).check()


def test_the_cli_runs_the_policies_side_by_side(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--workload", "training", "--nodes", "16", "--days", "0.3", "--seed", "2"]
    args += ["--gpu-failures", "--failure-scale", "2000", "--checkpoint-minutes", "30"]
    recoveries = ["--recovery", "requeue,replace+spares,elastic", "--spare-level", "block"]
    assert main([*args, *recoveries, "--elastic-min-share", "0.25"]) == 0
    out = capsys.readouterr()
    report = json.loads(out.out)
    assert list(report["figures"]) == ["requeue", "replace+spares", "elastic"]
    assert report["recovery_model"] == {
        "restart_overhead_s": 60.0,
        "spares": 1,
        "spare_level": "block",
        "replace_timeout_s": 300.0,
        "elastic_min_share": 0.25,
    }
    assert report["figures"]["requeue"]["gpu_failures"] > 0
    assert report["figures"]["replace+spares"]["spares_idle_gpu_hours"] > 0
    assert report["targets"]["ettr_gangs_64_plus"]["met"] in (True, False)
    assert report["figures"]["elastic"]["elastic"]["starts_below_max"] > 0
    assert report["figures"]["requeue"]["elastic"]["grows"] == 0
    assert "replace+spares" in out.err and "resizes up/down" in out.err


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--recovery", "shrink"], "--recovery: unknown shrink"),
        (["--recovery", "elastic", "--elastic-min-share", "1"], "--elastic-min-share: "),
        (["--recovery", "replace", "--failure-policies", "health-aware"], "choose one"),
        (["--recovery", "replace", "--restart-overhead-s", "-1"], "--restart-overhead-s"),
    ],
)
def test_the_cli_refuses_bad_recovery_options(
    flags: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        main(["--workload", "training", "--nodes", "8", "--gpu-failures", *flags])
    assert message in capsys.readouterr().err
