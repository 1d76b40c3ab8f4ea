"""The journal's fsync mode as a synapse-scheduler setting: ``[raft] fsync`` in TOML,
``--raft-fsync`` / ``--no-raft-fsync`` on the command line (flags win)."""

from __future__ import annotations

from pathlib import Path

import pytest

from synapse_ha.programs import scheduler as scheduler_main


def load(tmp_path: Path, toml: str = "", *flags: str) -> scheduler_main.SchedulerConfig:
    config = tmp_path / "scheduler.toml"
    config.write_text(toml)
    base = [
        "--config", str(config), "--id", "a", "--replica", "a=127.0.0.1:7001,127.0.0.1:7101",
        "--data-dir", str(tmp_path / "data"), "--insecure",
    ]  # fmt: skip
    return scheduler_main.load_config([*base, *flags], environ={"SYNAPSE_RAFT_PASSWORD": "pw"})


def test_the_default_is_the_documented_one(tmp_path: Path) -> None:
    assert load(tmp_path).raft_fsync is scheduler_main.RAFT_FSYNC_DEFAULT


@pytest.mark.parametrize("value", [True, False])
def test_toml_sets_it_and_the_opposite_flag_wins(tmp_path: Path, value: bool) -> None:
    toml = f"[raft]\nfsync = {'true' if value else 'false'}\n"
    assert load(tmp_path, toml).raft_fsync is value
    flag = "--no-raft-fsync" if value else "--raft-fsync"
    assert load(tmp_path, toml, flag).raft_fsync is (not value)


def test_a_value_that_is_not_a_boolean_is_refused(tmp_path: Path) -> None:
    with pytest.raises(scheduler_main.ConfigError, match=r"raft\.fsync must be true or false"):
        load(tmp_path, '[raft]\nfsync = "yes"\n')
