"""synctl's view of node checks and pre-start checks without a cluster: the node
document's ``conditions`` and the FAILING column, a job's ``prestart`` (its command
withheld from other users), and hostile check text kept off the terminal."""

from __future__ import annotations

import json

from synapse_ha.cli import render, render_jobs, render_nodes
from synapse_ha.client.jobs import job_from_proto
from synapse_ha.client.nodes import node_from_proto
from synapse_ha.core.health.fitness import CHECK_ACTOR, NodeCondition
from synapse_ha.core.health.prestart import Prestart
from synapse_ha.core.health.progress import SOURCE_LOG, Progress
from synapse_ha.core.model import Job, JobSpec, Node, NodeInfo, NodeStatus, Resources, RetryPolicy
from synapse_ha.core.workflows.dependencies import Dependencies
from synapse_ha.rpc import to_proto
from tests.cli.test_gpu_health_render import HOSTILE, NOW, row


def checked_node(message: str = "disk /scratch full") -> Node:
    info = NodeInfo("w1", "h:1", Resources(1000, 1024, 8))
    node = Node(info=info, status=NodeStatus.CORDONED, registered_at_ms=1)
    node.status_reason = f"health check failed: {message}"
    node.status_by = CHECK_ACTOR
    node.conditions = (NodeCondition("health-check", message, NOW - 1_000),)
    return node


def test_a_failing_check_reaches_the_document_and_the_table() -> None:
    doc = render_nodes.node_document(
        node_from_proto(to_proto.node_to_proto(checked_node(), -1)), NOW
    )
    assert doc["conditions"] == [
        {"name": "health-check", "message": "disk /scratch full", "since_ms": NOW - 1_000}
    ]
    assert doc["status"] == "cordoned"
    assert doc["status_reason"] == "health check failed: disk /scratch full"
    assert json.loads(render.structured({"nodes": [doc]}, "json"))["nodes"][0] == doc
    healthy = to_proto.node_to_proto(
        Node(info=NodeInfo("w2", "h:2", Resources(1, 1, 0)), status=NodeStatus.READY,
             registered_at_ms=1), -1
    )  # fmt: skip
    text = render_nodes.nodes_table(
        [doc, render_nodes.node_document(node_from_proto(healthy), NOW)]
    )
    assert row(text, "w1")["FAILING"] == "health-check"
    assert row(text, "w2")["FAILING"] == "-"


def test_hostile_check_text_stays_off_the_terminal_and_exact_in_json() -> None:
    doc = render_nodes.node_document(
        node_from_proto(to_proto.node_to_proto(checked_node(HOSTILE), -1)), NOW
    )
    assert doc["conditions"][0]["message"] == HOSTILE
    text = render_nodes.nodes_table([doc])
    for unsafe in ("\x1b", "\x07", "\r", "\u202e"):
        assert unsafe not in text


def job_with_prestart(prestart: Prestart | None) -> Job:
    spec = JobSpec("train", 1, Resources(), ("python train.py",), prestart=prestart)
    return Job("job-000001", spec, "r", 1, NOW, owner="alice")


def test_a_jobs_prestart_check_is_shown_and_withheld_from_other_users() -> None:
    prestart = Prestart(("/opt/check", "--gpus"), False, 120_000)
    doc = render_jobs.job_document(
        job_from_proto(to_proto.job_to_proto(job_with_prestart(prestart)))
    )
    assert doc["prestart"] == {
        "command": ["/opt/check", "--gpus"],
        "shell": False,
        "timeout_ms": 120_000,
    }
    assert "PRESTART:      /opt/check --gpus (timeout 2m)" in render_jobs.job_table(doc, NOW)
    shell = Prestart(("test -d /data && nvidia-smi",), True, 60_000)
    doc = render_jobs.job_document(job_from_proto(to_proto.job_to_proto(job_with_prestart(shell))))
    assert "PRESTART:      test -d /data && nvidia-smi (timeout 1m)" in (
        render_jobs.job_table(doc, NOW)
    )
    other = render_jobs.job_document(
        job_from_proto(to_proto.job_to_proto(job_with_prestart(prestart), redacted=True))
    )
    assert other["prestart"] == {"command": None, "shell": False, "timeout_ms": 120_000}
    assert "PRESTART:      (withheld) (timeout 2m)" in render_jobs.job_table(other, NOW)
    none = render_jobs.job_document(job_from_proto(to_proto.job_to_proto(job_with_prestart(None))))
    assert none["prestart"] is None


def test_a_job_from_the_wire_shows_its_spec_as_submitted() -> None:
    spec = JobSpec(
        "train", 2, Resources(2000, 1024, 1), ("python", "train.py"), shell=False,
        retries=RetryPolicy(3, 5_000, 60_000), progress=Progress(1_800_000, SOURCE_LOG),
        dependencies=Dependencies(after_ok=("job-000001",)), queue="team-a",
    )  # fmt: skip
    doc = render_jobs.job_document(
        job_from_proto(to_proto.job_to_proto(Job("job-2", spec, "r", 1, NOW)))
    )
    assert doc["command"] == ["python", "train.py"] and doc["shell"] is False
    assert doc["retries"] == {"max": 3, "backoff_ms": 5_000, "max_backoff_ms": 60_000}
    assert doc["progress"] == {"timeout_ms": 1_800_000, "source": SOURCE_LOG}
    assert doc["dependencies"] == {"afterok": ["job-000001"]}
    assert (doc["queue"], doc["replicas"], doc["resources"]["cpu_milli"]) == ("team-a", 2, 2000)
    withheld = to_proto.job_to_proto(Job("job-3", spec, "r", 1, NOW, owner="bob"), redacted=True)
    other = render_jobs.job_document(job_from_proto(withheld))
    assert other["command"] is None and other["redacted"]
