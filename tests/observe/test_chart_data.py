"""The charts' series (synapse_ha.observe.chart_data): GPUs allocated and pending per
bucket, and the wait of the jobs started per bucket and queue, from the jobs the API
lists. Checked by hand on a few jobs, and against a millisecond-by-millisecond count on
random small ones."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from synapse_ha.observe.chart_data import (
    HOUR_MS,
    MINUTE_MS,
    Span,
    bucket_for,
    chart_series,
    span_of_finished,
    span_of_job,
    spans_of,
)
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb

NOW = 1_800_000_000_000 + 17 * MINUTE_MS + 30_000  # not on a bucket boundary


def gang(replicas: int, gpu: int, queue: str = "") -> pb.JobSpec:
    return pb.JobSpec(name="g", replicas=replicas, queue=queue, resources=pb.Resources(gpu=gpu))


def running(job_id: str, submitted: int, bound: int, number: int = 1) -> pb.Job:
    return pb.Job(
        job_id=job_id,
        spec=gang(2, 4, "research"),
        state="RUNNING",
        job_state=pb.JOB_STATE_RUNNING,
        submitted_at_ms=submitted,
        attempt=pb.Attempt(number=number, bound_at_ms=bound, started_at_ms=bound + 5_000),
    )


def waiting(job_id: str, submitted: int) -> pb.Job:
    return pb.Job(
        job_id=job_id,
        spec=gang(3, 2),
        state="PENDING",
        job_state=pb.JOB_STATE_PENDING,
        submitted_at_ms=submitted,
    )


def finished(job_id: str, submitted: int, attempts: list[tuple[int, int]]) -> pb.HistoryJob:
    return pb.HistoryJob(
        job_id=job_id,
        queue="prod",
        submitted_at_ms=submitted,
        started_at_ms=attempts[0][0] if attempts else 0,
        finished_at_ms=attempts[-1][1] if attempts else submitted + MINUTE_MS,
        gpus_per_attempt=8,
        spec=gang(1, 8),
        attempt_list=[pb.HistoryAttempt(bound_at_ms=a, ended_at_ms=b) for a, b in attempts],
    )


def test_a_window_of_jobs_by_hand() -> None:
    live = [
        running("job-1", NOW - 40 * MINUTE_MS, NOW - 30 * MINUTE_MS),  # 8 GPUs for 30m
        waiting("job-2", NOW - 90 * MINUTE_MS),  # 6 GPUs waiting since 90m ago
    ]
    done = [
        # Waited 10m, ran 20m, failed, waited 5m (backoff) and ran 10m more.
        finished(
            "job-3",
            NOW - 60 * MINUTE_MS,
            [
                (NOW - 50 * MINUTE_MS, NOW - 30 * MINUTE_MS),
                (NOW - 25 * MINUTE_MS, NOW - 15 * MINUTE_MS),
            ],
        ),
    ]
    series = chart_series(spans_of(live, done, NOW), NOW, HOUR_MS, 5 * MINUTE_MS)
    assert series.bucket_ms == 5 * MINUTE_MS
    assert all(t % (5 * MINUTE_MS) == 0 for t in series.times_ms)
    assert series.times_ms[0] <= NOW - HOUR_MS < series.times_ms[0] + 5 * MINUTE_MS
    assert series.times_ms[-1] < NOW <= series.times_ms[-1] + 5 * MINUTE_MS

    def at(values: list[float], ms: int) -> float:
        return values[(ms - series.times_ms[0]) // series.bucket_ms]

    # The bucket holding 45m ago (all of it after job-3's bind, before job-1 came):
    # job-3 holds 8, job-2 waits (6).
    assert at(series.allocated, NOW - 45 * MINUTE_MS) == 8
    assert at(series.pending, NOW - 45 * MINUTE_MS) == 6
    # 35m ago: job-1 waits too (8).
    assert at(series.pending, NOW - 35 * MINUTE_MS) == 14
    # The bucket holding 20m ago (all of it between 25m and 15m ago): job-1 8 + job-3 8.
    assert at(series.allocated, NOW - 20 * MINUTE_MS) == 16
    assert at(series.pending, NOW - 20 * MINUTE_MS) == 6
    # The last bucket, partly elapsed: only job-1 holds, only job-2 waits.
    assert series.allocated[-1] == 8 and series.pending[-1] == 6
    # Waits: job-1 (research) waited 10m, job-3 (prod) 10m; job-2 has not started.
    assert at(series.wait_s["research"], NOW - 30 * MINUTE_MS) == 600  # type: ignore[arg-type]
    assert at(series.wait_s["prod"], NOW - 50 * MINUTE_MS) == 600  # type: ignore[arg-type]
    assert sum(series.started["research"]) == 1 and sum(series.started["prod"]) == 1
    assert series.wait_s["prod"].count(None) == len(series.times_ms) - 1


def test_a_bucket_is_the_average_over_its_length() -> None:
    # 4 GPUs held for 1 minute of a 5-minute bucket: 0.8 on average.
    span = Span("j", "q", 0, 4, ((MINUTE_MS, 2 * MINUTE_MS),), 0, 3 * MINUTE_MS, MINUTE_MS)
    series = chart_series([span], 10 * MINUTE_MS, 10 * MINUTE_MS, 5 * MINUTE_MS)
    assert series.allocated == [0.8, 0.0]
    assert series.pending == [pytest.approx(4 * 2 / 5), 0.0]  # waited 0-1m and 2-3m


def test_what_a_live_job_does_not_tell_is_left_out() -> None:
    # Its second attempt: the first one, and the wait before it, are not known.
    span = span_of_job(running("job-7", NOW - 3 * HOUR_MS, NOW - 10 * MINUTE_MS, number=2), NOW)
    assert span.started_ms is None and span.known_from_ms == NOW - 10 * MINUTE_MS
    series = chart_series([span], NOW, HOUR_MS, 5 * MINUTE_MS)
    assert sum(series.pending) == 0 and series.wait_s == {}
    # A job listed live and then finished (between the two calls) counts once.
    done = finished("job-7", NOW - HOUR_MS, [(NOW - 10 * MINUTE_MS, NOW - MINUTE_MS)])
    assert [s.job_id for s in spans_of([running("job-7", 0, 1)], [done], NOW)] == ["job-7"]
    assert span_of_finished(done).queue == "prod" and span_of_job(waiting("x", 1), NOW).queue == (
        "default"
    )


def test_the_bucket_is_the_shortest_that_keeps_the_points_few() -> None:
    assert bucket_for(HOUR_MS) == MINUTE_MS
    assert bucket_for(6 * HOUR_MS) == 5 * MINUTE_MS
    assert bucket_for(24 * HOUR_MS) == 15 * MINUTE_MS
    assert bucket_for(7 * 24 * HOUR_MS) == 2 * HOUR_MS


@st.composite
def spans(draw: st.DrawFn) -> Span:
    submitted = draw(st.integers(0, 90))
    cuts = sorted(draw(st.lists(st.integers(submitted, 130), max_size=4, unique=True)))
    held = tuple((cuts[i], cuts[i + 1]) for i in range(0, len(cuts) - 1, 2))
    ended = draw(st.one_of(st.none(), st.integers(max([submitted, *cuts]), 140)))
    return Span(
        job_id=f"j{draw(st.integers(0, 10**6))}",
        queue=draw(st.sampled_from(["a", "b"])),
        submitted_ms=submitted,
        gpus=draw(st.integers(0, 8)),
        held=held,
        known_from_ms=submitted,
        ended_ms=ended,
        started_ms=held[0][0] if held else None,
    )


@settings(max_examples=150, deadline=None)
@given(
    jobs=st.lists(spans(), max_size=6),
    now=st.integers(1, 140),
    window=st.integers(1, 100),
    bucket=st.integers(1, 30),
)
def test_the_series_are_the_millisecond_count_averaged_per_bucket(
    jobs: list[Span], now: int, window: int, bucket: int
) -> None:
    series = chart_series(jobs, now, window, bucket)
    for i, start in enumerate(series.times_ms):
        moments = range(start, min(start + bucket, now))
        held = waited = 0
        for t in moments:
            for s in jobs:
                end = s.ended_ms if s.ended_ms is not None else now
                holding = any(a <= t < b for a, b in s.held)
                held += s.gpus if holding else 0
                waited += s.gpus if s.submitted_ms <= t < end and not holding else 0
        assert series.allocated[i] == pytest.approx(held / len(moments), abs=1e-3)
        assert series.pending[i] == pytest.approx(waited / len(moments), abs=1e-3)
        for queue in ("a", "b"):
            began = [
                s.started_ms - s.submitted_ms
                for s in jobs
                if s.queue == queue
                and s.started_ms is not None
                and start <= s.started_ms < now
                and s.started_ms < start + bucket
            ]
            got = series.wait_s.get(queue, [None] * len(series.times_ms))[i]
            if began:
                assert got == pytest.approx(sum(began) / len(began) / 1000, abs=1e-3)
            else:
                assert got is None
    assert series.times_ms[0] <= now - window
    assert series.times_ms[-1] < now <= series.times_ms[-1] + bucket
