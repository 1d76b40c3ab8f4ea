"""The agent carries its running members' paces in every heartbeat, in the embedded form
(the only one that has them), and the flat form when there is none."""

from __future__ import annotations

from collections.abc import Sequence

from synapse_ha.core.desired import MemberKey
from synapse_ha.core.health.slowness import PaceReport
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb
from synapse_ha.worker.agent import Agent, AgentTimings
from tests.worker.helpers import FakeClock
from tests.worker.test_agent import FakeControl, FakeExecutor

KEY = MemberKey("job-000001", 3, 1)


def test_every_heartbeat_carries_the_running_members_paces() -> None:
    clock = FakeClock()
    control = FakeControl(clock)
    executor = FakeExecutor()
    asked: list[list[MemberKey]] = []

    def paces(keys: Sequence[MemberKey]) -> Sequence[PaceReport]:
        asked.append(list(keys))
        return [PaceReport(k.job_id, k.fencing_token, k.rank, 812_500, 40, "s1") for k in keys]

    agent = Agent(
        pb.RegisterNodeRequest(node_id="n1", address="127.0.0.1:7070"),
        control,
        executor,
        clock,
        timings=AgentTimings(heartbeat_interval_s=1.0, lease_ttl_s=4.0),
        member_paces=paces,
    )
    agent.step()
    (first,) = control.heartbeats
    assert not first.HasField("heartbeat") and first.node_id == "n1"  # no member: flat
    executor.known.add(KEY)
    executor.live.add(KEY)
    clock.advance(1.0)
    agent.step()
    beat = control.heartbeats[1]
    assert beat.HasField("heartbeat") and beat.heartbeat.node_id == "n1"
    assert [
        (p.job_id, p.fencing_token, p.rank, p.step_us, p.steps, p.peers)
        for p in beat.heartbeat.paces
    ] == [("job-000001", 3, 1, 812_500, 40, "s1")]
    assert [r.rank for r in beat.heartbeat.running] == [1]
    assert asked[-1] == [KEY]
