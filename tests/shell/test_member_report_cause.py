"""A worker's member reports keep their exit cause on the way into the state machine."""

from __future__ import annotations

import pytest

from synapse_ha.core import commands as cmd
from synapse_ha.rpc.from_proto import member_events_from_proto
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb


@pytest.mark.parametrize(
    ("cause", "expected"),
    [
        (pb.MemberReport.PROGRAM, cmd.ExitCause.PROGRAM),
        (pb.MemberReport.FENCED, cmd.ExitCause.FENCED),
        (pb.MemberReport.LOST, cmd.ExitCause.LOST),
        (pb.MemberReport.NODE_CANNOT_RUN, cmd.ExitCause.NODE_CANNOT_RUN),
        (pb.MemberReport.HUNG, cmd.ExitCause.HUNG),
    ],
)
def test_the_exit_cause_is_carried(cause: int, expected: cmd.ExitCause) -> None:
    report = pb.MemberReport(
        job_id="job-1",
        fencing_token=3,
        rank=0,
        kind=pb.MemberReport.EXITED,
        exit_code=137,
        cause=cause,  # type: ignore[arg-type]
    )
    (event,) = member_events_from_proto([report])
    assert event.cause is expected


def test_a_report_without_a_cause_is_the_members_own_exit() -> None:
    report = pb.MemberReport(job_id="j", fencing_token=1, rank=0, kind=pb.MemberReport.EXITED)
    (event,) = member_events_from_proto([report])
    assert event.cause is cmd.ExitCause.PROGRAM
