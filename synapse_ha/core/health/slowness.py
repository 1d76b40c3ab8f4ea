"""Slow nodes: a node consistently slower than the rest of its gangs, found from the
members' own pace before it costs many gangs their speed.

What is measured. A gang trains in lockstep: every step ends in a collective (an
all-reduce), so every member finishes every step at the same moment and the gang runs at
the pace of its slowest member. Step numbers and step times seen from outside are the
same for every member and cannot say which one is slow. What differs is each member's
*own* time per step: the time of its work up to the collective (forward and backward,
or the kernels of a timed section), without the time it waits for the others. A window
(:class:`GangWindow`, one per gang every few minutes) carries, per member, the median of
that time over the window's steps (:class:`MemberPace`): the median, so that a stall of
less than half the window (a data-loader hiccup, a checkpoint upload, a short throttle)
does not move it. Members compare only with members doing the same work: all of them in
data parallelism, the members of one pipeline stage otherwise (:attr:`MemberPace.peers`).

The rule (:class:`SlownessRule`). In a window, each member is compared with the median
of the *other* members of its peer group (so a slow member does not pull its own
reference). A member is a *strike* against its node when it is the slowest of its peer
group and at least ``threshold_pct`` (15 %) slower than that median. A node is marked
slow when ``strikes`` (3) of its last ``span`` (5) verdicts are strikes: it was the
slowest in at least 3 windows, of one gang or of several.

The window's length sets the shortest slowdown worth a mark: a stall moves the median of
a window only when it covers more than half of it, so with windows at least as long as
the longest stall to ignore (15 minutes is the length the simulator is judged with), one
stall makes at most one strike and a mark needs three stalls within five windows, while
a node slow for good is marked at its third window (45 minutes).

Why 15 %: a node 20 % slower (the slowdown worth finding) still clears it by 5 points,
about one and a half standard deviations of the noise the simulator gives a healthy
member's window median (a lasting 2 % per node: GPUs of one model differ for good, by 8 %
on average between the GPUs of one cluster in Sinha et al., SC '22; and 3 % per window);
a healthy node is 15 % slower than its peers' median for a whole window only in a stall.
docs/slow-nodes.md gives the simulator's figures (:mod:`synapse_ha.sim.slow_nodes`) for
this rule and its neighbours.

Cost: :class:`SlownessLedger` keeps at most ``span`` verdicts per node, so a window
costs what its members are, whatever the history.

On a real cluster, a member's pace comes with its worker's heartbeat
(:class:`PaceReport`: the median of the member's own step time over the worker's recent
window), the leader builds the windows (:mod:`synapse_ha.leader.slow_nodes`) and a node
it marks gets the condition :data:`DEGRADED` with the evidence
(:class:`~synapse_ha.core.commands.MarkNodeDegraded`).
"""

from __future__ import annotations

import bisect
from collections import deque
from dataclasses import dataclass
from itertools import groupby

from synapse_ha.core.health.fitness import MAX_CHECK_MESSAGE, NodeCondition

MAX_THRESHOLD_PCT = 1000
MAX_SPAN = 100
# The condition a node marked slow gets (a node check's name; see MarkNodeDegraded).
DEGRADED = "degraded"
# A pace report's bounds: a step of at most an hour, a peer group's key of 32 characters.
MAX_STEP_US = 3_600_000_000
MAX_PEERS = 32


def is_degraded(conditions: tuple[NodeCondition, ...]) -> bool:
    """Whether a node with ``conditions`` is marked slow."""
    return any(k.name == DEGRADED for k in conditions)


@dataclass(frozen=True, slots=True, order=True)
class PaceReport:
    """What a worker says of one member's pace in a heartbeat: the member (job, fencing
    token, rank), the median of its own time per step over the worker's window
    (``step_us``, microseconds), how many steps that window held, and its peer group."""

    job_id: str
    fencing_token: int
    rank: int
    step_us: int
    steps: int
    peers: str = ""

    def error(self) -> str | None:
        """The first field out of its range, as a sentence naming it and the rule."""
        if self.rank < 0:
            return f"paces.rank: at least 0, got {self.rank}"
        if not 1 <= self.step_us <= MAX_STEP_US:
            return f"paces.step_us: between 1 and {MAX_STEP_US}, got {self.step_us}"
        if self.steps < 1:
            return f"paces.steps: at least 1, got {self.steps}"
        if len(self.peers) > MAX_PEERS or not self.peers.isprintable():
            return f"paces.peers: at most {MAX_PEERS} printable characters"
        return None


