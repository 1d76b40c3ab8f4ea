"""deploy/: the systemd units pass ``systemd-analyze verify``, the example configs load
through the programs' own configuration loaders, agree with the units and run with TLS,
and the secrets deploy/README.md tells operators to make are what the programs accept.

The example configs name files under /etc/synapse; the tests make real ones (a cluster
CA, certificates, a Raft password and a bootstrap token) in a temporary directory and
point the programs at them with flags, which win over the file."""

from __future__ import annotations

import configparser
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from synapse_ha.core.identity.access import split_token
from synapse_ha.core.spec.validation import check_timeouts
from synapse_ha.programs import scheduler as scheduler_main
from synapse_ha.programs import worker as worker_main
from synapse_ha.security.bundle import ClusterCredentials

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
REPLICAS = ("a", "b", "c")
SYSTEMD_ANALYZE = shutil.which("systemd-analyze")
OPENSSL = shutil.which("openssl")
ETC = "/etc/synapse"
WORKER_NODE = "gpu-017"
NO_TLS_MATERIAL = "--tls-ca, --tls-cert, --tls-key not given"


class Secrets:
    """Real stand-ins for the files the example configs name under /etc/synapse."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.creds = ClusterCredentials.ensure(root / "credentials")
        self.raft_password = root / "raft.password"
        self.raft_password.write_text("eR82Q9ICx+bbMKByoNMieHUaHiAj/sFAQSHOPhNEmAI=\n")

    def replica_flags(self, replica_id: str) -> list[str]:
        """Flags that redirect replica ``replica_id``'s data directory, secrets and TLS
        files from /etc and /var/lib to the temporary directory."""
        return [
            "--data-dir",
            str(self.root / replica_id),
            "--raft-password-file",
            str(self.raft_password),
            "--bootstrap-token-file",
            str(self.creds.admin_token_file),
            *self.creds.tls_args(self.creds.replica_tls(replica_id)),
        ]

    def worker_flags(self) -> list[str]:
        return [
            "--data-dir",
            str(self.root / "worker"),
            *self.creds.tls_args(self.creds.worker_tls(WORKER_NODE)),
        ]


@pytest.fixture
def secrets(tmp_path: Path) -> Secrets:
    return Secrets(tmp_path)


def load_replica(secrets: Secrets, replica_id: str, *extra: str) -> scheduler_main.SchedulerConfig:
    path = DEPLOY / f"scheduler-{replica_id}.toml"
    return scheduler_main.load_config(
        ["--config", str(path), *secrets.replica_flags(replica_id), *extra], environ={}
    )


def without_tls_table(text: str) -> str:
    """The config text with its [tls] table (header, keys, and the comment above it)
    removed."""
    lines = text.splitlines()
    start = lines.index("[tls]")
    while start > 0 and lines[start - 1].startswith("#"):
        start -= 1
    end = lines.index("[tls]") + 1
    while end < len(lines) and lines[end] and not lines[end].startswith("["):
        end += 1
    stripped = "\n".join(lines[:start] + lines[end:]) + "\n"
    assert "tls" not in tomllib.loads(stripped)
    assert "/etc/synapse/tls" not in stripped
    return stripped


def readme_command(marker: str) -> str:
    """The one line of deploy/README.md's shell blocks that contains ``marker``."""
    lines = [
        line.strip()
        for line in (DEPLOY / "README.md").read_text().splitlines()
        if marker in line and not line.lstrip().startswith(("#", "|", "-", "`"))
    ]
    assert len(lines) == 1, lines
    return lines[0]


def unit(name: str) -> configparser.ConfigParser:
    """A unit file as sections of (last-wins) keys; enough for the checks below."""
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read_string((DEPLOY / name).read_text())
    return parser


def systemd_version() -> int:
    assert SYSTEMD_ANALYZE is not None
    out = subprocess.run(
        [SYSTEMD_ANALYZE, "--version"], capture_output=True, text=True, check=True
    ).stdout
    match = re.search(r"systemd (\d+)", out)
    assert match, out
    return int(match.group(1))


def shim(directory: Path, program: str) -> Path:
    """An executable standing in for the installed program: the unit's ExecStart must
    name an existing executable for ``verify``; this one runs the real program."""
    path = directory / program
    path.write_text(f'#!/bin/sh\nexec {sys.executable} -m synapse_ha.programs.{program} "$@"\n')
    path.chmod(0o755)
    return path


