"""Slow nodes in the simulator: nodes that turn slow at a rate, gangs whose members
report their pace every window with realistic noise, and the detector
(:mod:`synapse_ha.core.health.slowness`) run on it; the figures its target is judged on.

The model (:class:`SlowNodeModel`). Each node turns slow as a Poisson process of
``per_1000_node_days``; a slow node's own time per step is ``1 + slowdown`` times its
healthy one (``slowdown`` drawn uniformly between ``slowdown_min`` and ``slowdown_max``,
20 % to 50 % by default), in every window or, for a flapping node, in a share ``duty`` of
them, until it is marked and repaired (``repair_ms`` after its mark; it is then healthy).
A node that turns slow while marked is being repaired: that onset is dropped.

The noise (:class:`PaceNoise`), what a healthy member's window median varies with:

* a lasting factor per node (log-normal, ``node_sigma`` 2 %): GPUs of one model are not
  equally fast (Sinha et al., SC '22, measured an 8 % spread across a cluster on average);
* a factor per member and window (log-normal, ``window_sigma`` 3 %): the data of the
  window, the kernels' own jitter, what the node's other processes do;
* blips: short fail-slows (a throttle, a noisy neighbour, a congested link: Wu et al.,
  "Falcon", saw them last from under a minute to hours) at ``blips_per_node_day``, each
  lasting between ``blip_min_ms`` and ``blip_max_ms`` (log-uniform) and ``blip_slowdown_*``
  slower. A window's median moves only when a blip covers more than half of it; it then
  takes the blip's slowdown. Blips longer than about two windows are slow spells, not
  noise: the detector is meant to mark those.

The cluster (:func:`evaluate`). The multi-node gangs of :func:`synapse_ha.sim.training.
training` (a member is a whole 8-GPU host; one-host runs give no evidence and are left
out) are placed first come, first served on free unmarked nodes drawn at random (the
detector does not care which: the real planner's rack packing changes who the peers are,
not how many). A gang trains in lockstep: each window it progresses at the pace of its
slowest member, so a slow member costs every GPU of the gang. Every window of every
running gang goes to the detector; a node it marks takes no new gang until repaired (the
gang it is in keeps it: replacing it is ``on_node_failure: replace``'s business, and
``gpu_hours_lost_after_the_mark`` is what such gangs lose meanwhile).

Each :func:`evaluate` runs twice on the same slow spells and blips: with the detector,
and without it (the GPU-hours slow nodes cost when nobody finds them).
"""

from __future__ import annotations

import bisect
import math
import random
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from synapse_ha.core.health.slowness import GangWindow, MemberPace, SlownessLedger, SlownessRule
from synapse_ha.sim.training import training

MS_PER_DAY = 86_400_000
MS_PER_HOUR = 3_600_000
WINDOW_MS = 900_000  # a window: at least as long as the longest blip it should ignore
RECALL_TARGET = 0.90  # of slow nodes (>= 20 % slower) marked within TARGET_GANGS gangs
TARGET_GANGS = 3
FALSE_MARK_TARGET = 0.01  # of healthy nodes ever marked
TARGET_SLOWDOWN = 0.20
MAX_RATE = 100_000.0  # per 1,000 node-days


@dataclass(frozen=True, slots=True)
class SlowNodeModel:
    """How nodes turn slow, how much, and how soon a marked node is back."""

    per_1000_node_days: float = 20.0
    slowdown_min: float = 0.2
    slowdown_max: float = 0.5
    duty: float = 1.0  # share of windows a slow node is slow in (below 1: it flaps)
    repair_ms: int = 24 * MS_PER_HOUR
    seed: int = 1

    def check(self) -> None:
        """Raise ValueError naming the first field out of its range."""
        rate = self.per_1000_node_days
        if not (math.isfinite(rate) and 0 <= rate <= MAX_RATE):
            raise ValueError(f"per_1000_node_days: a number between 0 and {MAX_RATE:g}, got {rate}")
        if not 0 <= self.slowdown_min <= self.slowdown_max <= 10:
            raise ValueError(
                f"slowdown_min, slowdown_max: 0 <= min <= max <= 10, got "
                f"{self.slowdown_min} and {self.slowdown_max}"
            )
        if not 0 < self.duty <= 1:
            raise ValueError(f"duty: more than 0 and at most 1, got {self.duty}")
        if not 1 <= self.repair_ms <= 366 * MS_PER_DAY:
            raise ValueError(
                f"repair_ms: between 1 and {366 * MS_PER_DAY} ms, got {self.repair_ms}"
            )

    def describe(self) -> dict[str, Any]:
        return {
            "slow_per_1000_node_days": self.per_1000_node_days,
            "slowdown": [self.slowdown_min, self.slowdown_max],
            "duty": self.duty,
            "repair_hours": self.repair_ms / MS_PER_HOUR,
            "seed": self.seed,
        }


