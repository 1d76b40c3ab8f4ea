"""The shipped worker deployment runs members as their owners: the unit starts the agent
as root with ``--run-as owner``, the example config loads in that mode with a user map,
the worker's key is installed readable by root alone, and the agent refuses a data
directory that anyone but itself could change."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from synapse_ha.programs import worker as worker_main
from synapse_ha.worker.accounts import RunAsMode
from tests.deploy.test_deploy import DEPLOY, Secrets, readme_command, unit


@pytest.fixture
def secrets(tmp_path: Path) -> Secrets:
    return Secrets(tmp_path)


def test_the_worker_unit_runs_the_agent_as_root_with_members_as_their_owners() -> None:
    worker = unit("synapse-worker.service")["Service"]
    assert worker["User"] == "root"
    assert worker["ExecStart"].split()[-2:] == ["--run-as", "owner"]
    # Members pass through the data directory to their own; no one else lists it.
    assert worker["StateDirectoryMode"] == "0711"
    assert worker["NoNewPrivileges"] == "yes"


def test_the_worker_config_loads_in_owner_mode_with_a_user_map(
    secrets: Secrets, tmp_path: Path
) -> None:
    path = DEPLOY / "worker.toml"
    config = worker_main.load_config(["--config", str(path), *secrets.worker_flags()], euid=0)
    assert config.run_as is RunAsMode.OWNER
    assert config.user_map == ()
    # The README's user map, uncommented, is what the agent reads.
    mapped = tmp_path / "worker.toml"
    mapped.write_text(path.read_text().replace('# alice = "svc_alice"', 'alice = "svc_alice"'))
    assert tomllib.loads(mapped.read_text())["user_map"] == {"alice": "svc_alice"}
    config = worker_main.load_config(["--config", str(mapped), *secrets.worker_flags()], euid=0)
    assert config.user_map == (("alice", "svc_alice"),)


def test_the_readme_installs_the_worker_key_for_root_alone() -> None:
    command = readme_command("worker-gpu-017.key")
    assert "-m 0600" in command and "-o root" in command


def test_a_data_directory_others_could_change_is_refused(secrets: Secrets, tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir(mode=0o711)
    data.chmod(0o711)  # as StateDirectoryMode makes it
    flags = [*secrets.worker_flags(), "--data-dir", str(data)]
    assert worker_main.load_config(["--config", str(DEPLOY / "worker.toml"), *flags], euid=0)
    data.chmod(0o775)
    with pytest.raises(worker_main.ConfigError, match="writable by others"):
        worker_main.load_config(["--config", str(DEPLOY / "worker.toml"), *flags], euid=0)
