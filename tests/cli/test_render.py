"""The documents behind -o json/yaml (a stable interface) and their table layouts."""

from __future__ import annotations

import json

import yaml

from synapse_ha.cli import (
    cluster_ops,
    render,
    render_cluster,
    render_jobs,
    render_nodes,
    render_tokens,
)
from synapse_ha.client.jobs import explained_from_proto, job_from_proto
from synapse_ha.client.nodes import node_from_proto
from synapse_ha.client.replicas import members_from_proto, status_from_proto
from synapse_ha.client.tokens import token_from_proto
from synapse_ha.core.model import Node, NodeInfo, NodeStatus, Resources
from synapse_ha.rpc import readable, to_proto
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb

JOB_KEYS = [
    "id", "name", "state", "reason", "reason_code", "retries_used", "requeues", "image",
    "request_id", "owner", "cancelled_by", "redacted", "attempt", "fencing_token", "replicas",
    "priority", "resources", "topology", "time_limit_ms", "retries", "command", "shell",
    "submitted_at_ms", "submitted_at", "finished_at_ms", "finished_at", "attempt_outcome",
    "members", "queue", "priority_class", "preemption", "progress", "prestart",
    "dependencies", "waiting_for", "begin_ms", "deadline_ms", "checkpoint", "resume_step",
    "stop_grace_ms", "account", "nodes", "on_node_failure", "elastic", "started_at_ms",
    "started_at",
    "wait_ms", "elapsed_ms",
    "time_left_ms",
]  # fmt: skip
NODE_KEYS = [
    "id", "address", "status", "status_reason", "topology", "topology_path", "capacity",
    "allocated", "free_gpus", "allocated_gpus", "gpu_model", "features", "registered_at_ms",
    "last_heartbeat_age_ms", "members_run_as", "member_isolation", "gpu_faults", "unfit",
    "conditions", "spare", "draining_for", "draining_until_ms",
]  # fmt: skip


def running_job() -> pb.Job:
    return pb.Job(
        job_id="job-000007",
        request_id="r-7",
        reason_code="running",
        requeues=1,
        spec=pb.JobSpec(
            name="train",
            replicas=2,
            resources=pb.Resources(cpu_milli=1500, memory_mib=262144, gpu=4),
            argv=pb.CommandArgs(args=["python", "train.py"]),
            topology_required="rack",
            time_limit_ms=3_600_000,
            retries=pb.RetryPolicy(max=2, backoff_ms=10_000, max_backoff_ms=600_000),
            progress=pb.Progress(timeout_ms=1_800_000, source="file"),
        ),
        state="RUNNING",
        reason="attempt 2 running",
        submitted_at_ms=1_700_000_000_000,
        attempts_made=2,
        attempt=pb.Attempt(
            number=2,
            fencing_token=41,
            members=[
                pb.Member(rank=0, node_id="w1", gpus=[0, 1, 2, 3], state="running"),
                pb.Member(
                    rank=1, node_id="w2", gpus=[4, 5, 6, 7], state="exited",
                    has_exit_code=True, exit_code=0,
                ),
            ],
        ),
    )  # fmt: skip


def node(node_id: str, rack: str, used: list[int], age_ms: int) -> pb.Node:
    return pb.Node(
        node_id=node_id,
        address=f"{node_id}.example:7070",
        status="ready",
        capacity=pb.Resources(cpu_milli=64_000, memory_mib=512 * 1024, gpu=8),
        allocated=pb.Resources(cpu_milli=1500, memory_mib=1024, gpu=len(used)),
        allocated_gpus=used,
        topology=[
            pb.TopologyLabel(level="rack", value=rack),
            pb.TopologyLabel(level="zone", value="z1"),
            pb.TopologyLabel(level="block", value="b1"),
        ],
        last_heartbeat_age_ms=age_ms,
    )


