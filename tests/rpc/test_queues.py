"""Queues over the API: ListQueues / SetQueue / DeleteQueue, who may call them, the
queue a submission names (it must exist, its class must be allowed, and the caller's
credential must allow the queue), and the preemption a heartbeat tells a worker about.

Against an in-process replica with the real servicers and auth interceptor
(tests/rpc/authed.py)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import grpc
import pytest

from synapse_ha.core import commands as cmd
from synapse_ha.core.cluster_config import PreemptionKind, Queue
from synapse_ha.core.identity.access import Role
from synapse_ha.core.machine import apply
from synapse_ha.rpc.auth import new_token
from synapse_ha.rpc.errors import ErrorReason, failure_of
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb
from tests.rpc.authed import NOW, PEER_KEY, Replica, serving_replica


@pytest.fixture
def replica() -> Iterator[Replica]:
    with serving_replica() as started:
        yield started


def _md(replica: Replica, who: str) -> list[tuple[str, str]]:
    if who.startswith("cert:"):
        return [(PEER_KEY, who[len("cert:") :])]
    return [("authorization", f"Bearer {replica.tokens[who]}")]


def _token(replica: Replica, name: str, user: str, role: Role, queues: tuple[str, ...]) -> None:
    text, command = new_token(user, role, queues, 0, NOW, "user:root")
    assert replica.backend.propose(command).result().ok
    replica.tokens[name] = text


def _set(replica: Replica, queue: pb.Queue, who: str = "admin") -> pb.SetQueueResponse:
    answer: pb.SetQueueResponse = replica.scheduler.SetQueue(
        pb.SetQueueRequest(queue=queue), metadata=_md(replica, who)
    )
    return answer


def _spec(queue: str = "", priority_class: str = "", gpu: int = 0) -> pb.JobSpec:
    return pb.JobSpec(
        name="q",
        replicas=1,
        resources=pb.Resources(cpu_milli=100, gpu=gpu),
        shell_command="true",
        queue=queue,
        priority_class=priority_class,
    )


def _submit(replica: Replica, who: str, spec: pb.JobSpec) -> str:
    answer = replica.scheduler.SubmitJob(pb.SubmitJobRequest(spec=spec), metadata=_md(replica, who))
    job_id: str = answer.job_id
    return job_id


def _refused(call: object) -> grpc.RpcError:
    assert callable(call)
    with pytest.raises(grpc.RpcError) as refused:
        call()
    return refused.value


# ------------------------------------------------------------------- queue commands


def test_an_admin_sets_lists_and_deletes_queues(replica: Replica) -> None:
    made = _set(replica, pb.Queue(name="team-a", gpu=4, cohort="lab", borrowing_limit_gpu=2))
    assert made.created
    again = _set(replica, pb.Queue(name="team-a", gpu=6, cohort="lab"))
    assert not again.created
    stored = replica.backend.state.queues["team-a"]
    assert stored == Queue("team-a", gpu=6, cohort="lab")  # every setting replaced

    listed = replica.scheduler.ListQueues(pb.ListQueuesRequest(), metadata=_md(replica, "alice"))
    by_name = {q.queue.name: q for q in listed.queues}
    assert sorted(by_name) == ["default", "team-a"]
    assert not by_name["default"].queue.HasField("gpu")  # no quota
    assert by_name["team-a"].queue.gpu == 6
    assert not by_name["team-a"].queue.HasField("borrowing_limit_gpu")
    assert [c.name for c in listed.priority_classes] == ["low", "normal", "high"]
    assert listed.preemption == "topology"

    replica.scheduler.DeleteQueue(
        pb.DeleteQueueRequest(name="team-a"), metadata=_md(replica, "admin")
    )
    assert "team-a" not in replica.backend.state.queues


@pytest.mark.parametrize("who", ["alice", "operator", "cert:spiffe://synapse/user/user/bob"])
def test_only_admins_change_queues(replica: Replica, who: str) -> None:
    for call in (
        lambda: _set(replica, pb.Queue(name="team-a", gpu=4), who),
        lambda: replica.scheduler.DeleteQueue(
            pb.DeleteQueueRequest(name="default"), metadata=_md(replica, who)
        ),
    ):
        failure = failure_of(_refused(call))
        assert failure.code is grpc.StatusCode.PERMISSION_DENIED, failure
        assert "it needs role admin" in failure.message
    assert "team-a" not in replica.backend.state.queues


def test_queue_settings_are_checked_before_proposing(replica: Replica) -> None:
    bad = pb.Queue(name="Team_A", gpu=4, lending_limit_gpu=8, priority_classes=["urgent"])
    failure = failure_of(_refused(lambda: _set(replica, bad)))
    assert failure.reason is ErrorReason.INVALID_FIELD
    fields = [v.field for v in failure.violations]
    assert fields == ["name", "lending_limit_gpu", "priority_classes[0]"]
    assert set(replica.backend.state.queues) == {"default"}


def test_deleting_an_unknown_or_the_default_queue_is_refused(replica: Replica) -> None:
    admin = _md(replica, "admin")
    unknown = failure_of(
        _refused(
            lambda: replica.scheduler.DeleteQueue(
                pb.DeleteQueueRequest(name="nope"), metadata=admin
            )
        )
    )
    assert unknown.reason is ErrorReason.QUEUE_NOT_FOUND and unknown.metadata["queue"] == "nope"
    default = failure_of(
        _refused(
            lambda: replica.scheduler.DeleteQueue(
                pb.DeleteQueueRequest(name="default"), metadata=admin
            )
        )
    )
    assert default.reason is ErrorReason.CONFLICT


# ------------------------------------------------------------- submitting to a queue


def test_a_submission_names_an_existing_queue_and_an_allowed_class(replica: Replica) -> None:
    _set(replica, pb.Queue(name="team-a", gpu=4, priority_classes=["normal"]))
    job_id = _submit(replica, "admin", _spec("team-a", "normal"))
    stored = replica.backend.state.jobs[job_id].spec
    assert (stored.queue, stored.priority_class) == ("team-a", "normal")
    shown = replica.scheduler.GetJob(
        pb.GetJobRequest(job_id=job_id), metadata=_md(replica, "admin")
    )
    assert (shown.job.spec.queue, shown.job.spec.priority_class) == ("team-a", "normal")

    for spec, field, words in (
        (_spec("team-z"), "queue", "no queue 'team-z' (queues: default, team-a)"),
        (_spec("team-a", "high"), "priority", "queue team-a allows the classes normal"),
        (_spec("", "urgent"), "priority", "no priority class 'urgent'"),
        (_spec("Team A"), "queue", "a queue name is"),
    ):
        failure = failure_of(_refused(lambda s=spec: _submit(replica, "admin", s)))
        assert failure.reason is ErrorReason.INVALID_FIELD, failure
        assert failure.field == field and words in failure.rule, failure


def test_an_empty_queue_field_means_the_default_queue(replica: Replica) -> None:
    job_id = _submit(replica, "alice", _spec())
    assert replica.backend.state.jobs[job_id].spec.queue == "default"


# caller, queue, allowed?
TOKEN_RULES = [
    ("team-a-user", "team-a", True),
    ("team-a-user", "default", False),  # a token naming queues allows those only
    ("team-a-user", "team-b", False),
    ("alice", "default", True),  # a token naming none allows the default queue
    ("alice", "team-a", False),
    ("cert:spiffe://synapse/user/user/bob", "default", True),  # so does a user certificate
    ("cert:spiffe://synapse/user/user/bob", "team-a", False),
    ("operator", "team-b", True),  # operators and admins use any queue
    ("admin", "team-b", True),
    ("cert:spiffe://synapse/user/admin/root", "team-a", True),
]


@pytest.mark.parametrize(("who", "queue", "allowed"), TOKEN_RULES)
def test_the_credential_names_the_queues_a_user_may_submit_to(
    replica: Replica, who: str, queue: str, allowed: bool
) -> None:
    for name in ("team-a", "team-b"):
        _set(replica, pb.Queue(name=name, gpu=4))
    _token(replica, "team-a-user", "carol", Role.USER, ("team-a",))
    before = len(replica.backend.state.jobs)
    if allowed:
        job_id = _submit(replica, who, _spec(queue))
        assert replica.backend.state.jobs[job_id].spec.queue == queue
        return
    failure = failure_of(_refused(lambda: _submit(replica, who, _spec(queue))))
    assert failure.reason is ErrorReason.PERMISSION_DENIED, failure
    assert f"may not submit to queue {queue}" in failure.message
    rule = {
        "team-a-user": "its token allows the queues team-a",
        "alice": "its token names no queues, so it allows the default queue only",
    }.get(who, "a user certificate names no queues, so it allows the default queue only")
    assert rule in failure.message
    assert len(replica.backend.state.jobs) == before  # nothing proposed


# -------------------------------------------------------------------- usage numbers


def _bind(replica: Replica, job_id: str, node: str, gpus: tuple[int, ...]) -> None:
    placement = cmd.GangPlacement(job_id, 0, (cmd.MemberPlacement(0, node, gpus),))
    result = apply(replica.backend.state, cmd.BindPlan((placement,), now_ms=NOW))
    assert result.ok and result.bound == (job_id,), result


def test_list_queues_counts_used_borrowed_lent_and_pending(replica: Replica) -> None:
    _set(replica, pb.Queue(name="team-a", gpu=2, cohort="lab"))
    _set(replica, pb.Queue(name="team-b", gpu=1, cohort="lab"))
    # The fixture's jobs (alice's, bob's: 1 GPU each, default queue) are pending.
    running_b = _submit(replica, "admin", _spec("team-b", gpu=2))
    _bind(replica, running_b, "n1", (0, 1))
    _submit(replica, "admin", _spec("team-a", gpu=1))
    listed = replica.scheduler.ListQueues(pb.ListQueuesRequest(), metadata=_md(replica, "bob"))
    usage = {q.queue.name: q.usage for q in listed.queues}
    assert (usage["team-b"].used_gpu, usage["team-b"].borrowed_gpu) == (2, 1)
    assert (usage["team-a"].used_gpu, usage["team-a"].lent_gpu) == (0, 1)
    assert (usage["team-a"].pending_jobs, usage["team-a"].pending_gpu) == (1, 1)
    assert usage["team-b"].running_jobs == 1 and usage["team-b"].pending_jobs == 0
    assert (usage["default"].pending_jobs, usage["default"].borrowed_gpu) == (2, 0)


# -------------------------------------------------------------- preemption, heartbeat


def test_a_heartbeat_tells_the_worker_the_grace_left_of_a_preempted_member(
    replica: Replica,
) -> None:
    job_id = replica.jobs["alice"]
    _bind(replica, job_id, "n1", (0,))
    worker = [(PEER_KEY, "spiffe://synapse/worker/n1")]
    beat = replica.agent.Heartbeat(pb.HeartbeatRequest(node_id="n1"), metadata=worker)
    (member,) = beat.desired
    assert (member.preemption, member.preempted_by, member.preempt_grace_ms) == ("", "", 0)

    job = replica.backend.state.jobs[job_id]
    assert job.attempt is not None
    job.attempt = dataclasses.replace(
        job.attempt,
        preempted_by="j-9",
        preemption=PreemptionKind.RECLAIM,
        preempt_deadline_ms=replica.clock[0] + 7_000,
    )
    replica.clock[0] += 2_000
    beat = replica.agent.Heartbeat(pb.HeartbeatRequest(node_id="n1"), metadata=worker)
    (member,) = beat.desired
    assert (member.preemption, member.preempted_by) == ("reclaim", "j-9")
    assert member.preempt_grace_ms == 5_000
    replica.clock[0] += 60_000
    beat = replica.agent.Heartbeat(pb.HeartbeatRequest(node_id="n1"), metadata=worker)
    assert beat.desired[0].preempt_grace_ms == 0  # past the deadline: kill now
    shown = replica.scheduler.GetJob(
        pb.GetJobRequest(job_id=job_id), metadata=_md(replica, "alice")
    )
    assert (shown.job.attempt.preempted_by, shown.job.attempt.preemption) == ("j-9", "reclaim")
