"""Exit reports survive the leader forgetting this node: a member's exit 0 that the leader
has not committed when it declares the node dead is still reported, as the member's own
exit, after the agent registers again (DESIGN §4)."""

from __future__ import annotations

import pytest

from synapse_ha.core.desired import MemberKey
from synapse_ha.core.model import NodeStatus
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb
from synapse_ha.worker.agent import Agent, AgentTimings, ControlPlaneUnreachable, NotRegistered
from synapse_ha.worker.member_dirs import MemberExit
from tests.worker.helpers import FakeClock
from tests.worker.test_agent import FakeControl, FakeExecutor, desired

EXITED = pb.MemberReport.EXITED
KEY = MemberKey("j", 5, 0)


class RealisticExecutor(FakeExecutor):
    """As :class:`~synapse_ha.worker.members.MemberExecutor`: a member that exited but was
    not polled yet is still "running" to ``kill_all``, which reports it killed."""

    def exit(self, key: MemberKey, code: int) -> None:
        self.exits.append((key, MemberExit(code, "", 0)))  # stays live until polled

    def poll(self) -> list[tuple[MemberKey, MemberExit]]:
        out = super().poll()
        self.live.difference_update(k for k, _ in out)
        return out

    def kill_all(self, detail: str) -> list[tuple[MemberKey, MemberExit]]:
        self.exits = [(k, e) for k, e in self.exits if k not in self.live]
        return super().kill_all(detail)


class LateAckControl(FakeControl):
    """Acknowledges nothing while ``ack`` is False."""

    ack = True

    def heartbeat(self, request: pb.HeartbeatRequest, timeout_s: float) -> pb.HeartbeatResponse:
        answer = super().heartbeat(request, timeout_s)
        if not self.ack:
            answer.acked_reports = 0
        return answer


Parts = tuple[Agent, LateAckControl, RealisticExecutor, FakeClock]


@pytest.fixture
def parts() -> Parts:
    clock = FakeClock()
    control = LateAckControl(clock)
    executor = RealisticExecutor()
    agent = Agent(
        pb.RegisterNodeRequest(node_id="n1", address="127.0.0.1:7070"),
        control,
        executor,
        clock,
        timings=AgentTimings(heartbeat_interval_s=1.0, lease_ttl_s=4.0),
    )
    control.desired = [desired("j", 5, 0)]
    agent.step()
    assert executor.live == {KEY}
    return agent, control, executor, clock


def exits_sent(control: FakeControl) -> list[tuple[int, int]]:
    """(exit code, cause) of every EXITED report of KEY in the last heartbeat."""
    return [
        (r.exit_code, r.cause)
        for r in control.heartbeats[-1].reports
        if r.kind == EXITED and (r.job_id, r.fencing_token, r.rank) == KEY[:3]
    ]


def test_an_exit_while_cut_off_past_the_dead_timeout_is_sent_after_registering_again(
    parts: Parts,
) -> None:
    agent, control, executor, clock = parts
    control.fail = ControlPlaneUnreachable("partitioned")
    executor.exit(KEY, 0)
    for _ in range(12):  # past lease_ttl (fenced) and past any dead timeout
        clock.advance(1.0)
        agent.step()
    assert executor.kill_all_calls  # it fenced itself; the member had already exited
    # The leader has declared the node dead and no longer knows it: register again.
    control.fail = NotRegistered("node 'n1' is not registered")
    clock.advance(1.0)
    assert "registering again" in agent.step()
    control.fail = None
    control.desired = []
    clock.advance(1.0)
    agent.step()
    assert control.registrations == 2
    assert exits_sent(control) == [(0, pb.MemberReport.PROGRAM)]
    assert executor.reported == [KEY]  # acknowledged: marked, never sent again
    clock.advance(1.0)
    agent.step()
    assert exits_sent(control) == []


def test_an_exit_during_the_heartbeat_that_says_dead_is_the_members_own(parts: Parts) -> None:
    agent, control, executor, clock = parts
    control.node_status = NodeStatus.DEAD
    control.on_heartbeat = None
    control.desired = []
    # The member exits while the heartbeat is on the wire; the reply says "dead".
    original = control.heartbeat

    def heartbeat(request: pb.HeartbeatRequest, timeout_s: float) -> pb.HeartbeatResponse:
        executor.exit(KEY, 0)
        return original(request, timeout_s)

    control.heartbeat = heartbeat  # type: ignore[method-assign]
    clock.advance(1.0)
    assert "declared this node dead" in agent.step()
    control.heartbeat = original  # type: ignore[method-assign]
    control.node_status = NodeStatus.READY
    clock.advance(1.0)
    agent.step()
    assert exits_sent(control) == [(0, pb.MemberReport.PROGRAM)]


def test_unacknowledged_reports_outlive_a_dead_declaration(parts: Parts) -> None:
    agent, control, executor, clock = parts
    executor.exit(KEY, 0)
    control.ack = False
    control.node_status = NodeStatus.DEAD
    clock.advance(1.0)
    agent.step()
    assert exits_sent(control) == [(0, pb.MemberReport.PROGRAM)]
    assert not agent.registered
    control.node_status = NodeStatus.READY
    control.desired = []
    clock.advance(1.0)
    agent.step()  # registers, then heartbeats: the report goes out again
    assert control.registrations == 2
    assert exits_sent(control) == [(0, pb.MemberReport.PROGRAM)]
    assert executor.reported == []
    control.ack = True
    clock.advance(1.0)
    agent.step()
    assert executor.reported == [KEY]
