"""Job history and GPU accounting in an SQLite file in the replica's data directory.

Two tables, both written only from applied commands (:mod:`synapse_ha.history.tracker`),
so every replica that applied the same log holds the same rows:

* ``attempts``: every ended attempt (job, number, nodes, GPUs, bind/start/end, outcome),
  keyed by (job_id, number);
* ``jobs``: every finished job (spec, owner, queue, outcome, attempts, GPU-seconds of all
  its attempts, its last attempt's checkpoint mark and its resume step), keyed by job_id.
  A file written before the checkpoint columns existed gets them when it is opened (its
  older rows hold no mark). The spec is stored as the bytes of the ``SubmitJob`` command
  it came from (``submission``, decoded when read) when the replica applied that
  command, so that it is never encoded again; otherwise (a job restored from a snapshot,
  a spec the submission changed) as the core codec's plain form in JSON (``spec``).

Writes are idempotent (``INSERT OR IGNORE`` on those keys): replaying the journal after
a restart, or re-recording what a restored snapshot still holds, adds nothing twice.
Job ids are never reused (they come from a counter in the replicated state), so a key
names one job for good. Rows never change once written and nothing is ever deleted: the
replicated state forgets finished jobs after its retention window, this file does not.

Times are the commands' own milliseconds since the epoch. A :class:`HistoryStore` is used
by one writer thread; readers open their own connections (:meth:`HistoryStore.reader`;
the file is in WAL mode, so reads never wait for the writer).
"""

from __future__ import annotations

import datetime
import json
import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import closing, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from synapse_ha.core.codec.from_plain import from_plain
from synapse_ha.core.codec.to_plain import to_plain
from synapse_ha.core.codec.versioned import decode_command
from synapse_ha.core.commands import SubmitJob
from synapse_ha.core.model import JobSpec
from synapse_ha.core.reasons import render
from synapse_ha.history.tracker import AttemptRecord, JobRecord

FILE_NAME = "history.sqlite3"
DAY_MS = 86_400_000
MAX_ROWS = 10_000

_SCHEMA = """
CREATE TABLE IF NOT EXISTS attempts (
    job_id TEXT NOT NULL,
    number INTEGER NOT NULL,
    fencing_token INTEGER NOT NULL,
    name TEXT NOT NULL,
    owner TEXT NOT NULL,
    queue TEXT NOT NULL,
    state TEXT NOT NULL,
    nodes TEXT NOT NULL,
    gpus INTEGER NOT NULL,
    bound_at_ms INTEGER NOT NULL,
    started_at_ms INTEGER NOT NULL,
    ended_at_ms INTEGER NOT NULL,
    gpu_ms INTEGER NOT NULL,
    outcome_code TEXT NOT NULL,
    outcome TEXT NOT NULL,
    applied_index INTEGER NOT NULL,
    account TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (job_id, number)
);
CREATE INDEX IF NOT EXISTS attempts_by_end ON attempts (ended_at_ms);
CREATE TABLE IF NOT EXISTS jobs (
    job_id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    owner TEXT NOT NULL,
    queue TEXT NOT NULL,
    state TEXT NOT NULL,
    reason_code TEXT NOT NULL,
    reason TEXT NOT NULL,
    submitted_at_ms INTEGER NOT NULL,
    started_at_ms INTEGER NOT NULL,
    finished_at_ms INTEGER NOT NULL,
    attempts INTEGER NOT NULL,
    retries_used INTEGER NOT NULL,
    requeues INTEGER NOT NULL,
    gpus_per_attempt INTEGER NOT NULL,
    gpu_ms INTEGER NOT NULL,
    nodes TEXT NOT NULL,
    cancelled_by TEXT NOT NULL,
    spec TEXT NOT NULL,
    applied_index INTEGER NOT NULL,
    checkpoint_at_ms INTEGER NOT NULL DEFAULT 0,
    checkpoint_step INTEGER,
    resume_step INTEGER,
    submission BLOB
);
CREATE INDEX IF NOT EXISTS jobs_by_finish ON jobs (finished_at_ms);
CREATE INDEX IF NOT EXISTS jobs_by_owner ON jobs (owner, finished_at_ms);
"""
# Columns added since a table's first release: added to an older file on opening.
_ADDED_ATTEMPT_COLUMNS = (("account", "TEXT NOT NULL DEFAULT ''"),)
_ADDED_JOB_COLUMNS = (
    ("checkpoint_at_ms", "INTEGER NOT NULL DEFAULT 0"),
    ("checkpoint_step", "INTEGER"),
    ("resume_step", "INTEGER"),
    ("submission", "BLOB"),
)


