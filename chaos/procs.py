"""Processes of the chaos cluster: replicas and workers, each in its host's namespace.

Each process is started with ``ip netns exec`` (which execs the program, so the pid is the
program's own) in a new session, so it leads a process group of its own. ``kill9`` sends
SIGKILL to that group; ``pause``/``resume`` send SIGSTOP/SIGCONT to the process only (a
paused worker agent leaves its member supervisors running, as a frozen agent would).
Member supervisors start their own sessions; :func:`chaos.net.sweep` kills everything
left in the namespaces at the end.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from chaos.net import Host, exec_prefix


@dataclass
class ChaosProcess:
    name: str
    host: Host
    argv: list[str]
    log_path: Path
    env: dict[str, str] = field(default_factory=dict)
    process: subprocess.Popen[bytes] | None = None
    paused: bool = False

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    @property
    def pid(self) -> int:
        return self.process.pid if self.process is not None else 0

    def start(self) -> None:
        if self.alive:
            raise RuntimeError(f"{self.name} is already running")
        log = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child
        try:
            self.process = subprocess.Popen(
                [*exec_prefix(self.host), *self.argv],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,
                env={**os.environ, **self.env},
            )
        finally:
            log.close()
        self.paused = False

    def kill9(self) -> None:
        """SIGKILL the whole process group and reap it."""
        process = self.process
        if process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=10)
        self.process = None
        self.paused = False

    def pause(self) -> None:
        if self.alive:
            os.kill(self.pid, signal.SIGSTOP)
            self.paused = True

    def resume(self) -> None:
        if self.process is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGCONT)
        self.paused = False

    def stop(self, grace_s: float = 3.0) -> None:
        """SIGTERM, then SIGKILL after ``grace_s``: a graceful stop, bounded."""
        process = self.process
        if process is None:
            return
        self.resume()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and process.poll() is None:
            time.sleep(0.05)
        self.kill9()


def stop_all(processes: Sequence[ChaosProcess], grace_s: float = 3.0) -> None:
    for p in processes:
        p.resume()
        if p.process is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.process.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(p.alive for p in processes):
        time.sleep(0.05)
    for p in processes:
        p.kill9()
