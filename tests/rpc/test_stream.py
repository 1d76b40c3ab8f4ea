"""Heartbeat streams (``NodeStreamService.Connect``) in process: a real StreamServer on
127.0.0.1 in front of the fake backend of :mod:`tests.rpc.authed` (peer identities from
metadata stand in for certificates, as in the access tests)."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from contextlib import contextmanager

import grpc

from synapse_ha.core import commands as cmd
from synapse_ha.core.machine import apply
from synapse_ha.core.model import NodeStatus
from synapse_ha.core.scheduler import schedule
from synapse_ha.core.views import desired_by_node
from synapse_ha.rpc import states
from synapse_ha.rpc.stream import StreamFirstNudger, StreamServer
from tests.rpc.authed import NOW, Replica, serving_replica
from tests.rpc.stream_client import Client, connect


@contextmanager
def stream_server() -> Iterator[tuple[Replica, StreamServer, list[bool]]]:
    serving = [True]
    with serving_replica() as replica:
        replica.ctx.serving = lambda: serving[0]
        server = StreamServer(
            replica.ctx,
            "127.0.0.1:0",
            replica.auth,
            lambda s, a: s.add_insecure_port(a),  # type: ignore[no-any-return]
            watch_period_s=0.02,
        )
        server.start()
        try:
            yield replica, server, serving
        finally:
            server.stop()


def test_each_heartbeat_is_acknowledged_and_the_list_sent_only_when_it_changed(
    clients: list[Client],
) -> None:
    with stream_server() as (replica, server, _):
        c = connect(server, "n1", clients)
        c.send(1, "n1")
        first = c.receive()
        assert (first.ack_seq, first.has_desired) == (1, True)
        assert states.lease_status(first) is NodeStatus.READY
        assert first.lease_ttl_ms > 0 and first.heartbeat_interval_ms > 0
        assert replica.ctx.liveness.heard_since_election("n1") == NOW + 1_000
        c.send(2, "n1")
        second = c.receive()
        assert (second.ack_seq, second.has_desired) == (2, False)
        assert server.heartbeats == 2


def test_a_worker_may_not_stream_for_another_node(clients: list[Client]) -> None:
    with stream_server() as (_, server, _):
        c = connect(server, "n1", clients, as_node="n2")
        c.send(1, "n1")
        assert c.ended().code() is grpc.StatusCode.PERMISSION_DENIED


def test_an_unregistered_node_is_told_to_register(clients: list[Client]) -> None:
    with stream_server() as (_, server, _):
        c = connect(server, "n9", clients)
        c.send(1, "n9")
        assert c.ended().code() is grpc.StatusCode.NOT_FOUND


def test_a_committed_bind_is_pushed_at_once_and_only_when_it_changed_the_list(
    clients: list[Client],
) -> None:
    with stream_server() as (replica, server, _):
        state = replica.backend.state
        command = schedule(replica.backend.snapshot(), NOW).command(NOW)
        assert command is not None
        assert apply(state, command).ok
        node_id = min(n for n, members in desired_by_node(state).items() if members)
        c = connect(server, node_id, clients)
        c.send(1, node_id)
        assert c.receive().ack_seq == 1  # the list, as every first message has
        fallback: list[list[tuple[str, str]]] = []

        class Recorder:
            def nudge(self, targets: list[tuple[str, str]]) -> None:
                fallback.append(list(targets))

        nudger = StreamFirstNudger(server, Recorder())
        nudger.nudge([(node_id, "a"), ("elsewhere", "b")])
        assert fallback == [[("elsewhere", "b")]]  # no stream: nudged the old way
        # Unchanged since the first message: nothing is pushed, the next message is an ack.
        c.send(2, node_id)
        assert c.receive().ack_seq == 2
        # The job is cancelled: its members leave the list, which is pushed.
        job_id = desired_by_node(state)[node_id][0].job_id
        assert apply(state, cmd.CancelJob(job_id, now_ms=NOW + 1, actor="user:root")).ok
        nudger.nudge([(node_id, "a")])
        pushed = c.receive()
        assert (pushed.ack_seq, pushed.has_desired) == (0, True)
        assert job_id not in {d.job_id for d in pushed.desired}
        assert server.pushes == 1


def test_streams_end_when_the_replica_stops_serving(clients: list[Client]) -> None:
    with stream_server() as (replica, server, serving):
        c = connect(server, "n1", clients)
        c.send(1, "n1")
        assert c.receive().ack_seq == 1
        serving[0] = False
        replica.backend.leads = False
        assert c.ended().code() is grpc.StatusCode.FAILED_PRECONDITION
        late = connect(server, "n2", clients)
        late.send(1, "n2")
        assert late.ended().code() is grpc.StatusCode.FAILED_PRECONDITION


def lapse_grace(replica: Replica, interval_ms: int) -> None:
    """Make the heartbeat interval (the grace of a lapse) ``interval_ms``."""
    config = replica.backend.state.config
    timeouts = dataclasses.replace(config.timeouts, heartbeat_interval_ms=interval_ms)
    replica.backend.state.config = dataclasses.replace(config, timeouts=timeouts)


def test_a_short_lapse_in_the_same_term_keeps_the_stream_and_answers_after_it(
    clients: list[Client],
) -> None:
    with stream_server() as (replica, server, serving):
        lapse_grace(replica, 3_000)
        c = connect(server, "n1", clients)
        c.send(1, "n1")
        assert c.receive().ack_seq == 1
        serving[0] = False  # still the leader of term 1, its quorum contact stale
        time.sleep(0.2)  # ten watch periods: the stream stays open
        c.send(2, "n1")
        time.sleep(0.2)
        assert c.inbox.empty()  # nothing is acknowledged while it does not serve
        serving[0] = True
        assert c.receive().ack_seq == 2
        c.send(3, "n1")
        assert c.receive().ack_seq == 3
        assert server.connected() == 1


def test_a_lapse_longer_than_a_heartbeat_interval_or_a_new_term_ends_the_stream(
    clients: list[Client],
) -> None:
    with stream_server() as (replica, server, serving):
        lapse_grace(replica, 300)
        c = connect(server, "n1", clients)
        c.send(1, "n1")
        assert c.receive().ack_seq == 1
        serving[0] = False
        started = time.monotonic()
        assert c.ended().code() is grpc.StatusCode.FAILED_PRECONDITION
        assert time.monotonic() - started >= 0.3
        # Serving again, but in a later term: a stream of the old term ends.
        serving[0] = True
        d = connect(server, "n2", clients)
        d.send(1, "n2")
        assert d.receive().ack_seq == 1
        replica.backend.leader_term = 2
        assert d.ended().code() is grpc.StatusCode.FAILED_PRECONDITION
        # A heartbeat waiting out a lapse when the term changes is not answered.
        e = connect(server, "n1", clients)
        e.send(1, "n1")
        assert e.receive().ack_seq == 1
        lapse_grace(replica, 3_000)
        serving[0] = False
        e.send(2, "n1")
        time.sleep(0.1)
        replica.backend.leader_term = 3
        serving[0] = True
        assert e.ended().code() is grpc.StatusCode.FAILED_PRECONDITION
