"""``synctl cohort set|delete`` and ``synctl queues --tree`` against an in-process
replica with the auth interceptor (tests/rpc/authed.py): the tree drawn with its
numbers, as a table and as JSON, the format gate and the refusals."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from synapse_ha.cli.defaults import ExitCode
from synapse_ha.core import commands as cmd
from synapse_ha.core.codec.formats import FORMAT
from synapse_ha.core.machine import apply
from synapse_ha.core.model import MemberPlacement
from tests.cli.test_queues import synctl
from tests.core.harness import job
from tests.rpc.authed import NOW, Replica, serving_replica


@pytest.fixture
def replica() -> Iterator[Replica]:
    with serving_replica() as started:
        yield started


def _bind(replica: Replica, queue: str, gpus: int) -> None:
    """A job of ``queue`` bound to ``gpus`` GPUs of node n1 (n1 has them)."""
    made = apply(replica.backend.state, cmd.SubmitJob(job(queue=queue, gpu=gpus), queue, NOW))
    assert made.ok, made.message
    placement = cmd.GangPlacement(made.job_id, 0, (MemberPlacement(0, "n1", tuple(range(gpus))),))
    assert apply(replica.backend.state, cmd.BindPlan((placement,), now_ms=NOW)).bound


def test_an_admin_builds_a_tree_and_queues_draws_it(replica: Replica) -> None:
    early = synctl(replica, "cohort", "set", "org")
    assert early.exit_code != 0 and "this change needs format 7" in early.stderr
    assert apply(replica.backend.state, cmd.RaiseFormat(FORMAT, ("a",), NOW)).ok
    made = synctl(replica, "cohort", "set", "org", "--gpu", "1")
    assert made.exit_code == 0, made.output
    assert made.stdout.strip() == "cohort org: created"
    team = ("cohort", "set", "team-a", "--parent", "org", "--borrowing-limit", "2")
    assert synctl(replica, *team).exit_code == 0
    assert synctl(replica, *team).stdout.strip() == "cohort team-a: updated"
    for args in (
        ("queue", "set", "a1", "--gpu", "1", "--cohort", "team-a"),
        ("queue", "set", "a2", "--gpu", "1", "--cohort", "team-a", "--lending-limit", "0"),
    ):
        assert synctl(replica, *args).exit_code == 0
    _bind(replica, "a1", 2)  # a1 borrows 1: team-a lends a2's nothing, org its own 1

    drawn = synctl(replica, "queues", "--tree", who="alice")
    assert drawn.exit_code == 0, drawn.output
    lines = drawn.stdout.splitlines()
    assert lines[0].split() == [
        "COHORT", "/", "QUEUE", "NOMINAL", "USED", "BORROWED", "MAY", "BORROW", "MAY", "LEND"
    ]  # fmt: skip
    assert lines[1].split() == ["org", "3", "2", "0", "-", "-"]
    assert lines[2].split() == ["`-", "team-a", "2", "2", "1", "2", "any"]
    assert lines[3].split() == ["|-", "a1", "(queue)", "1", "2", "1", "any", "any"]
    assert lines[4].split() == ["`-", "a2", "(queue)", "1", "0", "0", "any", "0"]
    assert lines[5].split()[:2] == ["default", "(queue)"]

    doc = json.loads(synctl(replica, "queues", "--tree", "-o", "json").stdout)
    (org,) = doc["tree"]
    assert (org["name"], org["gpu"], org["nominal_gpu"], org["used_gpu"]) == ("org", 1, 3, 2)
    (team_a,) = org["children"]
    assert team_a["borrowing_limit_gpu"] == 2 and team_a["borrowed_gpu"] == 1
    assert [c["name"] for c in team_a["children"]] == ["a1", "a2"]
    assert team_a["children"][0]["borrowed_gpu"] == 1
    assert [q["name"] for q in doc["queues"]] == ["default"]


def test_cohort_refusals_name_the_rule(replica: Replica) -> None:
    assert apply(replica.backend.state, cmd.RaiseFormat(FORMAT, ("a",), NOW)).ok
    orphan = synctl(replica, "cohort", "set", "team", "--parent", "org")
    assert orphan.exit_code == ExitCode.USAGE, orphan.output
    assert "parent" in orphan.stderr and "no cohort 'org'" in orphan.stderr
    missing = synctl(replica, "cohort", "delete", "org")
    assert missing.exit_code == ExitCode.NOT_FOUND and "(COHORT_NOT_FOUND)" in missing.stderr
    assert synctl(replica, "cohort", "set", "org").exit_code == 0
    assert synctl(replica, "cohort", "set", "team", "--parent", "org").exit_code == 0
    busy = synctl(replica, "cohort", "delete", "org")
    assert busy.exit_code != 0 and "parent of team" in busy.stderr
    denied = synctl(replica, "cohort", "set", "lab", who="alice")
    assert denied.exit_code == 5
    assert synctl(replica, "cohort", "delete", "team").stdout.strip() == "cohort team: deleted"
    assert set(replica.backend.state.cohorts) == {"org"}
