"""Starting member supervisors from a fork server instead of a fresh interpreter each.

A supervisor (:mod:`synapse_ha.worker.shim`) started as ``python -I -S shim.py DIR``
costs a new interpreter: tens of milliseconds of CPU per member, paid again for every
member of a burst. :class:`ForkServer` starts one ``shim.py --fork-server AGENT_PID``
process per agent, with the supervisor's code already imported, and asks it for one
``fork()`` per member: a supervisor and its member then cost a few milliseconds of CPU
instead of about 65 (``bench/member_start.py``).

Why a member still never outlives its lease (DESIGN §4) with a fork server:

* The fork server holds no lease and runs no member. It exits as soon as the agent is
  gone: its stdin is a pipe whose only writer is the agent, so it reads end of file the
  moment the agent dies (``kill -9`` included), and it also exits when its parent
  changes. An idle fork server thus never survives its agent.
* A supervisor forked by it watches the fork server as today's supervisors watch the
  agent (``parent_pid`` in ``launch.json`` names the fork server): once the fork server
  is gone, its parent changes, and it kills its member's group (SIGTERM, ``fence_grace``,
  SIGKILL) within ``POLL_S + fence_grace``, as when the agent itself dies.
* Every supervisor still reads the lease file on its own, whatever the fork server and
  the agent do: a frozen agent (SIGSTOP), which keeps the fork server alive, still stops
  renewing the lease, and the members are gone within ``lease_ttl`` as before.
* A restarted agent finds the supervisors' pid records (``shim.json``) and kills what is
  left, as for supervisors it started itself; nothing is re-adopted.

A supervisor forked this way is not the agent's child, so the agent cannot ``waitpid``
it: :class:`ForkedSupervisor` follows it through ``/proc`` by pid and start time (a
zombie counts as gone; the fork server reaps them). The exit itself is read from the
supervisor's ``exit.json`` as for any supervisor.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import select
import signal
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path

from synapse_ha.worker import shim
from synapse_ha.worker.procgroup import process_state

log = logging.getLogger("synapse.worker.forkserver")


def fork_server_command(python: str) -> list[str]:
    return [python, "-I", "-S", str(Path(shim.__file__).resolve()), shim.FORK_SERVER_FLAG]


REPLY_TIMEOUT_S = 10.0  # a fork takes milliseconds; this bounds a wedged fork server


class ForkServerError(Exception):
    """A request could not reach the fork server: nothing was forked for it."""


class ForkedSupervisor:
    """The agent's handle on a supervisor the fork server forks: the part of
    :class:`subprocess.Popen` the executor uses (``pid``, ``poll``, ``send_signal``,
    ``kill``, ``wait``). ``poll`` says only whether it ended (0 then): the outcome is in
    its ``exit.json``.

    The fork server's answer (pid and start time) is read when first needed, so that the
    agent can ask for a whole gang's supervisors before waiting for any. When the answer
    never comes, the fork server is killed and the handle counts as ended once a
    supervisor it may have forked has fenced itself (``ended_after``)."""

    def __init__(self, server: ForkServer) -> None:
        self._server = server
        self._answer: tuple[int, int] | None = None
        self._ended_after: float | None = None  # monotonic; set when there is no answer
        self.returncode: int | None = None

    def _answered(self, pid: int, start_ticks: int) -> None:
        self._answer = (pid, start_ticks)

    def _unanswered(self, ended_after: float) -> None:
        self._ended_after = ended_after

    def _settle(self) -> None:
        if self._answer is None and self._ended_after is None:
            self._server.read_answers(until=self)

    @property
    def pid(self) -> int:
        """The supervisor's pid, or 0 when the fork server never named it."""
        self._settle()
        return self._answer[0] if self._answer is not None else 0

    def poll(self) -> int | None:
        if self.returncode is not None:
            return self.returncode
        self._settle()
        if self._answer is None:
            if self._ended_after is not None and time.monotonic() >= self._ended_after:
                self.returncode = 0
            return self.returncode
        pid, ticks = self._answer
        state = process_state(pid)
        if state is None or state[1] != ticks or state[0] in ("Z", "X"):
            self.returncode = 0
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None and self._answer is not None:
            try:
                os.kill(self._answer[0], sig)
            except ProcessLookupError:
                self.returncode = 0

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(f"supervisor {self.pid}", timeout or 0.0)
            time.sleep(0.005)
        return 0


