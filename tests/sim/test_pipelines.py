"""Pipelines in the simulator (synapse_ha/sim/pipelines.py): the same chains and sweeps
with their dependencies in the scheduler and in a polling orchestrator."""

from __future__ import annotations

import json
import math

import pytest

from synapse_ha.core.cluster_config import ClusterConfig
from synapse_ha.sim.cli import main
from synapse_ha.sim.engine import GRACE_MS, Pacing, build_cluster
from synapse_ha.sim.pipelines import POLL_MS, PipelineRun, pipeline_workload, pipelines_of
from synapse_ha.sim.policies import Ours


def run(orchestrated: bool) -> PipelineRun:
    workload = pipeline_workload(seed=2, hours=1.5, nodes=8)
    state = build_cluster(workload, ClusterConfig(retention_ms=0))
    pipeline = PipelineRun(
        workload, Ours(), state, Pacing(GRACE_MS, 500), orchestrated=orchestrated
    )
    pipeline.run()
    return pipeline


@pytest.mark.parametrize("orchestrated", [False, True])
def test_no_step_starts_before_every_step_it_waits_for_ended(orchestrated: bool) -> None:
    pipeline = run(orchestrated)
    jobs = pipeline.workload.jobs
    assert any(job.after_ok for job in jobs)
    for index, job in enumerate(jobs):
        record = pipeline.records[pipeline.job_id_of[index]]
        assert record.start_ms is not None and record.end_ms is not None
        for before in job.after_ok:
            ended = pipeline.records[pipeline.job_id_of[before]].end_ms
            assert ended is not None and record.start_ms >= ended
            if orchestrated:  # seen at the orchestrator's next poll, not before
                assert record.arrival_ms >= math.ceil(ended / POLL_MS) * POLL_MS
    metrics = pipeline.result(0.0).metrics["pipelines"]
    assert metrics["completed"] == metrics["pipelines"] == len(pipelines_of(pipeline.workload))


def test_the_cli_prints_both_makespans_and_their_ratio(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--workload", "pipelines", "--hours", "1", "--nodes", "8"]) == 0
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    for mode in ("scheduler", "orchestrator"):
        assert report[mode]["completed"] == report[mode]["pipelines"] > 0
        assert report[mode]["makespan_s"]["max"] >= report[mode]["makespan_s"]["mean"] > 0
    assert set(report["scheduler_over_orchestrator"]) == {"mean", "p95", "max"}
    assert "makespan mean" in captured.err
