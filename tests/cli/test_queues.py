"""``synctl queues`` and ``synctl queue set|delete`` against an in-process replica with
the auth interceptor (tests/rpc/authed.py): the table and JSON numbers, an admin's
changes, a non-admin refused with exit 5, and a submission refused for its queue."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from synapse_ha.cli import render_jobs
from synapse_ha.cli.defaults import ExitCode
from synapse_ha.cli.main import cli
from synapse_ha.client.jobs import explained_from_proto, job_from_proto
from synapse_ha.core import commands as cmd
from synapse_ha.core.cluster_config import QueueHistory
from synapse_ha.core.codec.formats import FORMAT
from synapse_ha.core.machine import apply
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb
from tests.rpc.authed import NOW, Replica, serving_replica


@pytest.fixture
def replica() -> Iterator[Replica]:
    with serving_replica() as started:
        yield started


def synctl(replica: Replica, *args: str, who: str = "admin") -> Result:
    env = {"SYNAPSE_TOKEN": replica.tokens[who], "XDG_CONFIG_HOME": "/nonexistent"}
    return CliRunner().invoke(cli, ["--cluster", replica.address, "--timeout", "5", *args], env=env)


def test_an_admin_sets_a_queue_and_queues_shows_it(replica: Replica) -> None:
    made = synctl(
        replica, "queue", "set", "team-a", "--gpu", "3", "--cpu", "8", "--memory", "64Gi",
        "--cohort", "lab", "--borrowing-limit", "2", "--classes", "normal,high",
    )  # fmt: skip
    assert made.exit_code == 0, made.output
    assert made.stdout.strip() == "queue team-a: created"
    assert synctl(replica, "queue", "set", "team-b", "--gpu", "1", "--cohort", "lab").exit_code == 0
    again = synctl(replica, "queue", "set", "team-a", "--gpu", "3", "--cohort", "lab")
    assert again.stdout.strip() == "queue team-a: updated"

    job = apply(
        replica.backend.state,
        cmd.BindPlan(
            (cmd.GangPlacement(replica.jobs["alice"], 0, (cmd.MemberPlacement(0, "n1", (0,)),)),),
            now_ms=NOW,
        ),
    )
    assert job.ok
    # team-b used 2 GPUs for two half-lives, decayed to a quarter: 1 GPU-half-life of 1.
    half_life = replica.backend.state.config.fair_share_half_life_ms
    replica.backend.state.queue_history["team-b"] = QueueHistory(
        gpu_ms=2 * half_life, at_ms=replica.clock[0] - 2 * half_life
    )
    listed = synctl(replica, "queues", "-o", "json", who="bob")
    assert listed.exit_code == 0, listed.output
    doc = json.loads(listed.stdout)
    queues = {q["name"]: q for q in doc["queues"]}
    assert list(queues) == ["default", "team-a", "team-b"]
    assert queues["team-a"]["nominal"] == {"gpu": 3, "cpu_milli": None, "memory_mib": None}
    assert queues["team-a"]["borrowing_limit_gpu"] is None  # set replaces every setting
    assert queues["default"]["nominal"] is None
    assert queues["default"]["used"]["gpu"] == 1 and queues["default"]["pending_jobs"] == 1
    assert [c["name"] for c in doc["priority_classes"]] == ["low", "normal", "high"]
    assert doc["preemption"] == "topology"
    # The fair-share order: default (no quota, share 0) has a gang waiting; team-a holds
    # and held nothing; team-b's past use puts it last.
    shares = {n: (q["fair_share"]["share"], q["fair_share"]["order"]) for n, q in queues.items()}
    assert shares == {"default": (0, 1), "team-a": (0, 2), "team-b": (0.5, 3)}
    assert doc["fair_share_half_life_ms"] == half_life

    table = synctl(replica, "queues", who="alice")
    assert table.exit_code == 0, table.output
    lines = table.stdout.splitlines()
    assert lines[0].split()[:6] == ["QUEUE", "COHORT", "NOMINAL", "USED", "BORROWED", "LENT"]
    team_a = next(line for line in lines if line.startswith("team-a"))
    assert team_a.split()[:6] == ["team-a", "lab", "3", "0", "0", "0"]
    tail = ["SHARE", "ORDER", "CLASSES", "ESTIMATE", "MIN", "RUN", "USER", "CAPS"]
    assert lines[0].split()[-8:] == tail
    team_b = next(line for line in lines if line.startswith("team-b")).split()
    assert team_b[-6:] == ["50%", "3", "any", "-", "-", "limits"]
    assert "lowest SHARE first (past usage decayed with half-life 7d" in table.stdout
    assert "preemption: topology" in table.stdout
    assert "high 100 (preempts)" in table.stdout


def test_set_keeps_what_the_options_say(replica: Replica) -> None:
    made = synctl(
        replica, "queue", "set", "team-a", "--gpu", "3", "--cpu", "500m", "--memory", "2Gi",
        "--lending-limit", "1", "--classes", "low",
    )  # fmt: skip
    assert made.exit_code == 0, made.output
    stored = replica.backend.state.queues["team-a"]
    assert (stored.gpu, stored.cpu_milli, stored.memory_mib) == (3, 500, 2048)
    assert (stored.lending_limit_gpu, stored.borrowing_limit_gpu) == (1, None)
    assert stored.priority_classes == ("low",)


def test_a_non_admin_queue_set_is_refused_with_exit_5(replica: Replica) -> None:
    for who in ("alice", "operator"):
        result = synctl(replica, "queue", "set", "team-a", "--gpu", "3", who=who)
        assert result.exit_code == ExitCode.DENIED, result.output
        assert "may not call SetQueue; it needs role admin" in result.stderr
        assert result.stderr.rstrip().endswith("(PERMISSION_DENIED)")
    assert "team-a" not in replica.backend.state.queues


def test_delete_and_its_refusals(replica: Replica) -> None:
    assert synctl(replica, "queue", "set", "team-a", "--gpu", "3").exit_code == 0
    deleted = synctl(replica, "queue", "delete", "team-a", "-o", "json")
    assert deleted.exit_code == 0, deleted.output
    assert json.loads(deleted.stdout) == {"name": "team-a", "deleted": True}
    missing = synctl(replica, "queue", "delete", "team-a")
    assert missing.exit_code == ExitCode.NOT_FOUND and "(QUEUE_NOT_FOUND)" in missing.stderr
    default = synctl(replica, "queue", "delete", "default")
    assert default.exit_code != 0 and "(CONFLICT)" in default.stderr


def test_bad_settings_are_a_usage_error_naming_the_field(replica: Replica) -> None:
    result = synctl(replica, "queue", "set", "team-a", "--gpu", "2", "--lending-limit", "5")
    assert result.exit_code == ExitCode.USAGE, result.output
    assert "lending_limit_gpu" in result.stderr
    memory = synctl(replica, "queue", "set", "team-a", "--memory", "lots")
    assert memory.exit_code == ExitCode.USAGE and "--memory" in memory.stderr


def test_a_submission_refused_for_its_queue_names_the_queue_and_the_rule(
    replica: Replica, tmp_path: Path
) -> None:
    assert synctl(replica, "queue", "set", "team-a", "--gpu", "3").exit_code == 0
    spec = tmp_path / "job.yaml"
    spec.write_text("name: t\nreplicas: 1\ncommand: 'true'\nqueue: team-a\n")
    refused = synctl(replica, "submit", str(spec), who="alice")
    assert refused.exit_code == ExitCode.DENIED, refused.output
    assert "may not submit to queue team-a" in refused.stderr
    assert "its token names no queues, so it allows the default queue only" in refused.stderr
    unknown = tmp_path / "unknown.yaml"
    unknown.write_text("name: t\nreplicas: 1\ncommand: 'true'\nqueue: team-z\n")
    invalid = synctl(replica, "submit", str(unknown), who="admin")
    assert invalid.exit_code == ExitCode.USAGE, invalid.output
    assert "unknown.yaml:4: queue: no queue 'team-z'" in invalid.stderr


def test_status_and_explain_show_who_preempts_a_job() -> None:
    job = pb.Job(
        job_id="job-000003",
        state="RUNNING",
        spec=pb.JobSpec(name="b", replicas=1, shell_command="x", queue="team-b"),
        attempt=pb.Attempt(
            number=1,
            fencing_token=5,
            preempted_by="job-000009",
            preemption="reclaim",
            preempt_deadline_ms=1_700_000_000_000,
        ),
    )
    doc = render_jobs.job_document(job_from_proto(job))
    assert doc["queue"] == "team-b"
    assert doc["preemption"] == {
        "preempted_by": "job-000009",
        "kind": "reclaim",
        "deadline_ms": 1_700_000_000_000,
    }
    answer = pb.ExplainJobResponse(job_id=job.job_id, state="RUNNING", explanation="placed")
    text = render_jobs.explain_table(
        render_jobs.explain_document(explained_from_proto(answer), job_from_proto(job), []), 0
    )
    assert "being preempted by job job-000009 (reclaim)" in text
    assert "being preempted by job job-000009" in render_jobs.job_table(doc, 0)
    plain = render_jobs.job_document(
        job_from_proto(pb.Job(job_id="j", spec=pb.JobSpec(shell_command="x")))
    )
    assert plain["preemption"] is None and plain["queue"] == "default"


def test_a_queues_minimum_run_time_is_set_shown_and_checked(replica: Replica) -> None:
    args = ("queue", "set", "team-a", "--gpu", "3", "--min-runtime", "2h")
    early = synctl(replica, *args)  # not every replica is known to read it yet
    assert early.exit_code != 0 and "this change needs format 6" in early.stderr
    assert "team-a" not in replica.backend.state.queues
    assert apply(replica.backend.state, cmd.RaiseFormat(FORMAT, ("a",), NOW)).ok
    made = synctl(replica, *args)
    assert made.exit_code == 0, made.output
    assert replica.backend.state.queues["team-a"].min_runtime_ms == 7_200_000
    doc = json.loads(synctl(replica, "queues", "-o", "json").stdout)
    team_a = next(q for q in doc["queues"] if q["name"] == "team-a")
    assert team_a["min_runtime_ms"] == 7_200_000
    assert [c["min_runtime_ms"] for c in doc["priority_classes"]] == [0, 0, 0]
    assert doc["reclaim_wait_max_ms"] == 600_000
    table = synctl(replica, "queues").stdout
    assert "MIN RUN" in table.splitlines()[0]
    team_a_row = next(line for line in table.splitlines() if line.startswith("team-a"))
    assert team_a_row.split()[-2:] == ["2h", "limits"]
    assert "a reclaim overrides minimum run times after 10m" in table
    too_long = synctl(replica, "queue", "set", "team-a", "--gpu", "3", "--min-runtime", "8d")
    assert too_long.exit_code == ExitCode.USAGE and "min_runtime_ms" in too_long.stderr
    garbled = synctl(replica, "queue", "set", "team-a", "--min-runtime", "soon")
    assert garbled.exit_code == ExitCode.USAGE and "--min-runtime" in garbled.stderr
    assert replica.backend.state.queues["team-a"].min_runtime_ms == 7_200_000


def test_a_queues_own_member_caps_are_set_shown_and_checked(replica: Replica) -> None:
    args = ("queue", "set", "batch", "--user-running-members", "50")
    early = synctl(replica, *args, "--user-members-per-node", "4")
    assert early.exit_code != 0 and "this change needs format 10" in early.stderr
    assert apply(replica.backend.state, cmd.RaiseFormat(FORMAT, ("a",), NOW)).ok
    made = synctl(replica, *args, "--user-members-per-node", "4")
    assert made.exit_code == 0, made.output
    stored = replica.backend.state.queues["batch"]
    assert (stored.running_members_per_user, stored.members_per_node_per_user) == (50, 4)
    doc = json.loads(synctl(replica, "queues", "-o", "json").stdout)
    batch = next(q for q in doc["queues"] if q["name"] == "batch")
    assert (batch["running_members_per_user"], batch["members_per_node_per_user"]) == (50, 4)
    table = synctl(replica, "queues").stdout
    row = next(line for line in table.splitlines() if line.startswith("batch"))
    assert row.endswith("50 running, 4/node"), row
    assert "USER CAPS: a queue's own caps on one user's members" in table
    assert synctl(replica, *args).exit_code == 0  # set replaces every setting
    stored = replica.backend.state.queues["batch"]
    assert (stored.running_members_per_user, stored.members_per_node_per_user) == (50, None)
