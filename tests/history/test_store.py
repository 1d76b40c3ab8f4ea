"""The SQLite history: idempotent writes, filters, usage per day."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from synapse_ha.core import commands as c
from synapse_ha.core.snapshot import AppliedCommand
from synapse_ha.history.recorder import HistoryRecorder
from synapse_ha.history.store import DAY_MS, FILE_NAME, HistoryFilter, HistoryStore
from synapse_ha.history.tracker import AttemptRecord, Tracker
from tests.core.harness import job, node
from tests.history.observed import ObservedCluster


def finished_cluster() -> ObservedCluster:
    """Two users' jobs finished on two nodes; one job retried once."""
    cl = ObservedCluster()
    cl.add(node("n1", gpus=8), node("n2", gpus=8))
    a = cl.do(c.SubmitJob(job("a", gpu=8), "ra", cl.now, owner="alice")).job_id
    b = cl.do(
        c.SubmitJob(job("b", gpu=2, retries=1, backoff_s=0), "rb", cl.now, owner="bob")
    ).job_id
    cl.run_pass()
    cl.start_all(a)
    cl.start_all(b)
    cl.now += 10_000
    cl.exit_member(a, 0, 0)
    cl.exit_member(b, 0, 1)  # bob's first attempt fails; retried
    cl.now += 1_000
    cl.run_pass()
    cl.start_all(b)
    cl.now += 20_000
    cl.exit_member(b, 0, 0)
    return cl


def test_history_rows_and_their_gpu_time(tmp_path: Path) -> None:
    cl = finished_cluster()
    store = HistoryStore(tmp_path / FILE_NAME)
    store.write(cl.attempts, cl.jobs)
    rows = {j.job_id: j for j in store.jobs(HistoryFilter())}
    a, b = rows["job-000001"], rows["job-000002"]
    assert (a.owner, a.state, a.attempts, a.gpu_ms) == ("alice", "SUCCEEDED", 1, 8 * 10_000)
    assert b.attempts == 2 and [x.state for x in b.attempt_list] == ["failed", "succeeded"]
    assert b.gpu_ms == sum(x.gpus * (x.ended_at_ms - x.bound_at_ms) for x in b.attempt_list)
    assert b.gpu_ms == 2 * 10_000 + 2 * 20_000
    assert a.spec.name == "a" and a.spec.resources.gpu == 8
    assert b.started_at_ms == b.attempt_list[0].bound_at_ms


def test_writing_the_same_records_again_adds_nothing(tmp_path: Path) -> None:
    cl = finished_cluster()
    store = HistoryStore(tmp_path / FILE_NAME)
    store.write(cl.attempts, cl.jobs)
    store.write(cl.attempts, cl.jobs)
    replay = Tracker().reset(cl.state)  # what a restored replica writes again
    store.write(replay.attempts, replay.jobs)
    store.close()
    reopened = HistoryStore(tmp_path / FILE_NAME)
    assert reopened.count() == 2
    with reopened.reader() as db:
        assert db.execute("SELECT COUNT(*) FROM attempts").fetchone()[0] == 3


def test_filters(tmp_path: Path) -> None:
    cl = finished_cluster()
    store = HistoryStore(tmp_path / FILE_NAME)
    store.write(cl.attempts, cl.jobs)

    def ids(**kw: object) -> list[str]:
        return [j.job_id for j in store.jobs(HistoryFilter(**kw))]  # type: ignore[arg-type]

    assert ids(owner="alice") == ["job-000001"]
    assert ids(owner="carol") == []
    assert ids(queue="default") == ["job-000002", "job-000001"]  # newest finish first
    node_a = store.jobs(HistoryFilter(owner="alice"))[0].nodes[0]
    assert "job-000001" in ids(node_id=node_a)
    assert ids(node_id="nowhere") == []
    finished_b = store.jobs(HistoryFilter(owner="bob"))[0].finished_at_ms
    assert ids(since_ms=finished_b) == ["job-000002"]
    assert ids(until_ms=finished_b) == ["job-000001"]
    assert ids(limit=1) == ["job-000002"]


