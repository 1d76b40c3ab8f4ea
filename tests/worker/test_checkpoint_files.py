"""Checkpoint marks on the worker: every member gets ``$SYNAPSE_CHECKPOINT_FILE`` (and
``$SYNAPSE_RESUME_STEP`` when its gang resumes from a step); a line written to it is a
mark, reported once, with the step the line carried; a mark written just before the
member exits is reported before its exit."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from synapse_ha.core.desired import MemberKey
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb
from synapse_ha.rpc.to_proto import desired_to_proto
from synapse_ha.worker.agent import Agent, AgentTimings, ControlPlaneUnreachable
from synapse_ha.worker.checkpoint_files import (
    TAIL_BYTES,
    CheckpointWatches,
    Mark,
    last_line,
    parse_step,
)
from synapse_ha.worker.environment import CHECKPOINT_FILE_ENV, RESUME_STEP_ENV, member_environment
from tests.worker.conftest import MakeExecutor
from tests.worker.helpers import FakeClock, Fifo, spec
from tests.worker.test_agent import FakeControl, FakeExecutor, desired


@pytest.mark.parametrize(
    ("line", "step"),
    [
        ("1200", 1200),
        ("step 1200", 1200),
        ("  Step: 7 ", 7),
        ("step=0", 0),
        ("", None),
        ("saved epoch three", None),
        ("-5", None),
        ("step 12 of 40", None),
        ("9" * 30, None),
    ],
)
def test_the_step_of_a_marks_line(line: str, step: int | None) -> None:
    assert parse_step(line) == step


def test_the_last_non_empty_line_is_the_mark() -> None:
    assert last_line(b"step 1\nstep 2\n\n") == "step 2"
    assert last_line(b"\xff\xfe broken\n") == "\ufffd\ufffd broken"
    assert last_line(b"") == ""


def test_a_watch_reports_each_change_once_and_reads_only_the_files_end(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint"
    path.touch()
    key = MemberKey("j", 1, 0)
    watches = CheckpointWatches()
    watches.watch(key, path)
    assert watches.poll([key]) == []  # empty: no mark yet
    with path.open("a") as f:
        f.write("x" * (TAIL_BYTES * 3) + "\nstep 40\n")
    assert watches.poll([key]) == [(key, Mark(1, 40))]
    assert watches.poll([key]) == []
    with path.open("a") as f:
        f.write("done\n")
    assert watches.poll([key]) == [(key, Mark(2, None))]
    path.unlink()
    os.symlink("/etc/passwd", path)  # never followed
    assert watches.poll([key]) == []
    watches.forget(key)
    assert watches.poll([key]) == []


def test_the_resume_step_is_a_member_variable_only_when_there_is_one() -> None:
    assert RESUME_STEP_ENV not in member_environment(spec("true"), {})
    env = member_environment(spec("true", resume_step=1200), {})
    assert env[RESUME_STEP_ENV] == "1200"


def test_a_real_member_marks_through_its_checkpoint_file(
    make_executor: MakeExecutor, fifo: Fifo
) -> None:
    executor = make_executor()
    command = (
        'echo "step 7" >> "$SYNAPSE_CHECKPOINT_FILE"; '
        f'echo "$SYNAPSE_RESUME_STEP $SYNAPSE_CHECKPOINT_FILE" > {fifo.path}; sleep 300'
    )
    member = executor.start(spec(command, resume_step=5))
    resume, path = fifo.read_line().split()
    assert resume == "5"
    assert path == str(member.dir / "checkpoint")
    launch = (member.dir / "launch.json").read_text()
    assert CHECKPOINT_FILE_ENV in launch
    assert executor.marks([member.key]) == [(member.key, Mark(1, 7))]
    assert executor.marks([member.key]) == []


def test_a_mark_written_just_before_a_failing_exit_is_reported_before_the_exit(
    make_executor: MakeExecutor,
) -> None:
    executor = make_executor()
    control = FakeControl(FakeClock())
    member = spec('echo "step 5" >> "$SYNAPSE_CHECKPOINT_FILE"; exit 1', job_id="j", token=3)
    control.desired = [desired_to_proto(member)]
    agent = Agent(
        pb.RegisterNodeRequest(node_id="n1", address="127.0.0.1:7070"),
        control,
        executor,
        time.monotonic,
        timings=AgentTimings(heartbeat_interval_s=0.05, lease_ttl_s=30.0),
        checkpoint_marks=executor.marks,
    )
    deadline = time.monotonic() + 20
    sent: list[pb.MemberReport] = []
    while time.monotonic() < deadline and not any(r.kind == pb.MemberReport.EXITED for r in sent):
        agent.step()
        sent = [r for hb in control.heartbeats for r in hb.reports]
        time.sleep(0.02)
    kinds = [r.kind for r in sent]
    assert kinds == [pb.MemberReport.STARTED, pb.MemberReport.CHECKPOINT, pb.MemberReport.EXITED]
    mark = sent[1]
    assert (mark.job_id, mark.fencing_token, mark.rank) == ("j", 3, 0)
    assert mark.HasField("checkpoint_step") and mark.checkpoint_step == 5
    assert mark.checkpoint_seq == 1
    assert sent[2].exit_code == 1


def test_an_unacknowledged_mark_is_replaced_by_the_members_newer_one() -> None:
    clock = FakeClock()
    control = FakeControl(clock)
    executor = FakeExecutor()
    key = MemberKey("j", 5, 0)
    waiting: list[tuple[MemberKey, Mark]] = []

    def marks(keys: Sequence[MemberKey]) -> list[tuple[MemberKey, Mark]]:
        out = [(k, m) for k, m in waiting if k in keys]
        waiting.clear()
        return out

    agent = Agent(
        pb.RegisterNodeRequest(node_id="n1", address="127.0.0.1:7070"),
        control,
        executor,
        clock,
        timings=AgentTimings(heartbeat_interval_s=1.0, lease_ttl_s=4.0),
        checkpoint_marks=marks,
    )
    control.desired = [desired("j", 5, 0)]
    agent.step()  # registers, starts the member
    control.fail = ControlPlaneUnreachable("no leader")
    for seq, step in ((1, 10), (2, 20)):
        waiting.append((key, Mark(seq, step)))
        clock.advance(1.0)
        agent.step()
    sent = control.heartbeats[-1].reports
    assert [(r.kind, r.checkpoint_seq) for r in sent] == [
        (pb.MemberReport.STARTED, 0),
        (pb.MemberReport.CHECKPOINT, 2),
    ]
    assert sent[1].checkpoint_step == 20
    control.fail = None
    clock.advance(1.0)
    agent.step()
    assert agent.pending == []  # acknowledged: never sent again
