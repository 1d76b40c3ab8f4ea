"""Failure policies side by side: what a GPU failure costs a training gang when the gang
is requeued whole, when only its lost rank is placed again, when that rank takes a hot
spare first, and when the gang is elastic.

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
* ``replace+spares``: the same, with :attr:`RecoveryModel.spares` nodes of each domain
  at :attr:`RecoveryModel.spare_level` (a rack by default) kept as hot spares, out of
  normal placement, which replacements take first (``ClusterConfig.spares``).
* ``elastic``: every multi-member gang is elastic (core/elastic.py) from ``min``
  (:attr:`RecoveryModel.elastic_min_share` of its members, rounded down, at least one)
  to ``max`` (its members) and replaces a lost rank as under ``replace``: it starts
  with ``min`` members when ``max`` do not fit, grows when room appears and nobody waits
  for it, and gives its members above ``min`` back to a gang waiting for room. The
  leader's growth and shrink plans are applied once a simulated second
  (:func:`~synapse_ha.sim.recovery_elastic.resize_gangs`: at the first whole second
  after anything happened, and each second after a step that resized a gang; a second
  in which nothing happened plans the same as the one before it), before the
  scheduling pass, as the leader does; shrunk ranks report their exit at once.
  ``elastic+spares``: the same with the spares of ``replace+spares`` (growth never
  takes a spare).

A gang a failure hits loses the work since its last checkpoint under every policy (a
distributed job restarts every worker from the checkpoint when a peer dies, as
torchrun's elastic agent does), then pays :attr:`RecoveryModel.restart_overhead_ms` (the
same for every policy: processes, NCCL set-up, checkpoint load) once it runs again at
full size. Checkpoints are every :attr:`FailureModel.checkpoint_ms` of useful run time
from the moment that useful work began.

What a resize costs under ``elastic``: a membership change (a growth, a shrink, or a
lost rank placed again) costs what a restart costs under the other policies, the work
since the last checkpoint and then the restart overhead, because torchrun's elastic
agent restarts every worker from the checkpoint when the membership changes. A gang's
useful work goes at its current size over its ``max`` (half its members: half the
rate), so a job's work is its duration at full size under every policy and ETTR and
goodput stay comparable: a gang that ran at ``min`` all along has an ETTR of its
``min`` over its ``max``. Work kept by a checkpoint counts at the size it was done at.

Figures (``metrics["recovery"]``): see :func:`synapse_ha.sim.recovery_figures.figures`.
"""

from __future__ import annotations

import enum
import math
from collections import Counter
from dataclasses import dataclass, replace
from typing import Any

from synapse_ha.core import commands as c
from synapse_ha.core.cluster_config import ClusterConfig
from synapse_ha.core.machine import apply
from synapse_ha.core.model import ClusterState, Job, JobSpec, JobState
from synapse_ha.core.replacement import ReplacePolicy
from synapse_ha.core.scheduler.replacement import plan_replacements
from synapse_ha.core.spares import spare_nodes
from synapse_ha.core.views import due_replacement_timeouts
from synapse_ha.sim.engine import FINISH, GRACE_MS, Pacing, build_cluster
from synapse_ha.sim.gpu_failures import MS_PER_HOUR, FailureModel, FaultPolicy, FaultRun
from synapse_ha.sim.members import SIGTERM_EXIT, report_all
from synapse_ha.sim.policies import Ours
from synapse_ha.sim.recovery_elastic import (
    ELASTIC_PERIOD_MS,
    Resize,
    apply_shrink,
    elastic_spec,
    resize_gangs,
)
from synapse_ha.sim.recovery_figures import LossTally, Outcome, figures
from synapse_ha.sim.workload import Workload

RESTART_OVERHEAD_MS = 60_000
REPLACE_TIMEOUT_MS = 300_000  # the job spec's default replace timeout
MAX_OVERHEAD_MS = 24 * MS_PER_HOUR


class Recovery(enum.StrEnum):
    REQUEUE = "requeue"
    REPLACE = "replace"
    REPLACE_SPARES = "replace+spares"
    ELASTIC = "elastic"
    ELASTIC_SPARES = "elastic+spares"


ELASTIC_POLICIES = frozenset({Recovery.ELASTIC, Recovery.ELASTIC_SPARES})
SPARE_POLICIES = frozenset({Recovery.REPLACE_SPARES, Recovery.ELASTIC_SPARES})