def test_a_job_document_has_every_documented_field() -> None:
    doc = render_jobs.job_document(job_from_proto(running_job()))
    assert list(doc) == JOB_KEYS
    assert doc["attempt"] == 2 and doc["fencing_token"] == 41
    assert (doc["reason_code"], doc["requeues"], doc["retries_used"]) == ("running", 1, 0)
    assert doc["resources"] == {"gpu": 4, "cpu_milli": 1500, "memory_mib": 262144}
    assert doc["command"] == ["python", "train.py"] and doc["shell"] is False
    assert doc["finished_at_ms"] is None
    assert doc["progress"] == {"timeout_ms": 1_800_000, "source": "file"}
    assert doc["members"] == [
        {
            "rank": 0, "node": "w1", "gpus": [0, 1, 2, 3], "state": "running",
            "exit_code": None, "checkpoint": None, "generation": 0, "lost": False,
        },
        {
            "rank": 1, "node": "w2", "gpus": [4, 5, 6, 7], "state": "exited",
            "exit_code": 0, "checkpoint": None, "generation": 0, "lost": False,
        },
    ]  # fmt: skip
    assert (doc["checkpoint"], doc["resume_step"]) == (None, None)
    assert doc["on_node_failure"] == {"policy": "requeue", "timeout_ms": None, "signal": None}
    assert doc["elastic"] is None
    assert json.loads(render.structured(doc, "json")) == doc
    assert yaml.safe_load(render.structured(doc, "yaml")) == doc


def test_a_job_never_bound_has_no_attempt() -> None:
    job = pb.Job(
        job_id="j", state="PENDING", reason="waits", spec=pb.JobSpec(shell_command="echo hi")
    )
    doc = render_jobs.job_document(job_from_proto(job))
    assert (doc["attempt"], doc["fencing_token"], doc["members"]) == (0, None, [])
    assert doc["progress"] is None
    assert doc["command"] == ["echo hi"] and doc["shell"] is True


def test_a_node_document_orders_topology_from_the_outside_in() -> None:
    doc = render_nodes.node_document(node_from_proto(node("w1", "r3", [0, 1], -1)))
    assert list(doc) == NODE_KEYS
    assert list(doc["topology"].items()) == [("zone", "z1"), ("block", "b1"), ("rack", "r3")]
    assert doc["topology_path"] == "z1/b1/r3"
    assert doc["free_gpus"] == 6
    assert doc["last_heartbeat_age_ms"] is None


def test_unknown_topology_levels_follow_the_known_ones() -> None:
    assert render_nodes.ordered_levels(["pod", "rack", "zone", "aisle"]) == [
        "zone",
        "rack",
        "aisle",
        "pod",
    ]


def test_explain_adds_each_members_rack() -> None:
    answer = pb.ExplainJobResponse(job_id="job-000007", state="RUNNING", explanation="...")
    nodes = [node("w1", "r1", [0, 1, 2, 3], 10), node("w2", "r2", [4, 5, 6, 7], 10)]
    doc = render_jobs.explain_document(
        explained_from_proto(answer),
        job_from_proto(running_job()),
        [node_from_proto(n) for n in nodes],
    )
    assert [(m["rank"], m["rack"], m["topology_path"]) for m in doc["members"]] == [
        (0, "r1", "z1/b1/r1"),
        (1, "r2", "z1/b1/r2"),
    ]
    text = render_jobs.explain_table(doc, 0)
    assert text.splitlines()[0] == "job job-000007 is RUNNING, attempt 2 (fencing token 41)"
    assert text.splitlines()[2].split() == [
        "RANK", "NODE", "GPUS", "RACK", "TOPOLOGY", "STATE", "EXIT",
    ]  # fmt: skip
    assert text.splitlines()[3].split() == ["0", "w1", "0,1,2,3", "r1", "z1/b1/r1", "running", "-"]


def test_checkpoint_marks_in_the_documents_and_the_tables() -> None:
    job = running_job()
    job.resume_step = 500
    job.attempt.checkpoint.CopyFrom(pb.Checkpoint(at_ms=1_700_000_000_000, step=1200))
    job.attempt.members[0].checkpoint.CopyFrom(pb.Checkpoint(at_ms=1_700_000_000_000, step=1200))
    job.attempt.members[1].checkpoint.CopyFrom(pb.Checkpoint(at_ms=1_700_000_060_000))
    doc = render_jobs.job_document(job_from_proto(job))
    assert doc["checkpoint"] == {"at_ms": 1_700_000_000_000, "step": 1200}
    assert doc["resume_step"] == 500
    assert doc["members"][1]["checkpoint"] == {"at_ms": 1_700_000_060_000, "step": None}
    assert json.loads(render.structured(doc, "json")) == doc
    now = 1_700_000_180_000
    text = render_jobs.job_table(doc, now)
    assert "CHECKPOINT:    step 1200, 3m ago" in text
    assert "RESUME STEP:   500" in text
    assert text.splitlines()[-3].split()[-1] == "CHECKPOINT"
    assert text.splitlines()[-1].endswith("2m ago, no step")
    answer = pb.ExplainJobResponse(job_id="job-000007", state="RUNNING", explanation="...")
    explained = render_jobs.explain_table(
        render_jobs.explain_document(explained_from_proto(answer), job_from_proto(job), []), now
    )
    assert "checkpoint: step 1200, 3m ago (the oldest of its members' newest marks)" in explained
    assert "a restart resumes from step 500 ($SYNAPSE_RESUME_STEP)" in explained
    job.attempt.ClearField("checkpoint")
    job.attempt.members[1].ClearField("checkpoint")
    explained = render_jobs.explain_table(
        render_jobs.explain_document(explained_from_proto(answer), job_from_proto(job), []), now
    )
    assert "checkpoint: none yet (1 of 2 members marked)" in explained


