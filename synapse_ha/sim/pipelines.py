"""Pipelines: chains of steps and sweeps, with the dependencies in the scheduler or in an
orchestrator outside it, side by side.

A **chain** is preprocess → train → evaluate → export, each step ``afterok`` the one
before; a **sweep** is several trials and an aggregate step ``afterok`` all of them. With
the dependencies in the scheduler (``scheduler``), every step is submitted when its
pipeline starts and waits in the cluster (reason ``dependency``): the state machine
resolves it when the step before succeeds, and the next pass places it. With an
orchestrator (``orchestrator``), as Airflow or a script polling ``synctl status`` every
:data:`POLL_MS` would do, a step is submitted at the first poll after the steps before it
ended. The figure is each pipeline's makespan: its first step's arrival to its last
step's end.
"""

from __future__ import annotations

import dataclasses
import random
from typing import Any

from synapse_ha.core.cluster_config import ClusterConfig
from synapse_ha.core.model import JobSpec, JobState, Resources
from synapse_ha.core.workflows.dependencies import Dependencies
from synapse_ha.sim.engine import ARRIVE, Pacing, Run, build_cluster
from synapse_ha.sim.fairness import summary
from synapse_ha.sim.policies import Ours
from synapse_ha.sim.workload import SimJob, Workload, gang_spec, synthetic_cluster

POLL_MS = 30_000  # how often the orchestrator of the baseline polls
# A step without GPUs (preparing data, exporting, picking a sweep's best trial).
CPU_STEP = JobSpec("cpu", 1, Resources(4_000, 16 * 1024, 0), ("python step.py",))
MODES = ("scheduler", "orchestrator")
MS_PER_MIN = 60_000


def pipeline_workload(seed: int = 1, hours: float = 6.0, nodes: int = 32) -> Workload:
    """Pipelines arriving about every 8 minutes for ``hours`` on ``nodes`` 8-GPU hosts:
    two chains for every sweep. Each job's ``after_ok`` names the steps it waits for."""
    rng = random.Random(f"pipelines-{seed}")
    jobs: list[SimJob] = []
    t = 0.0
    end = hours * 3_600_000
    while t < end:
        start = int(t)
        if rng.random() < 2 / 3:
            _chain(jobs, rng, start)
        else:
            _sweep(jobs, rng, start)
        t += rng.expovariate(1 / (8 * MS_PER_MIN))
    return Workload(
        name="pipelines",
        nodes=synthetic_cluster(nodes),
        jobs=tuple(jobs),
        notes=f"chains and sweeps for {hours:g} h on {nodes} hosts of 8 GPUs, seed {seed}",
    )


def _step(jobs: list[SimJob], name: str, spec: JobSpec, start: int, minutes: float,
          after: tuple[int, ...]) -> int:  # fmt: skip
    jobs.append(SimJob(start, dataclasses.replace(spec, name=name), int(minutes * MS_PER_MIN),
                       after_ok=after))  # fmt: skip
    return len(jobs) - 1


def _chain(jobs: list[SimJob], rng: random.Random, start: int) -> None:
    n = len(jobs)
    prep = _step(jobs, f"prep-{n}", CPU_STEP, start, rng.uniform(5, 15), ())
    gpus = rng.choice([8, 16, 32, 64])
    train = _step(jobs, f"train-{n}", gang_spec("x", gpus, 8), start, rng.uniform(30, 120), (prep,))
    evaluate = _step(jobs, f"eval-{n}", gang_spec("x", 8, 8), start, rng.uniform(10, 20), (train,))
    _step(jobs, f"export-{n}", CPU_STEP, start, rng.uniform(2, 5), (evaluate,))


def _sweep(jobs: list[SimJob], rng: random.Random, start: int) -> None:
    n = len(jobs)
    trials = tuple(
        _step(jobs, f"trial-{n}-{i}", gang_spec("x", 8, 8), start, rng.uniform(20, 40), ())
        for i in range(rng.randint(4, 8))
    )
    _step(jobs, f"pick-{n}", CPU_STEP, start, rng.uniform(2, 5), trials)


