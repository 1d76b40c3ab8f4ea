"""The pace of the members on this node, as they report it (docs/slow-nodes.md).

A member on the host (it has ``$SYNAPSE_PROGRESS_FILE``, watched for hangs only in a job
with ``progress:``) may append to it, once
per step or every few steps, a JSON line with the step and its *own* time per step: the
time of its work up to the collective that ends the step, without the time it waits for
the other members::

    {"step": 120, "step_ms": 812.5}
    {"step": 121, "step_ms": 809.0, "peers": "stage-2"}

``step_ms`` is required (a number above 0, at most an hour); ``step`` (an integer) is
optional; ``peers`` (at most 32 printable characters) names the members doing the same
work when not all of them do (one pipeline stage). Any other line, including an empty
file that is only touched, is ignored: writing the file keeps working for hang detection
(:mod:`synapse_ha.worker.progress`), which looks only at its modification time.

The agent reads what was appended since its last look when a heartbeat goes out: one
``lstat`` when nothing changed, otherwise at most :data:`READ_BYTES` from where it
stopped (a member far ahead is read from its last :data:`READ_BYTES`; a line longer
than :data:`MAX_LINE` is skipped). The file is opened without following links and
without blocking, in the agent's thread, never the supervisor's. Each member's paces
seen in the last :data:`WINDOW_S` seconds (at most :data:`MAX_SAMPLES`) give the median
its heartbeat carries (:class:`~synapse_ha.core.health.slowness.PaceReport`); a member
with none in the window reports nothing.
"""

from __future__ import annotations

import json
import math
import os
import stat
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from synapse_ha.core.desired import MemberKey
from synapse_ha.core.health.slowness import MAX_PEERS, MAX_STEP_US, PaceReport

READ_BYTES = 16_384  # read per member per look, at most
MAX_LINE = 1_024
WINDOW_S = 900.0  # as long as the leader's window (leader/slow_nodes.py)
MAX_SAMPLES = 4_096


def parse_pace(line: bytes) -> tuple[int, str] | None:
    """The time per step (microseconds, at least 1) and peer group a pace line carries,
    or None for any other line."""
    if not line.strip().startswith(b"{"):
        return None
    try:
        doc = json.loads(line)
    except ValueError:
        return None
    if not isinstance(doc, dict):
        return None
    step_ms = doc.get("step_ms")
    if isinstance(step_ms, bool) or not isinstance(step_ms, int | float):
        return None
    if not math.isfinite(step_ms) or not 0 < step_ms * 1000 <= MAX_STEP_US:
        return None
    step = doc.get("step")
    if step is not None and (isinstance(step, bool) or not isinstance(step, int) or step < 0):
        return None
    peers = doc.get("peers", "")
    if not isinstance(peers, str) or len(peers) > MAX_PEERS or not peers.isprintable():
        return None
    return max(1, round(step_ms * 1000)), peers


@dataclass(slots=True)
class _Watch:
    path: Path
    offset: int = 0  # where the next read starts (the start of an unfinished line)
    seen: tuple[int, int] = (0, 0)  # (modification time in ns, size) at the last look
    samples: deque[tuple[float, int]] = field(default_factory=lambda: deque(maxlen=MAX_SAMPLES))
    peers: str = ""
    report: PaceReport | None = None  # the last answer, while no sample came or went


def _read_new(watch: _Watch, size: int) -> bytes | None:
    """What was appended since ``watch.offset`` (at most :data:`READ_BYTES`, the newest
    when more), or None when the file cannot be read as a regular file."""
    try:
        fd = os.open(watch.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        if size < watch.offset:
            watch.offset = 0  # rewritten from the start
        start = max(watch.offset, size - READ_BYTES)
        os.lseek(fd, start, os.SEEK_SET)
        data = os.read(fd, min(READ_BYTES, size - start))
    except OSError:
        return None
    finally:
        os.close(fd)
    if start > watch.offset:  # skipped ahead: the first line is likely a part of one
        cut = data.find(b"\n") + 1 or len(data)
        data, start = data[cut:], start + cut
    watch.offset = start
    return data


class PaceWatches:
    """The progress files of this node's members that may report pace, by member."""

    def __init__(self, clock: Callable[[], float], window_s: float = WINDOW_S) -> None:
        self._clock = clock
        self._window_s = window_s
        self._watches: dict[MemberKey, _Watch] = {}

    def watch(self, key: MemberKey, path: Path) -> None:
        """Watch ``path`` (the member's progress file, just created) for ``key``'s pace."""
        self._watches[key] = _Watch(path)

    def forget(self, key: MemberKey) -> None:
        self._watches.pop(key, None)

    def poll(self, keys: Iterable[MemberKey]) -> list[PaceReport]:
        """The pace of each of ``keys`` that reported one in the window: the median of
        its times per step, read up to now."""
        now = self._clock()
        out = []
        for key in keys:
            watch = self._watches.get(key)
            if watch is None:
                continue
            fresh = self._look(watch, now)
            samples = watch.samples
            while samples and samples[0][0] < now - self._window_s:
                samples.popleft()
                fresh = True
            if not samples:
                watch.report = None
                continue
            if fresh or watch.report is None:  # else the last answer stands, unsorted again
                times = sorted(us for _, us in samples)
                median = times[(len(times) - 1) // 2]
                watch.report = PaceReport(
                    key.job_id, key.fencing_token, key.rank, median, len(times), watch.peers
                )
            out.append(watch.report)
        return out

    def _look(self, watch: _Watch, now: float) -> bool:
        """Read what the member appended; whether it gave a pace."""
        try:
            info = os.lstat(watch.path)
        except OSError:
            return False
        if (info.st_mtime_ns, info.st_size) == watch.seen:
            return False  # the common case: one lstat, nothing opened
        data = _read_new(watch, info.st_size)
        if data is None:
            return False
        watch.seen = (info.st_mtime_ns, info.st_size)
        end = data.rfind(b"\n")
        if end < 0:
            if len(data) > MAX_LINE:  # a line too long to ever be a pace: skip it
                watch.offset += len(data)
            return False
        watch.offset += end + 1  # an unfinished last line is read again next time
        paced = False
        for line in data[:end].split(b"\n"):
            if len(line) > MAX_LINE:
                continue
            parsed = parse_pace(line)
            if parsed is not None:
                watch.samples.append((now, parsed[0]))
                watch.peers = parsed[1]
                paced = True
        return paced