@dataclass(frozen=True, slots=True)
class PaceNoise:
    """What a healthy member's window median varies with (see the module's docstring)."""

    node_sigma: float = 0.02
    window_sigma: float = 0.03
    blips_per_node_day: float = 4.0
    blip_min_ms: int = 30_000
    blip_max_ms: int = 15 * 60_000
    blip_slowdown_min: float = 0.1
    blip_slowdown_max: float = 0.5

    def check(self) -> None:
        """Raise ValueError naming the first field out of its range."""
        for name, value in (("node_sigma", self.node_sigma), ("window_sigma", self.window_sigma)):
            if not 0 <= value <= 1:
                raise ValueError(f"{name}: between 0 and 1, got {value}")
        if not 0 <= self.blips_per_node_day <= MAX_RATE:
            raise ValueError(
                f"blips_per_node_day: between 0 and {MAX_RATE:g}, got {self.blips_per_node_day}"
            )
        if not 1 <= self.blip_min_ms <= self.blip_max_ms <= MS_PER_DAY:
            raise ValueError(
                f"blip_min_ms, blip_max_ms: 1 <= min <= max <= {MS_PER_DAY}, got "
                f"{self.blip_min_ms} and {self.blip_max_ms}"
            )
        if not 0 <= self.blip_slowdown_min <= self.blip_slowdown_max <= 10:
            raise ValueError(
                f"blip_slowdown_min, blip_slowdown_max: 0 <= min <= max <= 10, got "
                f"{self.blip_slowdown_min} and {self.blip_slowdown_max}"
            )

    def describe(self) -> dict[str, Any]:
        return {
            "node_sigma": self.node_sigma,
            "window_sigma": self.window_sigma,
            "blips_per_node_day": self.blips_per_node_day,
            "blip_minutes": [self.blip_min_ms / 60_000, self.blip_max_ms / 60_000],
            "blip_slowdown": [self.blip_slowdown_min, self.blip_slowdown_max],
        }


@dataclass(frozen=True, slots=True, order=True)
class SlowSpell:
    """From ``from_ms`` on, ``node_id``'s own time per step is ``1 + slowdown`` times
    its healthy one (until a repair ends it)."""

    from_ms: int
    node_id: str
    slowdown: float


def draw_slow_spells(
    node_ids: Iterable[str], model: SlowNodeModel, horizon_ms: int
) -> tuple[SlowSpell, ...]:
    """Every onset of slowness before ``horizon_ms``, by time then node: a Poisson process
    per node (its own seeded stream: the same node gets the same onsets whatever the other
    nodes). A caller decides what an onset on an already slow node means."""
    model.check()
    rate_per_ms = model.per_1000_node_days / 1000 / MS_PER_DAY
    spells: list[SlowSpell] = []
    for node_id in sorted(node_ids):
        if rate_per_ms <= 0:
            break
        rng = random.Random(f"slow-nodes:{model.seed}:{node_id}")
        at = rng.expovariate(rate_per_ms)
        while at < horizon_ms:
            slowdown = rng.uniform(model.slowdown_min, model.slowdown_max)
            spells.append(SlowSpell(int(at), node_id, round(slowdown, 4)))
            at += rng.expovariate(rate_per_ms)
    return tuple(sorted(spells))


def gang_pace(slowdowns: Mapping[str, float], node_ids: Iterable[str]) -> float:
    """How many times longer a lockstep gang on ``node_ids`` takes per step than on
    healthy nodes: its slowest member's factor (``slowdowns``: node -> slowdown, absent
    for a healthy node)."""
    return 1.0 + max((slowdowns.get(n, 0.0) for n in node_ids), default=0.0)


def draw_blips(
    node_ids: Iterable[str], noise: PaceNoise, horizon_ms: int, seed: int
) -> dict[str, list[tuple[int, int, float]]]:
    """Each node's blips before ``horizon_ms``: ``(start, end, slowdown)`` by start."""
    noise.check()
    rate_per_ms = noise.blips_per_node_day / MS_PER_DAY
    low, high = math.log(noise.blip_min_ms), math.log(noise.blip_max_ms)
    out: dict[str, list[tuple[int, int, float]]] = {}
    for node_id in sorted(node_ids):
        rng = random.Random(f"slow-nodes-blips:{seed}:{node_id}")
        blips = out[node_id] = []
        at = rng.expovariate(rate_per_ms) if rate_per_ms > 0 else horizon_ms
        while at < horizon_ms:
            length = math.exp(rng.uniform(low, high))
            slowdown = rng.uniform(noise.blip_slowdown_min, noise.blip_slowdown_max)
            blips.append((int(at), int(at + length), slowdown))
            at += rng.expovariate(rate_per_ms)
    return out


