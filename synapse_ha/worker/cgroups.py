"""CPU and memory limits for members through cgroup v2, where the hierarchy is writable.

Layout: ``ROOT/synapse/MEMBER/`` with ``cpu.max`` (quota per 100 ms period from the
member's millicores) and ``memory.max`` (bytes). The member's process joins its cgroup
before it execs (the supervisor writes to ``cgroup.procs`` in the child), so nothing it
forks escapes the limits; ``cgroup.kill`` then also reaches descendants that left the
member's process group.

:func:`probe_cgroups` answers whether limits can be enforced here, with the reason when
they cannot; the agent says that once and runs members without limits.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path

CPU_PERIOD_US = 100_000
# The kernel refuses a cpu.max quota below 1 ms per period.
CPU_MIN_QUOTA_US = 1_000


@dataclass(frozen=True, slots=True)
class CgroupLimits:
    """The contents of a member cgroup's ``cpu.max`` and ``memory.max``."""

    cpu_max: str
    memory_max: str


def cgroup_limits(cpu_milli: int, memory_mib: int) -> CgroupLimits:
    """Limits for a member asking for ``cpu_milli`` millicores and ``memory_mib`` MiB;
    0 (or less) means no limit ("max").

    ``cpu.max`` is "QUOTA PERIOD" in microseconds: ``cpu_milli`` millicores may run
    ``cpu_milli / 1000`` periods' worth per period (1500m -> "150000 100000"), never less
    than the kernel's minimum quota. ``memory.max`` is in bytes.
    """
    if cpu_milli > 0:
        quota = max(CPU_MIN_QUOTA_US, cpu_milli * CPU_PERIOD_US // 1000)
        cpu_max = f"{quota} {CPU_PERIOD_US}"
    else:
        cpu_max = "max"
    memory_max = str(memory_mib * 1024 * 1024) if memory_mib > 0 else "max"
    return CgroupLimits(cpu_max, memory_max)


class CgroupLimiter:
    def __init__(self, parent: Path) -> None:
        self.parent = parent

    def create(self, name: str, cpu_milli: int, memory_mib: int) -> str:
        """Create the member's cgroup with its limits (0 means unlimited); returns its
        path, or "" when it could not be created (the member then runs unlimited)."""
        path = self.parent / name
        limits = cgroup_limits(cpu_milli, memory_mib)
        try:
            path.mkdir(exist_ok=True)
            (path / "cpu.max").write_text(limits.cpu_max, encoding="ascii")
            (path / "memory.max").write_text(limits.memory_max, encoding="ascii")
        except OSError:
            return ""
        return str(path)

    def remove(self, name: str) -> None:
        """Remove an empty member cgroup; a cgroup still holding processes stays."""
        with contextlib.suppress(OSError):
            os.rmdir(self.parent / name)


def probe_cgroups(root: Path = Path("/sys/fs/cgroup")) -> tuple[CgroupLimiter | None, str]:
    """A limiter when cgroup v2 with the cpu and memory controllers is writable under
    ``root``; otherwise None and why not."""
    controllers_file = root / "cgroup.controllers"
    try:
        controllers = set(controllers_file.read_text(encoding="ascii").split())
    except OSError:
        unified = root / "unified" / "cgroup.controllers"
        if unified.exists():
            return None, (
                f"{root} is a cgroup v1/v2 hybrid: cpu and memory belong to the v1 "
                f"hierarchies, so the v2 hierarchy at {unified.parent} cannot limit them"
            )
        return None, f"no cgroup v2 hierarchy at {root}"
    missing = {"cpu", "memory"} - controllers
    if missing:
        return None, (
            f"cgroup v2 at {root} lacks the {', '.join(sorted(missing))} controller "
            "(not delegated, or bound to a cgroup v1 hierarchy)"
        )
    parent = root / "synapse"
    try:
        (root / "cgroup.subtree_control").write_text("+cpu +memory", encoding="ascii")
        parent.mkdir(exist_ok=True)
        (parent / "cgroup.subtree_control").write_text("+cpu +memory", encoding="ascii")
    except OSError as exc:
        return None, f"cgroup v2 at {root} is not writable: {exc}"
    return CgroupLimiter(parent), f"members run in cgroups under {parent}"
