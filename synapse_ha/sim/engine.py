"""The simulation loop: arrivals and completions on a simulated clock, each scheduling
pass planned by a policy and bound through the real ``apply``.

A pass runs at every moment something happened (arrivals, ends) while jobs wait, and
at the time a policy asks to plan again (a gang's locality wait ending). The figures
each run reports are defined in :mod:`synapse_ha.sim.metrics`.
"""

from __future__ import annotations

import heapq
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any

from synapse_ha.core import commands as c
from synapse_ha.core.cluster_config import ClusterConfig
from synapse_ha.core.codec.formats import FORMAT
from synapse_ha.core.machine import apply
from synapse_ha.core.machine.apply_dependencies import Outcome, outcome_of
from synapse_ha.core.model import ClusterState, JobSpec, JobState
from synapse_ha.core.queues.cohort_tree import root_of
from synapse_ha.core.workflows.dependencies import Dependencies, DependencyKind
from synapse_ha.sim.capacity import FreeGpus, RackLayout
from synapse_ha.sim.fairness import Loss, TenancyMeter
from synapse_ha.sim.marks import (
    Marking,
    check_save_bounds,
    kept_ms,
    lost_since,
    report_marks,
    save_delay_ms,
)
from synapse_ha.sim.members import SIGTERM_EXIT, report_all, shrink_gang
from synapse_ha.sim.metrics import JobRecord, Tally, queue_delays, run_metrics, tenancy_metrics
from synapse_ha.sim.policies import Policy
from synapse_ha.sim.workload import Workload

ARRIVE, FINISH, EXPIRE, WAKE, STOP, MARK, SAVE = 0, 1, 2, 3, 4, 5, 6
LAST_KIND = SAVE  # the kinds a subclass adds are above this
ATTEMPT_ENDS = frozenset({FINISH, EXPIRE, STOP, SAVE})
GRACE_MS = 30_000  # how long a preempted gang takes to stop (its whole grace period)
MS_PER_HOUR = 3_600_000


@dataclass(frozen=True, slots=True)
class Pacing:
    """How the simulated leader paces its work. ``grace_ms``: how long a preempted gang
    takes to stop. ``pass_interval_ms``: 0 plans at every instant something happened
    (and at the policy's wake time); otherwise passes run only at multiples of it.
    ``purge_every``: finished jobs are purged after every that many applied events."""

    grace_ms: int = GRACE_MS
    pass_interval_ms: int = 0
    purge_every: int = 500


@dataclass(slots=True)
class Result:
    policy: str
    workload: str
    metrics: dict[str, Any]
    series: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    delays_s: list[float] = field(default_factory=list)


def simulate(
    workload: Workload,
    policy: Policy,
    purge_every: int = 500,
    config: ClusterConfig | None = None,
    grace_ms: int = GRACE_MS,
    pass_interval_ms: int = 0,
) -> Result:
    """Replay ``workload`` under ``policy``; every job runs to completion or its limit.

    ``config`` is the simulated cluster's configuration (default: the defaults, with
    finished jobs purged at once); a configuration ``apply`` refuses raises ValueError.
    The workload's cohort records and queues are set through ``apply`` first (one refused
    raises ValueError).

    Preemption: the policy's shrinks (elastic gangs giving back members) are applied
    after its bind, then its ``Preempt`` commands, as the leader proposes them; every
    member of a victim exits (code 143, as after SIGTERM) ``grace_ms`` later, which
    confirms it stopped, unless its own end comes first or it saves on notice
    (``Workload.save_on_notice_ms``: it marks a checkpoint and exits after its save). It
    loses its GPUs x the time from its attempt's checkpoint mark (or its bind) to its
    stop. A job with a checkpoint interval marks through the real state machine while it
    runs (:mod:`synapse_ha.sim.marks`); requeued, it runs again from its resume step, any
    other job its whole duration. A ``save_on_notice_ms`` that is not two ms bounds,
    0 <= low <= high, raises ValueError.

    ``pass_interval_ms``: 0 plans at every instant something happened (and at the
    policy's wake time); otherwise passes run only at multiples of it, as a leader
    planning on a period does.

    Jobs with ``after_ok`` wait for those jobs through the real dependencies
    (:class:`AfterOkRun`); an array job's tasks each run the job's duration.
    """
    check_save_bounds(workload.save_on_notice_ms)
    if not policy.topology_aware:
        workload = workload.without_topology()
    state = build_cluster(workload, config or ClusterConfig(retention_ms=0))
    run_type = AfterOkRun if any(j.after_ok for j in workload.jobs) else Run
    run = run_type(workload, policy, state, Pacing(grace_ms, pass_interval_ms, purge_every))
    wall_start = time.perf_counter()
    run.run()
    return run.result(time.perf_counter() - wall_start)


