"""The agent's reports of its members (core member events) on the wire: every kind and
cause reads back, on the leader's side, as the event the agent queued."""

from __future__ import annotations

import pytest

from synapse_ha.core.commands import ExitCause, MemberEventKind
from synapse_ha.core.desired import MemberKey
from synapse_ha.rpc.from_proto import member_events_from_proto
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb
from synapse_ha.rpc.to_proto import member_event_to_proto
from synapse_ha.worker.agent import _mark_report, _report
from synapse_ha.worker.checkpoint_files import Mark
from synapse_ha.worker.member_dirs import MemberExit

KEY = MemberKey("job-1", 7, 2)
EXITS = {
    ExitCause.PROGRAM: MemberExit(3, "exit 3", 5),
    ExitCause.LOST: MemberExit(143, "supervisor gone", 5, disrupted=True),
    ExitCause.NODE_CANNOT_RUN: MemberExit(127, "no such image", 5, node_fault=True),
    ExitCause.HUNG: MemberExit(143, "no progress for 10s", 5, hung=True),
}


@pytest.mark.parametrize("cause", list(EXITS), ids=str)
def test_an_exit_reads_back_with_its_cause(cause: ExitCause) -> None:
    event = _report(KEY, MemberEventKind.EXITED, EXITS[cause])
    assert event.cause is cause
    wire = member_event_to_proto(event)
    assert wire.kind == pb.MemberReport.EXITED and wire.exit_code == EXITS[cause].exit_code
    assert member_events_from_proto([wire]) == (event,)


def test_a_fenced_exit_a_start_and_a_mark_read_back() -> None:
    fenced = _report(KEY, MemberEventKind.EXITED, EXITS[ExitCause.PROGRAM], fenced=True)
    assert fenced.cause is ExitCause.FENCED
    started = _report(KEY, MemberEventKind.STARTED)
    marks = [_mark_report(KEY, Mark(4, 1200)), _mark_report(KEY, Mark(5, None))]
    wire = [member_event_to_proto(e) for e in (fenced, started, *marks)]
    assert [w.cause for w in wire[:2]] == [pb.MemberReport.FENCED, pb.MemberReport.PROGRAM]
    assert (wire[2].checkpoint_step, wire[2].checkpoint_seq) == (1200, 4)
    assert not wire[3].HasField("checkpoint_step")
    assert member_events_from_proto(wire) == (fenced, started, *marks)
