"""The agent loop against a fake control plane, a fake executor and a fake clock."""

from __future__ import annotations

import errno
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from synapse_ha.core.desired import DesiredMember, MemberKey
from synapse_ha.core.model import NodeStatus
from synapse_ha.rpc import states
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb
from synapse_ha.worker.agent import (
    Agent,
    AgentTimings,
    ControlPlaneUnreachable,
    NotRegistered,
    StreamEnded,
)
from synapse_ha.worker.lease import Lease, LeaseFile, LeaseState
from synapse_ha.worker.member_dirs import MemberExit
from tests.worker.helpers import FakeClock

STARTED, EXITED = pb.MemberReport.STARTED, pb.MemberReport.EXITED


@dataclass
class Started:
    exit: MemberExit | None = None


class FakeExecutor:
    def __init__(self) -> None:
        self.known: set[MemberKey] = set()
        self.highest_token: dict[str, int] = {}
        self.live: set[MemberKey] = set()
        self.gpus: dict[MemberKey, tuple[int, ...]] = {}
        self.started: list[MemberKey] = []
        self.stopped: list[MemberKey] = []
        self.exits: list[tuple[MemberKey, MemberExit]] = []
        self.reported: list[MemberKey] = []
        self.kill_all_calls: list[str] = []
        self.refuse: dict[str, str] = {}  # job id -> why this node cannot start its members
        self.told: list[tuple[MemberKey, int]] = []  # (member, membership) it was told of

    def start(self, spec: DesiredMember) -> Started:
        self.known.add(spec.key)
        self.started.append(spec.key)
        refusal = self.refuse.get(spec.key.job_id)
        if refusal is not None:  # the node cannot start it: an exit at once, never run
            exit_ = MemberExit(126, refusal, 0, node_fault=True)
            self.exits.append((spec.key, exit_))
            return Started(exit_)
        self.live.add(spec.key)
        self.gpus[spec.key] = spec.gpus
        return Started()

    def stop(self, key: MemberKey) -> None:
        self.stopped.append(key)

    def exit(self, key: MemberKey, code: int) -> None:
        self.live.discard(key)
        self.exits.append((key, MemberExit(code, "", 0)))

    def poll(self) -> list[tuple[MemberKey, MemberExit]]:
        out, self.exits = self.exits, []
        return out

    def running(self) -> list[MemberKey]:
        return sorted(self.live)

    def gpus_held(self) -> dict[MemberKey, tuple[int, ...]]:
        return {k: self.gpus[k] for k in sorted(self.live) if self.gpus.get(k)}

    def kill_all(self, detail: str) -> list[tuple[MemberKey, MemberExit]]:
        self.kill_all_calls.append(detail)
        out = [(k, MemberExit(137, detail, 0)) for k in sorted(self.live)]
        self.live.clear()
        return out

    def mark_reported(self, key: MemberKey) -> None:
        self.reported.append(key)

    def tell_membership(self, desired: DesiredMember) -> bool:
        told = [n for k, n in self.told if k == desired.key]
        if desired.membership <= max(told, default=0):
            return False
        self.told.append((desired.key, desired.membership))
        return True


