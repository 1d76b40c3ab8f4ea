"""The use cases without a transport (synapse_ha.service), on a stand-in replica: the
heartbeat's one check sequence and its refusals, the one mapping of a proposal's outcome
to a refusal, and the one mapping of a refusal to its gRPC status; the three heartbeat
shapes read alike, embedded or in an earlier release's flat fields."""

from __future__ import annotations

import asyncio
import gc
import time
from concurrent import futures
from contextlib import AbstractContextManager, nullcontext

import grpc
import pytest
from google.rpc import error_details_pb2, status_pb2

from synapse_ha.core import commands as cmd
from synapse_ha.core.cluster_config import ClusterConfig
from synapse_ha.core.codec.formats import FORMAT
from synapse_ha.core.health.fitness import GpuFault
from synapse_ha.core.identity.access import Identity, Kind, Role
from synapse_ha.core.machine import apply
from synapse_ha.core.model import ClusterState, JobState, NodeStatus
from synapse_ha.leader.ports import ProposalError
from synapse_ha.rpc.errors import LEADER_METADATA_KEY, failure_of, refusal_status
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb
from synapse_ha.rpc.heartbeat import heartbeat_in, heartbeat_message
from synapse_ha.service import commit, submit
from synapse_ha.service.heartbeat import HeartbeatIn, HeartbeatOut, heartbeat
from synapse_ha.service.jobs import cancel
from synapse_ha.service.limits import PendingInFlight
from synapse_ha.service.nodes import Registered, register_node
from synapse_ha.service.refusal import ErrorReason, Refusal, node_not_found
from tests.core.harness import job, node
from tests.core.test_late_success import exit_event, gang_on_two_nodes, rank0_done_then_n2_dies
from tests.rpc.authed import PEER_KEY, serving_replica

STARTED = cmd.MemberEvent("job-000001", 1, 0, cmd.MemberEventKind.STARTED)


class StandIn:
    """A serving leader whose proposals apply at once to its own state."""

    def __init__(self, state: ClusterState, leader: Refusal | None = None) -> None:
        self.state = state
        self.leader = leader
        self.heard_at: dict[str, int] = {}
        self.proposed: list[cmd.Command] = []

    def snapshot(self) -> ClusterState:
        return self.state

    def reading(self) -> AbstractContextManager[ClusterState]:
        return nullcontext(self.state)

    def cluster_config(self) -> ClusterConfig:
        return self.state.config

    def propose(self, command: cmd.Command) -> futures.Future[cmd.Result]:
        self.proposed.append(command)
        done: futures.Future[cmd.Result] = futures.Future()
        done.set_result(apply(self.state, command))
        return done

    def leader_refusal(self) -> Refusal | None:
        return self.leader

    def heard(self, node_id: str, now_ms: int) -> None:
        self.heard_at[node_id] = now_ms

    def clock_ms(self) -> int:
        return 50


def registered(gpus: int = 2) -> StandIn:
    state = ClusterState()
    assert apply(state, cmd.RegisterNode(node("n1", gpus=gpus), 1)).ok
    return StandIn(state)


def test_an_idle_heartbeat_is_heard_and_proposes_nothing() -> None:
    replica = registered()
    taken = heartbeat(replica, HeartbeatIn("n1"), 10, heard_ms=7)
    assert isinstance(taken, HeartbeatOut)
    assert (taken.acked_reports, taken.proposed, replica.proposed) == (0, (), [])
    assert replica.heard_at == {"n1": 7}


def test_reports_are_proposed_and_acknowledged_once_committed() -> None:
    replica = registered()
    taken = heartbeat(replica, HeartbeatIn("n1", events=(STARTED,)), 10)
    assert isinstance(taken, HeartbeatOut)
    assert taken.acked_reports == 1
    assert [type(c) for c in replica.proposed] == [cmd.ReportMembers]
    assert commit.settle(taken.proposed, 1e18, node_not_found("n1")) is None
    assert replica.heard_at == {"n1": 10}


def test_an_unregistered_node_is_refused_and_not_heard() -> None:
    replica = registered()
    refused = heartbeat(replica, HeartbeatIn("n9", events=(STARTED,)), 10)
    assert isinstance(refused, Refusal)
    assert (refused.code, refused.metadata) == (ErrorReason.NODE_NOT_FOUND, {"node_id": "n9"})
    assert replica.heard_at == {} and replica.proposed == []


