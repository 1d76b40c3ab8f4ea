"""synapse-scheduler's ``[raft]`` settings in TOML and their flags (flags win): the
journal's fsync mode (``--raft-fsync`` / ``--no-raft-fsync``), the compact state
(``--compact-state`` / ``--no-compact-state``, left as replicated when neither says and
applied to the replicated configuration by the leader), and the Raft channel
(``raft.transport``; with TLS, see tests/deploy)."""

from __future__ import annotations

from pathlib import Path

import pytest

from synapse_ha.core.cluster_config import ClusterConfig
from synapse_ha.programs import scheduler as scheduler_main
from synapse_ha.programs.scheduler_config import RAFT_FSYNC_DEFAULT


def load(tmp_path: Path, toml: str = "", *flags: str) -> scheduler_main.SchedulerConfig:
    config = tmp_path / "scheduler.toml"
    config.write_text(toml)
    base = [
        "--config", str(config), "--id", "a", "--replica", "a=127.0.0.1:7001,127.0.0.1:7101",
        "--data-dir", str(tmp_path / "data"), "--insecure",
    ]  # fmt: skip
    return scheduler_main.load_config(
        [*base, *flags],
        environ={"SYNAPSE_RAFT_PASSWORD": "eR82Q9ICx+bbMKByoNMieHUaHiAj/sFAQSHOPhNEmAI="},
    )


def test_the_default_is_the_documented_one(tmp_path: Path) -> None:
    assert load(tmp_path).raft_fsync is RAFT_FSYNC_DEFAULT


@pytest.mark.parametrize("value", [True, False])
def test_toml_sets_it_and_the_opposite_flag_wins(tmp_path: Path, value: bool) -> None:
    toml = f"[raft]\nfsync = {'true' if value else 'false'}\n"
    assert load(tmp_path, toml).raft_fsync is value
    flag = "--no-raft-fsync" if value else "--raft-fsync"
    assert load(tmp_path, toml, flag).raft_fsync is (not value)


def test_a_value_that_is_not_a_boolean_is_refused(tmp_path: Path) -> None:
    with pytest.raises(scheduler_main.ConfigError, match=r"raft\.fsync must be true or false"):
        load(tmp_path, '[raft]\nfsync = "yes"\n')


def test_compact_state_not_given_leaves_the_replicated_value(tmp_path: Path) -> None:
    settings = load(tmp_path).scheduling
    assert settings.compact_state is None
    on = ClusterConfig(compact_state=True)
    assert settings.applied_to(on) == on


@pytest.mark.parametrize("value", [True, False])
def test_compact_state_from_toml_and_the_opposite_flag_wins(tmp_path: Path, value: bool) -> None:
    toml = f"[raft]\ncompact_state = {'true' if value else 'false'}\n"
    settings = load(tmp_path, toml).scheduling
    assert settings.compact_state is value
    assert settings.applied_to(ClusterConfig()).compact_state is value
    flag = "--no-compact-state" if value else "--compact-state"
    assert load(tmp_path, toml, flag).scheduling.compact_state is (not value)


def test_a_compact_state_that_is_not_a_boolean_is_refused(tmp_path: Path) -> None:
    with pytest.raises(
        scheduler_main.ConfigError, match=r"raft\.compact_state must be true or false"
    ):
        load(tmp_path, '[raft]\ncompact_state = "yes"\n')


def test_an_insecure_replica_runs_the_password_channel_and_refuses_tls(tmp_path: Path) -> None:
    config = load(tmp_path)
    assert (config.raft_transport, bool(config.raft_password)) == ("password", True)
    with pytest.raises(scheduler_main.ConfigError, match="needs the replica's TLS files"):
        load(tmp_path, '[raft]\ntransport = "tls"\n')
    with pytest.raises(scheduler_main.ConfigError, match="must be one of tls, password"):
        load(tmp_path, '[raft]\ntransport = "plain"\n')
