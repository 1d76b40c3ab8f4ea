"""``synctl ca init`` and ``synctl ca issue`` through click's runner."""

from __future__ import annotations

import ipaddress
from pathlib import Path

from click.testing import CliRunner
from cryptography import x509

from synapse_ha.cli.main import cli
from synapse_ha.core.identity.access import Role, replica, user
from synapse_ha.security.pki import identity_of_cert


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.output


def test_init_then_issue_prints_the_paths_it_wrote(tmp_path: Path) -> None:
    ca_dir, out = tmp_path / "ca", tmp_path / "certs"
    code, output = run("ca", "init", str(ca_dir))
    assert code == 0, output
    assert output.splitlines() == [str(ca_dir / "ca.pem"), str(ca_dir / "ca.key")]

    code, output = run(
        "ca", "issue", "replica", "r1", "--ca-dir", str(ca_dir), "--out", str(out),
        "--host", "127.0.0.1", "--host", "r1.internal", "--days", "30",
    )  # fmt: skip
    assert code == 0, output
    cert, key, ca = (Path(line) for line in output.splitlines())
    assert (cert, key, ca) == (out / "replica-r1.pem", out / "replica-r1.key", ca_dir / "ca.pem")
    assert identity_of_cert(cert.read_bytes()) == replica("r1")
    parsed = x509.load_pem_x509_certificate(cert.read_bytes())
    san = parsed.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("127.0.0.1")]
    assert san.get_values_for_type(x509.DNSName) == ["replica.synapse.invalid", "r1.internal"]
    lifetime = parsed.not_valid_after_utc - parsed.not_valid_before_utc
    assert 29 < lifetime.days <= 30

    code, output = run(
        "ca",
        "issue",
        "user",
        "alice",
        "--role",
        "admin",
        "--ca-dir",
        str(ca_dir),
        "--out",
        str(out),
    )
    assert code == 0, output
    assert identity_of_cert((out / "user-alice.pem").read_bytes()) == user("alice", Role.ADMIN)
    code, output = run("ca", "issue", "user", "bob", "--ca-dir", str(ca_dir), "--out", str(out))
    assert code == 0, output
    assert identity_of_cert((out / "user-bob.pem").read_bytes()) == user("bob", Role.USER)


def test_a_second_init_is_refused_and_keeps_the_ca(tmp_path: Path) -> None:
    assert run("ca", "init", str(tmp_path / "ca"))[0] == 0
    before = (tmp_path / "ca" / "ca.key").read_bytes()
    code, output = run("ca", "init", str(tmp_path / "ca"))
    assert code == 1
    assert "a CA is there already" in output
    assert (tmp_path / "ca" / "ca.key").read_bytes() == before


def test_issue_errors_are_clean(tmp_path: Path) -> None:
    ca_dir, out = str(tmp_path / "ca"), str(tmp_path / "out")
    assert run("ca", "init", ca_dir)[0] == 0
    code, output = run("ca", "issue", "worker", "no/slash", "--ca-dir", ca_dir, "--out", out)
    assert code == 2
    assert "Invalid value for 'NAME'" in output
    code, output = run("ca", "issue", "worker", "n1", "--role", "admin", "--ca-dir", ca_dir)
    assert (code, "only user certificates carry a role" in output) == (2, True)
    code, output = run("ca", "issue", "pet", "n1", "--ca-dir", ca_dir)
    assert code == 2
    assert not Path(out).exists()

    assert run("ca", "issue", "worker", "n1", "--ca-dir", ca_dir, "--out", out)[0] == 0
    code, output = run("ca", "issue", "worker", "n1", "--ca-dir", ca_dir, "--out", out)
    assert (code, "already exist" in output) == (1, True)
    code, output = run("ca", "issue", "worker", "n1", "--ca-dir", ca_dir, "--out", out, "--force")
    assert code == 0, output
    code, output = run("ca", "issue", "worker", "n1", "--ca-dir", str(tmp_path / "none"))
    assert code == 2


def test_a_client_certificate_names_nobody(tmp_path: Path) -> None:
    runner = CliRunner()
    assert runner.invoke(cli, ["ca", "init", str(tmp_path / "ca")]).exit_code == 0
    out = tmp_path / "out"
    result = runner.invoke(
        cli, ["ca", "issue", "client", "cli", "--ca-dir", str(tmp_path / "ca"), "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    assert identity_of_cert((out / "client-cli.pem").read_bytes()) is None
    refused = runner.invoke(
        cli,
        ["ca", "issue", "client", "cli2", "--ca-dir", str(tmp_path / "ca"), "--host", "h"],
    )
    assert refused.exit_code == 2
    assert "no hosts" in refused.output


def test_a_user_certificate_names_no_hosts(tmp_path: Path) -> None:
    ca_dir = str(tmp_path / "ca")
    assert run("ca", "init", ca_dir)[0] == 0
    out = tmp_path / "out"
    code, output = run(
        "ca", "issue", "user", "mallory", "--ca-dir", ca_dir, "--host", "10.0.0.1",
        "--out", str(out),
    )  # fmt: skip
    assert (code, "names no hosts" in output) == (2, True)
    assert not out.exists()
