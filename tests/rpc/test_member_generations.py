"""A member's generation and its gang's membership on the wire: reports carry the
generation to the leader's events (whichever way the heartbeat travels), desired members
carry generation, membership and signal to the worker, and a membership change alone
changes what a heartbeat stream sends."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from synapse_ha.core import commands as cmd
from synapse_ha.rpc import from_proto, to_proto
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb
from synapse_ha.rpc.heartbeat import heartbeat_in
from synapse_ha.rpc.stream import _digest
from synapse_ha.service.refusal import Refusal
from tests.worker.helpers import spec


def test_a_report_carries_its_generation_to_the_event() -> None:
    exited = cmd.MemberEvent("j", 4, 2, cmd.MemberEventKind.EXITED, 1, "exit 1", generation=3)
    mark = cmd.MemberEvent(
        "j", 4, 2, cmd.MemberEventKind.CHECKPOINT, step=9, mark_seq=1, generation=3
    )
    wire = [to_proto.member_event_to_proto(e) for e in (exited, mark)]
    assert [w.generation for w in wire] == [3, 3]
    assert from_proto.member_events_from_proto(wire) == (exited, mark)


def test_a_heartbeat_of_any_shape_keeps_the_generation_and_refuses_a_negative_one() -> None:
    report = pb.MemberReport(job_id="j", fencing_token=4, rank=2, kind=pb.MemberReport.STARTED)
    report.generation = 1
    embedded = pb.WorkerMessage(heartbeat=pb.Heartbeat(node_id="n1", reports=[report]))
    read = heartbeat_in(embedded.heartbeat)
    assert not isinstance(read, Refusal)
    assert [(e.rank, e.generation) for e in read.events] == [(2, 1)]
    report.generation = -1
    refused = heartbeat_in(pb.HeartbeatRequest(node_id="n1", reports=[report]))
    assert isinstance(refused, Refusal)
    assert "reports[0].generation" in refused.words and ">= 0" in refused.words


def test_a_desired_member_carries_generation_membership_and_signal_both_ways() -> None:
    member = spec(
        "true",
        world_size=2,
        generation=2,
        membership=3,
        membership_signal="SIGUSR1",
        member_hosts=("10.0.0.1", "10.0.0.7"),
    )
    wire = to_proto.desired_to_proto(member)
    assert (wire.generation, wire.membership, wire.membership_signal) == (2, 3, "SIGUSR1")
    assert from_proto.desired_from_proto(wire) == member
    assert from_proto.desired_from_proto(to_proto.desired_to_proto(spec("true"))).key[3] == 0


@pytest.mark.parametrize("change", [{"membership": 1}, {"generation": 1}], ids=str)
def test_a_membership_change_or_a_new_generation_changes_the_stream_digest(
    change: dict[str, Any],
) -> None:
    member = spec("true")
    assert _digest([member]) == _digest([dataclasses.replace(member)])
    assert _digest([member]) != _digest([dataclasses.replace(member, **change)])