class ForkServer:
    """One fork server per agent, started on first use and again after it died. Not
    thread-safe: the executor (the agent loop) is its only caller.

    ``env`` is the fork server's environment, which every supervisor it forks inherits
    (the executor gives the one of :func:`~synapse_ha.worker.members.supervisor_environment`;
    None: this process's own).

    ``fenced_within_s``: how long a supervisor takes to end its member once its parent
    is gone (the supervisor's poll period plus the fence grace); a handle without an
    answer counts as ended only that long after its fork server was killed."""

    def __init__(
        self, python: str, fenced_within_s: float, env: Mapping[str, str] | None = None
    ) -> None:
        self._python = python
        self._fenced_within_s = fenced_within_s
        self._env = None if env is None else dict(env)
        self._proc: subprocess.Popen[bytes] | None = None
        self._replies = b""
        self._waiting: collections.deque[ForkedSupervisor] = collections.deque()

    @property
    def pid(self) -> int:
        """The pid of the running fork server (started now if none runs): the parent its
        supervisors watch."""
        return self._running().pid

    def start(self) -> int:
        """Start the fork server unless it runs; return its pid."""
        return self._running().pid

    def _running(self) -> subprocess.Popen[bytes]:
        proc = self._proc
        if proc is not None and proc.poll() is None:
            return proc
        if proc is not None:
            self._abandon(proc)
        self._proc = subprocess.Popen(
            [*fork_server_command(self._python), str(os.getpid())],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=self._env,
            start_new_session=True,
            close_fds=True,
        )
        return self._proc

    def spawn(self, member_dir: Path) -> ForkedSupervisor:
        """Ask for a supervisor for ``member_dir`` (whose ``launch.json`` names this fork
        server's :attr:`pid` as parent); the answer is read when the handle needs it.
        Raises :class:`ForkServerError` when the request could not be delivered (nothing
        was forked for it)."""
        proc = self._running()
        assert proc.stdin is not None
        try:
            proc.stdin.write(os.fsencode(member_dir) + b"\n")
            proc.stdin.flush()
        except OSError as exc:
            self._abandon(proc)
            raise ForkServerError(f"fork server gone: {exc}") from None
        handle = ForkedSupervisor(self)
        self._waiting.append(handle)
        return handle

    def read_answers(self, until: ForkedSupervisor) -> None:
        """Read answers, in the order of the requests, until ``until`` has one."""
        proc = self._proc
        while until in self._waiting:
            line = self._read_line(proc) if proc is not None else None
            handle = self._waiting.popleft()
            words = line.split() if line is not None else []
            if len(words) == 2 and words[0].isdigit() and words[1].isdigit():
                handle._answered(int(words[0]), int(words[1]))
            elif line is not None and line.startswith("ERR"):
                log.error("the fork server could not fork a supervisor: %s", line[4:])
                handle._unanswered(time.monotonic())
            else:
                self._waiting.appendleft(handle)
                log.error("the fork server did not answer; killing it")
                if proc is not None:
                    self._abandon(proc)
                return

    def _read_line(self, proc: subprocess.Popen[bytes]) -> str | None:
        assert proc.stdout is not None
        fd = proc.stdout.fileno()
        deadline = time.monotonic() + REPLY_TIMEOUT_S
        while b"\n" not in self._replies:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                continue
            chunk = os.read(fd, 4096)
            if not chunk:
                return None
            self._replies += chunk
        line, self._replies = self._replies.split(b"\n", 1)
        return line.decode("utf-8", "replace")

    def _abandon(self, proc: subprocess.Popen[bytes]) -> None:
        """Kill a fork server that failed. Supervisors it forked see their parent change
        and fence their members; those it never named count as ended once that is
        done."""
        proc.kill()
        proc.wait()
        self._close_pipes(proc)
        if self._proc is proc:
            self._proc = None
        self._replies = b""
        ended_after = time.monotonic() + self._fenced_within_s
        while self._waiting:
            self._waiting.popleft()._unanswered(ended_after)

    @staticmethod
    def _close_pipes(proc: subprocess.Popen[bytes]) -> None:
        for pipe in (proc.stdin, proc.stdout):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop the fork server: it exits at end of file. Its supervisors, which watch it,
        then fence their members: close it only once the members are stopped."""
        proc = self._proc
        if proc is None:
            return
        if self._waiting:
            self.read_answers(until=self._waiting[-1])
        self._proc = None
        self._close_pipes(proc)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