def test_a_gpu_the_node_lacks_is_refused_naming_the_field() -> None:
    replica = registered(gpus=2)
    refused = heartbeat(replica, HeartbeatIn("n1", faults=(GpuFault(5, "xid-79"),)), 10)
    assert isinstance(refused, Refusal)
    assert (refused.code, refused.field) == (ErrorReason.INVALID_FIELD, "gpu_faults[0].gpu")
    assert replica.heard_at == {} and replica.proposed == []


@pytest.mark.parametrize("awaited", [False, True], ids=["waited", "awaited"])
def test_a_proposal_outcome_maps_to_one_refusal(awaited: bool) -> None:
    def failing(exc: BaseException) -> futures.Future[cmd.Result]:
        future: futures.Future[cmd.Result] = futures.Future()
        future.set_exception(exc)
        return future

    def done(code: cmd.ResultCode) -> futures.Future[cmd.Result]:
        future: futures.Future[cmd.Result] = futures.Future()
        future.set_result(cmd.Result(code, str(code)))
        return future

    not_found = node_not_found("n1")

    def settle(proposed: list[futures.Future[cmd.Result]], timeout_s: float) -> Refusal | None:
        if awaited:
            return asyncio.run(commit.settled(proposed, timeout_s, not_found))
        return commit.settle(proposed, time.monotonic() + timeout_s, not_found)

    unknown = settle([failing(ProposalError("x", committed_unknown=True))], 30.0)
    refused = settle([failing(ProposalError("x", committed_unknown=False))], 30.0)
    late = settle([done(cmd.ResultCode.OK), futures.Future()], 0.01)
    first = settle([done(cmd.ResultCode.OK), done(cmd.ResultCode.CONFLICT), futures.Future()], 30)
    assert [r.code if r else None for r in (unknown, refused, late, first)] == [
        ErrorReason.OUTCOME_UNKNOWN,
        ErrorReason.NOT_COMMITTED,
        ErrorReason.OUTCOME_UNKNOWN,
        ErrorReason.CONFLICT,
    ]
    assert settle([done(cmd.ResultCode.OK), done(cmd.ResultCode.OK)], 30.0) is None
    gone = commit.refused(cmd.Result(cmd.ResultCode.NOT_FOUND, "no node"), not_found)
    assert gone is not None and (gone.code, gone.words) == (ErrorReason.NODE_NOT_FOUND, "no node")
    conflict = commit.refused(cmd.Result(cmd.ResultCode.CONFLICT, "dead"), not_found)
    assert conflict is not None and conflict.code is ErrorReason.CONFLICT


def _details(status: grpc.Status) -> tuple[dict[str, str], list[str]]:
    raw = dict(status.trailing_metadata)["grpc-status-details-bin"]
    assert isinstance(raw, bytes)
    full = status_pb2.Status.FromString(raw)
    metadata: dict[str, str] = {}
    fields: list[str] = []
    for detail in full.details:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            metadata = dict(info.metadata)
        else:
            bad = error_details_pb2.BadRequest()
            detail.Unpack(bad)
            fields = [v.field for v in bad.field_violations]
    return metadata, fields


def test_a_refusal_becomes_its_status_in_one_place() -> None:
    replica = registered(gpus=2)
    invalid = heartbeat(replica, HeartbeatIn("n1", faults=(GpuFault(5, "xid-79"),)), 10)
    assert isinstance(invalid, Refusal)
    status = refusal_status(invalid)
    assert status.code is grpc.StatusCode.INVALID_ARGUMENT
    metadata, fields = _details(status)
    assert metadata["field"] == "gpu_faults[0].gpu" and fields == ["gpu_faults[0].gpu"]
    elsewhere = Refusal(
        ErrorReason.NOT_LEADER, "not me", metadata={"leader_id": "r2", "leader_address": "h:1"}
    )
    status = refusal_status(elsewhere, {"method": "Heartbeat"})
    assert status.code is grpc.StatusCode.FAILED_PRECONDITION
    assert (LEADER_METADATA_KEY, "h:1") in status.trailing_metadata
    assert _details(status)[0] == {
        "leader_id": "r2",
        "leader_address": "h:1",
        "method": "Heartbeat",
    }


