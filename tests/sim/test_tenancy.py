"""Queues and preemption in the simulator: a scripted preemption with known figures, the
multi-tenant generator, and a small run of the three modes side by side."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from synapse_ha.core.cluster_config import ClusterConfig, PreemptionKind, Queue
from synapse_ha.core.commands import BindPlan, Preempt, Victim
from synapse_ha.core.model import ClusterState
from synapse_ha.sim.cli import main
from synapse_ha.sim.engine import simulate
from synapse_ha.sim.policies import Ours
from synapse_ha.sim.tenancy import report, run_modes, table
from synapse_ha.sim.tenants import Tenant, multi_tenant
from synapse_ha.sim.workload import SimJob, Workload, synthetic_cluster
from tests.core.harness import job


class _ReclaimAt(Ours):
    """The real scheduler, with one scripted reclaim: at ``at_ms`` the pending job named
    ``preemptor`` evicts the live attempt of the job named ``victim`` (and nothing else
    is ever preempted)."""

    def __init__(self, at_ms: int, preemptor: str, victim: str) -> None:
        super().__init__()
        self.at_ms, self.preemptor, self.victim = at_ms, preemptor, victim

    def plan(self, state: ClusterState, now_ms: int) -> BindPlan | None:
        command = super().plan(state, now_ms)
        self.preempts = ()
        if now_ms == self.at_ms:
            by_name = {j.spec.name: j for j in state.jobs.values()}
            preemptor, victim = by_name[self.preemptor], by_name[self.victim]
            self.preempts = (
                Preempt(
                    preemptor.job_id,
                    preemptor.attempts_made,
                    (Victim(victim.job_id, victim.fencing_token),),
                    PreemptionKind.RECLAIM,
                    now_ms,
                ),
            )
        return command


def _reclaim_workload() -> Workload:
    # One rack of two 8-GPU hosts; queues a and b of 8 GPUs each in one cohort. Queue b
    # runs two whole-host jobs (one on borrowed quota); a's job arrives at 600 s and
    # reclaims b2.
    nodes = synthetic_cluster(2, hosts_per_rack=2)
    queues = (Queue("a", gpu=8, cohort="c"), Queue("b", gpu=8, cohort="c"))
    jobs = (
        SimJob(0, job("b1", gpu=8, queue="b"), 10_000_000),
        SimJob(1_000, job("b2", gpu=8, queue="b"), 5_000_000),
        # a1 comes first in line (priority 10) once b2 has stopped and waits again.
        SimJob(600_000, job("a1", gpu=8, queue="a", priority=10), 100_000),
    )
    return Workload("reclaim", nodes, jobs, "reclaim", queues=queues)


def test_a_scripted_reclaim_costs_the_victims_gpus_times_its_run_time() -> None:
    w = _reclaim_workload()
    policy = _ReclaimAt(600_000, preemptor="a1", victim="b2")
    result = simulate(w, policy, config=ClusterConfig(retention_ms=0), grace_ms=30_000)
    t = result.metrics["tenancy"]
    assert t["preemptions"] == 1
    assert t["preemptions_by_kind"] == {"reclaim": 1}
    assert t["preempt_commands_rejected"] == 0
    # b2 ran from 1 s to 600 s on 8 GPUs when it was chosen.
    assert t["gpu_hours_lost"] == pytest.approx(8 * 599 / 3600, abs=1e-3)
    # a1 waited exactly the victim's grace: its quota came back 30 s after it arrived.
    assert t["preemptor_wait_s"]["max"] == 30.0
    assert t["queues"]["a"]["quota_back_s"] == {"n": 1, "mean": 30.0, "p95": 30.0, "max": 30.0}
    assert t["requeued_jobs"] == 1  # b2 ran again, whole
    assert result.metrics["jobs_started"] == 3
    assert result.metrics["never_started"] == []


def test_a_pass_period_delays_the_reclaim_to_the_next_pass() -> None:
    w = _reclaim_workload()
    # Passes every 7 s: the first after a1 arrives is at 602 s.
    policy = _ReclaimAt(602_000, preemptor="a1", victim="b2")
    result = simulate(w, policy, grace_ms=30_000, pass_interval_ms=7_000)
    t = result.metrics["tenancy"]
    assert t["preemptions"] == 1
    assert t["queues"]["a"]["quota_back_s"]["max"] == pytest.approx(2 + 30 + 5)  # next tick 637 s


def test_multi_tenant_workload_is_seeded_and_has_its_patterns() -> None:
    a = multi_tenant(seed=4, hours=3)
    assert a == multi_tenant(seed=4, hours=3)
    assert {q.name for q in a.queues} == {"team-a", "team-b", "team-c", "team-d"}
    assert {q.cohort for q in a.queues} == {"research"}
    late = [j for j in a.jobs if j.spec.queue == "team-d"]
    assert late and min(j.arrival_ms for j in late) >= 2 * 3_600_000
    rack = [j for j in a.jobs if j.spec.topology_required == "rack"]
    assert rack and all(j.spec.replicas == 8 and j.spec.resources.gpu == 8 for j in rack)
    assert any(j.spec.priority_class == "high" for j in a.jobs)
    assert all(j.user for j in a.jobs)


def test_three_modes_side_by_side_on_a_small_run() -> None:
    tenants = (
        Tenant("x", 32, "steady", load=1.5),
        Tenant("y", 32, "late", load=1.5, start_h=0.5, rack_gangs=0.3),
    )
    w = multi_tenant(seed=2, hours=1.5, tenants=tenants, hosts=8, hosts_per_rack=4)
    results = run_modes(w)
    assert [r.policy for r in results] == ["off", "blind", "topology"]
    out = report(w, results)
    assert set(out["modes"]) == {"off", "blind", "topology"}
    for figures in out["modes"].values():
        assert figures["jobs_started"] == figures["jobs"] == len(w.jobs)
        assert set(figures["queues"]) == {"x", "y"}
    off = out["modes"]["off"]
    assert off["preemptions"] == 0 and off["gpu_hours_lost"] == 0
    assert set(out["targets"]) == {
        "gpu_hours_lost_vs_blind",
        "quota_back_within_pass_plus_grace",
        "jain_equal_entitlements",
    }
    assert all(isinstance(t["met"], bool) for t in out["targets"].values())
    assert table(results).splitlines()[0].startswith("mode")


def test_cli_replays_a_trace_under_the_three_modes(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    trace = tmp_path / "jobs.csv"
    trace.write_text(
        "submit_s,queue,members,gpus_per_member,duration_s,topology_required\n"
        "0,team-a,2,8,600,rack\n"
        "30,team-b,1,4,60,\n"
    )
    assert main(["--workload", "trace", "--trace-file", str(trace), "--nodes", "4"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out["modes"]) == {"off", "blind", "topology"}
    assert out["modes"]["off"]["jobs_started"] == 2


def test_cli_names_the_bad_trace_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    trace = tmp_path / "jobs.csv"
    trace.write_text("submit_s,queue,members,gpus_per_member,duration_s\n0,team-a,0,8,600\n")
    with pytest.raises(SystemExit) as info:
        main(["--workload", "trace", "--trace-file", str(trace)])
    assert info.value.code == 2
    assert "jobs.csv line 2: members: must be between 1" in capsys.readouterr().err


def test_cli_writes_the_report_of_a_queue_workload_with_the_modes_and_interval_asked(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    trace = tmp_path / "jobs.csv"
    trace.write_text(
        "submit_s,queue,members,gpus_per_member,duration_s,topology_required\n"
        "0,team-a,2,8,600,rack\n"
        "30,team-b,1,4,60,\n"
    )
    out_dir = tmp_path / "out"
    argv = ["--workload", "trace", "--trace-file", str(trace), "--nodes", "4"]
    argv += ["--modes", "topology,off", "--pass-interval", "2", "--out", str(out_dir)]
    assert main(argv) == 0
    captured = capsys.readouterr()
    printed = json.loads(captured.out)
    written = json.loads((out_dir / "report.json").read_text())
    assert written == printed
    assert list(written["modes"]) == ["topology", "off"]
    assert written["pass_interval_s"] == 2.0
    assert "targets" not in written  # they compare with blind, which did not run
    for figures in written["results"].values():  # every figure, big gangs included
        assert figures["jobs_started"] == 2
        assert set(figures["queue_delay_big_gangs_s"]) >= {"n", "mean", "max"}
    tables = captured.err
    assert "mode" in tables and "big max" in tables


def test_cli_refuses_unknown_modes_and_intervals(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--workload", "multi-tenant", "--modes", "topology,greedy"])
    assert "--modes: unknown greedy; choose from off, blind, topology" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--pass-interval", "-1"])
    assert "--pass-interval: seconds between 0 and 3600" in capsys.readouterr().err