def pipelines_of(workload: Workload) -> list[list[int]]:
    """The workload's pipelines: each the indices of its jobs, joined by ``after_ok``."""
    parent = list(range(len(workload.jobs)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for i, job in enumerate(workload.jobs):
        for j in job.after_ok:
            parent[root(i)] = root(j)
    groups: dict[int, list[int]] = {}
    for i in range(len(workload.jobs)):
        groups.setdefault(root(i), []).append(i)
    return [g for g in groups.values() if len(g) > 1]


class PipelineRun(Run):
    """A run whose jobs may wait for others, with the dependencies in the scheduler or
    in an orchestrator that submits a step at its first poll after the steps before it
    ended (``orchestrated``)."""

    def __init__(self, *args: Any, orchestrated: bool, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.orchestrated = orchestrated
        self.ended: dict[int, JobState] = {}  # index -> how it ended
        self.never_run: set[int] = set()  # steps never submitted (a step before failed)

    def _arrive(self, index: int, spec: JobSpec | None = None) -> None:
        if index in self.job_id_of or index in self.never_run:
            return  # submitted already (the orchestrator's poll came after the arrival)
        job = self.workload.jobs[index]
        failed = [
            i
            for i in job.after_ok
            if self.ended.get(i, JobState.SUCCEEDED) is not JobState.SUCCEEDED
        ]
        if failed:
            self.never_run.add(index)
            return
        waiting = [i for i in job.after_ok if i not in self.ended]
        if waiting and self.orchestrated:
            return  # submitted when the orchestrator sees them end (_released)
        deps = Dependencies(after_ok=tuple(self.job_id_of[i] for i in waiting))
        super()._arrive(
            index, dataclasses.replace(job.spec, dependencies=deps) if waiting else None
        )

    def _released(self, job_id: str) -> None:
        super()._released(job_id)
        job = self.state.jobs[job_id]
        if job.state.finished:
            self._ended(self.index_of[job_id], job.state)
        # Steps the state machine cancelled (a step before failed) never held resources.
        for waiting_id in [j for j in self.pending if self.state.jobs[j].state.finished]:
            del self.pending[waiting_id]
            self._ended(self.index_of[waiting_id], self.state.jobs[waiting_id].state)

    def _ended(self, index: int, state: JobState) -> None:
        self.ended[index] = state
        if not self.orchestrated:
            return
        poll = -(-self.now // POLL_MS) * POLL_MS
        for i, job in enumerate(self.workload.jobs):
            if index in job.after_ok and all(d in self.ended for d in job.after_ok):
                self._push(max(poll, job.arrival_ms), ARRIVE, str(i))

    def _extra_metrics(self, metrics: dict[str, Any]) -> None:
        spans = []
        for steps in pipelines_of(self.workload):
            ends = [self.records[self.job_id_of[i]].end_ms for i in steps if i in self.job_id_of]
            if len(ends) < len(steps) or any(e is None for e in ends):
                continue  # a step never ran
            first = min(self.workload.jobs[i].arrival_ms for i in steps)
            spans.append((max(e for e in ends if e is not None) - first) / 1000)
        metrics["pipelines"] = {
            "pipelines": len(pipelines_of(self.workload)),
            "completed": len(spans),
            "makespan_s": summary(spans),
            "steps_never_run": len(self.never_run),
        }


def run_pipelines(workload: Workload, config: ClusterConfig | None = None,
                  pass_interval_ms: int = 500) -> dict[str, Any]:  # fmt: skip
    """``workload`` with the dependencies in the scheduler and in an orchestrator; the
    makespans side by side."""
    out: dict[str, Any] = {"workload": workload.notes, "poll_s": POLL_MS / 1000}
    for mode in MODES:
        state = build_cluster(workload, config or ClusterConfig(retention_ms=0))
        run = PipelineRun(workload, Ours(), state, Pacing(pass_interval_ms=pass_interval_ms),
                          orchestrated=mode == "orchestrator")  # fmt: skip
        run.run()
        result = run.result(0.0)
        out[mode] = result.metrics["pipelines"] | {
            "gpu_allocation": result.metrics["gpu_allocation"]
        }
    ours, theirs = out["scheduler"]["makespan_s"], out["orchestrator"]["makespan_s"]
    out["scheduler_over_orchestrator"] = {
        k: round(ours[k] / theirs[k], 3) if theirs[k] else None for k in ("mean", "p95", "max")
    }
    return out
