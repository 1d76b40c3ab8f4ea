"""A node says whose account its members run under (``NodeInfo.members_run_as``): the rule
for the value, and that it is replicated with the node."""

from __future__ import annotations

import dataclasses
import json

import pytest

from synapse_ha.core import commands as c
from synapse_ha.core.codec.versioned import (
    decode_command,
    decode_state,
    encode_command,
    encode_state,
)
from synapse_ha.core.machine import apply
from synapse_ha.core.model import ClusterState, NodeInfo, Resources
from synapse_ha.core.spec.validation import check_node_info

NODE = NodeInfo(
    node_id="w1",
    address="10.0.0.1:7200",
    capacity=Resources(cpu_milli=8000, memory_mib=16384, gpu=2),
)


@pytest.mark.parametrize("value", ["", "owner", "agent:root", "agent:svc-train.1"])
def test_owner_or_the_agents_account_is_accepted(value: str) -> None:
    assert check_node_info(dataclasses.replace(NODE, members_run_as=value)) == []


@pytest.mark.parametrize(
    "value",
    ["root", "agent:", "agent:a b", "owner\n", "agent:" + "u" * 65, "agent:a:b", "Owner"],
)
def test_anything_else_is_refused_naming_the_field(value: str) -> None:
    violations = check_node_info(dataclasses.replace(NODE, members_run_as=value))
    assert [v.field for v in violations] == ["members_run_as"]


def test_the_registered_node_keeps_what_it_said_and_it_survives_the_codec() -> None:
    state = ClusterState()
    info = dataclasses.replace(NODE, members_run_as="agent:synapse")
    command = c.RegisterNode(info, now_ms=1)
    assert decode_command(encode_command(command)) == command
    result = apply(state, command)
    assert result.code is c.ResultCode.OK, result
    assert state.nodes["w1"].info.members_run_as == "agent:synapse"
    again = decode_state(encode_state(state))
    assert again.nodes["w1"].info.members_run_as == "agent:synapse"


def test_a_state_written_before_the_field_existed_decodes_as_unsaid() -> None:
    state = ClusterState()
    apply(state, c.RegisterNode(dataclasses.replace(NODE, members_run_as="owner"), now_ms=1))
    doc = json.loads(encode_state(state))
    found = []

    def strip(value: object) -> None:
        if isinstance(value, dict):
            if "members_run_as" in value:
                found.append(value.pop("members_run_as"))
            for v in value.values():
                strip(v)
        elif isinstance(value, list):
            for v in value:
                strip(v)

    strip(doc)
    assert found == ["owner"]
    old = decode_state(json.dumps(doc).encode())
    assert old.nodes["w1"].info.members_run_as == ""


def test_a_bad_value_is_an_invalid_registration_not_an_exception() -> None:
    state = ClusterState()
    result = apply(state, c.RegisterNode(dataclasses.replace(NODE, members_run_as="x"), 1))
    assert result.code is c.ResultCode.INVALID
    assert "members_run_as" in result.message
    assert "w1" not in state.nodes
