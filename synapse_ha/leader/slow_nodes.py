"""Slow nodes on a real cluster: the leader's collector of its members' pace.

A member that reports its pace (``$SYNAPSE_PROGRESS_FILE``, :mod:`synapse_ha.worker.pace`)
has, in each of its worker's heartbeats, the median of its own time per step over the
worker's recent window (:class:`~synapse_ha.core.health.slowness.PaceReport`). The
leader keeps the newest report of each member (:meth:`SlowNodes.note`, from the heartbeat
handlers' threads) and, every ``window_ms`` of each gang's attempt, makes a
:class:`~synapse_ha.core.health.slowness.GangWindow` of the reports heard in that window
and weighs it with the :class:`~synapse_ha.core.health.slowness.SlownessRule`
(:meth:`SlowNodes.step`, from the leader loop). A report counts only for the attempt it
names and from the node its member is placed on; a member on a node already degraded is
left out (it is known slow, and as a peer would hide the next slowest).

A node the rule marks is proposed as :class:`~synapse_ha.core.commands.MarkNodeDegraded`
with the evidence, once every replica reads format 15 (until then the mark waits here).
A degraded node an operator has made ready again (``synctl uncordon``) gets its
``degraded`` condition cleared (a passing ``degraded`` check, as a worker's check clears
its own), and is weighed afresh.

Evidence, not state: what the collector holds is the current leader's, never replicated,
and lost when leadership moves; the next leader starts with empty windows (a node needs
its three strikes again). Its size is bounded by the running members: the reports of a
gang that no longer runs are dropped at the next step.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from synapse_ha.core import commands as cmd
from synapse_ha.core.health.fitness import NodeCheck
from synapse_ha.core.health.slowness import (
    DEGRADED,
    GangWindow,
    MemberPace,
    PaceReport,
    SlownessLedger,
    SlownessRule,
    SlowNode,
    is_degraded,
)
from synapse_ha.core.model import Attempt, ClusterState, NodeStatus
from synapse_ha.leader.in_flight import InFlight

FORMAT_DEGRADED = 15  # the format that reads MarkNodeDegraded (core/codec/formats.py)
DEFAULT_WINDOW_MS = 900_000  # the windows the rule was judged with (docs/slow-nodes.md)
# How often the nodes are looked over for a degraded one made ready again (a scan).
SCAN_MS = 1_000


@dataclass(frozen=True, slots=True)
class SlowNodeSettings:
    """How the leader judges pace: one window per gang every ``window_ms`` (the worker's
    median covers about as long), weighed with ``rule``."""

    window_ms: int = DEFAULT_WINDOW_MS
    rule: SlownessRule = field(default_factory=SlownessRule)


@dataclass(frozen=True, slots=True)
class Heard:
    """A member's newest pace report, the node that sent it and when (leader clock)."""

    node_id: str
    report: PaceReport
    heard_ms: int


@dataclass(slots=True)
class _GangClock:
    """The windows of one gang's attempt: the attempt's token, the next window's number
    and when it opened."""

    fencing_token: int
    window: int
    opened_ms: int


def gang_window(
    state: ClusterState,
    job_id: str,
    attempt: Attempt,
    heard: Iterable[Heard],
    window: int,
    opened_ms: int,
) -> GangWindow:
    """The window of ``job_id``'s live ``attempt`` numbered ``window``: each member's
    report heard since ``opened_ms`` that names the attempt's token and comes from the
    node the member is placed on, in rank order; members on a degraded node and vacant
    ranks left out. Pure."""
    vacant = {v.rank for v in attempt.vacancies}
    paces = []
    for h in heard:
        r = h.report
        if r.fencing_token != attempt.fencing_token or h.heard_ms < opened_ms:
            continue
        if not 0 <= r.rank < len(attempt.members) or r.rank in vacant:
            continue
        node_id = attempt.members[r.rank].node_id
        node = state.nodes.get(node_id)
        if node_id != h.node_id or node is None or is_degraded(node.conditions):
            continue
        paces.append(MemberPace(node_id, r.rank, r.step_us, r.peers))
    return GangWindow(job_id, window, tuple(sorted(paces)))