def test_tables_for_people() -> None:
    now = 1_700_000_090_000
    jobs = render_jobs.jobs_table(
        [render_jobs.job_document(job_from_proto(running_job()), now)], now
    )
    submitted = readable.short_time(1_700_000_000_000, now)
    assert jobs.splitlines()[1].split()[:7] == [
        "job-000007", "train", "RUNNING", "2", "4", "2", submitted,
    ]  # fmt: skip
    nodes = render_nodes.nodes_table(
        [render_nodes.node_document(node_from_proto(node("w1", "r1", [0, 1], 1500)))]
    )
    assert nodes.splitlines()[1].split() == [
        "w1", "ready", "-", "z1/b1/r1", "6/8", "-", "-", "1.5/64", "1Gi/512Gi", "1.5s", "ago",
        "w1.example:7070", "-", "-", "-",
    ]  # fmt: skip
    held = node("w2", "r1", [], 0)
    held.draining_for, held.draining_until_ms = "job-000009", 1_700_000_000_000
    drained = render_nodes.node_document(node_from_proto(held))
    assert (drained["draining_for"], drained["draining_until_ms"]) == (
        "job-000009",
        1_700_000_000_000,
    )
    assert render_nodes.nodes_table([drained]).splitlines()[1].split()[-1] == "job-000009"
    status = render_jobs.job_table(render_jobs.job_document(job_from_proto(running_job())), now)
    assert "RESOURCES:     4 GPU, 1.5 CPU, 256Gi per member" in status
    assert "FENCING TOKEN: 41" in status
    assert "TIME LIMIT:    1h" in status
    assert "HANG AFTER:    30m without a touch of $SYNAPSE_PROGRESS_FILE" in status


def test_the_cluster_is_healthy_with_a_leader_and_a_healthy_majority() -> None:
    replicas = [
        pb.ReplicaStatus(replica_id="a", role="leader", term=3, healthy=True),
        pb.ReplicaStatus(replica_id="b", role="follower", term=3, healthy=True),
        pb.ReplicaStatus(replica_id="c", role="unreachable", healthy=False, error="refused"),
    ]
    status = pb.GetClusterStatusResponse(answered_by="b", leader_id="a", replicas=replicas)
    doc = render_cluster.cluster_document(status_from_proto(status))
    assert doc["healthy"] is True
    assert [r["id"] for r in doc["replicas"]] == ["a", "b", "c"]
    assert "refused" in render_cluster.cluster_table(doc)
    del replicas[1]
    lonely = pb.GetClusterStatusResponse(answered_by="a", leader_id="a", replicas=replicas)
    assert render_cluster.cluster_document(status_from_proto(lonely))["healthy"] is False
    no_leader = pb.GetClusterStatusResponse(answered_by="b", replicas=replicas)
    assert render_cluster.cluster_table(
        render_cluster.cluster_document(status_from_proto(no_leader))
    ).startswith("health:  UNHEALTHY\nleader:  none")


def test_quantities_and_durations_read_well() -> None:
    assert [render.memory_text(m) for m in (0, 512, 1024, 1536, 262144, 1 << 20)] == [
        "0", "512Mi", "1Gi", "1.5Gi", "256Gi", "1Ti",
    ]  # fmt: skip
    assert [render.duration_text(ms) for ms in (None, 400, 59_000, 3_600_000, 2 * 86_400_000)] == [
        "-", "0.4s", "59s", "1h", "2d",
    ]  # fmt: skip


