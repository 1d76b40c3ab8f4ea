"""Failure policies side by side: what a GPU failure costs a training gang when the gang
is requeued whole, when only its lost rank is placed again, and when that rank takes a
hot spare first.

The failures are :mod:`synapse_ha.sim.gpu_failures`' (a seeded Poisson process per GPU,
the same failures on the same GPUs under every policy), the core learns of each at once
(``ReportGpuHealth``: the health-aware core), and the real planner and ``apply`` do the
rest. The policies (:class:`Recovery`):

* ``requeue`` (a job spec without ``replace``): the core ends the gang's attempt as a
  disruption; the gang waits in the queue for all its nodes again and restarts from its
  last checkpoint once placed.
* ``replace`` (every multi-member gang's spec carries a ``ReplacePolicy``): the failed
  GPU's rank becomes a vacancy of the running attempt; once that member reported its
  exit, the leader's replacement plan (``plan_replacements``, applied before each
  scheduling pass) places the rank again on another node, and the other members keep
  their nodes. A vacancy not filled within the policy's timeout requeues the gang whole
  (``due_replacement_timeouts``).
* ``replace+spares``: the same, with :attr:`RecoveryModel.spares_per_rack` nodes of each
  rack kept as hot spares, out of normal placement, which replacements take first.

A gang a failure hits loses the work since its last checkpoint under every policy (a
distributed job restarts every worker from the checkpoint when a peer dies, as
torchrun's elastic agent does), then pays :attr:`RecoveryModel.restart_overhead_ms` (the
same for every policy: processes, NCCL set-up, checkpoint load) once it runs again at
full size. Checkpoints are every :attr:`FailureModel.checkpoint_ms` of useful run time
from the moment that useful work began.

Figures (``metrics["recovery"]``): see :func:`recovery_figures`.
"""

from __future__ import annotations

import enum
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any

from synapse_ha.core.cluster_config import ClusterConfig
from synapse_ha.core.model import ClusterState, Job, JobState
from synapse_ha.sim.engine import FINISH, GRACE_MS, Pacing, build_cluster
from synapse_ha.sim.gpu_failures import MS_PER_HOUR, FailureModel, FaultPolicy, FaultRun
from synapse_ha.sim.metrics import BIG_GANG_GPUS, _pct
from synapse_ha.sim.policies import Ours
from synapse_ha.sim.workload import Workload

RESTART_OVERHEAD_MS = 60_000
REPLACE_TIMEOUT_MS = 300_000  # the job spec's default replace timeout
MAX_OVERHEAD_MS = 24 * MS_PER_HOUR


class Recovery(enum.StrEnum):
    REQUEUE = "requeue"
    REPLACE = "replace"
    REPLACE_SPARES = "replace+spares"


@dataclass(frozen=True, slots=True)
class RecoveryModel:
    """How a gang comes back from a failure. ``restart_overhead_ms``: from running at
    full size again to useful work (every policy); ``spares_per_rack``: hot spares of
    each rack under ``replace+spares``; ``replace_timeout_ms``: a vacancy's wait before
    the gang is requeued whole."""

    restart_overhead_ms: int = RESTART_OVERHEAD_MS
    spares_per_rack: int = 1
    replace_timeout_ms: int = REPLACE_TIMEOUT_MS

    def check(self) -> None:
        """Raise ValueError naming the first field out of its range."""
        for name, value, least, most in (
            ("restart_overhead_ms", self.restart_overhead_ms, 0, MAX_OVERHEAD_MS),
            ("spares_per_rack", self.spares_per_rack, 0, 64),
            ("replace_timeout_ms", self.replace_timeout_ms, 1_000, MAX_OVERHEAD_MS),
        ):
            if not least <= value <= most:
                raise ValueError(f"{name}: between {least} and {most}, got {value}")

    def describe(self) -> dict[str, Any]:
        return {
            "restart_overhead_s": self.restart_overhead_ms / 1000,
            "spares_per_rack": self.spares_per_rack,
            "replace_timeout_s": self.replace_timeout_ms / 1000,
        }


@dataclass(slots=True)
class LossTally:
    """GPU x ms held by gangs that did not count, by cause."""

    work: int = 0  # run since the last checkpoint, thrown away by a failure
    overhead: int = 0  # restart overhead after a failure
    waiting: int = 0  # survivors' GPUs while their lost rank waited to be placed again

    @property
    def total(self) -> int:
        return self.work + self.overhead + self.waiting


