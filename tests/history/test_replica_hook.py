"""The Raft consumer's apply observer, with a real history recorder (no network): events
and history from applied commands, the retention purge, and a snapshot round trip."""

from __future__ import annotations

from pathlib import Path

from synapse_ha.core import commands as c
from synapse_ha.core.cluster_config import ClusterConfig
from synapse_ha.core.codec.versioned import encode_command
from synapse_ha.core.model import ClusterState
from synapse_ha.history.recorder import HistoryRecorder
from synapse_ha.history.store import HistoryFilter
from synapse_ha.raft.replicated_state import ReplicatedState
from tests.core.harness import job, node


class Replica:
    def __init__(self, data: Path) -> None:
        self.recorder = HistoryRecorder.in_dir(data, capacity=1000)
        self.machine = ReplicatedState(observer=self.recorder)
        self.now = 1_000

    def do(self, command: c.Command) -> c.Result:
        return self.machine._apply_one(encode_command(command))

    def close(self) -> None:
        self.recorder.close()


def run_one_job(r: Replica) -> str:
    assert r.do(c.Configure(ClusterConfig(retention_ms=0), now_ms=r.now)).ok
    assert r.do(c.RegisterNode(node("n1", gpus=8), now_ms=r.now)).ok
    job_id = r.do(c.SubmitJob(job("hist", gpu=2), "req-1", r.now, owner="alice")).job_id
    placement = c.GangPlacement(job_id, 0, (c.MemberPlacement(0, "n1", (0, 1)),))
    r.now += 100
    assert r.do(c.BindPlan((placement,), now_ms=r.now)).bound == (job_id,)
    token = r.machine.state.jobs[job_id].fencing_token
    started = c.MemberEvent(job_id, token, 0, c.MemberEventKind.STARTED)
    exited = c.MemberEvent(job_id, token, 0, c.MemberEventKind.EXITED)
    r.now += 100
    r.do(c.ReportMembers("n1", (started,), now_ms=r.now))
    r.now += 5_000
    r.do(c.ReportMembers("n1", (exited,), now_ms=r.now))
    return job_id


def test_history_outlives_the_retention_purge(tmp_path: Path) -> None:
    r = Replica(tmp_path)
    try:
        job_id = run_one_job(r)
        assert r.do(c.PurgeFinished(now_ms=r.now + 1)).purged == (job_id,)
        assert job_id not in r.machine.state.jobs
        assert r.recorder.flush(30.0)
        assert r.recorder.store is not None
        (row,) = r.recorder.store.jobs(HistoryFilter())
        assert (row.job_id, row.owner, row.state) == (job_id, "alice", "SUCCEEDED")
        assert row.gpu_ms == 2 * 5_100
        kinds = [str(e.kind) for e in r.recorder.ring.after(0) if e.job_id == job_id]
        assert kinds == ["submitted", "bound", "started", "exited"]
        assert r.recorder.errors == 0
    finally:
        r.close()


def test_a_snapshot_round_trip_records_nothing_twice(tmp_path: Path) -> None:
    r = Replica(tmp_path / "a")
    try:
        job_id = run_one_job(r)
        dump = str(tmp_path / "raft.dump")
        entry = (b"", r.machine.state.applied_commands, 1)
        r.machine.write_dump(dump, (entry, entry))  # flushes the recorder first
        assert r.recorder.store is not None and r.recorder.store.count() == 1
        r.machine.read_dump(dump)  # as a restart restores it: same rows, once
        assert r.recorder.flush(30.0)
        assert r.recorder.store.count() == 1
        assert [j.job_id for j in r.recorder.store.jobs(HistoryFilter())] == [job_id]
        assert r.recorder.ring.after(r.recorder.ring.complete_after) == []
    finally:
        r.close()


def test_an_observer_that_raises_never_stops_the_log(tmp_path: Path) -> None:
    class Broken:
        def observe(self, *args: object) -> None:
            raise RuntimeError("boom")

        def restored(self, state: ClusterState) -> None:
            raise RuntimeError("boom")

        def flush(self) -> bool:
            return True

    machine = ReplicatedState(observer=Broken())
    result = machine._apply_one(encode_command(c.RegisterNode(node("n1"))))
    assert result.ok
    assert "n1" in machine.state.nodes
    assert "n1" in machine.snapshot().nodes
    dump = str(tmp_path / "raft.dump")
    entry = (b"", machine.state.applied_commands, 1)
    machine.write_dump(dump, (entry, entry))
    machine.read_dump(dump)
    assert "n1" in machine.state.nodes
