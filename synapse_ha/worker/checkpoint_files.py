"""Checkpoint marks of the members on this node (:mod:`synapse_ha.core.workflows.checkpoints`).

Every member on the host gets ``$SYNAPSE_CHECKPOINT_FILE``: a file in its member directory,
created empty (and the owner's, like the output log, when it runs as its owner). A member
marks a checkpoint by writing a line to it (``synapse_ha.client.checkpoint`` appends one);
the line's step is a non-negative integer, alone or after the word ``step`` (``1200``,
``step 1200``, ``step=1200``); any other line is a mark without a step, never an error.

The agent looks at each watched file when it sends a heartbeat, and at a member's exit:
a file whose modification time or size changed since the last look, and that is not
empty, is a new mark, numbered 1, 2, ... per member; its step is read from the file's
last line. Only the newest mark between two looks is reported (the state keeps only the
newest). The file is read without following links, and only its last
:data:`TAIL_BYTES`: whatever a member writes there costs the agent one small read.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from synapse_ha.core.desired import MemberKey

CHECKPOINT_FILE = "checkpoint"  # in the member directory; see $SYNAPSE_CHECKPOINT_FILE
TAIL_BYTES = 4096  # the end of the file the step is read from
_STEP = re.compile(r"^\s*(?:step\s*[:=]?\s*)?(\d{1,18})\s*$", re.IGNORECASE)


def parse_step(line: str) -> int | None:
    """The step a mark's line carries (``1200``, ``step 1200``, ``step: 1200``), or None
    (an empty line, anything else)."""
    found = _STEP.match(line)
    return int(found.group(1)) if found else None


def last_line(data: bytes) -> str:
    """The last non-empty line of ``data`` (the end of a file), decoded leniently."""
    for raw in reversed(data.splitlines()):
        if raw.strip():
            return raw.decode("utf-8", errors="replace")
    return ""


def create_checkpoint_file(member_dir: Path) -> Path:
    """Create the member's ``$SYNAPSE_CHECKPOINT_FILE`` empty; its path."""
    path = member_dir / CHECKPOINT_FILE
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600))
    return path


@dataclass(frozen=True, slots=True)
class Mark:
    """A member's newest checkpoint mark: its number on this worker and its step."""

    seq: int
    step: int | None


@dataclass(slots=True)
class _Watch:
    path: Path
    seen: tuple[int, int] = (0, 0)  # (modification time in ns, size) at the last look
    seq: int = 0


def _look(path: Path) -> tuple[tuple[int, int], bytes] | None:
    """The file's (modification time, size) and its last :data:`TAIL_BYTES`, or None when
    it cannot be read as a regular file (gone, replaced, unreadable)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return None
        if info.st_size == 0:
            return (info.st_mtime_ns, 0), b""
        os.lseek(fd, max(0, info.st_size - TAIL_BYTES), os.SEEK_SET)
        return (info.st_mtime_ns, info.st_size), os.read(fd, TAIL_BYTES)
    except OSError:
        return None
    finally:
        os.close(fd)


class CheckpointWatches:
    """The checkpoint files of this node's members, by member."""

    def __init__(self) -> None:
        self._watches: dict[MemberKey, _Watch] = {}

    def watch(self, key: MemberKey, path: Path) -> None:
        """Watch ``path`` (just created, empty) for ``key``'s marks."""
        self._watches[key] = _Watch(path)

    def forget(self, key: MemberKey) -> None:
        self._watches.pop(key, None)

    def poll(self, keys: Iterable[MemberKey]) -> list[tuple[MemberKey, Mark]]:
        """The new mark of each of ``keys`` whose file changed since the last look."""
        out = []
        for key in keys:
            watch = self._watches.get(key)
            if watch is None:
                continue
            try:
                info = os.lstat(watch.path)
            except OSError:
                continue
            if (info.st_mtime_ns, info.st_size) == watch.seen:
                continue  # the common case: one lstat, nothing opened
            looked = _look(watch.path)
            if looked is None:
                continue
            seen, tail = looked
            if seen == watch.seen or seen[1] == 0:
                watch.seen = seen
                continue
            watch.seen = seen
            watch.seq += 1
            out.append((key, Mark(watch.seq, parse_step(last_line(tail)))))
        return out
