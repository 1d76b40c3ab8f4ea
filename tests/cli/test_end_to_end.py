"""synctl against a real cluster: three replicas and two mock-GPU workers on 127.0.0.1."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from synapse_ha.cli.defaults import ExitCode
from tests.cli.conftest import Synctl
from tests.integration.cluster import wait_for

pytestmark = pytest.mark.integration

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def spec_file(tmp_path: Path, name: str, body: str) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(f"name: {name}\n{body}")
    return path


def as_json(text: str) -> Any:
    return json.loads(text)


def test_submit_wait_then_logs_show_every_rank(synctl: Synctl) -> None:
    result = synctl("submit", str(EXAMPLES / "cpu-gang.yaml"), "--wait")
    assert result.exit_code == 0, result.output + synctl.diagnostics()
    job_id = result.stdout.strip()
    assert re.fullmatch(r"\S+", job_id), result.stdout
    assert f"job {job_id} SUCCEEDED" in result.stderr

    logs = synctl("logs", job_id)
    assert logs.exit_code == 0, logs.output
    lines = logs.stdout.splitlines()
    for rank in range(4):
        expected = f"[rank {rank}] rank {rank} of 4"
        assert [line for line in lines if line.startswith(expected)], logs.stdout

    one = synctl("logs", job_id, "--member", "2")
    assert one.exit_code == 0, one.output
    assert one.stdout.startswith("rank 2 of 4 "), one.stdout
    assert "[rank" not in one.stdout

    missing = synctl("logs", job_id, "--member", "9")
    assert missing.exit_code == ExitCode.NOT_FOUND
    assert "no member 9" in missing.stderr

    status = synctl("status", job_id, "-o", "json")
    assert status.exit_code == 0, status.output
    doc = as_json(status.stdout)
    assert doc["id"] == job_id
    assert doc["name"] == "cpu-gang"
    assert doc["state"] == "SUCCEEDED"
    assert doc["attempt"] == 1
    assert isinstance(doc["fencing_token"], int) and doc["fencing_token"] > 0
    assert doc["replicas"] == 4
    assert doc["resources"] == {"gpu": 0, "cpu_milli": 500, "memory_mib": 256}
    assert "reason" in doc
    assert sorted(m["rank"] for m in doc["members"]) == [0, 1, 2, 3]
    for member in doc["members"]:
        assert set(member) >= {"rank", "node", "gpus", "state", "exit_code"}
        assert member["node"] in ("w1", "w2")
        assert (member["state"], member["exit_code"], member["gpus"]) == ("exited", 0, [])

    table = synctl("status", job_id)
    assert table.exit_code == 0
    assert "SUCCEEDED" in table.stdout and "RANK" in table.stdout

    listed = synctl("jobs", "--all", "-o", "json")
    assert listed.exit_code == 0
    assert job_id in [j["id"] for j in as_json(listed.stdout)["jobs"]]
    active = synctl("jobs", "-o", "json")
    assert job_id not in [j["id"] for j in as_json(active.stdout)["jobs"]]
    succeeded = synctl("jobs", "--state", "succeeded")
    assert job_id in succeeded.stdout and "STATE" in succeeded.stdout


def test_a_failing_job_exits_1_with_wait(synctl: Synctl, tmp_path: Path) -> None:
    path = spec_file(tmp_path, "fails", "replicas: 2\ncommand: 'echo bye; exit 3'\n")
    result = synctl("-o", "json", "submit", str(path), "--wait")
    assert result.exit_code == ExitCode.JOB_FAILED, result.output
    doc = as_json(result.stdout)
    assert doc["state"] == "FAILED" and doc["created"] is True
    status = as_json(synctl("status", doc["id"], "-o", "json").stdout)
    assert status["state"] == "FAILED"
    assert 3 in [m["exit_code"] for m in status["members"]]


def test_resubmitting_the_same_request_id_returns_the_same_job(
    synctl: Synctl, tmp_path: Path
) -> None:
    path = spec_file(
        tmp_path, "once", "replicas: 1\ncommand: 'true'\nrequest_id: cli-test-once-1\n"
    )
    first = synctl("submit", str(path))
    second = synctl("submit", str(path))
    assert first.exit_code == 0 and second.exit_code == 0, first.output + second.output
    assert first.stdout == second.stdout
    assert "already submitted" not in first.stderr
    assert "already submitted" in second.stderr
    as_doc = as_json(synctl("-o", "json", "submit", str(path)).stdout)
    assert as_doc == {
        "id": first.stdout.strip(),
        "request_id": "cli-test-once-1",
        "created": False,
    }


def test_without_a_request_id_each_submission_is_a_new_job(synctl: Synctl, tmp_path: Path) -> None:
    path = spec_file(tmp_path, "twice", "replicas: 1\ncommand: 'true'\n")
    first = as_json(synctl("-o", "json", "submit", str(path)).stdout)
    second = as_json(synctl("-o", "json", "submit", str(path)).stdout)
    assert first["id"] != second["id"]
    assert first["request_id"] != second["request_id"]
    assert first["created"] and second["created"]
    status = as_json(synctl("-o", "json", "status", first["id"]).stdout)
    assert status["request_id"] == first["request_id"]


def test_follow_streams_every_rank_until_the_end(synctl: Synctl, tmp_path: Path) -> None:
    path = spec_file(
        tmp_path,
        "chatty",
        "replicas: 2\nresources: {cpu: 1}\n"
        "command: 'for i in 1 2 3; do echo line $i of $RANK; sleep 0.2; done'\n",
    )
    result = synctl("submit", str(path), "--follow")
    assert result.exit_code == 0, result.output + synctl.diagnostics()
    lines = result.stdout.splitlines()
    job_id = lines[0]
    for rank in (0, 1):
        assert [ln for ln in lines if ln.startswith(f"[rank {rank}] ")] == [
            f"[rank {rank}] line {i} of {rank}" for i in (1, 2, 3)
        ]
    again = synctl("logs", job_id, "-f", "--member", "1")
    assert again.exit_code == 0, again.output
    assert again.stdout.splitlines() == [f"line {i} of 1" for i in (1, 2, 3)]


def test_explain_a_running_gang_shows_node_gpus_and_rack(synctl: Synctl) -> None:
    submitted = synctl("submit", str(EXAMPLES / "topology-required.yaml"))
    assert submitted.exit_code == 0, submitted.output
    job_id = submitted.stdout.strip()
    wait_for(
        f"{job_id} placed",
        lambda: synctl.client.get_job(job_id).HasField("attempt"),
        timeout_s=20,
    )
    result = synctl("explain", job_id, "-o", "json")
    assert result.exit_code == 0, result.output
    doc = as_json(result.stdout)
    assert doc["id"] == job_id and doc["attempt"] == 1
    racks = {m["topology"]["rack"] for m in doc["members"]}
    assert len(racks) == 1, doc
    for member in doc["members"]:
        assert len(member["gpus"]) == 4
        assert member["topology_path"] == f"z1/b1/{member['topology']['rack']}"
    table = synctl("explain", job_id)
    assert table.exit_code == 0
    assert "TOPOLOGY" in table.stdout and "z1/b1/r" in table.stdout
    assert synctl("submit", str(EXAMPLES / "topology-required.yaml"), "--wait").exit_code == 0


def test_a_gang_too_large_is_refused_or_waits_explains_and_can_be_cancelled(
    synctl: Synctl, tmp_path: Path
) -> None:
    spec = "replicas: 3\nresources: {gpu: 8}\ncommand: 'true'\n"
    # Larger than the two nodes: refused at submit, saying what is missing ...
    refused = synctl("submit", str(spec_file(tmp_path, "huge", spec)))
    assert refused.exit_code != 0
    assert "needs 3 nodes" in refused.output and "the cluster has 2" in refused.output
    assert "wait_for_nodes" in refused.output
    assert "huge" not in [j.spec.name for j in synctl.client.list_jobs()]
    # ... unless it asks to wait for nodes that will join.
    path = spec_file(tmp_path, "huge", spec + "wait_for_nodes: true\n")
    job_id = synctl("submit", str(path)).stdout.strip()
    wait_for(f"{job_id} pending with a reason", lambda: synctl.client.get_job(job_id).reason)
    explained = synctl("explain", job_id)
    assert explained.exit_code == 0
    assert explained.stdout.startswith(f"job {job_id} is PENDING\n")
    reason = as_json(synctl("-o", "json", "explain", job_id).stdout)["explanation"]
    assert reason and reason in explained.stdout
    pending = as_json(synctl("jobs", "--state", "PENDING", "-o", "json").stdout)["jobs"]
    assert job_id in [j["id"] for j in pending]
    assert synctl("logs", job_id).exit_code == ExitCode.JOB_FAILED

    cancelled = synctl("cancel", job_id, "--reason", "too big")
    assert cancelled.exit_code == 0, cancelled.output
    assert cancelled.stdout.strip() == f"job {job_id}: CANCELLED"
    again = synctl("cancel", job_id, "-o", "yaml")
    assert again.exit_code == 0
    assert yaml.safe_load(again.stdout)["state"] == "CANCELLED"


def test_nodes_render_capacity_topology_and_heartbeat(synctl: Synctl) -> None:
    result = synctl("nodes", "-o", "json")
    assert result.exit_code == 0, result.output
    nodes = {n["id"]: n for n in as_json(result.stdout)["nodes"]}
    assert sorted(nodes) == ["w1", "w2"]
    w1 = nodes["w1"]
    assert w1["status"] == "ready"
    assert w1["topology"] == {"zone": "z1", "block": "b1", "rack": "r1"}
    assert w1["topology_path"] == "z1/b1/r1"
    assert w1["capacity"]["gpu"] == 8 and w1["capacity"]["cpu_milli"] == 8000
    assert w1["capacity"]["memory_mib"] == 16 * 1024
    assert set(w1["allocated"]) == {"gpu", "cpu_milli", "memory_mib"}
    assert w1["free_gpus"] == 8 - len(w1["allocated_gpus"])
    assert w1["address"].startswith("127.0.0.1:")
    assert isinstance(w1["last_heartbeat_age_ms"], int)
    assert w1["spare"] is False  # the cluster keeps no hot spares
    table = synctl("nodes")
    assert table.exit_code == 0
    header = table.stdout.splitlines()[0].split()
    assert header[:4] == ["NODE", "STATUS", "SPARE", "TOPOLOGY"]
    assert "z1/b1/r2" in table.stdout and " ago" in table.stdout


def node_status(synctl: Synctl, node_id: str) -> tuple[str, str]:
    nodes = {n["id"]: n for n in as_json(synctl("nodes", "-o", "json").stdout)["nodes"]}
    return nodes[node_id]["status"], nodes[node_id]["status_reason"]


def test_cordon_drain_uncordon(synctl: Synctl, tmp_path: Path) -> None:
    # A 2 x 8-GPU gang fills both 8-GPU nodes, so w2 runs a member while it drains.
    path = spec_file(tmp_path, "occupant", "replicas: 2\nresources: {gpu: 8}\ncommand: sleep 60\n")
    job_id = synctl("submit", str(path)).stdout.strip()
    try:
        wait_for(
            f"a member of {job_id} running on w2",
            lambda: any(
                m.node_id == "w2" and m.state == "running"
                for m in synctl.client.get_job(job_id).attempt.members
            ),
            timeout_s=30,
        )
        cordoned = synctl("cordon", "w2", "--reason", "testing")
        assert cordoned.exit_code == 0, cordoned.output
        assert cordoned.stdout.strip() == "node w2: cordoned"
        assert node_status(synctl, "w2") == ("cordoned", "testing")
        drained = as_json(synctl("drain", "w2", "-o", "json").stdout)
        # A member still runs on w2: the node drains, it is not empty yet.
        assert (drained["id"], drained["status"]) == ("w2", "draining")
        assert node_status(synctl, "w2")[0] == "draining"
    finally:
        synctl("cancel", job_id)
        back = synctl("uncordon", "w2")
    assert back.exit_code == 0 and back.stdout.strip() == "node w2: ready"


def test_a_drained_node_is_cordoned_once_empty(synctl: Synctl) -> None:
    try:
        assert synctl("drain", "w2", "--reason", "empty").exit_code == 0
        wait_for("w2 cordoned once empty", lambda: node_status(synctl, "w2")[0] == "cordoned", 5)
    finally:
        back = synctl("uncordon", "w2")
    assert back.exit_code == 0 and back.stdout.strip() == "node w2: ready"


def test_cluster_shows_one_leader_and_three_replicas(synctl: Synctl) -> None:
    result = synctl("cluster", "-o", "json")
    assert result.exit_code == 0, result.output
    doc = as_json(result.stdout)
    assert doc["healthy"] is True
    assert len(doc["replicas"]) == 3
    roles = sorted(r["role"] for r in doc["replicas"])
    assert roles == ["follower", "follower", "leader"]
    leader = next(r for r in doc["replicas"] if r["role"] == "leader")
    assert doc["leader"] == leader["id"]
    assert doc["leader_address"] == leader["grpc_address"]
    assert all(r["term"] >= 1 and r["commit_index"] >= 1 for r in doc["replicas"])
    assert doc["nodes"] == 2
    table = synctl("cluster")
    assert table.exit_code == 0
    assert table.stdout.startswith("health:  healthy\n")
    assert "REPLICA" in table.stdout and "leader" in table.stdout


@pytest.mark.parametrize(
    "args",
    [
        ("status", "no-such-job"),
        ("explain", "no-such-job"),
        ("cancel", "no-such-job"),
        ("logs", "no-such-job"),
        ("cordon", "no-such-node"),
        ("drain", "no-such-node"),
    ],
)
def test_unknown_ids_exit_4(synctl: Synctl, args: tuple[str, ...]) -> None:
    result = synctl(*args)
    assert result.exit_code == ExitCode.NOT_FOUND, result.output
    assert result.stdout == ""
    assert len(result.stderr.splitlines()) == 1
    assert args[1] in result.stderr and result.stderr.startswith("error: ")


def test_json_errors_carry_the_clusters_reason(synctl: Synctl, tmp_path: Path) -> None:
    missing = synctl("-o", "json", "status", "no-such-job")
    assert missing.exit_code == ExitCode.NOT_FOUND, missing.output
    error = as_json(missing.stderr)["error"]
    assert (error["code"], error["job_id"], error["status"]) == (
        "JOB_NOT_FOUND",
        "no-such-job",
        "NOT_FOUND",
    )
    assert "no-such-job" in error["message"]
    node = as_json(synctl("-o", "json", "cordon", "no-such-node").stderr)["error"]
    assert (node["code"], node["node_id"]) == ("NODE_NOT_FOUND", "no-such-node")
    path = spec_file(
        tmp_path, "galaxy", "replicas: 1\ncommand: 'true'\ntopology:\n  preferred: galaxy\n"
    )
    refused = synctl("-o", "json", "submit", str(path))
    assert refused.exit_code == ExitCode.USAGE, refused.output
    error = as_json(refused.stderr)["error"]
    assert (error["code"], error["field"], error["line"]) == (
        "INVALID_FIELD",
        "topology.preferred",
        5,
    )
    assert error["rule"].endswith("(the cluster's rule)")


def test_an_invalid_spec_never_reaches_the_cluster(synctl: Synctl, tmp_path: Path) -> None:
    before = len(synctl.client.list_jobs())
    path = spec_file(tmp_path, "bad", "replicas: 1\nresources: {memory: lots}\ncommand: x\n")
    result = synctl("submit", str(path))
    assert result.exit_code == ExitCode.USAGE
    assert f"{path}:3: resources.memory:" in result.stderr
    assert len(synctl.client.list_jobs()) == before


def test_the_cluster_checks_topology_levels_and_the_file_line_is_named(
    synctl: Synctl, tmp_path: Path
) -> None:
    path = spec_file(
        tmp_path, "galaxy", "replicas: 1\ncommand: 'true'\ntopology:\n  required: galaxy\n"
    )
    result = synctl("submit", str(path))
    assert result.exit_code == ExitCode.USAGE, result.output
    assert result.stderr.startswith(f"error: invalid job spec: {path}:5: topology.required: ")
    assert "'galaxy'" in result.stderr and "(the cluster's rule)" in result.stderr


def test_follow_carries_on_into_the_retry(synctl: Synctl, tmp_path: Path) -> None:
    path = spec_file(
        tmp_path,
        "retried",
        "replicas: 2\nresources: {cpu: 1}\nretries: {max: 1, backoff: 2s, max_backoff: 2s}\n"
        "command: 'echo try $SYNAPSE_ATTEMPT of $RANK; sleep 0.5; test $SYNAPSE_ATTEMPT -ge 2'\n",
    )
    result = synctl("submit", str(path), "--follow")
    assert result.exit_code == 0, result.output + synctl.diagnostics()
    lines = result.stdout.splitlines()[1:]
    # A member of the failed first attempt may be stopped before it ever starts (the
    # whole gang fails with its first member), so only the retry's output is certain.
    first = {f"[rank {r}] try 1 of {r}" for r in (0, 1)}
    second = {f"[rank {r}] try 2 of {r}" for r in (0, 1)}
    assert set(lines) & first, result.output
    assert set(lines) <= first | second and second <= set(lines), result.output
    assert len(lines) == len(set(lines)), result.output
    last_of_first = max(i for i, line in enumerate(lines) if line in first)
    assert last_of_first < min(lines.index(line) for line in second)
    assert "following attempt 2" in result.stderr
