"""GPU failures in the simulator: a seeded Poisson process per GPU, and two ways of
living with it, side by side on the same failures.

The rate. Meta's Llama 3 405B pre-training report (Dubey et al., 2024, table 5) counts
419 unexpected interruptions in 54 days on 16,384 H100 GPUs; 148 were a faulty GPU and
72 faulty HBM3 memory, the GPU's own failures. 220 / (16,384 GPUs x 54 days) = 0.249
per 1,000 GPU-days (:data:`LLAMA3_GPU_FAILURES_PER_1000_GPU_DAYS`); all 419 together
would be 0.47. Each GPU fails at that rate independently, so the cluster sees failures
as one Poisson process of rate (GPUs x rate), each on a GPU drawn uniformly, from a
``random.Random`` seeded with :attr:`FailureModel.seed`: the same seed gives the same
failures, at the same times, on the same GPUs, under both policies. A failure drawn
on a GPU that is already failed changes nothing (it cannot fail twice). The process
stops once nothing runs or is left to arrive; failures already drawn still run their
course (notice, repair).

The policies (:class:`FaultPolicy`), both running the real core planner and ``apply``:

* ``health-aware`` (the core as built): a failure becomes ``ReportGpuHealth`` at the
  instant it happens (the worker names it in its next heartbeat, a second later, which
  the simulation does not distinguish). The core excludes the GPU from placement and
  requeues the gang holding it as a disruption (``requeues``, not ``retries``). The
  GPU comes back with ``RepairGpus`` :attr:`FailureModel.repair_ms` after it failed.
* ``health-blind`` (the baseline): the state never learns of the failure. The gang
  holding the GPU fails: its member on that GPU exits 1, which the core counts as the
  job's failure (a retry after a back-off, or the job fails when its retries are
  used). The planner keeps placing on the GPU: a gang placed there runs
  :attr:`FailureModel.crash_after_ms` and fails the same way. An operator notices
  :attr:`FailureModel.operator_delay_ms` after the failure and cordons the node
  (``SetNodeStatus``; gangs on its other GPUs keep running), repairs the GPU
  :attr:`FailureModel.repair_ms` later and uncordons the node once none of its noticed
  GPUs is still failed.

Members of a gang ended by a failure are confirmed stopped at the same instant under
both policies. With :attr:`FailureModel.checkpoint_ms`, a gang keeps the work done up to
its last checkpoint (a multiple of that interval of run time since its start) and runs
only the rest when placed again; without it, it starts over.

Figures (``metrics["gpu_faults"]``): see :func:`fault_figures`.
"""

from __future__ import annotations

import enum
import math
import random
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

from synapse_ha.core import commands as c
from synapse_ha.core.cluster_config import ClusterConfig
from synapse_ha.core.health.fitness import GpuFault
from synapse_ha.core.machine import apply
from synapse_ha.core.model import ClusterState, Job, JobState, NodeStatus
from synapse_ha.sim.engine import (
    GRACE_MS,
    LAST_KIND,
    Pacing,
    Result,
    Run,
    build_cluster,
)
from synapse_ha.sim.fairness import summary
from synapse_ha.sim.members import report_all
from synapse_ha.sim.policies import Ours, Policy
from synapse_ha.sim.workload import Workload

LLAMA3_GPU_FAILURES_PER_1000_GPU_DAYS = round(1000 * (148 + 72) / (16_384 * 54), 4)
MS_PER_DAY = 86_400_000
MS_PER_HOUR = 3_600_000
FAULT, NOTICE, REPAIR, CRASH = LAST_KIND + 1, LAST_KIND + 2, LAST_KIND + 3, LAST_KIND + 4
FAULT_CODE = "xid-79"  # how the simulated failure is named in the state (GPU fell off the bus)
EXIT_ON_FAULT = 1  # the exit code of a member whose GPU failed under it
SIGTERM_EXIT = 143
MAX_RATE = 1_000_000.0  # per 1,000 GPU-days: beyond this a GPU fails every 0.1 s


