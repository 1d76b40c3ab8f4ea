"""Starting members' supervisors (:mod:`synapse_ha.worker.shim`): a new interpreter each,
or forked by the agent's fork server (:mod:`synapse_ha.worker.forkserver`).

Either way the supervisor runs in a session of its own with the fixed environment of
:func:`synapse_ha.worker.environment.supervisor_environment`, reads the member's
``launch.json`` and watches the parent that ``parent_pid`` in it names: the agent, or the
fork server, which exits with the agent.
"""

from __future__ import annotations

import logging
import os
import subprocess
from pathlib import Path
from typing import Any, Protocol

from synapse_ha.worker import shim
from synapse_ha.worker.environment import supervisor_environment
from synapse_ha.worker.forkserver import ForkServer, ForkServerError
from synapse_ha.worker.records import write_json_atomic

log = logging.getLogger("synapse.worker.members")

# The supervisor runs as a script in isolated mode without site-packages (-I -S): it
# needs only the standard library, and skipping site setup saves tens of milliseconds
# on every member start.
SHIM_COMMAND = ("-I", "-S", str(Path(shim.__file__).resolve()))


class Supervisor(Protocol):
    """A member's supervisor process as the executor handles it: a
    :class:`subprocess.Popen` of ``shim.py``, or one forked by the fork server."""

    @property
    def pid(self) -> int: ...
    def poll(self) -> int | None: ...
    def send_signal(self, sig: int, /) -> None: ...
    def kill(self) -> None: ...
    def wait(self, timeout: float | None = None) -> int: ...


class SupervisorStarter:
    """Starts supervisors with ``python`` (the interpreter that runs them), through a
    fork server when ``fork_server`` (started at once, so that the first member does not
    wait for an interpreter; :meth:`close` stops it), else as new interpreters."""

    def __init__(self, python: str, fork_server: bool, fence_grace_s: float) -> None:
        self.python = python
        self.env = supervisor_environment(os.environ)
        self._forks = (
            ForkServer(python, 2 * shim.POLL_S + fence_grace_s + 0.5, env=self.env)
            if fork_server
            else None
        )
        if self._forks is not None:
            try:
                self._forks.start()
            except OSError as exc:
                log.warning("no fork server (%s): supervisors start as interpreters", exc)

    def start(self, mdir: Path, launch: dict[str, Any]) -> Supervisor:
        """Write ``launch.json`` and start the member's supervisor: forked by the fork
        server when there is one (its ``parent_pid`` is then the fork server's), else a new
        interpreter (its ``parent_pid`` is the agent's). Raises OSError when no supervisor
        could start."""
        if self._forks is not None:
            try:
                launch = {**launch, "parent_pid": self._forks.pid}
                write_json_atomic(mdir / "launch.json", launch)
                return self._forks.spawn(mdir)
            except (ForkServerError, OSError) as exc:
                log.warning("no fork server (%s); starting %s's supervisor anew", exc, mdir)
            launch = {**launch, "parent_pid": os.getpid()}
        write_json_atomic(mdir / "launch.json", launch)
        shim_log = os.open(
            mdir / "shim.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600
        )
        try:
            return subprocess.Popen(
                [self.python, *SHIM_COMMAND, str(mdir)],
                stdin=subprocess.DEVNULL,
                stdout=shim_log,
                stderr=subprocess.STDOUT,
                env=self.env,
                start_new_session=True,
                close_fds=True,
            )
        finally:
            os.close(shim_log)

    @property
    def fork_server_pid(self) -> int | None:
        """The running fork server's pid (started now if it is not running), or None
        without one."""
        return self._forks.start() if self._forks is not None else None

    def close(self) -> None:
        """Stop the fork server, if any."""
        if self._forks is not None:
            self._forks.close()
