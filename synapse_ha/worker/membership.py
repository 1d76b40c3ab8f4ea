"""A member's view of its gang while ranks are placed again (member replacement,
DESIGN §4) or the gang grows and shrinks (elastic gangs, core/elastic.py):
``$SYNAPSE_MEMBERSHIP_FILE`` and the signal that says it changed.

Every member gets the file, in its member directory: the agent's (mode 0644, so that the
member's account, which may enter the directory, reads it and nothing of the member's
writes it). It starts with one line describing the gang as the member was started; each
time the member's desired record arrives with a higher ``membership`` than the member was
last told of, the agent appends one line, flushed to disk, and then sends the job's
``membership_signal`` to the member's process group. A line is one JSON object with sorted
keys: ``membership`` (how many times the gang changed since its attempt was bound),
``world_size``, ``member_hosts`` (in rank order), ``master_addr``, ``master_port``,
``rank`` and ``generation`` (the reader's own). The member is never stopped or restarted
for a change; it reads the last line when told, or whenever it wants. A member its
elastic gang gives back is not told: it is no longer desired, and the agent stops it.

A member that asks for a signal should install its handler before it reads the file: a
change that arrives before the member's process is recorded (``member.json``) is written
but not signalled, and a signal whose default action ends a process ends a member that
has no handler yet.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

from synapse_ha.core.desired import DesiredMember
from synapse_ha.core.replacement import MEMBERSHIP_SIGNALS

MEMBERSHIP_FILE = "membership"  # in the member directory; see $SYNAPSE_MEMBERSHIP_FILE
# The signals a membership change may be announced with (those a job may name): each
# one's default action ends no process, or a member's keeper (synapse_ha.worker.pidns)
# ignores it, so that only the member itself acts on it.
SIGNALS = frozenset(name for name in MEMBERSHIP_SIGNALS if name)


def membership_line(member: DesiredMember) -> bytes:
    """The line that describes ``member``'s gang as its desired record shows it."""
    doc = {
        "membership": member.membership,
        "world_size": member.world_size,
        "member_hosts": list(member.member_hosts),
        "master_addr": member.master_addr,
        "master_port": member.master_port,
        "rank": member.rank,
        "generation": member.generation,
    }
    return (json.dumps(doc, sort_keys=True) + "\n").encode()


def create_membership_file(member_dir: Path, member: DesiredMember) -> Path:
    """Create the member's ``$SYNAPSE_MEMBERSHIP_FILE`` (which must not exist) with the
    line of the gang it starts in; its path."""
    path = member_dir / MEMBERSHIP_FILE
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    try:
        os.fchmod(fd, 0o644)  # whatever the umask took away
        os.write(fd, membership_line(member))
    finally:
        os.close(fd)
    return path


def append_membership(member_dir: Path, member: DesiredMember) -> None:
    """Append the line of ``member``'s new membership to its file, on disk (fsync) when
    this returns. Raises ``OSError`` (a full disk, a file gone)."""
    fd = os.open(member_dir / MEMBERSHIP_FILE, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW)
    try:
        line = membership_line(member)
        if os.write(fd, line) != len(line):
            raise OSError(f"short write to {member_dir / MEMBERSHIP_FILE}")
        os.fsync(fd)
    finally:
        os.close(fd)


def membership_signal(name: str) -> signal.Signals | None:
    """The signal ``name`` ("SIGUSR1", ...) names; None for "" (no signal) and for a name
    outside :data:`SIGNALS`."""
    if name not in SIGNALS:
        return None
    return signal.Signals[name]
