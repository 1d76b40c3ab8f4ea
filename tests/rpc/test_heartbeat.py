"""The heartbeat use case both adapters share: reports to propose, answers, desired
members per snapshot version."""

from __future__ import annotations

import pytest

from synapse_ha.core import commands as cmd
from synapse_ha.core.codec.formats import FORMAT
from synapse_ha.core.health.fitness import GpuFault, NodeCheck
from synapse_ha.core.machine import apply
from synapse_ha.core.model import ClusterState, NodeStatus
from synapse_ha.core.scheduler import schedule
from synapse_ha.core.snapshot import full_copy
from synapse_ha.core.spec.document import SpecError
from synapse_ha.rpc import states
from synapse_ha.rpc.from_proto import member_events_from_proto
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb
from synapse_ha.rpc.heartbeat import answer_fields
from synapse_ha.service.heartbeat import (
    DesiredMembers,
    check_problems,
    checks_command,
    gpu_fault_problems,
    health_command,
    report_command,
)
from tests.core.harness import job, node


def test_no_events_propose_nothing_and_events_one_report() -> None:
    assert report_command("n1", (), 5, FORMAT) is None
    event = cmd.MemberEvent("job-000001", 1, 0, cmd.MemberEventKind.STARTED)
    command = report_command("n1", [event], 5, FORMAT)
    assert command is not None
    assert (command.node_id, command.events, command.now_ms) == ("n1", (event,), 5)
    assert 0 <= command.jitter_seed < 1 << 63


def test_checkpoint_marks_wait_for_every_replica_to_read_them() -> None:
    started = cmd.MemberEvent("job-000001", 1, 0, cmd.MemberEventKind.STARTED)
    mark = cmd.MemberEvent("job-000001", 1, 0, cmd.MemberEventKind.CHECKPOINT, step=3, mark_seq=1)
    command = report_command("n1", [started, mark], 5, 4)
    assert command is not None and command.events == (started,)
    assert report_command("n1", [mark], 5, 4) is None
    command = report_command("n1", [started, mark], 5, 5)
    assert command is not None and command.events == (started, mark)


def test_an_answer_says_dead_for_a_node_the_state_does_not_have() -> None:
    state = ClusterState()
    assert apply(state, cmd.RegisterNode(node("n1", gpus=2), 1)).ok
    assert (
        states.lease_status(pb.HeartbeatResponse(**answer_fields(state, "n1"))) is NodeStatus.READY
    )
    gone = answer_fields(state, "n9")
    assert states.lease_status(pb.HeartbeatResponse(**gone)) is NodeStatus.DEAD
    assert gone["lease_ttl_ms"] == state.config.timeouts.lease_ttl_ms


def test_desired_members_follow_the_newest_snapshot_version() -> None:
    state = ClusterState()
    assert apply(state, cmd.RegisterNode(node("n1", gpus=2), 1)).ok
    cache = DesiredMembers()
    before = full_copy(state)
    assert cache.of(before, "n1") == []
    assert apply(state, cmd.SubmitJob(job("j", replicas=1, gpu=1), "r1", 2)).ok
    plan = schedule(state, 3)
    assert apply(state, cmd.BindPlan(plan.placements, plan.reasons, 3)).ok
    after = full_copy(state)
    assert [m.job_id for m in cache.of(after, "n1")] == ["job-000001"]
    # An older snapshot asked later gets the newer answer, never an older one.
    assert [m.job_id for m in cache.of(before, "n1")] == ["job-000001"]


def test_a_heartbeat_naming_a_new_unhealthy_gpu_becomes_one_command() -> None:
    state = ClusterState()
    assert apply(state, cmd.RegisterNode(node("n1", gpus=8), 1)).ok
    xid = GpuFault(3, "xid-79", "fallen off the bus")
    command = health_command(state, "n1", [xid], 7)
    assert command is not None and (command.node_id, command.faults) == ("n1", (xid,))
    assert apply(state, command).ok
    # Named again in every later heartbeat: nothing new, no command.
    assert health_command(state, "n1", [xid], 8) is None
    assert health_command(state, "n1", [], 8) is None
    assert health_command(state, "n9", [xid], 8) is None
    second = health_command(state, "n1", [xid, GpuFault(5, "lost")], 9)
    assert second is not None