@dataclass(frozen=True, slots=True)
class RecoveryModel:
    """How a gang comes back from a failure. ``restart_overhead_ms``: from running at
    full size again to useful work (every policy); ``spares``: hot spares of each
    domain at ``spare_level`` under ``replace+spares`` and ``elastic+spares``;
    ``replace_timeout_ms``: a vacancy's wait before the gang is requeued whole;
    ``elastic_min_share``: an elastic gang's ``min``, as a share of its members (rounded
    down, at least one)."""

    restart_overhead_ms: int = RESTART_OVERHEAD_MS
    spares: int = 1
    spare_level: str = "rack"
    replace_timeout_ms: int = REPLACE_TIMEOUT_MS
    elastic_min_share: float = 0.5

    def check(self) -> None:
        """Raise ValueError naming the first field out of its range."""
        for name, value, least, most in (
            ("restart_overhead_ms", self.restart_overhead_ms, 0, MAX_OVERHEAD_MS),
            ("spares", self.spares, 0, 64),
            ("replace_timeout_ms", self.replace_timeout_ms, 1_000, MAX_OVERHEAD_MS),
        ):
            if not least <= value <= most:
                raise ValueError(f"{name}: between {least} and {most}, got {value}")
        share = self.elastic_min_share
        if not (math.isfinite(share) and 0 < share < 1):
            raise ValueError(f"elastic_min_share: more than 0 and less than 1, got {share}")

    def describe(self) -> dict[str, Any]:
        return {
            "restart_overhead_s": self.restart_overhead_ms / 1000,
            "spares": self.spares,
            "spare_level": self.spare_level,
            "replace_timeout_s": self.replace_timeout_ms / 1000,
            "elastic_min_share": self.elastic_min_share,
        }


