"""Queues and preemption in the simulator: a scripted preemption with known figures, the
multi-tenant generator, and a small run of the three modes side by side."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from synapse_ha.core.cluster_config import ClusterConfig, PreemptionKind, Queue
from synapse_ha.core.commands import BindPlan, Preempt, Victim
from synapse_ha.core.model import ClusterState
from synapse_ha.core.workflows.checkpoints import AttemptMark, CheckpointMark
from synapse_ha.sim.cli import main
from synapse_ha.sim.engine import GRACE_MS, MARK, Pacing, Run, build_cluster, simulate
from synapse_ha.sim.policies import Ours
from synapse_ha.sim.tenancy import report, run_modes, table
from synapse_ha.sim.tenants import Tenant, from_trace, heavy_tailed, multi_tenant
from synapse_ha.sim.trace import parse_trace
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


def test_a_scripted_reclaim_costs_the_victims_gpus_times_its_run_to_its_stop() -> None:
    w = _reclaim_workload()
    policy = _ReclaimAt(600_000, preemptor="a1", victim="b2")
    result = simulate(w, policy, config=ClusterConfig(retention_ms=0), grace_ms=30_000)
    t = result.metrics["tenancy"]
    assert t["preemptions"] == 1
    assert t["preemptions_by_kind"] == {"reclaim": 1}
    assert t["preempt_commands_rejected"] == 0
    # b2 ran from 1 s to its stop at 630 s (chosen at 600 s, a grace later) on 8 GPUs,
    # with no checkpoint mark: all of it is lost.
    assert t["gpu_hours_lost"] == pytest.approx(8 * 629 / 3600, abs=1e-3)
    assert t["gpu_hours_lost_without_marks"] == t["gpu_hours_lost"]
    assert t["gpu_hours_lost_per_preemptor_placed"] == t["gpu_hours_lost"]
    assert (t["victims_stopped"], t["victims_stopped_with_a_mark"]) == (1, 0)
    # a1 waited exactly the victim's grace: its quota came back 30 s after it arrived.
    assert t["preemptor_wait_s"]["max"] == 30.0
    assert t["queues"]["a"]["quota_back_s"] == {"n": 1, "mean": 30.0, "p95": 30.0, "max": 30.0}
    assert t["requeued_jobs"] == 1  # b2 ran again, whole
    assert result.metrics["jobs_started"] == 3
    assert result.metrics["never_started"] == []


class _MarksSeen(Run):
    """A run that keeps, after each checkpoint mark, the marks its attempt then held."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.seen: list[tuple[int, str, tuple[CheckpointMark, ...], AttemptMark | None]] = []

    def _mark(self, key: str) -> None:
        marks = self.tally.marks
        super()._mark(key)
        if self.tally.marks == marks:
            return  # the attempt named no longer holds resources
        job = self.state.jobs[key.rsplit("@", 1)[0]]
        assert job.attempt is not None
        self.seen.append((self.now, job.spec.name, job.attempt.marks, job.attempt.mark()))


def _run(w: Workload, policy: Ours, grace_ms: int = GRACE_MS) -> _MarksSeen:
    run = _MarksSeen(w, policy, build_cluster(w, ClusterConfig(retention_ms=0)), Pacing(grace_ms))
    run.run()
    return run


def test_a_trace_job_with_checkpoint_s_marks_on_its_attempt_every_interval() -> None:
    # A 2 x 8-GPU gang on two hosts marking every 10 minutes of a 35-minute run, and a
    # job without the column value that never marks.
    trace = (
        "submit_s,queue,members,gpus_per_member,duration_s,checkpoint_s,name\n"
        "0,team-a,2,8,2100,600,gang\n"
        "0,team-a,1,8,2100,,plain\n"
    )
    w = from_trace(parse_trace(trace), synthetic_cluster(4))
    run = _run(w, Ours())
    assert [(at, name) for at, name, _, _ in run.seen] == [
        (600_000, "gang"),
        (1_200_000, "gang"),
        (1_800_000, "gang"),
    ]
    _, _, marks, mark = run.seen[-1]
    assert marks == (
        CheckpointMark(rank=0, at_ms=1_800_000, step=1_800, seq=3),
        CheckpointMark(rank=1, at_ms=1_800_000, step=1_800, seq=3),
    )
    assert mark == AttemptMark(at_ms=1_800_000, step=1_800)
    assert run.tally.marks == 3
    assert run.result(0.0).metrics["jobs_started"] == 2


