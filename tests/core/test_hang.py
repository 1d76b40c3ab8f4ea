"""Hang detection (``progress:``): the spec, its rules and its encodings, and a hung
member's exit, which is the program's failure: it retries against ``retries.max`` (never
a requeue) and, with no retry left, fails the job as hung."""

from __future__ import annotations

import dataclasses

import pytest

from synapse_ha.core import commands as c
from synapse_ha.core.codec import formats
from synapse_ha.core.codec.versioned import decode_command, encode_command
from synapse_ha.core.health.progress import Progress
from synapse_ha.core.machine import apply
from synapse_ha.core.model import ClusterState, JobState
from synapse_ha.core.reasons import ReasonCode, render, withheld
from synapse_ha.core.spec.document import SpecError, parse_job_spec
from synapse_ha.core.spec.validation import check_job_spec
from synapse_ha.rpc.from_proto import spec_from_proto
from synapse_ha.rpc.to_proto import spec_to_proto
from tests.core.harness import Cluster, job, node

DETAIL = "no progress for 30m (progress file not touched since 2026-05-02T10:14:03Z)"
HALF_HOUR = Progress(30 * 60_000)


def doc(**extra: object) -> dict[str, object]:
    return {"name": "train", "replicas": 1, "command": "python train.py", **extra}


# --------------------------------------------------------------------------- spec


@pytest.mark.parametrize(
    ("progress", "expected"),
    [
        ({"timeout": "30m"}, Progress(1_800_000, "file")),
        ({"timeout": "30m", "source": "log"}, Progress(1_800_000, "log")),
        ({"timeout": "10s", "source": "file"}, Progress(10_000)),
        ({"timeout": "7d"}, Progress(7 * 86_400_000)),
        ({"timeout": 60}, Progress(60_000)),
    ],
)
def test_a_progress_setting_is_read(progress: object, expected: Progress) -> None:
    assert parse_job_spec(doc(progress=progress)).spec.progress == expected


def test_without_progress_there_is_no_hang_detection() -> None:
    assert parse_job_spec(doc()).spec.progress is None


@pytest.mark.parametrize(
    ("progress", "field", "rule_part"),
    [
        ({"timeout": "9s"}, "progress.timeout", "between 10s and 7d"),
        ({"timeout": "9999ms"}, "progress.timeout", "between 10s and 7d"),
        ({"timeout": "604800001ms"}, "progress.timeout", "7d"),
        ({"timeout": "-1m"}, "progress.timeout", "negative"),
        ({"timeout": "soon"}, "progress.timeout", "not a duration"),
        ({}, "progress.timeout", "is required"),
        ({"timeout": "1m", "source": "gpu"}, "progress.source", "allowed: file, log"),
        ({"timeout": "1m", "source": ""}, "progress.source", "allowed: file, log"),
        ({"timeout": "1m", "source": 1}, "progress.source", "expected a string"),
        ({"timeout": "1m", "interval": "1s"}, "progress.interval", "unknown field"),
        ("30m", "progress", "expected a mapping"),
    ],
)
def test_a_bad_progress_setting_is_refused_naming_field_and_rule(
    progress: object, field: str, rule_part: str
) -> None:
    with pytest.raises(SpecError) as info:
        parse_job_spec(doc(progress=progress))
    assert info.value.field == field
    assert rule_part in info.value.rule


def test_a_job_with_an_image_reads_its_progress_from_its_output() -> None:
    image = {"image": "registry.example/train:1"}
    spec = parse_job_spec(doc(progress={"timeout": "30m", "source": "log"}, **image)).spec
    assert spec.progress == Progress(1_800_000, "log")
    with pytest.raises(SpecError) as info:
        parse_job_spec(doc(progress={"timeout": "30m"}, **image))
    assert info.value.field == "progress.source"
    assert "must be log for a job with an image" in info.value.rule


def test_the_rule_set_checks_progress_whatever_built_the_spec() -> None:
    spec = job()
    assert check_job_spec(dataclasses.replace(spec, progress=HALF_HOUR), None) == []
    bad = dataclasses.replace(spec, progress=Progress(0, "socket"))
    assert [v.field for v in check_job_spec(bad, None)] == ["progress.timeout", "progress.source"]


