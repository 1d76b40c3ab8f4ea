"""The format gate (core/codec/formats.py): a command that needs a format not every replica
reads is refused at apply, the floor only rises through RaiseFormat, and the leader holds
back configured settings the floor does not allow yet."""

from __future__ import annotations

import dataclasses

import pytest

from synapse_ha.core import commands as c
from synapse_ha.core.cluster_config import ClusterConfig
from synapse_ha.core.codec import formats
from synapse_ha.core.codec import versioned as codec
from synapse_ha.core.machine import apply
from synapse_ha.core.model import ClusterState, JobSpec


def test_a_fresh_replica_starts_at_the_base_format() -> None:
    assert ClusterState().format_floor == formats.BASE_FORMAT < formats.FORMAT


def test_what_a_command_needs() -> None:
    assert formats.format_needed(c.Configure(ClusterConfig())) == formats.BASE_FORMAT
    hold = c.Configure(ClusterConfig(hold_until_stopped=True))
    assert formats.format_needed(hold) == 3
    assert formats.format_needed(c.CancelJob("j1")) == formats.BASE_FORMAT


def test_a_command_above_the_floor_is_refused_and_changes_nothing() -> None:
    state = ClusterState()
    before = codec.encode_state(state)
    result = apply(state, c.Configure(ClusterConfig(hold_until_stopped=True), now_ms=5))
    assert result.code is c.ResultCode.CONFLICT
    assert "needs format 3" in result.message and "format_version" in result.message
    assert codec.encode_state(state) == before


def test_raise_format_opens_the_gate_and_never_lowers_the_floor() -> None:
    state = ClusterState()
    assert apply(state, c.RaiseFormat(3, ("r1", "r2", "r3"), 1)).ok
    assert state.format_floor == 3
    assert apply(state, c.Configure(ClusterConfig(hold_until_stopped=True), now_ms=2)).ok
    assert state.config.hold_until_stopped
    assert apply(state, c.RaiseFormat(2, (), 3)).ok
    assert state.format_floor == 3


def test_a_format_newer_than_this_release_reads_is_refused() -> None:
    state = ClusterState()
    result = apply(state, c.RaiseFormat(formats.FORMAT + 1, ("r1",), 1))
    assert result.code is c.ResultCode.INVALID
    assert state.format_floor == formats.BASE_FORMAT


def test_the_floor_survives_the_codec_and_is_left_out_at_the_base_format() -> None:
    state = ClusterState()
    assert b"format_floor" not in codec.encode_state(state)
    assert apply(state, c.RaiseFormat(3, (), 1)).ok
    assert codec.decode_state(codec.encode_state(state)).format_floor == 3


def test_the_leader_holds_back_settings_above_the_floor() -> None:
    current = ClusterConfig()
    wanted = ClusterConfig(hold_until_stopped=True, max_requeues=9)
    held = formats.held_back_config(wanted, current, floor=2)
    assert held == dataclasses.replace(wanted, hold_until_stopped=False)
    assert formats.held_back_config(wanted, current, floor=3) == wanted


@pytest.mark.parametrize(
    "kind", sorted(formats.ADDED_FIELDS, key=lambda k: k.__name__), ids=lambda k: k.__name__
)
def test_every_added_field_is_a_field_with_a_default_and_a_known_format(kind: type) -> None:
    fields = {f.name: f for f in dataclasses.fields(kind)}
    for name, version in formats.ADDED_FIELDS[kind].items():
        assert name in fields, f"{kind.__name__} has no field {name}"
        f = fields[name]
        has_default = f.default is not dataclasses.MISSING
        assert has_default or f.default_factory is not dataclasses.MISSING, (
            f"{kind.__name__}.{name}: a field a format added needs a default, or every "
            "older replica refuses every value of its type"
        )
        assert formats.BASE_FORMAT <= version <= formats.FORMAT, f"{kind.__name__}.{name}"


def test_the_gated_fields_are_the_added_fields_above_the_base_format() -> None:
    assert formats.NEW_FIELDS[JobSpec]["wait_for_nodes"] == 9
    assert "queue" in formats.ADDED_FIELDS[JobSpec]
    assert "queue" not in formats.NEW_FIELDS[JobSpec]
    assert ClusterState not in formats.NEW_FIELDS  # every field of it is older than the gate