def build_cluster(workload: Workload, config: ClusterConfig) -> ClusterState:
    """A cluster configured with ``config``, the workload's queues and its nodes, all
    through ``apply``; anything it refuses raises ValueError."""
    state = ClusterState()
    apply(state, c.RaiseFormat(FORMAT))  # every replica of a simulated cluster is this release
    steps: list[tuple[c.Command, str]] = [(c.Configure(config), "cluster configuration")]
    steps += [(c.SetCohort(cohort, 0), f"cohort {cohort.name}") for cohort in workload.cohorts]
    steps += [(c.SetQueue(queue, 0, "sim"), f"queue {queue.name}") for queue in workload.queues]
    steps += [(c.RegisterNode(info, 0), f"node {info.node_id}") for info in workload.nodes]
    for command, what in steps:
        result = apply(state, command)
        if not result.ok:
            raise ValueError(f"{what}: {result.message}")
    return state


class Run:
    """One simulation in progress: the cluster, the clock, the event queue, the jobs
    waiting and holding GPUs, and the running sums the figures are made of.

    Events are ``(time, sequence, kind, key)``: an arrival's key is the job's index in
    the workload, an end's (FINISH, EXPIRE, STOP, SAVE: a victim's save done) and a mark's
    (MARK) is ``job_id@fencing_token`` so one of an attempt that no longer holds resources
    is ignored, a WAKE's is empty. A mark alone is no reason to plan.

    A subclass adds kinds of its own (above LAST_KIND) through :meth:`_other_event`, and
    may extend :meth:`_more_to_do`, :meth:`_wants_pass`, :meth:`_run_ms`,
    :meth:`_after_start`, :meth:`_marks_every` and :meth:`_extra_metrics`; as defined here
    they change nothing.
    """

    def __init__(
        self, workload: Workload, policy: Policy, state: ClusterState, pacing: Pacing
    ) -> None:
        self.workload = workload
        self.policy = policy
        self.state = state
        self.pacing = pacing
        self.total_gpus = workload.total_gpus
        self.layout = RackLayout(workload.nodes)
        self.events: list[tuple[int, int, int, str]] = []
        for i, job in enumerate(workload.jobs):
            heapq.heappush(self.events, (job.arrival_ms, i, ARRIVE, str(i)))
        self.seq = len(workload.jobs)
        self.wakes: set[int] = set()  # times of WAKE events in the queue
        self.now = 0
        self.last_t = 0
        self.applied = 0  # events applied (ends of stale attempts not counted)
        self.records: dict[str, JobRecord] = {}
        self.index_of: dict[str, int] = {}  # job id (an array's: each task's) -> index
        self.job_id_of: dict[int, str] = {}  # index -> the job or array id it was given
        self.tasks_of: dict[str, tuple[str, ...]] = {}  # that id -> the jobs it made
        self.pending: dict[str, int] = {}  # pending job id -> GPUs per member
        self.allocated = 0  # GPUs bound to live attempts
        self.free = FreeGpus(state)
        self.usage: Counter[str] = Counter()  # queue -> GPUs its live attempts hold
        self.nominal = {q.name: q.gpu for q in workload.queues if q.gpu}
        # Each queue's tree (its root cohort; its own cohort without records): the
        # queues a reclaim may take from.
        records = {r.name: r for r in workload.cohorts}
        self.cohort = {q.name: root_of(q.cohort, records) for q in workload.queues}
        self.meter = TenancyMeter(workload.queues) if workload.queues else None
        self.tally = Tally()
        self.series_alloc: list[tuple[float, float]] = []
        self.series_queue: list[tuple[float, float]] = []
        self.marking: dict[str, Marking] = {}  # job -> its live attempt's marks
        self.noticed: dict[str, int] = {}  # job@token saving on notice -> the notice's time
        self.given_back: Counter[str] = Counter()  # job -> GPUs its live attempt shrank by

    def run(self) -> None:
        """Every instant with events, in time order: account for the time since the
        last one, apply its events, plan (or wait for the next pass), observe."""
        events = self.events
        while events and self._more_to_do():
            now, _, kind, key = events[0]
            if kind == MARK:  # a mark changes nothing to account for, plan or observe
                heapq.heappop(events)
                self.now = now
                self._mark(key)
                continue
            pending_count = len(self.pending)
            self._advance(now, pending_count)
            self._apply_events()
            if self.pending or self._wants_pass():
                self._pass_or_wait(pending_count)
            if self.applied % self.pacing.purge_every == 0:
                apply(self.state, c.PurgeFinished(now))
            self._observe(pending_count)

    def _advance(self, now: int, pending_count: int) -> None:
        """Move the clock to ``now``, adding the time since the last instant to the
        areas under allocation, queue length and fragmentation."""
        dt = now - self.last_t
        tally = self.tally
        tally.alloc_area += self.allocated * dt
        tally.queue_area += pending_count * dt
        tally.frag_area += self.free.unusable(self.pending.values()) * dt if pending_count else 0.0
        self.last_t = now
        self.now = now

    def _push(self, at_ms: int, kind: int, key: str) -> None:
        self.seq += 1
        heapq.heappush(self.events, (at_ms, self.seq, kind, key))

    def _wake_at(self, at_ms: int) -> None:
        """Plan again at ``at_ms`` (once, however often it is asked)."""
        if at_ms not in self.wakes:
            self.wakes.add(at_ms)
            self._push(at_ms, WAKE, "")

    def _apply_events(self) -> None:
        """Apply every event of the current instant."""
        events, now = self.events, self.now
        while events and events[0][0] == now:
            _, _, kind, key = heapq.heappop(events)
            if kind == MARK:
                self._mark(key)
                continue
            if kind == WAKE:
                self.wakes.discard(now)
            elif kind == ARRIVE:
                self._arrive(int(key))
            elif kind in ATTEMPT_ENDS:
                if not self._end(kind, key):
                    continue
            elif not self._other_event(kind, key):
                continue
            self.applied += 1

    def _more_to_do(self) -> bool:
        """Whether the events left still matter (here: always, while there are any)."""
        return True

    def _wants_pass(self) -> bool:
        """Whether to plan although no job waits (here: never)."""
        return False

    def _other_event(self, kind: int, key: str) -> bool:
        """Apply an event of a kind a subclass added; False when it changed nothing."""
        raise ValueError(f"unknown simulation event kind {kind}")

    def _arrive(self, index: int, spec: JobSpec | None = None) -> None:
        """Submit the workload's job ``index`` (as ``spec``, when given); it waits. An
        array's tasks are jobs of their own here, each running the job's duration."""
        job = self.workload.jobs[index]
        spec = spec or job.spec
        res = apply(self.state, c.SubmitJob(spec, f"sim-{index}", self.now, owner=job.user))
        if not res.ok:
            raise ValueError(f"job {spec.name}: {res.message}")
        self.job_id_of[index] = res.job_id
        array = self.state.arrays.get(res.job_id) if spec.array else None
        job_ids = array.task_ids() if array is not None else [res.job_id]
        self.tasks_of[res.job_id] = tuple(job_ids)
        gpus = spec.resources.gpu * spec.replicas
        for job_id in job_ids:
            self.records[job_id] = JobRecord(
                arrival_ms=self.now,
                gpus=gpus,
                members=spec.replicas,
                duration_ms=job.duration_ms,
                fits_one_rack=gpus <= self.layout.largest_rack,
                queue=spec.queue,
                topology=bool(spec.topology_required or spec.topology_preferred),
            )
            self.index_of[job_id] = index
            self.pending[job_id] = spec.resources.gpu

    def _end(self, kind: int, key: str) -> bool:
        """An attempt's end: it finished, hit its time limit, or its members stopped
        after preemption. False when the attempt named no longer holds resources."""
        job_id, token_text = key.rsplit("@", 1)
        token = int(token_text)
        record = self.state.jobs.get(job_id)
        if record is None or record.fencing_token != token or not record.state.holds_resources:
            return False
        if kind == EXPIRE:
            apply(self.state, c.ExpireTimeLimit(job_id, token, self.now))
        elif kind in (STOP, SAVE):
            attempt = record.attempt
            assert attempt is not None
            # A victim that saved loses its save: its step is the notice's.
            since = self._saved(key, token) if kind == SAVE else lost_since(attempt)
            if since is None:
                return False
            gpus = self.records[job_id].gpus
            ran = self.now - attempt.bound_at_ms
            self.tally.losses.append(Loss(gpus, self.now - since, ran))
            report_all(self.state, job_id, token, c.MemberEventKind.EXITED, self.now, SIGTERM_EXIT)
        else:
            report_all(self.state, job_id, token, c.MemberEventKind.EXITED, self.now)
        if not self.state.jobs[job_id].state.holds_resources:
            self._released(job_id)
        return True

    def _released(self, job_id: str) -> None:
        """The job's attempt stopped holding resources: free them; a requeued job waits
        again, any other has ended."""
        rec = self.records[job_id]
        held = rec.gpus - self.given_back.pop(job_id, 0)
        self.allocated -= held
        self.usage[rec.queue] -= held
        self.marking.pop(job_id, None)
        job = self.state.jobs[job_id]
        self.free.update(self.state, job)
        if job.state is JobState.PENDING:
            self.pending[job_id] = job.spec.resources.gpu
            if job.retry_not_before_ms > self.now:  # a retry after its back-off
                self._wake_at(job.retry_not_before_ms)
        else:
            rec.end_ms = self.now

    def _pass_or_wait(self, pending_count: int) -> None:
        """Plan now, or, off the pass period, at its next multiple."""
        interval, now = self.pacing.pass_interval_ms, self.now
        if interval > 0 and now % interval != 0:
            self._wake_at(now - now % interval + interval)
        else:
            self._schedule_pass(pending_count)

    def _schedule_pass(self, pending_count: int) -> None:
        """One pass of the policy: bind its placements, then apply its shrinks and then
        its preemptions (as the leader proposes them), then ask for the wake time it
        wants."""
        tally = self.tally
        t0 = time.process_time()
        command = self.policy.plan(self.state, self.now)
        tally.cpu_in_policy += time.process_time() - t0
        tally.passes += 1
        tally.decisions += pending_count
        if command is not None:
            for job_id in self._bind(command):
                self._started(job_id)
        for shrink in self.policy.shrinks:
            self._shrink(shrink)
        for preempt in self.policy.preempts:
            self._preempt(preempt)
        wake = self.policy.wake_ms
        if wake is not None and wake > self.now:
            self._wake_at(wake)

    def _bind(self, command: c.BindPlan) -> list[str]:
        """Bind the plan one placement at a time (as ``apply`` does within one plan), so
        the room each gang had is judged on the cluster it was bound into; then record
        the plan's reasons. The ids of the jobs bound, in order."""
        bound = []
        for placement in command.placements:
            rec = self.records[placement.job_id]
            had_room = (
                rec.members > 1
                and rec.fits_one_rack
                and self.layout.some_rack_has_room(self.state, placement.job_id)
            )
            one = c.BindPlan((placement,), (), command.now_ms)
            if apply(self.state, one).bound:
                rec.rack_had_room = had_room
                bound.append(placement.job_id)
        if command.reasons:
            apply(self.state, c.BindPlan((), command.reasons, command.now_ms))
        return bound

    def _started(self, job_id: str) -> None:
        """A job just bound: record where and when, report its members started, and
        schedule the end of its run (or of its time limit, if that comes first)."""
        now, state, layout = self.now, self.state, self.layout
        del self.pending[job_id]
        job = state.jobs[job_id]
        self.free.update(state, job)
        rec = self.records[job_id]
        if rec.start_ms is None:
            rec.start_ms = now
        rec.starts += 1
        if rec.preempting_since_ms is not None and rec.preemptor_wait_ms is None:
            rec.preemptor_wait_ms = now - rec.preempting_since_ms
        self.allocated += rec.gpus
        self.usage[rec.queue] += rec.gpus
        attempt = job.attempt
        assert attempt is not None
        nodes = {m.node_id for m in attempt.members}
        rec.hosts = len(nodes)
        rec.racks = len({layout.rack_of[n] for n in nodes})
        rec.blocks = len({layout.block_of[n] for n in nodes})
        report_all(state, job_id, attempt.fencing_token, c.MemberEventKind.STARTED, now)
        spec = state.jobs[job_id].spec
        run = self._run_ms(job_id)
        tag = f"{job_id}@{attempt.fencing_token}"
        if spec.time_limit_ms and spec.time_limit_ms < run:
            self._push(now + spec.time_limit_ms, EXPIRE, tag)
        else:
            self._push(now + run, FINISH, tag)
        every = self._marks_every(job_id)
        if every:
            ends = now + min(run, spec.time_limit_ms or run)
            marking = Marking(attempt.fencing_token, every, now, kept_ms(job), ends)
            self.marking[job_id] = marking
            self._next_mark(job_id, marking)
        self._after_start(job_id)

    def _run_ms(self, job_id: str) -> int:
        """How long the attempt just started runs to its end: the job's duration, less
        the run time its resume step kept when it marks checkpoints."""
        duration = self.workload.jobs[self.index_of[job_id]].duration_ms
        if not self._marks_every(job_id):
            return duration
        return max(duration - kept_ms(self.state.jobs[job_id]), 1)

    def _marks_every(self, job_id: str) -> int:
        """How often the job's members mark a checkpoint, ms of run time (0: never)."""
        return self.workload.jobs[self.index_of[job_id]].checkpoint_ms

    def _next_mark(self, job_id: str, marking: Marking) -> None:
        """Queue the attempt's next mark, unless its run ends first."""
        at = marking.next_at()
        if at is not None:
            self._push(at, MARK, f"{job_id}@{marking.token}")

    def _mark(self, key: str) -> None:
        """Every member of the attempt named marks a checkpoint (through the real
        ``ReportMembers``); then its next mark is queued. Nothing when the attempt no
        longer holds resources."""
        job_id, token_text = key.rsplit("@", 1)
        marking = self.marking.get(job_id)
        if marking is None or marking.token != int(token_text):
            return
        seq, step = marking.mark()
        report_marks(self.state, job_id, seq, step, self.now)
        self.tally.marks += 1
        self._next_mark(job_id, marking)

    def _saved(self, key: str, token: int) -> int | None:
        """The victim ``key`` saved after its notice: every member marks the step reached
        at the notice (the real ``ReportMembers``). The notice's time; None: not saving."""
        job_id = key.rsplit("@", 1)[0]
        notice, marking = self.noticed.pop(key, None), self.marking.get(job_id)
        if notice is None or marking is None or marking.token != token:
            return None
        seq, step = marking.mark_at(notice)
        report_marks(self.state, job_id, seq, step, self.now)
        self.tally.marks += 1
        return notice

    def _after_start(self, job_id: str) -> None:
        """A subclass's look at an attempt just started (here: nothing)."""

    def _shrink(self, shrink: c.ShrinkMembers) -> None:
        """Apply one of the policy's shrinks: the ranks it gives back exit at once, their
        GPUs are free, and the next pass may place the gang it was for."""
        gpus = shrink_gang(self.state, shrink, self.now)
        if gpus:
            self._wake_at(self.now + max(self.pacing.pass_interval_ms, 1))
            self.allocated -= gpus
            self.usage[self.records[shrink.job_id].queue] -= gpus
            self.given_back[shrink.job_id] += gpus
            self.free.update(self.state, self.state.jobs[shrink.job_id])

    def _preempt(self, preempt: c.Preempt) -> None:
        """Apply one of the policy's preemptions; each victim's members stop a grace
        later, losing the work since its attempt's mark (counted when they stop)."""
        tally, state, now = self.tally, self.state, self.now
        tally.preempt_commands += 1
        victims = [v for v in preempt.victims if v.job_id in state.jobs]
        if not apply(state, preempt).ok:
            tally.preempt_rejected += 1
            return
        rec = self.records[preempt.preemptor]
        if rec.preempting_since_ms is None:
            rec.preempting_since_ms = now
        bounds = self.workload.save_on_notice_ms
        for victim in victims:
            tally.victims_by_kind[str(preempt.kind)] += 1
            tag = f"{victim.job_id}@{victim.fencing_token}"
            self._push(now + self.pacing.grace_ms, STOP, tag)
            marking = self.marking.get(victim.job_id)
            if bounds is not None and marking is not None and marking.token == victim.fencing_token:
                attempt = state.jobs[victim.job_id].attempts_made
                save = save_delay_ms(bounds, self.workload.name, victim.job_id, attempt)
                if save < self.pacing.grace_ms:  # a longer save is cut short by the grace
                    self.noticed[tag] = now
                    self._push(now + save, SAVE, tag)

    def _observe(self, pending_count: int) -> None:
        """Record the instant's allocation and queue length, and the queues' shares."""
        hours = self.now / MS_PER_HOUR
        self.series_alloc.append((hours, self.allocated / self.total_gpus))
        self.series_queue.append((hours, float(pending_count)))
        if self.meter is None:
            return
        smallest: dict[str, int] = {}
        for job_id in self.pending:
            rec = self.records[job_id]
            if rec.gpus < smallest.get(rec.queue, rec.gpus + 1):
                smallest[rec.queue] = rec.gpus
        usage, nominal = self.usage, self.nominal
        starved = [q for q, g in smallest.items() if q in nominal and usage[q] + g <= nominal[q]]
        self.meter.observe(self.now, usage, smallest, starved, self._reclaimable(starved, smallest))

    def _reclaimable(self, starved: list[str], smallest: dict[str, int]) -> list[str]:
        """Of the ``starved`` queues, those whose smallest pending gang the other queues
        of their cohort tree borrow enough GPUs for (see :mod:`synapse_ha.sim.fairness`)."""
        usage, nominal, cohort = self.usage, self.nominal, self.cohort
        out = []
        for q in starved:
            borrowed = sum(
                max(0, usage[o] - n)
                for o, n in nominal.items()
                if o != q and cohort.get(o) and cohort.get(o) == cohort.get(q)
            )
            if smallest[q] <= borrowed:
                out.append(q)
        return out

    def result(self, wall_s: float) -> Result:
        """The run's figures, series and queueing delays, once every event is applied."""
        records = self.records
        metrics = run_metrics(self.state, records, self.tally, self.total_gpus, self.last_t, wall_s)
        series = {"allocation": self.series_alloc, "queue": self.series_queue}
        if self.meter is not None:
            metrics["tenancy"] = tenancy_metrics(self.meter, self.last_t, records, self.tally)
            series.update({f"share:{q}": points for q, points in self.meter.series.items()})
        self._extra_metrics(metrics)
        delays = queue_delays(records.values())
        return Result(self.policy.name, self.workload.name, metrics, series, delays)

    def _extra_metrics(self, metrics: dict[str, Any]) -> None:
        """A subclass's figures, added to ``metrics`` (here: none)."""