class FaultPolicy(enum.StrEnum):
    HEALTH_AWARE = "health-aware"
    HEALTH_BLIND = "health-blind"


@dataclass(frozen=True, slots=True)
class FailureModel:
    """How GPUs fail and come back. Times in ms of simulated time."""

    per_1000_gpu_days: float = LLAMA3_GPU_FAILURES_PER_1000_GPU_DAYS
    repair_ms: int = 24 * MS_PER_HOUR
    operator_delay_ms: int = MS_PER_HOUR  # health-blind: failure until the node is cordoned
    crash_after_ms: int = 300_000  # health-blind: a gang placed on a failed GPU runs this long
    checkpoint_ms: int = 0  # 0: no checkpoints, a gang ended by a failure starts over
    seed: int = 1

    def check(self) -> None:
        """Raise ValueError naming the first field out of its range."""
        rate = self.per_1000_gpu_days
        if not (math.isfinite(rate) and 0 <= rate <= MAX_RATE):
            raise ValueError(f"per_1000_gpu_days: a number between 0 and {MAX_RATE:g}, got {rate}")
        for name, value, least in (
            ("repair_ms", self.repair_ms, 1),
            ("operator_delay_ms", self.operator_delay_ms, 0),
            ("crash_after_ms", self.crash_after_ms, 0),
            ("checkpoint_ms", self.checkpoint_ms, 0),
        ):
            if not least <= value <= 366 * MS_PER_DAY:
                raise ValueError(f"{name}: between {least} and {366 * MS_PER_DAY} ms, got {value}")

    def describe(self) -> dict[str, Any]:
        """The model as JSON-ready data, with the rate's multiple of the Llama 3 rate."""
        return {
            "gpu_failures_per_1000_gpu_days": self.per_1000_gpu_days,
            "times_llama3_rate": round(
                self.per_1000_gpu_days / LLAMA3_GPU_FAILURES_PER_1000_GPU_DAYS, 3
            ),
            "repair_hours": self.repair_ms / MS_PER_HOUR,
            "operator_delay_hours": self.operator_delay_ms / MS_PER_HOUR,
            "crash_after_s": self.crash_after_ms / 1000,
            "checkpoint_minutes": self.checkpoint_ms / 60_000,
            "seed": self.seed,
        }


@dataclass(slots=True)
class FaultTally:
    """What the failures did in one run."""

    failures: int = 0
    failures_on_failed_gpus: int = 0  # drawn on a GPU already failed: no effect
    gangs_killed: int = 0  # running on a GPU when it failed
    placements_on_failed: int = 0  # gangs bound with a member on a failed GPU
    gangs_crashed: int = 0  # of those, ended by the failed GPU
    lost_killed_gpu_ms: int = 0
    lost_crashed_gpu_ms: int = 0
    down_gpu_ms: float = 0.0  # failed GPUs, and the other GPUs of cordoned nodes, x ms
    cordons: int = 0


Gpu = tuple[str, int]


