"""Find and kill processes by a marker in their environment.

Every process a dev cluster starts (replicas, workers, member supervisors, members)
inherits the environment of the process that started the cluster, so a unique variable
set there identifies all of them, whatever session or process group they are in. The
launcher marks its own processes the same way; this marker is set by the test itself, so
it also catches what a launcher failed to stop.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
import uuid

from synapse_ha.local.process import processes_with_env

MARKER_VARIABLE = "SYNAPSE_TEST_MARKER"


def new_marker() -> str:
    return uuid.uuid4().hex


def marked_processes(marker: str) -> list[int]:
    """Pids of live (non-zombie) processes whose environment carries ``marker``."""
    return processes_with_env(MARKER_VARIABLE, marker)


def wait_no_marked_processes(marker: str, timeout_s: float = 10.0) -> list[int]:
    """Wait (bounded) until no marked process is left; the ones left at the deadline."""
    deadline = time.monotonic() + timeout_s
    left = marked_processes(marker)
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = marked_processes(marker)
    return left


def kill_marked(marker: str) -> None:
    """SIGKILL every marked process (test teardown)."""
    for pid in marked_processes(marker):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
