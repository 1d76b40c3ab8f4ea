"""How long a job is expected to run: the estimate reservations and backfill use.

A job's estimate is, in order:

* its ``time_limit``, when it has one (it is stopped then: a limit, not a guess);
* in a queue with ``learned_estimates``, the 90th percentile (nearest rank) of the run
  times of the finished jobs of the same owner, queue and name, when there are at least
  :data:`MIN_RUNS` of them; else of the same owner and queue, with as many;
* its queue's ``default_time_limit_ms`` (Slurm's DefaultTime), when not 0;
* none: its end is unknown.

An estimate other than a time limit is never a limit: a job that runs past it is not
stopped for it, it only loses backfill trust. Its end is unknown from then on, as a job's
without an estimate (:func:`estimated_end`), so a reservation no longer counts on it.

A run time is the time from an attempt's start (its bind when no member reported
running) to its end, of the last attempt of a job that ended SUCCEEDED or FAILED; a
cancelled job's run was cut short by a person and says nothing of its length.

Pure and deterministic. The learned percentiles come from one scan of the state's jobs,
made by :class:`Estimates` when first asked and kept by it: whoever holds one holds it
for one state (a scheduling pass, an explanation), so the scan is off every path that
does not reserve or explain.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TypeVar

from synapse_ha.core.cluster_config import MAX_DEFAULT_TIME_LIMIT_MS, Queue
from synapse_ha.core.model import ClusterState, Job, JobState

MIN_RUNS = 5  # the fewest finished runs a learned estimate is made from
PERCENTILE = 90

_K = TypeVar("_K", tuple[str, str, str], tuple[str, str])

# The finished states whose last attempt's length is a sample.
_SAMPLED = frozenset({JobState.SUCCEEDED, JobState.FAILED})


class EstimateSource(enum.StrEnum):
    TIME_LIMIT = "time_limit"
    LEARNED_NAME = "learned_name"  # runs of the same owner, queue and name
    LEARNED_QUEUE = "learned_queue"  # runs of the same owner and queue
    QUEUE_DEFAULT = "queue_default"


@dataclass(frozen=True, slots=True)
class Estimate:
    """How long a job is expected to run, and from what: for a learned estimate, how
    many runs it was made from."""

    ms: int
    source: EstimateSource
    runs: int = 0

    @property
    def trusted_past_end(self) -> bool:
        """Whether the end still holds once passed: only a time limit's (the job is
        being stopped)."""
        return self.source is EstimateSource.TIME_LIMIT


def estimate_problems(queue: Queue) -> list[tuple[str, str]]:
    """``(field, rule)`` for every rule ``queue``'s estimate fields break."""
    if not 0 <= queue.default_time_limit_ms <= MAX_DEFAULT_TIME_LIMIT_MS:
        return [("default_time_limit_ms", "must be between 0 (none) and 366 days")]
    return []


def percentile(values: list[int], pct: int = PERCENTILE) -> int:
    """The ``pct``-th percentile of ``values`` by nearest rank (a value of the list);
    ``values`` must not be empty."""
    ordered = sorted(values)
    rank = (pct * len(ordered) + 99) // 100  # ceil(pct / 100 * n), integers only
    return ordered[max(rank, 1) - 1]


def run_ms(job: Job) -> int | None:
    """The run time of ``job``'s last attempt, when it is a sample (module doc)."""
    attempt = job.attempt
    if job.state not in _SAMPLED or attempt is None or attempt.ended_at_ms is None:
        return None
    start = attempt.bound_at_ms if attempt.started_at_ms is None else attempt.started_at_ms
    return max(attempt.ended_at_ms - start, 0)