class FakeControl:
    """Answers with ``desired``; ``fail`` makes calls raise; records every request."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.desired: list[pb.DesiredMember] = []
        self.fail: Exception | None = None
        self.node_status = NodeStatus.READY
        self.call_takes_s = 0.0
        self.registrations = 0
        self.registered_with: list[pb.RegisterNodeRequest] = []
        self.acks_registration_reports = False
        self.heartbeats: list[pb.HeartbeatRequest] = []
        self.on_heartbeat: Callable[[], None] | None = None

    def register(self, request: pb.RegisterNodeRequest) -> pb.RegisterNodeResponse:
        if isinstance(self.fail, ControlPlaneUnreachable):
            raise self.fail
        self.registrations += 1
        self.registered_with.append(request)
        return pb.RegisterNodeResponse(
            **states.node_status_fields(NodeStatus.READY),
            heartbeat_interval_ms=1000,
            lease_ttl_ms=4000,
            acked_reports=len(request.reports) if self.acks_registration_reports else 0,
        )

    def heartbeat(self, request: pb.HeartbeatRequest, timeout_s: float) -> pb.HeartbeatResponse:
        copy = pb.HeartbeatRequest()
        copy.CopyFrom(request)
        self.heartbeats.append(copy)
        self.clock.advance(self.call_takes_s)
        if self.fail is not None:
            raise self.fail
        return pb.HeartbeatResponse(
            desired=self.desired,
            lease_ttl_ms=4000,
            heartbeat_interval_ms=1000,
            acked_reports=len(request.reports),
            **states.lease_status_fields(self.node_status),
        )


def desired(job: str, token: int, rank: int, gpus: tuple[int, ...] = ()) -> pb.DesiredMember:
    return pb.DesiredMember(
        job_id=job,
        fencing_token=token,
        attempt=token,
        rank=rank,
        world_size=2,
        command=["true"],
        shell=True,
        gpus=gpus,
    )


def reports(request: pb.HeartbeatRequest) -> list[tuple[str, int, int, int]]:
    return [(r.job_id, r.fencing_token, r.rank, r.kind) for r in request.reports]


@pytest.fixture
def setup() -> tuple[Agent, FakeControl, FakeExecutor, FakeClock]:
    clock = FakeClock()
    control = FakeControl(clock)
    executor = FakeExecutor()
    agent = Agent(
        pb.RegisterNodeRequest(node_id="n1", address="127.0.0.1:7070"),
        control,
        executor,
        clock,
        timings=AgentTimings(heartbeat_interval_s=1.0, lease_ttl_s=4.0),
    )
    return agent, control, executor, clock


Setup = tuple[Agent, FakeControl, FakeExecutor, FakeClock]


def test_registers_then_starts_desired_members_and_reports_them(setup: Setup) -> None:
    agent, control, executor, clock = setup
    control.desired = [desired("j", 5, 0), desired("j", 5, 1)]
    said = agent.step()
    assert "registered" in said
    assert "started 2 member(s)" in said
    assert executor.started == [MemberKey("j", 5, 0), MemberKey("j", 5, 1)]
    clock.advance(0.05)
    agent.step()  # fresh reports go out early
    assert reports(control.heartbeats[-1]) == [("j", 5, 0, STARTED), ("j", 5, 1, STARTED)]
    assert {(r.job_id, r.rank) for r in control.heartbeats[-1].running} == {("j", 0), ("j", 1)}


def test_a_member_its_node_cannot_start_reports_its_exit_and_never_a_start(
    setup: Setup,
) -> None:
    agent, control, executor, clock = setup
    executor.refuse["j"] = "node n1 has no account for user alice"
    control.desired = [desired("j", 5, 0)]
    said = agent.step()
    assert "could not start 1 member(s) (the node's fault)" in said
    assert "started" not in said.replace("could not start", "")
    clock.advance(0.05)
    agent.step()
    sent = [r for hb in control.heartbeats for r in hb.reports]
    assert [(r.kind, r.cause) for r in sent] == [(EXITED, pb.MemberReport.NODE_CANNOT_RUN)]
    assert "no account for user alice" in sent[0].detail


def test_applying_the_same_desired_state_again_changes_nothing(setup: Setup) -> None:
    agent, control, executor, clock = setup
    control.desired = [desired("j", 5, 0)]
    for _ in range(5):
        agent.step()
        clock.advance(1.0)
    assert executor.started == [MemberKey("j", 5, 0)]
    assert executor.stopped == []


def test_an_exited_member_is_never_restarted_and_its_exit_is_reported_until_acked(
    setup: Setup,
) -> None:
    agent, control, executor, clock = setup
    control.desired = [desired("j", 5, 0)]
    agent.step()
    executor.exit(MemberKey("j", 5, 0), 1)
    control.fail = ControlPlaneUnreachable("partition")
    clock.advance(0.05)
    agent.step()
    assert ("j", 5, 0, EXITED) in reports(control.heartbeats[-1])
    assert executor.reported == []
    control.fail = None
    clock.advance(1.0)
    agent.step()  # resent, acknowledged this time
    assert ("j", 5, 0, EXITED) in reports(control.heartbeats[-1])
    exited = [r for r in control.heartbeats[-1].reports if r.kind == EXITED]
    assert exited and all(r.cause == pb.MemberReport.PROGRAM for r in exited)
    assert executor.reported == [MemberKey("j", 5, 0)]
    clock.advance(1.0)
    agent.step()
    assert reports(control.heartbeats[-1]) == []
    assert executor.started == [MemberKey("j", 5, 0)]  # still desired, never restarted


def test_members_no_longer_desired_are_stopped(setup: Setup) -> None:
    agent, control, executor, clock = setup
    control.desired = [desired("a", 1, 0), desired("b", 2, 0)]
    agent.step()
    control.desired = [desired("b", 2, 0)]
    clock.advance(1.0)
    said = agent.step()
    assert executor.stopped == [MemberKey("a", 1, 0)]
    assert "stopped 1 member(s)" in said


def test_a_member_with_a_lower_token_than_one_seen_is_never_started(setup: Setup) -> None:
    agent, control, executor, clock = setup
    control.desired = [desired("j", 7, 0)]
    agent.step()
    control.desired = [desired("j", 6, 1), desired("j", 7, 0)]  # a stale entry
    clock.advance(1.0)
    agent.step()
    assert executor.started == [MemberKey("j", 7, 0)]


def test_a_newer_token_stops_the_older_attempt_and_starts_the_new_one(setup: Setup) -> None:
    agent, control, executor, clock = setup
    control.desired = [desired("j", 3, 0)]
    agent.step()
    control.desired = [desired("j", 3, 0), desired("j", 4, 0)]
    clock.advance(1.0)
    agent.step()
    assert executor.stopped == [MemberKey("j", 3, 0)]
    assert executor.started == [MemberKey("j", 3, 0)]  # not while the old one still runs
    executor.exit(MemberKey("j", 3, 0), 143)
    clock.advance(1.0)
    agent.step()
    assert executor.started == [MemberKey("j", 3, 0), MemberKey("j", 4, 0)]


def test_a_gpu_still_held_by_a_stopping_member_of_another_job_waits_for_it(
    setup: Setup,
) -> None:
    """The leader frees an ended attempt's GPUs at once; the member holding one here may
    still be stopping when another job's member is bound to it. That member starts only
    once the holder is gone, never alongside it; a member on other GPUs starts at once."""
    agent, control, executor, clock = setup
    control.desired = [desired("old", 3, 1, gpus=(2, 3))]
    agent.step()
    control.desired = [desired("new", 9, 1, gpus=(2,)), desired("other", 4, 0, gpus=(5,))]
    clock.advance(1.0)
    said = agent.step()
    assert executor.stopped == [MemberKey("old", 3, 1)]
    assert executor.started == [MemberKey("old", 3, 1), MemberKey("other", 4, 0)]
    assert "1 member(s) waiting for GPUs a stopping member still holds" in said
    clock.advance(1.0)
    agent.step()  # still stopping: still waiting
    assert MemberKey("new", 9, 1) not in executor.started
    executor.exit(MemberKey("old", 3, 1), 143)
    clock.advance(1.0)
    agent.step()
    assert executor.started[-1] == MemberKey("new", 9, 1)


def test_tokens_seen_before_a_restart_still_count(setup: Setup) -> None:
    agent, control, executor, _ = setup
    executor.highest_token["j"] = 9  # recovered from member records
    executor.known.add(MemberKey("j", 9, 0))
    control.desired = [desired("j", 8, 0), desired("j", 9, 0)]
    agent.step()
    assert executor.started == []


def test_no_reply_for_lease_ttl_kills_every_member_and_starts_nothing(setup: Setup) -> None:
    agent, control, executor, clock = setup
    control.desired = [desired("j", 5, 0), desired("j", 5, 1)]
    agent.step()
    assert agent.lease.state is LeaseState.HELD
    control.fail = ControlPlaneUnreachable("leader unreachable")
    clock.advance(3.9)
    agent.step()
    assert executor.kill_all_calls == []  # still inside the lease
    clock.advance(0.1)
    said = agent.step()
    assert "fenced" in said
    assert executor.kill_all_calls == ["fenced: no heartbeat reply from a leader for lease_ttl"]
    assert agent.lease.state is LeaseState.FENCED
    assert executor.live == set()

    # Back in touch: the fenced exits are reported; killed members are not restarted.
    control.fail = None
    control.desired = [desired("j", 5, 0), desired("j", 5, 1), desired("k", 6, 0)]
    clock.advance(1.0)
    said = agent.step()
    assert "lease renewed after fencing" in said
    sent = reports(control.heartbeats[-1])
    assert ("j", 5, 0, EXITED) in sent
    assert ("j", 5, 1, EXITED) in sent
    assert [r.exit_code for r in control.heartbeats[-1].reports if r.kind == EXITED] == [137, 137]
    # Killed by fencing: a disruption, which the control plane requeues without a retry.
    fenced = pb.MemberReport.FENCED
    assert [r.cause for r in control.heartbeats[-1].reports if r.kind == EXITED] == [fenced] * 2
    assert executor.started == [MemberKey("j", 5, 0), MemberKey("j", 5, 1), MemberKey("k", 6, 0)]


def test_a_reply_to_a_request_sent_before_the_fencing_does_not_lift_it(setup: Setup) -> None:
    agent, control, executor, clock = setup
    agent.step()
    control.fail = ControlPlaneUnreachable("slow")
    clock.advance(4.5)
    agent.step()  # fences
    assert agent.lease.state is LeaseState.FENCED
    # A reply that takes longer than the lease ttl renews nothing and starts nothing.
    control.fail = None
    control.call_takes_s = 4.5
    control.desired = [desired("j", 5, 0)]
    clock.advance(1.0)
    said = agent.step()
    assert "too late" in said
    assert executor.started == []
    assert agent.lease.state is LeaseState.FENCED


def test_an_unknown_node_kills_its_members_and_registers_again(setup: Setup) -> None:
    agent, control, executor, clock = setup
    control.desired = [desired("j", 5, 0)]
    agent.step()
    control.fail = NotRegistered("node 'n1' is not registered")
    clock.advance(1.0)
    said = agent.step()
    assert "registering again" in said
    assert executor.live == set()
    control.fail = None
    clock.advance(0.01)
    agent.step()
    assert control.registrations == 2
    assert ("j", 5, 0, EXITED) in reports(control.heartbeats[-1])


def test_a_node_declared_dead_kills_its_members_and_registers_again(setup: Setup) -> None:
    agent, control, executor, clock = setup
    control.desired = [desired("j", 5, 0)]
    agent.step()
    control.node_status = NodeStatus.DEAD
    clock.advance(1.0)
    agent.step()
    assert len(executor.kill_all_calls) == 1
    assert not agent.registered


def test_a_node_back_from_dead_registers_with_the_exits_it_has_not_reported(
    setup: Setup,
) -> None:
    agent, control, executor, clock = setup
    control.desired = [desired("j", 5, 0)]
    agent.step()
    clock.advance(0.05)
    agent.step()  # the start is acknowledged
    assert list(control.registered_with[0].reports) == []
    # The member exits while the node is declared dead; the leader ended its stream.
    executor.exit(MemberKey("j", 5, 0), 0)
    control.fail = StreamEnded("the heartbeat stream to the leader ended")
    clock.advance(1.0)
    assert "registering again" in agent.step()
    control.fail = None
    control.heartbeats.clear()
    control.acks_registration_reports = True
    clock.advance(0.01)
    assert "registered" in agent.step()
    sent = reports(pb.HeartbeatRequest(reports=control.registered_with[-1].reports))
    assert sent == [("j", 5, 0, EXITED)]
    assert executor.reported == [MemberKey("j", 5, 0)]
    assert all(("j", 5, 0, EXITED) not in reports(h) for h in control.heartbeats)


def test_registration_retries_until_a_scheduler_answers(setup: Setup) -> None:
    agent, control, _, clock = setup
    control.fail = ControlPlaneUnreachable("nobody home")
    assert "could not register" in agent.step()
    assert agent.step() == ""  # waits before the next try
    clock.advance(0.5)
    control.fail = None
    assert "registered" in agent.step()


def test_shutdown_reports_the_final_exits(setup: Setup) -> None:
    agent, control, executor, _ = setup
    control.desired = [desired("j", 5, 0)]
    agent.step()
    agent.shutdown(lambda: executor.kill_all("stopped at worker shutdown"))
    assert ("j", 5, 0, EXITED) in reports(control.heartbeats[-1])


# ------------------------------------------------------------------------ lease


def test_lease_runs_from_when_the_request_was_sent() -> None:
    clock = FakeClock()
    lease = Lease(4.0, clock)
    assert not lease.held()
    sent = clock()
    clock.advance(1.5)  # the reply took a while
    assert lease.renew(sent)
    assert lease.valid_until == sent + 4.0
    clock.advance(2.4)
    assert lease.held() and not lease.must_fence()
    clock.advance(0.1)
    assert lease.must_fence()
    lease.fence()
    assert not lease.must_fence()
    assert not lease.renew(sent)  # sent before the fencing
    assert lease.renew(clock())
    assert lease.held()


def test_lease_takes_the_ttl_the_leader_announces() -> None:
    clock = FakeClock()
    lease = Lease(4.0, clock)
    lease.renew(clock(), ttl_s=2.0)
    assert lease.valid_until == clock() + 2.0
    with pytest.raises(ValueError, match="positive"):
        Lease(0, clock)


def test_a_nudge_brings_the_next_heartbeat_forward_but_keeps_the_minimum_gap(
    setup: Setup,
) -> None:
    agent, control, _, clock = setup
    agent.step()  # registers and heartbeats
    sent = len(control.heartbeats)
    clock.advance(0.01)
    assert agent.nudge("n1")
    assert agent.next_wakeup_in() == pytest.approx(0.01)
    agent.step()
    assert len(control.heartbeats) == sent  # within MIN_REPORT_GAP_S of the last one
    clock.advance(0.01)
    control.desired = [desired("j", 7, 0)]
    assert "started 1 member(s)" in agent.step()
    assert len(control.heartbeats) == sent + 1
    clock.advance(0.05)
    agent.step()  # the started report goes out early; the nudge was consumed
    clock.advance(0.05)
    before = len(control.heartbeats)
    agent.step()
    assert len(control.heartbeats) == before  # no nudge, no fresh reports: waits the interval


def test_a_nudge_for_another_node_is_refused(setup: Setup) -> None:
    agent, control, _, clock = setup
    agent.step()
    clock.advance(0.1)
    assert not agent.nudge("n2")
    sent = len(control.heartbeats)
    agent.step()
    assert len(control.heartbeats) == sent


class FullDiskLeaseFile(LeaseFile):
    """A lease file on a disk that fills up: writes raise ENOSPC while ``full``."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.full = False

    def write(self, deadline_monotonic: float) -> None:
        if self.full:
            raise OSError(errno.ENOSPC, "No space left on device")
        super().write(deadline_monotonic)


