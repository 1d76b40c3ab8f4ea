"""Multi-tenancy metrics of a simulation: shares against entitlement over time, Jain's
fairness index among backlogged queues, and how long a queue below its nominal quota
waits to get it back.

Definitions (docs/simulator.md):

* A queue's *share* at an instant is the GPUs its live attempts hold (a gang being
  preempted still holds them) divided by its nominal GPU quota, its *entitlement*.
  Queues without a quota, or with a quota of 0, have no share.
* A queue is *backlogged* while it has pending jobs. Jain's index over the shares
  x_1..x_n of the backlogged queues is (sum x)^2 / (n * sum x^2): 1 when all equal, 1/n
  when one queue has everything. It is averaged over the time during which at least
  two queues with an entitlement are backlogged (and not all at share 0).
* A queue is *starved* while one of its pending gangs would fit within its nominal
  quota (usage + the gang's GPUs <= nominal). A starved episode lasts from the instant
  that becomes true until it is false again; the quota-back time is its length.
* An episode is *reclaimable* when, at some instant of it, the other queues of its
  cohort borrowed at least the GPUs of that gang: reclaim alone could have ended it. The
  others wait for running gangs to end (a whole-rack gang when less than a rack is
  borrowed; a gang of 8 GPUs on one host when 4 are borrowed and the free GPUs are
  scattered) and no victim choice can shorten them. Both are reported.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from synapse_ha.core.cluster_config import Queue

MS_PER_HOUR = 3_600_000


def jain(values: Sequence[float]) -> float | None:
    """Jain's fairness index of ``values`` (None for none, or when all are 0)."""
    if not values:
        return None
    total = sum(values)
    squares = sum(v * v for v in values)
    if squares == 0:
        return None
    return total * total / (len(values) * squares)


@dataclass(frozen=True, slots=True)
class Loss:
    """One preempted gang, when its members stopped: its GPUs and the run time it lost
    (``lost_ms``: since its attempt's checkpoint mark, or since its bind without one);
    the work lost is their product. ``ran_ms``: its whole run since its bind, what it
    would have lost without marks (``lost_ms`` when not given)."""

    gpus: int
    lost_ms: int
    ran_ms: int | None = None

    @property
    def gpu_hours(self) -> float:
        return self.gpus * self.lost_ms / MS_PER_HOUR

    @property
    def gpu_hours_since_bind(self) -> float:
        ran = self.lost_ms if self.ran_ms is None else self.ran_ms
        return self.gpus * ran / MS_PER_HOUR


def gpu_hours_lost(losses: Iterable[Loss]) -> float:
    """GPU-hours of work thrown away by preemption: GPUs x run time since each victim's
    checkpoint mark (or its bind), to when it stopped."""
    return sum(loss.gpu_hours for loss in losses)


def summary(values: Sequence[float]) -> dict[str, float]:
    """n, mean, p95 and max of ``values`` (zeros when empty)."""
    if not values:
        return {"n": 0, "mean": 0.0, "p95": 0.0, "max": 0.0}
    ordered = sorted(values)
    return {
        "n": len(values),
        "mean": round(statistics.fmean(values), 1),
        "p95": round(ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))], 1),
        "max": round(ordered[-1], 1),
    }


