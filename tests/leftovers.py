"""What a test leaves running: processes of this test session and non-daemon threads.

Every process the test session starts, directly or through the programs it starts,
inherits ``SYNAPSE_TEST_SESSION`` from the pytest process, which adds its own id to it
when the session begins (``tests/conftest.py``; ids are joined with ``:``, so a session
run inside a test keeps its parent's id too), and a scan of ``/proc`` finds them
wherever they are: in another session or process group, reparented to init, run as
another user. A worker's members get none of its variables but those it is told to pass
on (``member_env_passthrough``; the worker tests' executors name this one); a member in
a PID namespace of its own lives no longer than its keeper and init, which carry it.

The check runs once every fixture that could own such a process has been torn down: after
each test at whose end no class-, module- or package-scoped fixture is set up (a module's
shared cluster lives until the module's last test). What is found is named with the test
that was running when it started, killed (so the tests after it run on a clean machine)
and reported as an error of the test whose teardown found it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

SESSION_VARIABLE = "SYNAPSE_TEST_SESSION"
# A process being stopped when a test ends may take a moment to be reaped; a thread told
# to stop may finish its last iteration. Both are waited for, this long at most.
SETTLE_S = float(os.environ.get("SYNAPSE_TEST_SETTLE_S", "5"))
_POLL_S = 0.05
_TICKS_PER_S = os.sysconf("SC_CLK_TCK")
# A program being exec'd shows an empty environment for a moment: the kernel lets the
# parent of a vfork (subprocess.Popen) go on before it lays out the new environment. A
# young process without one is read again for this long, so that a test that starts a
# process and ends at once is still found at its own teardown on a loaded machine.
_EXEC_WAIT_S = 0.25
_YOUNG_S = 5.0
_PF_KTHREAD = 0x00200000  # stat's flags: a kernel thread (never has an environment)


def join_session(session: str) -> str:
    """Add ``session`` to this process's session variable (inherited from now on)."""
    outer = os.environ.get(SESSION_VARIABLE, "")
    os.environ[SESSION_VARIABLE] = f"{outer}:{session}" if outer else session
    return session


def boot_seconds() -> float:
    """Seconds since boot, on the clock ``/proc/<pid>/stat`` start times use."""
    return time.clock_gettime(time.CLOCK_BOOTTIME)


@dataclass(frozen=True)
class Leftover:
    """One process or thread still alive after the test that owned it ended."""

    what: str  # "process 1234 (python -m ...)" or "thread 'name'"
    started_during: str  # the test id, or "" when unknown

    def __str__(self) -> str:
        when = f", started during {self.started_during}" if self.started_during else ""
        return f"{self.what}{when}"


class LeftoverError(AssertionError):
    """Processes or threads outlived the tests that started them."""

    def __init__(self, leftovers: Iterable[Leftover]) -> None:
        lines = "\n".join(f"  - {x}" for x in leftovers)
        super().__init__(
            "left running after the tests that started them (every process and thread a "
            f"test starts must be gone when it ends; they were killed now):\n{lines}"
        )


def _read(path: str) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return None


def _stat_fields(pid: str) -> list[bytes] | None:
    """The fields of ``/proc/<pid>/stat`` after the command (state first)."""
    stat = _read(f"/proc/{pid}/stat")
    return None if stat is None else stat[stat.rfind(b")") + 2 :].split()


def _environ(pid: str) -> bytes | None:
    """``/proc/<pid>/environ``; for a young user process that shows none yet (in the
    middle of exec), read again until it does, for :data:`_EXEC_WAIT_S` at most."""
    environ = _read(f"/proc/{pid}/environ")
    if environ != b"":
        return environ
    fields = _stat_fields(pid)
    if fields is None or fields[0] in (b"Z", b"X") or int(fields[6]) & _PF_KTHREAD:
        return environ
    if boot_seconds() - int(fields[19]) / _TICKS_PER_S > _YOUNG_S:
        return environ
    deadline = time.monotonic() + _EXEC_WAIT_S
    while environ == b"" and time.monotonic() < deadline:
        time.sleep(0.005)
        environ = _read(f"/proc/{pid}/environ")
    return environ


def session_processes(session: str) -> dict[int, float]:
    """Live (non-zombie) processes other than this one whose session variable holds
    ``session``: pid → start time in seconds since boot."""
    prefix = f"{SESSION_VARIABLE}=".encode()
    wanted = session.encode()
    me = os.getpid()
    found: dict[int, float] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        environ = _environ(entry.name)
        if environ is None or prefix not in environ:
            continue
        values = [v[len(prefix) :] for v in environ.split(b"\0") if v.startswith(prefix)]
        if not values or wanted not in values[0].split(b":"):
            continue
        fields = _stat_fields(entry.name)
        if fields is None or fields[0] in (b"Z", b"X"):
            continue
        # Field 22 of stat, the 20th after the command: start time in clock ticks.
        found[int(entry.name)] = int(fields[19]) / _TICKS_PER_S
    return found


def describe_process(pid: int) -> str:
    raw = _read(f"/proc/{pid}/cmdline") or b""
    command = " ".join(part.decode(errors="replace") for part in raw.split(b"\0") if part)
    return f"process {pid} ({command[:200] or '?'})"


def user_threads() -> list[threading.Thread]:
    """Non-daemon threads other than the main thread that are alive."""
    main = threading.main_thread()
    return [t for t in threading.enumerate() if t is not main and not t.daemon and t.is_alive()]


@dataclass
class LeftoverCheck:
    """The session's record of which test ran when, and the check itself."""

    session: str
    # (test id, start, end) in seconds since boot, in the order the tests ran.
    windows: list[tuple[str, float, float]] = field(default_factory=list)
    # Non-daemon thread → the test after which it was first seen alive.
    thread_owner: dict[threading.Thread, str] = field(default_factory=dict)
    # Threads cannot be killed: one reported once is not reported (nor waited for) again.
    reported: set[threading.Thread] = field(default_factory=set)

    def test_ran(self, test_id: str, start: float, end: float) -> None:
        self.windows.append((test_id, start, end))
        for thread in user_threads():
            self.thread_owner.setdefault(thread, test_id)

    def started_during(self, started: float) -> str:
        """The test running at ``started``, a start time in whole clock ticks: the true
        start lies in the tick after it. Of tests that share that tick, the first."""
        tick = 1.0 / _TICKS_PER_S
        found = ""
        for test_id, start, end in reversed(self.windows):
            if end < started:
                break
            if start < started + tick:
                found = test_id
        return found

    def settle(self, settle_s: float = SETTLE_S) -> list[Leftover]:
        """Wait (bounded) for processes and threads to end; what is still alive, killed."""
        deadline = time.monotonic() + settle_s
        while True:
            processes = session_processes(self.session)
            threads = [t for t in user_threads() if t not in self.reported]
            if (not processes and not threads) or time.monotonic() >= deadline:
                break
            time.sleep(_POLL_S)
        found = [
            Leftover(describe_process(pid), self.started_during(started))
            for pid, started in sorted(processes.items())
        ]
        found += [
            Leftover(f"thread {t.name!r} ({t.__class__.__name__})", self.thread_owner.get(t, ""))
            for t in threads
        ]
        for pid in processes:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        self.reported.update(threads)
        return found
