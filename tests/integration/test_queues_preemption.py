"""Queues and preemption through synctl on a real TLS cluster: three replicas and one
mock-GPU worker on 127.0.0.1, users with tokens naming their queues.

team-a and team-b share cohort ``lab`` (4 GPUs of nominal quota each, 8 GPUs in all).
team-b borrows all 8; team-a then submits a gang within its nominal quota, so team-b's
gang is preempted whole: each member finds its notice in ``$SYNAPSE_PREEMPT_FILE`` and
gets SIGTERM, the gang is requeued (PENDING, same place in line, retries untouched) and
team-a's gang runs. ``synctl queues`` and ``synctl explain`` say so along the way.

A gang of a class with a minimum run time is not preempted before it has run that long
(the preemptor says so: ``waiting_min_runtime``); once preempted, its members save, mark
a checkpoint and exit on SIGTERM (examples/pytorch_checkpoint.py), so the grace ends at
once, and its next attempt resumes from that mark.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from synapse_ha.client.cluster import ClusterClient
from synapse_ha.rpc.errors import Reason, failure_of
from tests.cli.conftest import TIMEOUTS, Synctl
from tests.integration.cluster import LocalCluster, wait_for
from tests.worker.workers import LocalWorkers

pytestmark = pytest.mark.integration

MIN_RUNTIME_S = 8
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "pytorch_checkpoint.py"

# A short grace for the victims' class, so that a member ignoring SIGTERM would not hold
# the test up; these members exit on SIGTERM anyway.
CLASSES = [
    "--priority-class", "low=-100,grace=3s",
    "--priority-class", "normal=0,grace=3s",
    "--priority-class", "high=100,preempts,grace=3s",
    # A long grace the victims end early by saving, marking and exiting, and a minimum
    # run time the preemptor waits for.
    "--priority-class", f"patient=-50,grace=60s,min-runtime={MIN_RUNTIME_S}s",
    "--preemption", "topology",
]  # fmt: skip


@pytest.fixture(scope="module")
def synctl(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Synctl]:
    root = tmp_path_factory.mktemp("queues")
    cluster = LocalCluster(root / "cluster", extra_args=[*TIMEOUTS, *CLASSES])
    workers = LocalWorkers(root / "workers", cluster.grpc_addresses, cluster.credentials)
    workers.root.mkdir()
    try:
        cluster.start()
        cluster.serving_leader()
        workers.start(
            "w1", "--mock-gpus", "8", "--cpu", "16", "--memory", "16Gi",
            "--topology", "zone=z1,block=b1,rack=r1", "--log-level", "WARNING",
        )  # fmt: skip
        with cluster.client(timeout_s=10.0) as client:
            wait_for(
                "the worker ready",
                lambda: [n.node_id for n in client.list_nodes() if n.status == "ready"] == ["w1"],
                timeout_s=30,
            )
            yield Synctl(cluster, workers, client)
    finally:
        workers.close()
        cluster.close()


def as_user(synctl: Synctl, token: str) -> dict[str, str]:
    """The environment of a user who has the cluster's TLS files and ``token``."""
    env = {k: v for k, v in synctl.admin_env.items() if k != "SYNAPSE_TOKEN_FILE"}
    return {**env, "SYNAPSE_TOKEN": token}


def known_everywhere(synctl: Synctl, token: str) -> None:
    """Wait (bounded) until every replica has applied the token: each one checks a
    caller's token against its own copy before it redirects to the leader."""

    def accepted(address: str) -> bool:
        transport = synctl.cluster.transport
        with ClusterClient([address], token=token, channel_factory=transport.channel) as c:
            try:
                c.list_queues()
            except grpc.RpcError as exc:
                return failure_of(exc).reason is not Reason.UNAUTHENTICATED
            return True

    for address in synctl.cluster.grpc_addresses:
        wait_for(f"the token known at {address}", lambda a=address: accepted(a))


def ok(result: Any, synctl: Synctl) -> str:
    assert result.exit_code == 0, result.output + synctl.diagnostics()
    text: str = result.stdout
    return text


