"""``prestart:`` in a job spec: a command string (shell) or list (argv), or a mapping of
``command`` and ``timeout`` (default 60s, at most 1h); every error names the field."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from synapse_ha.core.cluster_config import DEFAULT_TOPOLOGY_LEVELS
from synapse_ha.core.health.prestart import Prestart
from synapse_ha.core.spec.document import SpecError, parse_job_spec
from synapse_ha.core.spec.validation import check_job_spec


def doc(prestart: Any) -> dict[str, Any]:
    return {"name": "train", "replicas": 2, "command": "python train.py", "prestart": prestart}


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("nvidia-smi -L", Prestart(("nvidia-smi -L",), True, 60_000)),
        (["/opt/check", "--gpus"], Prestart(("/opt/check", "--gpus"), False, 60_000)),
        ({"command": "test -d /data"}, Prestart(("test -d /data",), True, 60_000)),
        ({"command": ["/opt/check"], "timeout": "2m"}, Prestart(("/opt/check",), False, 120_000)),
        ({"command": "true", "timeout": "1h"}, Prestart(("true",), True, 3_600_000)),
    ],
)
def test_good_prestart_checks(value: Any, expected: Prestart) -> None:
    assert parse_job_spec(doc(value)).spec.prestart == expected


def test_no_prestart_is_none() -> None:
    document = doc("x")
    del document["prestart"]
    assert parse_job_spec(document).spec.prestart is None


@pytest.mark.parametrize(
    ("value", "field", "rule"),
    [
        ("", "prestart", "must not be empty"),
        (3, "prestart", "expected a string or a non-empty list"),
        ([], "prestart", "expected a string or a non-empty list"),
        (["ok", ""], "prestart[1]", "expected a non-empty string"),
        ({"timeout": "1m"}, "prestart.command", "is required"),
        ({"command": "x", "tiemout": "1m"}, "prestart.tiemout", "unknown field"),
        ({"command": 5}, "prestart.command", "expected a string"),
        ({"command": "x", "timeout": "61m"}, "prestart.timeout", "at most 1h"),
        ({"command": "x", "timeout": "0s"}, "prestart.timeout", "more than 0"),
        ({"command": "x", "timeout": "soon"}, "prestart.timeout", "not a duration"),
        ({"command": "a\x00b"}, "prestart.command", "NUL"),
    ],
)
def test_bad_prestart_checks_name_the_field(value: Any, field: str, rule: str) -> None:
    with pytest.raises(SpecError) as info:
        parse_job_spec(doc(value))
    assert info.value.field == field
    assert rule in info.value.rule


def test_the_state_machine_refuses_what_the_parser_refuses() -> None:
    spec = parse_job_spec(doc("true")).spec
    bad = dataclasses.replace(spec, prestart=Prestart(("a", "b"), True, 60_000))
    fields = [v.field for v in check_job_spec(bad, DEFAULT_TOPOLOGY_LEVELS)]
    assert fields == ["prestart.command"]


def test_a_prestart_check_survives_the_wire_to_the_worker() -> None:
    from synapse_ha.core.desired import DesiredMember, LaunchSpec
    from synapse_ha.rpc.from_proto import desired_from_proto, spec_from_proto
    from synapse_ha.rpc.to_proto import desired_to_proto, spec_to_proto

    for value in ("test -d /data", {"command": ["/opt/check", "-v"], "timeout": "5m"}):
        spec = parse_job_spec(doc(value)).spec
        assert spec_from_proto(spec_to_proto(spec)) == spec
        member = DesiredMember(
            "job-1", 1, 7, 0, 1, 0, 1, (), "h:1", 29500, ("h",), LaunchSpec.of(spec)
        )
        assert desired_from_proto(desired_to_proto(member)).spec.prestart == spec.prestart
    bare = parse_job_spec({"name": "t", "replicas": 1, "command": "x"}).spec
    assert spec_from_proto(spec_to_proto(bare)).prestart is None
    assert not desired_to_proto(
        DesiredMember("j", 1, 1, 0, 1, 0, 1, (), "h:1", 1, ("h",), LaunchSpec.of(bare))
    ).prestart_command
