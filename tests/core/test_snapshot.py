"""Copy-on-write snapshots: after any command sequence a snapshot equals the live state,
and a snapshot once taken never changes, whatever is applied afterwards (every record a
command changes was copied before it changed it)."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import invariant, rule

from synapse_ha.core import commands as c
from synapse_ha.core import snapshot
from synapse_ha.core.codec.versioned import encode_command, encode_state
from synapse_ha.core.machine import HANDLERS, apply
from synapse_ha.core.model import ClusterState, NodeStatus
from synapse_ha.core.scheduler import schedule
from synapse_ha.core.snapshot import SnapshotBuilder, apply_tracked, full_copy
from tests.core.harness import job, node
from tests.core.test_properties import ClusterMachine, live_by_scan, node_index_by_scan


class SnapshotMachine(ClusterMachine):
    """Every rule of the property machine, applied with change tracking; snapshots are
    taken at random moments, so changes from several commands accumulate between them."""

    def __init__(self) -> None:
        super().__init__()
        self.builder = SnapshotBuilder()
        self.kept: list[tuple[ClusterState, bytes]] = []

    def do(self, command: c.Command) -> c.Result:
        self.log.append(encode_command(command))
        result = apply_tracked(self.state, command, self.builder.changes)
        assert result.code is not c.ResultCode.INTERNAL, result.message
        return result

    @rule(keep=st.booleans())
    def take_snapshot(self, keep: bool) -> None:
        snap = self.builder.take(self.state)
        encoded = encode_state(snap)
        assert encoded == encode_state(self.state)
        assert list(snap.jobs) == list(self.state.jobs)  # same (submission) order
        assert list(snap.nodes) == list(self.state.nodes)
        # Taking one copies no record: it shares the live ones until a command changes one.
        for node_id, record in snap.nodes.items():
            assert record is self.state.nodes[node_id]
        for job_id, record in snap.jobs.items():
            assert record is self.state.jobs[job_id]
        assert snap.live_ids() == live_by_scan(snap)  # the index taken with it
        assert snap.live_ids() is not self.state.live_ids()
        assert snap.node_index() == node_index_by_scan(snap)
        assert snap.node_index() is not self.state.node_index()
        if keep:
            self.kept = [*self.kept[-4:], (snap, encoded)]

    @rule()
    def plan_on_a_snapshot(self) -> None:
        snap = self.builder.take(self.state)
        on_snapshot = schedule(snap, self.now)
        assert on_snapshot == schedule(self.state, self.now)

    @invariant()
    def kept_snapshots_never_change(self) -> None:
        for snap, encoded in self.kept:
            assert encode_state(snap) == encoded
            assert snap.live_ids() == live_by_scan(snap)
            assert snap.node_index() == node_index_by_scan(snap)


SnapshotMachine.TestCase.settings = settings(
    max_examples=100,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestSnapshotMachine = SnapshotMachine.TestCase


def test_every_command_type_says_what_it_touches() -> None:
    # Declared beside each handler; the snapshot's table is built from the declarations
    # (the state machine above checks, on runs of every command, that they hold).
    missing = [t.__name__ for t in c.COMMAND_TYPES if t not in snapshot._TOUCHES]
    assert missing == []
    assert set(HANDLERS) == set(c.COMMAND_TYPES) == set(snapshot._TOUCHES)


def test_an_unchanged_state_gives_the_same_snapshot_and_shares_untouched_records() -> None:
    state = ClusterState()
    builder = SnapshotBuilder()
    for n in ("a", "b"):
        apply_tracked(state, c.RegisterNode(node(n, gpus=4), 1), builder.changes)
    first = builder.take(state)
    assert builder.take(state) is first
    apply_tracked(state, c.SubmitJob(job("j", gpu=1), "r1", 2), builder.changes)
    second = builder.take(state)
    assert second is not first
    assert second.nodes["a"] is first.nodes["a"]  # untouched: shared, not copied
    assert "job-000001" in second.jobs and "job-000001" not in first.jobs


def test_a_changed_record_is_copied_once_and_the_snapshot_keeps_the_old_one() -> None:
    state = ClusterState()
    builder = SnapshotBuilder()
    apply_tracked(state, c.RegisterNode(node("a", gpus=4), 1), builder.changes)
    apply_tracked(state, c.SubmitJob(job("j", gpu=2), "r1", 2), builder.changes)
    first = builder.take(state)
    before = encode_state(first)
    bind = schedule(state, 3).command(3)
    assert bind is not None and apply_tracked(state, bind, builder.changes).ok
    node_a = state.nodes["a"]
    assert node_a is not first.nodes["a"]  # copied before the bind changed it
    assert first.nodes["a"].allocated.gpu == 0 and node_a.allocated.gpu == 2
    job_id = next(iter(state.jobs))
    report = c.ReportMembers("a", (c.MemberEvent(job_id, 1, 0, c.MemberEventKind.STARTED),), 0, 4)
    apply_tracked(state, report, builder.changes)
    assert state.nodes["a"] is node_a  # owned since the snapshot: not copied again
    assert encode_state(first) == before
    assert encode_state(builder.take(state)) == encode_state(state)


def test_an_unknown_command_type_makes_every_record_private_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    state = ClusterState()
    builder = SnapshotBuilder()
    for n in ("a", "b"):
        apply_tracked(state, c.RegisterNode(node(n, gpus=4), 1), builder.changes)
    first = builder.take(state)
    before = encode_state(first)
    monkeypatch.delitem(snapshot._TOUCHES, c.SetNodeStatus)
    command = c.SetNodeStatus("a", NodeStatus.CORDONED, "maintenance", 2)
    assert apply_tracked(state, command, builder.changes).ok
    assert builder.changes.everything and builder.changes.own_all
    assert all(state.nodes[n] is not first.nodes[n] for n in ("a", "b"))
    assert encode_state(first) == before  # the snapshot still has "a" ready
    assert first.nodes["a"].status is NodeStatus.READY
    assert encode_state(builder.take(state)) == encode_state(state)


def _mutable_parts(value: object) -> list[object]:
    """Every mutable object reachable from ``value`` (lists, sets, dicts and dataclasses
    that are not frozen), depth first in field order."""
    found: list[object] = []

    def walk(v: object) -> None:
        if isinstance(v, dict):
            found.append(v)
            for item in v.values():
                walk(item)
        elif isinstance(v, list | set):
            found.append(v)
            for item in v:
                walk(item)
        elif isinstance(v, tuple):
            for item in v:
                walk(item)
        elif dataclasses.is_dataclass(v) and not isinstance(v, type):
            if not type(v).__dataclass_params__.frozen:  # type: ignore[attr-defined]
                found.append(v)
            for f in dataclasses.fields(v):
                walk(getattr(v, f.name))

    walk(value)
    return found


def test_a_full_copy_is_equal_and_shares_no_mutable_part() -> None:
    state = ClusterState()
    for n in ("a", "b"):
        apply(state, c.RegisterNode(node(n, gpus=4), 1))
    for i in range(3):
        apply(state, c.SubmitJob(job(f"j{i}", replicas=2, gpu=2), f"r{i}", 2))
    bind = schedule(state, 3).command(3)
    assert bind is not None and apply(state, bind).ok
    copied = full_copy(state)
    assert encode_state(copied) == encode_state(state)
    ours, theirs = _mutable_parts(state), _mutable_parts(copied)
    assert len(ours) == len(theirs) > 20  # nodes, jobs, attempts, members, GPU sets
    assert not {id(p) for p in ours} & {id(p) for p in theirs}
