"""``queue:`` and ``priority:`` (a number or a class name) in a job spec, the rules on
them, and the rules a spec meets against the cluster's queues and classes."""

from __future__ import annotations

from typing import Any

import pytest

from synapse_ha.core.cluster_config import DEFAULT_PRIORITY_CLASSES, Queue
from synapse_ha.core.queues.job_rules import check_job_queue
from synapse_ha.core.spec.document import SpecError, parse_job_spec
from synapse_ha.core.spec.validation import ViolationCode


def doc(**overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"name": "train", "replicas": 2, "command": "true"}
    base.update(overrides)
    return base


def test_queue_and_class_are_read() -> None:
    spec = parse_job_spec(doc(queue="team-a", priority="high")).spec
    assert (spec.queue, spec.priority_class, spec.priority) == ("team-a", "high", 0)


def test_a_number_is_a_plain_priority_and_no_queue_means_default() -> None:
    spec = parse_job_spec(doc(priority=-5)).spec
    assert (spec.queue, spec.priority_class, spec.priority) == ("default", "", -5)


@pytest.mark.parametrize(
    ("overrides", "field", "code", "words"),
    [
        ({"queue": "Team_A"}, "queue", ViolationCode.INVALID_FIELD, "a queue name is lowercase"),
        ({"queue": ""}, "queue", ViolationCode.INVALID_FIELD, "a queue name is"),
        ({"queue": 7}, "queue", ViolationCode.WRONG_TYPE, "expected a string"),
        ({"priority": "Top!"}, "priority", ViolationCode.INVALID_FIELD, "a class name is"),
        ({"priority": 1.5}, "priority", ViolationCode.WRONG_TYPE, "integer or a priority class"),
        ({"priority": True}, "priority", ViolationCode.WRONG_TYPE, "integer or a priority class"),
    ],
)
def test_bad_queue_or_class_names_the_field(
    overrides: dict[str, Any], field: str, code: ViolationCode, words: str
) -> None:
    with pytest.raises(SpecError) as refused:
        parse_job_spec(doc(**overrides))
    assert (refused.value.field, refused.value.code) == (field, code)
    assert words in refused.value.rule


def test_a_spec_against_the_clusters_queues_and_classes() -> None:
    queues = {
        "default": Queue("default"),
        "team-a": Queue("team-a", gpu=8, priority_classes=("low",)),
    }
    classes = DEFAULT_PRIORITY_CLASSES

    def problems(**overrides: Any) -> list[tuple[str, str]]:
        spec = parse_job_spec(doc(**overrides)).spec
        return [(v.field, v.rule) for v in check_job_queue(spec, queues, classes)]

    assert problems() == []
    assert problems(queue="team-a", priority="low") == []
    assert problems(queue="team-a", priority=5) == [
        ("priority", "queue team-a allows the classes low, not a plain number")
    ]
    assert problems(queue="team-b") == [("queue", "no queue 'team-b' (queues: default, team-a)")]
    assert problems(priority="urgent") == [
        ("priority", "no priority class 'urgent' (high, low, normal)")
    ]
    assert problems(queue="team-a", priority="high") == [
        ("priority", "queue team-a allows the classes low, not 'high'")
    ]