@dataclass(slots=True)
class TenancyMeter:
    """Accumulates the shares, Jain's index and starved episodes of the queues with a
    nominal GPU quota. Call :meth:`observe` after each instant of the simulation with
    the state the cluster then holds until the next call."""

    queues: Sequence[Queue]
    series_every_ms: int = 60_000
    _nominal: dict[str, int] = field(default_factory=dict)
    _last_ms: int | None = None
    _usage: dict[str, int] = field(default_factory=dict)
    _backlogged: frozenset[str] = frozenset()
    _share_area: dict[str, float] = field(default_factory=dict)
    _backlogged_ms: dict[str, int] = field(default_factory=dict)
    _backlogged_share_area: dict[str, float] = field(default_factory=dict)
    _jain_area: float = 0.0
    _jain_ms: int = 0
    _starved_since: dict[str, int] = field(default_factory=dict)
    episodes: dict[str, list[int]] = field(default_factory=dict)  # queue -> lengths, ms
    reclaimable: dict[str, list[int]] = field(default_factory=dict)  # those reclaim could end
    _reclaimable_now: set[str] = field(default_factory=set)  # open episodes reclaim could end
    series: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    _next_sample_ms: int = 0
    _first_ms: int = 0

    def __post_init__(self) -> None:
        self._nominal = {q.name: q.gpu for q in self.queues if q.gpu}
        for name in self._nominal:
            self._share_area[name] = 0.0
            self._backlogged_ms[name] = 0
            self._backlogged_share_area[name] = 0.0
            self.episodes[name] = []
            self.reclaimable[name] = []
            self.series[name] = []

    def share(self, queue: str, usage: int) -> float:
        return usage / self._nominal[queue]

    def observe(
        self,
        now_ms: int,
        usage: Mapping[str, int],
        backlogged: Iterable[str],
        starved: Iterable[str],
        reclaimable: Iterable[str] = (),
    ) -> None:
        """The cluster at ``now_ms``: GPUs held per queue, the queues with pending jobs,
        the starved queues and those of them reclaim could serve (see the module
        docstring)."""
        if self._last_ms is None:
            self._first_ms = now_ms
            self._next_sample_ms = now_ms
        else:
            self._close(now_ms)
        self._last_ms = now_ms
        self._usage = {q: usage.get(q, 0) for q in self._nominal}
        self._backlogged = frozenset(q for q in backlogged if q in self._nominal)
        now_starved = {q for q in starved if q in self._nominal}
        for q in list(self._starved_since):
            if q not in now_starved:
                self._end_episode(q, now_ms)
        for q in now_starved:
            self._starved_since.setdefault(q, now_ms)
        self._reclaimable_now.update(q for q in reclaimable if q in now_starved)
        if now_ms >= self._next_sample_ms:
            for q in self._nominal:
                self.series[q].append((now_ms / MS_PER_HOUR, self.share(q, self._usage[q])))
            self._next_sample_ms = now_ms + self.series_every_ms

    def _end_episode(self, q: str, now_ms: int) -> None:
        length = now_ms - self._starved_since.pop(q)
        self.episodes[q].append(length)
        if q in self._reclaimable_now:
            self._reclaimable_now.discard(q)
            self.reclaimable[q].append(length)

    def _close(self, now_ms: int) -> None:
        assert self._last_ms is not None
        dt = now_ms - self._last_ms
        if dt <= 0:
            return
        shares = {q: self.share(q, u) for q, u in self._usage.items()}
        for q, s in shares.items():
            self._share_area[q] += s * dt
        for q in self._backlogged:
            self._backlogged_ms[q] += dt
            self._backlogged_share_area[q] += shares[q] * dt
        if len(self._backlogged) >= 2:
            index = jain([shares[q] for q in sorted(self._backlogged)])
            if index is not None:
                self._jain_area += index * dt
                self._jain_ms += dt

    def finish(self, now_ms: int) -> dict[str, Any]:
        """The metrics; episodes still open at ``now_ms`` end there."""
        if self._last_ms is not None:
            self._close(now_ms)
        for q in sorted(self._starved_since):
            self._end_episode(q, now_ms)
        span = max(now_ms - self._first_ms, 1)
        per_queue = {}
        for q, nominal in sorted(self._nominal.items()):
            backlogged = self._backlogged_ms[q]
            per_queue[q] = {
                "nominal_gpus": nominal,
                "mean_share": round(self._share_area[q] / span, 4),
                "mean_share_while_backlogged": (
                    round(self._backlogged_share_area[q] / backlogged, 4) if backlogged else None
                ),
                "backlogged_h": round(backlogged / MS_PER_HOUR, 3),
                "quota_back_s": summary([e / 1000 for e in self.episodes[q]]),
                "quota_back_reclaimable_s": summary([e / 1000 for e in self.reclaimable[q]]),
            }
        every = [e / 1000 for q in sorted(self.episodes) for e in self.episodes[q]]
        served = [e / 1000 for q in sorted(self.reclaimable) for e in self.reclaimable[q]]
        return {
            "jain_backlogged": round(self._jain_area / self._jain_ms, 4) if self._jain_ms else None,
            "jain_backlogged_h": round(self._jain_ms / MS_PER_HOUR, 3),
            "quota_back_s": summary(every),
            "quota_back_reclaimable_s": summary(served),
            "queues": per_queue,
        }
