"""A preempted member's graceful stop, with real processes: the notice in
``$SYNAPSE_PREEMPT_FILE`` before SIGTERM, SIGKILL when the grace ends, the lease still
ending it sooner, the exit a disruption; and the agent turning a desired member marked
preempted into that stop (and never starting one)."""

from __future__ import annotations

import errno
import json
import time

import pytest

from synapse_ha.core.desired import DesiredMember, MemberKey
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb
from synapse_ha.worker import members as members_module
from synapse_ha.worker.agent import Agent
from synapse_ha.worker.environment import PREEMPT_FILE_ENV
from synapse_ha.worker.lease import LeaseFile
from synapse_ha.worker.member_dirs import MemberExit
from synapse_ha.worker.members import Member, PreemptNotice
from tests.worker.conftest import MakeExecutor
from tests.worker.helpers import FakeClock, Fifo, process_gone, spec, wait_gone
from tests.worker.test_agent import FakeControl, FakeExecutor, desired

# Long enough that only the notice's grace (or the lease) can end a member in a test.
NEVER_S = 3600.0


def finish(member: Member, executor_poll: object, timeout_s: float = 15.0) -> MemberExit:
    assert member.shim is not None
    member.shim.wait(timeout=timeout_s)
    assert callable(executor_poll)
    executor_poll()
    assert member.exit is not None
    return member.exit


def test_a_member_that_traps_sigterm_reads_the_notice_and_exits(
    make_executor: MakeExecutor, fifo: Fifo
) -> None:
    executor = make_executor(stop_grace_s=NEVER_S)
    marker = f"{fifo.path}.notice"
    script = (
        f"trap 'cat \"${PREEMPT_FILE_ENV}\" > {marker}; echo done > {fifo.path}; exit 0' TERM; "
        f'echo "${PREEMPT_FILE_ENV}" > {fifo.path}; sleep 300 & wait'
    )
    member = executor.start(spec(script))
    notice_path = fifo.read_line()
    assert notice_path == str(member.dir / "preempt.json")
    executor.preempt(member.key, PreemptNotice("reclaim", "job-000009", 10_000))
    executor.preempt(member.key, PreemptNotice("reclaim", "job-000009", 10_000))  # idempotent
    assert fifo.read_line() == "done"  # the trap ran: SIGTERM reached the member
    with open(marker, encoding="utf-8") as f:
        seen = json.load(f)
    assert seen == {
        "kind": "reclaim",
        "preemptor": "job-000009",
        "grace_ms": 10_000,
        "checkpoint": True,
    }
    result = finish(member, executor.poll)
    assert result.exit_code == 143  # stopped by the worker, even though it exited 0
    assert result.disrupted  # never the job's failure
    assert result.detail == "preempted (reclaim) for job job-000009: stopped by the worker"


def test_a_notice_that_a_full_disk_refuses_still_stops_the_member(
    make_executor: MakeExecutor, fifo: Fifo, monkeypatch: pytest.MonkeyPatch
) -> None:
    executor = make_executor(stop_grace_s=1.0)
    member = executor.start(spec(f"echo $$ > {fifo.path}; sleep 300 & wait"))
    pid = int(fifo.read_line())

    def full(path: object, doc: object, mode: int = 0o600) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(members_module, "write_json_atomic", full)
    executor.preempt(member.key, PreemptNotice("priority", "job-000004", 300))
    result = finish(member, executor.poll)
    assert result.exit_code == 143  # stopped by the worker: never a success
    assert process_gone(pid)
    assert not (member.dir / "preempt.json").exists()


def test_a_member_that_ignores_sigterm_is_killed_when_the_grace_ends(
    make_executor: MakeExecutor, fifo: Fifo
) -> None:
    executor = make_executor(stop_grace_s=NEVER_S)
    member = executor.start(spec(f"trap '' TERM; echo $$ > {fifo.path}; sleep 300 & wait"))
    pid = int(fifo.read_line())
    executor.preempt(member.key, PreemptNotice("priority", "job-000004", 300))
    result = finish(member, executor.poll)
    assert result.exit_code == 137  # SIGKILL after the notice's 300 ms, not stop_grace_s
    assert result.disrupted and "preempted (priority)" in result.detail
    assert process_gone(pid)
    assert json.loads((member.dir / "preempt.json").read_text())["grace_ms"] == 300


