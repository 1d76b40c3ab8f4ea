"""A job spec file with several mistakes: every one at once, in line order, with the
closest allowed name for a misspelt field, through the file reader and synctl; a YAML
file indented with tabs says so; a spec and an sbatch script without resources get the
same ones."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from synapse_ha.cli.defaults import ExitCode
from synapse_ha.cli.main import cli
from synapse_ha.client.sbatch import translate
from synapse_ha.client.specfile import SpecFileError, load_job_file
from synapse_ha.core.spec.document import parse_job_spec

# The mistakes people make, one a line: a value out of range, a plural for a field, a
# word for a number, a misspelt field, a duration in words.
FIVE_MISTAKES = """\
name: train
replicas: -1
resources:
  gpus: 8
  cpu: four
comand: python train.py
time_limit: 2 hours
"""
EXPECTED = [
    (2, "replicas", "must be between 1 and 10000, got -1"),
    (4, "resources.gpus", "unknown field; did you mean `gpu`?"),
    (5, "resources.cpu", "'four' is not a CPU quantity (e.g. 32, 0.5 or 500m)"),
    (6, "comand", "unknown field; did you mean `command`?"),
    (7, "time_limit", "'2 hours' is not a duration (e.g. 10s, 10m or 12h)"),
]


def run(*args: str) -> Result:
    # Nothing listens on this address: the spec is refused before any call.
    return CliRunner().invoke(cli, ["--cluster", "127.0.0.1:1", *args], catch_exceptions=False)


@pytest.fixture
def spec(tmp_path: Path) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(FIVE_MISTAKES)
    return path


def test_the_file_reader_reports_every_mistake_in_line_order(spec: Path) -> None:
    with pytest.raises(SpecFileError) as caught:
        load_job_file(spec)
    error = caught.value
    assert [(p.line, p.field, p.rule) for p in error.problems] == EXPECTED
    assert (error.line, error.field) == (2, "replicas")
    assert str(error).splitlines() == [f"{spec}:{line}: {f}: {r}" for line, f, r in EXPECTED]


def test_synctl_shows_every_mistake_in_one_error(spec: Path) -> None:
    result = run("submit", str(spec))
    assert result.exit_code == ExitCode.USAGE, result.output
    assert result.stdout == ""
    assert result.stderr.splitlines() == [
        "error: invalid job spec, 5 problems:",
        *(f"  {spec}:{line}: {field}: {rule}" for line, field, rule in EXPECTED),
    ]


def test_synctl_json_lists_every_problem(spec: Path) -> None:
    result = run("-o", "json", "submit", str(spec))
    assert result.exit_code == ExitCode.USAGE, result.output
    error = json.loads(result.stderr)["error"]
    assert [(p["line"], p["field"], p["rule"]) for p in error["problems"]] == EXPECTED
    assert (error["line"], error["field"], error["file"]) == (2, "replicas", str(spec))


def test_a_file_indented_with_tabs_says_so(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text("name: train\nreplicas: 1\ncommand: x\nresources:\n\tgpu: 1\n")
    result = run("submit", str(path))
    assert result.exit_code == ExitCode.USAGE, result.output
    assert result.stderr.startswith(f"error: invalid job spec: {path}:5: spec: not valid YAML")
    assert "(YAML indents with spaces, not tabs)" in result.stderr


def test_a_spec_and_an_sbatch_script_without_resources_get_the_same(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text("name: train\nreplicas: 1\ncommand: python train.py\n")
    from_yaml = load_job_file(path).spec.resources
    script = "#!/bin/bash\n#SBATCH --job-name=train\npython train.py\n"
    from_sbatch = parse_job_spec(translate(script, "train.sh").spec).spec.resources
    assert from_yaml == from_sbatch
    assert (from_yaml.cpu_milli, from_yaml.memory_mib, from_yaml.gpu) == (0, 0, 0)
