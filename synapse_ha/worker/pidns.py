"""Starting a member in a PID namespace of its own, with a ``/proc`` of its own: from
inside, the member sees its own processes and none of the node's others (other users'
members, their command lines, the agent), and no pid of theirs can be named.

:func:`start` is what the supervisor (:mod:`synapse_ha.worker.shim`) starts a member (and
its pre-start check) with: ``subprocess.Popen`` as before when the namespace is not asked
for, else three processes, each forked from the supervisor (a fork of a small
interpreter costs little memory and no new interpreter):

* the **keeper**, outside the namespace: a session and process group of its own, so it is
  the process the supervisor's records name (``member.json``) and the group the
  supervisor and the agent signal (SIGTERM, then SIGKILL). It ignores the polite signals,
  enters new PID and mount namespaces for its children (``unshare(2)`` through ctypes),
  forks the init, waits for it and then ends as the member's main process ended: the same
  exit code, or killed by the same signal, so the supervisor records what it would
  record for a member it had started itself;
* the **init**, PID 1 of the namespace, still root: it makes the mounts it inherited
  slaves of the host's (the host's new mounts still reach the member; the member's never
  reach the host), mounts a new ``proc`` on ``/proc``, forks the member and reaps every
  process the namespace orphans. When the member's main process ends it sends SIGTERM to
  everything left in the namespace, waits up to ``leftover_grace_s``, and exits: the
  kernel then kills whatever is left (the end of a namespace's init ends the namespace).
  As a namespace's init it ignores every signal but SIGKILL, wherever it comes from;
* the **member**, PID 2: stdin from ``/dev/null``, stdout and stderr to the descriptors
  given, ``before_exec`` (the supervisor's steps: cgroup, account, working directory),
  every other descriptor closed, signal dispositions reset, then exec.

Every signal the supervisor or the agent sends to the keeper's group reaches the member
(and whatever it started in the group) directly. SIGKILL to the group kills the keeper
and the init, and with the init the whole namespace. Each of the keeper and the init has
its parent's death signalled to it as SIGKILL (``PR_SET_PDEATHSIG``), so a supervisor
killed outright takes its member with it.

Whether the exec happened is known before :func:`start` returns, as with ``Popen``: a
pipe whose writing ends close at the member's exec carries, instead, the step that
failed. A namespace that cannot be made raises :class:`NamespaceError`; a failing
``before_exec`` raises ``SubprocessError`` (its step is the supervisor's to read, as with
``Popen``); an exec that fails raises ``OSError`` with its errno.

``python -I -S pidns.py --probe`` checks that this node can do all of it (the worker runs
it at start): exit 0, else 1 and why.

Part of the supervisor: standard library only, and neither pathlib nor typing (see
:mod:`synapse_ha.worker.shim`).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import resource
import signal
import subprocess
import sys
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

CLONE_NEWNS = 0x00020000
CLONE_NEWPID = 0x20000000
MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_NOEXEC = 0x8
MS_REC = 0x4000
MS_SLAVE = 0x80000
PR_SET_PDEATHSIG = 1
EXIT_FAILED = 127  # the member never ran (the report says why)
# Signals the keeper ignores (the member gets each one itself, through the group: a stop,
# or a membership change, synapse_ha.worker.membership), and that the member gets back at
# their defaults: Python ignores SIGPIPE and SIGXFSZ, the fork server SIGINT, and the
# supervisor handles SIGTERM and SIGUSR1.
_POLITE = (
    signal.SIGTERM,
    signal.SIGINT,
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGUSR1,
    signal.SIGUSR2,
)
_RESET = (*_POLITE, signal.SIGPIPE, signal.SIGXFSZ)


class NamespaceError(subprocess.SubprocessError):
    """The member's PID or mount namespace, or its ``/proc``, could not be made."""


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _die_with_parent() -> None:
    """Be sent SIGKILL when the parent that forked this process ends."""
    _check(_libc().prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl")


def _report(fd: int, what: str, err: int = 0) -> None:
    with contextlib.suppress(OSError):
        os.write(fd, f"{what} {err}".encode())


class NamespacedProcess:
    """The supervisor's handle on a member started in a namespace: its keeper's pid,
    and the part of ``Popen`` the supervisor uses (``poll``, ``wait``, ``returncode``)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def _reaped(self, flags: int) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, flags)
            except ChildProcessError:
                return self.returncode
            if pid == self.pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def poll(self) -> int | None:
        return self._reaped(os.WNOHANG)

    def wait(self) -> int:
        code = self._reaped(0)
        return -1 if code is None else code


def spawn(
    argv: Sequence[str],
    stdout: int,
    stderr: int,
    env: dict[str, str] | None = None,
    before_exec: Callable[[], None] | None = None,
) -> subprocess.Popen[bytes]:
    """``Popen`` of ``argv`` in a session of its own, stdin from ``/dev/null``, output to
    ``stdout`` and ``stderr``, no other descriptor inherited; with ``env`` (default:
    this process's), running ``before_exec`` before the exec."""
    return subprocess.Popen(
        list(argv),
        stdin=subprocess.DEVNULL,
        stdout=stdout,
        stderr=stderr,
        env=env,
        start_new_session=True,
        preexec_fn=before_exec,
        close_fds=True,
    )


class StartFailure(Exception):
    """A process :func:`start_stepped` could not start: the error ``cause`` and the step
    before exec that failed, as the steps wrote it (``b""`` when none did)."""

    def __init__(self, cause: BaseException, step: bytes) -> None:
        super().__init__(f"could not start: {cause}")
        self.cause = cause
        self.step = step


def start_stepped(
    argv: Sequence[str],
    env: dict[str, str],
    stdout: int,
    stderr: int,
    before_exec: Callable[[int], Callable[[], None]],
    pid_namespace: bool,
    leftover_grace_s: float = 1.0,
) -> subprocess.Popen[bytes] | NamespacedProcess:
    """:func:`start`, running ``before_exec(fd)`` before the exec, whose steps write the
    one that fails to ``fd`` (the write end of a pipe, closed at exec); raises
    :class:`StartFailure` with the error and that step when it could not start."""
    step_read, step_write = os.pipe()
    try:
        proc = start(
            argv, env, stdout, stderr, before_exec(step_write), pid_namespace, leftover_grace_s
        )
    except (OSError, subprocess.SubprocessError, ValueError) as exc:
        os.close(step_write)
        step = os.read(step_read, 64)
        os.close(step_read)
        raise StartFailure(exc, step) from exc
    os.close(step_write)
    os.close(step_read)
    return proc


def start(
    argv: Sequence[str],
    env: dict[str, str],
    stdout: int,
    stderr: int,
    before_exec: Callable[[], None],
    pid_namespace: bool,
    leftover_grace_s: float = 1.0,
) -> subprocess.Popen[bytes] | NamespacedProcess:
    """Start ``argv`` with ``env`` in a session of its own, stdin from ``/dev/null``,
    output to ``stdout`` and ``stderr``, running ``before_exec`` before the exec; in a
    PID namespace of its own when ``pid_namespace``. Raises as ``Popen`` does when it
    could not start, and :class:`NamespaceError` when the namespace could not be made."""
    if not pid_namespace:
        return spawn(argv, stdout, stderr, env, before_exec)
    report_read, report_write = os.pipe()
    supervisor = os.getpid()
    try:
        keeper = os.fork()
    except OSError:
        os.close(report_read)
        os.close(report_write)
        raise
    if keeper == 0:
        code = EXIT_FAILED
        try:
            os.close(report_read)
            code = _keep(
                argv, env, (stdout, stderr), before_exec, report_write, supervisor, leftover_grace_s
            )
        finally:
            os._exit(code)
    os.close(report_write)
    with os.fdopen(report_read, "rb") as report:
        said = report.read().decode("ascii", "replace")
    if said:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(keeper, 0)
        what, _, err = said.partition(" ")
        errno_ = int(err) if err.isdigit() else 0
        if what == "exec":
            raise OSError(errno_, os.strerror(errno_))
        if what == "preexec":
            raise subprocess.SubprocessError("Exception occurred in preexec_fn.")
        raise NamespaceError(f"no PID namespace of its own: {os.strerror(errno_)}")
    return NamespacedProcess(keeper)


def _keep(
    argv: Sequence[str],
    env: dict[str, str],
    output: tuple[int, int],
    before_exec: Callable[[], None],
    report: int,
    supervisor: int,
    leftover_grace_s: float,
) -> int:
    """The keeper (see the module's description); returns only when the namespace could
    not be made, with the exit code to leave with."""
    try:
        os.setsid()
        _die_with_parent()
        if os.getppid() != supervisor:
            return EXIT_FAILED  # the supervisor is gone already
        for sig in _POLITE:
            signal.signal(sig, signal.SIG_IGN)
        _check(_libc().unshare(CLONE_NEWPID | CLONE_NEWNS), "unshare")
        status_read, status_write = os.pipe()
        init = os.fork()
    except OSError as exc:
        _report(report, "namespace", exc.errno or 0)
        return EXIT_FAILED
    if init == 0:
        code = EXIT_FAILED
        try:
            os.close(status_read)
            code = _init(argv, env, output, before_exec, report, status_write, leftover_grace_s)
        finally:
            os._exit(code)
    os.close(report)
    os.close(status_write)
    _, status = os.waitpid(init, 0)
    with os.fdopen(status_read, "rb") as f:
        said = f.read()
    if said.strip().isdigit():  # the member's own status; else the init's (killed)
        status = int(said)
    _end_as(status)
    return EXIT_FAILED


def _end_as(status: int) -> None:
    """Exit as a process with wait status ``status`` did: by the same signal (without a
    core dump of this process), else with the same code."""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        with contextlib.suppress(OSError, ValueError):
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        with contextlib.suppress(OSError, ValueError):
            signal.signal(sig, signal.SIG_DFL)
            os.kill(os.getpid(), sig)
        os._exit(128 + sig)
    os._exit(os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else EXIT_FAILED)


def _init(
    argv: Sequence[str],
    env: dict[str, str],
    output: tuple[int, int],
    before_exec: Callable[[], None],
    report: int,
    status_write: int,
    leftover_grace_s: float,
) -> int:
    """PID 1 of the member's namespace (see the module's description); returns the exit
    code to leave with."""
    try:
        _die_with_parent()
        for sig in _RESET:
            signal.signal(sig, signal.SIG_DFL)  # as init: ignored, SIGKILL aside
        libc = _libc()
        _check(libc.mount(None, b"/", None, ctypes.c_ulong(MS_REC | MS_SLAVE), None), "mount")
        proc_flags = ctypes.c_ulong(MS_NOSUID | MS_NODEV | MS_NOEXEC)
        _check(libc.mount(b"proc", b"/proc", b"proc", proc_flags, None), "mount /proc")
        member = os.fork()
    except OSError as exc:
        _report(report, "namespace", exc.errno or 0)
        return EXIT_FAILED
    if member == 0:
        _member(argv, env, output, before_exec, report)
    os.close(report)
    status = _reap(member, leftover_grace_s)
    with contextlib.suppress(OSError):
        os.write(status_write, str(status).encode())
    return 0


def _reap(member: int, leftover_grace_s: float) -> int:
    """Reap every process the namespace orphans until the member's main process ends;
    then SIGTERM to what is left, reaped for up to ``leftover_grace_s``. Returns the
    member's wait status."""
    status: int | None = None
    while status is None:
        pid, found = os.waitpid(-1, 0)
        if pid == member:
            status = found
    try:
        os.kill(-1, signal.SIGTERM)  # every process of the namespace but this one
    except ProcessLookupError:
        return status
    deadline = time.monotonic() + leftover_grace_s
    while time.monotonic() < deadline:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break  # nothing is left: every process of a namespace descends from its init
        if pid == 0:
            time.sleep(0.01)
    return status


def _member(
    argv: Sequence[str],
    env: dict[str, str],
    output: tuple[int, int],
    before_exec: Callable[[], None],
    report: int,
) -> None:
    """PID 2: the member itself, up to its exec; never returns."""
    try:
        for sig in _RESET:
            signal.signal(sig, signal.SIG_DFL)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(output[0], 1)
        os.dup2(output[1], 2)
        try:
            before_exec()
        except BaseException:
            _report(report, "preexec")
            os._exit(EXIT_FAILED)
        os.closerange(3, report)
        os.closerange(report + 1, os.sysconf("SC_OPEN_MAX"))
        os.execvpe(argv[0], list(argv), env)
    except OSError as exc:
        _report(report, "exec", exc.errno or 0)
    finally:
        os._exit(EXIT_FAILED)


# What a member's shell runs to say which process it is: its pid and its PID namespace
# (a member in a namespace of its own is PID 2 there; see :func:`host_pid`).
ECHO_PID = 'echo "$$ $(readlink /proc/self/ns/pid)"'


def host_pid(said: str) -> int | None:
    """The pid in this process's namespace of the running process that said ``said`` (a
    line of :data:`ECHO_PID`; a bare pid is this namespace's), or None when it is gone:
    the process of that namespace whose innermost pid (``NSpid``) is the one said."""
    pid_text, _, namespace = said.strip().partition(" ")
    pid = int(pid_text)
    if not namespace or namespace == os.readlink("/proc/self/ns/pid"):
        return pid
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            if os.readlink(f"/proc/{name}/ns/pid") != namespace:
                continue
            with open(f"/proc/{name}/status", encoding="utf-8") as f:
                status = f.read()
        except OSError:
            continue
        for line in status.splitlines():
            if line.startswith("NSpid:") and int(line.split()[-1]) == pid:
                return int(name)
    return None


def probe() -> str:
    """ "" when this node can start a member in a PID namespace of its own, else why
    not (needs root, or the rights to make PID and mount namespaces and mount proc)."""
    try:
        with open(os.devnull, "wb") as null:
            proc = start(
                ["/bin/sh", "-c", "exit 0"],
                {"PATH": "/usr/bin:/bin"},
                null.fileno(),
                null.fileno(),
                lambda: None,
                pid_namespace=True,
                leftover_grace_s=0.0,
            )
    except (OSError, subprocess.SubprocessError) as exc:
        return str(exc)
    code = proc.wait()
    return "" if code == 0 else f"a probe in a PID namespace of its own exited with {code}"


def main(argv: list[str]) -> int:
    if argv != ["--probe"]:
        print("usage: python -I -S pidns.py --probe", file=sys.stderr)
        return 2
    why = probe()
    if why:
        print(why)
    return 1 if why else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
