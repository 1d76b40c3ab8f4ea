"""Victims that save on notice (``Workload.save_on_notice_ms``) and the plan's shrinks in
the simulator: a victim with a checkpoint interval marks a checkpoint of the step it had
reached at its notice after its save and exits, ending its grace then; an elastic gang's
shrink a preemption takes is applied before the preemptions, its GPUs freed at once."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from synapse_ha.core.cluster_config import ClusterConfig, Queue
from synapse_ha.core.commands import BindPlan, ShrinkMembers
from synapse_ha.core.elastic import ElasticPolicy
from synapse_ha.core.model import ClusterState
from synapse_ha.core.workflows.checkpoints import AttemptMark
from synapse_ha.sim.engine import Pacing, Run, build_cluster, simulate
from synapse_ha.sim.marks import save_delay_ms
from synapse_ha.sim.policies import Ours
from synapse_ha.sim.quality import SAVE_ON_NOTICE_MS, saving_on_notice, trace_file_workload
from synapse_ha.sim.workload import SimJob, Workload, synthetic_cluster
from tests.core.harness import job
from tests.sim.test_tenancy import _job_id, _marking_reclaim, _reclaim_workload, _ReclaimAt, _run


def test_a_victim_that_saves_on_notice_stops_after_its_save_and_loses_only_it() -> None:
    # b2 (bound at 1 s) marks at 1,201 s; chosen at 1,471 s, it saves for 10 s, marks the
    # step it had reached at the notice (1,470 s of run time) at 1,481 s and exits then:
    # its 8 GPUs did no work for those 10 s.
    w = replace(_marking_reclaim(1_471), save_on_notice_ms=(10_000, 10_000))
    run = _run(w, _ReclaimAt(1_471_000, preemptor="a1", victim="b2"))
    t = run.result(0.0).metrics["tenancy"]
    assert (t["preemptions"], t["victims_stopped"], t["victims_stopped_with_a_mark"]) == (1, 1, 1)
    assert t["gpu_hours_lost"] == pytest.approx(8 * 10 / 3600, abs=1e-3)
    assert t["gpu_hours_lost_without_marks"] == pytest.approx(8 * 1_480 / 3600, abs=1e-3)
    # The preemptor waited for the save, not the grace.
    assert t["preemptor_wait_s"]["max"] == 10.0
    assert t["queues"]["a"]["quota_back_s"]["max"] == 10.0
    # Placed again, b2 resumes from step 1,470 of its 5,000 s: its next mark is of step
    # 2,670 and it ends 3,530 s after its bind.
    b2 = run.records[_job_id(run, 1)]
    marks = [(at, mark) for at, name, _, mark in run.seen if name == "b2"]
    assert marks[0] == (1_201_000, AttemptMark(at_ms=1_201_000, step=1_200))
    at, mark = marks[1]
    assert mark is not None and mark.step == 1_470 + 1_200
    rebound = at - 1_200_000
    assert rebound >= 1_481_000 and b2.starts == 2
    assert b2.end_ms == rebound + 3_530_000


def test_a_save_longer_than_the_grace_is_cut_short_by_it() -> None:
    # The same reclaim with a 40 s save: b2 stops when its grace ends (1,501 s), having
    # lost the 300 s since its mark at 1,201 s, as without the option.
    w = replace(_marking_reclaim(1_471), save_on_notice_ms=(40_000, 40_000))
    run = _run(w, _ReclaimAt(1_471_000, preemptor="a1", victim="b2"))
    t = run.result(0.0).metrics["tenancy"]
    assert t["gpu_hours_lost"] == pytest.approx(8 * 300 / 3600, abs=1e-3)
    assert t["preemptor_wait_s"]["max"] == 30.0


def test_a_victim_that_never_checkpoints_runs_out_its_grace_with_the_option() -> None:
    w = replace(_reclaim_workload(), save_on_notice_ms=(5_000, 5_000))
    result = simulate(w, _ReclaimAt(600_000, preemptor="a1", victim="b2"))
    t = result.metrics["tenancy"]
    assert t["preemptor_wait_s"]["max"] == 30.0
    assert t["gpu_hours_lost"] == pytest.approx(8 * 629 / 3600, abs=1e-3)


def test_the_save_time_is_drawn_within_its_bounds_and_seeded() -> None:
    draws = [save_delay_ms(SAVE_ON_NOTICE_MS, "w", f"job-{i}", 7) for i in range(200)]
    assert all(5_000 <= d <= 20_000 for d in draws)
    assert len(set(draws)) > 100
    assert draws == [save_delay_ms(SAVE_ON_NOTICE_MS, "w", f"job-{i}", 7) for i in range(200)]
    assert save_delay_ms((9_000, 9_000), "w", "job-1", 3) == 9_000


def test_bad_save_bounds_are_refused_naming_the_field() -> None:
    w = replace(_reclaim_workload(), save_on_notice_ms=(20_000, 5_000))
    with pytest.raises(ValueError, match=r"save_on_notice_ms: must be \(low, high\)"):
        simulate(w, Ours())


def test_the_report_saves_on_notice_only_in_workloads_that_checkpoint() -> None:
    assert saving_on_notice(_reclaim_workload()).save_on_notice_ms is None
    marking = saving_on_notice(_marking_reclaim(1_471))
    assert marking.save_on_notice_ms == SAVE_ON_NOTICE_MS
    assert saving_on_notice(_marking_reclaim(1_471), None).save_on_notice_ms is None


class _ShrinkAt(Ours):
    """The real scheduler, with one scripted shrink: at ``at_ms`` the running gang named
    ``giver`` gives back its ranks from ``size`` for the pending job named ``taker``."""

    def __init__(self, at_ms: int, giver: str, size: int, taker: str) -> None:
        super().__init__()
        self.at_ms, self.giver, self.size, self.taker = at_ms, giver, size, taker

    def plan(self, state: ClusterState, now_ms: int) -> BindPlan | None:
        command = super().plan(state, now_ms)
        self.shrinks = ()
        if now_ms == self.at_ms:
            by_name = {j.spec.name: j for j in state.jobs.values()}
            giver, taker = by_name[self.giver], by_name[self.taker]
            shrink = ShrinkMembers(giver.job_id, giver.fencing_token, self.size, taker.job_id)
            self.shrinks = (replace(shrink, now_ms=now_ms),)
        return command


def _elastic_workload() -> Workload:
    # Two 8-GPU hosts; queues a and b of 8 GPUs in one cohort. b runs an elastic gang of
    # 2 x 8 GPUs (min 1), borrowing a's quota; a1 arrives at 600 s.
    elastic = replace(job("e", replicas=2, gpu=8, queue="b"), elastic=ElasticPolicy(1))
    jobs = (
        SimJob(0, elastic, 5_000_000),
        SimJob(600_000, job("a1", gpu=8, queue="a"), 100_000),
    )
    queues = (Queue("a", gpu=8, cohort="c"), Queue("b", gpu=8, cohort="c"))
    nodes = synthetic_cluster(2, hosts_per_rack=2)
    return Workload("elastic", nodes, jobs, "elastic", queues=queues)


def test_a_plans_shrink_gives_its_gpus_back_at_once_and_the_taker_starts() -> None:
    w = _elastic_workload()
    state = build_cluster(w, ClusterConfig(retention_ms=0))
    run = Run(w, _ShrinkAt(600_000, giver="e", size=1, taker="a1"), state, Pacing())
    run.run()
    e, a1 = run.records[_job_id(run, 0)], run.records[_job_id(run, 1)]
    # a1 starts at the next pass after the shrink, not when the gang ends.
    assert a1.start_ms == 600_001
    assert (e.starts, e.end_ms) == (1, 5_000_000)
    # Every GPU is accounted for: the gang's released share is what it still held.
    assert run.allocated == 0 and all(v == 0 for v in run.usage.values())
    assert run.result(0.0).metrics["never_started"] == []


def test_a_trace_checkpoint_interval_is_given_to_jobs_without_one(tmp_path: Path) -> None:
    trace = tmp_path / "jobs.csv"
    trace.write_text(
        "submit_s,queue,members,gpus_per_member,duration_s,checkpoint_s\n"
        "0,team-a,1,8,600,\n"
        "0,team-b,1,8,600,120\n"
    )
    w = trace_file_workload(trace, 2, checkpoint_s=300)
    assert [j.checkpoint_ms for j in w.jobs] == [300_000, 120_000]
    assert [j.checkpoint_ms for j in trace_file_workload(trace, 2).jobs] == [0, 120_000]
    assert saving_on_notice(w).save_on_notice_ms == SAVE_ON_NOTICE_MS
    with pytest.raises(ValueError, match=r"checkpoint interval: at least 1 second, got 0\.5"):
        trace_file_workload(trace, 2, checkpoint_s=0.5)
