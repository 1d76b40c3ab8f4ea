"""The per-member supervisor: ``python -I -S .../synapse_ha/worker/shim.py MEMBER_DIR``.

One shim runs per gang member, in a session of its own, started by the agent (or forked
by the agent's fork server, :func:`serve_forks`; see :mod:`synapse_ha.worker.forkserver`
for why that keeps every rule below). It reads
``launch.json`` from the member directory, starts the member as its own process group
(``setsid``) and then holds the member's lease on the agent's behalf:

* the lease file (written by the agent after every acknowledged heartbeat) holds a
  ``CLOCK_MONOTONIC`` deadline; once it has passed, or the file is unreadable, the shim
  kills the member's process group (SIGTERM, ``fence_grace_s``, SIGKILL);
* when the agent that started it is gone (its parent changed: ``parent_pid`` in
  ``launch.json``, the agent or its fork server, which exits with the agent), the shim
  does the same, so a crashed, killed or restarted agent never leaves a member behind;
* SIGTERM to the shim is the agent's graceful stop: SIGTERM to the group,
  ``stop_grace_s``, SIGKILL; SIGUSR1 is the agent fencing: the same with ``fence_grace_s``;
* a preempted member: the agent first writes ``preempt.json`` (the member's
  ``$SYNAPSE_PREEMPT_FILE``: kind, preemptor, grace_ms), then sends SIGTERM; the shim's
  grace is then the notice's ``grace_ms``, and the exit is a disruption. During any grace
  the lease and the agent are still watched: a member never outlives its lease;
* ``time_limit_ms`` (when > 0) is enforced the same way, and so is hang detection
  (``progress_timeout_ms`` > 0, :mod:`~synapse_ha.worker.progress`): a member that made
  no progress for that long is stopped and its exit recorded as ``hung``.

A member whose job names an image runs as the container runtime's client (``podman run``
and the like), started by its absolute path with the fixed environment of the launch
record: nothing of the job's reaches the runtime's own environment, where variables such
as ``PATH``, ``LD_PRELOAD`` or ``CONTAINERS_CONF`` would change what a root process runs.
The job's variables reach the container through an environment file
(:mod:`~synapse_ha.worker.shim_containers`). The container lives under the runtime's
monitor, so whenever the shim forces the member down, or the client dies of a signal, it
also runs the launch record's ``container_stop`` commands; the agent runs the same
commands for a member whose shim died.

Because the deadline is checked every ``POLL_S`` seconds, a member's whole process tree is
gone at most ``POLL_S + fence_grace_s`` after its lease deadline, whatever happened to the
agent (killed, paused or partitioned). The shim is a child subreaper, so descendants that
the member orphans are reparented to it and reaped; where the member runs in a cgroup,
``cgroup.kill`` also reaches descendants that left the process group.

A member that runs as its job's owner (``run_as`` in the launch record: uid, gid and
groups) is started by the shim, which joins the member's cgroup in the child first (that
needs the agent's rights) and then sets the groups, the gid and the uid (real, effective
and saved); only then does the child enter the working directory (``cwd``) and exec, so
nothing the job names is looked up with root's rights. A runtime that runs rootless is
started the same way, as the owner. The shim itself stays root: it must signal the
member's group and write ``cgroup.kill`` whatever the member does, and it writes the
records the agent acts on (pids, exit) into a directory the member cannot write, with
mode 0600, never following a link. A supervisor running as the owner could be killed or
traced by the owner's other processes, which would end the member's self-fencing.

A member that cannot start gets a detail that names neither a path nor a program of the
job's: a working directory that does not exist and one the member's account may not enter
give the same sentence (:data:`WORKDIR_REFUSED`), and so do a program that does not exist
and one it may not run (:data:`NOT_RUNNABLE`). The detail becomes the job's reason, which
other users may see.

A member whose launch record says ``pid_namespace`` runs in a PID namespace of its own,
with a ``/proc`` of its own (:mod:`~synapse_ha.worker.pidns`): the pid the records name is
then that of the member's keeper, whose group holds the member, and killing the group
ends the namespace.

The shim writes ``member.json`` (pid and start time of the member) once the member runs,
and ``exit.json`` (exit code, detail, end time) atomically when it is gone; the agent reads
both. Exit codes follow the shell: 128 + N for death by signal N. A member stopped by the
shim never reports 0: a fenced member that exits cleanly on SIGTERM did not succeed.

The supervisor is this script and the modules it imports: :mod:`~synapse_ha.worker.procgroup`
(processes and groups), :mod:`~synapse_ha.worker.records` (the records and the lease file),
:mod:`~synapse_ha.worker.shim_containers` (a member's container),
:mod:`~synapse_ha.worker.pidns` (a member's PID namespace) and
:mod:`~synapse_ha.worker.progress` (hang detection). They import only the
standard library and each other, so that the supervisor runs in isolated mode without
site-packages and starts in a few milliseconds; keep it so. Run as a script, it finds
them through the directory that holds the ``synapse_ha`` package (its own location),
after the standard library.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import select
import signal
import subprocess
import sys
import time

if __name__ == "__main__":
    # ``python -I -S .../synapse_ha/worker/shim.py``: the isolated interpreter has neither
    # site-packages nor this directory on its path. The supervisor's other modules are
    # found through the directory holding the package, searched after the standard
    # library so that nothing there can stand in for a standard module.
    sys.path.append(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from synapse_ha.worker.pidns import (
    NamespacedProcess,
    NamespaceError,
    StartFailure,
    start_stepped,
)
from synapse_ha.worker.procgroup import (
    become_subreaper,
    drop_to,
    group_alive,
    process_start_ticks,
    reap_exited,
    signal_group,
)
from synapse_ha.worker.progress import ProgressWatch
from synapse_ha.worker.records import (
    read_lease_deadline,
    reserve,
    write_json_atomic,
    write_reserved,
)
from synapse_ha.worker.shim_containers import MemberContainer, error_kind
from synapse_ha.worker.shim_prestart import FAILED, INTERRUPTED, run_prestart

# No pathlib or typing: they would add several milliseconds to every member start.
# mypy reads the annotations below; the interpreter never imports typing for them.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

POLL_S = 0.05
EXIT_TIME_LIMIT = 124
EXIT_STOPPED = 143  # 128 + SIGTERM: never 0 for a member the supervisor stopped
EXIT_COULD_NOT_EXEC = 127
PREEMPT_FILE = "preempt.json"  # in the member directory; see $SYNAPSE_PREEMPT_FILE
EXIT_PRESTART_FAILED = 126  # the job's pre-start check failed: the member never ran
_STOPPED = "stopped"

# Why a member could not start, in words that name no path and no program of the job's:
# the same sentence whether a path does not exist or the member's account may not use it.
WORKDIR_REFUSED = (
    "could not exec: the working directory does not exist or the job's user may not enter it"
)
NOT_RUNNABLE = "could not exec: the program does not exist or the job's user may not run it"
_STEP_FAILURES = {
    b"cgroup": "could not exec: could not join the member's cgroup",
    b"account": "could not exec: could not switch to the job's user",
    b"workdir": WORKDIR_REFUSED,
}
_NOT_RUNNABLE_ERRNOS = frozenset(
    {errno.ENOENT, errno.EACCES, errno.ENOTDIR, errno.ELOOP, errno.ENAMETOOLONG, errno.EPERM}
)


def _exec_failure(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.errno in _NOT_RUNNABLE_ERRNOS:
        return NOT_RUNNABLE
    return f"could not exec: {error_kind(exc)}"


def _before_exec(launch: dict[str, Any], step_write: int) -> Callable[[], None]:
    """What the member's process does between fork and exec: join the cgroup first (it
    needs the agent's rights), then drop to the account in ``run_as`` (groups, gid, uid:
    real, effective and saved), and only then enter the working directory, so that a
    directory is entered with the rights of the account that runs there. The step that
    fails is written to ``step_write`` (the exception itself reaches the parent only as
    "Exception occurred in preexec_fn")."""
    cgroup_procs = launch.get("cgroup_dir") and os.path.join(launch["cgroup_dir"], "cgroup.procs")
    run_as = launch.get("run_as")
    cwd = launch.get("cwd") or ""

    def before_exec() -> None:
        step = b"cgroup"
        try:
            if cgroup_procs:
                with open(cgroup_procs, "w", encoding="ascii") as f:
                    f.write("0")
            step = b"account"
            if run_as:
                drop_to(run_as)
            step = b"workdir"
            if cwd:
                os.chdir(cwd)
        except BaseException:
            os.write(step_write, step)
            raise

    return before_exec


class Shim:
    def __init__(self, member_dir: str) -> None:
        self.dir = member_dir
        with open(os.path.join(member_dir, "launch.json"), encoding="utf-8") as f:
            self.launch: dict[str, Any] = json.load(f)
        self.lease_path: str = self.launch["lease_path"]
        self.parent_pid = int(self.launch["parent_pid"])
        # False only in the deliberately broken test build (see synapse_ha.programs.worker).
        self.self_fencing = bool(self.launch.get("self_fencing", True))
        self.stop_requested = False
        self.fence_requested = False
        self.member_pid = 0
        self.member_status: int | None = None
        self.started_monotonic = 0.0
        self.progress: ProgressWatch | None = None
        self.hung = False  # stopped for making no progress (hang detection)
        # The member's container, its files and the commands that end it (none on the host).
        self.container = MemberContainer(self.launch)

    def _on_sigterm(self, signum: int, frame: object) -> None:
        self.stop_requested = True

    def _on_sigusr1(self, signum: int, frame: object) -> None:
        self.fence_requested = True

    # ------------------------------------------------------------------ start

    def start(self) -> str | None:
        """Start the member; return why it could not be started, or None.

        The steps before exec are :func:`_before_exec`'s. A directory the member's
        account cannot enter gives one sentence whether or not it exists
        (:data:`WORKDIR_REFUSED`), and no failure names a path or a program of the
        job's."""
        launch = self.launch
        failure = self.container.write_env_file()
        if failure is not None:
            return failure
        log = os.open(
            launch["log_path"], os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600
        )
        try:
            proc = start_stepped(
                launch["argv"],
                launch["env"],
                log,
                log,
                lambda step_write: _before_exec(launch, step_write),
                bool(launch.get("pid_namespace")),
                min(float(launch.get("stop_grace_s", 5.0)), 1.0),
            )
        except StartFailure as exc:
            detail = self._start_failure(exc.cause, exc.step)
            os.write(log, f"synapse-worker: {detail}\n".encode())
            os.close(log)
            self.container.remove_files()
            return detail
        os.close(log)
        self._record_member(proc)
        return None

    def _start_failure(self, exc: BaseException, failed_step: bytes) -> str:
        """Why the member could not start: the step before exec that failed, else the
        runtime or the program that could not run."""
        if failed_step in _STEP_FAILURES:
            return _STEP_FAILURES[failed_step]
        if isinstance(exc, NamespaceError):
            return "could not exec: could not give the member a PID namespace of its own"
        if self.container.files is not None:
            return f"could not run the container runtime: {error_kind(exc)}"
        return _exec_failure(exc)

    def _record_member(self, proc: subprocess.Popen[bytes] | NamespacedProcess) -> None:
        """The member runs: remember it and write ``member.json`` (into the room taken
        before it started)."""
        self.member_pid = proc.pid
        # The shim reaps with waitpid itself; Popen must not try again.
        proc.returncode = 0
        self.started_monotonic = time.monotonic()
        self.progress = ProgressWatch.of_launch(self.launch, self.started_monotonic, time.time())
        write_reserved(
            os.path.join(self.dir, "member.json"),
            {
                "pid": proc.pid,
                "pgid": proc.pid,
                "start_ticks": process_start_ticks(proc.pid),
                "started_at_ms": int(time.time() * 1000),
            },
        )

    # ------------------------------------------------------------ supervising

    def reap(self) -> None:
        """Reap every exited child; remember the member's own status."""
        status = reap_exited().get(self.member_pid)
        if status is not None:
            self.member_status = status

    def fenced_now(self) -> bool:
        """The lease has passed or the agent is gone (never with self-fencing off)."""
        if not self.self_fencing:
            return False
        if time.monotonic() >= read_lease_deadline(self.lease_path):
            return True
        return os.getppid() != self.parent_pid

    def wait_group_gone(self, grace_s: float) -> None:
        """SIGTERM was sent; wait up to ``grace_s`` for the group, then SIGKILL it. A
        grace never outlasts the lease: once it passes, the group is killed at once."""
        deadline = time.monotonic() + grace_s
        next_lease_check = 0.0
        while time.monotonic() < deadline:
            self.reap()
            if self.member_status is not None and not group_alive(self.member_pid):
                return
            now = time.monotonic()
            if now >= next_lease_check:
                if self.fenced_now():
                    break
                next_lease_check = now + POLL_S
            time.sleep(0.01)
        self.kill_everything()

    def preempt_notice(self) -> dict[str, Any] | None:
        """The notice the agent wrote before asking a preempted member to stop."""
        try:
            with open(os.path.join(self.dir, PREEMPT_FILE), encoding="utf-8") as f:
                doc = json.load(f)
        except (OSError, ValueError):
            return None
        return doc if isinstance(doc, dict) else None

    def kill_everything(self) -> None:
        signal_group(self.member_pid, signal.SIGKILL)
        self.container.stop()
        cgroup_dir = self.launch.get("cgroup_dir")
        if cgroup_dir:
            try:
                with open(os.path.join(cgroup_dir, "cgroup.kill"), "w", encoding="ascii") as f:
                    f.write("1")
            except OSError:
                pass
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline:
            self.reap()
            if self.member_status is not None and not group_alive(self.member_pid):
                return
            time.sleep(0.005)

    def terminate(self, grace_s: float) -> None:
        signal_group(self.member_pid, signal.SIGTERM)
        self.wait_group_gone(grace_s)

    def supervise(self) -> tuple[int | None, str, bool]:
        """Run until the member is gone; return (forced exit code or None, detail, whether
        it was fenced: a disruption the job did not cause)."""
        launch = self.launch
        time_limit_s = int(launch.get("time_limit_ms", 0)) / 1000
        stop_grace = float(launch.get("stop_grace_s", 5.0))
        fence_grace = float(launch.get("fence_grace_s", 0.5))
        while True:
            self.reap()
            self.container.forget_env_file_once_created()
            if self.member_status is not None:
                # The member's main process ended; nothing it started may outlive it.
                if group_alive(self.member_pid):
                    self.terminate(min(stop_grace, 1.0))
                # The agent may have signalled the group itself while asking us to stop.
                if self.fence_requested:
                    return 137, "fenced by the worker agent", True
                if self.stop_requested:
                    return self.stopped()
                return None, "", False
            now = time.monotonic()
            lease_over = self.self_fencing and now >= read_lease_deadline(self.lease_path)
            if self.fence_requested or lease_over:
                self.terminate(fence_grace)
                return 137, "fenced: the node's lease expired", True
            if self.self_fencing and os.getppid() != self.parent_pid:
                self.terminate(fence_grace)
                return 137, "fenced: the worker agent went away", True
            if self.stop_requested:
                notice = self.preempt_notice()
                grace = stop_grace
                if notice is not None and isinstance(notice.get("grace_ms"), int):
                    grace = max(0, notice["grace_ms"]) / 1000
                self.terminate(grace)
                return self.stopped()
            if time_limit_s > 0 and now - self.started_monotonic >= time_limit_s:
                self.terminate(stop_grace)
                limit = launch["time_limit_ms"]
                return EXIT_TIME_LIMIT, f"time limit of {limit} ms exceeded", False
            hung = self.progress.hung(now) if self.progress is not None else None
            if hung is not None:
                self.terminate(stop_grace)
                self.hung = True
                return EXIT_STOPPED, hung, False
            time.sleep(POLL_S)

    def stopped(self) -> tuple[int, str, bool]:
        """The exit of a member the agent stopped: a preempted one's is a disruption
        naming the preemptor, any other stop the worker's plain stop."""
        notice = self.preempt_notice()
        if notice is None:
            return 143, "stopped by the worker", False
        kind, preemptor = notice.get("kind", ""), notice.get("preemptor", "")
        return 143, f"preempted ({kind}) for job {preemptor}: stopped by the worker", True

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._on_sigterm)
        signal.signal(signal.SIGUSR1, self._on_sigusr1)
        become_subreaper()
        if self.self_fencing and (
            os.getppid() != self.parent_pid
            or time.monotonic() >= read_lease_deadline(self.lease_path)
        ):
            self.finish(137, "fenced before start: no valid lease", disrupted=True)
            return 0
        try:
            # Room for the two records written once the member runs, taken before it
            # does: on a disk that fills up meanwhile they can still be written (a member
            # whose pid cannot be recorded could not be killed by a restarted agent).
            reserve(os.path.join(self.dir, "member.json"))
            reserve(os.path.join(self.dir, "exit.json"))
        except OSError as exc:
            # Not started: a disruption (the disk's), not the job's failure.
            self.finish(137, f"not started: no room for the member's records ({exc})", True)
            return 0
        if self.launch.get("prestart") and not self.prestart_passed():
            return 0
        failure = self.start()
        if failure is not None:
            self.finish(EXIT_COULD_NOT_EXEC, failure)
            return 0
        forced, detail, fenced = self.supervise()
        status = self.member_status if self.member_status is not None else 0
        code = os.waitstatus_to_exitcode(status)
        exit_code = 128 - code if code < 0 else code
        if code < 0 and not detail:
            detail = f"killed by signal {-code}"
        if forced is not None and (forced == EXIT_TIME_LIMIT or exit_code == 0):
            exit_code = forced
        if forced is not None or code < 0:
            # The runtime client was stopped or died by a signal: its container may
            # still run under the runtime's monitor.
            self.container.stop()
        self.finish(exit_code, detail, disrupted=fenced)
        return 0

    def prestart_passed(self) -> bool:
        """Run the job's pre-start check (:mod:`~synapse_ha.worker.shim_prestart`); when
        it does not pass, finish: the node's fault, or the stop that cut it short."""
        record = self.launch["prestart"]

        def before_exec(step_write: int) -> Callable[[], None]:
            return _before_exec(record, step_write)

        outcome, detail = run_prestart(record, self.dir, before_exec, self._interrupted)
        if outcome == FAILED:
            detail = f"prestart check failed: {detail}"
            flags = os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW
            with contextlib.suppress(OSError):
                log = os.open(self.launch["log_path"], flags)
                os.write(log, f"synapse-worker: {detail}\n".encode())
                os.close(log)
            self.finish(EXIT_PRESTART_FAILED, detail, node_fault=True)
        elif outcome == INTERRUPTED:
            code, detail, _ = self.stopped() if detail == _STOPPED else (137, detail, True)
            self.finish(code, f"{detail} (during its prestart check)", disrupted=True)
        return outcome not in (FAILED, INTERRUPTED)

    def _interrupted(self) -> str:
        """Why a pre-start check must be cut short ("" : it need not)."""
        if self.fence_requested or (
            self.self_fencing and time.monotonic() >= read_lease_deadline(self.lease_path)
        ):
            return "fenced: the node's lease expired"
        if self.self_fencing and os.getppid() != self.parent_pid:
            return "fenced: the worker agent went away"
        return _STOPPED if self.stop_requested else ""

    def finish(
        self, exit_code: int, detail: str, disrupted: bool = False, node_fault: bool = False
    ) -> None:
        self.container.remove_files()
        write_reserved(
            os.path.join(self.dir, "exit.json"),
            {
                "exit_code": exit_code,
                "detail": detail,
                "ended_at_ms": int(time.time() * 1000),
                "disrupted": disrupted,
                "hung": self.hung,
                "node_fault": node_fault,
            },
        )


