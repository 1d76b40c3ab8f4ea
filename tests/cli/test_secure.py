"""synctl against a secure cluster (mutual TLS, tokens, log grants): three real replicas
and two mock-GPU workers on 127.0.0.1, with the credentials ``synctl dev up`` exports."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from synapse_ha.cli.defaults import ExitCode
from synapse_ha.security.pki import issue_client
from tests.cli.conftest import Synctl

pytestmark = pytest.mark.integration


def spec_file(tmp_path: Path, name: str, body: str) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(f"name: {name}\n{body}")
    return path


def user_env(synctl: Synctl, tmp_path: Path, name: str) -> dict[str, str]:
    """The environment of user ``name``: the transport-only client certificate, and a
    token the admin creates with ``synctl token create --user NAME``."""
    made = synctl("token", "create", "--user", name)
    assert made.exit_code == 0, made.output
    token_file = tmp_path / f"{name}.token"
    token_file.write_text(made.stdout.strip() + "\n")
    return {**synctl.admin_env, "SYNAPSE_TOKEN_FILE": str(token_file)}


def test_the_exported_environment_works(synctl: Synctl) -> None:
    result = synctl("cluster", "-o", "json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["healthy"] is True


def test_without_tls_files_synctl_cannot_reach_and_hints_at_tls(synctl: Synctl) -> None:
    env = {"SYNAPSE_TOKEN_FILE": synctl.admin_env["SYNAPSE_TOKEN_FILE"]}
    result = synctl("--timeout", "2", "jobs", env=env)
    assert result.exit_code == ExitCode.UNREACHABLE, result.output
    assert result.stderr.count("\n") == 1
    assert "the client has no TLS files: set SYNAPSE_CA, SYNAPSE_CERT, SYNAPSE_KEY" in (
        result.stderr
    )
    as_json = synctl("--timeout", "2", "-o", "json", "jobs", env=env)
    assert json.loads(as_json.stderr)["error"]["code"] == "UNREACHABLE"


@pytest.mark.parametrize(
    ("given", "missing"),
    [
        (("SYNAPSE_CA",), ["--cert ($SYNAPSE_CERT)", "--key ($SYNAPSE_KEY)"]),
        (("SYNAPSE_CA", "SYNAPSE_CERT"), ["--key ($SYNAPSE_KEY)"]),
        (("SYNAPSE_CERT", "SYNAPSE_KEY"), ["--ca ($SYNAPSE_CA)"]),
    ],
)
def test_partial_tls_settings_are_a_usage_error_naming_what_is_missing(
    synctl: Synctl, given: tuple[str, ...], missing: list[str]
) -> None:
    env = {name: synctl.admin_env[name] for name in given}
    result = synctl("jobs", env=env)
    assert result.exit_code == ExitCode.USAGE, result.output
    assert result.stderr.startswith("error: incomplete TLS settings: ")
    assert f"{', '.join(missing)} not given" in result.stderr


def test_a_key_that_is_not_the_certificates_is_a_usage_error(
    synctl: Synctl, tmp_path: Path
) -> None:
    assert synctl.cluster.credentials is not None
    other = issue_client(synctl.cluster.credentials.ca_dir, "other", tmp_path)
    env = {**synctl.admin_env, "SYNAPSE_KEY": str(other.key)}
    result = synctl("jobs", env=env)
    assert result.exit_code == ExitCode.USAGE, result.output
    assert str(other.key) in result.stderr and "is not the private key" in result.stderr


def test_tls_files_in_the_config_directory_are_found(synctl: Synctl, tmp_path: Path) -> None:
    admin = synctl.admin_env
    folder = tmp_path / "config" / "synapse"
    folder.mkdir(parents=True)
    for variable, name in (("SYNAPSE_CA", "ca.pem"), ("SYNAPSE_CERT", "cert.pem")):
        shutil.copy(admin[variable], folder / name)
    env = {"SYNAPSE_TOKEN_FILE": admin["SYNAPSE_TOKEN_FILE"]}
    env["XDG_CONFIG_HOME"] = str(tmp_path / "config")
    # The key is missing from the directory and not given: an incomplete setting.
    incomplete = synctl("jobs", env=env)
    assert incomplete.exit_code == ExitCode.USAGE, incomplete.output
    assert "--key ($SYNAPSE_KEY) not given" in incomplete.stderr
    shutil.copy(admin["SYNAPSE_KEY"], folder / "key.pem")
    complete = synctl("jobs", env=env)
    assert complete.exit_code == 0, complete.output


def test_a_user_reads_her_own_logs_and_another_user_is_refused(
    synctl: Synctl, tmp_path: Path
) -> None:
    alice = user_env(synctl, tmp_path, "alice")
    bob = user_env(synctl, tmp_path, "bob")
    path = spec_file(tmp_path, "mine", "replicas: 2\ncommand: 'echo secret of $RANK'\n")
    submitted = synctl("submit", str(path), "--wait", env=alice)
    assert submitted.exit_code == 0, submitted.output + synctl.diagnostics()
    job_id = submitted.stdout.strip()
    owner = json.loads(synctl("status", job_id, "-o", "json", env=alice).stdout)["owner"]
    assert owner == "alice"

    logs = synctl("logs", job_id, env=alice)
    assert logs.exit_code == 0, logs.output
    assert sorted(logs.stdout.splitlines()) == ["[rank 0] secret of 0", "[rank 1] secret of 1"]
    followed = synctl("logs", job_id, "--member", "1", "-f", env=alice)
    assert followed.exit_code == 0, followed.output
    assert followed.stdout.splitlines() == ["secret of 1"]

    for args in (("logs", job_id), ("logs", job_id, "-f"), ("cancel", job_id)):
        refused = synctl(*args, env=bob)
        assert refused.exit_code == ExitCode.DENIED, (args, refused.output)
        assert refused.stdout == "", args
        assert refused.stderr.rstrip().endswith("(PERMISSION_DENIED)"), (args, refused.stderr)
        assert "secret" not in refused.output

    # An admin may read anyone's logs.
    admin = synctl("logs", job_id, "--member", "0")
    assert admin.exit_code == 0, admin.output
    assert admin.stdout.splitlines() == ["secret of 0"]


def test_bob_cannot_cancel_alices_running_job(synctl: Synctl, tmp_path: Path) -> None:
    alice = user_env(synctl, tmp_path, "alice")
    bob = user_env(synctl, tmp_path, "bob")
    path = spec_file(tmp_path, "long", "replicas: 1\ncommand: 'sleep 60'\n")
    submitted = synctl("submit", str(path), env=alice)
    assert submitted.exit_code == 0, submitted.output
    job_id = submitted.stdout.strip()
    try:
        refused = synctl("cancel", job_id, env=bob)
        assert refused.exit_code == ExitCode.DENIED, refused.output
        assert "belongs to user alice" in refused.stderr
        state = json.loads(synctl("status", job_id, "-o", "json").stdout)["state"]
        assert state != "CANCELLED"
        mine = synctl("cancel", job_id, env=alice)
        assert mine.exit_code == 0, mine.output
        assert mine.stdout.strip() == f"job {job_id}: CANCELLED"
    finally:
        synctl("cancel", job_id)