@dataclass(frozen=True, slots=True, order=True)
class MemberPace:
    """One member's pace in one window: its node, its rank, the median of its own time
    per step over the window (``step_us``, microseconds, at least 1), and the key of the
    members doing the same work (``peers``; one group when all do, as in data
    parallelism)."""

    node_id: str
    rank: int
    step_us: int
    peers: str = ""


@dataclass(frozen=True, slots=True)
class GangWindow:
    """The paces of one gang's members over one window: ``window`` counts the windows of
    the gang's attempt (0, 1, ...), so ``(job_id, window)`` names it in the evidence."""

    job_id: str
    window: int
    members: tuple[MemberPace, ...]


@dataclass(frozen=True, slots=True)
class SlownessRule:
    """When a node is marked slow: it was a strike (the slowest of its peers and at least
    ``threshold_pct`` percent slower than the median of the others) in ``strikes`` of its
    last ``span`` verdicts. A peer group of fewer than ``min_peers`` members is not
    judged (with one member there is no one to compare with)."""

    threshold_pct: int = 15
    strikes: int = 3
    span: int = 5
    min_peers: int = 2

    def error(self) -> str | None:
        """The first field out of its range, as a sentence naming it and the rule."""
        if not 1 <= self.threshold_pct <= MAX_THRESHOLD_PCT:
            return f"threshold_pct: between 1 and {MAX_THRESHOLD_PCT}, got {self.threshold_pct}"
        if not 1 <= self.span <= MAX_SPAN:
            return f"span: between 1 and {MAX_SPAN}, got {self.span}"
        if not 1 <= self.strikes <= self.span:
            return f"strikes: between 1 and span ({self.span}), got {self.strikes}"
        if self.min_peers < 2:
            return f"min_peers: at least 2, got {self.min_peers}"
        return None


@dataclass(frozen=True, slots=True, order=True)
class Verdict:
    """How one member's window judged its node: ``slower_pct`` is how much slower than
    the median of its other peers it was (whole percent, rounded down; negative when
    faster), ``strike`` whether it was the slowest of them by at least the threshold."""

    node_id: str
    job_id: str
    window: int
    rank: int
    slower_pct: int
    strike: bool


