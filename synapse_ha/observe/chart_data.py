"""The series the dashboard's charts draw, derived from the jobs the API lists (nothing is
stored for them): pure functions of the API's messages and a time.

Each job becomes a :class:`Span` — when it was submitted, its whole gang's GPUs (members
x GPUs per member), the intervals its attempts held them (from the bind to the end, or
to now for a live attempt: the same interval ``synctl usage`` counts), when it first
started (its first bind) and when it finished. A live job the API shows only its current
attempt of is known from that attempt's bind on; what came before is left out rather
than guessed.

:func:`chart_series` cuts a window ending now into buckets of equal length (aligned to
multiples of the bucket, the last one ending at now) and gives, per bucket:

* **GPUs allocated** and **GPUs pending**: the average over the bucket of the GPUs held
  by bound attempts, and of the GPUs jobs waited for (submitted, not finished, and not
  held by an attempt: before the first bind and between attempts);
* **queue wait**, per queue: the mean wait (submission to first bind) of the jobs of
  that queue that started in the bucket, and how many started; None for a bucket in
  which none did.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from synapse_ha.core.cluster_config import DEFAULT_QUEUE
from synapse_ha.core.model import JobState
from synapse_ha.rpc import states
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb

MINUTE_MS = 60_000
HOUR_MS = 60 * MINUTE_MS
# The windows the charts page offers, and the bucket lengths they may be cut into: the
# shortest that gives at most MAX_BUCKETS buckets.
WINDOWS_MS = {"1h": HOUR_MS, "6h": 6 * HOUR_MS, "24h": 24 * HOUR_MS, "7d": 7 * 24 * HOUR_MS}
DEFAULT_WINDOW = "6h"
BUCKETS_MS = tuple(m * MINUTE_MS for m in (1, 2, 5, 10, 15, 30, 60, 120, 180, 360, 720, 1440))
MAX_BUCKETS = 120


@dataclass(frozen=True, slots=True)
class Span:
    """What the charts need of one job (times in ms). ``held``: the ``[from, to)``
    intervals its attempts held ``gpus`` GPUs; ``known_from_ms``: nothing before it is
    known (the submission, or a live job's current attempt's bind when earlier attempts
    are not listed); ``ended_ms``: when it finished (None while live);
    ``started_ms``: its first bind (None: never bound, or not known)."""

    job_id: str
    queue: str
    submitted_ms: int
    gpus: int
    held: tuple[tuple[int, int], ...] = ()
    known_from_ms: int = 0
    ended_ms: int | None = None
    started_ms: int | None = None


@dataclass(frozen=True, slots=True)
class ChartSeries:
    """The charts' data. ``times_ms``: each bucket's start; ``allocated`` and
    ``pending``: average GPUs over each bucket; ``wait_s``: per queue (by name), the
    mean wait in seconds of the jobs started in each bucket (None: none started);
    ``started``: per queue, how many started in each bucket."""

    times_ms: list[int]
    bucket_ms: int
    allocated: list[float]
    pending: list[float]
    wait_s: dict[str, list[float | None]] = field(default_factory=dict)
    started: dict[str, list[int]] = field(default_factory=dict)

    def document(self) -> dict[str, object]:
        """The series as JSON-ready values (what the page's script draws)."""
        return {
            "times_ms": self.times_ms,
            "bucket_ms": self.bucket_ms,
            "allocated": self.allocated,
            "pending": self.pending,
            "wait_s": self.wait_s,
            "started": self.started,
        }


def bucket_for(window_ms: int) -> int:
    """The shortest bucket of :data:`BUCKETS_MS` that cuts ``window_ms`` into at most
    :data:`MAX_BUCKETS` buckets (the longest when none does)."""
    for bucket in BUCKETS_MS:
        if window_ms <= bucket * MAX_BUCKETS:
            return bucket
    return BUCKETS_MS[-1]


def _gang_gpus(spec: pb.JobSpec) -> int:
    return max(spec.replicas, 0) * max(spec.resources.gpu, 0)


def span_of_job(job: pb.Job, now_ms: int) -> Span:
    """A job the API lists as live (pending, scheduled or running)."""
    gpus = _gang_gpus(job.spec)
    queue = job.spec.queue or DEFAULT_QUEUE
    if not job.HasField("attempt") or not job.attempt.bound_at_ms:
        return Span(job.job_id, queue, job.submitted_at_ms, gpus, (), job.submitted_at_ms)
    a = job.attempt
    holding = states.shown_job_state(job) in (JobState.SCHEDULED, JobState.RUNNING)
    end = now_ms if holding else a.ended_at_ms or a.bound_at_ms
    first = a.number <= 1
    return Span(
        job_id=job.job_id,
        queue=queue,
        submitted_ms=job.submitted_at_ms,
        gpus=gpus,
        held=((a.bound_at_ms, max(end, a.bound_at_ms)),),
        known_from_ms=job.submitted_at_ms if first else a.bound_at_ms,
        started_ms=a.bound_at_ms if first else None,
    )


def span_of_finished(job: pb.HistoryJob) -> Span:
    """A finished job from the history: every attempt it made."""
    gpus = job.gpus_per_attempt or _gang_gpus(job.spec)
    held = tuple(
        sorted(
            (a.bound_at_ms, max(a.ended_at_ms, a.bound_at_ms))
            for a in job.attempt_list
            if a.bound_at_ms
        )
    )
    return Span(
        job_id=job.job_id,
        queue=job.queue or DEFAULT_QUEUE,
        submitted_ms=job.submitted_at_ms,
        gpus=gpus,
        held=held,
        known_from_ms=job.submitted_at_ms,
        ended_ms=job.finished_at_ms or None,
        started_ms=job.started_at_ms or None,
    )


def spans_of(live: Iterable[pb.Job], finished: Iterable[pb.HistoryJob], now_ms: int) -> list[Span]:
    """Every job once: a job listed both as live and as finished (it finished between
    the two calls) counts as finished."""
    done = [span_of_finished(j) for j in finished]
    seen = {s.job_id for s in done}
    return done + [span_of_job(j, now_ms) for j in live if j.job_id not in seen]


def _pending(span: Span, now_ms: int) -> list[tuple[int, int]]:
    """The intervals ``span`` waited: from what is known of it to its end, less what
    its attempts held."""
    out = []
    at = max(span.submitted_ms, span.known_from_ms)
    end = now_ms if span.ended_ms is None else min(span.ended_ms, now_ms)
    for start, stop in span.held:
        if start > at:
            out.append((at, min(start, end)))
        at = max(at, stop)
    if end > at:
        out.append((at, end))
    return [(a, b) for a, b in out if b > a]


def _spread(totals: list[float], start_ms: int, bucket_ms: int, a: int, b: int, w: int) -> None:
    """Add ``w`` times the length of ``[a, b)`` falling in each bucket to its total."""
    if b <= a or w == 0:
        return
    first = max((a - start_ms) // bucket_ms, 0)
    last = min((b - 1 - start_ms) // bucket_ms, len(totals) - 1)
    for i in range(first, last + 1):
        lo = start_ms + i * bucket_ms
        overlap = min(b, lo + bucket_ms) - max(a, lo)
        if overlap > 0:
            totals[i] += w * overlap


def chart_series(spans: Sequence[Span], now_ms: int, window_ms: int, bucket_ms: int) -> ChartSeries:
    """The charts' series over the window ``window_ms`` ending at ``now_ms`` (see the
    module docstring). Buckets start at multiples of ``bucket_ms``; the first one holds
    ``now_ms - window_ms``, the last one ``now_ms - 1`` and is averaged over the part
    of it up to ``now_ms``."""
    if bucket_ms <= 0 or window_ms <= 0:
        raise ValueError("window_ms and bucket_ms must be positive")
    start = (now_ms - window_ms) // bucket_ms * bucket_ms
    n = max((now_ms - 1 - start) // bucket_ms + 1, 1)
    times = [start + i * bucket_ms for i in range(n)]
    held = [0.0] * n
    waiting = [0.0] * n
    waits: dict[str, list[list[int]]] = {}
    for span in spans:
        for a, b in span.held:
            _spread(held, start, bucket_ms, a, min(b, now_ms), span.gpus)
        for a, b in _pending(span, now_ms):
            _spread(waiting, start, bucket_ms, a, b, span.gpus)
        began = span.started_ms
        if began is not None and start <= began < now_ms:
            per_bucket = waits.setdefault(span.queue, [[] for _ in range(n)])
            per_bucket[(began - start) // bucket_ms].append(max(began - span.submitted_ms, 0))
    lengths = [min(t + bucket_ms, now_ms) - t for t in times]
    return ChartSeries(
        times_ms=times,
        bucket_ms=bucket_ms,
        allocated=[round(total / length, 3) for total, length in zip(held, lengths, strict=True)],
        pending=[round(total / length, 3) for total, length in zip(waiting, lengths, strict=True)],
        wait_s={
            q: [round(sum(w) / len(w) / 1000, 3) if w else None for w in per_bucket]
            for q, per_bucket in sorted(waits.items())
        },
        started={q: [len(w) for w in per_bucket] for q, per_bucket in sorted(waits.items())},
    )
