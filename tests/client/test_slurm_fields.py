"""A job in Slurm's words (synapse_ha.client.slurm_fields) and squeue's -o formats
(synapse_ha.cli.slurm): ids both ways, states, reasons, durations, exit codes, widths."""

from __future__ import annotations

import pytest

from synapse_ha.cli.slurm import show_job, squeue_header, squeue_line
from synapse_ha.client import slurm_fields as sf
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb

NOW = 1_800_000_000_000


def a_job(state: str = "RUNNING", reason_code: str = "running", **members: int) -> pb.Job:
    job = pb.Job(
        job_id="job-000042",
        state=state,
        reason_code=reason_code,
        owner="alice",
        submitted_at_ms=NOW - 7_200_000,
        attempts_made=2,
        spec=pb.JobSpec(name="train", replicas=3, queue="research", time_limit_ms=90_000),
    )
    job.attempt.started_at_ms = NOW - 3_723_000
    for rank, node in enumerate(("gpu01", "gpu02", "gpu03")):
        member = job.attempt.members.add(rank=rank, node_id=node)
        if node in members:
            member.has_exit_code, member.exit_code = True, members[node]
    return job


@pytest.mark.parametrize(
    ("ours", "slurms"),
    [("job-000042", "42"), ("job-000042_7", "42_7"), ("job-1234567", "1234567")],
)
def test_ids_both_ways(ours: str, slurms: str) -> None:
    assert sf.slurm_id(ours) == slurms
    assert sf.job_id_of(slurms) == ours
    assert sf.job_id_of(ours) == ours


@pytest.mark.parametrize(
    ("state", "code", "slurms"),
    [
        ("PENDING", "waiting_capacity", "PENDING"),
        ("SCHEDULED", "bound", "CONFIGURING"),
        ("SUCCEEDED", "succeeded", "COMPLETED"),
        ("FAILED", "failed_exit", "FAILED"),
        ("FAILED", "failed_time_limit", "TIMEOUT"),
        ("FAILED", "failed_max_requeues", "NODE_FAIL"),
        ("CANCELLED", "cancelled", "CANCELLED"),
    ],
)
def test_states_in_slurms_words(state: str, code: str, slurms: str) -> None:
    assert sf.state(a_job(state, code)) == slurms


def test_reason_is_why_it_waits_or_where_it_runs() -> None:
    assert sf.reason(a_job("PENDING", "dependency")) == "(Dependency)"
    assert sf.reason(a_job("PENDING", "something_new")) == "(None)"
    assert sf.reason(a_job()) == "gpu[01-03]"


def test_durations_times_and_exit_codes() -> None:
    assert [sf.duration(ms) for ms in (0, 59_000, 3_723_000, 90_061_000)] == [
        "0:00", "0:59", "1:02:03", "1-01:01:01",
    ]  # fmt: skip
    job = a_job()
    assert sf.elapsed(job, NOW) == "1:02:03" and sf.time_limit(job) == "1:30"
    assert sf.timestamp(0) == "Unknown"
    assert sf.exit_code(a_job(gpu01=0, gpu02=3)) == "3:0"
    assert sf.exit_code(a_job(gpu03=137)) == "0:9"  # killed by signal 9
    assert sf.field(job, "Restarts", NOW) == "1"
    with pytest.raises(KeyError):
        sf.field(job, "MaxRSS", NOW)


def test_squeue_formats_keep_widths_and_justification() -> None:
    job = a_job()
    assert squeue_line(job, "%.5i|%6j|%t|%D|%%", NOW) == "   42|train |R|3|%"
    assert squeue_line(job, "%8P %R", NOW) == "research gpu[01-03]"
    assert squeue_header("%.5i %T") == "JOBID STATE"


def test_scontrol_show_job_is_key_value_without_spaces_in_values() -> None:
    fields = dict(word.split("=", 1) for word in show_job(a_job(), NOW).split())
    assert fields["JobId"] == "42" and fields["JobState"] == "RUNNING"
    assert (fields["NodeList"], fields["BatchHost"], fields["NumNodes"]) == (
        "gpu[01-03]",
        "gpu01",
        "3",
    )
