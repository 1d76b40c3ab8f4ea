"""Job spec validation: quantities, rules, and errors that name the field."""

from __future__ import annotations

from typing import Any

import pytest

from synapse_ha.core.spec import SpecError, parse_cpu, parse_duration, parse_job_spec, parse_memory


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
