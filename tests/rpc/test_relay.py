"""Relayed heartbeats (rpc/relay.py) in process: a leader (the real servicers of
:mod:`tests.rpc.authed`) and a follower's real StreamServer that relays to it over
127.0.0.1, with workers' streams opened on the follower."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any

import grpc
import pytest

from synapse_ha.core.cluster_config import ClusterConfig
from synapse_ha.core.identity import access
from synapse_ha.core.machine import apply
from synapse_ha.core.model import ClusterState
from synapse_ha.core.scheduler import schedule
from synapse_ha.core.snapshot import full_copy
from synapse_ha.core.views import desired_by_node
from synapse_ha.leader.liveness import Liveness
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb
from synapse_ha.rpc.relay_table import RELAY_FRESH_S, RelayTable
from synapse_ha.rpc.server import ReplicaAddress, ReplicaContext
from synapse_ha.rpc.stream import StreamServer
from tests.rpc.authed import NOW, PEER_KEY, FakeBackend, Replica, serving_replica
from tests.rpc.stream_client import Client, connect

LEADER_RAFT = "127.0.0.1:1"
FOLLOWER_STREAMS_WAIT_S = 10.0


@dataclass
class FollowerRaft:
    term: int = 1
    role: str = "follower"
    commit_index: int = 0
    last_applied: int = 0
    leader: str = LEADER_RAFT
    has_quorum: bool = True
    tick_stalls: int = 0
    longest_tick_interval_s: float = 0.0


class FollowerBackend:
    """The follower's view of the leader's state: the same state, or (``frozen``) a copy
    taken earlier, standing for a follower that has not applied the newest entries."""

    def __init__(self, leader: FakeBackend) -> None:
        self.leader = leader
        self.frozen: ClusterState | None = None
        self.lock = threading.Lock()

    def snapshot(self) -> ClusterState:
        with self.lock:
            return self.frozen if self.frozen is not None else self.leader.snapshot()

    def freeze(self) -> None:
        with self.lock:
            self.frozen = full_copy(self.leader.state)

    def thaw(self) -> None:
        with self.lock:
            self.frozen = None

    def reading(self) -> AbstractContextManager[ClusterState]:
        return nullcontext(self.snapshot())

    def cluster_config(self) -> ClusterConfig:
        return self.snapshot().config

    def status(self) -> FollowerRaft:
        return FollowerRaft()

    def is_leader(self) -> bool:
        return False

    def leader_address(self) -> str:
        return LEADER_RAFT

    def term(self) -> int:
        return self.status().term

    def propose(self, command: Any) -> Any:
        raise AssertionError("a follower proposes nothing")


class AsReplica(grpc.UnaryUnaryClientInterceptor):  # type: ignore[misc]
    """Stands in for the follower's replica certificate."""

    def __init__(self, replica_id: str) -> None:
        self.peer = access.replica(replica_id).spiffe_id

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        metadata = [*(details.metadata or ()), (PEER_KEY, self.peer)]
        return continuation(details._replace(metadata=metadata), request)


@dataclass
class Pair:
    leader: Replica
    follower: FollowerBackend
    streams: StreamServer

    @property
    def follower_address(self) -> str:
        return f"127.0.0.1:{self.streams.port}"


def _relay_on(leader: Replica) -> None:
    state = leader.backend.state
    state.config = dataclasses.replace(state.config, relay_heartbeats=True)


@contextmanager
def relaying(leader_grpc: str | None = None, as_replica: str = "r2") -> Iterator[Pair]:
    """A leader with relayed heartbeats on and a follower (r2) that relays to it (or to
    ``leader_grpc`` instead)."""
    with serving_replica() as leader:
        _relay_on(leader)
        leader.ctx.stream_address = "127.0.0.1:7"  # the leader's own streams (not served)
        follower = FollowerBackend(leader.backend)
        members = [
            ReplicaAddress("r1", LEADER_RAFT, leader_grpc or leader.address),
            ReplicaAddress("r2", "127.0.0.1:2", "127.0.0.1:0"),
        ]
        leader.ctx.replicas = members
        ctx = ReplicaContext(
            self_id="r2",
            replicas=members,
            backend=follower,  # type: ignore[arg-type]
            liveness=Liveness(),
            serving=lambda: False,
            clock_ms=lambda: leader.clock[0],
            peer_channel=lambda address: grpc.intercept_channel(
                grpc.insecure_channel(address), AsReplica(as_replica)
            ),
        )
        streams = StreamServer(
            ctx,
            "127.0.0.1:0",
            leader.auth,
            lambda s, a: s.add_insecure_port(a),  # type: ignore[no-any-return]
            watch_period_s=0.02,
        )
        streams.relay.period_s = 0.02
        streams.start()
        ctx.stream_address = f"127.0.0.1:{streams.port}"
        try:
            yield Pair(leader, follower, streams)
        finally:
            streams.stop()


