"""Job spec validation: quantities, rules, and errors that name the field."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from synapse_ha.core.cluster_config import DEFAULT_TOPOLOGY_LEVELS
from synapse_ha.core.spec.document import (
    SpecError,
    parse_cpu,
    parse_duration,
    parse_job_spec,
    parse_memory,
)
from synapse_ha.core.spec.validation import Violation, ViolationCode, check_job_spec


def doc(**overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "name": "llama-pretrain",
        "replicas": 8,
        "resources": {"gpu": 8, "cpu": 32, "memory": "256Gi"},
        "command": "torchrun train.py",
    }
    base.update(overrides)
    return base


def test_a_full_document_becomes_a_core_spec() -> None:
    parsed = parse_job_spec(
        doc(
            env={"HF_HOME": "/data/hf"},
            workdir="/data/run1",
            priority=100,
            topology={"required": "block", "preferred": "rack"},
            time_limit="12h",
            retries={"max": 3, "backoff": "10s", "max_backoff": "10m"},
            request_id="6f1c",
        )
    )
    spec = parsed.spec
    assert parsed.request_id == "6f1c"
    assert (spec.resources.gpu, spec.resources.cpu_milli) == (8, 32_000)
    assert spec.resources.memory_mib == 256 * 1024
    assert spec.command == ("torchrun train.py",) and spec.shell
    assert spec.time_limit_ms == 12 * 3600 * 1000
    assert spec.retries.max_retries == 3
    assert spec.retries.max_backoff_ms == 600_000
    assert spec.env == (("HF_HOME", "/data/hf"),)


def test_a_list_command_runs_without_a_shell() -> None:
    spec = parse_job_spec(doc(command=["python", "train.py"])).spec
    assert spec.command == ("python", "train.py")
    assert not spec.shell


@pytest.mark.parametrize(
    ("value", "milli"), [(32, 32_000), ("500m", 500), (0.5, 500), ("2", 2_000)]
)
def test_cpu_quantities(value: object, milli: int) -> None:
    assert parse_cpu(value) == milli


@pytest.mark.parametrize(
    ("value", "mib"), [("256Gi", 262_144), ("512Mi", 512), ("1G", 954), ("1Ti", 1 << 20)]
)
def test_memory_quantities(value: object, mib: int) -> None:
    assert parse_memory(value) == mib


@pytest.mark.parametrize(
    ("value", "ms"), [("10s", 10_000), ("10m", 600_000), ("12h", 43_200_000), ("500ms", 500)]
)
def test_durations(value: object, ms: int) -> None:
    assert parse_duration(value, "time_limit") == ms


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"name": "Has_Upper"}, "name"),
        ({"name": "x" * 64}, "name"),
        ({"replicas": 0}, "replicas"),
        ({"replicas": 10_001}, "replicas"),
        ({"replicas": "8"}, "replicas"),
        ({"replicas": True}, "replicas"),
        ({"resources": {"gpu": -1}}, "resources.gpu"),
        ({"resources": {"cpu": "lots"}}, "resources.cpu"),
        ({"resources": {"memory": "12 bananas"}}, "resources.memory"),
        ({"resources": {"tpu": 1}}, "resources.tpu"),
        ({"command": ""}, "command"),
        ({"command": ["ok", 3]}, "command[1]"),
        ({"colour": "blue"}, "colour"),
        ({"time_limit": "forever"}, "time_limit"),
        ({"topology": {"required": "galaxy"}}, "topology.required"),
        ({"retries": {"max": -1}}, "retries.max"),
        ({"env": {"1BAD": "x"}}, "env.1BAD"),
        ({"workdir": "relative"}, "workdir"),
        ({"request_id": "has space"}, "request_id"),
    ],
)
def test_invalid_documents_name_the_field(overrides: dict[str, Any], field: str) -> None:
    with pytest.raises(SpecError) as info:
        parse_job_spec(doc(**overrides))
    assert info.value.field == field
    assert str(info.value).startswith(f"{field}: ")


@pytest.mark.parametrize("missing", ["name", "replicas", "command"])
def test_required_fields(missing: str) -> None:
    document = doc()
    del document[missing]
    with pytest.raises(SpecError) as info:
        parse_job_spec(document)
    assert info.value.field == missing


def test_a_document_must_be_a_mapping() -> None:
    with pytest.raises(SpecError):
        parse_job_spec(["not", "a", "mapping"])


@pytest.mark.parametrize(
    ("document", "code"),
    [
        ({"replicas": 1, "command": "x"}, ViolationCode.REQUIRED),
        (doc(colour="blue"), ViolationCode.UNKNOWN_FIELD),
        (doc(replicas="8"), ViolationCode.WRONG_TYPE),
        (doc(resources={"memory": 12}, env="x"), ViolationCode.WRONG_TYPE),
        (doc(replicas=0), ViolationCode.INVALID_FIELD),
    ],
)
def test_each_error_says_which_kind_of_rule_it_broke(
    document: dict[str, Any], code: ViolationCode
) -> None:
    with pytest.raises(SpecError) as info:
        parse_job_spec(document)
    assert info.value.code is code
    assert info.value.violation == Violation(code, info.value.field, info.value.rule)


def test_the_parser_reports_every_rule_the_built_spec_breaks() -> None:
    with pytest.raises(SpecError) as info:
        parse_job_spec(doc(replicas=0, workdir="relative", request_id="has space"))
    assert [v.field for v in info.value.violations] == ["replicas", "workdir", "request_id"]
    assert info.value.field == "replicas"


def test_the_parser_and_the_state_machine_share_one_rule_set() -> None:
    # A rule that once lived only at the edge: the core refuses it too.
    spec = parse_job_spec(doc()).spec
    relative = dataclasses.replace(spec, workdir="relative")
    assert [v.field for v in check_job_spec(relative, DEFAULT_TOPOLOGY_LEVELS)] == ["workdir"]
    with pytest.raises(SpecError) as info:
        parse_job_spec(doc(workdir="relative"))
    assert info.value.violations == tuple(check_job_spec(relative, DEFAULT_TOPOLOGY_LEVELS))


def test_an_image_reaches_the_core_spec_and_survives_the_wire() -> None:
    from synapse_ha.rpc.from_proto import spec_from_proto
    from synapse_ha.rpc.to_proto import spec_to_proto

    spec = parse_job_spec(doc(image="registry.local/train:1.2")).spec
    assert spec.image == "registry.local/train:1.2"
    assert spec_from_proto(spec_to_proto(spec)) == spec
    with pytest.raises(SpecError) as bad:
        parse_job_spec(doc(image="two words"))
    assert bad.value.field == "image"
