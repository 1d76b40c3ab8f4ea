"""``synctl queue set --default-time-limit/--learned-estimates`` and the ESTIMATE column of
``synctl queues``, against an in-process replica (tests/rpc/authed.py)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from click.testing import CliRunner, Result

from synapse_ha.cli.defaults import ExitCode
from synapse_ha.cli.main import cli
from synapse_ha.core import commands as cmd
from synapse_ha.core.codec.formats import FORMAT
from synapse_ha.core.machine import apply
from tests.rpc.authed import NOW, Replica, serving_replica


@pytest.fixture
def replica() -> Iterator[Replica]:
    with serving_replica() as started:
        yield started


def synctl(replica: Replica, *args: str) -> Result:
    env = {"SYNAPSE_TOKEN": replica.tokens["admin"], "XDG_CONFIG_HOME": "/nonexistent"}
    return CliRunner().invoke(cli, ["--cluster", replica.address, "--timeout", "5", *args], env=env)


def _row(replica: Replica, name: str) -> list[str]:
    table = synctl(replica, "queues").stdout
    assert "ESTIMATE: how long a job without a time limit is expected to run" in table
    return next(line for line in table.splitlines() if line.startswith(name)).split()


def test_a_queue_default_time_limit_is_set_shown_and_checked(replica: Replica) -> None:
    early = synctl(replica, "queue", "set", "batch", "--default-time-limit", "4h")
    assert early.exit_code != 0 and "this change needs format 15" in early.stderr
    assert "batch" not in replica.backend.state.queues
    assert apply(replica.backend.state, cmd.RaiseFormat(FORMAT, ("a",), NOW)).ok
    made = synctl(replica, "queue", "set", "batch", "--default-time-limit", "4h")
    assert made.exit_code == 0, made.output
    stored = replica.backend.state.queues["batch"]
    assert (stored.default_time_limit_ms, stored.learned_estimates) == (4 * 3_600_000, False)
    assert _row(replica, "batch")[-3] == "4h"
    doc = json.loads(synctl(replica, "queues", "-o", "json").stdout)
    batch = next(q for q in doc["queues"] if q["name"] == "batch")
    assert (batch["default_time_limit_ms"], batch["learned_estimates"]) == (14_400_000, False)
    args = ("queue", "set", "batch", "--learned-estimates", "--default-time-limit")
    assert synctl(replica, *args, "30m").exit_code == 0
    assert replica.backend.state.queues["batch"].learned_estimates
    assert _row(replica, "batch")[-3] == "learned,30m"
    too_long = synctl(replica, *args, "367d")
    assert too_long.exit_code == ExitCode.USAGE and "default_time_limit_ms" in too_long.stderr
    garbled = synctl(replica, *args, "soon")
    assert garbled.exit_code == ExitCode.USAGE and "--default-time-limit" in garbled.stderr
    assert replica.backend.state.queues["batch"].default_time_limit_ms == 1_800_000
    assert synctl(replica, "queue", "set", "batch").exit_code == 0  # set replaces all
    assert _row(replica, "batch")[-3] == "-"