def queues(synctl: Synctl) -> dict[str, Any]:
    doc = json.loads(ok(synctl("queues", "-o", "json"), synctl))
    return {q["name"]: q for q in doc["queues"]}


def job(synctl: Synctl, job_id: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(ok(synctl("status", job_id, "-o", "json"), synctl))
    return doc


def gang_spec(path: Path, name: str, queue: str, members: int, gpu: int, out: Path) -> Path:
    """A gang whose members note that they started, and on SIGTERM copy the preemption
    notice and note the signal, then exit."""
    command = (
        f'trap \'cp "$SYNAPSE_PREEMPT_FILE" {out}/{name}-$RANK.notice; '
        f"echo $SYNAPSE_FENCING_TOKEN > {out}/{name}-$RANK.term; exit 0' TERM; "
        f"echo $SYNAPSE_FENCING_TOKEN > {out}/{name}-$RANK.up; sleep 600 & wait"
    )
    path.write_text(
        f"name: {name}\nreplicas: {members}\nqueue: {queue}\npriority: low\n"
        f"resources: {{gpu: {gpu}, cpu: 1, memory: 256Mi}}\n"
        f"command: {json.dumps(command)}\n"
    )
    return path


def test_a_queue_within_its_quota_reclaims_from_a_borrower(synctl: Synctl, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    for name in ("team-a", "team-b"):
        ok(synctl("queue", "set", name, "--gpu", "4", "--cohort", "lab"), synctl)
    alice = ok(synctl("token", "create", "--user", "alice", "--queue", "team-a"), synctl).strip()
    bob = ok(synctl("token", "create", "--user", "bob", "--queue", "team-b"), synctl).strip()
    for token in (alice, bob):
        known_everywhere(synctl, token)

    # bob may not use team-a's queue: refused, naming the queue and the rule.
    wrong = gang_spec(tmp_path / "wrong.yaml", "wrong", "team-a", 1, 1, out)
    refused = synctl("submit", str(wrong), env=as_user(synctl, bob))
    assert refused.exit_code == 5, refused.output
    assert "may not submit to queue team-a: its token allows the queues team-b" in refused.stderr

    # team-b runs two gangs of 4 GPUs: its nominal 4, and 4 borrowed from team-a.
    b_ids = []
    for name in ("b1", "b2"):
        spec = gang_spec(tmp_path / f"{name}.yaml", name, "team-b", 2, 2, out)
        b_ids.append(ok(synctl("submit", str(spec), env=as_user(synctl, bob)), synctl).strip())
    wait_for(
        "team-b's gangs running",
        lambda: all(job(synctl, b)["state"] == "RUNNING" for b in b_ids),
        timeout_s=30,
    )
    wait_for("team-b's members up", lambda: len(list(out.glob("b*.up"))) == 4)
    order_before = [j["id"] for j in json.loads(ok(synctl("jobs", "-o", "json"), synctl))["jobs"]]
    shown = queues(synctl)
    assert (shown["team-b"]["used"]["gpu"], shown["team-b"]["borrowed_gpu"]) == (8, 4)
    assert (shown["team-a"]["used"]["gpu"], shown["team-a"]["lent_gpu"]) == (0, 4)
    table = ok(synctl("queues"), synctl)
    assert [line.split()[:6] for line in table.splitlines() if line.startswith("team-b")] == [
        ["team-b", "lab", "4", "8", "4", "0"]
    ]

    # team-a asks for its own nominal quota back.
    a_spec = gang_spec(tmp_path / "a.yaml", "a-gang", "team-a", 1, 4, out)
    a_id = ok(synctl("submit", str(a_spec), env=as_user(synctl, alice)), synctl).strip()

    # One of team-b's gangs is preempted whole: both its members got the notice and
    # SIGTERM; the other gang was left alone.
    victim_name = wait_for(
        "a team-b gang's members got SIGTERM",
        lambda: next((n for n in ("b1", "b2") if len(list(out.glob(f"{n}-*.term"))) == 2), None),
        timeout_s=30,
    )
    victim = b_ids[0] if victim_name == "b1" else b_ids[1]
    survivor_name = "b2" if victim_name == "b1" else "b1"
    survivor = b_ids[1] if victim_name == "b1" else b_ids[0]
    for notice in sorted(out.glob(f"{victim_name}-*.notice")):
        doc = json.loads(notice.read_text())
        assert (doc["kind"], doc["preemptor"]) == ("reclaim", a_id), doc
        assert 0 <= doc["grace_ms"] <= 3_000
    assert len(list(out.glob(f"{victim_name}-*.notice"))) == 2

    # It is requeued, keeping its place and its retries; a-gang runs.
    wait_for("a-gang running", lambda: job(synctl, a_id)["state"] == "RUNNING", timeout_s=30)
    b = wait_for(
        "the victim requeued",
        lambda: (d := job(synctl, victim))["state"] == "PENDING" and d["attempt"] == 1 and d,
        timeout_s=30,
    )
    assert b["retries_used"] == 0 and b["requeues"] == 0, b
    # Its reason says why it waits now, with the preemption as the cause.
    assert b["reason_code"] in ("requeued_preempted", "waiting_quota"), b
    assert f"preempted by {a_id}" in b["reason"], b
    assert f"preempted by {a_id}" in b["attempt_outcome"], b
    assert job(synctl, survivor)["state"] == "RUNNING"
    assert not list(out.glob(f"{survivor_name}-*.term"))
    order_after = [j["id"] for j in json.loads(ok(synctl("jobs", "-o", "json"), synctl))["jobs"]]
    assert order_after[: len(order_before)] == order_before  # the same place in line

    # explain says who preempted whom, and why the victim waits now.
    explained = json.loads(ok(synctl("explain", victim, "-o", "json"), synctl))
    assert f"preempted by {a_id}" in explained["reason"], explained
    assert "queue team-b" in explained["explanation"], explained

    shown = queues(synctl)
    assert (shown["team-a"]["used"]["gpu"], shown["team-a"]["borrowed_gpu"]) == (4, 0)
    assert (shown["team-b"]["used"]["gpu"], shown["team-b"]["borrowed_gpu"]) == (4, 0)
    assert (shown["team-b"]["pending_jobs"], shown["team-b"]["pending_gpu"]) == (1, 4)

    # Leave the cluster as found.
    for job_id in (a_id, *b_ids):
        ok(synctl("cancel", job_id), synctl)


def test_a_victim_runs_its_minimum_then_checkpoints_in_its_grace_and_resumes(
    synctl: Synctl, tmp_path: Path
) -> None:
    ok(synctl("queue", "set", "prio", "--classes", "patient,high"), synctl)
    saved = tmp_path / "states"
    command = [sys.executable, str(EXAMPLE), "--steps", "1000000", "--every", "1000000"]
    victim_spec = tmp_path / "victim.yaml"
    victim_spec.write_text(
        "name: patient\nreplicas: 2\nqueue: prio\npriority: patient\n"
        "resources: {gpu: 4, cpu: 1, memory: 256Mi}\n"
        f"command: {json.dumps([*command, '--step-s', '0.01', '--dir', str(saved)])}\n"
    )
    victim = ok(synctl("submit", str(victim_spec)), synctl).strip()
    wait_for("the victim running", lambda: job(synctl, victim)["state"] == "RUNNING", timeout_s=30)
    urgent_spec = tmp_path / "urgent.yaml"
    urgent_spec.write_text(
        "name: urgent\nreplicas: 1\nqueue: prio\npriority: high\n"
        "resources: {gpu: 8, cpu: 1, memory: 256Mi}\ncommand: sleep 600\n"
    )
    urgent = ok(synctl("submit", str(urgent_spec)), synctl).strip()

    # Within the victim's minimum run time the preemptor waits, and says why.
    waiting = wait_for(
        "the preemptor waiting for the minimum run time",
        lambda: (d := job(synctl, urgent))["reason_code"] == "waiting_min_runtime" and d,
        timeout_s=MIN_RUNTIME_S,
    )
    assert "1 gang(s) it may preempt (priority:" in waiting["reason"], waiting
    assert job(synctl, victim)["state"] == "RUNNING"

    # Then the victim is preempted: its members save and mark the step they reached and
    # exit, and the preemptor runs long before the victim's 60 s grace is over.
    wait_for("the preemptor running", lambda: job(synctl, urgent)["state"] == "RUNNING", 40)
    requeued = wait_for(
        "the victim requeued with a resume step",
        lambda: (
            (d := job(synctl, victim))["state"] == "PENDING" and d["resume_step"] is not None and d
        ),
        timeout_s=30,
    )
    step = requeued["resume_step"]
    assert requeued["requeues"] == 0 and requeued["retries_used"] == 0, requeued
    assert requeued["checkpoint"]["step"] == step, requeued
    logs = ok(synctl("logs", victim), synctl)
    assert "preempted; saved and marked step" in logs, logs

    # Once the preemptor is gone the victim resumes from that step.
    ok(synctl("cancel", urgent), synctl)

    def resumed() -> bool:
        shown = synctl("logs", victim)  # refused while its new attempt has not started
        return shown.exit_code == 0 and f"(the gang's mark: {step})" in shown.stdout

    wait_for("the victim resumed", resumed, timeout_s=60)
    ok(synctl("cancel", victim), synctl)


def test_a_cohort_tree_is_built_drawn_and_bounds_admission(synctl: Synctl, tmp_path: Path) -> None:
    """``synctl cohort set`` once every replica reads format 7 (the leader raises the
    floor by itself), ``synctl queues --tree``, and a gang beyond what its team may
    borrow waiting with the quota reason."""
    wait_for(
        "the cohort org created (format 7)",
        lambda: synctl("cohort", "set", "org").exit_code == 0,
        timeout_s=30,
    )
    ok(synctl("cohort", "set", "team-x", "--parent", "org", "--borrowing-limit", "0"), synctl)
    ok(synctl("cohort", "set", "team-y", "--parent", "org", "--gpu", "2"), synctl)
    ok(synctl("queue", "set", "tx", "--gpu", "1", "--cohort", "team-x"), synctl)
    ok(synctl("queue", "set", "ty", "--gpu", "1", "--cohort", "team-y"), synctl)

    doc = json.loads(ok(synctl("queues", "--tree", "-o", "json"), synctl))
    (org,) = [root for root in doc["tree"] if root["name"] == "org"]
    assert (org["nominal_gpu"], org["used_gpu"], org["borrowed_gpu"]) == (4, 0, 0)
    teams = {c["name"]: c for c in org["children"]}
    assert sorted(teams) == ["team-x", "team-y"]
    assert teams["team-x"]["borrowing_limit_gpu"] == 0 and teams["team-y"]["nominal_gpu"] == 3
    assert [q["name"] for q in teams["team-x"]["children"]] == ["tx"]
    drawn = ok(synctl("queues", "--tree"), synctl).splitlines()
    assert drawn[0].split()[:3] == ["COHORT", "/", "QUEUE"]
    assert ["|-", "team-x", "1", "0", "0", "0", "any"] in [line.split() for line in drawn]

    # tx has 1 GPU and its team may borrow none of org's 3 idle GPUs: a 2-GPU gang waits.
    spec = gang_spec(tmp_path / "tx.yaml", "tx-gang", "tx", 1, 2, tmp_path)
    waiting = ok(synctl("submit", str(spec)), synctl).strip()
    shown = wait_for(
        "tx-gang waiting for quota",
        lambda: (d := job(synctl, waiting))["reason_code"] == "waiting_quota" and d,
        timeout_s=30,
    )
    assert shown["state"] == "PENDING" and "queue tx uses 0/1 GPUs" in shown["reason"], shown
    ok(synctl("cancel", waiting), synctl)

    busy = synctl("cohort", "delete", "org")
    assert busy.exit_code != 0 and "parent of team-x, team-y" in busy.stderr, busy.output
    for name in ("team-x", "team-y", "org"):
        ok(synctl("cohort", "delete", name), synctl)
    missing = synctl("cohort", "delete", "org")
    assert missing.exit_code == 4 and "COHORT_NOT_FOUND" in missing.stderr, missing.output
