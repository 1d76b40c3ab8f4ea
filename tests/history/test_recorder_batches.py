"""The recorder off the hot path: an applied entry's events reach the ring in one piece
and its records the writer as one batch, the writer is woken once for many batches, and
a finished job's spec is stored as the bytes of the command that submitted it."""

from __future__ import annotations

import dataclasses
import sqlite3
from pathlib import Path

from synapse_ha.core import commands as c
from synapse_ha.core.cluster_config import ClusterConfig, PriorityClass
from synapse_ha.core.codec.formats import FORMAT
from synapse_ha.core.codec.versioned import encode_command
from synapse_ha.history.events import EventRing
from synapse_ha.history.recorder import HistoryRecorder
from synapse_ha.history.store import FILE_NAME, HistoryFilter, HistoryStore
from synapse_ha.history.submissions import ENTRY_BYTES
from synapse_ha.history.tracker import Event, Tracker
from synapse_ha.raft.batch import frame
from synapse_ha.raft.replicated_state import ReplicatedState
from tests.core.harness import job, node


class CountingRing(EventRing):
    """An event ring that counts the appends it was given."""

    def __init__(self) -> None:
        super().__init__(1000)
        self.appends = 0

    def extend(self, events: list[Event]) -> None:
        self.appends += 1
        super().extend(events)


def recorder_in(data: Path, linger_s: float = 0.05) -> HistoryRecorder:
    return HistoryRecorder(HistoryStore(data / FILE_NAME), CountingRing(), linger_s=linger_s)


def started() -> list[c.Command]:
    """The cluster's format raised (as by its leader) and a node."""
    return [c.RaiseFormat(FORMAT), c.RegisterNode(node("n1", gpus=8), now_ms=1)]


def submit_and_cancel(count: int) -> list[bytes]:
    """A started cluster, then ``count`` submissions each followed by the cancellation
    of its job (jobs that wait: no node has 64 GPUs)."""
    commands = started()
    for i in range(count):
        commands.append(
            c.SubmitJob(job(f"j{i}", gpu=64, wait_for_nodes=True), f"req-{i}", 10 + i, "alice")
        )
        commands.append(c.CancelJob(f"job-{i + 1:06d}", now_ms=10 + i, actor="alice"))
    return [encode_command(command) for command in commands]


def test_an_entry_is_one_append_and_one_batch_with_the_same_events(tmp_path: Path) -> None:
    items = submit_and_cancel(3)
    one = recorder_in(tmp_path / "one")
    each = recorder_in(tmp_path / "each")
    try:
        ReplicatedState(observer=one).apply_commands(frame(items), _doApply=True)
        machine = ReplicatedState(observer=each)
        for item in items:
            machine._apply_one(item)
        assert isinstance(one.ring, CountingRing) and isinstance(each.ring, CountingRing)
        assert (one.ring.appends, each.ring.appends) == (1, len(items))
        assert one.queued_batches == 1
        assert each.queued_batches == 3  # each cancellation on its own
        assert one.ring.after(0) == each.ring.after(0)
        assert [str(e.kind) for e in one.ring.after(0)].count("cancelled") == 3
        assert one.flush(30.0) and each.flush(30.0)
        assert one.store is not None and each.store is not None
        assert one.store.jobs(HistoryFilter()) == each.store.jobs(HistoryFilter())
        assert one.store.count() == 3
        assert one.errors == each.errors == 0
    finally:
        one.close()
        each.close()


def test_the_writer_is_woken_once_for_many_batches(tmp_path: Path) -> None:
    # A linger far longer than the test: only the flush ends it.
    recorder = recorder_in(tmp_path, linger_s=3600.0)
    try:
        machine = ReplicatedState(observer=recorder)
        items = submit_and_cancel(50)
        for start in range(0, len(items), 2):  # an entry per submission and its cancel
            machine.apply_commands(frame(items[start : start + 2]), _doApply=True)
        assert recorder.queued_batches == 50
        assert recorder.flush(30.0)
        assert (recorder.wakeups, recorder.writes) == (1, 1)
        assert recorder.store is not None and recorder.store.count() == 50
    finally:
        recorder.close()
    assert recorder._writer is None  # the stop cut the linger short


def test_what_is_queued_when_the_recorder_closes_is_written(tmp_path: Path) -> None:
    recorder = recorder_in(tmp_path, linger_s=3600.0)
    machine = ReplicatedState(observer=recorder)
    machine.apply_commands(frame(submit_and_cancel(5)), _doApply=True)
    recorder.close()
    store = HistoryStore(tmp_path / FILE_NAME)
    try:
        assert store.count() == 5
    finally:
        store.close()