class FaultRun(Run):
    """A :class:`~synapse_ha.sim.engine.Run` with GPUs failing under ``fault_policy``.

    Events it adds: FAULT (key: the GPU's index, drawn with the time), NOTICE and
    REPAIR (key ``node_id:gpu``), CRASH (key ``job_id@fencing_token``, a gang on a
    failed GPU failing).

    ``scripted``: failures at given times on given GPUs, ``(at_ms, node_id, gpu)``,
    instead of the Poisson process (a GPU the cluster does not have raises ValueError).
    ``failure_log`` records every failure that took effect, ``(at_ms, node_id, gpu)``,
    and ``onto_failed_at`` the times gangs were bound onto a failed GPU."""

    def __init__(
        self,
        workload: Workload,
        policy: Policy,
        state: ClusterState,
        model: FailureModel,
        fault_policy: FaultPolicy,
        pacing: Pacing | None = None,
        scripted: tuple[tuple[int, str, int], ...] | None = None,
    ) -> None:
        super().__init__(workload, policy, state, pacing or Pacing())
        self.model = model
        self.fault_policy = fault_policy
        self.aware = fault_policy is FaultPolicy.HEALTH_AWARE
        self.rng = random.Random(f"gpu-failures:{model.seed}")
        self.all_gpus: list[Gpu] = [
            (n.node_id, g) for n in workload.nodes for g in range(n.capacity.gpu)
        ]
        self.capacity = {n.node_id: n.capacity.gpu for n in workload.nodes}
        self.rate_per_ms = model.per_1000_gpu_days / 1000 / MS_PER_DAY * len(self.all_gpus)
        self.failed: dict[Gpu, int] = {}  # failed GPU -> when it failed
        self.noticed: Counter[str] = Counter()  # node -> noticed GPUs not yet repaired
        self.cordoned: set[str] = set()  # nodes the operator cordoned
        self.fault_events = 0  # FAULT, NOTICE and REPAIR events in the queue
        self.recoveries = 0  # NOTICE and REPAIR events in the queue
        self.down_gpus = 0
        self.progress: dict[str, int] = {}  # job -> run time kept by checkpoints
        self.killed_at: dict[str, int] = {}  # job ended by a failure -> when
        self.restart_delays_s: list[float] = []
        self.failed_jobs: set[str] = set()  # jobs a failure ended for good
        self.final_states: dict[str, JobState] = {}  # job -> how it ended
        self.faults = FaultTally()
        self.failure_log: list[tuple[int, str, int]] = []
        self.onto_failed_at: list[int] = []
        self.scripted = scripted is not None
        if scripted is not None:
            index_of = {gpu: i for i, gpu in enumerate(self.all_gpus)}
            for at_ms, node_id, gpu in scripted:
                if (node_id, gpu) not in index_of:
                    raise ValueError(f"scripted failure: no GPU {gpu} on a node {node_id!r}")
                self._push(at_ms, FAULT, str(index_of[node_id, gpu]))
        elif self.rate_per_ms > 0 and self.all_gpus:
            self._draw_next_failure()

    # ----------------------------------------------------------------- the event loop

    def _push(self, at_ms: int, kind: int, key: str) -> None:
        if kind in (FAULT, NOTICE, REPAIR):
            self.fault_events += 1
            self.recoveries += kind != FAULT
        super()._push(at_ms, kind, key)

    def _more_to_do(self) -> bool:
        """Go on while anything runs or is to arrive, or while gangs wait and a GPU is
        still to come back."""
        work_left = len(self.events) > self.fault_events
        return work_left or (bool(self.pending) and self.recoveries > 0)

    def _advance(self, now: int, pending_count: int) -> None:
        self.faults.down_gpu_ms += self.down_gpus * (now - self.last_t)
        super()._advance(now, pending_count)

    def _other_event(self, kind: int, key: str) -> bool:
        if kind == CRASH:
            return self._crash(key)
        self.fault_events -= 1
        self.recoveries -= kind != FAULT
        if kind == FAULT:
            self._fail(self.all_gpus[int(key)])
            if not self.scripted and len(self.events) > self.fault_events:
                self._draw_next_failure()
        elif kind == NOTICE:
            self._notice(_gpu(key))
        elif kind == REPAIR:
            self._repair(_gpu(key))
        else:
            raise ValueError(f"unknown simulation event kind {kind}")
        self._count_down_gpus()
        return True

    def _draw_next_failure(self) -> None:
        """The next failure of the cluster's Poisson process: a time, then a GPU."""
        gap = self.rng.expovariate(self.rate_per_ms)
        index = self.rng.randrange(len(self.all_gpus))
        self._push(self.now + max(int(gap), 1), FAULT, str(index))

    # ---------------------------------------------------------------- failure and repair

    def _fail(self, gpu: Gpu) -> None:
        """``gpu`` fails now: the gang on it ends; the health-aware core learns of it."""
        if gpu in self.failed:
            self.faults.failures_on_failed_gpus += 1
            return
        self.faults.failures += 1
        self.failed[gpu] = self.now
        node_id, index = gpu
        self.failure_log.append((self.now, node_id, index))
        holders = _holders(self.state, gpu)
        if not self.aware:
            for job in holders:
                self._end_by_fault(job, crashed=False)
            self._push(self.now + self.model.operator_delay_ms, NOTICE, f"{node_id}:{index}")
            return
        report = c.ReportGpuHealth(
            node_id, (GpuFault(index, FAULT_CODE, "simulated GPU failure"),), 0, self.now
        )
        tokens = {j.job_id: j.attempt.fencing_token for j in holders if j.attempt is not None}
        losses = {j.job_id: self._loss_ms(j) for j in holders}
        result = apply(self.state, report)
        if not result.ok:
            raise ValueError(f"ReportGpuHealth refused: {result.message}")
        for job_id, token in sorted(tokens.items()):
            self._lost_to_fault(job_id, token, losses[job_id])
        self._push(self.now + self.model.repair_ms, REPAIR, f"{node_id}:{index}")

    def _lost_to_fault(self, job_id: str, token: int, loss_ms: int) -> None:
        """Health-aware: the core ended the attempt ``token`` of the gang that held the
        failed GPU (a requeue); its members are confirmed stopped."""
        report_all(self.state, job_id, token, c.MemberEventKind.EXITED, self.now, SIGTERM_EXIT)
        self._count_loss(job_id, loss_ms, crashed=False)
        self._released(job_id)

    def _notice(self, gpu: Gpu) -> None:
        """Health-blind: the operator sees the failure and cordons its node."""
        node_id, index = gpu
        self.noticed[node_id] += 1
        node = self.state.nodes[node_id]
        if node_id not in self.cordoned and node.status is NodeStatus.READY:
            why = f"GPU {index} failed (operator)"
            cordon = c.SetNodeStatus(node_id, NodeStatus.CORDONED, why, self.now, "operator")
            if apply(self.state, cordon).ok:
                self.cordoned.add(node_id)
                self.faults.cordons += 1
        self._push(self.now + self.model.repair_ms, REPAIR, f"{node_id}:{index}")

    def _repair(self, gpu: Gpu) -> None:
        """The GPU is fit again: health-aware, ``RepairGpus``; health-blind, the node is
        uncordoned once none of its noticed GPUs is still failed."""
        node_id, index = gpu
        del self.failed[gpu]
        if self.aware:
            repaired = apply(self.state, c.RepairGpus(node_id, (index,), self.now, "operator"))
            if not repaired.ok:
                raise ValueError(f"RepairGpus refused: {repaired.message}")
            return
        self.noticed[node_id] -= 1
        if self.noticed[node_id] == 0 and node_id in self.cordoned:
            ready = c.SetNodeStatus(node_id, NodeStatus.READY, "repaired", self.now, "operator")
            apply(self.state, ready)
            self.cordoned.discard(node_id)

    def _count_down_gpus(self) -> None:
        """GPUs out of service: the failed ones and every GPU of a cordoned node."""
        down = sum(self.capacity[n] for n in self.cordoned)
        down += sum(1 for node_id, _ in self.failed if node_id not in self.cordoned)
        self.down_gpus = down

    # ------------------------------------------------------------------ gangs it ends

    def _after_start(self, job_id: str) -> None:
        """Count a gang bound onto a failed GPU; health-blind, it fails a while later."""
        job = self.state.jobs[job_id]
        attempt = job.attempt
        assert attempt is not None
        if job_id in self.killed_at:
            self.restart_delays_s.append((self.now - self.killed_at.pop(job_id)) / 1000)
        if not any((m.node_id, g) in self.failed for m in attempt.members for g in m.gpus):
            return
        self.faults.placements_on_failed += 1
        self.onto_failed_at.append(self.now)
        if not self.aware:
            self._push(
                self.now + self.model.crash_after_ms, CRASH, f"{job_id}@{attempt.fencing_token}"
            )

    def _crash(self, key: str) -> bool:
        """Health-blind: the gang placed on a failed GPU fails, if that attempt still runs."""
        job_id, token_text = key.rsplit("@", 1)
        job = self.state.jobs.get(job_id)
        if job is None or job.attempt is None or job.live_attempt() is None:
            return False
        if job.attempt.fencing_token != int(token_text) or job.attempt.preempted_by:
            return False
        self._end_by_fault(job, crashed=True)
        return True

    def _end_by_fault(self, job: Job, crashed: bool) -> None:
        """Health-blind: the member on a failed GPU exits 1 (the job's failure, as the
        core sees it); the others are confirmed stopped."""
        attempt = job.attempt
        assert attempt is not None
        loss = self._loss_ms(job)
        failing = [m for m in attempt.members if any((m.node_id, g) in self.failed for g in m.gpus)]
        first = failing[0] if failing else attempt.members[0]  # repaired since it was bound
        event = c.MemberEvent(
            job.job_id, attempt.fencing_token, first.rank, c.MemberEventKind.EXITED, EXIT_ON_FAULT
        )
        apply(self.state, c.ReportMembers(first.node_id, (event,), now_ms=self.now))
        report_all(
            self.state,
            job.job_id,
            attempt.fencing_token,
            c.MemberEventKind.EXITED,
            self.now,
            SIGTERM_EXIT,
        )
        self._count_loss(job.job_id, loss, crashed)
        self._released(job.job_id)

    def _loss_ms(self, job: Job) -> int:
        """Run time of the live attempt since its start that no checkpoint kept; the
        kept part is added to the job's progress."""
        attempt = job.attempt
        assert attempt is not None
        started = (
            attempt.started_at_ms if attempt.started_at_ms is not None else attempt.bound_at_ms
        )
        ran = self.now - started
        every = self.model.checkpoint_ms
        kept = ran - ran % every if every else 0
        self.progress[job.job_id] = self.progress.get(job.job_id, 0) + kept
        return ran - kept

    def _count_loss(self, job_id: str, lost_ms: int, crashed: bool) -> None:
        gpu_ms = lost_ms * self.records[job_id].gpus
        faults = self.faults
        if crashed:
            faults.gangs_crashed += 1
            faults.lost_crashed_gpu_ms += gpu_ms
        else:
            faults.gangs_killed += 1
            faults.lost_killed_gpu_ms += gpu_ms
        if self.state.jobs[job_id].state.finished:
            self.failed_jobs.add(job_id)
            self.killed_at.pop(job_id, None)
        else:
            self.killed_at.setdefault(job_id, self.now)

    def _released(self, job_id: str) -> None:
        super()._released(job_id)
        job = self.state.jobs[job_id]
        if job.state.finished:
            self.final_states[job_id] = job.state

    def _marks_every(self, job_id: str) -> int:
        """Never: the model's checkpoint period keeps a gang's work here, in place of the
        jobs' own checkpoint intervals."""
        return 0

    def _run_ms(self, job_id: str) -> int:
        whole = super()._run_ms(job_id)
        return max(whole - self.progress.get(job_id, 0), 1)

    def _extra_metrics(self, metrics: dict[str, Any]) -> None:
        metrics["gpu_faults"] = fault_figures(self)


