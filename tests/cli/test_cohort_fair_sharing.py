"""``synctl cohort set --fair-sharing-preemption``: the cohort's switch set through the
API and shown by ``synctl queues --tree`` (DESIGN §8)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from synapse_ha.core import commands as cmd
from synapse_ha.core.codec.formats import FORMAT
from synapse_ha.core.machine import apply
from tests.cli.test_queues import synctl
from tests.rpc.authed import NOW, Replica, serving_replica


@pytest.fixture
def replica() -> Iterator[Replica]:
    with serving_replica() as started:
        yield started


def test_the_switch_is_set_and_shown_with_the_tree(replica: Replica) -> None:
    assert apply(replica.backend.state, cmd.RaiseFormat(FORMAT, ("a",), NOW)).ok
    made = synctl(replica, "cohort", "set", "lab", "--fair-sharing-preemption")
    assert made.exit_code == 0, made.output
    assert replica.backend.state.cohorts["lab"].fair_sharing_preemption
    assert synctl(replica, "cohort", "set", "org").exit_code == 0
    assert not replica.backend.state.cohorts["org"].fair_sharing_preemption

    drawn = synctl(replica, "queues", "--tree", who="alice")
    assert drawn.exit_code == 0, drawn.output
    lines = drawn.stdout.splitlines()
    assert lines[1].split()[:3] == ["lab", "(fair-sharing", "preemption)"]
    assert "fair-sharing" not in lines[2]
    doc = json.loads(synctl(replica, "queues", "--tree", "-o", "json").stdout)
    switches = {c["name"]: c["fair_sharing_preemption"] for c in doc["tree"]}
    assert switches == {"lab": True, "org": False}