def test_malformed_unhealthy_gpus_name_the_field_and_the_rule() -> None:
    state = ClusterState()
    assert apply(state, cmd.RegisterNode(node("n1", gpus=2), 1)).ok
    problems = gpu_fault_problems(state, "n1", [GpuFault(2, "xid-79")])
    assert [str(p) for p in problems] == ["gpu_faults[0].gpu: must be a GPU index from 0 to 1"]
    assert gpu_fault_problems(state, "n1", [GpuFault(1, "lost")]) == []


def test_node_checks_become_a_command_only_when_they_change_the_conditions() -> None:
    state = ClusterState()
    assert apply(state, cmd.RegisterNode(node("n1", gpus=2), 1)).ok
    failing = NodeCheck("health-check", True, "disk full")
    passing = NodeCheck("health-check", False)
    assert checks_command(state, "n1", [passing], 2) is None
    assert checks_command(state, "n1", [], 2) is None
    # Not before every replica reads it: the heartbeat is answered, the checks wait.
    assert checks_command(state, "n1", [failing], 2) is None
    assert apply(state, cmd.RaiseFormat(FORMAT)).ok
    command = checks_command(state, "n1", [failing], 3)
    assert command is not None and command.checks == (failing,)
    assert apply(state, command).ok
    assert state.nodes["n1"].status is NodeStatus.CORDONED
    assert checks_command(state, "n1", [failing], 4) is None
    assert checks_command(state, "n9", [failing], 4) is None
    assert checks_command(state, "n1", [passing], 5) is not None
    problems = check_problems([NodeCheck("Bad Name", True, "x")])
    assert [p.field for p in problems] == ["checks[0].name"]


def test_no_worker_sets_or_clears_the_leaders_degraded_mark() -> None:
    state = ClusterState()
    assert apply(state, cmd.RegisterNode(node("n1", gpus=2), 1)).ok
    assert apply(state, cmd.RaiseFormat(FORMAT)).ok
    assert apply(state, cmd.MarkNodeDegraded("n1", "23% slower than its gangs", 2)).ok
    assert [k.name for k in state.nodes["n1"].conditions] == ["degraded"]
    assert checks_command(state, "n1", [NodeCheck("degraded", False)], 3) is None
    forged = checks_command(
        state, "n1", [NodeCheck("degraded", True, "x"), NodeCheck("disk", True, "full")], 3
    )
    assert forged is not None and [k.name for k in forged.checks] == ["disk"]


def test_checkpoint_reports_become_mark_events_and_bad_ones_are_refused() -> None:
    kind = pb.MemberReport.CHECKPOINT
    marked = pb.MemberReport(
        job_id="j", fencing_token=3, rank=1, kind=kind, checkpoint_step=40, checkpoint_seq=2
    )
    plain = pb.MemberReport(job_id="j", fencing_token=3, rank=0, kind=kind, checkpoint_seq=1)
    started = pb.MemberReport(job_id="j", fencing_token=3, rank=0, kind=pb.MemberReport.STARTED)
    events = member_events_from_proto([marked, plain, started])
    assert [(e.kind, e.step, e.mark_seq) for e in events] == [
        (cmd.MemberEventKind.CHECKPOINT, 40, 2),
        (cmd.MemberEventKind.CHECKPOINT, None, 1),
        (cmd.MemberEventKind.STARTED, None, 0),
    ]
    no_number = pb.MemberReport(job_id="j", fencing_token=3, kind=kind)
    negative = pb.MemberReport(
        job_id="j", fencing_token=3, kind=kind, checkpoint_step=-1, checkpoint_seq=1
    )
    for bad in (no_number, negative):
        with pytest.raises(SpecError, match="checkpoint_seq > 0 and checkpoint_step >= 0"):
            member_events_from_proto([bad])
