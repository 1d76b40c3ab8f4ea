"""A job's window (core/workflows/windows.py): a begin time keeps it out of every pass until then,
a deadline cancels it when still pending, both resolved with the command time."""

from __future__ import annotations

import dataclasses
import datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from synapse_ha.core import commands as c
from synapse_ha.core.codec.formats import format_needed
from synapse_ha.core.model import JobState
from synapse_ha.core.reasons import ReasonCode, render
from synapse_ha.core.scheduler.explainer import why_pending
from synapse_ha.core.spec.document import SpecError, parse_job_spec
from synapse_ha.core.views import due_deadlines
from synapse_ha.core.workflows.windows import MAX_TIME_MS, MIN_TIME_MS, parse_time, time_text
from tests.core.harness import Cluster, job, node

HOUR = 3_600_000
T0 = parse_time("2026-12-01T02:00:00Z") or 0


def cluster(now: int = T0) -> Cluster:
    k = Cluster(now=now)
    k.add(node("a", gpus=8))
    return k


def submit(k: Cluster, **window: int) -> str:
    return k.submit(dataclasses.replace(job("w", gpu=8), **window))


def test_a_job_is_not_considered_before_its_begin_time() -> None:
    k = cluster()
    job_id = submit(k, begin_delay_ms=2 * HOUR)
    waiting = k.state.jobs[job_id]
    assert waiting.retry_not_before_ms == T0 + 2 * HOUR  # the command time plus the delay
    assert waiting.reason.code is ReasonCode.BEGIN_TIME
    assert render(waiting.reason) == "not considered before 2026-12-01T04:00:00Z (begin)"
    k.run_pass()
    assert k.state_of(job_id) is JobState.PENDING
    assert why_pending(k.state, job_id, k.now, k.plan()).code is ReasonCode.BEGIN_TIME
    k.now += 2 * HOUR
    k.run_pass()
    assert k.state_of(job_id) is JobState.SCHEDULED


def test_a_begin_time_in_the_past_changes_nothing() -> None:
    k = cluster()
    job_id = submit(k, begin_at_ms=T0 - HOUR)
    assert k.state.jobs[job_id].retry_not_before_ms == 0
    k.run_pass()
    assert k.state_of(job_id) is JobState.SCHEDULED


def test_a_job_still_pending_at_its_deadline_is_cancelled_and_one_placed_is_not() -> None:
    k = cluster()
    blocker = submit(k)
    k.run_pass()  # takes the only node
    placed = submit(k, deadline_at_ms=T0 + HOUR)  # first in line once the node is free
    late = submit(k, deadline_delay_ms=HOUR)
    assert k.do(c.CancelJob(blocker, now_ms=k.now)).ok
    k.run_pass()
    assert (k.state_of(placed), k.state_of(late)) == (JobState.SCHEDULED, JobState.PENDING)
    assert due_deadlines(k.state, k.now + HOUR - 1) == []
    k.now += HOUR
    assert due_deadlines(k.state, k.now) == [c.ExpireDeadline(late, k.now)]
    assert k.do(c.ExpireDeadline(late, k.now)).ok
    cancelled = k.state.jobs[late]
    assert cancelled.state is JobState.CANCELLED
    assert cancelled.reason.code is ReasonCode.DEADLINE
    assert render(cancelled.reason).endswith("still pending at its deadline, 2026-12-01T03:00:00Z")
    assert k.state_of(placed) is JobState.SCHEDULED


def test_an_early_or_late_deadline_command_is_refused() -> None:
    k = cluster()
    job_id = submit(k, deadline_delay_ms=HOUR)
    early = k.do(c.ExpireDeadline(job_id, now_ms=k.now + 1))
    assert early.code is c.ResultCode.CONFLICT and "not reached" in early.message
    k.run_pass()
    k.now += HOUR
    placed = k.do(c.ExpireDeadline(job_id, now_ms=k.now))
    assert placed.code is c.ResultCode.CONFLICT and k.state_of(job_id) is JobState.SCHEDULED


def test_deadlines_that_passed_or_precede_the_begin_are_refused_at_submit() -> None:
    k = cluster()
    for window, says in (
        ({"deadline_at_ms": T0 - 1}, "deadline: has already passed"),
        ({"begin_at_ms": T0 + 2 * HOUR, "deadline_delay_ms": HOUR}, "must come after begin"),
    ):
        spec = dataclasses.replace(job("w"), **window)
        result = k.do(c.SubmitJob(spec, f"r-{says}", k.now))
        assert result.code is c.ResultCode.INVALID and says in result.message
    assert k.state.jobs == {}


def test_windows_need_format_4() -> None:
    spec = dataclasses.replace(job("w"), begin_delay_ms=HOUR)
    assert format_needed(c.SubmitJob(spec, "r", 0)) == 4
    assert format_needed(c.ExpireDeadline("job-000001", 0)) == 4


@pytest.mark.parametrize(
    ("window", "says"),
    [
        ({"begin": "tomorrow"}, "begin: 'tomorrow' is neither a time with its zone"),
        ({"begin": "2026-12-01T02:00"}, "is neither a time with its zone"),
        ({"deadline": "+400d"}, "deadline: a delay must be between +0s and +366d"),
        ({"begin": "+3h", "deadline": "+1h"}, "deadline: must come after begin"),
        ({"begin": "1999-01-01T00:00Z"}, "begin: must be a time between the years 2000"),
        ({"deadline": 5}, "deadline: expected a string, got int"),
    ],
)
def test_spec_windows_name_the_field_and_the_rule(window: dict[str, object], says: str) -> None:
    with pytest.raises(SpecError, match=says.replace("(", r"\(").replace("+", r"\+")):
        parse_job_spec({"name": "a", "replicas": 1, "command": "true", **window})


def test_spec_windows_take_a_time_with_its_zone_or_a_delay() -> None:
    doc = {"name": "a", "replicas": 1, "command": "true"}
    spec = parse_job_spec({**doc, "begin": "+2h", "deadline": "2026-12-01T03:00+01:00"}).spec
    assert (spec.begin_at_ms, spec.begin_delay_ms) == (0, 2 * HOUR)
    assert (spec.deadline_at_ms, spec.deadline_delay_ms) == (T0, 0)


@given(st.integers(MIN_TIME_MS, MAX_TIME_MS))
def test_times_are_written_and_read_as_the_standard_library_does(ms: int) -> None:
    moment = datetime.datetime.fromtimestamp(ms // 1000, tz=datetime.UTC)
    text = moment.strftime("%Y-%m-%dT%H:%M:%SZ")
    assert time_text(ms) == text
    assert parse_time(text) == ms // 1000 * 1000
    shifted = moment.astimezone(datetime.timezone(datetime.timedelta(hours=-5, minutes=-30)))
    assert parse_time(shifted.isoformat()) == ms // 1000 * 1000