def test_a_lease_file_on_a_full_disk_starts_nothing_and_the_agent_goes_on(
    tmp_path: Path,
) -> None:
    clock = FakeClock()
    control = FakeControl(clock)
    executor = FakeExecutor()
    lease_file = FullDiskLeaseFile(tmp_path / "lease")
    lease_file.full = True  # full already at start: the agent still starts
    agent = Agent(
        pb.RegisterNodeRequest(node_id="n1", address="127.0.0.1:7070"),
        control,
        executor,
        clock,
        lease_file=lease_file,
        timings=AgentTimings(heartbeat_interval_s=1.0, lease_ttl_s=4.0),
    )
    control.desired = [desired("j", 5, 0)]
    said = agent.step()
    assert "the lease file cannot be written" in said
    assert executor.started == []  # its supervisor could not be told of the lease
    # Asked to stop a member while full: it still stops it.
    executor.known.add(MemberKey("old", 1, 0))
    executor.live.add(MemberKey("old", 1, 0))
    clock.advance(1.0)
    agent.step()
    assert executor.stopped == [MemberKey("old", 1, 0)]
    # Space is back: the next acknowledgement writes the deadline and members start.
    lease_file.full = False
    clock.advance(1.0)
    said = agent.step()
    assert "cannot be written" not in said
    assert executor.started == [MemberKey("j", 5, 0)]
    assert float(lease_file.path.read_text()) == pytest.approx(agent.lease.valid_until)
