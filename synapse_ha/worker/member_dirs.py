"""A member's directory on this node and the exit records in it.

Each member has ``DATA_DIR/members/JOB_ID/aATTEMPT.tTOKEN.rRANK``, with ``.gGENERATION``
after it for a generation above 0 (:func:`member_dir_name`).
Its supervisor writes ``member.json`` (the member's pid, group and start time) and
``exit.json`` when the member is gone; the agent writes ``launch.json``, ``shim.json``
(the supervisor's pid record), the exit of a member that got no supervisor or whose
supervisor died, and ``reported`` once the control plane has acknowledged the exit.

The agent keeps these records for a later life of itself: the exit it reports is the one
in memory, so a disk that refuses a record only loses the copy, and never stops the
agent (:func:`tolerate_full_disk`).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from synapse_ha.worker.images import CONTAINER_DIR, stop_recorded_container
from synapse_ha.worker.procgroup import kill_recorded_process
from synapse_ha.worker.records import read_json, write_json_atomic
from synapse_ha.worker.shim_containers import remove_container_dir

log = logging.getLogger("synapse.worker.members")

EXIT_LOST = 137

_DIR_PATTERN = re.compile(r"^a(\d+)\.t(\d+)\.r(\d+)(?:\.g([1-9]\d*))?$")


@dataclass(frozen=True, slots=True)
class MemberExit:
    exit_code: int
    detail: str
    ended_at_ms: int
    # True when the worker, not the member's own program, ended it (fenced, killed at
    # shutdown or restart, supervisor gone): a disruption, not the job's failure.
    disrupted: bool = False
    # True when this node could not start it (no account for the owner, no container
    # runtime, files it could not hand over, a supervisor it could not start): the
    # node's fault, reported as such (DESIGN §4).
    node_fault: bool = False
    # True when its supervisor stopped it for making no progress for its job's progress
    # timeout (hang detection): the program's failure, reported as hung.
    hung: bool = False

    @classmethod
    def from_record(cls, record: Mapping[str, Any], ended_at_ms: int) -> MemberExit:
        """The exit in an ``exit.json`` record (``ended_at_ms`` when it names no time)."""
        return cls(
            int(record.get("exit_code", EXIT_LOST)),
            str(record.get("detail", "")),
            int(record.get("ended_at_ms", ended_at_ms)),
            bool(record.get("disrupted", False)),
            bool(record.get("node_fault", False)),
            bool(record.get("hung", False)),
        )


def member_dir_name(attempt: int, fencing_token: int, rank: int, generation: int = 0) -> str:
    """The directory name of a member; generation 0 has the name it had before members
    had generations, so directories written by earlier releases read as generation 0."""
    name = f"a{attempt}.t{fencing_token}.r{rank}"
    return f"{name}.g{generation}" if generation else name


def parse_member_dir_name(name: str) -> tuple[int, int, int, int] | None:
    """(attempt, fencing token, rank, generation) from a member directory name."""
    m = _DIR_PATTERN.match(name)
    if m is None:
        return None
    return int(m.group(1)), int(m.group(2)), int(m.group(3)), int(m.group(4) or 0)


def tolerate_full_disk(write: Callable[[], object], where: Path) -> None:
    """Run ``write`` (a record kept on disk for later); log instead of raising when the
    disk refuses it, so that a full disk never stops the agent."""
    try:
        write()
    except OSError as exc:
        log.error("could not write under %s: %s", where, exc)


def write_exit_record(member_dir: Path, exit_: MemberExit) -> None:
    """The exit on disk, for an agent restarted later."""
    record = {
        "exit_code": exit_.exit_code,
        "detail": exit_.detail,
        "disrupted": exit_.disrupted,
        "node_fault": exit_.node_fault,
        "hung": exit_.hung,
        "ended_at_ms": exit_.ended_at_ms,
    }
    tolerate_full_disk(lambda: write_json_atomic(member_dir / "exit.json", record), member_dir)


def collect_exit(member_dir: Path, now_ms: int) -> MemberExit:
    """The exit of a member whose supervisor has ended: the one it recorded, else lost
    (the supervisor died), once nothing of the member lives any more (its group killed,
    its container stopped and its files removed)."""
    record = read_json(member_dir / "exit.json")
    if record is not None:
        return MemberExit.from_record(record, now_ms)
    kill_recorded_process(read_json(member_dir / "member.json"))
    stop_recorded_container(member_dir)
    exit_ = MemberExit(EXIT_LOST, "lost: its supervisor died", now_ms, disrupted=True)
    lost = {
        "exit_code": exit_.exit_code,
        "detail": exit_.detail,
        "ended_at_ms": 0,
        "disrupted": True,
    }
    tolerate_full_disk(lambda: write_json_atomic(member_dir / "exit.json", lost), member_dir)
    return exit_


def recover_exit(
    member_dir: Path, wall_clock_ms: Callable[[], int], killed_groups: list[int]
) -> MemberExit | None:
    """At agent start, for a member directory a previous life of the agent left: kill
    what is left of its supervisor and its member (the member's group is added to
    ``killed_groups``) and remove its container's files; then its exit, None when it was
    reported already. A member found running, or without an exit record, is lost."""
    killed_shim = kill_recorded_process(read_json(member_dir / "shim.json"))
    member_record = read_json(member_dir / "member.json")
    killed_member = kill_recorded_process(member_record)
    if killed_member and member_record is not None:
        killed_groups.append(int(member_record["pid"]))
    if (member_dir / CONTAINER_DIR).exists():
        # A supervisor killed before it could clean up: the container's files.
        remove_container_dir(str(member_dir / CONTAINER_DIR))
    if (member_dir / "reported").exists():
        return None
    record = read_json(member_dir / "exit.json")
    if record is not None and not killed_shim and not killed_member:
        return MemberExit.from_record(record, 0)
    stop_recorded_container(member_dir)
    return MemberExit(
        EXIT_LOST,
        "lost: left running by a previous worker agent; killed",
        wall_clock_ms(),
        disrupted=True,
    )