def fault_figures(run: FaultRun) -> dict[str, Any]:
    """The failure figures of a finished run.

    * ``gpu_hours_lost_to_faults``: GPUs x run time since their last start (less what
      a checkpoint kept) of the gangs a failure ended: those running on the GPU when it
      failed (``..._killed``) and, health-blind, those placed on it afterwards
      (``..._on_failed_gpus``).
    * ``jobs_failed_by_faults``: jobs a failure ended for good (health-blind: retries
      used up; health-aware: ``max_requeues`` reached);
      ``gpu_hours_checkpointed_in_jobs_failed_by_faults``: the work their checkpoints had
      kept, thrown away with them (not in the hours lost).
    * ``placements_onto_failed_gpus``: gangs bound with a member on a failed GPU.
    * ``gpu_hours_out_of_service``: failed GPUs, and all GPUs of cordoned nodes, x time.
    * ``restart_delay_s``: from a failure ending a gang to the gang's next bind.
    * ``goodput_gpu_hours``: GPUs x run time of the jobs that succeeded (the work done).
    """
    f = run.faults
    per_hour = MS_PER_HOUR
    states = Counter(str(s) for s in run.final_states.values())
    goodput_gpu_ms = sum(
        run.records[job_id].gpus * run.workload.jobs[run.index_of[job_id]].duration_ms
        for job_id, s in run.final_states.items()
        if s is JobState.SUCCEEDED
    )
    return {
        "policy": str(run.fault_policy),
        "gpu_failures": f.failures,
        "failures_on_already_failed_gpus": f.failures_on_failed_gpus,
        "gangs_killed_by_failures": f.gangs_killed,
        "placements_onto_failed_gpus": f.placements_on_failed,
        "gangs_failed_on_failed_gpus": f.gangs_crashed,
        "gpu_hours_lost_to_faults": round(
            (f.lost_killed_gpu_ms + f.lost_crashed_gpu_ms) / per_hour, 3
        ),
        "gpu_hours_lost_killed": round(f.lost_killed_gpu_ms / per_hour, 3),
        "gpu_hours_lost_on_failed_gpus": round(f.lost_crashed_gpu_ms / per_hour, 3),
        "gpu_hours_lost_per_failure": round(
            (f.lost_killed_gpu_ms + f.lost_crashed_gpu_ms) / per_hour / max(f.failures, 1), 3
        ),
        "jobs_failed_by_faults": len(run.failed_jobs),
        "gpu_hours_checkpointed_in_jobs_failed_by_faults": round(
            sum(run.progress.get(j, 0) * run.records[j].gpus for j in run.failed_jobs) / per_hour,
            3,
        ),
        "jobs_ended": dict(sorted(states.items())),
        "goodput_gpu_hours": round(goodput_gpu_ms / per_hour, 3),
        "node_cordons": f.cordons,
        "gpu_hours_out_of_service": round(f.down_gpu_ms / per_hour, 3),
        "restart_delay_s": summary(run.restart_delays_s),
    }