class RecoveryRun(FaultRun):
    """A health-aware :class:`~synapse_ha.sim.gpu_failures.FaultRun` that lives with the
    failures as ``recovery`` says, and measures each job's effective training time.

    Per job it keeps the current run segment (when it began to hold its GPUs at its
    current size, when useful work began, the restart overhead later, and the GPUs it
    runs on), the GPUs it holds and since when, and the run's end (a FINISH event for
    another end is stale). ``resizes`` records every membership change of an elastic
    gang."""

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
        self.elastic = recovery in ELASTIC_POLICIES
        # job -> (held from, useful from, GPUs it runs on)
        self.segment: dict[str, tuple[int, int, int]] = {}
        self.holding: dict[str, tuple[int, int]] = {}  # job -> (GPUs held, since)
        self.held_gpu_ms: Counter[str] = Counter()
        self.hits: Counter[str] = Counter()  # job -> failures that hit it
        self.run_end: dict[str, int] = {}  # job -> when its current run ends
        self.lost = LossTally()
        self.waiting: set[str] = set()  # jobs running with a lost rank not placed again
        self.replaced = 0  # ranks placed again
        self.replaced_on_spares = 0
        self.replace_timeouts = 0  # gangs requeued whole because a rank was not placed in time
        self.spare_gpus = 0  # GPUs of the spare nodes, since the last instant
        self.spare_gpu_ms = 0
        self.resizes: list[Resize] = []
        self.resized: set[str] = set()  # jobs whose current segment began with a resize
        self.started_small = 0  # binds with fewer members than the gang's max
        self.resize_due = False  # the leader's elastic step is to run at the next second

    # ------------------------------------------------------------- what a job holds

    def _hold(self, job_id: str, gpus: int) -> None:
        """From now on ``job_id`` holds ``gpus`` GPUs: settle what it held until now."""
        held = self.holding.pop(job_id, None)
        if held is not None:
            gpu_ms = held[0] * (self.now - held[1])
            self.held_gpu_ms[job_id] += gpu_ms
            if job_id in self.waiting:
                self.lost.waiting += gpu_ms
        if gpus:
            self.holding[job_id] = (gpus, self.now)

    def _gpus_of(self, job: Job) -> int:
        """The GPUs the job's members hold (a lost rank holds none)."""
        attempt = job.attempt
        assert attempt is not None
        vacant = {v.rank for v in attempt.vacancies}
        return job.spec.resources.gpu * sum(1 for m in attempt.members if m.rank not in vacant)

    def _after_start(self, job_id: str) -> None:
        """A bind: a run segment begins at the gang's size; after a failure, the useful
        work begins the restart overhead later."""
        super()._after_start(job_id)
        rec = self.records[job_id]
        gpus = self._gpus_of(self.state.jobs[job_id])
        # The engine counts the whole gang as bound; an elastic one may start smaller.
        self.allocated += gpus - rec.gpus
        self.usage[rec.queue] += gpus - rec.gpus
        self.started_small += gpus < rec.gpus
        overhead = self.recovery_model.restart_overhead_ms if self.hits[job_id] else 0
        self.segment[job_id] = (self.now, self.now + overhead, gpus)
        self.run_end[job_id] = self.now + self._run_ms(job_id)
        self._hold(job_id, gpus)
        if self.elastic:
            self._resize_soon()

    def _run_ms(self, job_id: str) -> int:
        """The work left at the gang's size, plus the restart overhead after a failure."""
        overhead = self.recovery_model.restart_overhead_ms if self.hits[job_id] else 0
        return self._work_ms(job_id) + overhead

    def _work_ms(self, job_id: str) -> int:
        """How long the work left takes at the gang's current size: the run time left
        at full size, times its max over its size."""
        left = super()._run_ms(job_id)
        whole = self.records[job_id].gpus
        gpus = self._gpus_of(self.state.jobs[job_id])
        return left if gpus >= whole else -(-left * whole // gpus)

    def _close_segment(self, job_id: str) -> tuple[int, int, int]:
        """The job's run segment ends now: count the restart overhead it spent; its
        start, when its useful work began, and its GPUs."""
        held_from, useful_from, gpus = self.segment.pop(job_id)
        overhead = gpus * (min(self.now, useful_from) - held_from)
        self.lost.overhead += overhead
        if job_id in self.resized:
            self.resized.discard(job_id)
            self.lost.resizing += overhead
        return held_from, useful_from, gpus

    def _keep_checkpointed(self, job_id: str) -> tuple[int, int, int]:
        """The job's run segment ends now: its useful work up to its last checkpoint is
        kept (as progress, in run time at full size), the rest is lost. When the segment
        began, the run time a checkpoint kept, and the GPU x ms of work lost."""
        held_from, useful_from, gpus = self._close_segment(job_id)
        now, every = self.now, self.model.checkpoint_ms
        ran = max(0, now - useful_from)
        kept = ran - ran % every if every else 0
        self.progress[job_id] = (
            self.progress.get(job_id, 0) + kept * gpus // self.records[job_id].gpus
        )
        lost = gpus * (ran - kept)
        self.lost.work += lost
        return held_from, kept, lost

    def _released(self, job_id: str) -> None:
        if job_id in self.segment:
            self._close_segment(job_id)
        rec = self.records[job_id]
        held = self.holding.get(job_id, (rec.gpus, 0))[0]
        self.allocated += rec.gpus - held  # the engine frees the whole gang's GPUs
        self.usage[rec.queue] += rec.gpus - held
        self._hold(job_id, 0)
        self.waiting.discard(job_id)
        self.run_end.pop(job_id, None)
        super()._released(job_id)

    def _end(self, kind: int, key: str) -> bool:
        """An attempt's end; a FINISH of a run a failure or a resize interrupted is
        stale."""
        job_id = key.rsplit("@", 1)[0]
        if kind == FINISH and self.run_end.get(job_id) != self.now:
            return False
        return super()._end(kind, key)

    def _loss_ms(self, job: Job) -> int:
        """A failure hits ``job``'s run: the useful work since its last checkpoint is
        lost (the rest is kept as progress), and so is the overhead it spent since its
        segment began. The run time of the segment that no checkpoint kept."""
        job_id = job.job_id
        self.hits[job_id] += 1
        if job_id not in self.segment:
            return 0  # it was already waiting for a lost rank: nothing ran since
        held_from, kept, _ = self._keep_checkpointed(job_id)
        return self.now - held_from - kept

    # ------------------------------------------------------------- replacement

    def _arrive(self, index: int, spec: JobSpec | None = None) -> None:
        """Under every policy but ``requeue`` each gang of two or more members asks for
        replacement (a one-member job is requeued: it has no member to keep); under the
        elastic ones it is elastic as well."""
        spec = spec or self.workload.jobs[index].spec
        if self.recovery is not Recovery.REQUEUE and spec.replicas > 1:
            timeout = self.recovery_model.replace_timeout_ms
            spec = replace(spec, replace=ReplacePolicy(timeout_ms=timeout))
            if self.elastic:
                spec = elastic_spec(spec, self.recovery_model.elastic_min_share)
        super()._arrive(index, spec)

    def _lost_to_fault(self, job_id: str, token: int, loss_ms: int) -> None:
        """The core either requeued the gang (as without ``replace``), or made its
        members on the failed GPU vacancies and kept it running: then those members
        exit (their worker reports it), the others wait for the lost ranks to be placed
        again, holding their GPUs."""
        job = self.state.jobs[job_id]
        attempt = job.live_attempt()
        if attempt is None or attempt.fencing_token != token or not attempt.vacancies:
            super()._lost_to_fault(job_id, token, loss_ms)
            return
        vacant = [v.rank for v in attempt.vacancies if not v.stopped]
        by_node: dict[str, list[c.MemberEvent]] = {}
        for rank in vacant:
            m = attempt.members[rank]
            event = c.MemberEvent(
                job_id, token, rank, c.MemberEventKind.EXITED, SIGTERM_EXIT, generation=m.generation
            )
            by_node.setdefault(m.node_id, []).append(event)
        for node_id, events in sorted(by_node.items()):
            apply(self.state, c.ReportMembers(node_id, tuple(events), now_ms=self.now))
        self._count_loss(job_id, loss_ms, crashed=False)
        self.run_end.pop(job_id, None)
        self._holding_changed(job)
        self.waiting.add(job_id)
        self._wake_at(self.now + job.spec.replace.timeout_ms if job.spec.replace else self.now)

    def _holding_changed(self, job: Job) -> None:
        """The GPUs the job's members hold changed (a rank lost or placed again, or an
        elastic gang resized)."""
        gpus = self._gpus_of(job)
        held = self.holding.get(job.job_id, (0, 0))[0]
        self.allocated += gpus - held
        self.usage[self.records[job.job_id].queue] += gpus - held
        self._hold(job.job_id, gpus)
        self.free.update(self.state, job)

    def _wants_pass(self) -> bool:
        return bool(self.waiting) or self.resize_due

    def _apply_events(self) -> None:
        super()._apply_events()
        if self.elastic:
            self.resize_due = True  # something happened: the next elastic step may act

    def _schedule_pass(self, pending_count: int) -> None:
        """Before the pass: requeue the gangs whose lost rank waited too long, place
        lost ranks again, then grow or shrink elastic gangs (the leader's order)."""
        if self.waiting:
            self._replacement_timeouts()
            self._replace_lost_ranks()
        if self.resize_due:
            self._resize_step()
        if self.pending:
            super()._schedule_pass(pending_count)

    def _replacement_timeouts(self) -> None:
        for command in due_replacement_timeouts(self.state, self.now):
            if not apply(self.state, command).ok:
                continue
            self.replace_timeouts += 1
            # The gang is requeued whole: its other members are confirmed stopped at once.
            report_all(
                self.state,
                command.job_id,
                command.fencing_token,
                c.MemberEventKind.EXITED,
                self.now,
                SIGTERM_EXIT,
            )
            self._released(command.job_id)

    def _replace_lost_ranks(self) -> None:
        """Apply the leader's replacement plan; a gang whose every lost rank is placed
        again runs at full size: its members restart from its checkpoint."""
        plan = plan_replacements(self.state, self.now)
        if plan is None:
            return
        spares = spare_nodes(self.state)
        before = {r.job_id: r.member.rank for r in plan.replacements}
        apply(self.state, plan)
        for r in plan.replacements:
            job = self.state.jobs[r.job_id]
            attempt = job.attempt
            assert attempt is not None
            if attempt.members[r.member.rank] != r.member:
                continue  # refused at apply
            self.replaced += 1
            self.replaced_on_spares += r.member.node_id in spares
            event = c.MemberEvent(
                r.job_id,
                r.fencing_token,
                r.member.rank,
                c.MemberEventKind.STARTED,
                generation=r.member.generation,
            )
            apply(self.state, c.ReportMembers(r.member.node_id, (event,), now_ms=self.now))
        for job_id in sorted(before):
            job = self.state.jobs[job_id]
            self._holding_changed(job)
            attempt = job.attempt
            if attempt is not None and not attempt.vacancies:
                self._restart(job_id)

    def _restart(self, job_id: str) -> None:
        """Every lost rank of the gang is placed again: it runs at its size from now."""
        self.waiting.discard(job_id)
        self.restart_delays_s.append((self.now - self.killed_at.pop(job_id)) / 1000)
        self._begin_segment(job_id)

    def _begin_segment(self, job_id: str) -> None:
        """The gang's members restart now at its current size (a lost rank placed
        again, or a resize): useful work from its checkpoint the restart overhead later."""
        overhead = self.recovery_model.restart_overhead_ms
        job = self.state.jobs[job_id]
        self.segment[job_id] = (self.now, self.now + overhead, self._gpus_of(job))
        run = overhead + self._work_ms(job_id)
        self.run_end[job_id] = self.now + run
        assert job.attempt is not None
        self._push(self.now + run, FINISH, f"{job_id}@{job.attempt.fencing_token}")

    # ------------------------------------------------------------- elastic gangs

    def _resize_soon(self) -> None:
        """Run the leader's elastic step at the next whole second."""
        self.resize_due = True
        self._wake_at(self.now - self.now % ELASTIC_PERIOD_MS + ELASTIC_PERIOD_MS)

    def _resize_step(self) -> None:
        """On a whole second, the leader's elastic step (or wait for the next one): each
        gang it resizes restarts from its checkpoint at its new size."""
        if self.now % ELASTIC_PERIOD_MS:
            self._wake_at(self.now - self.now % ELASTIC_PERIOD_MS + ELASTIC_PERIOD_MS)
            return
        self.resize_due = False
        resizes = resize_gangs(self.state, self.now)
        for resize in resizes:
            self._resized(resize)
        if resizes:
            self._resize_soon()

    def _shrink(self, shrink: c.ShrinkMembers) -> None:
        """A shrink a preemption of the plan takes: as one of the elastic loop's."""
        resize = apply_shrink(self.state, shrink, self.now)
        if resize is not None:
            self._resized(resize)

    def _resized(self, resize: Resize) -> None:
        """An elastic gang's membership changed: the work since its checkpoint is lost
        and every member restarts, as after a failure."""
        job_id = resize.job_id
        self.resizes.append(resize)
        if job_id in self.segment:
            lost = self._keep_checkpointed(job_id)[2]
            self.lost.resizing += lost
        self._holding_changed(self.state.jobs[job_id])
        self._begin_segment(job_id)
        self.resized.add(job_id)

    def _advance(self, now: int, pending_count: int) -> None:
        self.spare_gpu_ms += self.spare_gpus * (now - self.last_t)
        super()._advance(now, pending_count)

    def _observe(self, pending_count: int) -> None:
        super()._observe(pending_count)
        if self.state.config.spares:
            nodes = self.state.nodes
            self.spare_gpus = sum(nodes[n].info.capacity.gpu for n in spare_nodes(self.state))

    def _extra_metrics(self, metrics: dict[str, Any]) -> None:
        super()._extra_metrics(metrics)
        metrics["recovery"] = recovery_figures(self)


def outcome(run: RecoveryRun) -> Outcome:
    """The outcome of a finished run: a job's useful run time is its duration when it
    succeeded, nothing otherwise."""
    out = Outcome(str(run.recovery), runs=1)
    for job_id, rec in run.records.items():
        if rec.start_ms is None or rec.end_ms is None:
            continue
        succeeded = run.final_states.get(job_id) is JobState.SUCCEEDED
        useful = rec.duration_ms if succeeded else 0
        out.waits_s.append((rec.start_ms - rec.arrival_ms) / 1000)
        out.jobs.append((rec.gpus, run.hits[job_id] > 0, useful, rec.end_ms - rec.start_ms))
    out.delays_s = list(run.restart_delays_s)
    out.lost = replace(run.lost)
    out.lost.abandoned = sum(run.progress.get(j, 0) * run.records[j].gpus for j in run.failed_jobs)
    out.failures = run.faults.failures
    out.held_gpu_ms = sum(run.held_gpu_ms.values())
    out.jobs_failed = len(run.failed_jobs)
    out.replaced = run.replaced
    out.replaced_on_spares = run.replaced_on_spares
    out.replace_timeouts = run.replace_timeouts
    out.spare_gpu_ms = run.spare_gpu_ms
    out.grown = sum(1 for r in run.resizes if r.after > r.before)
    out.shrunk = len(run.resizes) - out.grown
    out.members_added = sum(max(0, r.after - r.before) for r in run.resizes)
    out.members_given_back = sum(max(0, r.before - r.after) for r in run.resizes)
    out.started_small = run.started_small
    return out


def recovery_figures(run: RecoveryRun) -> dict[str, Any]:
    """The failure policy's figures of a finished run (:func:`figures`)."""
    return figures(outcome(run))


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
    config = config or ClusterConfig(retention_ms=0)
    if recovery in SPARE_POLICIES:
        config = replace(
            config, spares=recovery_model.spares, spare_level=recovery_model.spare_level
        )
    state = build_cluster(workload, config)
    pacing = Pacing(grace_ms, pass_interval_ms)
    return RecoveryRun(workload, state, model, recovery, recovery_model, pacing, scripted)
