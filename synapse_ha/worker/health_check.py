"""The node's health-check program (``synapse-worker --health-check PROGRAM``), in the
manner of Slurm's ``HealthCheckProgram``: run at start and then every
``--health-check-interval``, in a thread of its own so that the heartbeat loop never
waits for it.

A run that exits 0 passes. A non-zero exit, a program that cannot be run, or one still
running after ``--health-check-timeout`` (its whole process group is killed) fails, with
a message: the program's first non-empty output line, else how it ended ("exited 3",
"timed out after 60s"). Every heartbeat carries the latest result as the check named
``health-check``; the leader records a failing one as a condition of the node and
cordons it while it was ready, and uncordons it once the check passes again (only a
cordon the check set; an operator's cordon or drain stays).
"""

from __future__ import annotations

import logging
import signal
import subprocess
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass

from synapse_ha.core.health.fitness import CHECK_ACTOR, NodeCheck
from synapse_ha.worker.check_output import READ_LIMIT, failure_message
from synapse_ha.worker.pidns import spawn
from synapse_ha.worker.procgroup import signal_group

log = logging.getLogger("synapse.worker.health_check")

CHECK_NAME = CHECK_ACTOR  # the check's name in heartbeats: "health-check"


@dataclass(frozen=True, slots=True)
class HealthCheckSettings:
    """The program's argv (empty: no health check), how often it runs and how long a
    run may take."""

    argv: tuple[str, ...] = ()
    interval_s: float = 300.0
    timeout_s: float = 60.0

    @property
    def enabled(self) -> bool:
        return bool(self.argv)


def run_check(
    argv: tuple[str, ...],
    timeout_s: float,
    running: Callable[[int | None], None] = lambda pgid: None,
) -> NodeCheck:
    """Run the program once, as this agent, and say how it went. ``running`` is told
    the run's process group while it runs (then None), so that it can be killed."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        try:
            proc = spawn(argv, out.fileno(), err.fileno())
        except (OSError, subprocess.SubprocessError, ValueError) as exc:
            return NodeCheck(CHECK_NAME, True, f"cannot run the health check: {exc}"[:256])
        running(proc.pid)
        code: int | None
        try:
            code = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            code = None
        signal_group(proc.pid, signal.SIGKILL)  # nothing the check started outlives it
        if code is None:
            proc.wait()
        running(None)
        if code == 0:
            return NodeCheck(CHECK_NAME, False, "")
        out.seek(0)
        err.seek(0)
        message = failure_message(code, timeout_s, out.read(READ_LIMIT), err.read(READ_LIMIT))
        return NodeCheck(CHECK_NAME, True, message)


class HealthCheck:
    """Runs the program in a thread: once at :meth:`start`, then every interval until
    :meth:`stop`. :meth:`checks` is the latest result (none before the first run ends),
    safe to call from any thread; ``changed`` is called when a result differs from the
    one before (the worker wakes its agent, which then heartbeats early)."""

    def __init__(
        self,
        settings: HealthCheckSettings,
        changed: Callable[[], None] = lambda: None,
        run: Callable[[tuple[str, ...], float, Callable[[int | None], None]], NodeCheck] = (
            run_check
        ),
    ) -> None:
        self.settings = settings
        self._changed = changed
        self._run = run
        self._result: NodeCheck | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._group: int | None = None  # the run under way's process group
        self.runs = 0

    def checks(self) -> tuple[NodeCheck, ...]:
        result = self._result
        return () if result is None else (result,)

    def start(self) -> None:
        if not self.settings.enabled or self._thread is not None:
            return
        self._thread = threading.Thread(target=self._loop, name="health-check", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop running the program; a run under way is killed with its process group."""
        self._stop.set()
        group = self._group
        if group is not None:
            signal_group(group, signal.SIGKILL)

    def _running(self, group: int | None) -> None:
        self._group = group
        if group is not None and self._stop.is_set():
            signal_group(group, signal.SIGKILL)

    def run_once(self) -> NodeCheck:
        result = self._run(self.settings.argv, self.settings.timeout_s, self._running)
        if self._stop.is_set():
            return result  # cut short by the stop: not the node's health
        self.runs += 1
        before, self._result = self._result, result
        if result != before:
            if result.failing:
                log.warning("health check failing: %s", result.message)
            else:
                log.info("health check passes")
            self._changed()
        return result

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.run_once()
            except Exception:  # a bug here must not end the checks
                log.exception("the health check could not be run")
            self._stop.wait(self.settings.interval_s)