def attempt(
    owner: str, queue: str, gpus: int, start: int, end: int, n: int = 1, account: str = ""
) -> AttemptRecord:
    return AttemptRecord(
        job_id=f"job-{owner}-{n}",
        number=1,
        fencing_token=n,
        name="x",
        owner=owner,
        queue=queue,
        state="succeeded",
        nodes=("n1",),
        gpus=gpus,
        bound_at_ms=start,
        started_at_ms=start,
        ended_at_ms=end,
        outcome_code="all_exited_zero",
        outcome=None,
        applied_index=n,
        account=account,
    )


def test_usage_is_split_at_midnight_and_bounded_by_the_period(tmp_path: Path) -> None:
    store = HistoryStore(tmp_path / FILE_NAME)
    day0 = 20_000 * DAY_MS
    hour = 3_600_000
    store.write(
        [
            attempt("alice", "q1", 4, day0 + 22 * hour, day0 + 26 * hour, 1, "six@v100"),
            attempt("bob", "q1", 1, day0 + 1 * hour, day0 + 2 * hour, 2, "six@v100"),
            attempt("bob", "q2", 0, day0, day0 + hour, 3),  # no GPUs: not counted
        ],
        [],
    )
    rows = store.usage("user", day0, day0 + 2 * DAY_MS)
    assert [(r.key, r.day, r.gpu_ms) for r in rows] == [
        ("alice", "2024-10-04", 4 * 2 * hour),
        ("bob", "2024-10-04", 1 * hour),
        ("alice", "2024-10-05", 4 * 2 * hour),
    ]
    by_queue = store.usage("queue", day0 + 23 * hour, day0 + 2 * DAY_MS)
    assert [(r.key, r.gpu_ms) for r in by_queue] == [("q1", 4 * hour), ("q1", 4 * 2 * hour)]
    assert [r.key for r in store.usage("user", day0, day0 + DAY_MS, owner="bob")] == ["bob"]
    by_account = store.usage("account", day0, day0 + DAY_MS)
    assert [(r.key, r.gpu_ms) for r in by_account] == [("six@v100", 4 * 2 * hour + hour)]
    with pytest.raises(ValueError, match="by must be"):
        store.usage("node", day0, day0 + 1)


def test_the_recorder_writes_on_its_own_thread_and_flushes(tmp_path: Path) -> None:
    recorder = HistoryRecorder.in_dir(tmp_path, capacity=100)
    cl = finished_cluster()
    cl.tracker = recorder.tracker
    recorder.restored(cl.state)  # a restored state's finished jobs are written
    assert recorder.flush(timeout_s=30.0)
    assert recorder.store is not None and recorder.store.count() == 2
    assert recorder.errors == 0
    recorder.close()


def test_the_recorder_never_raises_into_the_apply_thread(tmp_path: Path) -> None:
    class Broken(Tracker):
        def step(self, *args: object, **kwargs: object) -> object:  # type: ignore[override]
            raise RuntimeError("boom")

    recorder = HistoryRecorder(None, tracker=Broken())
    cl = ObservedCluster()
    recorder.observe(AppliedCommand(c.Barrier("r1"), c.ok(), cl.state))
    assert recorder.errors == 1
    recorder.close()


def test_a_full_database_raises_its_own_error_and_writes_nothing(tmp_path: Path) -> None:
    store = HistoryStore(tmp_path / FILE_NAME)
    with store.reader() as db:
        pages = db.execute("PRAGMA page_count").fetchone()[0]
    # The file may not grow beyond its current pages: the next write finds it full.
    store._db.execute(f"PRAGMA max_page_count = {pages}")
    many = [attempt("alice", "default", 1, 0, 1_000, n) for n in range(1, 400)]
    with pytest.raises(sqlite3.OperationalError, match="full"):
        store.write(many, [])
    assert not store._db.in_transaction
    with store.reader() as db:
        assert db.execute("SELECT COUNT(*) FROM attempts").fetchone()[0] == 0