# The columns of ``jobs``, in the order rows are written and read.
_JOB_COLUMNS = (
    "job_id, name, owner, queue, state, reason_code, reason, submitted_at_ms, "
    "started_at_ms, finished_at_ms, attempts, retries_used, requeues, gpus_per_attempt, "
    "gpu_ms, nodes, cancelled_by, spec, applied_index, checkpoint_at_ms, checkpoint_step, "
    "resume_step, submission"
)


@dataclass(frozen=True, slots=True)
class HistoryAttempt:
    number: int
    fencing_token: int
    state: str
    nodes: tuple[str, ...]
    gpus: int
    bound_at_ms: int
    started_at_ms: int
    ended_at_ms: int
    gpu_ms: int
    outcome_code: str
    outcome: str


@dataclass(frozen=True, slots=True)
class HistoryJob:
    job_id: str
    name: str
    owner: str
    queue: str
    state: str
    reason_code: str
    reason: str
    submitted_at_ms: int
    started_at_ms: int  # the first attempt's bind; 0 when it never ran
    finished_at_ms: int
    attempts: int
    retries_used: int
    requeues: int
    gpus_per_attempt: int
    gpu_ms: int  # GPU-milliseconds of every recorded attempt
    nodes: tuple[str, ...]  # every node any recorded attempt used
    cancelled_by: str
    spec: JobSpec
    applied_index: int
    attempt_list: tuple[HistoryAttempt, ...] = ()
    checkpoint_at_ms: int = 0  # the last attempt's checkpoint mark: when (0: none)
    checkpoint_step: int | None = None  # and its step
    resume_step: int | None = None  # the step a next attempt would have resumed from


@dataclass(frozen=True, slots=True)
class HistoryFilter:
    """Which finished jobs to list; empty strings and zeros match everything."""

    owner: str = ""
    queue: str = ""
    node_id: str = ""
    since_ms: int = 0  # finished at or after
    until_ms: int = 0  # finished before (0: no bound)
    limit: int = 1000


@dataclass(frozen=True, slots=True)
class UsageRow:
    key: str  # the user, queue or account
    day: str  # YYYY-MM-DD (UTC)
    gpu_ms: int
    attempts: int  # attempts that held GPUs on that day


USAGE_KEYS = ("user", "queue", "account")