def test_marks_are_queued_one_at_a_time_however_short_the_interval() -> None:
    # Two one-member jobs of 2 h marking every second: 14,398 marks, never more than one
    # mark event per attempt in the queue.
    jobs = (
        SimJob(0, job("j1", gpu=8), 7_200_000, checkpoint_ms=1_000),
        SimJob(0, job("j2", gpu=8), 7_200_000, checkpoint_ms=1_000),
    )
    w = Workload("marks", synthetic_cluster(2), jobs, "marks")

    class Counting(_MarksSeen):
        most = 0

        def _mark(self, key: str) -> None:
            super()._mark(key)
            self.most = max(self.most, sum(1 for e in self.events if e[2] == MARK))

    run = Counting(w, Ours(), build_cluster(w, ClusterConfig(retention_ms=0)), Pacing())
    run.run()
    assert run.tally.marks == 2 * 7_199
    assert run.most == 2
    assert run.seen[-1][3] == AttemptMark(at_ms=7_199_000, step=7_199)


def _marking_reclaim(preempt_at_s: int, every_s: int = 1_200) -> Workload:
    # The reclaim workload, b2 marking a checkpoint every ``every_s`` of run time (from
    # its bind at 1 s) and a1 arriving at ``preempt_at_s`` to reclaim it.
    w = _reclaim_workload()
    b1, b2, a1 = w.jobs
    jobs = (
        b1,
        replace(b2, checkpoint_ms=every_s * 1000),
        replace(a1, arrival_ms=preempt_at_s * 1000),
    )
    return replace(w, jobs=jobs)


def test_a_victim_stopped_5_minutes_after_its_mark_loses_5_minutes_of_its_gpus() -> None:
    # b2 marks at 1,201 s; chosen at 1,471 s, its members stop a grace later, at 1,501 s.
    run = _run(_marking_reclaim(1_471), _ReclaimAt(1_471_000, preemptor="a1", victim="b2"))
    t = run.result(0.0).metrics["tenancy"]
    assert (t["preemptions"], t["victims_stopped"], t["victims_stopped_with_a_mark"]) == (1, 1, 1)
    assert t["gpu_hours_lost"] == pytest.approx(8 * 300 / 3600, abs=1e-3)
    # Without the mark it would have lost its whole run, from its bind at 1 s.
    assert t["gpu_hours_lost_without_marks"] == pytest.approx(8 * 1_500 / 3600, abs=1e-3)
    # Placed again, b2 resumes from its mark's step (1,200 s of its 5,000 s run): its
    # next attempt marks from step 2,400 on and ends 3,800 s after its bind.
    b2 = run.records[_job_id(run, 1)]
    marks = [(at, mark) for at, name, _, mark in run.seen if name == "b2"]
    assert marks[0] == (1_201_000, AttemptMark(at_ms=1_201_000, step=1_200))
    at, mark = marks[1]
    assert mark is not None and mark.step == 2_400
    rebound = at - 1_200_000
    assert rebound >= 1_501_000 and b2.starts == 2
    assert b2.end_ms == rebound + 3_800_000


def _job_id(run: Run, index: int) -> str:
    return next(job_id for job_id, i in run.index_of.items() if i == index)