class SlowNodes:
    """The leader's pace collector and slow-node marker. :meth:`note` is thread-safe (the
    heartbeat handlers call it); :meth:`step` and :meth:`reset` are the leader loop's."""

    def __init__(self, settings: SlowNodeSettings | None = None) -> None:
        self.settings = settings or SlowNodeSettings()
        problem = self.settings.rule.error()
        if problem is not None:
            raise ValueError(problem)
        if self.settings.window_ms < 1:
            raise ValueError(f"window_ms: at least 1, got {self.settings.window_ms}")
        self._lock = threading.Lock()
        self._heard: dict[str, dict[int, Heard]] = {}  # job id -> rank -> newest report
        self._new: set[str] = set()  # jobs first heard since the last step
        self._clocks: dict[str, _GangClock] = {}
        self._ledger = SlownessLedger(self.settings.rule)
        self._found: dict[str, SlowNode] = {}  # marked here, not yet seen in the state
        self._marking: dict[str, InFlight] = {}
        self._clearing: dict[str, InFlight] = {}
        self._held = False
        self._next_scan_ms = 0
        self._next_weigh_ms = 0
        self.ignored = 0  # reports that broke a rule (PaceReport.error), since the start

    @property
    def marked(self) -> tuple[str, ...]:
        """The nodes this leader found slow and does not weigh, until their mark is
        cleared."""
        return tuple(sorted(self._ledger.marked))

    # ------------------------------------------------------------ heartbeats

    def note(self, node_id: str, paces: Iterable[PaceReport], now_ms: int) -> None:
        """Keep each of ``paces`` (from ``node_id``'s heartbeat at ``now_ms``) as its
        member's newest report. A report that breaks a rule is ignored (and counted):
        a heartbeat is never refused for its paces."""
        with self._lock:
            for report in paces:
                if report.error() is not None:
                    self.ignored += 1
                    continue
                ranks = self._heard.get(report.job_id)
                if ranks is None:
                    ranks = self._heard[report.job_id] = {}
                    self._new.add(report.job_id)
                ranks[report.rank] = Heard(node_id, report, now_ms)

    def newest(self, job_id: str) -> tuple[Heard, ...]:
        """The newest report of each member of ``job_id`` kept, in rank order."""
        with self._lock:
            ranks = self._heard.get(job_id, {})
            return tuple(ranks[r] for r in sorted(ranks))

    def reset(self) -> None:
        """Forget everything: leadership moved (a new term starts with no evidence)."""
        with self._lock:
            self._heard.clear()
            self._new.clear()
        self._clocks.clear()
        self._ledger = SlownessLedger(self.settings.rule)
        self._found.clear()
        self._marking.clear()
        self._clearing.clear()
        self._held = False
        self._next_scan_ms = 0
        self._next_weigh_ms = 0

    # ------------------------------------------------------------------ step

    def step(
        self, state: ClusterState, now_ms: int, start: Callable[[cmd.Command, int], InFlight]
    ) -> list[str]:
        """Close the gangs' windows that are due, weigh them, and propose what follows
        (marks, clears); say what was proposed."""
        said = self._clear_lifted(state, now_ms, start)
        for mark in self._weigh_due(state, now_ms):
            self._found[mark.node_id] = mark
            said.append(f"found node {mark.node_id} slow: {mark.evidence()}")
        said += self._propose_marks(state, now_ms, start)
        return said

    def _weigh_due(self, state: ClusterState, now_ms: int) -> list[SlowNode]:
        """Weigh the windows that are due, in job id order; a step costs the gangs, and
        the members of the gangs whose window closes."""
        if now_ms < self._next_weigh_ms:
            return []
        self._next_weigh_ms = now_ms + min(SCAN_MS, self.settings.window_ms // 10)
        with self._lock:
            new, self._new = self._new, set()
        for job_id in new:
            self._clocks.setdefault(job_id, _GangClock(-1, 0, now_ms - self.settings.window_ms))
        window_ms = self.settings.window_ms
        marks: list[SlowNode] = []
        for job_id in sorted(
            j for j, c in self._clocks.items() if now_ms - c.opened_ms >= window_ms
        ):
            clock = self._clocks[job_id]
            attempt = _live(state, job_id)
            if attempt is None:  # ended (or never was): its reports go with it
                del self._clocks[job_id]
                with self._lock:
                    self._heard.pop(job_id, None)
                continue
            if clock.fencing_token != attempt.fencing_token:  # its first window opens now
                self._clocks[job_id] = _GangClock(attempt.fencing_token, 0, now_ms)
                continue
            with self._lock:
                heard = tuple(self._heard.get(job_id, {}).values())
            window = gang_window(state, job_id, attempt, heard, clock.window, clock.opened_ms)
            clock.window += 1
            clock.opened_ms = now_ms
            marks += self._ledger.observe(window)
        return marks

    def _propose_marks(
        self, state: ClusterState, now_ms: int, start: Callable[[cmd.Command, int], InFlight]
    ) -> list[str]:
        said: list[str] = []
        for node_id in sorted(self._found):
            node = state.nodes.get(node_id)
            flight = self._marking.get(node_id)
            if node is not None and is_degraded(node.conditions):
                del self._found[node_id]  # recorded: the state says so from now on
                self._marking.pop(node_id, None)
                continue
            if flight is not None:
                if not flight.settled(now_ms):
                    continue
                del self._marking[node_id]
                result = flight.result()
                if result is not None and result.ok:
                    continue  # committed after this snapshot: seen at the next step
                if result is not None or node is None or node.status is NodeStatus.DEAD:
                    # Refused (a dead or unknown node): weigh it afresh.
                    del self._found[node_id]
                    self._ledger.clear(node_id)
                    continue
            if state.format_floor < FORMAT_DEGRADED:
                if not self._held:
                    self._held = True
                    said.append(
                        f"slow node(s) {', '.join(sorted(self._found))} not marked yet: not "
                        f"every replica reads format {FORMAT_DEGRADED}"
                    )
                return said
            mark = self._found[node_id]
            command = cmd.MarkNodeDegraded(node_id, mark.condition_message(), now_ms)
            self._marking[node_id] = start(command, now_ms)
            said.append(f"marking node {node_id} degraded")
        self._held = False
        return said

    def _clear_lifted(
        self, state: ClusterState, now_ms: int, start: Callable[[cmd.Command, int], InFlight]
    ) -> list[str]:
        """Clear the ``degraded`` condition of nodes an operator made ready again, and
        weigh afresh every node the ledger marked that the state no longer shows degraded
        (cleared, or dead and registered again)."""
        said: list[str] = []
        for node_id in [n for n, f in self._clearing.items() if f.settled(now_ms)]:
            del self._clearing[node_id]
        if now_ms < self._next_scan_ms:
            return said
        self._next_scan_ms = now_ms + SCAN_MS
        for node_id in sorted(state.nodes):
            lifted = state.nodes[node_id]
            if lifted.status is not NodeStatus.READY or not is_degraded(lifted.conditions):
                continue
            if node_id in self._clearing:
                continue
            command = cmd.ReportNodeChecks(node_id, (NodeCheck(DEGRADED, False),), now_ms)
            self._clearing[node_id] = start(command, now_ms)
            said.append(f"clearing node {node_id}'s degraded mark: an operator made it ready")
        for node_id in list(self._ledger.marked):
            node = state.nodes.get(node_id)
            if node_id in self._found or (node is not None and is_degraded(node.conditions)):
                continue
            self._ledger.clear(node_id)
        return said


def _live(state: ClusterState, job_id: str) -> Attempt | None:
    job = state.jobs.get(job_id)
    return job.live_attempt() if job is not None else None
