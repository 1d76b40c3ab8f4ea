"""GPU failures in the simulator: seeded, excluded from placement by the health-aware
core, placed on by the health-blind baseline until an operator cordons the node, and
figures that add up on a scenario small enough to check by hand."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from synapse_ha.core.model import JobState, NodeStatus
from synapse_ha.sim.cli import main
from synapse_ha.sim.engine import simulate
from synapse_ha.sim.failure_report import loss_target, parse_policies
from synapse_ha.sim.gpu_failures import (
    LLAMA3_GPU_FAILURES_PER_1000_GPU_DAYS,
    FailureModel,
    FaultPolicy,
    FaultRun,
    fault_run,
    simulate_failures,
)
from synapse_ha.sim.policies import Ours
from synapse_ha.sim.training import training
from synapse_ha.sim.workload import SimJob, Workload, synthetic, synthetic_cluster
from tests.core.harness import job

H = 3_600_000
AWARE, BLIND = FaultPolicy.HEALTH_AWARE, FaultPolicy.HEALTH_BLIND
# Node 0 runs C (8 GPUs, 48 h) throughout; A (8 GPUs, 10 h) is bound to node 1, whose
# GPU 0 fails an hour in.
FAILURE_AT = H + 1_000
SCRIPT = ((FAILURE_AT, "node-00001", 0),)


def _two_nodes(retries: int) -> Workload:
    c = SimJob(0, job("c", gpu=8), 48 * H)
    a = SimJob(1_000, job("a", gpu=8, retries=retries), 10 * H)
    return Workload("hand", synthetic_cluster(2), (c, a), "hand")


def _run(policy: FaultPolicy, retries: int = 3, **model: int) -> FaultRun:
    model.setdefault("repair_ms", 5 * H)
    run = fault_run(_two_nodes(retries), FailureModel(**model), policy, scripted=SCRIPT)
    run.run()
    return run


def _job(run: FaultRun, name: str) -> Any:
    return next(j for j in run.state.jobs.values() if j.spec.name == name)


def _figures(run: FaultRun) -> dict[str, Any]:
    figures: dict[str, Any] = run.result(0.0).metrics["gpu_faults"]
    return figures


def test_the_llama3_rate_is_gpu_and_hbm_failures_per_gpu_day() -> None:
    assert round(LLAMA3_GPU_FAILURES_PER_1000_GPU_DAYS, 4) == 0.2487
    assert FailureModel().per_1000_gpu_days == LLAMA3_GPU_FAILURES_PER_1000_GPU_DAYS


def test_health_aware_requeues_the_gang_and_never_places_on_the_failed_gpu() -> None:
    run = _run(AWARE)
    a = _job(run, "a")
    f = _figures(run)
    # A lost 8 GPUs x 1 h; it needs 8 GPUs, node 1 has 7 healthy ones, node 0 is busy:
    # it waits for the repair 5 h after the failure, then runs its 10 h again.
    assert f["gpu_failures"] == 1
    assert f["gangs_killed_by_failures"] == 1
    assert f["gpu_hours_lost_to_faults"] == pytest.approx(8.0)
    assert f["placements_onto_failed_gpus"] == 0
    assert run.onto_failed_at == []
    assert f["jobs_failed_by_faults"] == 0
    assert f["restart_delay_s"]["mean"] == pytest.approx(5 * 3600)
    assert a.state is JobState.SUCCEEDED
    assert a.requeues == 1 and a.retries_used == 0
    assert run.records[a.job_id].end_ms == FAILURE_AT + 5 * H + 10 * H
    assert run.state.nodes["node-00001"].gpu_faults == ()  # repaired
    assert f["gpu_hours_out_of_service"] == pytest.approx(5.0)  # one GPU for 5 h


def test_health_blind_kills_the_gang_as_its_own_failure_and_places_it_on_the_failed_gpu() -> None:
    run = _run(BLIND)
    a = _job(run, "a")
    f = _figures(run)
    # Killed at 1 h (8 GPU-h), then bound onto the failed GPU after each back-off and
    # failing 5 min later, three times: 3 x 8 GPUs x 5 min = 2 GPU-h; retries used up.
    assert f["gangs_killed_by_failures"] == 1
    assert f["placements_onto_failed_gpus"] == 3
    assert f["gangs_failed_on_failed_gpus"] == 3
    assert f["gpu_hours_lost_killed"] == pytest.approx(8.0)
    assert f["gpu_hours_lost_on_failed_gpus"] == pytest.approx(2.0)
    assert f["gpu_hours_lost_to_faults"] == pytest.approx(10.0)
    assert f["jobs_failed_by_faults"] == 1
    assert a.state is JobState.FAILED and a.retries_used == 3 and a.requeues == 0
    assert all(FAILURE_AT < t < FAILURE_AT + H for t in run.onto_failed_at)


def test_health_blind_places_on_the_failed_gpu_until_the_operator_cordons_the_node() -> None:
    run = _run(BLIND, retries=100, operator_delay_ms=H)
    noticed = FAILURE_AT + H
    f = _figures(run)
    # Every bind of A in the hour before the cordon is onto the failed GPU; after it,
    # A waits for the repair (node 0 is busy) and then runs to its end.
    assert len(run.onto_failed_at) >= 5
    assert max(run.onto_failed_at) < noticed
    assert f["node_cordons"] == 1
    a = _job(run, "a")
    assert a.state is JobState.SUCCEEDED
    assert run.records[a.job_id].end_ms == noticed + 5 * H + 10 * H
    assert run.state.nodes["node-00001"].status is NodeStatus.READY  # uncordoned
    # The node is out of service (8 GPUs) from the cordon to the repair; the GPU alone
    # for the hour before.
    assert f["gpu_hours_out_of_service"] == pytest.approx(1.0 + 8 * 5.0)


def test_checkpoints_keep_work_up_to_the_last_one() -> None:
    run = _run(AWARE, checkpoint_ms=25 * 60_000)
    f = _figures(run)
    # 1 h of run time: checkpoints at 25 and 50 min keep 50 min; 10 min x 8 GPUs lost;
    # placed again at the repair, A runs only the 9 h 10 min left.
    assert f["gpu_hours_lost_to_faults"] == pytest.approx(8 * 10 / 60, abs=1e-3)
    a = _job(run, "a")
    assert run.records[a.job_id].end_ms == FAILURE_AT + 5 * H + 10 * H - 50 * 60_000


def test_failures_are_seeded_and_the_same_under_both_policies() -> None:
    w = training(seed=2, nodes=16, days=1.0)
    model = FailureModel(per_1000_gpu_days=400 * LLAMA3_GPU_FAILURES_PER_1000_GPU_DAYS, seed=7)

    def logged(policy: FaultPolicy) -> tuple[list[tuple[int, str, int]], dict[str, Any]]:
        run = fault_run(w, model, policy)
        run.run()
        metrics = run.result(0.0).metrics
        metrics.pop("wall_s")
        metrics.pop("scheduler_cpu_ms_per_decision")
        return run.failure_log, metrics

    log_a, metrics_a = logged(AWARE)
    assert len(log_a) >= 5
    assert logged(AWARE) == (log_a, metrics_a)
    log_b, _ = logged(BLIND)
    common = min(len(log_a), len(log_b))
    assert log_a[:common] == log_b[:common]  # the runs may end at different times
    other = fault_run(w, FailureModel(per_1000_gpu_days=model.per_1000_gpu_days, seed=8), AWARE)
    other.run()
    assert other.failure_log != log_a


def test_without_failures_the_run_is_the_plain_simulation() -> None:
    w = synthetic(seed=4, jobs=120, nodes=16, load=0.8)
    plain = simulate(w, Ours()).metrics
    failing = simulate_failures(fault_run(w, FailureModel(per_1000_gpu_days=0), AWARE)).metrics
    failing.pop("gpu_faults")
    for key in ("wall_s", "scheduler_cpu_ms_per_decision"):
        plain.pop(key)
        failing.pop(key)
    assert failing == plain


@pytest.mark.parametrize(
    ("field", "model"),
    [
        ("per_1000_gpu_days", FailureModel(per_1000_gpu_days=-1)),
        ("per_1000_gpu_days", FailureModel(per_1000_gpu_days=float("nan"))),
        ("repair_ms", FailureModel(repair_ms=0)),
        ("operator_delay_ms", FailureModel(operator_delay_ms=-5)),
        ("checkpoint_ms", FailureModel(checkpoint_ms=-1)),
    ],
)
def test_a_model_out_of_range_is_refused_naming_the_field(field: str, model: FailureModel) -> None:
    with pytest.raises(ValueError, match=field):
        simulate_failures(fault_run(_two_nodes(0), model, AWARE))


def test_policies_parse_and_the_target_compares_losses() -> None:
    assert parse_policies("health-blind, health-aware") == (BLIND, AWARE)
    with pytest.raises(ValueError, match="unknown oblivious"):
        parse_policies("health-aware,oblivious")
    met = loss_target({"gpu_hours_lost_to_faults": 4.0}, {"gpu_hours_lost_to_faults": 10.0})
    assert met["reduction"] == 0.6 and met["met"]
    missed = loss_target({"gpu_hours_lost_to_faults": 8.0}, {"gpu_hours_lost_to_faults": 10.0})
    assert missed["reduction"] == 0.2 and not missed["met"]


def test_cli_runs_both_policies_side_by_side(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    argv = ["--workload", "training", "--nodes", "8", "--days", "0.5", "--gpu-failures"]
    argv += ["--failure-scale", "2000", "--out", str(tmp_path)]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    report = json.loads(out)
    assert set(report["results"]) == {"health-aware", "health-blind"}
    assert report["failure_model"]["times_llama3_rate"] == 2000
    assert report["results"]["health-aware"]["gpu_faults"]["placements_onto_failed_gpus"] == 0
    assert "reduction" in report["target"]
    assert "health-blind" in err
    assert json.loads((tmp_path / "report.json").read_text()) == report


def test_cli_refuses_a_negative_repair_time(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--workload", "training", "--gpu-failures", "--repair-hours", "-1"])
    assert "--repair-hours" in capsys.readouterr().err