# ------------------------------------------------------------------ fork server

FORK_SERVER_FLAG = "--fork-server"


def _run_forked_supervisor(member_dir: str) -> int:
    """In a child of the fork server: become a session of its own with the member
    directory's ``shim.log`` as output, as a supervisor started by the agent would be,
    and supervise the member."""
    os.setsid()
    null = os.open(os.devnull, os.O_RDONLY)
    out = os.open(
        os.path.join(member_dir, "shim.log"),
        os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW,
        0o600,
    )
    os.dup2(null, 0)
    os.dup2(out, 1)
    os.dup2(out, 2)
    os.closerange(3, os.sysconf("SC_OPEN_MAX"))
    pid = os.getpid()
    # The agent's record of its supervisor, which a restarted agent kills (the agent
    # itself learns the pid only from the fork server's answer).
    write_json_atomic(
        os.path.join(member_dir, "shim.json"), {"pid": pid, "start_ticks": process_start_ticks(pid)}
    )
    for sig in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)
    return Shim(member_dir).run()


def serve_forks(agent_pid: int) -> int:
    """The fork server: ``python -I -S shim.py --fork-server AGENT_PID``.

    Started once by the agent with this module imported, it forks one supervisor per
    member directory the agent writes to its stdin (one path a line) and answers each
    with ``PID START_TICKS`` on stdout (``ERR why`` when it could not fork). A fork costs
    a few milliseconds of CPU, where a fresh interpreter costs tens.

    It holds no lease and starts nothing by itself. It exits as soon as the agent is gone:
    its stdin (the agent's pipe) reaches end of file when the agent dies however it dies,
    and its parent changes (checked every ``POLL_S``). A supervisor it forked names the
    fork server as the parent it watches (``parent_pid`` in ``launch.json``), so the
    agent's death reaches every supervisor through the fork server's exit, and each of them
    still watches the lease file on its own.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    buffered = b""
    while True:
        reap_exited()  # the supervisors that ended (their exit is in exit.json)
        if os.getppid() != agent_pid:
            return 0
        ready, _, _ = select.select([0], [], [], POLL_S)
        if not ready:
            continue
        chunk = os.read(0, 65536)
        if not chunk:
            return 0  # the agent closed the pipe or died
        buffered += chunk
        while b"\n" in buffered:
            line, buffered = buffered.split(b"\n", 1)
            member_dir = line.decode("utf-8", "surrogateescape")
            try:
                pid = os.fork()
            except OSError as exc:
                os.write(1, f"ERR {exc}\n".encode())
                continue
            if pid == 0:
                code = 1
                try:
                    code = _run_forked_supervisor(member_dir)
                except BaseException as exc:  # the forked child must never return
                    with contextlib.suppress(OSError):
                        os.write(2, f"supervisor failed: {exc!r}\n".encode())
                finally:
                    os._exit(code)
            os.write(1, f"{pid} {process_start_ticks(pid) or 0}\n".encode())


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) == 2 and args[0] == FORK_SERVER_FLAG:
        return serve_forks(int(args[1]))
    if len(args) != 1:
        print("usage: python -I -S shim.py MEMBER_DIR | --fork-server AGENT_PID", file=sys.stderr)
        return 2
    return Shim(args[0]).run()


if __name__ == "__main__":
    sys.exit(main())
