"""The test-only switch that disables self-fencing needs both the variable and the flag."""

from __future__ import annotations

from pathlib import Path

import pytest

from synapse_ha.programs.worker import (
    UNSAFE_NO_SELF_FENCING_ENV,
    UNSAFE_NO_SELF_FENCING_FLAG,
    ConfigError,
    load_config,
)


def _argv(tmp_path: Path, *extra: str) -> list[str]:
    return ["--scheduler", "127.0.0.1:1", "--data-dir", str(tmp_path), *extra]


def test_self_fencing_is_on_by_default(tmp_path: Path) -> None:
    assert load_config(_argv(tmp_path), environ={}).self_fencing is True


def test_the_variable_alone_is_refused(tmp_path: Path) -> None:
    with pytest.raises(
        ConfigError, match=f"refusing to start without {UNSAFE_NO_SELF_FENCING_FLAG}"
    ):
        load_config(_argv(tmp_path), environ={UNSAFE_NO_SELF_FENCING_ENV: "1"})


def test_the_flag_alone_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=f"needs {UNSAFE_NO_SELF_FENCING_ENV}=1"):
        load_config(_argv(tmp_path, UNSAFE_NO_SELF_FENCING_FLAG), environ={})


def test_a_bad_value_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="must be 1 or unset"):
        load_config(_argv(tmp_path), environ={UNSAFE_NO_SELF_FENCING_ENV: "yes"})


def test_both_together_disable_self_fencing(tmp_path: Path) -> None:
    config = load_config(
        _argv(tmp_path, UNSAFE_NO_SELF_FENCING_FLAG), environ={UNSAFE_NO_SELF_FENCING_ENV: "1"}
    )
    assert config.self_fencing is False