@pytest.mark.parametrize(
    "shape",
    [
        pb.HeartbeatRequest(heartbeat=pb.Heartbeat(node_id="n1", gpu_faults=[pb.GpuFault(gpu=1)])),
        pb.HeartbeatRequest(node_id="n1", gpu_faults=[pb.GpuFault(gpu=1)]),  # earlier release
        pb.WorkerMessage(
            seq=3, heartbeat=pb.Heartbeat(node_id="n1", gpu_faults=[pb.GpuFault(gpu=1)])
        ),
        pb.WorkerMessage(seq=3, node_id="n1", gpu_faults=[pb.GpuFault(gpu=1)]),
        pb.RelayedHeartbeat(heartbeat=pb.Heartbeat(node_id="n1", gpu_faults=[pb.GpuFault(gpu=1)])),
        pb.RelayedHeartbeat(node_id="n1", gpu_faults=[pb.GpuFault(gpu=1)]),
    ],
)
def test_every_shape_embedded_or_flat_reads_as_the_same_heartbeat(
    shape: pb.HeartbeatRequest | pb.WorkerMessage | pb.RelayedHeartbeat,
) -> None:
    assert heartbeat_in(heartbeat_message(shape)) == HeartbeatIn("n1", faults=(GpuFault(1, ""),))


def test_a_stream_message_need_not_name_its_node_but_a_heartbeat_must() -> None:
    later = pb.WorkerMessage(seq=4, heartbeat=pb.Heartbeat())
    assert heartbeat_in(heartbeat_message(later), "n1") == HeartbeatIn("n1")
    refused = heartbeat_in(heartbeat_message(pb.HeartbeatRequest()))
    assert isinstance(refused, Refusal) and refused.field == "node_id"


def test_cancel_refuses_another_users_job_and_cancels_ones_own() -> None:
    replica = registered()
    assert apply(replica.state, cmd.SubmitJob(job("j", replicas=1), "r1", 2, owner="ann")).ok
    bob = Identity(Kind.USER, "bob", Role.USER)
    refused = cancel(replica, bob, "job-000001", "", 1.0)
    assert isinstance(refused, Refusal) and refused.code is ErrorReason.PERMISSION_DENIED
    assert refused.denied is not None and replica.proposed == []
    missing = cancel(replica, bob, "job-000009", "", 1.0)
    assert isinstance(missing, Refusal) and missing.code is ErrorReason.JOB_NOT_FOUND
    ann = Identity(Kind.USER, "ann", Role.USER)
    done = cancel(replica, ann, "job-000001", "", 1.0)
    assert not isinstance(done, Refusal) and done.state is JobState.CANCELLED
    elsewhere = StandIn(replica.state, Refusal(ErrorReason.NO_LEADER, "no leader"))
    refused = cancel(elsewhere, ann, "job-000001", "", 1.0)
    assert isinstance(refused, Refusal) and refused.code is ErrorReason.NO_LEADER


def test_requeue_refuses_another_users_job_and_what_holds_no_nodes() -> None:
    replica = registered()
    assert apply(replica.state, cmd.SubmitJob(job("j", replicas=1), "r1", 2, owner="ann")).ok
    bob = Identity(Kind.USER, "bob", Role.USER)
    refused = cancel(replica, bob, "job-000001", "", 1.0, requeue=True)
    assert isinstance(refused, Refusal) and refused.code is ErrorReason.PERMISSION_DENIED
    assert replica.proposed == []
    ann = Identity(Kind.USER, "ann", Role.USER)
    older = cancel(replica, ann, "job-000001", "", 1.0, requeue=True)  # a cluster at format 2
    assert isinstance(older, Refusal) and "this change needs format 13" in older.words
    replica.state.format_floor = FORMAT  # every replica runs this release
    pending = cancel(replica, ann, "job-000001", "", 1.0, requeue=True)
    assert isinstance(pending, Refusal) and pending.code is ErrorReason.CONFLICT
    assert "holds no nodes" in pending.words
    assert [type(c) for c in replica.proposed] == [cmd.RequeueJob, cmd.RequeueJob]
    assert replica.state.jobs["job-000001"].state is JobState.PENDING


