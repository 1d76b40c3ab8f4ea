"""``--slow-node-window`` (``[slow_nodes] window``) of synapse-scheduler: how long each
window of a gang's member paces the leader weighs for slow nodes (docs/slow-nodes.md),
passed to the replica's collector; a bad value is refused naming the option and its
rule."""

from __future__ import annotations

from pathlib import Path

import pytest

from synapse_ha.leader.slow_nodes import DEFAULT_WINDOW_MS
from synapse_ha.programs import scheduler as scheduler_main


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


def test_the_window_is_fifteen_minutes_unless_set(tmp_path: Path) -> None:
    assert load(tmp_path).slow_node_window_ms == DEFAULT_WINDOW_MS == 900_000


def test_the_window_from_toml_or_flag_and_the_flag_wins(tmp_path: Path) -> None:
    assert load(tmp_path, '[slow_nodes]\nwindow = "20m"\n').slow_node_window_ms == 1_200_000
    flagged = load(tmp_path, '[slow_nodes]\nwindow = "20m"\n', "--slow-node-window=2s")
    assert flagged.slow_node_window_ms == 2_000


@pytest.mark.parametrize(
    ("toml", "flags", "says"),
    [
        ("", ("--slow-node-window=500ms",), "between 1s and 24h, got '500ms'"),
        ("", ("--slow-node-window=25h",), "between 1s and 24h"),
        ("", ("--slow-node-window=soon",), "--slow-node-window"),
        ('[slow_nodes]\nwindow = "0s"\n', (), "between 1s and 24h"),
        ("[slow_nodes]\nwindow = -5\n", (), "--slow-node-window"),
        ('slow_nodes = "15m"\n', (), "slow_nodes"),
    ],
)
def test_a_bad_window_is_refused_naming_the_option(
    tmp_path: Path, toml: str, flags: tuple[str, ...], says: str
) -> None:
    with pytest.raises(scheduler_main.ConfigError, match="slow_nodes") as refused:
        load(tmp_path, toml, *flags)
    assert says in str(refused.value)


def test_the_threshold_is_fifteen_percent_unless_set(tmp_path: Path) -> None:
    assert load(tmp_path).slow_node_threshold_pct == 15
    assert load(tmp_path, "[slow_nodes]\nthreshold = 40\n").slow_node_threshold_pct == 40
    flagged = load(tmp_path, "[slow_nodes]\nthreshold = 40\n", "--slow-node-threshold=100")
    assert flagged.slow_node_threshold_pct == 100


def test_the_replica_weighs_paces_with_the_threshold(tmp_path: Path) -> None:
    config = load(tmp_path, "", "--slow-node-threshold=100", "--slow-node-window=2s")
    rule = scheduler_main.slow_node_settings(config).rule
    assert (rule.threshold_pct, rule.strikes, rule.span) == (100, 3, 5)
    assert scheduler_main.slow_node_settings(config).window_ms == 2_000


@pytest.mark.parametrize(
    ("toml", "flags", "says"),
    [
        ("", ("--slow-node-threshold=0",), "between 1 and 1000, got 0"),
        ("", ("--slow-node-threshold=1001",), "between 1 and 1000"),
        ("[slow_nodes]\nthreshold = 15.5\n", (), "whole percent, got 15.5"),
        ("[slow_nodes]\nthreshold = true\n", (), "whole percent"),
    ],
)
def test_a_bad_threshold_is_refused_naming_the_option(
    tmp_path: Path, toml: str, flags: tuple[str, ...], says: str
) -> None:
    with pytest.raises(scheduler_main.ConfigError, match="--slow-node-threshold") as refused:
        load(tmp_path, toml, *flags)
    assert says in str(refused.value)


def test_a_threshold_flag_that_is_no_integer_is_refused_naming_the_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        load(tmp_path, "", "--slow-node-threshold=15%")
    assert "--slow-node-threshold: invalid int value: '15%'" in capsys.readouterr().err