def test_a_victim_that_marks_during_its_grace_loses_only_since_that_mark() -> None:
    # b2 marks at 1,201 s and 2,401 s; chosen at 2,390 s, it stops at 2,420 s, having
    # marked 19 s before.
    run = _run(_marking_reclaim(2_390), _ReclaimAt(2_390_000, preemptor="a1", victim="b2"))
    t = run.result(0.0).metrics["tenancy"]
    assert [at for at, name, _, _ in run.seen if name == "b2"][:2] == [1_201_000, 2_401_000]
    assert t["gpu_hours_lost"] == pytest.approx(8 * 19 / 3600, abs=1e-3)
    marks = [mark for _, name, _, mark in run.seen if name == "b2"]
    assert marks[2] is not None and marks[2].step == 2_400 + 1_200  # resumed from 2,400


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
    # Checkpoint intervals log-uniform in 10-60 min, from a generator of their own.
    every = [j.checkpoint_ms for j in a.jobs]
    assert all(600_000 <= e <= 3_600_000 for e in every)
    assert min(every) < 1_200_000 and max(every) > 2_400_000
    plain = multi_tenant(seed=4, hours=3, checkpoint_minutes=None)
    assert [replace(j, checkpoint_ms=0) for j in a.jobs] == list(plain.jobs)
    assert all(j.checkpoint_ms == 0 for j in plain.jobs)


def test_the_tree_workload_has_the_same_jobs_in_two_organisations() -> None:
    flat = multi_tenant(seed=4, hours=3)
    tree = multi_tenant(seed=4, hours=3, organisations=2)
    assert tree.jobs == flat.jobs
    assert {q.name: q.cohort for q in tree.queues} == {
        "team-a": "org-1",
        "team-b": "org-2",
        "team-c": "org-1",
        "team-d": "org-2",
    }
    state = build_cluster(tree, ClusterConfig(retention_ms=0))
    assert {name: r.parent for name, r in state.cohorts.items()} == {
        "research": "",
        "org-1": "research",
        "org-2": "research",
    }


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
        "preemptors_in_one_rack",
        "queue_delay_vs_off",
    }
    assert all(figures["checkpoint_marks"] > 0 for figures in out["modes"].values())
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


@pytest.mark.parametrize("workload", ["trace", "multi-tenant"])
def test_cli_writes_the_report_and_plots_of_every_queue_workload(
    workload: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    trace = tmp_path / "jobs.csv"
    trace.write_text(
        "submit_s,queue,members,gpus_per_member,duration_s,checkpoint_s\n"
        "0,team-a,2,8,3000,600\n"
        "30,team-b,1,4,60,\n"
    )
    out_dir = tmp_path / "out"
    argv = ["--workload", workload, "--nodes", "4", "--out", str(out_dir)]
    argv += ["--trace-file", str(trace)] if workload == "trace" else ["--hours", "0.3"]
    assert main(argv) == 0
    printed = json.loads(capsys.readouterr().out)
    assert json.loads((out_dir / "report.json").read_text()) == printed
    assert set(printed["modes"]) == {"off", "blind", "topology"}
    assert all(f["checkpoint_marks"] > 0 for f in printed["modes"].values())
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return  # the plots need the bench extra; the report is written without it
    for name in ("allocation.png", "queue.png", "delay_cdf.png"):
        assert (out_dir / name).stat().st_size > 0


def test_the_heavy_tailed_workload_has_eight_unequal_queues_and_long_jobs() -> None:
    workload = heavy_tailed(seed=3, weeks=1.0)
    assert [q.gpu for q in workload.queues] == [32] * 8
    assert {q.cohort for q in workload.queues} == {"research"}
    durations = sorted(j.duration_ms for j in workload.jobs)
    median_h = durations[len(durations) // 2] / 3_600_000
    assert 6 <= median_h <= 16, median_h  # drawn with a median of 10 h
    assert durations[-1] <= 168 * 3_600_000 and durations[-1] > 4 * 3_600_000
    demand: dict[str, float] = {}
    for j in workload.jobs:
        gpus = j.spec.resources.gpu * j.spec.replicas
        demand[j.spec.queue] = demand.get(j.spec.queue, 0.0) + gpus * j.duration_ms
    assert max(demand.values()) > 2 * min(demand.values())  # unequal demand
    assert all(j.checkpoint_ms for j in workload.jobs)
    assert heavy_tailed(seed=3, weeks=1.0).jobs == workload.jobs  # seeded
