"""deploy/: the systemd units pass ``systemd-analyze verify`` and the example configs load
through the programs' own configuration loaders and agree with the units."""

from __future__ import annotations

import configparser
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from synapse_ha.programs import scheduler as scheduler_main
from synapse_ha.programs import worker as worker_main

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
REPLICAS = ("a", "b", "c")
SYSTEMD_ANALYZE = shutil.which("systemd-analyze")


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


def test_the_units_run_as_a_dedicated_user_with_restart_and_hardening() -> None:
    scheduler = unit("synapse-scheduler@.service")["Service"]
    worker = unit("synapse-worker.service")["Service"]
    for service in (scheduler, worker):
        assert service["User"] == "synapse"
        assert service["Restart"] in ("on-failure", "always")
        assert service["NoNewPrivileges"] == "yes"
        assert service["PrivateTmp"] == "yes"
        assert service["StateDirectory"].startswith("synapse/")
    assert scheduler["ExecStart"].endswith("--config /etc/synapse/scheduler-%i.toml")
    assert scheduler["EnvironmentFile"] == "/etc/synapse/raft.env"
    assert scheduler["ProtectSystem"] == "strict"
    assert scheduler["ProtectHome"] == "yes"
    # The worker manages cgroups and members' process groups.
    assert worker["KillMode"] == "mixed"
    assert "ProtectControlGroups" not in worker
    assert "PrivateDevices" not in worker  # members need the GPUs
    assert worker["Delegate"]


def test_the_three_replica_configs_load_and_form_one_quorum(tmp_path: Path) -> None:
    state_dir = unit("synapse-scheduler@.service")["Service"]["StateDirectory"]
    configs = []
    for r in REPLICAS:
        path = DEPLOY / f"scheduler-{r}.toml"
        # The data directory is redirected (flags win over the file) so that loading
        # does not touch /var/lib; the file's own value is checked against the unit.
        config = scheduler_main.load_config(
            ["--config", str(path), "--data-dir", str(tmp_path / r)],
            environ={"SYNAPSE_RAFT_PASSWORD": "example"},
        )
        assert config.replica_id == r
        configs.append(config)
        text = path.read_text()
        expected = "/var/lib/" + state_dir.replace("%i", r)
        assert f'data_dir = "{expected}"' in text
    assert len({c.replicas for c in configs}) == 1
    assert [x.replica_id for x in configs[0].replicas] == list(REPLICAS)
    assert len({c.me.grpc for c in configs}) == 3
    assert all(c.timeouts.violations() == [] for c in configs)
    assert {c.locality_wait_ms for c in configs} == {600_000}


def test_the_locality_wait_comes_from_the_flag_or_the_file_and_is_bounded(
    tmp_path: Path,
) -> None:
    base = ["--config", str(DEPLOY / "scheduler-a.toml"), "--data-dir", str(tmp_path)]
    env = {"SYNAPSE_RAFT_PASSWORD": "example"}
    assert scheduler_main.load_config([*base, "--locality-wait", "0s"], env).locality_wait_ms == 0
    assert (
        scheduler_main.load_config([*base, "--locality-wait", "90s"], env).locality_wait_ms
        == 90_000
    )
    for bad in ("soon", "25h"):
        with pytest.raises(scheduler_main.ConfigError, match="locality_wait"):
            scheduler_main.load_config([*base, "--locality-wait", bad], env)


def test_heavy_read_limits_come_from_flags_or_the_file_and_are_bounded(tmp_path: Path) -> None:
    base = ["--config", str(DEPLOY / "scheduler-a.toml"), "--data-dir", str(tmp_path)]
    env = {"SYNAPSE_RAFT_PASSWORD": "example"}
    default = scheduler_main.load_config(base, env)
    assert (default.heavy_reads, default.heavy_read_cpu_share) == (2, 0.3)
    tuned = scheduler_main.load_config(
        [*base, "--heavy-reads", "1", "--heavy-read-cpu-share", "0.15"], env
    )
    assert (tuned.heavy_reads, tuned.heavy_read_cpu_share) == (1, 0.15)
    in_file = tmp_path / "reads.toml"
    in_file.write_text(
        (DEPLOY / "scheduler-a.toml").read_text()
        + "\n[reads]\nheavy_concurrency = 4\nheavy_cpu_share = 0.5\n"
    )
    from_file = scheduler_main.load_config(
        ["--config", str(in_file), "--data-dir", str(tmp_path)], env
    )
    assert (from_file.heavy_reads, from_file.heavy_read_cpu_share) == (4, 0.5)
    for flag, bad, words in (
        ("--heavy-reads", "0", "heavy reads at once"),
        ("--heavy-read-cpu-share", "0", "CPU share"),
        ("--heavy-read-cpu-share", "1.5", "CPU share"),
    ):
        with pytest.raises(scheduler_main.ConfigError, match=words):
            scheduler_main.load_config([*base, flag, bad], env)


def test_a_config_without_the_raft_password_is_refused(tmp_path: Path) -> None:
    with pytest.raises(scheduler_main.ConfigError, match="Raft password"):
        scheduler_main.load_config(
            ["--config", str(DEPLOY / "scheduler-a.toml"), "--data-dir", str(tmp_path)],
            environ={},
        )


def test_the_worker_config_loads_and_points_at_the_quorum(tmp_path: Path) -> None:
    config = worker_main.load_config(
        ["--config", str(DEPLOY / "worker.toml"), "--data-dir", str(tmp_path / "w")]
    )
    quorum = scheduler_main.load_config(
        ["--config", str(DEPLOY / "scheduler-a.toml"), "--data-dir", str(tmp_path / "a")],
        environ={"SYNAPSE_RAFT_PASSWORD": "example"},
    )
    assert set(config.schedulers) == {r.grpc for r in quorum.replicas}
    assert dict(config.topology) == {"zone": "z1", "block": "b2", "rack": "r7"}
    assert config.node_id == "gpu-017"
    assert config.cpu_milli == 60_000
    assert config.memory_mib == 480 * 1024
    assert config.cgroups
    worker_state = unit("synapse-worker.service")["Service"]["StateDirectory"]
    assert f'data_dir = "/var/lib/{worker_state}"' in (DEPLOY / "worker.toml").read_text()
