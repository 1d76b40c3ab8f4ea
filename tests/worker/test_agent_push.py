"""Pushed desired lists (heartbeat streams): applied at once under a held
lease, never under a lapsed one, never after a newer reply; a stream that ends makes the
agent register again without touching its members."""

from __future__ import annotations

from synapse_ha.core.desired import MemberKey
from synapse_ha.worker.agent import ControlPlaneUnreachable, StreamEnded
from synapse_ha.worker.lease import LeaseState
from tests.worker.test_agent import Setup, desired, setup

__all__ = ["setup"]


def test_a_push_starts_members_at_once_while_the_lease_is_held(setup: Setup) -> None:
    agent, control, executor, clock = setup
    agent.step()  # registers and heartbeats: the lease is held
    heartbeats = len(control.heartbeats)
    clock.advance(0.1)  # the next heartbeat is 0.9 s away
    agent.push([desired("j", 5, 0)])
    said = agent.step()
    assert "pushed: started 1 member(s)" in said
    assert executor.started == [MemberKey("j", 5, 0)]
    # The start report goes out in an early heartbeat, as after any start.
    assert agent.fresh_reports
    assert len(control.heartbeats) == heartbeats


def test_a_push_does_not_renew_the_lease_nor_start_anything_once_it_lapsed(
    setup: Setup,
) -> None:
    agent, control, executor, clock = setup
    agent.step()
    control.fail = ControlPlaneUnreachable("the leader is silent")
    clock.advance(4.0)
    agent.push([desired("j", 5, 0)])
    said = agent.step()
    assert "fenced" in said
    assert agent.lease.state is LeaseState.FENCED
    assert not agent.lease.held()
    assert agent.registered  # still registered: only the lease stops the push
    assert executor.started == []


def test_a_push_received_before_a_reply_is_dropped_for_the_reply(setup: Setup) -> None:
    agent, control, executor, clock = setup
    control.desired = [desired("j", 5, 0)]
    agent.step()
    assert executor.started == [MemberKey("j", 5, 0)]
    agent.push([])  # older than the reply below, which still lists j
    clock.advance(1.0)
    agent.step()
    assert executor.stopped == []
    assert MemberKey("j", 5, 0) in executor.live


def test_an_ended_stream_registers_again_and_keeps_the_members(setup: Setup) -> None:
    agent, control, executor, clock = setup
    control.desired = [desired("j", 5, 0)]
    agent.step()
    control.fail = StreamEnded("the leader stepped down")
    clock.advance(1.0)
    said = agent.step()
    assert "registering again" in said
    assert not agent.registered
    assert executor.kill_all_calls == []
    control.fail = None
    agent.step()
    assert control.registrations == 2
    assert executor.live == {MemberKey("j", 5, 0)}