def _wait(what: str, probe: Any) -> None:
    deadline = time.monotonic() + FOLLOWER_STREAMS_WAIT_S
    while not probe():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def test_a_follower_acknowledges_a_heartbeat_the_leader_heard(clients: list[Client]) -> None:
    with relaying() as pair:
        c = connect(pair.streams, "n1", clients)
        c.send(1, "n1")
        ack = c.receive()
        assert (ack.ack_seq, ack.has_desired, ack.leader_term) == (1, True, 1)
        # The leader heard n1 (at its own clock, less the moments the heartbeat waited in
        # the follower's batch); the follower itself records nothing.
        heard = pair.leader.ctx.liveness.heard_since_election("n1")
        assert heard is not None and pair.leader.clock[0] - 1_000 <= heard <= pair.leader.clock[0]
        assert pair.streams.relay.ctx.liveness.heard_since_election("n1") is None
        assert pair.streams.relay.relayed == 1
        c.send(2, "n1")
        assert c.receive().ack_seq == 2


def test_the_leader_stamps_a_relayed_node_as_heard_when_the_follower_received_it(
    clients: list[Client],
) -> None:
    with relaying() as pair:
        relay = pair.streams.relay
        # The batch goes when the test wakes the relay (the period is also bounded by a
        # quarter of the heartbeat interval).
        relay.period_s = 30.0
        state = pair.leader.backend.state
        slow = dataclasses.replace(state.config.timeouts, heartbeat_interval_ms=120_000)
        state.config = dataclasses.replace(state.config, timeouts=slow)
        _wait("the relay to run", lambda: relay._wake is not None)
        loop = pair.streams._loop
        assert loop is not None and relay._wake is not None
        # Woken, the relay sends one (empty) batch and then waits on the new period.
        sent = relay.batches
        loop.call_soon_threadsafe(relay._wake.set)
        _wait("a batch after the wake", lambda: relay.batches > sent)
        c = connect(pair.streams, "n1", clients)
        c.send(1, "n1")
        time.sleep(0.4)  # the time the heartbeat waits on the follower, which is measured
        assert c.inbox.empty()
        loop.call_soon_threadsafe(relay._wake.set)
        assert c.receive().ack_seq == 1
        heard = pair.leader.ctx.liveness.heard_since_election("n1")
        # The leader's clock stands still here: the stamp is earlier by about the 0.4 s
        # the heartbeat waited on the follower.
        assert heard is not None
        assert pair.leader.clock[0] - 30_000 <= heard <= pair.leader.clock[0] - 300


def test_the_leader_sends_registering_workers_to_a_relaying_follower() -> None:
    with relaying() as pair:
        _wait("the follower to announce itself", lambda: pair.leader.ctx.relays.fresh())
        assert pair.leader.ctx.relays.fresh() == {"r2": pair.follower_address}
        peer = [(PEER_KEY, access.worker("n2").spiffe_id)]
        request = pb.RegisterNodeRequest(
            node_id="n2", address="127.0.0.1:9", capacity=pb.Resources(cpu_milli=1000, gpu=2)
        )
        answer = pair.leader.agent.RegisterNode(request, metadata=peer)
        assert (answer.stream_address, answer.relayed) == (pair.follower_address, True)
        # A worker that could not reach that stream is sent to the leader's own.
        request.unreachable_streams.append(pair.follower_address)
        answer = pair.leader.agent.RegisterNode(request, metadata=peer)
        assert (answer.stream_address, answer.relayed) == ("127.0.0.1:7", False)
        # A worker cannot make the leader hold an unbounded list.
        request.unreachable_streams.extend(f"10.0.0.{i}:1" for i in range(200))
        with pytest.raises(grpc.RpcError) as refused:
            pair.leader.agent.RegisterNode(request, metadata=peer)
        assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert "unreachable_streams" in (refused.value.details() or "")


def test_an_acknowledgement_waits_for_the_follower_to_catch_up(clients: list[Client]) -> None:
    with relaying() as pair:
        c = connect(pair.streams, "n1", clients)
        c.send(1, "n1")
        assert c.receive().ack_seq == 1
        applied = pair.leader.backend.state.applied_commands
        pair.follower.freeze()  # the follower applies nothing new from here
        c.outbox.put(
            pb.WorkerMessage(seq=2, node_id="n1", gpu_faults=[pb.GpuFault(gpu=0, code="xid-79")])
        )
        _wait(
            "the leader to commit the fault",
            lambda: pair.leader.backend.state.applied_commands > applied,
        )
        time.sleep(0.2)
        assert c.inbox.empty()  # the follower's state lacks the fault: no acknowledgement yet
        pair.follower.thaw()
        ack = c.receive()
        assert ack.ack_seq == 2
        assert pair.leader.backend.state.nodes["n1"].gpu_faults


def test_the_leaders_refusal_ends_the_relayed_stream(clients: list[Client]) -> None:
    with relaying() as pair:
        c = connect(pair.streams, "n9", clients)  # never registered
        c.send(1, "n9")
        ended = c.ended()
        assert ended.code() is grpc.StatusCode.NOT_FOUND
        assert "not registered" in (ended.details() or "")
        bad = connect(pair.streams, "n1", clients)
        bad.outbox.put(
            pb.WorkerMessage(seq=1, node_id="n1", gpu_faults=[pb.GpuFault(gpu=7, code="x")])
        )
        ended = bad.ended()
        assert ended.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert "gpu" in (ended.details() or "")
        assert pair.leader.backend.state.nodes["n1"].gpu_faults == ()


