"""The simulator replays workloads through the real core and compares policies."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from synapse_ha.core.cluster_config import ClusterConfig
from synapse_ha.sim.cli import main
from synapse_ha.sim.engine import simulate
from synapse_ha.sim.policies import POLICIES, FifoFirstFit, NaiveHeadOfLine, Ours
from synapse_ha.sim.workload import SimJob, Workload, load_openb, synthetic, synthetic_cluster
from tests.core.harness import job

TRACE = Path(__file__).resolve().parents[3] / "shared" / "data" / "alibaba-openb-v2023"


def _tiny() -> Workload:
    nodes = synthetic_cluster(4, hosts_per_rack=2)
    jobs = (
        SimJob(0, job("a", replicas=2, gpu=8), 100_000),
        SimJob(1_000, job("b", replicas=4, gpu=8), 50_000),
        SimJob(2_000, job("c", gpu=1), 10_000),
    )
    return Workload("tiny", nodes, jobs, "tiny")


@pytest.mark.parametrize(
    "policy", [Ours(), NaiveHeadOfLine(), FifoFirstFit()], ids=lambda p: p.name
)
def test_every_policy_runs_every_job_to_completion(policy: object) -> None:
    result = simulate(_tiny(), policy)  # type: ignore[arg-type]
    m = result.metrics
    assert m["jobs_started"] == 3
    assert m["job_completion_s"]["n"] == 3
    assert m["never_started"] == []


def test_head_of_line_baseline_makes_small_jobs_wait_behind_the_big_gang() -> None:
    naive = simulate(_tiny(), NaiveHeadOfLine()).metrics
    fifo = simulate(_tiny(), FifoFirstFit()).metrics
    # Job c (1 GPU) could start at once beside a, but naive holds it behind b.
    assert naive["queue_delay_s"]["max"] >= 99
    assert fifo["queue_delay_s"]["max"] < naive["queue_delay_s"]["max"]


def test_synthetic_workload_is_seeded_and_sized_for_its_load() -> None:
    a = synthetic(seed=3, jobs=200, nodes=64, load=0.85)
    b = synthetic(seed=3, jobs=200, nodes=64, load=0.85)
    assert a == b
    span = a.jobs[-1].arrival_ms - a.jobs[0].arrival_ms
    work = sum(j.spec.resources.gpu * j.spec.replicas * j.duration_ms for j in a.jobs)
    assert 0.5 < work / (span * a.total_gpus) < 1.5
    assert any(j.spec.topology_required for j in a.jobs)
    assert any(j.spec.time_limit_ms for j in a.jobs)


def test_ours_keeps_rack_sized_gangs_in_one_rack_more_often_than_topology_blind_fifo() -> None:
    w = synthetic(seed=2, jobs=300, nodes=64, load=0.8)
    ours = simulate(w, Ours()).metrics
    fifo = simulate(w, FifoFirstFit()).metrics
    assert ours["rack_fitting_gangs_in_one_rack"] > fifo["rack_fitting_gangs_in_one_rack"]


@pytest.mark.skipif(
    not TRACE.is_dir(), reason="the shared Alibaba trace is not beside the checkout"
)
def test_openb_loader_converts_pods_to_one_member_jobs() -> None:
    w = load_openb(TRACE, limit=200)
    assert len(w.nodes) == 1213
    assert len(w.jobs) == 200
    assert all(j.spec.replicas == 1 and j.duration_ms > 0 for j in w.jobs)
    assert all(0 <= j.spec.resources.gpu <= 8 for j in w.jobs)


def test_cli_prints_a_side_by_side_report(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert main(["--jobs", "60", "--nodes", "16", "--out", str(tmp_path)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert set(report["results"]) == set(POLICIES)
    assert "naive" in report["ours_over_baseline"]
    assert json.loads((tmp_path / "report.json").read_text()) == report


def test_cli_rejects_an_unknown_policy(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--policies", "ours,lottery"])
    assert exit_info.value.code == 2
    assert "unknown lottery" in capsys.readouterr().err


def test_locality_is_judged_against_the_racks_free_when_each_gang_was_bound() -> None:
    # Two racks of two 8-GPU hosts. A 1-GPU job takes part of the first host; then a
    # 2 x 8 GPU gang arrives while rack 1 is entirely free.
    nodes = synthetic_cluster(4, hosts_per_rack=2)
    jobs = (
        SimJob(0, job("small", gpu=1), 1_000_000),
        SimJob(1_000, job("gang", replicas=2, gpu=8), 10_000),
    )
    w = Workload("racks", nodes, jobs, "racks")
    ours = simulate(w, Ours()).metrics
    fifo = simulate(w, FifoFirstFit()).metrics
    assert ours["gangs_with_rack_room_at_bind"] == fifo["gangs_with_rack_room_at_bind"] == 1
    assert ours["gangs_with_rack_room_at_bind_in_one_rack"] == 1.0
    # First fit by node id takes the rest of rack 0's second host and one host of rack 1.
    assert fifo["gangs_with_rack_room_at_bind_in_one_rack"] == 0.0
    assert fifo["rack_fitting_gangs_in_one_rack"] == 0.0


def _waiting_gang(wait_s: int) -> Workload:
    # Two racks of two 8-GPU hosts. Three whole-host jobs fill rack 0 and one host of
    # rack 1; the first ends at once, leaving one free host per rack. Then a 2 x 8 GPU
    # gang arrives: it fits across the racks, in one rack only when a long job ends.
    nodes = synthetic_cluster(4, hosts_per_rack=2)
    long_ms = 10 * (wait_s + 1) * 1000
    jobs = (
        SimJob(0, job("short", gpu=8), 500),
        SimJob(0, job("fill-a", gpu=8), long_ms),
        SimJob(0, job("fill-b", gpu=8), long_ms),
        SimJob(1_000, job("gang", replicas=2, gpu=8), 10_000),
    )
    return Workload("waiting", nodes, jobs, "waiting")


@pytest.mark.parametrize("wait_s", [0, 90])
def test_a_locality_wait_ends_on_time_even_when_nothing_else_happens(wait_s: int) -> None:
    config = ClusterConfig(retention_ms=0, locality_wait_ms=wait_s * 1000)
    m = simulate(_waiting_gang(wait_s), Ours(), config=config).metrics
    # The gang starts across the racks exactly when its wait ends, not at the next
    # arrival or completion (the fillers end much later).
    assert m["queue_delay_rack_fitting_gangs_s"]["max"] == wait_s
    assert m["rack_fitting_gangs_in_one_rack"] == 0.0


def test_simulate_refuses_a_configuration_the_cluster_would_refuse() -> None:
    with pytest.raises(ValueError, match="locality_wait_ms"):
        simulate(_tiny(), Ours(), config=ClusterConfig(locality_wait_ms=-1))


def test_cli_passes_the_locality_wait_to_the_simulated_cluster(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert (
        main(["--jobs", "40", "--nodes", "16", "--policies", "ours", "--locality-wait", "0"]) == 0
    )
    assert json.loads(capsys.readouterr().out)["locality_wait_s"] == 0
    with pytest.raises(SystemExit) as exit_info:
        main(["--locality-wait", "-5"])
    assert exit_info.value.code == 2
    assert "--locality-wait" in capsys.readouterr().err


def test_cli_refuses_a_reservation_count_out_of_range(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--reservations", "17"])
    assert exit_info.value.code == 2
    assert "--reservations: from 1 to 16 per pass, got 17" in capsys.readouterr().err
