"""Per-host fault machinery besides the network: a cgroup v2 freezer per simulated host,
size-limited tmpfs disks that can be filled, and a wall-clock offset file per replica.

* **Freeze.** Each worker host gets a cgroup ``CGROUP_PARENT/<host>``; its worker program
  is started inside it (:func:`cgroup_prefix`) and the member supervisors and members it
  spawns inherit it, so writing ``1`` to ``cgroup.freeze`` stops the agent, the
  supervisors and the members at once, as a suspended VM or a stalled host would.
* **Full disk.** A replica's and a worker's data directory are each a tmpfs of
  ``DISK_SIZE`` (:func:`mount_disk`, before the program starts). :func:`fill` takes every
  free byte with one file, :func:`unfill` deletes it.
* **Clock jump.** A replica started with :func:`clock_env` reads its wall-clock offset
  from a file (``chaos/clockshim/sitecustomize.py``); :func:`set_clock` writes it.

:func:`sweep` thaws and removes every cgroup of ours and unmounts every tmpfs of ours
(also what a crashed earlier run left behind).
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import subprocess
import time
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup/unified")
CGROUP_PARENT_NAME = "synapse-chaos"
DISK_SIZE = "48m"
FILL_NAME = ".chaos-fill"
CLOCK_SHIM = Path(__file__).resolve().parent / "clockshim"
CLOCK_ENV = "SYNAPSE_CHAOS_CLOCK_FILE"


class HostError(Exception):
    """A host-level fault could not be set up; the message names the step."""


# ---------------------------------------------------------------------- cgroups


def cgroup_root() -> Path | None:
    """The cgroup v2 hierarchy to use: the unified mount of a hybrid host, or the root
    of a pure v2 host; None when neither offers ``cgroup.freeze``-capable children."""
    for root in (CGROUP_ROOT, Path("/sys/fs/cgroup")):
        if (root / "cgroup.procs").exists() and (root / "cgroup.subtree_control").exists():
            return root
    return None


def cgroup_parent() -> Path:
    root = cgroup_root()
    if root is None:
        raise HostError("no cgroup v2 hierarchy (cgroup.subtree_control) is mounted")
    return root / CGROUP_PARENT_NAME


def probe_freezer() -> str:
    """ "" when a cgroup of ours can be created and frozen here; else the reason."""
    try:
        parent = cgroup_parent()
        probe = parent / "probe"
        probe.mkdir(parents=True, exist_ok=True)
        try:
            (probe / "cgroup.freeze").write_text("1\n")
            (probe / "cgroup.freeze").write_text("0\n")
        finally:
            with contextlib.suppress(OSError):
                probe.rmdir()
    except (OSError, HostError) as exc:
        return f"cgroup v2 freezer not writable here: {exc}"
    return ""


def host_cgroup(host: str) -> Path:
    path = cgroup_parent() / host
    path.mkdir(parents=True, exist_ok=True)
    return path


def cgroup_prefix(cgroup: Path) -> list[str]:
    """A command prefix that moves the shell into ``cgroup`` and then execs the rest (the
    pid stays the program's own)."""
    return ["sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', str(cgroup)]


def freeze(cgroup: Path, frozen: bool) -> None:
    (cgroup / "cgroup.freeze").write_text("1\n" if frozen else "0\n")
    deadline = time.monotonic() + 5.0
    want = f"frozen {1 if frozen else 0}"
    while time.monotonic() < deadline:
        events = (cgroup / "cgroup.events").read_text()
        if want in events or "populated 0" in events:
            return
        time.sleep(0.01)
    raise HostError(f"{cgroup} did not become {'frozen' if frozen else 'thawed'} within 5 s")


def sweep_cgroups() -> list[str]:
    """Thaw and remove every cgroup of ours, killing what is left in them (the caller
    holds :func:`chaos.net.machine_lock`: a running scenario's workers live there)."""
    removed: list[str] = []
    with contextlib.suppress(HostError):
        parent = cgroup_parent()
        if not parent.is_dir():
            return removed
        for child in sorted(p for p in parent.iterdir() if p.is_dir()):
            with contextlib.suppress(OSError):
                (child / "cgroup.freeze").write_text("0\n")
            for line in (child / "cgroup.procs").read_text().split():
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(line), signal.SIGKILL)
            deadline = time.monotonic() + 5.0
            while time.monotonic() < deadline:
                try:
                    child.rmdir()
                    removed.append(f"cgroup {child}")
                    break
                except OSError:
                    time.sleep(0.05)
        with contextlib.suppress(OSError):
            parent.rmdir()
    return removed


# ------------------------------------------------------------------------- disks


def mount_disk(path: Path, size: str = DISK_SIZE) -> None:
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "synchaos-disk", str(path)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    if done.returncode != 0:
        raise HostError(f"mount tmpfs on {path}: {done.stderr.strip()}")


def is_our_disk(path: Path) -> bool:
    return str(path) in _our_mounts()


def _our_mounts() -> list[str]:
    out = []
    with open("/proc/self/mounts", encoding="utf-8") as f:
        for line in f:
            parts = line.split()
            if len(parts) > 2 and parts[0] == "synchaos-disk" and parts[2] == "tmpfs":
                out.append(parts[1])
    return out


def fill(path: Path) -> int:
    """Take every free byte of the filesystem at ``path`` with one file; the bytes taken.

    Unbuffered: a buffered file would keep the chunk that did not fit and fail again
    when closed."""
    target = path / FILL_NAME
    written = 0
    size = 1 << 20
    with open(target, "ab", buffering=0) as f:
        while size >= 1:
            try:
                n = f.write(b"\0" * size)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                n = 0
            written += n or 0
            if not n:
                size //= 2  # no room for this much: try less, down to one byte
    return written


def unfill(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        (path / FILL_NAME).unlink()


def sweep_disks(under: Path | None = None) -> list[str]:
    """Unmount our tmpfs disks (only those below ``under`` when given)."""
    removed: list[str] = []
    for mount in sorted(_our_mounts(), key=len, reverse=True):
        if under is not None and not mount.startswith(str(under)):
            continue
        done = subprocess.run(["umount", "-l", mount], capture_output=True, timeout=30)
        if done.returncode == 0:
            removed.append(f"tmpfs {mount}")
    return removed


# ------------------------------------------------------------------------- clock


def clock_env(clock_file: Path, pythonpath: str) -> dict[str, str]:
    """Environment entries that give a process the offset wall clock of ``clock_file``."""
    set_clock(clock_file, 0.0)
    return {CLOCK_ENV: str(clock_file), "PYTHONPATH": f"{CLOCK_SHIM}{os.pathsep}{pythonpath}"}


def set_clock(clock_file: Path, offset_s: float) -> None:
    tmp = clock_file.with_suffix(".tmp")
    tmp.write_text(f"{offset_s:.3f}\n", encoding="ascii")
    os.replace(tmp, clock_file)


# ------------------------------------------------------------------------- sweep


def sweep() -> list[str]:
    """Everything of ours: cgroups (and what runs in them) and tmpfs disks. The caller
    holds :func:`chaos.net.machine_lock`."""
    return [*sweep_cgroups(), *sweep_disks()]
