"""A job document's every problem at once, with the closest allowed name for a misspelt
field or value, and the resources a member gets when the document leaves them out."""

from __future__ import annotations

from typing import Any

import pytest

from synapse_ha.core.model import Resources
from synapse_ha.core.spec.document import DEFAULT_RESOURCES, SpecError, parse_job_spec
from synapse_ha.core.spec.validation import ViolationCode


def problems_of(doc: dict[str, Any], levels: tuple[str, ...] | None = ("rack",)) -> SpecError:
    with pytest.raises(SpecError) as caught:
        parse_job_spec(doc, levels)
    return caught.value


def test_every_problem_is_reported_in_the_documents_order() -> None:
    error = problems_of(
        {
            "name": "Train Run",  # a rule on the value
            "replica": 2,  # misspelt
            "resources": {"gpus": 8, "cpu": "two"},  # misspelt, a string for a number
            "command": "python train.py",
            "time_limit": "2 hours",  # not a duration
            "env": {"OK": "1", "BAD": {"nested": True}},  # a mapping for a string
        }
    )
    assert [(v.field, v.code) for v in error.violations] == [
        ("name", ViolationCode.INVALID_FIELD),
        ("replica", ViolationCode.UNKNOWN_FIELD),
        ("resources.gpus", ViolationCode.UNKNOWN_FIELD),
        ("resources.cpu", ViolationCode.INVALID_FIELD),
        ("time_limit", ViolationCode.INVALID_FIELD),
        ("env.BAD", ViolationCode.WRONG_TYPE),
    ]
    assert (error.field, error.code) == ("name", ViolationCode.INVALID_FIELD)
    message = str(error)
    for violation in error.violations:
        assert str(violation) in message
    # "replicas" is misspelt, not missing: said once, as the misspelling.
    assert all(v.field != "replicas" for v in error.violations)


def test_a_required_field_that_is_absent_comes_after_those_given() -> None:
    error = problems_of({"command": "true", "replicas": -1})
    assert [v.field for v in error.violations] == ["replicas", "name"]
    assert error.violations[1].code is ViolationCode.REQUIRED


@pytest.mark.parametrize(
    ("doc", "field", "suggestion"),
    [
        ({"name": "a", "replicas": 1, "comand": "true"}, "comand", "`command`"),
        ({"name": "a", "replica": 1, "command": "true"}, "replica", "`replicas`"),
        (
            {"name": "a", "replicas": 1, "command": "x", "resources": {"gpus": 1}},
            "resources.gpus",
            "`gpu`",
        ),
        (
            {"name": "a", "replicas": 1, "command": "x", "retries": {"maxx": 1}},
            "retries.max",
            "`max`",
        ),
        # A field of resources written at the top (the indentation lost).
        ({"name": "a", "replicas": 1, "command": "x", "cpu": 2}, "cpu", "`resources.cpu`"),
        (
            {"name": "a", "replicas": 1, "command": "x", "topology": {"required": "rak"}},
            "topology.required",
            "`rack`",
        ),
        (
            {
                "name": "a",
                "replicas": 1,
                "command": "x",
                "progress": {"timeout": "1h", "source": "lgo"},
            },
            "progress.source",
            "`log`",
        ),
        (
            {"name": "a", "replicas": 1, "command": "x", "dependencies": {"after_ok": "job-1"}},
            "dependencies.after_ok",
            "`afterok`",
        ),
    ],
)
def test_a_misspelt_field_or_value_names_the_closest_one(
    doc: dict[str, Any], field: str, suggestion: str
) -> None:
    error = problems_of(doc)
    matching = [v for v in error.violations if v.field.startswith(field)]
    assert matching, error.violations
    assert f"did you mean {suggestion}?" in matching[0].rule


def test_a_name_far_from_every_field_lists_the_allowed_ones() -> None:
    error = problems_of({"name": "a", "replicas": 1, "command": "x", "resources": {"zzz": 1}})
    assert error.violations[0].rule == "unknown field (allowed: cpu, gpu, memory)"


def test_a_spec_without_cpu_or_memory_reserves_and_limits_none() -> None:
    bare = parse_job_spec({"name": "a", "replicas": 2, "command": "x"}).spec
    assert (bare.resources.cpu_milli, bare.resources.memory_mib) == (0, 0)
    assert bare.resources == DEFAULT_RESOURCES
    gpus_only = parse_job_spec(
        {"name": "a", "replicas": 2, "command": "x", "resources": {"gpu": 8}}
    ).spec
    assert gpus_only.resources == Resources(cpu_milli=0, memory_mib=0, gpu=8)
    explicit = parse_job_spec(
        {"name": "a", "replicas": 1, "command": "x", "resources": {"cpu": 2, "memory": "4Gi"}}
    ).spec
    assert (explicit.resources.cpu_milli, explicit.resources.memory_mib) == (2000, 4096)
