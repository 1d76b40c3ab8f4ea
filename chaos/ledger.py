"""Append-only JSON-lines files shared by processes in different namespaces.

Every record is one line written by one unbuffered ``os.write`` on a file descriptor
opened with ``O_APPEND``: the kernel places each write at the end of the file atomically,
so records of concurrent writers never interleave and a killed writer leaves at most its
last record missing, never half of an earlier one. Times are ``CLOCK_MONOTONIC``
nanoseconds, which all network namespaces share.

Record kinds (field ``type``):

* member records (``ledger.jsonl``): ``start``, ``heartbeat``, ``effect``, ``end``,
  ``term``, ``preempted`` and ``membership`` (told of a new membership of its gang) with
  ``job``, ``attempt``, ``token``, ``rank``, ``generation``, ``replace``, ``node``,
  ``mono_ns``, ``pid``;
* step records (``steps.jsonl``, :mod:`chaos.steptask`): ``task-start``,
  ``task-heartbeat``, ``task-end``, ``task-term`` of a job step's task with ``job``,
  ``attempt``, ``token``, ``step``, ``task``, ``node``, ``pid``, ``pid_ns``,
  ``start_ticks``, ``gpus``, ``mono_ns``; ``batch-start`` and ``batch-end`` (with
  ``statuses``) of an sbatch job's batch script, without ``step`` and ``task``;
* sink decisions (``effects.jsonl``): ``effect`` with ``job``, ``token``, ``rank``,
  ``generation``, ``attempt``, ``node``, ``pid``, ``accepted``, ``highest_before``,
  ``mono_ns``, and ``claim`` (a member's token and generation claimed as it starts);
* submissions (``submissions.jsonl``): ``begin``, then one of ``ok``, ``failed``,
  ``unknown`` with ``request_id``, ``name``, ``job_id``, ``detail``, ``mono_ns``; an
  array's records also carry ``array`` (its text) and ``throttle`` (0: none), and its
  ``job_id`` is the array's id; an sbatch job's carry ``sbatch: true``;
* faults (``faults.jsonl``): ``fault`` with ``kind``, ``step``, ``targets``, ``hit``,
  ``start_ns``, ``end_ns``, ``detail``;
* observations (``leaders.jsonl``): ``role`` with ``replica``, ``role``, ``term``,
  ``mono_ns``.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

LEDGER = "ledger.jsonl"
STEPS = "steps.jsonl"
EFFECTS = "effects.jsonl"
SUBMISSIONS = "submissions.jsonl"
FAULTS = "faults.jsonl"
LEADERS = "leaders.jsonl"


def now_ns() -> int:
    return time.monotonic_ns()


class Appender:
    """One append-only file. Safe to share between threads (one write per record)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def append(self, record: dict[str, Any]) -> None:
        line = json.dumps(record, separators=(",", ":"), sort_keys=True) + "\n"
        data = line.encode()
        written = os.write(self.fd, data)
        if written != len(data):
            raise OSError(f"{self.path}: short append ({written} of {len(data)} bytes)")

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> Appender:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_records(path: Path) -> Iterator[dict[str, Any]]:
    """Every complete record of a file; a torn last line (writer killed) is skipped."""
    if not path.exists():
        return
    with open(path, encoding="utf-8") as f:
        for line in f:
            if not line.endswith("\n"):
                continue
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict):
                yield record
