"""synctl with credentials: where it finds its token, the token commands, owners in
``status``, and refusals as one line with exit code 5. Against an in-process replica
with the auth interceptor (tests/rpc/authed.py)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from synapse_ha.cli import config
from synapse_ha.cli.app import CommandFailed, find_token
from synapse_ha.cli.defaults import ExitCode
from synapse_ha.cli.main import cli
from synapse_ha.client.credentials import default_token_file
from synapse_ha.client.limits import limits_from_proto
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb
from tests.rpc.authed import Replica, serving_replica


@pytest.fixture
def replica() -> Iterator[Replica]:
    with serving_replica() as started:
        yield started


def synctl(replica: Replica, *args: str, token: str | None = None) -> Result:
    env = {"SYNAPSE_TOKEN": token or "", "XDG_CONFIG_HOME": "/nonexistent"}
    return CliRunner().invoke(cli, ["--cluster", replica.address, "--timeout", "5", *args], env=env)


# ------------------------------------------------------------------ finding the token


def test_the_token_comes_from_the_file_then_the_environment_then_the_config_dir(
    tmp_path: Path,
) -> None:
    config = tmp_path / "config"
    (config / "synapse").mkdir(parents=True)
    (config / "synapse" / "token").write_text("syn_from_config\n")
    given = tmp_path / "given"
    given.write_text("  syn_from_file\n")
    env = {"XDG_CONFIG_HOME": str(config), "SYNAPSE_TOKEN": "syn_from_env"}
    assert default_token_file(env) == config / "synapse" / "token"
    assert find_token(given, env) == "syn_from_file"
    assert find_token(None, env) == "syn_from_env"
    assert find_token(None, {"XDG_CONFIG_HOME": str(config)}) == "syn_from_config"
    assert find_token(None, {"XDG_CONFIG_HOME": str(tmp_path / "none")}) is None
    home = {"HOME": str(tmp_path)}
    assert default_token_file(home) == Path.home() / ".config" / "synapse" / "token"
    with pytest.raises(CommandFailed) as missing:
        find_token(tmp_path / "absent", env)
    assert missing.value.code is ExitCode.USAGE and "absent" in str(missing.value)


def test_a_token_file_given_on_the_command_line_is_used(replica: Replica, tmp_path: Path) -> None:
    path = tmp_path / "admin.token"
    path.write_text(replica.tokens["admin"] + "\n")
    result = CliRunner().invoke(
        cli,
        ["--cluster", replica.address, "--token-file", str(path), "token", "list"],
        env={"SYNAPSE_TOKEN": "", "XDG_CONFIG_HOME": "/nonexistent"},
    )
    assert result.exit_code == 0, result.output
    assert "alice" in result.stdout


# --------------------------------------------------------------------- token commands


def test_an_admin_creates_lists_and_revokes_a_token(replica: Replica) -> None:
    admin = replica.tokens["admin"]
    made = synctl(
        replica, "token", "create", "--user", "erin", "--role", "operator", "--ttl", "90d",
        token=admin,
    )  # fmt: skip
    assert made.exit_code == 0, made.output
    text = made.stdout.strip()
    assert text.startswith("syn_") and "\n" not in text  # stdout is the token alone
    token_id = text.split("_")[1]
    assert f"token {token_id} for erin (role operator)" in made.stderr
    assert synctl(replica, "cordon", "n1", token=text).exit_code == 0  # works at once

    listed = synctl(replica, "token", "list", "-o", "json", token=admin)
    assert listed.exit_code == 0, listed.output
    tokens = {t["id"]: t for t in json.loads(listed.stdout)["tokens"]}
    erin = tokens[token_id]
    assert (erin["user"], erin["role"], erin["created_by"]) == ("erin", "operator", "user:root")
    assert erin["expires_at_ms"] == replica.clock[0] + 90 * 24 * 3600 * 1000
    assert text.split("_", 2)[2] not in listed.stdout

    revoked = synctl(replica, "token", "revoke", token_id, token=admin)
    assert revoked.exit_code == 0, revoked.output
    refused = synctl(replica, "cordon", "n1", token=text)
    assert refused.exit_code == ExitCode.DENIED
    assert refused.stderr.count("\n") == 1 and "revoked" in refused.stderr
    assert refused.stderr.rstrip().endswith("(UNAUTHENTICATED)")


def test_a_bad_ttl_is_a_usage_error(replica: Replica) -> None:
    result = synctl(
        replica, "token", "create", "--user", "x", "--ttl", "soon", token=replica.tokens["admin"]
    )
    assert result.exit_code == ExitCode.USAGE
    assert "ttl" in result.stderr


# --------------------------------------------------------------- refusals and owners


@pytest.mark.parametrize(
    ("who", "args", "words"),
    [
        ("alice", ("cordon", "n1"), "user:alice (role user) may not call CordonNode"),
        ("alice", ("token", "list"), "may not call ListTokens; it needs role admin"),
        (None, ("jobs",), "no credential"),
    ],
)
def test_refusals_are_one_line_and_exit_5(
    replica: Replica, who: str | None, args: tuple[str, ...], words: str
) -> None:
    result = synctl(replica, *args, token=replica.tokens[who] if who else None)
    assert result.exit_code == ExitCode.DENIED, result.output
    assert result.stderr.count("\n") == 1
    assert result.stderr.startswith("error: ") and words in result.stderr


def test_cancelling_another_users_job_is_refused(replica: Replica) -> None:
    result = synctl(replica, "cancel", replica.jobs["bob"], token=replica.tokens["alice"])
    assert result.exit_code == ExitCode.DENIED
    assert "belongs to user bob" in result.stderr and "(PERMISSION_DENIED)" in result.stderr


def test_status_shows_the_owner_and_who_cancelled(replica: Replica) -> None:
    job_id = replica.jobs["bob"]
    ops = replica.tokens["operator"]
    assert synctl(replica, "cancel", job_id, token=ops).exit_code == 0
    shown = synctl(replica, "status", job_id, "-o", "json", token=replica.tokens["alice"])
    assert shown.exit_code == 0, shown.output
    doc = json.loads(shown.stdout)
    assert (doc["owner"], doc["cancelled_by"], doc["redacted"]) == ("bob", "user:ops", True)
    assert doc["command"] is None
    table = synctl(replica, "status", job_id, token=replica.tokens["bob"])
    assert "OWNER:         bob" in table.stdout and "CANCELLED BY:  user:ops" in table.stdout


# ------------------------------------------------------------- priority and limits


def test_a_token_allowing_a_preempting_class_and_a_higher_priority(replica: Replica) -> None:
    admin = replica.tokens["admin"]
    made = synctl(
        replica, "token", "create", "--user", "frank", "--priority-class", "high",
        "--max-priority", "50", "-o", "json", token=admin,
    )  # fmt: skip
    assert made.exit_code == 0, made.output
    token_id = json.loads(made.stdout)["id"]
    listed = json.loads(synctl(replica, "token", "list", "-o", "json", token=admin).stdout)
    frank = next(t for t in listed["tokens"] if t["id"] == token_id)
    assert (frank["priority_classes"], frank["max_priority"]) == (["high"], 50)
    table = synctl(replica, "token", "list", token=admin).stdout
    assert "high; up to 50" in table
    too_high = synctl(
        replica, "token", "create", "--user", "x", "--max-priority", "2000000", token=admin
    )
    assert too_high.exit_code == ExitCode.USAGE


def test_the_limits_are_shown_to_users_and_set_by_admins(replica: Replica) -> None:
    shown = synctl(replica, "config", "show", "-o", "json", token=replica.tokens["alice"])
    assert shown.exit_code == 0, shown.output
    limits = json.loads(shown.stdout)["limits"]
    assert (limits["submit_burst"], limits["env_bytes"]) == (200, 32 * 1024)
    table = synctl(replica, "config", "show", token=replica.tokens["bob"]).stdout
    assert "limits.pending_jobs_per_user" in table

    changed = synctl(
        replica, "config", "set", "limits.submit_per_s=7", "limits.pending_jobs_per_user=1_000",
        "-o", "json", token=replica.tokens["admin"],
    )  # fmt: skip
    assert changed.exit_code == 0, changed.output
    after = json.loads(changed.stdout)["limits"]
    assert (after["submit_per_s"], after["pending_jobs_per_user"]) == (7, 1000)
    assert after["submit_burst"] == 200  # the others stay

    refused = synctl(
        replica, "config", "set", "limits.submit_per_s=1", token=replica.tokens["alice"]
    )
    assert refused.exit_code == ExitCode.DENIED and "(PERMISSION_DENIED)" in refused.stderr
    for bad in ("submit_per_s=1", "limits.submit_per_s=fast", "limits.no_such=3"):
        wrong = synctl(replica, "config", "set", bad, token=replica.tokens["admin"])
        assert wrong.exit_code == ExitCode.USAGE, (bad, wrong.output)
    out_of_range = synctl(
        replica, "config", "set", "limits.watch_streams_total=0", token=replica.tokens["admin"]
    )
    assert out_of_range.exit_code == ExitCode.USAGE
    assert "limits.watch_streams_total" in out_of_range.stderr
    again = synctl(replica, "config", "show", "-o", "json", token=replica.tokens["alice"])
    unchanged = json.loads(again.stdout)["limits"]
    assert unchanged == after


def test_the_limits_document_keeps_the_wire_order_and_every_value() -> None:
    wire = pb.Limits(**{f.name: i + 1 for i, f in enumerate(pb.Limits.DESCRIPTOR.fields)})
    document = config.limits_document(limits_from_proto(wire))
    assert list(document) == [f.name for f in pb.Limits.DESCRIPTOR.fields]
    assert list(document.values()) == list(range(1, len(document) + 1))