def test_a_node_back_from_dead_has_its_late_exit_counted_before_it_is_ready() -> None:
    cl, j, token = gang_on_two_nodes()
    rank0_done_then_n2_dies(cl, j, token)
    replica = StandIn(cl.state)
    worker = Identity(Kind.WORKER, "n2", Role.USER)
    late = exit_event(j, token, 1)
    back = register_node(replica, worker, node("n2", gpus=8), 1.0, (late,))
    assert isinstance(back, Registered) and back.acked_reports == 1
    # The exit is committed first: the job ended while n2 was still dead.
    assert [type(c) for c in replica.proposed] == [cmd.ReportMembers, cmd.RegisterNode]
    assert back.state.jobs[j].state is JobState.SUCCEEDED
    assert back.state.nodes["n2"].status is NodeStatus.READY
    # A node the state does not know registers; its reports are not acknowledged.
    fresh = StandIn(ClusterState())
    first = register_node(fresh, Identity(Kind.WORKER, "n9", Role.USER), node("n9"), 1.0, (late,))
    assert isinstance(first, Registered) and first.acked_reports == 0
    assert [type(c) for c in fresh.proposed] == [cmd.RegisterNode]


def test_the_unary_heartbeat_reads_the_embedded_message_and_checks_its_node() -> None:
    with serving_replica() as replica:
        worker = [(PEER_KEY, "spiffe://synapse/worker/n1")]
        fault = pb.GpuFault(gpu=1, code="xid-79")
        beat = pb.HeartbeatRequest(heartbeat=pb.Heartbeat(node_id="n1", gpu_faults=[fault]))
        replica.agent.Heartbeat(beat, metadata=worker)
        assert [f.gpu for f in replica.backend.state.nodes["n1"].gpu_faults] == [1]
        for wrong, reason in (
            (pb.Heartbeat(node_id="n2"), ErrorReason.PERMISSION_DENIED),  # another node's
            (
                pb.Heartbeat(node_id="n1", gpu_faults=[pb.GpuFault(gpu=5)]),
                ErrorReason.INVALID_FIELD,
            ),
        ):
            with pytest.raises(grpc.RpcError) as refused:
                replica.agent.Heartbeat(pb.HeartbeatRequest(heartbeat=wrong), metadata=worker)
            assert failure_of(refused.value).reason is reason


def test_an_awaited_proposal_that_fails_after_its_deadline_is_not_logged_as_unretrieved(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def late_failure() -> Refusal | None:
        pending: futures.Future[cmd.Result] = futures.Future()
        pending.set_running_or_notify_cancel()  # as the proposer marks it
        refused = await commit.settled([pending], 0.01, node_not_found("n1"))
        pending.set_exception(ProposalError("leadership lost", committed_unknown=True))
        await asyncio.sleep(0.05)  # the failure reaches the loop's copy of the future
        return refused

    refused = asyncio.run(late_failure())
    gc.collect()  # the loop's copy is gone: unread, it would log here
    assert refused is not None and refused.code is ErrorReason.OUTCOME_UNKNOWN
    assert not [r for r in caplog.records if "never retrieved" in r.getMessage()]


class NoSnapshots(StandIn):
    """A replica whose snapshots fail the test: a snapshot copies the record
    dictionaries (O(jobs), after every commit), too much for a path run per call."""

    def snapshot(self) -> ClusterState:
        raise AssertionError("a snapshot taken on a per-submission path")


def test_a_submissions_admission_reads_the_state_in_place_and_takes_no_snapshot() -> None:
    replica = NoSnapshots(registered().state)
    ann = Identity(Kind.USER, "ann", Role.USER)

    def admit(request_id: str) -> submit.Admitted | Refusal:
        return submit.admit(
            replica,
            ann,
            job("j", replicas=1),
            request_id,
            limits=replica.state.config.limits,
            limited=False,
            presented=lambda state: None,
            pending=PendingInFlight(),
        )

    first = admit("r1")
    assert isinstance(first, submit.Admitted) and first.command is not None
    assert replica.propose(first.command).result().ok
    again = admit("r1")  # the same request id names the job it made
    assert isinstance(again, submit.Admitted) and again.existing == "job-000001"
    assert again.command is None
