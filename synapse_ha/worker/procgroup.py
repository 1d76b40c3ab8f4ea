"""Processes and process groups as the member supervisor and the agent handle them.

A member runs as a process group of its own. A process is named by its pid together
with its start time (:func:`process_start_ticks`), so that a pid reused by another
process is never signalled in its place; a group id is not reused while any process of
the group lives, so a group is signalled by its id alone.

Part of the supervisor (:mod:`synapse_ha.worker.shim`): standard library only, and
neither pathlib nor typing, which would slow every member start.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal

# No typing at run time: mypy reads the annotations; the interpreter never imports it.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

PR_SET_CHILD_SUBREAPER = 36


def process_state(pid: int) -> tuple[str, int] | None:
    """(state letter, start ticks) of ``pid`` from ``/proc/PID/stat`` (fields 3 and 22),
    or None when no such process exists."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2 :].split()
    try:
        return fields[0], int(fields[19])
    except (IndexError, ValueError):
        return None


def process_start_ticks(pid: int) -> int | None:
    """The start time of ``pid`` in clock ticks since boot (``/proc/PID/stat`` field 22),
    or None when no such process exists. Together with the pid it names one process."""
    found = process_state(pid)
    return None if found is None else found[1]


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def running_groups() -> set[int]:
    """Process group ids with at least one process that is not a zombie (from /proc)."""
    groups: set[int] = set()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", encoding="utf-8") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) > 2 and fields[0] not in ("Z", "X"):
            groups.add(int(fields[2]))
    return groups


def kill_recorded_process(record: dict[str, Any] | None, pid_key: str = "pid") -> bool:
    """SIGKILL the process group named by a pid record, if that very process (same pid
    and start time) still exists. Returns whether something was killed."""
    if not record or not isinstance(record.get(pid_key), int):
        return False
    pid = int(record[pid_key])
    ticks = record.get("start_ticks")
    alive_ticks = process_start_ticks(pid)
    if alive_ticks is None or (ticks is not None and alive_ticks != ticks):
        # The leader of the group is gone (or the pid was reused); the rest of the group
        # may still exist, and a pgid is not reused while any member of it lives.
        if group_alive(pid) and ticks is not None and alive_ticks is None:
            signal_group(pid, signal.SIGKILL)
            return True
        return False
    signal_group(pid, signal.SIGKILL)
    return True


def drop_to(run_as: dict[str, Any]) -> None:
    """Become the account ``run_as`` names (``uid``, ``gid``, ``groups``) for good: the
    supplementary groups, then real, effective and saved gid, then uid."""
    os.setgroups([int(g) for g in run_as["groups"]])
    gid = int(run_as["gid"])
    os.setresgid(gid, gid, gid)
    uid = int(run_as["uid"])
    os.setresuid(uid, uid, uid)


def become_subreaper() -> None:
    """Have the processes this one's descendants orphan reparented to it (and reaped by
    it) instead of init; nothing happens where the kernel does not offer it."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def reap_exited() -> dict[int, int]:
    """Reap every child that has exited, without waiting for those still running: their
    wait statuses by pid."""
    exited: dict[int, int] = {}
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return exited  # no child left
        if pid == 0:
            return exited
        exited[pid] = status
