"""``leader_step_down`` and the election timeout: a leader steps down after one election
timeout (``election_max``), so ``leader_step_down``, the bound the fencing timeouts
assume, may not be shorter."""

from __future__ import annotations

from pathlib import Path

import pytest

from synapse_ha.programs import scheduler as scheduler_main
from tests.shell.test_scheduling_config import load


def test_a_step_down_shorter_than_the_election_timeout_is_refused(tmp_path: Path) -> None:
    with pytest.raises(scheduler_main.ConfigError) as refused:
        load(tmp_path, "", "--leader-step-down", "500ms", "--election-max", "800ms")
    assert "leader_step_down (500 ms) must be at least election_max (800 ms)" in str(refused.value)


def test_the_toml_setting_is_checked_too(tmp_path: Path) -> None:
    toml = '[timeouts]\nleader_step_down = "1s"\n[raft]\nelection_max = "1500ms"\n'
    with pytest.raises(scheduler_main.ConfigError, match="must be at least election_max"):
        load(tmp_path, toml)


def test_a_step_down_of_one_election_timeout_is_accepted(tmp_path: Path) -> None:
    config = load(tmp_path, "", "--leader-step-down", "800ms", "--election-max", "800ms")
    assert config.timing.leader_step_down_s == pytest.approx(0.8)
    assert config.timing.check_quorum_s == pytest.approx(0.8)