def test_progress_survives_the_log_and_the_wire() -> None:
    spec = dataclasses.replace(job(), progress=Progress(1_800_000, "log"))
    command = c.SubmitJob(spec, "r", 5, "alice")
    assert decode_command(encode_command(command)) == command
    assert spec_from_proto(spec_to_proto(spec)) == spec
    plain = job()
    assert spec_from_proto(spec_to_proto(plain)).progress is None
    # A spec without progress encodes as before the field existed.
    assert b"progress" not in encode_command(c.SubmitJob(plain, "r", 5, "alice"))


def test_progress_and_a_hung_exit_need_format_3() -> None:
    spec = dataclasses.replace(job(), progress=HALF_HOUR)
    assert formats.format_needed(c.SubmitJob(job(), "r", 5)) == formats.BASE_FORMAT
    assert formats.format_needed(c.SubmitJob(spec, "r", 5)) == 3
    event = c.MemberEvent("j", 1, 0, c.MemberEventKind.EXITED, 143, cause=c.ExitCause.HUNG)
    assert formats.format_needed(c.ReportMembers("n1", (event,))) == 3
    state = ClusterState()  # not every replica reads format 3 yet: refused, nothing changes
    assert apply(state, c.SubmitJob(spec, "r", 5)).code is c.ResultCode.CONFLICT
    assert state.jobs == {}


def test_a_progress_message_without_a_source_reads_the_file() -> None:
    msg = spec_to_proto(dataclasses.replace(job(), progress=HALF_HOUR))
    msg.progress.source = ""
    assert spec_from_proto(msg).progress == HALF_HOUR


# ------------------------------------------------------------------------ apply


def running(retries: int) -> tuple[Cluster, str]:
    cl = Cluster()
    cl.add(node("n1"))
    spec = dataclasses.replace(job("train", retries=retries), progress=HALF_HOUR)
    job_id = cl.submit(spec)
    cl.run_pass()
    cl.start_all(job_id)
    return cl, job_id


def hung(cl: Cluster, job_id: str, exit_code: int = 143) -> c.Result:
    attempt = cl.state.jobs[job_id].attempt
    assert attempt is not None
    event = c.MemberEvent(
        job_id,
        attempt.fencing_token,
        0,
        c.MemberEventKind.EXITED,
        exit_code=exit_code,
        detail=DETAIL,
        cause=c.ExitCause.HUNG,
    )
    return cl.do(c.ReportMembers("n1", (event,), 3, cl.now))


def test_a_hung_member_is_the_programs_failure_not_a_disruption() -> None:
    assert not c.ExitCause.HUNG.disruption


def test_a_hung_member_fails_the_attempt_and_uses_a_retry() -> None:
    cl, j = running(retries=2)
    assert hung(cl, j).ok
    record = cl.state.jobs[j]
    assert record.state is JobState.PENDING
    assert (record.retries_used, record.requeues) == (1, 0)
    assert record.reason.code is ReasonCode.RETRY_BACKOFF
    outcome = record.reason.cause
    assert outcome is not None and outcome.code is ReasonCode.MEMBER_HUNG
    assert (outcome.num("rank"), outcome.text("node"), outcome.num("exit_code")) == (0, "n1", 143)
    assert outcome.num("timeout_ms") == 1_800_000
    assert record.attempt is not None and record.attempt.outcome == outcome
    assert render(record.reason).startswith("attempt 1 failed (rank 0 on n1 hung and was stopped")
    assert DETAIL in render(record.reason)


def test_a_hung_member_with_no_retry_left_fails_the_job_as_hung() -> None:
    cl, j = running(retries=0)
    assert hung(cl, j).ok
    record = cl.state.jobs[j]
    assert record.state is JobState.FAILED
    assert record.reason.code is ReasonCode.FAILED_HUNG
    assert record.reason.cause is not None
    assert record.reason.cause.code is ReasonCode.MEMBER_HUNG
    sentence = render(record.reason)
    assert sentence.startswith("attempt 1 failed: a member hung (rank 0 on n1 hung")
    assert sentence.endswith("0 retries used")


def test_a_hung_member_never_succeeds_whatever_its_code() -> None:
    cl, j = running(retries=0)
    assert hung(cl, j, exit_code=0).ok
    assert cl.state.jobs[j].state is JobState.FAILED


def test_who_may_not_see_the_detail_still_reads_that_it_hung() -> None:
    cl, j = running(retries=0)
    hung(cl, j)
    sentence = render(withheld(cl.state.jobs[j].reason))
    assert "rank 0 on n1 hung: no progress for 30m (progress.timeout); stopped, code 143" in (
        sentence
    )
    assert "2026" not in sentence