def test_a_finished_job_keeps_its_last_checkpoint_mark(tmp_path: Path) -> None:
    cl = ObservedCluster()
    cl.add(node("n1", gpus=8))
    j = cl.do(c.SubmitJob(job("ck", gpu=1), "rc", cl.now, owner="alice")).job_id
    cl.run_pass()
    cl.start_all(j)
    cl.now += 5_000
    token = cl.state.jobs[j].fencing_token
    mark = c.MemberEvent(j, token, 0, c.MemberEventKind.CHECKPOINT, step=300, mark_seq=1)
    cl.do(c.ReportMembers("n1", (mark,), now_ms=cl.now))
    marked_at = cl.now
    cl.now += 1_000
    cl.exit_member(j, 0, 0)
    store = HistoryStore(tmp_path / FILE_NAME)
    store.write(cl.attempts, cl.jobs)
    (row,) = store.jobs(HistoryFilter())
    assert (row.checkpoint_at_ms, row.checkpoint_step, row.resume_step) == (marked_at, 300, 300)


def test_an_older_history_file_gets_the_checkpoint_columns(tmp_path: Path) -> None:
    path = tmp_path / FILE_NAME
    db = sqlite3.connect(path)
    db.execute(
        "CREATE TABLE jobs (job_id TEXT PRIMARY KEY, name TEXT NOT NULL, owner TEXT NOT NULL,"
        " queue TEXT NOT NULL, state TEXT NOT NULL, reason_code TEXT NOT NULL,"
        " reason TEXT NOT NULL, submitted_at_ms INTEGER NOT NULL,"
        " started_at_ms INTEGER NOT NULL, finished_at_ms INTEGER NOT NULL,"
        " attempts INTEGER NOT NULL, retries_used INTEGER NOT NULL,"
        " requeues INTEGER NOT NULL, gpus_per_attempt INTEGER NOT NULL,"
        " gpu_ms INTEGER NOT NULL, nodes TEXT NOT NULL, cancelled_by TEXT NOT NULL,"
        " spec TEXT NOT NULL, applied_index INTEGER NOT NULL)"
    )
    db.execute(
        "INSERT INTO jobs VALUES ('job-000009', 'old', 'bob', 'default', 'SUCCEEDED', "
        "'succeeded', 'done', 1, 2, 3, 1, 0, 0, 0, 0, '[]', '', "
        """'{"name": "old", "replicas": 1, "resources": {}, "command": ["true"]}', 4)"""
    )
    db.commit()
    db.close()
    cl = finished_cluster()
    store = HistoryStore(path)
    store.write(cl.attempts, cl.jobs)
    rows = {j.job_id: j for j in store.jobs(HistoryFilter())}
    assert (rows["job-000009"].checkpoint_at_ms, rows["job-000009"].checkpoint_step) == (0, None)
    assert rows["job-000001"].checkpoint_at_ms == 0 and len(rows) == 3


def test_an_older_history_file_gets_the_account_column(tmp_path: Path) -> None:
    path = tmp_path / FILE_NAME
    db = sqlite3.connect(path)
    db.execute(
        "CREATE TABLE attempts (job_id TEXT NOT NULL, number INTEGER NOT NULL,"
        " fencing_token INTEGER NOT NULL, name TEXT NOT NULL, owner TEXT NOT NULL,"
        " queue TEXT NOT NULL, state TEXT NOT NULL, nodes TEXT NOT NULL,"
        " gpus INTEGER NOT NULL, bound_at_ms INTEGER NOT NULL,"
        " started_at_ms INTEGER NOT NULL, ended_at_ms INTEGER NOT NULL,"
        " gpu_ms INTEGER NOT NULL, outcome_code TEXT NOT NULL, outcome TEXT NOT NULL,"
        " applied_index INTEGER NOT NULL, PRIMARY KEY (job_id, number))"
    )
    db.execute(
        "INSERT INTO attempts VALUES ('job-000009', 1, 1, 'old', 'bob', 'default', "
        "'succeeded', '[]', 2, 0, 0, 3600000, 7200000, 'all_exited_zero', 'done', 4)"
    )
    db.commit()
    db.close()
    store = HistoryStore(path)
    store.write([attempt("ann", "default", 1, 0, 3_600_000, 5, "proj")], [])
    rows = store.usage("account", 0, DAY_MS)
    assert [(r.key, r.gpu_ms) for r in rows] == [("", 2 * 3_600_000), ("proj", 3_600_000)]
