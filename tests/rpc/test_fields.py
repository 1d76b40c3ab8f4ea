"""The generic conversions between a message and a record whose fields it names alike
(rpc/fields.py: to_message, from_message): None and an unset optional field, repeated
fields and maps, and the refusal of a field neither side can fill."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
from google.protobuf.message import Message

from synapse_ha.client.jobs import ArrayView
from synapse_ha.core.cluster_config import Cohort, PriorityClass, Queue
from synapse_ha.core.identity.access import Role
from synapse_ha.core.identity.tokens import Token
from synapse_ha.core.queues.usage import CohortUsage, QueueUsage
from synapse_ha.rpc import fields, from_proto, to_proto
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb

_LIMITS = (
    "gpu",
    "cpu_milli",
    "memory_mib",
    "borrowing_limit_gpu",
    "lending_limit_gpu",
    "running_members_per_user",
    "members_per_node_per_user",
)


def test_a_limit_of_none_travels_unset_and_a_limit_of_zero_travels_set() -> None:
    unset = to_proto.queue_to_proto(Queue("q"))
    zeros: dict[str, Any] = dict.fromkeys(_LIMITS, 0)
    zero = to_proto.queue_to_proto(Queue("q", **zeros))
    assert [unset.HasField(n) for n in _LIMITS] == [False] * len(_LIMITS)
    assert [zero.HasField(n) for n in _LIMITS] == [True] * len(_LIMITS)
    assert from_proto.queue_from_proto(unset) == Queue("q")
    assert from_proto.queue_from_proto(zero) == Queue("q", **zeros)


@pytest.mark.parametrize(
    ("record", "message"),
    [
        (
            Queue(
                "q",
                gpu=8,
                cpu_milli=0,
                cohort="c",
                lending_limit_gpu=2,
                priority_classes=("high", "low"),
                max_priority=5,
                min_runtime_ms=60_000,
                members_per_node_per_user=1,
            ),
            pb.Queue,
        ),
        (Cohort("c", "org", None, 4, 0), pb.Cohort),
        (QueueUsage(1, 2, 3, 4, 5, 6, 7, 8, 9), pb.QueueUsage),
        (PriorityClass("high", 100, True, 30_000, 5), pb.PriorityClass),
    ],
    ids=["queue", "cohort", "usage", "class"],
)
def test_a_record_comes_back_from_its_message_equal(record: Any, message: type[Message]) -> None:
    msg = fields.to_message(message, record)
    assert type(msg) is message
    assert fields.from_message(type(record), msg) == record


def test_repeated_fields_read_as_tuples_and_maps_as_dicts() -> None:
    token = Token("t1", "ann", Role.USER, "hash", 5, "admin", queues=("a", "b"))
    msg = to_proto.token_to_proto(token)
    assert list(msg.queues) == ["a", "b"] and msg.role == "user"
    summary = pb.ArraySummary(array_id="a1", tasks=2, task_states={"PENDING": 2})
    view = fields.from_message(ArrayView, summary, spec=None)
    assert view.task_states == {"PENDING": 2} and type(view.task_states) is dict
    status = fields.from_message(
        CohortUsage, pb.CohortStatus(nominal_gpu=3, used_gpu=1), cohort=Cohort("c")
    )
    assert (status.nominal_gpu, status.used_gpu, status.defined) == (3, 1, False)


@dataclass(frozen=True)
class _Stray:
    name: str
    colour: str


def test_a_field_neither_side_fills_is_refused_naming_it() -> None:
    token = Token("t1", "ann", Role.USER, "hash", 5, "admin")
    with pytest.raises(TypeError, match="user_role"):
        fields.to_message(pb.TokenInfo, token, role="user")
    with pytest.raises(TypeError, match="cohort"):
        fields.to_message(pb.CohortStatus, CohortUsage(Cohort("c"), True, 1, 0, 0, 0))
    with pytest.raises(TypeError, match="colour"):
        fields.from_message(_Stray, pb.Cohort(name="c"))
    with pytest.raises(TypeError, match="cohort"):
        fields.from_message(CohortUsage, pb.CohortStatus())