class HistoryStore:
    """The history file of one replica. Writes from one thread only."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        # Every row can be re-derived from what the state still holds after a crash
        # (Tracker.reset), so the write ahead log need not be synced on every commit.
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(_SCHEMA)
        for table, added in (("attempts", _ADDED_ATTEMPT_COLUMNS), ("jobs", _ADDED_JOB_COLUMNS)):
            have = {row[1] for row in self._db.execute(f"PRAGMA table_info({table})")}
            for name, kind in added:
                if name not in have:
                    self._db.execute(f"ALTER TABLE {table} ADD COLUMN {name} {kind}")

    def close(self) -> None:
        self._db.close()

    def write(self, attempts: Sequence[AttemptRecord], jobs: Sequence[JobRecord]) -> None:
        """Record ended attempts, then finished jobs, in one transaction. Idempotent."""
        if not attempts and not jobs:
            return
        db = self._db
        db.execute("BEGIN")
        try:
            db.executemany(
                "INSERT OR IGNORE INTO attempts VALUES "
                "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [
                    (
                        a.job_id,
                        a.number,
                        a.fencing_token,
                        a.name,
                        a.owner,
                        a.queue,
                        a.state,
                        json.dumps(list(a.nodes)),
                        a.gpus,
                        a.bound_at_ms,
                        a.started_at_ms,
                        a.ended_at_ms,
                        a.gpu_ms,
                        a.outcome_code,
                        render(a.outcome),
                        a.applied_index,
                        a.account,
                    )
                    for a in attempts
                ],
            )
            rows = []
            for j in jobs:
                # A job cancelled before its first bind has no attempts to add up.
                started, gpu_ms, nodes = (
                    self._attempt_totals(j.job_id) if j.attempts else (0, 0, [])
                )
                rows.append(
                    (
                        j.job_id,
                        j.name,
                        j.owner,
                        j.queue,
                        j.state,
                        j.reason_code,
                        render(j.reason),
                        j.submitted_at_ms,
                        started,
                        j.finished_at_ms,
                        j.attempts,
                        j.retries_used,
                        j.requeues,
                        j.gpus_per_attempt,
                        gpu_ms,
                        json.dumps(nodes) if nodes else "[]",
                        j.cancelled_by,
                        "" if j.submission else json.dumps(to_plain(j.spec), sort_keys=True),
                        j.applied_index,
                        j.checkpoint_at_ms,
                        j.checkpoint_step,
                        j.resume_step,
                        j.submission or None,
                    )
                )
            db.executemany(
                f"INSERT OR IGNORE INTO jobs ({_JOB_COLUMNS}) VALUES "
                "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                rows,
            )
            db.execute("COMMIT")
        except BaseException:
            # A failed COMMIT (a full disk) may have ended the transaction already; then
            # there is nothing to roll back, and the first error is the one to raise.
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise

    def _attempt_totals(self, job_id: str) -> tuple[int, int, list[str]]:
        rows = self._db.execute(
            "SELECT bound_at_ms, gpu_ms, nodes FROM attempts WHERE job_id = ?", (job_id,)
        ).fetchall()
        started = min((r[0] for r in rows), default=0)
        nodes = sorted({n for r in rows for n in json.loads(r[2])})
        return started, sum(r[1] for r in rows), nodes

    # ------------------------------------------------------------------ reading

    @contextmanager
    def reader(self) -> Iterator[sqlite3.Connection]:
        """A read-only connection of the caller's own, closed after the block."""
        uri = f"file:{self.path}?mode=ro"
        with closing(sqlite3.connect(uri, uri=True)) as db:
            yield db

    def count(self) -> int:
        with self.reader() as db:
            row = db.execute("SELECT COUNT(*) FROM jobs").fetchone()
        return int(row[0])

    def jobs(self, f: HistoryFilter) -> list[HistoryJob]:
        """Finished jobs matching ``f``, newest finish first (then job id), at most
        ``f.limit`` (capped at :data:`MAX_ROWS`)."""
        conditions = (
            ("owner = ?", f.owner),
            ("queue = ?", f.queue),
            ("EXISTS (SELECT 1 FROM json_each(jobs.nodes) WHERE value = ?)", f.node_id),
            ("finished_at_ms >= ?", f.since_ms),
            ("finished_at_ms < ?", f.until_ms),
        )
        where = ["1 = 1", *(condition for condition, value in conditions if value)]
        args: list[Any] = [value for _, value in conditions if value]
        limit = max(1, min(f.limit or MAX_ROWS, MAX_ROWS))
        sql = (
            f"SELECT {_JOB_COLUMNS} FROM jobs "
            f"WHERE {' AND '.join(where)} ORDER BY finished_at_ms DESC, job_id DESC LIMIT ?"
        )
        with self.reader() as db:
            rows = db.execute(sql, (*args, limit)).fetchall()
            attempts = _attempts_of(db, [r[0] for r in rows])
        return [_job(r, attempts.get(r[0], ())) for r in rows]

    def usage(self, by: str, since_ms: int, until_ms: int, owner: str = "") -> list[UsageRow]:
        """GPU-milliseconds per ``by`` (``user``, ``queue`` or ``account``) and UTC day, over ended
        attempts that held GPUs between ``since_ms`` and ``until_ms``; an attempt that
        spans days is split at midnight. ``owner`` limits it to one user's attempts.
        Sorted by day, then key."""
        if by not in USAGE_KEYS:
            raise ValueError(f"by must be one of {', '.join(USAGE_KEYS)}, got {by!r}")
        column = {"user": "owner", "queue": "queue", "account": "account"}[by]
        where = ["gpus > 0", "ended_at_ms > ?", "bound_at_ms < ?"]
        args: list[Any] = [since_ms, until_ms]
        if owner:
            where.append("owner = ?")
            args.append(owner)
        sql = (
            f"SELECT {column}, gpus, bound_at_ms, ended_at_ms FROM attempts "
            f"WHERE {' AND '.join(where)}"
        )
        with self.reader() as db:
            rows = db.execute(sql, args).fetchall()
        totals: dict[tuple[str, int], list[int]] = {}
        for key, gpus, start, end in rows:
            start, end = max(start, since_ms), min(end, until_ms)
            day = start // DAY_MS
            while start < end:
                edge = min(end, (day + 1) * DAY_MS)
                cell = totals.setdefault((key, day), [0, 0])
                cell[0] += gpus * (edge - start)
                cell[1] += 1
                start, day = edge, day + 1
        return [
            UsageRow(key=key, day=_day(day), gpu_ms=cell[0], attempts=cell[1])
            for (key, day), cell in sorted(totals.items(), key=lambda kv: (kv[0][1], kv[0][0]))
        ]


