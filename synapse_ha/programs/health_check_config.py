"""``synapse-worker``'s health-check program settings: ``--health-check PROGRAM`` (a
command line, split as a shell would, run without one; default none),
``--health-check-interval`` (default 5m) and ``--health-check-timeout`` (default 60s); in
the configuration file ``health_check``, ``health_check_interval`` and
``health_check_timeout``."""

from __future__ import annotations

import shlex
from typing import Any

from synapse_ha.programs.config_file import ConfigError, duration_ms
from synapse_ha.programs.settings import Inputs, defaulted
from synapse_ha.worker.health_check import HealthCheckSettings


def _program(value: Any) -> tuple[str, ...]:
    if not isinstance(value, str):
        raise ConfigError(f"health_check: expected a command line, got {type(value).__name__}")
    try:
        argv = tuple(shlex.split(value))
    except ValueError as exc:
        raise ConfigError(f"--health-check: {exc}") from None
    if not argv:
        raise ConfigError("--health-check: must name a program")
    return argv


def _positive(what: str, most_s: float) -> Any:
    def check(value: Any) -> float:
        ms = duration_ms(value, what)
        if not 0 < ms <= most_s * 1000:
            raise ConfigError(f"{what}: must be more than 0 and at most {most_s:g}s")
        return ms / 1000

    return check


HEALTH_CHECK = defaulted(
    "health_check",
    (),
    _program,
    "a program run at start and every --health-check-interval (a command line, split "
    "as a shell would); a non-zero exit or a timeout cordons the node until it passes "
    "(default: none)",
)
HEALTH_CHECK_INTERVAL = defaulted(
    "health_check_interval",
    300.0,
    _positive("--health-check-interval", 7 * 86_400),
    "how often the health check runs (default 5m)",
)
HEALTH_CHECK_TIMEOUT = defaulted(
    "health_check_timeout",
    60.0,
    _positive("--health-check-timeout", 3_600),
    "how long a run may take before it is killed and fails (default 60s, at most 1h)",
)
HEALTH_CHECK_SETTINGS = (HEALTH_CHECK, HEALTH_CHECK_INTERVAL, HEALTH_CHECK_TIMEOUT)


def health_check_settings(inputs: Inputs) -> HealthCheckSettings:
    return HealthCheckSettings(
        argv=inputs.value(HEALTH_CHECK),
        interval_s=inputs.value(HEALTH_CHECK_INTERVAL),
        timeout_s=inputs.value(HEALTH_CHECK_TIMEOUT),
    )
