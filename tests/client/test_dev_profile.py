"""The dev profile: what `synctl dev up` leaves for synctl and the Python client, and the
order in which the flags, the variables, the profile and the config directory win."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from synapse_ha.cli.main import cli
from synapse_ha.client import Cluster
from synapse_ha.client.credentials import (
    DEFAULT_CLUSTER,
    DevProfile,
    dev_profile_path,
    discover,
    read_dev_profile,
    remove_dev_profile,
    write_dev_profile,
)
from synapse_ha.security.bundle import ClusterCredentials
from synapse_ha.security.tls import TlsFiles

DEV = "127.0.0.1:17101,127.0.0.1:17102,127.0.0.1:17103"


@pytest.fixture(scope="module")
def credentials(tmp_path_factory: pytest.TempPathFactory) -> ClusterCredentials:
    return ClusterCredentials.ensure(tmp_path_factory.mktemp("dev") / "credentials")


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    """A fresh account: no SYNAPSE_* variables, an empty config directory."""
    return {"HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path / "config")}


def profile(credentials: ClusterCredentials, pid: int | None = None) -> DevProfile:
    return DevProfile(
        cluster=DEV,
        pid=os.getpid() if pid is None else pid,
        tls=credentials.client_tls(),
        token_file=credentials.admin_token_file,
    )


def dead_pid() -> int:
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


def test_without_a_profile_the_default_addresses_and_no_credentials(env: dict[str, str]) -> None:
    found = discover(environ=env)
    assert (found.addresses, found.token, found.tls, found.dev) == (
        DEFAULT_CLUSTER.split(","),
        None,
        None,
        None,
    )


def test_a_running_dev_cluster_is_found_with_its_admin_credentials(
    env: dict[str, str], credentials: ClusterCredentials
) -> None:
    path = write_dev_profile(profile(credentials), env)
    assert path == dev_profile_path(env)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    found = discover(environ=env)
    assert found.addresses == DEV.split(",")
    assert found.tls == credentials.client_tls()
    assert found.token == credentials.admin_token_file.read_text().strip()
    # The same cluster named by a variable (or a flag) keeps its credentials.
    same = discover(environ={**env, "SYNAPSE_CLUSTER": DEV})
    assert same.tls == found.tls and same.token == found.token


def test_variables_win_and_another_cluster_gets_none_of_the_dev_credentials(
    env: dict[str, str], credentials: ClusterCredentials, tmp_path: Path
) -> None:
    write_dev_profile(profile(credentials), env)
    other = discover(environ={**env, "SYNAPSE_CLUSTER": "10.0.0.1:7000"})
    assert (other.addresses, other.token, other.tls, other.dev) == (
        ["10.0.0.1:7000"],
        None,
        None,
        None,
    )
    assert discover("10.0.0.2:7000", environ=env).tls is None  # a flag, the same way
    token_file = tmp_path / "alice.token"
    token_file.write_text("syn_alice\n")
    alice = discover(environ={**env, "SYNAPSE_TOKEN_FILE": str(token_file)})
    assert alice.token == "syn_alice" and alice.addresses == DEV.split(",")
    assert discover(environ={**env, "SYNAPSE_TOKEN": "syn_bob"}).token == "syn_bob"
    theirs = ClusterCredentials.ensure(tmp_path / "theirs").client_tls()
    given = {"SYNAPSE_CA": theirs.ca, "SYNAPSE_CERT": theirs.cert, "SYNAPSE_KEY": theirs.key}
    assert discover(environ={**env, **{k: str(v) for k, v in given.items()}}).tls == theirs


def test_a_stale_profile_is_ignored_and_only_its_writer_removes_it(
    env: dict[str, str], credentials: ClusterCredentials
) -> None:
    write_dev_profile(profile(credentials, pid=dead_pid()), env)
    assert read_dev_profile(env) is None
    assert discover(environ=env).addresses == DEFAULT_CLUSTER.split(",")
    write_dev_profile(profile(credentials), env)
    remove_dev_profile(os.getpid() + 1_000_000, env)  # another writer: left alone
    assert read_dev_profile(env) is not None
    remove_dev_profile(os.getpid(), env)
    assert not dev_profile_path(env).exists()


def test_dev_env_prints_lines_a_shell_evaluates(
    env: dict[str, str], credentials: ClusterCredentials
) -> None:
    runner = CliRunner()
    absent = runner.invoke(cli, ["dev", "env"], env=env)
    assert absent.exit_code == 4
    assert "no dev cluster is running" in absent.stderr and "synctl dev up" in absent.stderr
    write_dev_profile(profile(credentials), env)
    result = runner.invoke(cli, ["dev", "env"], env=env)
    assert result.exit_code == 0, result.output
    script = (
        result.stdout
        + 'echo "$SYNAPSE_CLUSTER|$SYNAPSE_CA|$SYNAPSE_TOKEN_FILE|${SYNAPSE_TOKEN-unset}"'
    )
    shell = subprocess.run(
        ["sh", "-c", script], env={"SYNAPSE_TOKEN": "left over"}, capture_output=True, text=True
    )
    tls = credentials.client_tls()
    assert shell.stdout.strip() == f"{DEV}|{tls.ca}|{credentials.admin_token_file}|unset"


def test_an_insecure_dev_cluster_unsets_every_tls_variable() -> None:
    lines = DevProfile(cluster=DEV, pid=1).exports()
    assert lines == [
        f"export SYNAPSE_CLUSTER={DEV}",
        "unset SYNAPSE_CA SYNAPSE_CERT SYNAPSE_KEY SYNAPSE_TOKEN_FILE SYNAPSE_TOKEN",
    ]


def test_synctl_and_the_python_client_go_where_the_profile_says(
    env: dict[str, str], credentials: ClusterCredentials
) -> None:
    """Nothing listens at the profile's addresses: the refusal names them, so both went
    there, with the profile's TLS files (no TLS hint)."""
    write_dev_profile(profile(credentials), env)
    result = CliRunner().invoke(cli, ["jobs"], env=env)
    assert result.exit_code == 3
    for address in DEV.split(","):
        assert f"{address} (connection refused" in result.stderr
    assert "TLS" not in result.stderr
    with Cluster.from_env(env) as cluster:
        assert cluster.client.addresses == DEV.split(",")
        assert isinstance(cluster.transport.files, TlsFiles)