def stored_specs(path: Path) -> dict[str, tuple[str, bytes | None]]:
    db = sqlite3.connect(path)
    try:
        rows = db.execute("SELECT job_id, spec, submission FROM jobs").fetchall()
    finally:
        db.close()
    return {r[0]: (r[1], r[2]) for r in rows}


def test_a_spec_is_stored_as_the_bytes_of_its_submission(tmp_path: Path) -> None:
    recorder = recorder_in(tmp_path)
    spec = dataclasses.replace(job("sweep", gpu=64, wait_for_nodes=True), array="0-1")
    submit = c.SubmitJob(spec, "req-a", 10, "alice")
    single = c.SubmitJob(job("single", gpu=64, wait_for_nodes=True), "req-s", 12, "alice")
    commands = [
        *started(),
        submit,
        c.CancelJob("job-000001", now_ms=11),
        single,
        c.CancelJob("job-000002", now_ms=13),
    ]
    items = [encode_command(command) for command in commands]
    try:
        results = ReplicatedState(observer=recorder).apply_commands(frame(items), _doApply=True)
        assert all(r.ok for r in results), [r.message for r in results]
        assert recorder.flush(30.0)
        assert recorder.store is not None
        rows = {j.job_id: j for j in recorder.store.jobs(HistoryFilter())}
    finally:
        recorder.close()
    assert sorted(rows) == ["job-000001_0", "job-000001_1", "job-000002"]
    assert rows["job-000001_0"].spec == rows["job-000001_1"].spec == spec
    assert rows["job-000002"].spec == single.spec
    stored = stored_specs(tmp_path / FILE_NAME)
    assert stored["job-000001_0"] == stored["job-000001_1"] == ("", items[2])
    assert stored["job-000002"] == ("", items[4])


def test_a_spec_the_submission_changed_is_stored_as_itself(tmp_path: Path) -> None:
    """A priority class's value replaces the spec's ``priority``: the stored spec is the
    job's, not the command's."""
    config = ClusterConfig(priority_classes=(PriorityClass("high", 500),), retention_ms=0)
    spec = dataclasses.replace(job("classy", gpu=64, wait_for_nodes=True), priority_class="high")
    commands = [
        *started(),
        c.Configure(config, now_ms=1),
        c.SubmitJob(spec, "req-p", 10, "alice"),
        c.CancelJob("job-000001", now_ms=11),
    ]
    items = [encode_command(command) for command in commands]
    recorder = recorder_in(tmp_path)
    try:
        machine = ReplicatedState(observer=recorder)
        results = machine.apply_commands(frame(items), _doApply=True)
        assert all(r.ok for r in results), [r.message for r in results]
        assert recorder.flush(30.0)
        assert recorder.store is not None
        (row,) = recorder.store.jobs(HistoryFilter())
    finally:
        recorder.close()
    assert row.spec == dataclasses.replace(spec, priority=500)
    plain, submission = stored_specs(tmp_path / FILE_NAME)["job-000001"]
    assert plain and submission is None


def test_the_oldest_kept_submissions_give_way_to_the_budget(tmp_path: Path) -> None:
    first = c.SubmitJob(job("first", gpu=64, wait_for_nodes=True), "req-1", 10, "alice")
    second = c.SubmitJob(job("second", gpu=64, wait_for_nodes=True), "req-2", 11, "alice")
    commands = [
        *started(),
        first,
        second,
        c.CancelJob("job-000001", now_ms=12),
        c.CancelJob("job-000002", now_ms=12),
    ]
    items = [encode_command(command) for command in commands]
    tracker = Tracker()
    tracker.submissions.budget_bytes = len(items[3]) + ENTRY_BYTES  # room for one
    recorder = HistoryRecorder(HistoryStore(tmp_path / FILE_NAME), tracker=tracker)
    try:
        ReplicatedState(observer=recorder).apply_commands(frame(items), _doApply=True)
        assert recorder.flush(30.0)
        assert recorder.store is not None
        rows = {j.job_id: j for j in recorder.store.jobs(HistoryFilter())}
    finally:
        recorder.close()
    assert (tracker.submissions.dropped, len(tracker.submissions)) == (1, 0)
    assert tracker.submissions.kept_bytes == 0
    assert (rows["job-000001"].spec, rows["job-000002"].spec) == (first.spec, second.spec)
    stored = stored_specs(tmp_path / FILE_NAME)
    assert stored["job-000001"][0] and stored["job-000001"][1] is None
    assert stored["job-000002"] == ("", items[3])