def blip_in_window(
    blips: list[tuple[int, int, float]], start: int, window_ms: int, longest_ms: int
) -> float:
    """The slowdown blips give a window's median from ``start``: the largest of those
    covering it, when together they cover more than half of it; 0 otherwise."""
    if not blips:
        return 0.0
    end = start + window_ms
    first = bisect.bisect_left(blips, (start - longest_ms,))
    covered, worst = 0, 0.0
    for i in range(first, len(blips)):
        b_start, b_end, slowdown = blips[i]
        if b_start >= end:
            break
        overlap = min(b_end, end) - max(b_start, start)
        if overlap > 0:
            covered += overlap
            worst = max(worst, slowdown)
    return worst if 2 * covered > window_ms else 0.0


@dataclass(slots=True)
class SpellTally:
    """What became of one slow spell: the gangs it was judged in (in order), its judged
    windows, and when and after how many gangs it was marked."""

    spell: SlowSpell
    gangs: list[str] = field(default_factory=list)
    windows: int = 0
    marked_ms: int | None = None
    gangs_at_mark: int | None = None
    windows_at_mark: int | None = None


@dataclass(slots=True)
class _Gang:
    job_id: str
    nodes: tuple[str, ...]
    base_us: float
    work_left_ms: float
    windows: int = 0


@dataclass(slots=True)
class SlowNodeRun:
    """One run's outcome: every spell's tally, the false marks ``(at_ms, node)``, the
    nodes slow at any time, and the GPU-hours run and lost to slow members."""

    nodes: int
    days: float
    detect: bool
    tallies: list[SpellTally] = field(default_factory=list)
    false_marks: list[tuple[int, str]] = field(default_factory=list)
    ever_slow: set[str] = field(default_factory=set)
    gang_windows: int = 0
    gangs_run: int = 0
    gpu_ms: float = 0.0
    lost_gpu_ms: float = 0.0
    lost_after_mark_gpu_ms: float = 0.0  # of it, gangs that kept a marked member