def test_a_committed_bind_is_pushed_on_the_relayed_stream(clients: list[Client]) -> None:
    with relaying() as pair:
        state = pair.leader.backend.state
        streams = {n: connect(pair.streams, n, clients) for n in ("n1", "n2")}
        for node_id, c in streams.items():
            c.send(1, node_id)
            assert c.receive().ack_seq == 1
        command = schedule(pair.leader.backend.snapshot(), NOW).command(NOW)
        assert command is not None
        with pair.leader.backend.lock:
            assert apply(state, command).ok
        bound = {n: m for n, m in desired_by_node(state).items() if m}
        assert bound  # the harness's two jobs fit
        for node_id, members in bound.items():
            pushed = streams[node_id].receive()
            assert (pushed.ack_seq, pushed.has_desired) == (0, True)
            assert {d.job_id for d in pushed.desired} == {d.job_id for d in members}
        assert pair.streams.pushes == len(bound)


def test_a_relayed_report_is_committed_before_it_is_acknowledged(clients: list[Client]) -> None:
    with relaying() as pair:
        state = pair.leader.backend.state
        command = schedule(pair.leader.backend.snapshot(), NOW).command(NOW)
        assert command is not None
        with pair.leader.backend.lock:
            assert apply(state, command).ok
        node_id, members = min((n, m) for n, m in desired_by_node(state).items() if m)
        member = members[0]
        c = connect(pair.streams, node_id, clients)
        started = pb.MemberReport(
            job_id=member.job_id,
            fencing_token=member.fencing_token,
            rank=member.rank,
            kind=pb.MemberReport.STARTED,
        )
        c.outbox.put(pb.WorkerMessage(seq=1, node_id=node_id, reports=[started]))
        ack = next(m for m in iter(c.receive, None) if m.ack_seq == 1)
        assert ack.acked_reports == 1
        attempt = state.jobs[member.job_id].attempt
        assert attempt is not None and attempt.started_at_ms > 0


def test_without_a_reachable_leader_nothing_is_acknowledged(clients: list[Client]) -> None:
    with relaying(leader_grpc="127.0.0.1:1") as pair:  # nothing listens there
        c = connect(pair.streams, "n1", clients)
        c.send(1, "n1")
        ended = c.ended()
        assert ended.code() is grpc.StatusCode.FAILED_PRECONDITION
        assert "could not relay" in (ended.details() or "")
        assert pair.leader.ctx.liveness.heard_since_election("n1") is None


def test_a_replica_relays_only_as_itself(clients: list[Client]) -> None:
    with relaying(as_replica="r3") as pair:
        c = connect(pair.streams, "n1", clients)
        c.send(1, "n1")
        assert c.ended().code() is grpc.StatusCode.FAILED_PRECONDITION
        assert pair.leader.ctx.relays.fresh() == {}
    with serving_replica() as leader:
        _relay_on(leader)
        removed = [(PEER_KEY, access.replica("r9").spiffe_id)]  # a valid cert, no member
        with pytest.raises(grpc.RpcError) as refused:
            leader.agent.RelayHeartbeats(
                pb.RelayHeartbeatsRequest(replica_id="r9"), metadata=removed
            )
        assert refused.value.code() is grpc.StatusCode.PERMISSION_DENIED
        assert "not a member" in (refused.value.details() or "")
        worker = [(PEER_KEY, access.worker("n1").spiffe_id)]
        with pytest.raises(grpc.RpcError) as refused:
            leader.agent.RelayHeartbeats(
                pb.RelayHeartbeatsRequest(replica_id="r2"), metadata=worker
            )
        assert refused.value.code() is grpc.StatusCode.PERMISSION_DENIED


def test_with_relaying_off_a_follower_takes_no_stream(clients: list[Client]) -> None:
    with relaying() as pair:
        state = pair.leader.backend.state
        state.config = dataclasses.replace(state.config, relay_heartbeats=False)
        c = connect(pair.streams, "n1", clients)
        c.send(1, "n1")
        assert c.ended().code() is grpc.StatusCode.FAILED_PRECONDITION


def test_the_relay_table_spreads_nodes_and_forgets_silent_followers() -> None:
    now = [100.0]
    table = RelayTable(clock=lambda: now[0])
    table.heard("r2", "h2:1")
    table.heard("r3", "h3:1")
    picks = [table.pick(f"node-{i}") for i in range(300)]
    assert set(picks) == {"h2:1", "h3:1"}
    assert 100 <= picks.count("h2:1") <= 200  # an even spread, by node id
    assert [table.pick(f"node-{i}") for i in range(300)] == picks  # stable
    assert table.pick("node-1", avoid={"h2:1", "h3:1"}) == ""
    now[0] += RELAY_FRESH_S + 0.1
    table.heard("r3", "h3:1")
    assert table.fresh() == {"r3": "h3:1"}
    assert table.pick("node-1") == "h3:1"