@dataclass(frozen=True, slots=True)
class SlowNode:
    """A node the rule marks slow, with its evidence: the strikes, out of how many
    verdicts weighed (``weighed``)."""

    node_id: str
    strikes: tuple[Verdict, ...]
    weighed: int

    @property
    def slower_pct(self) -> int:
        """The median of the strikes' slowdowns (the lower middle one of an even count)."""
        pcts = sorted(v.slower_pct for v in self.strikes)
        return pcts[(len(pcts) - 1) // 2]

    @property
    def gangs(self) -> tuple[str, ...]:
        """The gangs of the strikes, each once, in the order of the strikes."""
        return tuple(dict.fromkeys(v.job_id for v in self.strikes))

    def evidence(self, limit: int = 0) -> str:
        """A sentence a person can act on: ``node n7: 23% slower than the median of its
        gang in 3 of its last 4 windows (2 gangs): job-12 window 4 (rank 3, 21%), ...``.
        ``limit`` > 0: at most that many characters, the newest strikes left out first
        (``and 2 more``)."""
        gangs = len(self.gangs)
        where = "1 gang" if gangs == 1 else f"{gangs} gangs"
        cases = [
            f"{v.job_id} window {v.window} (rank {v.rank}, {v.slower_pct}%)" for v in self.strikes
        ]
        head = (
            f"node {self.node_id}: {self.slower_pct}% slower than the median of its gang in "
            f"{len(self.strikes)} of its last {self.weighed} windows ({where}), the slowest "
            f"member each time: "
        )
        shown = len(cases)
        text = head + ", ".join(cases)
        while limit > 0 and len(text) > limit and shown > 0:
            shown -= 1
            text = head + ", ".join([*cases[:shown], f"and {len(cases) - shown} more"])
        return text[:limit] if limit > 0 else text

    def condition_message(self) -> str:
        """The evidence as a node condition's message (bounded as a check's message)."""
        return self.evidence(MAX_CHECK_MESSAGE)


def _peer_key(pace: MemberPace) -> str:
    return pace.peers


def judge_window(window: GangWindow, rule: SlownessRule) -> tuple[Verdict, ...]:
    """One verdict per member of ``window`` whose peer group has at least
    ``rule.min_peers`` members, in (peers, rank, node) order. A pace below 1 us counts
    as 1 us. Pure: the same window gives the same verdicts in any member order."""
    verdicts: list[Verdict] = []
    paces = sorted(window.members, key=lambda p: (p.peers, p.rank, p.node_id, p.step_us))
    for _, group in groupby(paces, key=_peer_key):
        members = list(group)
        if len(members) < rule.min_peers:
            continue
        times = sorted(max(p.step_us, 1) for p in members)
        slowest = times[-1]
        for pace in members:
            step = max(pace.step_us, 1)
            median2 = _twice_median_without(times, step)
            # (step - median) / median, in whole percent, on integers: median2 is twice it.
            excess = 100 * (2 * step - median2)
            verdicts.append(
                Verdict(
                    pace.node_id,
                    window.job_id,
                    window.window,
                    pace.rank,
                    excess // median2,
                    step == slowest and excess >= rule.threshold_pct * median2,
                )
            )
    return tuple(verdicts)


def _twice_median_without(times: list[int], step: int) -> int:
    """Twice the median of the sorted ``times`` with one copy of ``step`` left out (an
    integer even when the count left is even), without copying ``times``."""
    gone = bisect.bisect_left(times, step)

    def rest(k: int) -> int:
        return times[k] if k < gone else times[k + 1]

    middle, odd = divmod(len(times) - 1, 2)
    return 2 * rest(middle) if odd else rest(middle - 1) + rest(middle)


class SlownessLedger:
    """The recent verdicts of every node and the nodes marked slow.

    Feed it every gang's windows in the order they end (:meth:`observe`); it returns the
    nodes each window marks, once each. A marked node is no longer weighed, nor a peer
    of anyone, until :meth:`clear` (its repair, or an operator's word) forgets its mark
    and its history.
    Deterministic: the same windows in the same order give the same marks."""

    def __init__(self, rule: SlownessRule | None = None) -> None:
        self.rule = rule or SlownessRule()
        problem = self.rule.error()
        if problem is not None:
            raise ValueError(problem)
        self.recent: dict[str, deque[Verdict]] = {}
        self.marked: dict[str, SlowNode] = {}

    def observe(self, window: GangWindow) -> tuple[SlowNode, ...]:
        """Weigh one window; the nodes it marks slow, in the order of their verdicts."""
        marks: list[SlowNode] = []
        if any(p.node_id in self.marked for p in window.members):
            # A marked node is known slow: as a peer it would stay the slowest and hide
            # the next slowest of its gang, so its members are left out.
            members = tuple(p for p in window.members if p.node_id not in self.marked)
            window = GangWindow(window.job_id, window.window, members)
        for verdict in judge_window(window, self.rule):
            node_id = verdict.node_id
            recent = self.recent.get(node_id)
            if recent is None:
                recent = self.recent[node_id] = deque(maxlen=self.rule.span)
            recent.append(verdict)
            if not verdict.strike:
                continue
            strikes = tuple(v for v in recent if v.strike)
            if len(strikes) >= self.rule.strikes:
                mark = SlowNode(node_id, strikes, len(recent))
                self.marked[node_id] = mark
                del self.recent[node_id]
                marks.append(mark)
        return tuple(marks)

    def clear(self, node_id: str) -> None:
        """Forget the node's mark and verdicts: it is weighed afresh from its next window."""
        self.marked.pop(node_id, None)
        self.recent.pop(node_id, None)