class _Cluster:
    """The cluster stepped one window at a time (see the module's docstring)."""

    def __init__(
        self,
        nodes: int,
        days: float,
        model: SlowNodeModel,
        noise: PaceNoise,
        rule: SlownessRule | None,
        window_ms: int,
    ) -> None:
        seed = model.seed
        workload = training(seed=seed, nodes=nodes, days=days, load=0.9)
        self.arrivals = [j for j in workload.jobs if j.spec.replicas >= 2]
        self.node_ids = [n.node_id for n in workload.nodes]
        self.horizon = int(days * MS_PER_DAY)
        self.window_ms = window_ms
        self.model, self.noise = model, noise
        self.ledger = SlownessLedger(rule) if rule is not None else None
        self.run = SlowNodeRun(nodes, days, rule is not None)
        factors = random.Random(f"slow-nodes-factors:{seed}")
        self.factor = {n: factors.lognormvariate(0, noise.node_sigma) for n in self.node_ids}
        self.onsets = list(draw_slow_spells(self.node_ids, model, self.horizon))
        self.blips = draw_blips(self.node_ids, noise, self.horizon, seed)
        self.jitter = random.Random(f"slow-nodes-jitter:{seed}")
        self.placement = random.Random(f"slow-nodes-placement:{seed}")
        self.slow: dict[str, SpellTally] = {}
        self.repair_at: dict[str, int] = {}
        self.free = set(self.node_ids)
        self.queue: list[tuple[str, int, float]] = []  # (job, members, run ms) waiting
        self.running: list[_Gang] = []

    def step(self, now: int) -> None:
        self._repair(now)
        while self.onsets and self.onsets[0].from_ms <= now:
            spell = self.onsets.pop(0)
            if spell.node_id not in self.slow and spell.node_id not in self.repair_at:
                self.slow[spell.node_id] = tally = SpellTally(spell)
                self.run.tallies.append(tally)
                self.run.ever_slow.add(spell.node_id)
        while self.arrivals and self.arrivals[0].arrival_ms <= now:
            job = self.arrivals.pop(0)
            self.queue.append((job.spec.name, job.spec.replicas, job.duration_ms))
        self._place()
        for gang in list(self.running):
            self._run_window(gang, now)

    def _repair(self, now: int) -> None:
        for node_id in sorted(n for n, at in self.repair_at.items() if at <= now):
            del self.repair_at[node_id]
            self.slow.pop(node_id, None)
            if self.ledger is not None:
                self.ledger.clear(node_id)
            if not any(node_id in g.nodes for g in self.running):
                self.free.add(node_id)

    def _place(self) -> None:
        """First come, first served: the head of the queue waits for enough free nodes."""
        while self.queue and self.queue[0][1] <= len(self.free):
            job_id, members, run_ms = self.queue.pop(0)
            nodes = tuple(self.placement.sample(sorted(self.free), members))
            self.free.difference_update(nodes)
            base_us = self.placement.uniform(200_000, 2_000_000)
            self.running.append(_Gang(job_id, nodes, base_us, float(run_ms)))
            self.run.gangs_run += 1

    def _run_window(self, gang: _Gang, now: int) -> None:
        paces, worst, worst_marked = [], 0.0, False
        longest = self.noise.blip_max_ms
        for rank, node_id in enumerate(gang.nodes):
            factor = self.factor[node_id] * self.jitter.lognormvariate(0, self.noise.window_sigma)
            factor *= 1 + blip_in_window(self.blips[node_id], now, self.window_ms, longest)
            tally = self.slow.get(node_id)
            if tally is not None and (
                self.model.duty >= 1 or self.jitter.random() < self.model.duty
            ):
                factor *= 1 + tally.spell.slowdown
                if tally.spell.slowdown > worst:
                    worst, worst_marked = tally.spell.slowdown, node_id in self.repair_at
            paces.append(MemberPace(node_id, rank, max(int(gang.base_us * factor), 1)))
        gpus = 8 * len(gang.nodes)
        self.run.gang_windows += 1
        self.run.gpu_ms += gpus * self.window_ms
        lost = gpus * self.window_ms * (1 - 1 / (1 + worst))
        self.run.lost_gpu_ms += lost
        if worst_marked:
            self.run.lost_after_mark_gpu_ms += lost
        gang.work_left_ms -= self.window_ms / (1 + worst)
        self._judge(GangWindow(gang.job_id, gang.windows, tuple(paces)), now)
        gang.windows += 1
        if gang.work_left_ms <= 0:
            self.running.remove(gang)
            self.free.update(n for n in gang.nodes if n not in self.repair_at)

    def _judge(self, window: GangWindow, now: int) -> None:
        for pace in window.members:
            tally = self.slow.get(pace.node_id)
            if tally is not None and pace.node_id not in self.repair_at:
                tally.windows += 1
                if window.job_id not in tally.gangs:
                    tally.gangs.append(window.job_id)
        if self.ledger is None:
            return
        for mark in self.ledger.observe(window):
            node_id = mark.node_id
            self.repair_at[node_id] = now + self.window_ms + self.model.repair_ms
            self.free.discard(node_id)
            tally = self.slow.get(node_id)
            if tally is None:
                self.run.false_marks.append((now, node_id))
            else:
                tally.marked_ms = now + self.window_ms
                tally.gangs_at_mark = len(tally.gangs)
                tally.windows_at_mark = tally.windows


def evaluate_once(
    nodes: int,
    days: float,
    model: SlowNodeModel,
    noise: PaceNoise,
    rule: SlownessRule | None,
    window_ms: int = WINDOW_MS,
) -> SlowNodeRun:
    """One run of ``days`` on ``nodes`` 8-GPU hosts; ``rule`` None runs without the
    detector. Deterministic for a given model seed."""
    model.check()
    noise.check()
    if not 1 <= window_ms <= MS_PER_DAY:
        raise ValueError(f"window_ms: between 1 and {MS_PER_DAY}, got {window_ms}")
    cluster = _Cluster(nodes, days, model, noise, rule, window_ms)
    for now in range(0, cluster.horizon, window_ms):
        cluster.step(now)
    return cluster.run