def test_a_redacted_job_shows_no_command_and_says_why() -> None:
    job = running_job()
    job.owner, job.redacted, job.cancelled_by = "bob", True, "user:ops"
    job.spec.ClearField("command")
    doc = render_jobs.job_document(job_from_proto(job))
    assert doc["command"] is None and doc["redacted"] is True
    assert (doc["owner"], doc["cancelled_by"]) == ("bob", "user:ops")
    text = render_jobs.job_table(doc, now_ms=1_700_000_100_000)
    assert "OWNER:         bob" in text and "CANCELLED BY:  user:ops" in text
    assert "(withheld: not your job)" in text
    mine = render_jobs.job_document(job_from_proto(running_job()))
    assert mine["command"] == ["python", "train.py"] and not mine["redacted"]
    assert "withheld" not in render_jobs.job_table(mine, now_ms=1_700_000_100_000)


def test_the_token_table_never_shows_secrets_and_says_which_are_revoked() -> None:
    tokens = [
        pb.TokenInfo(token_id="0123456789ab", user="alice", role="user", created_by="bootstrap"),
        pb.TokenInfo(
            token_id="ba9876543210",
            user="bob",
            role="operator",
            queues=["train", "eval"],
            created_by="user:root",
            revoked_at_ms=5,
            revoked_by="user:root",
        ),
    ]
    docs = [render_tokens.token_document(token_from_proto(t)) for t in tokens]
    assert docs[0]["expires_at_ms"] is None and docs[1]["revoked_at_ms"] == 5
    lines = render_tokens.tokens_table(docs).splitlines()
    headers = ["ID", "USER", "ROLE", "QUEUES", "PRIORITY", "CREATED", "BY", "EXPIRES", "STATE"]
    assert lines[0].split() == headers
    assert lines[1].split() == [
        "0123456789ab", "alice", "user", "-", "-", "bootstrap", "never", "live"
    ]  # fmt: skip
    assert "revoked by user:root" in lines[2] and "train,eval" in lines[2]


def test_the_replica_members_after_a_change_are_listed_with_their_liveness() -> None:
    answer = pb.MembershipResponse(
        members=[
            pb.ReplicaMember(replica_id="r1", raft_address="h:1", grpc_address="h:2", live=True),
            pb.ReplicaMember(replica_id="r4", raft_address="h:3", grpc_address="h:4"),
        ]
    )
    doc = cluster_ops.members_document(members_from_proto(answer))
    assert doc["members"][1] == {
        "id": "r4", "raft_address": "h:3", "grpc_address": "h:4", "live": False
    }  # fmt: skip
    lines = cluster_ops.members_table(doc).splitlines()
    assert lines[0].split() == ["REPLICA", "RAFT", "GRPC", "LIVE"]
    assert lines[1].split() == ["r1", "h:1", "h:2", "yes"] and lines[2].split()[-1] == "no"


def test_a_jobs_node_selector_in_the_document_and_the_table() -> None:
    job = running_job()
    job.spec.nodes.CopyFrom(pb.NodeSelector(features="a100&ib", names=["gpu01"]))
    doc = render_jobs.job_document(job_from_proto(job))
    assert doc["nodes"] == {"features": "a100&ib", "gpu_model": "", "names": ["gpu01"],
                            "exclude": []}  # fmt: skip
    assert json.loads(render.structured(doc, "json")) == doc
    assert "NODES:         features a100&ib, nodes gpu01" in render_jobs.job_table(doc, 0)
    assert render_jobs.job_document(job_from_proto(running_job()))["nodes"] is None


def test_a_nodes_features_reach_its_document_through_the_wire() -> None:
    info = NodeInfo("w9", "127.0.0.1:9", Resources(1000, 1024, 4), features=("ib", "a100"))
    node = Node(info=info, status=NodeStatus.READY, registered_at_ms=0)
    doc = render_nodes.node_document(node_from_proto(to_proto.node_to_proto(node, 5)))
    assert doc["features"] == ["a100", "ib"]


def test_an_elastic_gang_shows_its_range_and_its_size() -> None:
    msg = running_job()
    msg.spec.replicas = 4
    msg.spec.elastic.min_replicas = 2
    msg.spec.elastic.signal = "SIGUSR2"
    doc = render_jobs.job_document(job_from_proto(msg))
    assert doc["elastic"] == {"min": 2, "max": 4, "signal": "SIGUSR2"}
    assert render_jobs.members_text(doc) == "2 (2-4)"
    assert "2 to 4, elastic (2 now)" in render_jobs.job_table(doc, 0)
    assert render_jobs.members_text({**doc, "members": []}) == "2-4"
    fixed = render_jobs.job_document(job_from_proto(running_job()))
    assert render_jobs.members_text(fixed) == 2 and render_jobs.replicas_text(fixed) == 2