class AfterOkRun(Run):
    """A run whose jobs may wait for earlier ones (``SimJob.after_ok``) through the real
    dependencies: a job is submitted with ``dependencies.after_ok`` naming the job or
    array ids those were given, the state machine holds it (reason ``dependency``) until
    each has succeeded (an array: every task), and cancels it when one cannot.

    Finished jobs are purged as the run goes: a job waited for that was purged after it
    succeeded is met already; one that failed (an array: any task of it), purged or not,
    leaves the job never submitted (``never_submitted``), as the cluster would have
    refused it or cancelled it at once."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.succeeded: dict[str, bool] = {}  # finished job id -> whether it succeeded
        self.never_submitted: set[int] = set()  # indices of jobs never submitted
        self.cancelled_waiting = 0  # jobs the state machine cancelled while they waited

    def _arrive(self, index: int, spec: JobSpec | None = None) -> None:
        job = self.workload.jobs[index]
        waiting: list[str] = []
        for before in job.after_ok:
            target = self.job_id_of.get(before)
            if target is None:
                if before not in self.never_submitted:
                    raise ValueError(
                        f"job {job.spec.name} waits for job {before} of the workload, "
                        "which arrives after it"
                    )
                self.never_submitted.add(index)
                return
            known = outcome_of(self.state, DependencyKind.AFTER_OK, target)
            # How its jobs (an array's tasks) that ended did; those purged are known here only.
            ended = [self.succeeded[t] for t in self.tasks_of[target] if t in self.succeeded]
            if known is Outcome.NEVER or not all(ended) or (known is None and not ended):
                self.never_submitted.add(index)
                return
            if known is Outcome.WAITING:
                waiting.append(target)
        spec = spec or job.spec
        if waiting:
            spec = replace(spec, dependencies=Dependencies(after_ok=tuple(waiting)))
        super()._arrive(index, spec)

    def _released(self, job_id: str) -> None:
        super()._released(job_id)
        job = self.state.jobs[job_id]
        if not job.state.finished:
            return
        self.succeeded[job_id] = job.state is JobState.SUCCEEDED
        if job.state is not JobState.SUCCEEDED:
            # Jobs waiting for it (directly or not) were cancelled: they never held resources.
            jobs = self.state.jobs
            for waiting_id in [j for j in self.pending if jobs[j].state.finished]:
                del self.pending[waiting_id]
                self.succeeded[waiting_id] = False
                self.cancelled_waiting += 1

    def _extra_metrics(self, metrics: dict[str, Any]) -> None:
        metrics["after_ok"] = {
            "jobs_with_after_ok": sum(1 for j in self.workload.jobs if j.after_ok),
            "cancelled_waiting": self.cancelled_waiting,
            "never_submitted": len(self.never_submitted),
        }
