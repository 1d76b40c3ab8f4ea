"""Hang detection of one member, as its supervisor (:mod:`synapse_ha.worker.shim`) does it.

A member of a job with ``progress: {timeout: ...}`` (:mod:`synapse_ha.core.health.progress`) is
watched through one file: its ``$SYNAPSE_PROGRESS_FILE`` (source ``file``), which the
member touches whenever it makes progress, or its output log (source ``log``). Its last
progress is the newest of its start and the last change of that file's modification time;
once it is older than the timeout, the member is hung and its supervisor stops it as it
stops a member at its time limit (SIGTERM to the group, the stop grace, SIGKILL).

The file is looked at (one ``stat``) at most every :data:`CHECK_S` seconds, or a tenth of
the timeout when that is shorter, whatever the supervisor's own poll interval: the cost
is bounded per member. A change is timed on the monotonic clock when it is seen, so a
step of the wall clock neither hides a hang nor makes one up; a member is thus found
hung between ``timeout`` and ``timeout`` plus two check intervals after its last touch.

Part of the supervisor: standard library only, and neither pathlib nor typing, which
would slow every member start.
"""

from __future__ import annotations

import os
import time

CHECK_S = 1.0
PROGRESS_FILE = "progress"  # in the member directory; see $SYNAPSE_PROGRESS_FILE

# No typing at run time: mypy reads the annotations; the interpreter never imports it.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


def duration_text(ms: int) -> str:
    """``30m``, ``2h``, ``1h30m``, ``45s``, ``1.5s``: whole units where they divide."""
    if ms % 1000:
        return f"{ms / 1000:g}s"
    hours, rest = divmod(ms // 1000, 3600)
    minutes, seconds = divmod(rest, 60)
    text = (f"{hours}h" if hours else "") + (f"{minutes}m" if minutes else "")
    return text + (f"{seconds}s" if seconds or not text else "")


def _utc_text(wall_s: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(wall_s))


def _mtime(path: str) -> float | None:
    try:
        return os.stat(path, follow_symlinks=False).st_mtime
    except OSError:
        return None


class ProgressWatch:
    """The progress of one member that started at ``started_monotonic`` (and at
    ``started_wall`` by the wall clock): :meth:`hung` says when it has made none for
    ``timeout_ms``. ``source`` is ``file`` or ``log``; ``path`` the file it names."""

    def __init__(
        self,
        path: str,
        source: str,
        timeout_ms: int,
        started_monotonic: float,
        started_wall: float,
    ) -> None:
        self.path = path
        self.source = source
        self.timeout_ms = timeout_ms
        self.timeout_s = timeout_ms / 1000
        self.interval_s = min(CHECK_S, self.timeout_s / 10)
        self.started_wall = started_wall
        self.last_progress = started_monotonic
        self.last_mtime = _mtime(path)
        self.next_check = started_monotonic + self.interval_s

    @classmethod
    def of_launch(
        cls, launch: dict[str, Any], started_monotonic: float, started_wall: float
    ) -> ProgressWatch | None:
        """The watch a launch record asks for (``progress_timeout_ms`` > 0, with
        ``progress_source`` and ``progress_path``), or None."""
        timeout_ms = int(launch.get("progress_timeout_ms") or 0)
        path = launch.get("progress_path")
        if timeout_ms <= 0 or not path:
            return None
        source = str(launch.get("progress_source") or "file")
        return cls(str(path), source, timeout_ms, started_monotonic, started_wall)

    def hung(self, now: float) -> str | None:
        """None while the member makes progress; once it has made none for the timeout,
        the exit detail that says so (``no progress for 30m (progress file not touched
        since 2026-05-02T10:14:03Z)``)."""
        if now < self.next_check:
            return None
        self.next_check = now + self.interval_s
        mtime = _mtime(self.path)
        if mtime is not None and mtime != self.last_mtime:
            self.last_mtime = mtime
            self.last_progress = now
        if now - self.last_progress <= self.timeout_s:
            return None
        what = "output log not written" if self.source == "log" else "progress file not touched"
        if self.last_mtime is not None and self.last_mtime > self.started_wall:
            since = f"since {_utc_text(self.last_mtime)}"
        else:
            since = f"since the member started at {_utc_text(self.started_wall)}"
        return f"no progress for {duration_text(self.timeout_ms)} ({what} {since})"