class RecoveryRun(FaultRun):
    """A health-aware :class:`~synapse_ha.sim.gpu_failures.FaultRun` that lives with the
    failures as ``recovery`` says, and measures each job's effective training time.

    Per job it keeps the current run segment (when it began to hold its GPUs at full
    size, and when useful work began, the restart overhead later), the GPUs it holds and
    since when, and the run's end (a FINISH event for another end is stale)."""

    def __init__(
        self,
        workload: Workload,
        state: ClusterState,
        model: FailureModel,
        recovery: Recovery,
        recovery_model: RecoveryModel,
        pacing: Pacing | None = None,
        scripted: tuple[tuple[int, str, int], ...] | None = None,
    ) -> None:
        super().__init__(workload, Ours(), state, model, FaultPolicy.HEALTH_AWARE, pacing, scripted)
        self.recovery = recovery
        self.recovery_model = recovery_model
        self.segment: dict[str, tuple[int, int]] = {}  # job -> (held from, useful from)
        self.holding: dict[str, tuple[int, int]] = {}  # job -> (GPUs held, since)
        self.held_gpu_ms: Counter[str] = Counter()
        self.hits: Counter[str] = Counter()  # job -> failures that hit it
        self.run_end: dict[str, int] = {}  # job -> when its current run ends
        self.lost = LossTally()

    # ------------------------------------------------------------- what a job holds

    def _hold(self, job_id: str, gpus: int) -> None:
        """From now on ``job_id`` holds ``gpus`` GPUs: settle what it held until now."""
        held = self.holding.pop(job_id, None)
        if held is not None:
            self.held_gpu_ms[job_id] += held[0] * (self.now - held[1])
        if gpus:
            self.holding[job_id] = (gpus, self.now)

    def _after_start(self, job_id: str) -> None:
        """A bind at full size: a run segment begins; after a failure, the useful work
        begins the restart overhead later."""
        super()._after_start(job_id)
        overhead = self.recovery_model.restart_overhead_ms if self.hits[job_id] else 0
        self.segment[job_id] = (self.now, self.now + overhead)
        self.run_end[job_id] = self.now + self._run_ms(job_id)
        self._hold(job_id, self.records[job_id].gpus)

    def _run_ms(self, job_id: str) -> int:
        """The work left, plus the restart overhead after a failure."""
        overhead = self.recovery_model.restart_overhead_ms if self.hits[job_id] else 0
        return super()._run_ms(job_id) + overhead

    def _close_segment(self, job_id: str) -> tuple[int, int]:
        """The job's run segment ends now: count the restart overhead it spent; its
        start and when its useful work began."""
        held_from, useful_from = self.segment.pop(job_id)
        gpus = self.records[job_id].gpus
        self.lost.overhead += gpus * (min(self.now, useful_from) - held_from)
        return held_from, useful_from

    def _released(self, job_id: str) -> None:
        if job_id in self.segment:
            self._close_segment(job_id)
        self._hold(job_id, 0)
        self.run_end.pop(job_id, None)
        super()._released(job_id)

    def _end(self, kind: int, key: str) -> bool:
        """An attempt's end; a FINISH of a run a failure interrupted is stale."""
        job_id = key.rsplit("@", 1)[0]
        if kind == FINISH and self.run_end.get(job_id) != self.now:
            return False
        return super()._end(kind, key)

    def _loss_ms(self, job: Job) -> int:
        """A failure hits ``job``'s run: the useful work since its last checkpoint is
        lost (the rest is kept as progress), and so is the overhead it spent since its
        segment began. The run time of the segment that no checkpoint kept."""
        job_id = job.job_id
        held_from, useful_from = self._close_segment(job_id)
        now, every = self.now, self.model.checkpoint_ms
        ran = max(0, now - useful_from)
        kept = ran - ran % every if every else 0
        self.progress[job_id] = self.progress.get(job_id, 0) + kept
        self.lost.work += self.records[job_id].gpus * (ran - kept)
        self.hits[job_id] += 1
        return now - held_from - kept

    def _extra_metrics(self, metrics: dict[str, Any]) -> None:
        super()._extra_metrics(metrics)
        metrics["recovery"] = recovery_figures(self)


@dataclass(slots=True)
class Outcome:
    """What one or more runs of a policy measured, merged over seeds by :meth:`add`.

    ``jobs``: per job that ran, (GPUs, whether a failure hit it, its useful run time,
    its wall time from its first start to its end), in ms; ``delays_s``: restart delays."""

    policy: str
    jobs: list[tuple[int, bool, int, int]] = field(default_factory=list)
    delays_s: list[float] = field(default_factory=list)
    lost: LossTally = field(default_factory=LossTally)
    failures: int = 0
    goodput_gpu_ms: int = 0
    held_gpu_ms: int = 0
    jobs_failed: int = 0
    runs: int = 0

    def add(self, other: Outcome) -> None:
        """Merge ``other`` (the same policy, another seed) into this one."""
        self.jobs += other.jobs
        self.delays_s += other.delays_s
        for name in ("work", "overhead", "waiting"):
            setattr(self.lost, name, getattr(self.lost, name) + getattr(other.lost, name))
        self.failures += other.failures
        self.goodput_gpu_ms += other.goodput_gpu_ms
        self.held_gpu_ms += other.held_gpu_ms
        self.jobs_failed += other.jobs_failed
        self.runs += other.runs


