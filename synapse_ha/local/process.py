"""One started program: its command, its log, its process group, and how it stops.

Each program leads a process group of its own (it is started in a new session), so
signals go to the whole group. stdout and stderr go to one log file per process,
appended across restarts; :meth:`Process.log_tail` reads its end for error messages.
:meth:`Process.stop` sends SIGTERM to the group (after SIGCONT, so a paused program can
act on it), waits ``grace_s`` and then SIGKILLs the group; every wait has a deadline.
:func:`processes_with_env` finds live processes by a variable in their environment,
whatever session or group they are in.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_STOP_GRACE_S = 3.0
KILL_WAIT_S = 5.0  # bound on reaping a SIGKILLed process


class LaunchError(Exception):
    """A program could not be started or did not become ready; the message says why."""


class ProcessExited(LaunchError):
    """A process that should be running has exited."""

    def __init__(self, process: Process) -> None:
        code = process.returncode
        super().__init__(
            f"{process.name} exited with code {code}; its log {process.log_path} ends with:\n"
            f"{process.log_tail()}"
        )
        self.process = process
        self.returncode = code


@dataclass
class Process:
    """One program: its command, its log, and (once started) its OS process.

    ``pid`` is also the id of the process group the program leads. ``expect_running`` is
    False once the process was stopped or killed on purpose, so waits do not report it.
    """

    name: str
    argv: list[str]
    log_path: Path
    env: dict[str, str] | None = None  # the whole environment (None: the launcher's)
    prefix: list[str] = field(default_factory=list)  # e.g. ["ip", "netns", "exec", "r1"]
    process: subprocess.Popen[bytes] | None = None
    paused: bool = False
    expect_running: bool = True

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    @property
    def returncode(self) -> int | None:
        return self.process.poll() if self.process is not None else None

    def log_tail(self, chars: int = 2000) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return text[-chars:]

    def signal_group(self, sig: int) -> None:
        """Send ``sig`` to the whole process group, if the process has not been reaped."""
        if self.process is not None and self.process.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.process.pid, sig)

    def signal_process(self, sig: int) -> None:
        """Send ``sig`` to the program's own process only (not the rest of its group)."""
        if self.process is not None and self.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.process.pid, sig)

    def pause(self) -> None:
        """SIGSTOP the program only: its children (member supervisors) keep running, as
        they would beside a frozen program."""
        if self.alive:
            self.signal_process(signal.SIGSTOP)
            self.paused = True

    def resume(self) -> None:
        self.signal_process(signal.SIGCONT)
        self.paused = False

    def wait(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for the process to exit; whether it has."""
        if self.process is None:
            return True
        try:
            self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return False
        return True

    def kill(self, sig: int = signal.SIGKILL, wait_s: float = KILL_WAIT_S) -> None:
        """Send ``sig`` to the group and wait (bounded) until the process has exited;
        SIGKILL the group when it is still there after ``wait_s``. Marks the process as
        not expected to run."""
        self.expect_running = False
        if self.process is None:
            return
        if sig != signal.SIGKILL:
            self.signal_group(signal.SIGCONT)
        self.signal_group(sig)
        if not self.wait(wait_s):
            self.signal_group(signal.SIGKILL)
            self.wait(KILL_WAIT_S)
        self.paused = False

    def stop(self, grace_s: float = DEFAULT_STOP_GRACE_S) -> None:
        """A graceful stop, bounded: SIGTERM to the group, SIGKILL after ``grace_s``."""
        self.kill(signal.SIGTERM, wait_s=grace_s)


@dataclass
class Replica(Process):
    """A ``synapse-scheduler`` replica."""

    replica_id: str = ""
    raft: str = ""  # host:port of its Raft traffic
    grpc: str = ""  # host:port of its gRPC API
    data_dir: Path = field(default_factory=Path)
    metrics: str = ""  # host:port of /metrics and the dashboard (port 0: see its status)


@dataclass
class Worker(Process):
    """A ``synapse-worker`` agent."""

    node_id: str = ""
    data_dir: Path = field(default_factory=Path)
    metrics: str = ""  # host:port of its /metrics (port 0: chosen by the worker)


def processes_with_env(name: str, value: str) -> list[int]:
    """Pids of live (non-zombie) processes whose environment has ``name=value``.

    Processes whose environment cannot be read (another user's) are skipped.
    """
    needle = f"{name}={value}".encode()
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/environ", "rb") as f:
                environ = f.read()
            with open(f"/proc/{entry.name}/stat", encoding="utf-8") as f:
                stat = f.read()
        except OSError:
            continue
        state = stat[stat.rfind(")") + 2 :].split()[:1]
        if needle in environ.split(b"\0") and state not in (["Z"], ["X"]):
            found.append(int(entry.name))
    return found
