"""Decoding with per-type decoders worked out once: nested errors still name the exact
path and the rule, a decoded value is rebuilt afresh every time, and the compiled
decoders (the fast path) build what the constructors build."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from synapse_ha.core import commands as c
from synapse_ha.core.codec.compiled import Mismatch, _twin
from synapse_ha.core.codec.decode_errors import CodecError
from synapse_ha.core.codec.from_plain import from_plain, from_plain_compiled
from synapse_ha.core.codec.to_plain import to_plain
from synapse_ha.core.codec.versioned import (
    decode_command,
    decode_state,
    encode_command,
    encode_state,
)
from synapse_ha.core.model import ClusterState, JobSpec, Resources
from tests.core.test_codec import a_running_and_a_waiting_job


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        (
            b'{"v":2,"type":"BindPlan","body":{"placements":[{"job_id":"j","attempts_made":0,'
            b'"members":[{"rank":0,"node_id":"n","gpus":[0,"x"]}]}],"reasons":[]}}',
            "BindPlan.placements[0].members[0].gpus[1]: expected an integer, got str",
        ),
        (
            b'{"v":2,"type":"BindPlan","body":{"placements":[],"reasons":[["j"]]}}',
            "BindPlan.reasons[0]: expected 2 items, got 1",
        ),
        (
            b'{"v":2,"type":"BindPlan","body":{"placements":{},"reasons":[]}}',
            "BindPlan.placements: expected a list, got dict",
        ),
        (
            b'{"v":2,"type":"BindPlan","body":{"placements":[5],"reasons":[]}}',
            "BindPlan.placements[0]: expected an object, got int",
        ),
        (
            b'{"v":2,"type":"SubmitJob","body":{"spec":{"name":"x","env":[["A",1]]},'
            b'"request_id":"r","now_ms":1,"owner":"a"}}',
            "SubmitJob.spec.env[0][1]: expected a string, got int",
        ),
        (
            b'{"v":2,"type":"SubmitJob","body":{"spec":null,"request_id":"r","now_ms":1,'
            b'"owner":"a"}}',
            "SubmitJob.spec: expected an object, got NoneType",
        ),
        (
            b'{"v":2,"type":"ReportMembers","body":{"node_id":"n","events":[{"job_id":"j",'
            b'"fencing_token":3,"rank":0,"kind":"bogus","exit_code":1,"detail":""}]}}',
            "ReportMembers.events[0].kind: 'bogus' is not one of started, exited, checkpoint",
        ),
    ],
)
def test_nested_errors_name_the_path_and_the_rule(payload: bytes, message: str) -> None:
    with pytest.raises(CodecError) as info:
        decode_command(payload)
    assert str(info.value) == message


def test_each_decode_builds_new_equal_values() -> None:
    spec = JobSpec(
        name="x", command=("true",), replicas=2, resources=Resources(cpu_milli=10, gpu=1)
    )
    encoded = encode_command(c.SubmitJob(spec=spec, request_id="r", now_ms=1, owner="a"))
    first, second = decode_command(encoded), decode_command(encoded)
    assert first == second
    assert isinstance(first, c.SubmitJob) and isinstance(second, c.SubmitJob)
    assert first.spec == spec and first.spec is not second.spec
    # A malformed command after good ones still fails, and good ones still decode after it.
    with pytest.raises(CodecError):
        decode_command(encoded.replace(b'"replicas":2', b'"replicas":"2"'))
    assert decode_command(encoded) == first


def assert_built_as_by_constructors(value: Any) -> None:
    """Every record in ``value`` (a decoded tree) equals the record its constructor
    builds from its fields, with every field set; a frozen one hashes alike and stays
    frozen. (Fields the constructor does not take are derived, not decoded.)"""
    if isinstance(value, dict):
        for item in value.values():
            assert_built_as_by_constructors(item)
    elif isinstance(value, (list, tuple, set, frozenset)):
        for item in value:
            assert_built_as_by_constructors(item)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {f.name: getattr(value, f.name) for f in dataclasses.fields(value) if f.init}
        rebuilt = type(value)(**fields)
        assert rebuilt == value
        if type(value).__dataclass_params__.frozen:  # type: ignore[attr-defined]
            assert hash(rebuilt) == hash(value)
            name = next(iter(fields))
            with pytest.raises(dataclasses.FrozenInstanceError):
                setattr(value, name, fields[name])
        for item in fields.values():
            assert_built_as_by_constructors(item)


def test_a_decoded_state_holds_records_as_their_constructors_build_them() -> None:
    cl = a_running_and_a_waiting_job()
    for compact in (False, True):
        cl.state.config = dataclasses.replace(cl.state.config, compact_state=compact)
        data = encode_state(cl.state)
        decoded = decode_state(data)
        assert decoded == cl.state
        assert_built_as_by_constructors(decoded)
        # The compiled decoders alone decode it whole.
        assert from_plain_compiled(ClusterState, json.loads(data)["state"]) == cl.state
        # Defaults made by a factory are made afresh for each record and each decode.
        again = decode_state(data)
        assert again.tokens is not decoded.tokens
        specs = [j.spec for j in decoded.jobs.values()]
        assert specs[0].retries is not again.jobs[next(iter(again.jobs))].spec.retries


@dataclasses.dataclass(frozen=True, slots=True)
class Plain:
    name: str
    size: int = 1


@dataclasses.dataclass(frozen=True, slots=True)
class Checked:
    """Its ``__post_init__`` runs for a decoded value too."""

    name: str

    def __post_init__(self) -> None:
        if not self.name:
            raise TypeError("name must not be empty")


@dataclasses.dataclass
class Unslotted:
    items: tuple[Plain, ...] = ()


@dataclasses.dataclass(frozen=True, slots=True)
class Derived(Plain):
    extra: str = ""


@dataclasses.dataclass(slots=True)
class Mixed:
    either: Plain | Derived
    checked: Checked | None = None
    by_name: dict[str, Unslotted] = dataclasses.field(default_factory=dict)
    codes: frozenset[int] = frozenset()
    pairs: tuple[tuple[str, int | str], ...] = ()
    anything: Any = None


def test_only_records_built_by_a_plain_init_are_built_without_it() -> None:
    assert _twin(Plain) is not None and _twin(Mixed) is not None
    # A __post_init__, no slots, a base class: built by calling the constructor.
    assert _twin(Checked) is None and _twin(Unslotted) is None and _twin(Derived) is None
    value = Mixed(
        Derived("d", 2, "x"),
        Checked("c"),
        {"u": Unslotted((Plain("p"), Plain("q", 3)))},
        frozenset({3, 1}),
        (("a", 1), ("b", "two")),
        {"any": [1]},
    )
    plain = to_plain(value)
    assert from_plain(Mixed, plain) == value
    assert from_plain_compiled(Mixed, plain) == value
    assert_built_as_by_constructors(from_plain(Mixed, plain))
    # The constructor's own check still runs, on the fast path and the generic one.
    plain["checked"] = {"name": ""}
    with pytest.raises(CodecError, match=r"^\$\.checked: name must not be empty"):
        from_plain(Mixed, plain)


@pytest.mark.parametrize(
    ("plain", "message"),
    [
        ({"either": {"name": "p", "size": True}}, "$.either.size: expected an integer, got bool"),
        ({"either": {"name": "p"}, "pairs": [["a", 1, 2]]}, "$.pairs[0]: expected 2 items"),
        ({"either": {"name": "p"}, "pairs": [["a", None]]}, "$.pairs[0][1]: "),
        ({"either": {"name": "p"}, "codes": [1, "2"]}, "$.codes[1]: expected an integer"),
        (
            {"either": {"name": "p"}, "by_name": {"u": {"items": [["p", 1, 2]]}}},
            "$.by_name.u.items[0]: 3 fields",
        ),
        ({"either": {"name": "p"}, "by_name": {"u": 5}}, "$.by_name.u: expected an object"),
        ({"either": {"name": "p"}, "nope": 1}, "$: unknown field 'nope'"),
        ({}, "$: Mixed.__init__() missing 1 required positional argument"),
    ],
)
def test_what_the_compiled_decoders_refuse_the_generic_path_names(
    plain: dict[str, Any], message: str
) -> None:
    with pytest.raises(Mismatch):
        from_plain_compiled(Mixed, plain)
    with pytest.raises(CodecError) as info:
        from_plain(Mixed, plain)
    assert str(info.value).startswith(message)
