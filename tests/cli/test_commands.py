"""synctl without a cluster: help for every command, usage errors, invalid specs and an
unreachable cluster."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import click
import pytest
import yaml
from click.testing import CliRunner, Result

from synapse_ha.cli.app import parse_cluster
from synapse_ha.cli.defaults import ExitCode
from synapse_ha.cli.main import cli
from synapse_ha.client.credentials import DEFAULT_CLUSTER
from tests.integration.cluster import reserve_ports

ROOT = Path(__file__).resolve().parents[2]


def run(*args: str, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(cli, list(args), env=env, catch_exceptions=False)


def command_paths() -> list[tuple[str, ...]]:
    paths: list[tuple[str, ...]] = []

    def walk(group: click.Group, prefix: tuple[str, ...]) -> None:
        for name, command in group.commands.items():
            paths.append((*prefix, name))
            if isinstance(command, click.Group):
                walk(command, (*prefix, name))

    walk(cli, ())
    return paths


def test_every_command_the_issue_lists_exists() -> None:
    expected = {
        "submit", "status", "jobs", "explain", "cancel", "logs", "nodes",
        "cordon", "uncordon", "drain", "cluster", "dev", "dev up",
    }  # fmt: skip
    assert expected <= {" ".join(p) for p in command_paths()}


@pytest.mark.parametrize("path", command_paths(), ids=" ".join)
def test_every_command_has_help_with_an_example(path: tuple[str, ...]) -> None:
    result = run(*path, "--help")
    assert result.exit_code == 0, result.output
    assert "Usage: synctl" not in result.stderr
    if path != ("dev",):
        assert "Example" in result.stdout, result.stdout
        assert "synctl " + " ".join(path) in result.stdout


def test_top_level_help_documents_exit_codes_and_completion() -> None:
    result = run("--help")
    assert result.exit_code == 0
    text = " ".join(result.stdout.split())
    assert "_SYNCTL_COMPLETE=bash_source synctl" in text
    assert "3 cluster unreachable" in text
    assert "SYNAPSE_CLUSTER" in text
    assert DEFAULT_CLUSTER in "".join(result.stdout.split())


def test_shell_completion_script() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "synapse_ha.cli"],
        env={**os.environ, "_SYNCTL_COMPLETE": "bash_source"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "_SYNCTL_COMPLETE=bash_complete" in result.stdout
    assert "complete -o nosort -F _synctl_completion synctl" in result.stdout


def test_completing_a_command_name() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "synapse_ha.cli"],
        env={
            **os.environ,
            "_SYNCTL_COMPLETE": "bash_complete",
            "COMP_WORDS": "synctl cor",
            "COMP_CWORD": "1",
        },
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "plain,cordon" in result.stdout.split()


def test_python_dash_m_runs_synctl() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "synapse_ha.cli", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("synctl, version ")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--cluster", "localhost", "jobs"), "'localhost' is not host:port"),
        (("--cluster", "a:1,b:99999", "jobs"), "'b:99999' is not host:port"),
        (("--cluster", ",", "jobs"), "no address given"),
        (("-o", "xml", "jobs"), "'xml' is not one of"),
        (("jobs", "--state", "sleeping"), "'sleeping' is not one of"),
        (("--timeout", "0", "jobs"), "--timeout"),
        (("status",), "Missing argument 'JOB'"),
        (("logs", "j", "--member", "-1"), "--member"),
        (("frobnicate",), "No such command 'frobnicate'"),
    ],
)
def test_usage_errors_exit_2(args: tuple[str, ...], message: str) -> None:
    result = run(*args)
    assert result.exit_code == ExitCode.USAGE, result.output
    assert message in result.stderr


def test_the_cluster_comes_from_the_environment() -> None:
    result = run("jobs", env={"SYNAPSE_CLUSTER": "nonsense"})
    assert result.exit_code == ExitCode.USAGE
    assert "'nonsense' is not host:port" in result.stderr


def test_parse_cluster() -> None:
    assert parse_cluster(" a:1, b:2 ,,[::1]:3") == ["a:1", "b:2", "[::1]:3"]
    assert parse_cluster(DEFAULT_CLUSTER) == [
        "127.0.0.1:7101",
        "127.0.0.1:7102",
        "127.0.0.1:7103",
    ]


@pytest.mark.parametrize(
    ("body", "where"),
    [
        ("replicas: 2\nresources: {memory: lots}\ncommand: x\n", ":3: resources.memory: "),
        ("replicas: 2\ncommand: ''\n", ":3: command: must not be empty"),
        ("replicas: 20000\ncommand: x\n", ":2: replicas: must be between 1 and 10000"),
        ("replicas: 2\ncommand: x\ncolor: red\n", ":4: color: unknown field"),
        ("replicas: 2\nresources: {gpu: -1}\ncommand: x\n", ":3: resources.gpu: must be"),
        ("replicas: '2'\ncommand: x\n", ":2: replicas: expected an integer, got str"),
    ],
)
def test_invalid_specs_exit_2_naming_line_and_field(tmp_path: Path, body: str, where: str) -> None:
    path = tmp_path / "job.yaml"
    path.write_text("name: job\n" + body)
    # Nothing listens on this address: the spec is rejected before any call.
    result = run("--cluster", "127.0.0.1:1", "submit", str(path))
    assert result.exit_code == ExitCode.USAGE, result.output
    assert result.stdout == ""
    assert result.stderr.startswith(f"error: invalid job spec: {path}{where}"), result.stderr
    assert len(result.stderr.splitlines()) == 1


def test_a_missing_spec_file_exits_2_saying_no_such_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    result = run("--cluster", "127.0.0.1:1", "submit", str(missing))
    assert result.exit_code == ExitCode.USAGE
    assert result.stderr == f"error: no such file: {missing}\n"


@pytest.mark.parametrize(
    "args",
    [
        ("jobs",),
        ("status", "j1"),
        ("nodes",),
        ("cluster",),
        ("cancel", "j1"),
        ("logs", "j1"),
        ("cordon", "n1"),
        ("explain", "j1"),
    ],
)
def test_an_unreachable_cluster_exits_3_listing_every_address(args: tuple[str, ...]) -> None:
    ports = reserve_ports(3)  # closed loopback ports: connections are refused
    addresses = [f"127.0.0.1:{p}" for p in ports]
    result = run("--cluster", ",".join(addresses), "--timeout", "0.5", *args)
    assert result.exit_code == ExitCode.UNREACHABLE, result.output
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: cannot reach the cluster; tried")
    for address in addresses:
        assert f"{address} (connection refused" in lines[0]
    assert "Is the cluster running?" in lines[0]


def test_an_unreachable_cluster_on_submit_exits_3(tmp_path: Path) -> None:
    path = ROOT / "examples" / "cpu-gang.yaml"
    port = reserve_ports(1)[0]
    result = run("--cluster", f"127.0.0.1:{port}", "--timeout", "0.5", "submit", str(path))
    assert result.exit_code == ExitCode.UNREACHABLE
    assert f"127.0.0.1:{port}" in result.stderr


def test_dev_up_hands_its_options_to_the_dev_cluster(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import synapse_ha.local.foreground as foreground
    from synapse_ha.local.devoptions import DevClusterOptions

    seen: list[DevClusterOptions] = []

    def fake_run_foreground(options: DevClusterOptions, out: Callable[[str], None]) -> int:
        seen.append(options)
        out("started")
        return 7

    monkeypatch.setattr(foreground, "run_foreground", fake_run_foreground)
    args = ["--workers", "3", "--racks", "3", "--gpus-per-worker", "2", "--data-dir", str(tmp_path)]
    result = run("dev", "up", *args)
    assert result.exit_code == 7
    assert result.stdout == "started\n"
    assert [(o.workers, o.racks, o.gpus_per_worker, o.data_dir) for o in seen] == [
        (3, 3, 2, tmp_path)
    ]
    defaults = run("dev", "up")
    assert defaults.exit_code == 7
    assert (seen[1].workers, seen[1].racks, seen[1].gpus_per_worker, seen[1].data_dir) == (
        4,
        2,
        8,
        None,
    )
    assert run("dev", "up", "--workers", "-1").exit_code == ExitCode.USAGE


def test_with_json_output_an_invalid_spec_is_an_error_document(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text("name: job\nreplicas: two\ncommand: x\n")
    result = run("--cluster", "127.0.0.1:1", "-o", "json", "submit", str(path))
    assert result.exit_code == ExitCode.USAGE, result.output
    assert result.stdout == ""
    error = json.loads(result.stderr)["error"]
    assert error["code"] == "INVALID_FIELD"
    assert (error["field"], error["line"], error["violation"]) == ("replicas", 2, "wrong_type")
    assert error["file"] == str(path)
    assert error["message"].startswith(f"invalid job spec: {path}:2: replicas: expected")


def test_with_yaml_output_an_unreachable_cluster_is_an_error_document() -> None:
    (port,) = reserve_ports(1)
    result = run("--cluster", f"127.0.0.1:{port}", "--timeout", "0.5", "jobs", "-o", "yaml")
    assert result.exit_code == ExitCode.UNREACHABLE, result.output
    error = yaml.safe_load(result.stderr)["error"]
    assert error["code"] == "UNREACHABLE"
    assert error["message"].startswith(f"cannot reach the cluster; tried 127.0.0.1:{port}")