def outcome(run: RecoveryRun) -> Outcome:
    """The outcome of a finished run: a job's useful run time is its duration when it
    succeeded, nothing otherwise."""
    out = Outcome(str(run.recovery), runs=1)
    for job_id, rec in run.records.items():
        if rec.start_ms is None or rec.end_ms is None:
            continue
        succeeded = run.final_states.get(job_id) is JobState.SUCCEEDED
        useful = rec.duration_ms if succeeded else 0
        out.jobs.append((rec.gpus, run.hits[job_id] > 0, useful, rec.end_ms - rec.start_ms))
        out.goodput_gpu_ms += rec.gpus * useful
    out.delays_s = list(run.restart_delays_s)
    out.lost = replace(run.lost)
    out.failures = run.faults.failures
    out.held_gpu_ms = sum(run.held_gpu_ms.values())
    out.jobs_failed = len(run.failed_jobs)
    return out


def recovery_figures(run: RecoveryRun) -> dict[str, Any]:
    """The failure policy's figures of a finished run (:func:`figures`)."""
    return figures(outcome(run))


def figures(o: Outcome) -> dict[str, Any]:
    """The figures of an outcome, JSON-ready.

    * ``ettr``: effective training time ratio of each job that ran, its useful run time
      over its wall time from its first start to its end; n, mean, p50 and min over
      gangs of :data:`BIG_GANG_GPUS`+ GPUs (``gangs_64_plus``), over every job
      (``all``) and over the jobs a failure hit (``hit``), and weighted by GPUs x wall
      time (``gpu_weighted``).
    * ``goodput_gpu_hours``: GPUs x run time of the jobs that succeeded;
      ``gpu_hours_held``: GPUs x time held by every job; ``goodput_share_of_held``.
    * ``gpu_hours_lost``: held, not counted (held less goodput), by cause (``..._work``
      since the last checkpoint, ``..._restart_overhead``,
      ``..._waiting_for_replacement``).
    * ``restart_delay_s``: from a failure ending or interrupting a gang until it runs
      again at full size (its next bind, or its lost rank placed again), n, mean, p50,
      p99 and max; the restart overhead comes after it.
    """
    ratios = [(g, hit, min(u / w, 1.0) if w > 0 else 1.0) for g, hit, u, w in o.jobs]
    wall_area = sum(g * w for g, _, _, w in o.jobs)
    lost = o.lost
    return {
        "policy": o.policy,
        "runs": o.runs,
        "gpu_failures": o.failures,
        "gangs_hit": sum(1 for _, hit, _ in ratios if hit),
        "ettr": {
            "gangs_64_plus": _ratios([r for g, _, r in ratios if g >= BIG_GANG_GPUS]),
            "all": _ratios([r for _, _, r in ratios]),
            "hit": _ratios([r for _, hit, r in ratios if hit]),
            "gpu_weighted": round(o.goodput_gpu_ms / wall_area, 5) if wall_area else None,
        },
        "goodput_gpu_hours": _hours(o.goodput_gpu_ms),
        "gpu_hours_held": _hours(o.held_gpu_ms),
        "goodput_share_of_held": (
            round(o.goodput_gpu_ms / o.held_gpu_ms, 5) if o.held_gpu_ms else None
        ),
        "gpu_hours_lost": _hours(lost.total),
        "gpu_hours_lost_work": _hours(lost.work),
        "gpu_hours_lost_restart_overhead": _hours(lost.overhead),
        "gpu_hours_lost_waiting_for_replacement": _hours(lost.waiting),
        "restart_delay_s": _delays(o.delays_s),
        "jobs_failed_by_faults": o.jobs_failed,
    }


def _hours(gpu_ms: float) -> float:
    return round(gpu_ms / MS_PER_HOUR, 3)


def _ratios(values: list[float]) -> dict[str, float | int | None]:
    if not values:
        return {"n": 0, "mean": None, "p50": None, "min": None}
    return {
        "n": len(values),
        "mean": round(sum(values) / len(values), 5),
        "p50": round(_pct(values, 0.5), 5),
        "min": round(min(values), 5),
    }


def _delays(values: list[float]) -> dict[str, float | int | None]:
    if not values:
        return {"n": 0, "mean": None, "p50": None, "p99": None, "max": None}
    return {
        "n": len(values),
        "mean": round(sum(values) / len(values), 1),
        "p50": round(_pct(values, 0.5), 1),
        "p99": round(_pct(values, 0.99), 1),
        "max": round(max(values), 1),
    }


def recovery_run(
    workload: Workload,
    model: FailureModel,
    recovery: Recovery,
    recovery_model: RecoveryModel | None = None,
    config: ClusterConfig | None = None,
    grace_ms: int = GRACE_MS,
    pass_interval_ms: int = 0,
    scripted: tuple[tuple[int, str, int], ...] | None = None,
) -> RecoveryRun:
    """A run of ``workload`` under ``model``'s failures, lived with as ``recovery`` says,
    not yet run. A model out of range raises ValueError naming the field."""
    model.check()
    recovery_model = recovery_model or RecoveryModel()
    recovery_model.check()
    state = build_cluster(workload, config or ClusterConfig(retention_ms=0))
    pacing = Pacing(grace_ms, pass_interval_ms)
    return RecoveryRun(workload, state, model, recovery, recovery_model, pacing, scripted)