def test_the_lease_ends_a_long_grace(make_executor: MakeExecutor, fifo: Fifo) -> None:
    executor = make_executor(stop_grace_s=NEVER_S)
    member = executor.start(spec(f"trap '' TERM; echo $$ > {fifo.path}; sleep 300 & wait"))
    pid = int(fifo.read_line())
    executor.preempt(member.key, PreemptNotice("reclaim", "job-000002", int(NEVER_S * 1000)))
    LeaseFile(executor.lease_path).write(time.monotonic())  # the lease lapses now
    wait_gone([pid], bound_s=15.0)
    assert finish(member, executor.poll).exit_code == 137


def test_a_plain_stop_is_not_a_preemption(make_executor: MakeExecutor, fifo: Fifo) -> None:
    executor = make_executor(stop_grace_s=2.0)
    member = executor.start(spec(f"trap 'exit 0' TERM; echo up > {fifo.path}; sleep 300 & wait"))
    fifo.read_line()
    executor.stop(member.key)
    executor.preempt(member.key, PreemptNotice("reclaim", "job-9", 1000))  # too late: no-op
    result = finish(member, executor.poll)
    assert (result.exit_code, result.detail, result.disrupted) == (
        143,
        "stopped by the worker",
        False,
    )
    assert not (member.dir / "preempt.json").exists()


# --------------------------------------------------------------------------- agent


class PreemptingExecutor(FakeExecutor):
    def __init__(self) -> None:
        super().__init__()
        self.preempted: list[tuple[str, int, int, PreemptNotice]] = []
        self.never_run: list[tuple[object, PreemptNotice]] = []

    def start(self, spec: DesiredMember, preempted: PreemptNotice | None = None) -> object:
        if preempted is None:
            return super().start(spec)
        self.known.add(spec.key)
        self.never_run.append((spec.key, preempted))
        self.exits.append((spec.key, MemberExit(143, "preempted before it started", 0, True)))
        return spec

    def preempt(self, key: object, notice: PreemptNotice) -> None:
        assert isinstance(key, tuple)
        self.preempted.append((key[0], key[1], key[2], notice))


def _preempted(d: pb.DesiredMember, grace_ms: int) -> pb.DesiredMember:
    out = pb.DesiredMember()
    out.CopyFrom(d)
    out.preemption, out.preempted_by, out.preempt_grace_ms = "reclaim", "job-9", grace_ms
    return out


def test_the_agent_preempts_running_members_and_never_starts_preempted_ones() -> None:
    clock = FakeClock()
    control = FakeControl(clock)
    executor = PreemptingExecutor()
    agent = Agent(pb.RegisterNodeRequest(node_id="n1"), control, executor, clock)
    control.desired = [desired("job-1", 5, 0)]
    agent.step()
    agent.step()
    assert executor.started == [MemberKey("job-1", 5, 0)]
    control.desired = [
        _preempted(desired("job-1", 5, 0), 4_000),
        _preempted(desired("job-2", 7, 0), 4_000),
    ]
    clock.advance(1.0)
    said = agent.step()
    assert "1 member(s) being preempted" in said
    assert executor.preempted == [("job-1", 5, 0, PreemptNotice("reclaim", "job-9", 4_000))]
    # Preempted before it ever started here: never run, but recorded with an exit.
    assert MemberKey("job-2", 7, 0) not in executor.started
    assert executor.never_run == [
        (MemberKey("job-2", 7, 0), PreemptNotice("reclaim", "job-9", 4_000))
    ]
    assert executor.stopped == []  # still desired: stopped through the preemption only
    clock.advance(1.0)
    agent.step()
    sent = control.heartbeats[-1]
    assert [(r.job_id, r.kind, r.cause) for r in sent.reports if r.job_id == "job-2"] == [
        ("job-2", pb.MemberReport.STARTED, pb.MemberReport.PROGRAM),
        ("job-2", pb.MemberReport.EXITED, pb.MemberReport.LOST),
    ]
    agent.step()
    assert len(executor.never_run) == 1  # never again


def test_a_member_preempted_before_it_started_never_runs(make_executor: MakeExecutor) -> None:
    executor = make_executor()
    notice = PreemptNotice("priority", "job-000005", 2_000)
    member = executor.start(spec("echo ran > /dev/stderr; exit 0"), notice)
    assert member.shim is None  # nothing was started
    assert member.key in executor.known
    ((key, exit_),) = executor.poll()
    assert key == member.key
    assert (exit_.exit_code, exit_.disrupted) == (143, True)
    assert exit_.detail == "preempted (priority) for job job-000005 before it started"