@pytest.mark.skipif(SYSTEMD_ANALYZE is None, reason="systemd-analyze is not installed here")
def test_the_units_pass_systemd_analyze_verify(tmp_path: Path) -> None:
    assert SYSTEMD_ANALYZE is not None
    units = tmp_path / "units"
    bin_dir = tmp_path / "bin"
    units.mkdir()
    bin_dir.mkdir()
    programs = {
        "/opt/synapse/venv/bin/synapse-scheduler": shim(bin_dir, "scheduler"),
        "/opt/synapse/venv/bin/synapse-worker": shim(bin_dir, "worker"),
    }
    for name in ("synapse-scheduler@.service", "synapse-worker.service"):
        text = (DEPLOY / name).read_text()
        for installed, stand_in in programs.items():
            text = text.replace(installed, str(stand_in))
        (units / name).write_text(text)
    # The template is verified through an instance, so that %i is expanded.
    targets = [str(units / f"synapse-scheduler@{r}.service") for r in REPLICAS]
    result = subprocess.run(
        [SYSTEMD_ANALYZE, "verify", *targets, str(units / "synapse-worker.service")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    output = (result.stdout + result.stderr).strip()
    assert result.returncode == 0, output
    # verify reports bad values as warnings with exit code 0: none may concern our units.
    tolerated = []
    if systemd_version() < 254:  # DelegateSubgroup= arrived in systemd 254
        tolerated.append("Unknown key 'DelegateSubgroup'")
    problems = [
        line
        for line in output.splitlines()
        if str(units) in line or "synapse-" in line
        if not any(t in line for t in tolerated)
    ]
    assert problems == []


def test_the_shim_runs_the_real_programs(tmp_path: Path) -> None:
    for program in ("scheduler", "worker"):
        result = subprocess.run(
            [str(shim(tmp_path, program)), "--help"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert result.returncode == 0, result.stderr
        assert "--config" in result.stdout


def test_the_units_run_with_restart_and_hardening() -> None:
    scheduler = unit("synapse-scheduler@.service")["Service"]
    worker = unit("synapse-worker.service")["Service"]
    # The worker agent runs as root so that members run as their owners
    # (tests/deploy/test_worker_owner_mode.py).
    assert scheduler["User"] == "synapse"
    for service in (scheduler, worker):
        assert service["Restart"] in ("on-failure", "always")
        assert service["NoNewPrivileges"] == "yes"
        assert service["PrivateTmp"] == "yes"
        assert service["StateDirectory"].startswith("synapse/")
    assert scheduler["ExecStart"].endswith("--config /etc/synapse/scheduler-%i.toml")
    # Secrets come from files the TOML names: never the command line or the environment.
    for service in (scheduler, worker):
        assert "password" not in service["ExecStart"]
        assert "token" not in service["ExecStart"]
        assert "EnvironmentFile" not in service
    assert scheduler["ProtectSystem"] == "strict"
    assert scheduler["ProtectHome"] == "yes"
    # The worker manages cgroups and members' process groups.
    assert worker["KillMode"] == "mixed"
    assert "ProtectControlGroups" not in worker
    assert "PrivateDevices" not in worker  # members need the GPUs
    assert worker["Delegate"]


def test_the_three_replica_configs_load_and_form_one_quorum(secrets: Secrets) -> None:
    state_dir = unit("synapse-scheduler@.service")["Service"]["StateDirectory"]
    configs = []
    for r in REPLICAS:
        path = DEPLOY / f"scheduler-{r}.toml"
        # The data directory, secrets and TLS files are redirected (flags win over the
        # file) so that loading does not touch /etc or /var/lib; the file's own values are
        # checked against the unit and against what `synctl ca issue` writes.
        config = load_replica(secrets, r)
        assert config.replica_id == r
        assert config.tls == secrets.creds.replica_tls(r)
        assert config.bootstrap_token == secrets.creds.admin_token
        # Raft over mutual TLS: the password the flags name is not read.
        assert (config.raft_transport, config.raft_password) == ("tls", "")
        configs.append(config)
        text = path.read_text()
        expected = "/var/lib/" + state_dir.replace("%i", r)
        assert f'data_dir = "{expected}"' in text
    assert len({c.replicas for c in configs}) == 1
    assert [x.replica_id for x in configs[0].replicas] == list(REPLICAS)
    assert len({c.me.grpc for c in configs}) == 3
    assert all(check_timeouts(c.timeouts) == [] for c in configs)
    assert {c.locality_wait_ms for c in configs} == {600_000}


def test_the_configs_name_the_files_deploy_readme_tells_operators_to_make(
    secrets: Secrets,
) -> None:
    # `synctl ca issue replica a --out /etc/synapse/tls` writes replica-a.pem/.key, and
    # ca.pem is the CA bundle beside them: the names in the files must be those.
    for r in REPLICAS:
        doc = tomllib.loads((DEPLOY / f"scheduler-{r}.toml").read_text())
        issued = secrets.creds.replica_tls(r)
        assert doc["tls"] == {
            "ca": f"{ETC}/tls/ca.pem",
            "cert": f"{ETC}/tls/{issued.cert.name}",
            "key": f"{ETC}/tls/{issued.key.name}",
        }
        assert "raft_password_file" not in doc  # Raft over mutual TLS
        assert doc["bootstrap_token_file"] == f"{ETC}/admin.token"
    doc = tomllib.loads((DEPLOY / "worker.toml").read_text())
    issued = secrets.creds.worker_tls(doc["node_id"])
    assert doc["tls"] == {
        "ca": f"{ETC}/tls/ca.pem",
        "cert": f"{ETC}/tls/{issued.cert.name}",
        "key": f"{ETC}/tls/{issued.key.name}",
    }
    readme = (DEPLOY / "README.md").read_text()
    for name in ("raft.password", "admin.token", "ca.pem", "replica-a.pem", "worker-gpu-017"):
        assert name in readme


@pytest.mark.skipif(Path(ETC).exists(), reason="this machine has a real /etc/synapse")
def test_without_tls_flags_the_programs_read_the_tls_files_the_configs_name(
    secrets: Secrets, tmp_path: Path
) -> None:
    base = ["--config", str(DEPLOY / "scheduler-a.toml"), "--data-dir", str(tmp_path / "a")]
    flags = ["--raft-password-file", str(secrets.raft_password)]
    with pytest.raises(scheduler_main.ConfigError, match=f"cannot read TLS file {ETC}/tls/"):
        scheduler_main.load_config([*base, *flags], environ={})
    with pytest.raises(worker_main.ConfigError, match=f"cannot read TLS file {ETC}/tls/"):
        worker_main.load_config(
            ["--config", str(DEPLOY / "worker.toml"), "--data-dir", str(tmp_path / "w")]
        )


def test_a_config_with_neither_tls_nor_insecure_is_refused_naming_the_flags(
    secrets: Secrets, tmp_path: Path
) -> None:
    replica = tmp_path / "scheduler-a.toml"
    replica.write_text(without_tls_table((DEPLOY / "scheduler-a.toml").read_text()))
    flags = secrets.replica_flags("a")[:6]  # the data directory and secrets, no --tls-*
    with pytest.raises(scheduler_main.ConfigError, match=NO_TLS_MATERIAL) as err:
        scheduler_main.load_config(["--config", str(replica), *flags], environ={})
    assert "--insecure" in str(err.value)
    # With --insecure it loads (and runs plaintext, warning at every start).
    insecure = scheduler_main.load_config(
        ["--config", str(replica), *flags, "--insecure"], environ={}
    )
    assert insecure.tls is None
    node = tmp_path / "worker.toml"
    node.write_text(without_tls_table((DEPLOY / "worker.toml").read_text()))
    with pytest.raises(worker_main.ConfigError, match=NO_TLS_MATERIAL) as worker_err:
        worker_main.load_config(["--config", str(node), "--data-dir", str(tmp_path / "w")])
    assert "--insecure" in str(worker_err.value)


def test_the_locality_wait_comes_from_the_flag_or_the_file_and_is_bounded(
    secrets: Secrets,
) -> None:
    assert load_replica(secrets, "a", "--locality-wait", "0s").locality_wait_ms == 0
    assert load_replica(secrets, "a", "--locality-wait", "90s").locality_wait_ms == 90_000
    for bad in ("soon", "25h"):
        with pytest.raises(scheduler_main.ConfigError, match="locality_wait"):
            load_replica(secrets, "a", "--locality-wait", bad)


def test_heavy_read_limits_come_from_flags_or_the_file_and_are_bounded(
    secrets: Secrets, tmp_path: Path
) -> None:
    default = load_replica(secrets, "a")
    assert (default.heavy_reads, default.heavy_read_cpu_share) == (2, 0.3)
    assert default.leader_read_cpu_share == 0.05
    tuned = load_replica(secrets, "a", "--heavy-reads", "1", "--heavy-read-cpu-share", "0.15")
    assert (tuned.heavy_reads, tuned.heavy_read_cpu_share) == (1, 0.15)
    assert load_replica(secrets, "a", "--leader-read-cpu-share", "0").leader_read_cpu_share == 0
    in_file = tmp_path / "reads.toml"
    in_file.write_text(
        (DEPLOY / "scheduler-a.toml").read_text()
        + "\n[reads]\nheavy_concurrency = 4\nheavy_cpu_share = 0.5\nleader_cpu_share = 0.1\n"
    )
    from_file = scheduler_main.load_config(
        ["--config", str(in_file), *secrets.replica_flags("a")], environ={}
    )
    assert (from_file.heavy_reads, from_file.heavy_read_cpu_share) == (4, 0.5)
    assert from_file.leader_read_cpu_share == 0.1
    for flag, bad, words in (
        ("--heavy-reads", "0", "heavy reads at once"),
        ("--heavy-read-cpu-share", "0", "CPU share"),
        ("--heavy-read-cpu-share", "1.5", "CPU share"),
        ("--leader-read-cpu-share", "-0.1", r"leader read CPU share must be in \[0, 1\]"),
    ):
        with pytest.raises(scheduler_main.ConfigError, match=words):
            load_replica(secrets, "a", flag, bad)


def test_a_missing_or_empty_raft_password_file_is_refused(secrets: Secrets) -> None:
    missing = secrets.root / "no-such.password"
    channel = ("--raft-transport", "password")
    with pytest.raises(scheduler_main.ConfigError, match="raft password file"):
        load_replica(secrets, "a", *channel, "--raft-password-file", str(missing))
    empty = secrets.root / "empty.password"
    empty.write_text("\n")
    with pytest.raises(scheduler_main.ConfigError, match="Raft password is required"):
        load_replica(secrets, "a", *channel, "--raft-password-file", str(empty))
    # On the TLS channel no password is read.
    assert load_replica(secrets, "a", "--raft-password-file", str(missing)).raft_password == ""


def test_a_bootstrap_token_file_that_holds_no_token_is_refused(secrets: Secrets) -> None:
    bad = secrets.root / "bad.token"
    bad.write_text("not-a-token\n")
    with pytest.raises(scheduler_main.ConfigError, match="not a token"):
        load_replica(secrets, "a", "--bootstrap-token-file", str(bad))


@pytest.mark.skipif(OPENSSL is None, reason="openssl is not installed here")
def test_the_readme_commands_make_a_raft_password_and_a_bootstrap_token(
    secrets: Secrets, tmp_path: Path
) -> None:
    made = tmp_path / "made"
    made.mkdir()
    for marker in ("> admin.token", "> raft.password"):
        command = readme_command(marker)
        result = subprocess.run(
            ["sh", "-c", command], cwd=made, capture_output=True, text=True, timeout=30
        )
        assert result.returncode == 0, result.stderr
    token = (made / "admin.token").read_text().strip()
    assert split_token(token) is not None, token
    password = (made / "raft.password").read_text().strip()
    assert len(password) >= 32
    config = load_replica(
        secrets,
        "a",
        "--bootstrap-token-file",
        str(made / "admin.token"),
        "--raft-password-file",
        str(made / "raft.password"),
        "--raft-transport",
        "password",
    )
    assert (config.bootstrap_token, config.raft_password) == (token, password)


def test_the_worker_config_loads_and_points_at_the_quorum(secrets: Secrets) -> None:
    config = worker_main.load_config(
        ["--config", str(DEPLOY / "worker.toml"), *secrets.worker_flags()]
    )
    quorum = load_replica(secrets, "a")
    assert set(config.schedulers) == {r.grpc for r in quorum.replicas}
    assert dict(config.topology) == {"zone": "z1", "block": "b2", "rack": "r7"}
    assert config.node_id == WORKER_NODE
    assert config.tls == secrets.creds.worker_tls(WORKER_NODE)
    assert config.cpu_milli == 60_000
    assert config.memory_mib == 480 * 1024
    assert config.cgroups
    worker_state = unit("synapse-worker.service")["Service"]["StateDirectory"]
    assert f'data_dir = "/var/lib/{worker_state}"' in (DEPLOY / "worker.toml").read_text()