def simulate_failures(run: FaultRun) -> Result:
    """Run ``run`` (:func:`fault_run`) to its end: the workload replayed with the real
    core planner (``Ours``) while GPUs fail as its model says, lived with as its fault
    policy says. The result's policy is the fault policy's name; ``metrics["gpu_faults"]``
    holds the failure figures."""
    wall_start = time.perf_counter()
    run.run()
    result = run.result(time.perf_counter() - wall_start)
    result.policy = str(run.fault_policy)
    return result


def fault_run(
    workload: Workload,
    model: FailureModel,
    fault_policy: FaultPolicy,
    config: ClusterConfig | None = None,
    grace_ms: int = GRACE_MS,
    pass_interval_ms: int = 0,
    scripted: tuple[tuple[int, str, int], ...] | None = None,
) -> FaultRun:
    """A run of ``workload`` with the real core planner while GPUs fail as ``model``
    says, lived with as ``fault_policy`` says, not yet run (:func:`simulate_failures` or
    ``run.run()`` runs it), with ``scripted`` failures when given. A model out of range
    raises ValueError naming the field."""
    model.check()
    state = build_cluster(workload, config or ClusterConfig(retention_ms=0))
    return FaultRun(
        workload,
        Ours(),
        state,
        model,
        fault_policy,
        Pacing(grace_ms, pass_interval_ms),
        scripted=scripted,
    )


def _holders(state: ClusterState, gpu: Gpu) -> list[Job]:
    """Live attempts holding ``gpu`` that are not being preempted, by job id (a rank
    lost and waiting to be placed again holds nothing)."""
    node_id, index = gpu
    out = []
    for job in state.jobs.values():
        attempt = job.live_attempt()
        if attempt is None or attempt.preempted_by:
            continue
        vacant = {v.rank for v in attempt.vacancies}
        if any(
            m.node_id == node_id and index in m.gpus and m.rank not in vacant
            for m in attempt.members
        ):
            out.append(job)
    return sorted(out, key=lambda j: j.job_id)


def _gpu(key: str) -> Gpu:
    node_id, index = key.rsplit(":", 1)
    return node_id, int(index)