@dataclass(frozen=True, slots=True)
class Learned:
    """The learned estimates of one state: per (owner, queue, name) and per (owner,
    queue), the percentile and the number of runs, for keys with at least
    :data:`MIN_RUNS` runs."""

    by_name: dict[tuple[str, str, str], tuple[int, int]]
    by_queue: dict[tuple[str, str], tuple[int, int]]

    @staticmethod
    def of(state: ClusterState, queues: frozenset[str] | None = None) -> Learned:
        """From one scan of ``state``'s jobs; only of ``queues`` when given."""
        by_name: dict[tuple[str, str, str], list[int]] = {}
        by_queue: dict[tuple[str, str], list[int]] = {}
        for job in state.jobs.values():
            queue = job.spec.queue
            if queues is not None and queue not in queues:
                continue
            ms = run_ms(job)
            if ms is None:
                continue
            by_name.setdefault((job.owner, queue, job.spec.name), []).append(ms)
            by_queue.setdefault((job.owner, queue), []).append(ms)
        return Learned(_summed(by_name), _summed(by_queue))

    def estimate(self, owner: str, queue: str, name: str) -> Estimate | None:
        hit = self.by_name.get((owner, queue, name))
        if hit is not None:
            return Estimate(hit[0], EstimateSource.LEARNED_NAME, hit[1])
        hit = self.by_queue.get((owner, queue))
        if hit is not None:
            return Estimate(hit[0], EstimateSource.LEARNED_QUEUE, hit[1])
        return None


def _summed(runs: dict[_K, list[int]]) -> dict[_K, tuple[int, int]]:
    return {k: (percentile(v), len(v)) for k, v in sorted(runs.items()) if len(v) >= MIN_RUNS}


class Estimates:
    """The estimates of the jobs of one state. The learned percentiles are worked out
    once, when a job of a queue with ``learned_estimates`` is first asked about, for
    those queues only; the holder keeps this object no longer than the state (the
    history it read) stays the same."""

    __slots__ = ("_learned", "state")

    def __init__(self, state: ClusterState) -> None:
        self.state = state
        self._learned: Learned | None = None

    def learned(self) -> Learned:
        if self._learned is None:
            queues = frozenset(n for n, q in self.state.queues.items() if q.learned_estimates)
            self._learned = Learned.of(self.state, queues)
        return self._learned

    def of(self, job: Job) -> Estimate | None:
        """``job``'s estimate (module doc), or None: its end is unknown."""
        spec = job.spec
        if spec.time_limit_ms > 0:
            return Estimate(spec.time_limit_ms, EstimateSource.TIME_LIMIT)
        queue = self.state.queues.get(spec.queue)
        if queue is None:
            return None
        if queue.learned_estimates:
            learned = self.learned().estimate(job.owner, spec.queue, spec.name)
            if learned is not None:
                return learned
        if queue.default_time_limit_ms > 0:
            return Estimate(queue.default_time_limit_ms, EstimateSource.QUEUE_DEFAULT)
        return None

    def end(self, job: Job) -> int | None:
        """:func:`estimated_end` of ``job``."""
        attempt = job.live_attempt()
        if attempt is None:
            return None
        guess = self.of(job)
        if guess is None:
            return None
        start = attempt.bound_at_ms if attempt.started_at_ms is None else attempt.started_at_ms
        end = start + guess.ms
        if guess.trusted_past_end or end > self.state.last_time_ms:
            return end
        return None  # past its estimate: it runs on, its end unknown


def estimated_end(state: ClusterState, job: Job) -> int | None:
    """When ``job``'s live attempt is expected to end, or None: no live attempt, no
    estimate, or an estimate (other than a time limit) it has run past by the state's
    clock (the newest command's time, so the answer is a function of the state alone)."""
    return Estimates(state).end(job)


def estimate_of(state: ClusterState, job: Job) -> Estimate | None:
    """``job``'s estimate (module doc); a scan of the jobs for a learned one."""
    return Estimates(state).of(job)


def describe(estimate: Estimate, job: Job) -> str:
    """``2h10m (p90 of 12 runs of alice/train in gpu)``: the estimate and its source."""
    spec = job.spec
    if estimate.source is EstimateSource.TIME_LIMIT:
        source = "its time limit"
    elif estimate.source is EstimateSource.QUEUE_DEFAULT:
        source = f"the default time limit of queue {spec.queue}"
    else:
        of = (
            f"{job.owner}/{spec.name}"
            if estimate.source is EstimateSource.LEARNED_NAME
            else job.owner
        )
        source = f"p{PERCENTILE} of {estimate.runs} runs of {of} in {spec.queue}"
    return f"{_duration(estimate.ms)} ({source})"


def _duration(ms: int) -> str:
    """``2h10m``, ``45s``: to the minute from a minute up (estimates are rough)."""
    if ms < 60_000:
        return f"{max(ms // 1000, 1)}s"
    hours, minutes = divmod(ms // 60_000, 60)
    return (f"{hours}h" if hours else "") + (f"{minutes}m" if minutes or not hours else "")
