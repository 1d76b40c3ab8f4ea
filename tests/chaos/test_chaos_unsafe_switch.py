"""The test-only switch that disables self-fencing needs both the variable and the flag,
whether the worker runs with TLS (as the chaos suite's broken build does) or --insecure."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from synapse_ha.programs.worker_config import (
    UNSAFE_NO_SELF_FENCING_ENV,
    UNSAFE_NO_SELF_FENCING_FLAG,
    ConfigError,
    load_config,
)
from synapse_ha.security.bundle import ClusterCredentials


@pytest.fixture(params=["tls", "insecure"])
def security(request: pytest.FixtureRequest, tmp_path: Path) -> list[str]:
    """The worker's transport flags: a worker certificate of a fresh CA, or --insecure."""
    if request.param == "insecure":
        return ["--insecure"]
    creds = ClusterCredentials.ensure(tmp_path / "credentials")
    return creds.tls_args(creds.worker_tls("w1"))


@pytest.fixture
def argv(tmp_path: Path, security: list[str]) -> Callable[..., list[str]]:
    data = tmp_path / "data"
    data.mkdir()

    def argv(*extra: str) -> list[str]:
        return ["--scheduler", "127.0.0.1:1", "--data-dir", str(data), *security, *extra]

    return argv


def test_self_fencing_is_on_by_default(argv: Callable[..., list[str]]) -> None:
    config = load_config(argv(), environ={})
    assert config.self_fencing is True
    assert (config.tls is None) == ("--insecure" in argv())


def test_the_variable_alone_is_refused(argv: Callable[..., list[str]]) -> None:
    with pytest.raises(
        ConfigError, match=f"refusing to start without {UNSAFE_NO_SELF_FENCING_FLAG}"
    ):
        load_config(argv(), environ={UNSAFE_NO_SELF_FENCING_ENV: "1"})


def test_the_flag_alone_is_refused(argv: Callable[..., list[str]]) -> None:
    with pytest.raises(ConfigError, match=f"needs {UNSAFE_NO_SELF_FENCING_ENV}=1"):
        load_config(argv(UNSAFE_NO_SELF_FENCING_FLAG), environ={})


def test_a_bad_value_is_refused(argv: Callable[..., list[str]]) -> None:
    with pytest.raises(ConfigError, match="must be 1 or unset"):
        load_config(argv(), environ={UNSAFE_NO_SELF_FENCING_ENV: "yes"})


def test_both_together_disable_self_fencing(argv: Callable[..., list[str]]) -> None:
    config = load_config(
        argv(UNSAFE_NO_SELF_FENCING_FLAG), environ={UNSAFE_NO_SELF_FENCING_ENV: "1"}
    )
    assert config.self_fencing is False
