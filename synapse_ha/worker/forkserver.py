"""Starting member supervisors from a fork server instead of a fresh interpreter each.

A supervisor (:mod:`synapse_ha.worker.shim`) started as ``python -I -S shim.py DIR``
costs a new interpreter: tens of milliseconds of CPU per member, paid again for every
member of a burst. :class:`ForkServer` starts one ``shim.py --fork-server AGENT_PID``
process per agent, with the supervisor's code already imported, and asks it for one
``fork()`` per member: about a millisecond.

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

import contextlib
import os
import select
import signal
import subprocess
import time
from pathlib import Path

from synapse_ha.worker import shim


def fork_server_command(python: str) -> list[str]:
    return [python, "-I", "-S", str(Path(shim.__file__).resolve()), shim.FORK_SERVER_FLAG]


REPLY_TIMEOUT_S = 10.0  # a fork takes milliseconds; this bounds a wedged fork server


class ForkServerError(Exception):
    """The fork server did not fork the supervisor. ``maybe_forked`` is True when the
    request reached it, so a supervisor may exist that the agent cannot name."""

    def __init__(self, message: str, *, maybe_forked: bool) -> None:
        super().__init__(message)
        self.maybe_forked = maybe_forked


def _proc_state(pid: int) -> tuple[str, int] | None:
    """(state letter, start ticks) of ``pid`` from ``/proc``, or None when it is gone."""
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


class ForkedSupervisor:
    """The agent's handle on a supervisor the fork server forked: the part of
    :class:`subprocess.Popen` the executor uses (``pid``, ``poll``, ``send_signal``,
    ``kill``, ``wait``). ``poll`` says only whether it ended (0 then): the outcome is in
    its ``exit.json``."""

    def __init__(self, pid: int, start_ticks: int) -> None:
        self.pid = pid
        self.start_ticks = start_ticks
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            state = _proc_state(self.pid)
            if state is None or state[1] != self.start_ticks or state[0] in ("Z", "X"):
                self.returncode = 0
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, sig)
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
    thread-safe: the executor (the agent loop) is its only caller."""

    def __init__(self, python: str) -> None:
        self._python = python
        self._proc: subprocess.Popen[bytes] | None = None
        self._replies = b""

    @property
    def pid(self) -> int:
        """The pid of the running fork server (started now if none runs): the parent its
        supervisors watch."""
        return self._running().pid

    def _running(self) -> subprocess.Popen[bytes]:
        proc = self._proc
        if proc is not None and proc.poll() is None:
            return proc
        if proc is not None:
            self._close_pipes(proc)
        self._replies = b""
        self._proc = subprocess.Popen(
            [*fork_server_command(self._python), str(os.getpid())],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            start_new_session=True,
            close_fds=True,
        )
        return self._proc

    def spawn(self, member_dir: Path) -> ForkedSupervisor:
        """Fork a supervisor for ``member_dir`` (its ``launch.json`` names this fork
        server's :attr:`pid` as parent). Raises :class:`ForkServerError`."""
        proc = self._running()
        assert proc.stdin is not None and proc.stdout is not None
        try:
            proc.stdin.write(os.fsencode(member_dir) + b"\n")
            proc.stdin.flush()
        except OSError as exc:
            # Not delivered: nothing was forked.
            self._abandon(proc)
            raise ForkServerError(f"fork server gone: {exc}", maybe_forked=False) from None
        reply = self._read_line(proc)
        if reply is None:
            self._abandon(proc)
            raise ForkServerError("fork server did not answer", maybe_forked=True)
        words = reply.split()
        if len(words) == 2 and words[0].isdigit() and words[1].isdigit():
            return ForkedSupervisor(int(words[0]), int(words[1]))
        raise ForkServerError(f"fork server: {reply}", maybe_forked=False)

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
        """Kill a fork server that failed; its supervisors see their parent change and
        fence their members."""
        proc.kill()
        proc.wait()
        self._close_pipes(proc)
        self._proc = None

    @staticmethod
    def _close_pipes(proc: subprocess.Popen[bytes]) -> None:
        for pipe in (proc.stdin, proc.stdout):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop the fork server: it exits at end of file. Its supervisors, which watch it,
        then fence their members: close it only once the members are stopped."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        self._close_pipes(proc)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
