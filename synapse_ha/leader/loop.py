"""The leader's duties: barrier, scheduling passes, the reaper, time limits, start
timeouts and purges.

Only the Raft leader runs these. Every decision is proposed as a command carrying its own
time and seeds; the state machine re-verifies it when it is applied, so a decision made
on a stale view is rejected rather than acted on.

:class:`LeaderLoop` is a step function: the composition root calls :meth:`LeaderLoop.step`
when the state changes and on a short period, and tests call it with a fake clock. Each
step returns one sentence saying what it decided (in the manner of Patroni's HA loop).

Rules it keeps:

* On becoming leader it first commits a :class:`Barrier`; until that commits, the log may
  hold entries from earlier terms that are not applied yet, so it decides nothing.
* A new leader treats every node as heard from at its election (:class:`Liveness`), so
  no node is reaped before it had a whole ``dead_timeout`` to find the new leader.
* At most one bind command is in flight; the next pass plans on the state it produced.
  Once a bind commits, the workers it placed members on are nudged to heartbeat at once
  (a hint; they would learn it at their next heartbeat anyway).
* Preemptions the pass decides are proposed as :class:`~synapse_ha.core.commands.Preempt`
  commands right after its bind, at most one in flight per preemptor; once one commits,
  the victims' nodes are nudged (their members get SIGTERM at their next heartbeat
  anyway). A committed preemption is never proposed again: its victims are marked in the
  state, and the pass chooses only gangs that are not being preempted.
* Proposals in flight are forgotten when leadership is lost: their outcomes, should they
  arrive, are ignored, and the next term starts from a clean slate.
* It decides on snapshots (:meth:`StateReader.snapshot`), never on the live state: a
  scheduling pass, however long, holds no lock that the log's applies need. The free
  capacity table is kept between passes in the loop's own :class:`CapacityCache`, and the
  last pass's plan is kept so that ``explain`` answers from it instead of planning again.
* Its passes are incremental (:class:`~synapse_ha.core.scheduler.IncrementalPlanner`):
  a pass keeps the previous plan when nothing it reads changed and the clock crossed no
  deadline, and decides only new submissions that come last in the queue; anything else
  is a full pass. The plan is the one a full pass makes. A new term starts with a full
  pass.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from synapse_ha.core import commands as cmd
from synapse_ha.core.codec.formats import held_back_config
from synapse_ha.core.model import ClusterState, JobState, NodeStatus
from synapse_ha.core.reasons import render
from synapse_ha.core.scheduler import CapacityCache, IncrementalPlanner, Plan, schedule
from synapse_ha.core.views import due_deadlines, due_start_timeouts, due_time_limits
from synapse_ha.leader.elastic import Elasticity
from synapse_ha.leader.in_flight import InFlight, propose_per_job
from synapse_ha.leader.liveness import Liveness
from synapse_ha.leader.ports import Nudger, Proposer, StateReader
from synapse_ha.leader.replacing import Replacing
from synapse_ha.leader.scheduling import DesiredSettings
from synapse_ha.leader.silence import DEFAULT_SILENCE_HOLD, SilenceHold, hold_reason
from synapse_ha.leader.slow_nodes import SlowNodes


def _marked(state: ClusterState, preemptor: str) -> bool:
    """Whether ``state`` shows a gang preempted for ``preemptor`` (or it is placed)."""
    job = state.jobs.get(preemptor)
    if job is None or job.state is not JobState.PENDING:
        return True
    return any(
        j.attempt is not None and j.attempt.preempted_by == preemptor for j in state.jobs.values()
    )


# A replica that did not run for this long (stopped, starved, a paused VM) cannot tell its
# own deafness from its nodes' silence: when it runs again as leader it counts every node
# as heard then, as at an election (LeaderLoop.note_not_running).
STALL_MS = 1000
# How often pending jobs are looked over for a deadline that came due.
DEADLINE_SCAN_MS = 1000


@dataclass(frozen=True, slots=True)
class LoopSettings:
    """How often the leader acts.

    A scheduling pass runs when the state changed (a command was applied since the
    previous pass: a submission, an exit, a cancel, a bind; or the driver says so), but no
    sooner than
    ``min_pass_gap_ms`` and ``pass_gap_factor`` times the previous pass's cost after the
    previous pass: a pass holds no lock, but it takes CPU (and the interpreter lock) that
    applies and heartbeats need, so passes back to back would starve them. It also runs
    every ``schedule_period_ms`` (back-off timers expire without any state change), or
    after the gap when that is longer.
    Reaper and time limits are checked every ``housekeeping_period_ms``; the reaper
    declares no node dead during a mass silence (``silence_hold``, leader/silence.py).
    ``incremental_planning`` off makes every pass a full one (the same plans).
    """

    schedule_period_ms: int = 500
    min_pass_gap_ms: int = 5
    pass_gap_factor: float = 3.0
    housekeeping_period_ms: int = 100
    purge_period_ms: int = 60_000
    proposal_timeout_ms: int = 5_000
    incremental_planning: bool = True
    silence_hold: SilenceHold = DEFAULT_SILENCE_HOLD


class LeaderLoop:
    """The leader-only control loop. Not thread-safe: one driver thread calls it."""

    def __init__(
        self,
        state: StateReader,
        proposer: Proposer,
        liveness: Liveness,
        replica_id: str,
        settings: LoopSettings | None = None,
        rng: random.Random | None = None,
        on_ready: Callable[[bool], None] | None = None,
        desired: DesiredSettings | None = None,
        timer: Callable[[], float] = time.perf_counter,
        nudger: Nudger | None = None,
        wake: Callable[[], None] | None = None,
        slow_nodes: SlowNodes | None = None,
    ) -> None:
        """``slow_nodes``: the collector of the members' pace that marks slow nodes
        (leader/slow_nodes.py), weighed at housekeeping; None: no such marks.
        ``wake`` is called (on another thread) when one of this loop's proposals
        settles, so the driver can step at once instead of at its next tick.
        ``desired``: the timeouts, locality wait and scheduling settings this replica is
        configured with, replicated when the cluster's configuration differs (dropped once
        the cluster refuses them)."""
        self._state = state
        self._proposer = proposer
        self._liveness = liveness
        self._replica_id = replica_id
        self._settings = settings or LoopSettings()
        self._rng = rng or random.Random()
        self._on_ready = on_ready
        self._desired = desired
        self._timer = timer
        self._nudger = nudger
        self._wake = wake
        self._slow_nodes = slow_nodes
        self._bind_nodes: tuple[str, ...] = ()
        self._next_pass_ms: int | None = None
        self._pass_cost_ms = 0.0
        self._last_housekeeping_ms = -(1 << 62)
        self._configure: InFlight | None = None
        self._leader = False
        self._term = 0
        self._ready = False
        self._barrier: InFlight | None = None
        self._bind: InFlight | None = None
        self._node_deaths: dict[str, InFlight] = {}
        self._held = False  # node deaths held for a mass silence (leader/silence.py)
        self._expiries: dict[str, InFlight] = {}
        self._deadlines: dict[str, InFlight] = {}
        self._next_deadline_scan_ms = 0
        self._start_timeouts: dict[str, InFlight] = {}
        self._replacing = Replacing(self._start, self._rng)
        self._elasticity = Elasticity(self._start)
        self._purge: InFlight | None = None
        self._preempts: dict[str, tuple[InFlight, tuple[str, ...]]] = {}
        self._dirty = True
        self._planned_applied = -1  # the state's applied_commands the last pass planned on
        self._last_pass_ms = 0
        self._last_purge_ms = 0
        self._cache = CapacityCache()
        self._planner = IncrementalPlanner(self._cache)
        self._last_plan: Plan | None = None
        self._notable: list[str] = []

    # ------------------------------------------------------------ notifications

    @property
    def ready(self) -> bool:
        """True once this leader's barrier committed: it may serve reads and decide."""
        return self._ready

    def on_role_change(self, is_leader: bool, term: int, now_ms: int) -> None:
        """Leadership gained or lost. Forgets every proposal of the previous term."""
        self._leader = is_leader
        self._term = term
        self._barrier = None
        self._bind = None
        self._bind_nodes = ()
        self._next_pass_ms = None
        self._node_deaths.clear()
        self._held = False
        self._expiries.clear()
        self._deadlines.clear()
        self._start_timeouts.clear()
        self._preempts.clear()
        self._purge = None
        self._configure = None
        self._dirty = True
        self._planned_applied = -1
        self._last_pass_ms = 0
        self._last_housekeeping_ms = -(1 << 62)
        self._last_purge_ms = now_ms
        self._last_plan = None
        self._planner.reset()
        if self._slow_nodes is not None:
            self._slow_nodes.reset()
        self._set_ready(False)
        if is_leader:
            self._liveness.reset(now_ms)

    def note_not_running(self, stalled_ms: int, now_ms: int) -> str:
        """The driver saw this replica not run for ``stalled_ms`` (its thread overslept a
        short wait, or a step took that much longer than the CPU it used). Heartbeats sent
        meanwhile may not have been read, so a leader counts every node as heard now:
        silence it measured while it was not listening is not a node's. A dead node is then
        declared at most ``stalled_ms`` later; never early."""
        if stalled_ms < STALL_MS or not self._leader:
            return ""
        self._liveness.raise_baseline(now_ms)
        return self._note(
            f"this replica did not run for {stalled_ms} ms: every node counts as heard now"
        )

    def note_state_changed(self) -> None:
        """Plan again at the next step (within the gap) even if no command was applied
        since the last pass. Applied commands are seen without this: the loop compares the
        snapshot's ``applied_commands`` with the one its last pass planned on."""
        self._dirty = True

    def take_notable(self) -> list[str]:
        """Sentences since the last call that an operator should see (leadership, node
        deaths, refused settings), as opposed to routine passes."""
        notable, self._notable = self._notable, []
        return notable

    def _note(self, sentence: str) -> str:
        self._notable.append(sentence)
        return sentence

    @property
    def last_plan(self) -> Plan | None:
        """The plan of this term's newest scheduling pass (why each pending job waits,
        and what it placed), or None before the first. Safe to read from any thread:
        a plan is never changed once made."""
        return self._last_plan

    @property
    def planning(self) -> dict[str, int]:
        """How this loop's passes were made, by kind: ``full``, ``kept`` (the previous
        plan stood), ``extended`` (new submissions decided after it) and
        ``fallback:<why>`` (a full pass where an incremental one was tried)."""
        return dict(self._planner.counts)

    # --------------------------------------------------------------------- step

    def step(self, now_ms: int) -> str:
        """Decide and propose what is due; return a sentence saying what was decided."""
        if not self._leader:
            return "not the leader: nothing to do"
        if not self._ready:
            return self._await_barrier(now_ms)
        housekeeping = now_ms - self._last_housekeeping_ms >= self._settings.housekeeping_period_ms
        if housekeeping:
            self._last_housekeeping_ms = now_ms
        state = self._state.snapshot()
        sentences = [self._configure_cluster(state, now_ms)]
        if housekeeping:
            sentences += self._reap(state, now_ms)
            sentences += self._expire_time_limits(state, now_ms)
            sentences += self._expire_deadlines(state, now_ms)
            sentences += self._fail_unstarted(state, now_ms)
            sentences += self._replace_lost(state, now_ms)
            if self._slow_nodes is not None:
                found = self._slow_nodes.step(state, now_ms, self._start)
                sentences += [self._note(s) for s in found]
        sentences += [self._schedule(state, now_ms), self._purge_finished(now_ms)]
        said = [s for s in sentences if s]
        return "; ".join(said) if said else "leader: nothing to do"

    # ----------------------------------------------------------------- barrier

    def _await_barrier(self, now_ms: int) -> str:
        if self._barrier is None:
            self._barrier = self._start(
                cmd.Barrier(leader_id=self._replica_id, now_ms=now_ms), now_ms
            )
            return self._note(
                f"became leader in term {self._term}: committing a barrier before acting"
            )
        barrier = self._barrier
        if not barrier.settled(now_ms):
            return f"leader in term {self._term}: waiting for the barrier to commit"
        self._barrier = None
        error = barrier.error()
        if error is not None:
            return self._note(f"leader in term {self._term}: barrier failed ({error}); retrying")
        self._set_ready(True)
        return self._note(f"leader in term {self._term}: barrier committed, now scheduling")

    def _set_ready(self, ready: bool) -> None:
        if ready != self._ready:
            self._ready = ready
            if self._on_ready is not None:
                self._on_ready(ready)

    def _start(self, command: cmd.Command, now_ms: int) -> InFlight:
        future = self._proposer.propose(command)
        if self._wake is not None:
            wake = self._wake
            future.add_done_callback(lambda _f: wake())
        return InFlight(future, now_ms, self._settings.proposal_timeout_ms)

    def next_step_in_ms(self, now_ms: int) -> int | None:
        """When a scheduling pass that is waiting out the gap after the previous one
        becomes due, in ms from ``now_ms``; None when none is waiting."""
        if self._next_pass_ms is None or not self._leader:
            return None
        return max(0, self._next_pass_ms - now_ms)

    # ------------------------------------------------------------------- config

    def _configure_cluster(self, state: ClusterState, now_ms: int) -> str:
        """Replicate this replica's configured timeouts and locality wait when the
        replicated configuration differs."""
        wanted = state.config if self._desired is None else self._desired.applied_to(state.config)
        # What not every replica reads yet waits for the format gate (core/codec/formats.py).
        wanted = held_back_config(wanted, state.config, state.format_floor)
        if wanted == state.config:
            return ""
        if self._configure is not None:
            if not self._configure.settled(now_ms):
                return ""
            result = self._configure.result()
            self._configure = None
            if result is not None and not result.ok:
                # Refused: keep the replicated values.
                self._desired = None
                return self._note(f"the configured settings were refused: {result.message}")
        self._configure = self._start(cmd.Configure(config=wanted, now_ms=now_ms), now_ms)
        return "replicating the configured settings"

    # ------------------------------------------------------------------ reaper

    def _reap(self, state: ClusterState, now_ms: int) -> list[str]:
        dead_after = state.config.timeouts.dead_timeout_ms
        said: list[str] = []
        for node_id in list(self._node_deaths):
            if self._node_deaths[node_id].settled(now_ms):
                del self._node_deaths[node_id]
        alive = [n for n, node in state.nodes.items() if node.status is not NodeStatus.DEAD]
        late, overdue = self._liveness.overdue(alive, now_ms, dead_after // 2, dead_after)
        held = hold_reason(late, len(alive), dead_after, self._settings.silence_hold)
        if bool(held) != self._held:  # said when a hold starts or ends, not at every step
            self._held = bool(held)
            said.append(self._note(held or "node deaths no longer held: most nodes are heard"))
        if held:
            return said
        for node_id, silent in sorted(overdue):
            if node_id in self._node_deaths:
                continue
            command = cmd.MarkNodeDead(
                node_id=node_id,
                reason=f"no heartbeat for {silent} ms (dead_timeout {dead_after} ms)",
                jitter_seed=self._rng.getrandbits(63),
                now_ms=now_ms,
            )
            self._node_deaths[node_id] = self._start(command, now_ms)
            said.append(self._note(f"declaring node {node_id} dead after {silent} ms of silence"))
        return said

    # ------------------------------------------------------------- time limits

    def _expire_time_limits(self, state: ClusterState, now_ms: int) -> list[str]:
        due = due_time_limits(state, now_ms)
        return propose_per_job(
            self._expiries,
            due,
            now_ms,
            self._start,
            lambda c: f"stopping {c.job_id} at its time limit",
        )

    def _expire_deadlines(self, state: ClusterState, now_ms: int) -> list[str]:
        """Cancel pending jobs at their deadline; looked for once a second at most (a
        scan of the jobs), at most one proposal in flight per job."""
        if now_ms < self._next_deadline_scan_ms:
            return []
        self._next_deadline_scan_ms = now_ms + DEADLINE_SCAN_MS
        due = due_deadlines(state, now_ms)
        return propose_per_job(
            self._deadlines,
            due,
            now_ms,
            self._start,
            lambda c: f"cancelling {c.job_id} at its deadline",
        )

    # ---------------------------------------------------------- start timeouts

    def _fail_unstarted(self, state: ClusterState, now_ms: int) -> list[str]:
        """Fail attempts with a member not running ``start_timeout_ms`` after the bind;
        at most one proposal in flight per job."""
        due = (
            replace(command, jitter_seed=self._rng.getrandbits(63))
            for command in due_start_timeouts(state, now_ms)
            if command.job_id not in self._start_timeouts
        )
        return propose_per_job(
            self._start_timeouts,
            due,
            now_ms,
            self._start,
            lambda c: f"failing {c.job_id}: {render(c.reason)}",
        )

    def _replace_lost(self, state: ClusterState, now_ms: int) -> list[str]:
        """Lost members of running gangs placed again (leader/replacing.py), elastic
        gangs grown and shrunk (leader/elastic.py)."""
        said, nudge = self._replacing.step(state, now_ms)
        resized, grown = self._elasticity.step(state, now_ms)
        said, nudge = said + resized, nudge + grown
        if nudge and self._nudger is not None:
            targets = [(n, state.nodes[n].info.address) for n in nudge if n in state.nodes]
            self._nudger.nudge(targets)
        return [self._note(s) for s in said]

    # -------------------------------------------------------------- scheduling

    def _schedule(self, state: ClusterState, now_ms: int) -> str:
        self._next_pass_ms = None
        if self._bind is not None:
            if not self._bind.settled(now_ms):
                return "a bind is in flight"
            error = self._bind.error()
            self._bind = None
            self._dirty = True
            if error is not None:
                self._bind_nodes = ()
                return f"the last bind did not commit ({error}); planning again"
            self._nudge(state)
        if state.applied_commands != self._planned_applied:
            # Something was applied since the last pass: plan on it as soon as the gap
            # allows; every command applied meanwhile is planned on in that one pass.
            self._dirty = True
        since = now_ms - self._last_pass_ms
        settings = self._settings
        gap = max(settings.min_pass_gap_ms, settings.pass_gap_factor * self._pass_cost_ms)
        # The period too waits out the gap: a pass costing more than a third of the period
        # would otherwise run every period, at more than the share of the CPU the gap allows.
        periodic = since >= max(settings.schedule_period_ms, gap)
        if not periodic and not (self._dirty and since >= gap):
            if self._dirty:
                self._next_pass_ms = self._last_pass_ms + math.ceil(gap)
            return ""
        self._dirty = False
        self._planned_applied = state.applied_commands
        self._last_pass_ms = now_ms
        started = self._timer()
        if self._settings.incremental_planning:
            plan = self._planner.plan(state, now_ms)
        else:
            plan = schedule(state, now_ms, cache=self._cache)
        command = plan.command(now_ms)
        self._pass_cost_ms = (self._timer() - started) * 1000
        self._last_plan = plan
        preempting = self._propose_preemptions(state, plan, now_ms)
        if command is None:
            pending = len(plan.reasons)
            said = f"scheduling pass: nothing to bind ({pending} pending)" if pending else ""
            return "; ".join(x for x in (said, preempting) if x)
        self._bind = self._start(command, now_ms)
        self._bind_nodes = tuple(sorted({m.node_id for p in command.placements for m in p.members}))
        waiting = len(plan.reasons)
        if not command.placements:
            said = f"updating why {len(command.reasons)} jobs wait ({waiting} pending)"
            return "; ".join(x for x in (said, preempting) if x)
        members = sum(len(p.members) for p in command.placements)
        said = (
            f"proposing to bind {len(command.placements)} gangs ({members} members); "
            f"{waiting} jobs keep waiting"
        )
        return "; ".join(x for x in (said, preempting) if x)

    def _propose_preemptions(self, state: ClusterState, plan: Plan, now_ms: int) -> str:
        """Propose the plan's preemptions, one in flight per preemptor; nudge the victims'
        nodes of those that committed since the last pass."""
        for preemptor in list(self._preempts):
            flight, nodes = self._preempts[preemptor]
            if not flight.settled(now_ms):
                continue
            result = flight.result()
            if result is not None and result.ok and not _marked(state, preemptor):
                continue  # committed after this snapshot was taken: not planned again yet
            del self._preempts[preemptor]
            if result is not None and result.ok and self._nudger is not None:
                self._nudger.nudge(
                    [(n, state.nodes[n].info.address) for n in nodes if n in state.nodes]
                )
        # Shrinks first: apply then judges the whole victims with them taken.
        proposed = self._elasticity.shrink_for_preemptors(state, plan.shrink_commands(), now_ms)
        for command in plan.preempt_commands(now_ms):
            if command.preemptor in self._preempts:
                continue
            nodes = tuple(
                sorted(
                    {
                        m.node_id
                        for v in command.victims
                        if (job := state.jobs.get(v.job_id)) is not None and job.attempt is not None
                        for m in job.attempt.members
                    }
                )
            )
            self._preempts[command.preemptor] = (self._start(command, now_ms), nodes)
            proposed.append(
                f"{command.preemptor} preempts {', '.join(v.job_id for v in command.victims)} "
                f"({command.kind.value})"
            )
        if not proposed:
            return ""
        return self._note("proposing preemption: " + "; ".join(proposed))

    def _nudge(self, state: ClusterState) -> None:
        """Tell the workers of the bind that just committed to heartbeat now."""
        nodes, self._bind_nodes = self._bind_nodes, ()
        if self._nudger is None or not nodes:
            return
        targets = [
            (node_id, state.nodes[node_id].info.address)
            for node_id in nodes
            if node_id in state.nodes
        ]
        self._nudger.nudge(targets)

    # ------------------------------------------------------------------- purge

    def _purge_finished(self, now_ms: int) -> str:
        if self._purge is not None:
            if not self._purge.settled(now_ms):
                return ""
            self._purge = None
        if now_ms - self._last_purge_ms < self._settings.purge_period_ms:
            return ""
        self._last_purge_ms = now_ms
        self._purge = self._start(cmd.PurgeFinished(now_ms=now_ms), now_ms)
        return "purging finished jobs past the retention window"
