"""Job spec files: every rule's error names the field, the file line and the rule; the
shipped examples are valid."""

from __future__ import annotations

from pathlib import Path

import pytest

from synapse_ha.client.specfile import (
    SpecFileError,
    SpecFileUnreadable,
    line_in_file,
    load_job_file,
    load_job_spec_file,
)
from synapse_ha.core.spec.document import SpecError, parse_job_spec

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

VALID = """\
name: train
replicas: 2
resources:
  gpu: 1
  cpu: 2
  memory: 4Gi
command: echo $RANK
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(text)
    return path


def error_of(tmp_path: Path, text: str) -> SpecFileError:
    with pytest.raises(SpecFileError) as info:
        load_job_file(write(tmp_path, text))
    return info.value


def test_a_valid_file_gives_the_spec_and_no_request_id(tmp_path: Path) -> None:
    parsed = load_job_file(write(tmp_path, VALID))
    assert parsed.request_id == ""
    assert parsed.spec.name == "train"
    assert parsed.spec.replicas == 2
    assert parsed.spec.resources.memory_mib == 4096
    assert load_job_spec_file(write(tmp_path, VALID)) == parsed.spec


def test_the_request_id_comes_from_the_file(tmp_path: Path) -> None:
    parsed = load_job_file(write(tmp_path, VALID + "request_id: run-7\n"))
    assert parsed.request_id == "run-7"


@pytest.mark.parametrize(
    ("text", "field", "line", "rule_part"),
    [
        (VALID.replace("memory: 4Gi", "memory: lots"), "resources.memory", 6, "'lots'"),
        (VALID + "colour: blue\n", "colour", 8, "unknown field"),
        (VALID.replace("  cpu: 2\n", "  cpu: 2\n  tpu: 1\n"), "resources.tpu", 6, "unknown"),
        (VALID.replace("replicas: 2", "replicas: two"), "replicas", 2, "expected an integer"),
        (VALID.replace("replicas: 2", "replicas: 100000"), "replicas", 2, "between 1 and"),
        (VALID.replace("replicas: 2", "replicas: -4"), "replicas", 2, "between 1 and"),
        (VALID.replace("gpu: 1", "gpu: -1"), "resources.gpu", 4, "between 0 and"),
        (VALID.replace("cpu: 2", "cpu: -2"), "resources.cpu", 5, "must not be negative"),
        (VALID.replace("cpu: 2", "cpu: .inf"), "resources.cpu", 5, "finite"),
        (VALID.replace("command: echo $RANK", "command: ''"), "command", 7, "must not be empty"),
        (VALID.replace("command: echo $RANK", "command: []"), "command", 7, "non-empty list"),
        (
            VALID.replace("command: echo $RANK", "command:\n  - python\n  - ''"),
            "command[1]",
            9,
            "non-empty string",
        ),
        (VALID + "time_limit: -5m\n", "time_limit", 8, "must not be negative"),
        (VALID + "topology:\n  required: galaxy\n", "topology.required", 9, "not a topology"),
        (VALID + "retries:\n  max: 2\n  backoff: 1h\n", "retries.max_backoff", 8, "at least"),
        (VALID + "env:\n  1BAD: x\n", "env.1BAD", 9, "letters, digits"),
        (VALID.replace("name: train", "name: Train_1"), "name", 1, "a-z, 0-9"),
        (VALID + "replicas: 3\n", "replicas", 8, "appears twice"),
        (VALID + "progress:\n  timeout: 5s\n", "progress.timeout", 9, "between 10s and 7d"),
        (VALID + "progress: {timeout: 8d}\n", "progress.timeout", 8, "between 10s and 7d"),
        (VALID + "progress:\n  timeout: 1m\n  source: gpu\n", "progress.source", 10, "file, log"),
        (VALID + "progress:\n  timeout: 1m\n  every: 1s\n", "progress.every", 10, "unknown"),
        (VALID + "progress: 30m\n", "progress", 8, "expected a mapping"),
    ],
)
def test_errors_name_field_line_and_rule(
    tmp_path: Path, text: str, field: str, line: int, rule_part: str
) -> None:
    error = error_of(tmp_path, text)
    assert (error.field, error.line) == (field, line), str(error)
    assert rule_part in error.rule
    assert str(error) == f"{tmp_path / 'job.yaml'}:{line}: {field}: {error.rule}"


def test_a_missing_required_field_has_no_line(tmp_path: Path) -> None:
    error = error_of(tmp_path, VALID.replace("command: echo $RANK\n", ""))
    assert (error.field, error.line, error.rule) == ("command", None, "is required")
    assert str(error) == f"{tmp_path / 'job.yaml'}: command: is required"


def test_broken_yaml_names_the_line(tmp_path: Path) -> None:
    error = error_of(tmp_path, "name: a\n  replicas: [2\n")
    assert error.field == "spec"
    assert error.line == 2
    assert error.rule.startswith("not valid YAML")


@pytest.mark.parametrize(("text", "kind"), [("", "nothing"), ("- a\n- b\n", "list")])
def test_a_document_that_is_not_a_mapping(tmp_path: Path, text: str, kind: str) -> None:
    error = error_of(tmp_path, text)
    assert error.field == "spec"
    assert error.rule == f"expected a mapping, got {kind}"


def test_a_missing_file_says_no_such_file(tmp_path: Path) -> None:
    missing = tmp_path / "missing.yaml"
    with pytest.raises(SpecFileError) as info:
        load_job_file(missing)
    assert info.value.field == "spec"
    assert str(info.value) == f"no such file: {missing}"
    assert isinstance(info.value, SpecFileUnreadable)
    assert isinstance(info.value.os_error, FileNotFoundError)


def test_a_spec_file_error_is_a_spec_error(tmp_path: Path) -> None:
    with pytest.raises(SpecError):
        load_job_file(write(tmp_path, VALID.replace("memory: 4Gi", "memory: lots")))


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.name)
def test_every_example_is_valid(path: Path) -> None:
    spec = load_job_spec_file(path)
    assert spec.name
    assert spec.replicas >= 1


def test_the_examples_show_what_they_promise() -> None:
    names = {p.name for p in EXAMPLES.glob("*.yaml")}
    assert {"cpu-gang.yaml", "torchrun-gang.yaml", "topology-required.yaml"} <= names
    cpu = load_job_spec_file(EXAMPLES / "cpu-gang.yaml")
    assert cpu.resources.gpu == 0 and cpu.replicas > 1 and "$RANK" in cpu.command[0]
    torchrun = load_job_spec_file(EXAMPLES / "torchrun-gang.yaml")
    assert torchrun.command[0].startswith("torchrun")
    for variable in ("$NNODES", "$NODE_RANK", "$MASTER_ADDR", "$MASTER_PORT"):
        assert variable in torchrun.command[0]
    assert load_job_spec_file(EXAMPLES / "topology-required.yaml").topology_required == "rack"


@pytest.mark.parametrize(
    ("resources", "field", "rule_part"),
    [
        ({"cpu": float("nan")}, "resources.cpu", "finite"),
        ({"cpu": 10**400}, "resources.cpu", "between 0 and"),
        ({"memory": 10**400}, "resources.memory", "between 0 and 1Pi"),
        ({"memory": "-1Gi"}, "resources.memory", "must not be negative"),
    ],
)
def test_absurd_quantities_are_spec_errors(
    resources: dict[str, object], field: str, rule_part: str
) -> None:
    with pytest.raises(SpecError) as info:
        parse_job_spec({"name": "a", "replicas": 1, "command": "x", "resources": resources})
    assert info.value.field == field
    assert rule_part in info.value.rule


def test_an_absurd_duration_is_a_spec_error() -> None:
    with pytest.raises(SpecError) as info:
        parse_job_spec({"name": "a", "replicas": 1, "command": "x", "time_limit": 10**400})
    assert info.value.field == "time_limit"


def test_without_known_levels_any_well_formed_level_passes(tmp_path: Path) -> None:
    path = write(tmp_path, VALID + "topology:\n  required: pod\n")
    assert load_job_spec_file(path, topology_levels=None).topology_required == "pod"
    with pytest.raises(SpecFileError) as info:
        load_job_file(path)  # the default levels are zone, block, rack
    assert (info.value.field, info.value.line) == ("topology.required", 9)
    bad = write(tmp_path, VALID + "topology:\n  preferred: 'two words'\n")
    with pytest.raises(SpecFileError) as bad_info:
        load_job_file(bad, topology_levels=None)
    assert (bad_info.value.field, bad_info.value.line) == ("topology.preferred", 9)


def test_line_in_file_finds_a_field_or_its_parent(tmp_path: Path) -> None:
    path = write(tmp_path, VALID)
    assert line_in_file(path, "resources.cpu") == 5
    assert line_in_file(path, "resources.nothing") == 3
    assert line_in_file(path, "absent") is None
    assert line_in_file(tmp_path / "missing.yaml", "name") is None


def test_a_member_cannot_ask_for_more_gpus_than_a_node_has(tmp_path: Path) -> None:
    error = error_of(tmp_path, VALID.replace("gpu: 1", "gpu: 65"))
    assert (error.field, error.line) == ("resources.gpu", 4)