def _day(day: int) -> str:
    return datetime.datetime.fromtimestamp(day * 86_400, tz=datetime.UTC).strftime("%Y-%m-%d")


def _attempts_of(db: sqlite3.Connection, job_ids: list[str]) -> dict[str, list[HistoryAttempt]]:
    out: dict[str, list[HistoryAttempt]] = {}
    for start in range(0, len(job_ids), 500):
        chunk = job_ids[start : start + 500]
        marks = ", ".join("?" * len(chunk))
        rows = db.execute(
            "SELECT job_id, number, fencing_token, state, nodes, gpus, bound_at_ms, "
            "started_at_ms, ended_at_ms, gpu_ms, outcome_code, outcome FROM attempts "
            f"WHERE job_id IN ({marks}) ORDER BY job_id, number",
            chunk,
        ).fetchall()
        for r in rows:
            out.setdefault(r[0], []).append(
                HistoryAttempt(
                    number=r[1],
                    fencing_token=r[2],
                    state=r[3],
                    nodes=tuple(json.loads(r[4])),
                    gpus=r[5],
                    bound_at_ms=r[6],
                    started_at_ms=r[7],
                    ended_at_ms=r[8],
                    gpu_ms=r[9],
                    outcome_code=r[10],
                    outcome=r[11],
                )
            )
    return out


def _spec(plain: str, submission: bytes | None) -> JobSpec:
    """A stored spec: from the SubmitJob command it came from, else its plain form."""
    if submission:
        command = decode_command(submission)
        if not isinstance(command, SubmitJob):
            raise ValueError(f"a job's stored submission is a {type(command).__name__}")
        return command.spec
    spec: JobSpec = from_plain(JobSpec, json.loads(plain))
    return spec


def _job(r: Sequence[Any], attempts: Sequence[HistoryAttempt]) -> HistoryJob:
    return HistoryJob(
        job_id=r[0],
        name=r[1],
        owner=r[2],
        queue=r[3],
        state=r[4],
        reason_code=r[5],
        reason=r[6],
        submitted_at_ms=r[7],
        started_at_ms=r[8],
        finished_at_ms=r[9],
        attempts=r[10],
        retries_used=r[11],
        requeues=r[12],
        gpus_per_attempt=r[13],
        gpu_ms=r[14],
        nodes=tuple(json.loads(r[15])),
        cancelled_by=r[16],
        spec=_spec(r[17], r[22]),
        applied_index=r[18],
        attempt_list=tuple(attempts),
        checkpoint_at_ms=r[19],
        checkpoint_step=r[20],
        resume_step=r[21],
    )
