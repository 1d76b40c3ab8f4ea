"""Each job version's API message is converted once and follows every change."""

from __future__ import annotations

import pytest

from synapse_ha.core import commands as c
from synapse_ha.core.codec.formats import FORMAT
from synapse_ha.core.model import ClusterState
from synapse_ha.core.snapshot import SnapshotBuilder, apply_tracked
from synapse_ha.rpc import to_proto
from synapse_ha.rpc.server.job_messages import JobMessages, JobOrder
from tests.core.harness import job, node


class Live:
    """A live state changed through ``apply_tracked`` and read through snapshots, as a
    replica serves reads."""

    def __init__(self) -> None:
        self.state = ClusterState()
        self.builder = SnapshotBuilder()
        self.now = 1_000
        self.do(c.RaiseFormat(FORMAT))
        self.do(c.RegisterNode(node("a", gpus=4), self.now))

    def do(self, command: c.Command) -> c.Result:
        result = apply_tracked(self.state, command, self.builder.changes)
        assert result.ok, result.message
        return result

    def snapshot(self) -> ClusterState:
        return self.builder.take(self.state)


def test_a_message_is_the_conversion_and_is_converted_once() -> None:
    live = Live()
    job_id = live.do(c.SubmitJob(job("j", gpu=1), "r1", live.now)).job_id
    messages = JobMessages()
    first = live.snapshot().jobs[job_id]
    message = messages.of(first, redacted=False)
    assert message == to_proto.job_to_proto(first)
    # The same version, read from a later snapshot: the same message, not a new one.
    again = live.snapshot().jobs[job_id]
    assert again is first
    assert messages.of(again, redacted=False) is message
    assert len(messages) == 1


def test_a_changed_job_gets_a_new_message() -> None:
    live = Live()
    job_id = live.do(c.SubmitJob(job("j", gpu=1), "r1", live.now)).job_id
    messages = JobMessages()
    before = messages.of(live.snapshot().jobs[job_id], redacted=False)
    live.do(c.CancelJob(job_id, "no longer needed", live.now))
    after_job = live.snapshot().jobs[job_id]
    after = messages.of(after_job, redacted=False)
    assert after == to_proto.job_to_proto(after_job)
    assert after.state != before.state
    assert "no longer needed" in after.reason


def test_redacted_and_whole_messages_are_kept_apart() -> None:
    live = Live()
    job_id = live.do(c.SubmitJob(job("j", gpu=1), "r1", live.now)).job_id
    record = live.snapshot().jobs[job_id]
    messages = JobMessages()
    whole = messages.of(record, redacted=False)
    redacted = messages.of(record, redacted=True)
    assert not whole.redacted and whole.spec.shell_command == "echo $RANK"
    assert redacted.redacted and not redacted.spec.shell_command
    assert messages.of(record, redacted=False) is whole


def test_memory_is_bounded_by_two_generations() -> None:
    live = Live()
    for i in range(7):
        live.do(c.SubmitJob(job(f"j{i}"), f"r{i}", live.now))
    records = list(live.snapshot().jobs.values())
    messages = JobMessages(generation=3)
    for record in records:
        messages.of(record, redacted=False)
    assert len(messages) <= 6
    # The newest are still kept; the oldest were dropped and convert again.
    newest = messages.of(records[-1], redacted=False)
    assert messages.of(records[-1], redacted=False) is newest
    assert messages.of(records[0], redacted=False) == to_proto.job_to_proto(records[0])


def test_a_generation_must_hold_a_message() -> None:
    with pytest.raises(ValueError, match="generation: at least 1, got 0"):
        JobMessages(generation=0)


def test_a_snapshot_s_jobs_are_sorted_once_and_again_for_the_next_snapshot() -> None:
    live = Live()
    for i in range(3):
        live.do(c.SubmitJob(job(f"j{i}", gpu=1), f"r{i}", live.now))
    order = JobOrder()
    snap = live.snapshot()
    first = order.of(snap)
    assert [j.spec.name for j in first] == ["j0", "j1", "j2"]
    assert order.of(live.snapshot()) is first  # the same snapshot: sorted once
    live.do(c.SubmitJob(job("j3", gpu=1), "r3", live.now))
    again = order.of(live.snapshot())
    assert again is not first
    assert [j.spec.name for j in again] == ["j0", "j1", "j2", "j3"]


def test_the_order_is_submission_order_whatever_the_dictionary_s() -> None:
    live = Live()
    for i in range(3):
        live.do(c.SubmitJob(job(f"j{i}", gpu=1), f"r{i}", live.now))
    snap = live.snapshot()
    reordered = ClusterState(jobs=dict(reversed(list(snap.jobs.items()))))
    names = [j.spec.name for j in JobOrder().of(reordered)]
    assert names == ["j0", "j1", "j2"]