def figures(runs: Sequence[SlowNodeRun], baselines: Sequence[SlowNodeRun] = ()) -> dict[str, Any]:
    """The figures of ``runs`` pooled (seeds side by side), as JSON-ready data. The
    target's two shares: of the slow spells at least :data:`TARGET_SLOWDOWN` slower that
    were judged in at least 3 windows (fewer cannot be marked by any rule of 3), those
    marked within :data:`TARGET_GANGS` gangs; of the nodes never slow, those ever marked.
    ``baselines``: the same runs without the detector, for what slow nodes cost then."""
    tallies = [t for run in runs for t in run.tallies]
    counted = [
        t for t in tallies if t.spell.slowdown >= TARGET_SLOWDOWN and t.windows >= TARGET_GANGS
    ]
    within = [t for t in counted if t.gangs_at_mark is not None and t.gangs_at_mark <= TARGET_GANGS]
    marked = [t for t in tallies if t.marked_ms is not None]
    healthy = sum(run.nodes - len(run.ever_slow) for run in runs)
    healthy_marked = sum(
        len({n for _, n in run.false_marks if n not in run.ever_slow}) for run in runs
    )
    gangs_at_mark: dict[str, int] = {}
    for t in marked:
        key = str(t.gangs_at_mark) if (t.gangs_at_mark or 0) <= TARGET_GANGS else "more"
        gangs_at_mark[key] = gangs_at_mark.get(key, 0) + 1
    hours = sorted(((t.marked_ms or 0) - t.spell.from_ms) / MS_PER_HOUR for t in marked)
    out: dict[str, Any] = {
        "slow_spells": len(tallies),
        "slow_spells_counted": len(counted),
        "marked_within_3_gangs": len(within),
        "recall_within_3_gangs": _share(len(within), len(counted)),
        "slow_spells_marked": len(marked),
        "gangs_at_mark": dict(sorted(gangs_at_mark.items())),
        "windows_at_mark_p50": _quantile(sorted(t.windows_at_mark or 0 for t in marked), 0.5),
        "hours_onset_to_mark_p50": _quantile(hours, 0.5),
        "hours_onset_to_mark_p90": _quantile(hours, 0.9),
        "healthy_nodes": healthy,
        "healthy_nodes_marked": healthy_marked,
        "healthy_marked_share": _share(healthy_marked, healthy),
        "false_marks": sum(len(run.false_marks) for run in runs),
        "gangs_run": sum(run.gangs_run for run in runs),
        "gang_windows": sum(run.gang_windows for run in runs),
        "gpu_hours_run": round(sum(run.gpu_ms for run in runs) / MS_PER_HOUR, 1),
        "gpu_hours_lost_to_slow_nodes": _hours(runs),
        "gpu_hours_lost_after_the_mark": round(
            sum(run.lost_after_mark_gpu_ms for run in runs) / MS_PER_HOUR, 1
        ),
    }
    if baselines:
        out["gpu_hours_lost_without_detector"] = _hours(baselines)
    return out


def judge_targets(fig: Mapping[str, Any]) -> dict[str, Any]:
    """Met or missed, with the figure each target reads."""
    recall, healthy = fig["recall_within_3_gangs"], fig["healthy_marked_share"]
    return {
        "recall_within_3_gangs": {
            "target": RECALL_TARGET,
            "got": recall,
            "met": recall is not None and recall >= RECALL_TARGET,
        },
        "healthy_marked_share": {
            "target": FALSE_MARK_TARGET,
            "got": healthy,
            "met": healthy is not None and healthy <= FALSE_MARK_TARGET,
        },
    }


def evaluate(
    nodes: int,
    days: float,
    model: SlowNodeModel,
    noise: PaceNoise | None = None,
    rule: SlownessRule | None = None,
    window_ms: int = WINDOW_MS,
    seeds: Sequence[int] = (1,),
) -> dict[str, Any]:
    """Per seed (the model's seed replaced), the run with the detector (``rule``, default
    :class:`SlownessRule`) and without it on the same spells and blips; the figures
    pooled over the seeds, the targets, and the wall time."""
    noise = noise or PaceNoise()
    rule = rule or SlownessRule()
    started = time.perf_counter()
    runs, baselines = [], []
    for seed in seeds:
        seeded = replace(model, seed=seed)
        runs.append(evaluate_once(nodes, days, seeded, noise, rule, window_ms))
        baselines.append(evaluate_once(nodes, days, seeded, noise, None, window_ms))
    fig = figures(runs, baselines)
    return {
        "figures": fig,
        "targets": judge_targets(fig),
        "wall_s": round(time.perf_counter() - started, 2),
    }


def _hours(runs: Sequence[SlowNodeRun]) -> float:
    return round(sum(run.lost_gpu_ms for run in runs) / MS_PER_HOUR, 1)


def _share(part: int, whole: int) -> float | None:
    return round(part / whole, 4) if whole else None


def _quantile(values: list[float] | list[int], q: float) -> float | None:
    if not values:
        return None
    return round(float(values[min(int(q * len(values)), len(values) - 1)]), 2)
