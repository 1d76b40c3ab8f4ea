"""Gang members on this node: their environment, their launch and their records.

Every member runs under its own supervisor (:mod:`synapse_ha.worker.shim`), which starts
it as a process group of its own and kills that group when the lease expires, when the
agent goes away, on a stop request, or at the time limit. With ``fork_server`` set the
supervisors are forked from one pre-started process (:mod:`synapse_ha.worker.forkserver`,
which explains why a member still never outlives its lease) instead of each starting an
interpreter. This module is the agent's side:

* :func:`member_environment` is the DESIGN §5 contract (torchrun variables and ours);
* :class:`MemberExecutor` starts, stops and polls members, and keeps one directory per
  member under ``DATA_DIR/members/JOB_ID/`` holding the launch description, the output
  log, the supervisor's pid record and the exit record. A member directory is never
  removed while the agent runs, so a (job, fencing token, rank) that ever started here is
  never started again, also after an agent restart;
* :meth:`MemberExecutor.recover` runs at agent start: anything left from a previous life
  of the agent is killed (never re-adopted) and reported as lost.

Identity is (job_id, fencing_token, rank): :class:`MemberKey`.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, NamedTuple, Protocol

from synapse_ha.worker import shim
from synapse_ha.worker.accounts import (
    Account,
    AccountLookup,
    RunAsPolicy,
    RunAsRefusal,
    local_account,
    owner_environment,
    resolve_member_account,
)
from synapse_ha.worker.cgroups import CgroupLimiter
from synapse_ha.worker.forkserver import ForkServer, ForkServerError
from synapse_ha.worker.shim import (
    group_alive,
    process_start_ticks,
    signal_group,
    stop_containers,
    write_json_atomic,
)

log = logging.getLogger("synapse.worker.members")

EXIT_LOST = 137
# A member this node refuses to run under its owner's account (no such account, or root).
EXIT_REFUSED = 126
# The supervisor runs as a script in isolated mode without site-packages (-I -S): it
# needs only the standard library, and skipping site setup saves tens of milliseconds
# on every member start.
SHIM_COMMAND = ("-I", "-S", str(Path(shim.__file__).resolve()))
# The variable naming the file a preempted member finds its notice in (docs/queues.md).
PREEMPT_FILE_ENV = "SYNAPSE_PREEMPT_FILE"
_SAFE_NAME = re.compile(r"^[A-Za-z0-9._-]+$")


class MemberKey(NamedTuple):
    job_id: str
    fencing_token: int
    rank: int

    def __str__(self) -> str:
        return f"{self.job_id}/token {self.fencing_token}/rank {self.rank}"


@dataclass(frozen=True, slots=True)
class LaunchSpec:
    """Everything needed to launch one member (the worker's view of a desired member)."""

    job_id: str
    attempt: int
    fencing_token: int
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    gpus: tuple[int, ...]
    master_addr: str
    master_port: int
    member_hosts: tuple[str, ...]
    command: tuple[str, ...]
    shell: bool = True
    env: tuple[tuple[str, str], ...] = ()
    workdir: str = ""
    time_limit_ms: int = 0
    image: str = ""
    cpu_milli: int = 0
    memory_mib: int = 0
    owner: str = ""  # the job's owner ("": none); see synapse_ha.worker.accounts

    @property
    def key(self) -> MemberKey:
        return MemberKey(self.job_id, self.fencing_token, self.rank)


@dataclass(frozen=True, slots=True)
class PreemptNotice:
    """The leader is preempting this member's gang: why (``reclaim`` | ``priority``), for
    which job, and the grace left before SIGKILL (ms, counted from when it arrived)."""

    kind: str
    preemptor: str
    grace_ms: int


@dataclass(frozen=True, slots=True)
class MemberExit:
    exit_code: int
    detail: str
    ended_at_ms: int
    # True when the worker, not the member's own program, ended it (fenced, killed at
    # shutdown or restart, supervisor gone): a disruption, not the job's failure.
    disrupted: bool = False


# ---------------------------------------------------------------- environment


def member_environment(
    spec: LaunchSpec, base: Mapping[str, str], account: Account | None = None
) -> dict[str, str]:
    """The member's environment: ``base``, then ``HOME``, ``USER`` and ``LOGNAME`` of the
    ``account`` it runs as (when it runs as its owner), then the job's ``env``, then the
    DESIGN §5 variables (which the job cannot override: they define the gang)."""
    env = dict(base)
    if account is not None:
        env.update(owner_environment(account))
    env.update(spec.env)
    env.update(
        {
            "MASTER_ADDR": spec.master_addr,
            "MASTER_PORT": str(spec.master_port),
            "WORLD_SIZE": str(spec.world_size),
            "RANK": str(spec.rank),
            "NNODES": str(spec.world_size),
            "NODE_RANK": str(spec.rank),
            "LOCAL_RANK": str(spec.local_rank),
            "LOCAL_WORLD_SIZE": str(spec.local_world_size),
            "CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in spec.gpus),
            "SYNAPSE_JOB_ID": spec.job_id,
            "SYNAPSE_ATTEMPT": str(spec.attempt),
            "SYNAPSE_FENCING_TOKEN": str(spec.fencing_token),
            "SYNAPSE_MEMBER_HOSTS": ",".join(spec.member_hosts),
        }
    )
    return env


CDI_GPU_DEVICE = "nvidia.com/gpu={index}"


@dataclass(frozen=True, slots=True)
class ImageRuntime:
    """A container runtime's command line (podman, or docker with the same flags) that
    runs members whose job names an image.

    ``command`` is the runtime's own argv prefix (``("podman",)`` or
    ``("podman", "--runtime", "runc")``); ``run_args`` are extra ``run`` options from the
    node's configuration (``--ipc host``, ``--shm-size 16g``, ``--ulimit ...``). A member
    becomes::

        COMMAND run --rm --name synapse-JOB-TOKEN-RANK --network host
            [--device nvidia.com/gpu=I ...] [--cpus C] [--memory Mm]
            [--user UID:GID --group-add GID ...] RUN_ARGS
            --env NAME ... [--workdir DIR] IMAGE ARGV...

    * ``--env NAME`` (no value) makes the runtime copy the variable from its own
      environment, which the supervisor sets to the member's: every job variable and every
      DESIGN §5 variable reaches the container, and no value shows in a process listing.
    * GPUs are passed as CDI devices only when ``gpu_devices`` is set (GPUs discovered
      through NVML; mock GPUs have no devices). The container then sees only its own GPUs,
      numbered from 0, so ``CUDA_VISIBLE_DEVICES`` inside it is ``0..k-1``
      (:func:`container_environment`).
    * CPU and memory limits go to the runtime (``--cpus``, ``--memory``): the container's
      processes are children of the runtime's monitor, not of the supervisor, so the
      member cgroup would not hold them.
    * The container is named after the member, so the supervisor (and a restarted agent)
      can stop it by name: :meth:`stop_argvs` (``kill`` and then ``rm -f``).
    * A member that runs as its owner runs in the container with the owner's uid, gid and
      supplementary groups (``--user``, ``--group-add``); the runtime's client itself runs
      as the agent's account, which must be allowed to start containers.
    """

    command: tuple[str, ...]
    run_args: tuple[str, ...] = ()
    gpu_devices: bool = False

    @classmethod
    def parse(cls, command: str, run_args: str = "", *, gpu_devices: bool = False) -> ImageRuntime:
        """From configuration text split like a shell line; raises ValueError naming what
        is wrong."""
        try:
            words = tuple(shlex.split(command))
            extra = tuple(shlex.split(run_args))
        except ValueError as exc:
            raise ValueError(f"image runtime: {exc}") from None
        if not words:
            raise ValueError("image runtime: the runtime command is empty")
        if any("{" in w for w in words):
            raise ValueError(
                "image runtime: give the runtime command (e.g. podman), not a template; "
                "synapse builds the run command itself"
            )
        if any(w in ("run", "create") for w in words[1:]):
            raise ValueError(
                "image runtime: give the runtime command without its subcommand "
                "(e.g. podman, not podman run); extra run options go to the run arguments"
            )
        return cls(words, extra, gpu_devices)

    @staticmethod
    def container_name(key: MemberKey) -> str:
        return f"synapse-{key.job_id}-{key.fencing_token}-{key.rank}"

    def run_argv(
        self,
        spec: LaunchSpec,
        argv: Sequence[str],
        env_names: Iterable[str],
        account: Account | None = None,
    ) -> list[str]:
        out = [
            *self.command,
            "run",
            "--rm",
            "--name",
            self.container_name(spec.key),
            "--network",
            "host",
        ]
        if self.gpu_devices:
            for gpu in spec.gpus:
                out += ["--device", CDI_GPU_DEVICE.format(index=gpu)]
        if spec.cpu_milli > 0:
            out += ["--cpus", f"{spec.cpu_milli // 1000}.{spec.cpu_milli % 1000:03d}"]
        if spec.memory_mib > 0:
            out += ["--memory", f"{spec.memory_mib}m"]
        if account is not None:
            out += ["--user", f"{account.uid}:{account.gid}"]
            for gid in account.groups:
                if gid != account.gid:
                    out += ["--group-add", str(gid)]
        out += self.run_args
        for name in env_names:
            out += ["--env", name]
        if spec.workdir:
            out += ["--workdir", spec.workdir]
        out.append(spec.image)
        out += argv
        return out

    def stop_argvs(self, key: MemberKey) -> list[list[str]]:
        """Commands that end the member's container whatever state it is in (each may
        fail harmlessly when the container is already gone)."""
        name = self.container_name(key)
        return [[*self.command, "kill", name], [*self.command, "rm", "-f", name]]


class NoImageRuntime(ValueError):
    """The member names an image and this node has no image runtime."""


def command_argv(spec: LaunchSpec) -> list[str]:
    """The member's own argv: a string command under ``/bin/sh -c``, a list as is."""
    if spec.shell:
        argv = ["/bin/sh", "-c", spec.command[0] if spec.command else ""]
    else:
        argv = list(spec.command)
    if not argv or not argv[0]:
        raise ValueError("empty command")
    return argv


def container_environment(
    spec: LaunchSpec, env: Mapping[str, str], runtime: ImageRuntime
) -> dict[str, str]:
    """The environment handed to a containerised member: as on the host, except that
    with GPU devices the container numbers its GPUs from 0."""
    out = dict(env)
    if runtime.gpu_devices:
        out["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in range(len(spec.gpus)))
    return out


def member_argv(
    spec: LaunchSpec, runtime: ImageRuntime | None = None, account: Account | None = None
) -> list[str]:
    """The argv to exec, wrapped in the image runtime when the job names an image (run as
    ``account`` inside the container when given). Raises :class:`NoImageRuntime` for an
    image on a node without a runtime, ValueError for an empty command."""
    argv = command_argv(spec)
    if spec.image:
        if runtime is None:
            raise NoImageRuntime(
                f"job names image {spec.image!r} but this node has no image runtime "
                "(synapse-worker --image-runtime)"
            )
        names = [*(k for k, _ in spec.env), *member_environment(spec, {})]
        argv = runtime.run_argv(spec, argv, dict.fromkeys(names), account)
    return argv


# ------------------------------------------------------------------- executor


@dataclass(frozen=True, slots=True)
class ExecutorSettings:
    stop_grace_s: float = 5.0  # SIGTERM → SIGKILL on a graceful stop and at the time limit
    fence_grace_s: float = 0.5  # SIGTERM → SIGKILL when the lease is lost
    python: str = sys.executable  # interpreter that runs the supervisor
    base_env: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    # False only in the deliberately broken test build (synapse_ha.programs.worker): the
    # supervisors then ignore the lease file and the agent's disappearance.
    self_fencing: bool = True
    # Whose account members run under; None: the agent's own, whoever owns the job.
    run_as: RunAsPolicy | None = None
    # Fork supervisors from one pre-started fork server (synapse_ha.worker.forkserver)
    # instead of starting an interpreter per member; the executor must then be closed.
    fork_server: bool = False


class Supervisor(Protocol):
    """A member's supervisor process as the executor handles it: a
    :class:`subprocess.Popen` of ``shim.py``, or one forked by the fork server."""

    @property
    def pid(self) -> int: ...
    def poll(self) -> int | None: ...
    def send_signal(self, sig: int, /) -> None: ...
    def kill(self) -> None: ...
    def wait(self, timeout: float | None = None) -> int: ...


@dataclass(slots=True)
class Member:
    spec: LaunchSpec
    dir: Path
    shim: Supervisor | None
    started_at_ms: int
    exit: MemberExit | None = None
    stop_sent: bool = False

    @property
    def key(self) -> MemberKey:
        return self.spec.key


def give_to_owner(member_dir: Path, log_path: Path, account: Account) -> None:
    """The output log becomes the owner's; the member directory stays the agent's but
    the owner's group may read and enter it (and no one else)."""
    os.chown(log_path, account.uid, account.gid)
    os.chmod(log_path, 0o640)
    os.chown(member_dir, -1, account.gid)
    os.chmod(member_dir, 0o750)


def member_dir_name(attempt: int, fencing_token: int, rank: int) -> str:
    return f"a{attempt}.t{fencing_token}.r{rank}"


_DIR_PATTERN = re.compile(r"^a(\d+)\.t(\d+)\.r(\d+)$")


def parse_member_dir_name(name: str) -> tuple[int, int, int] | None:
    """(attempt, fencing token, rank) from a member directory name."""
    m = _DIR_PATTERN.match(name)
    return (int(m.group(1)), int(m.group(2)), int(m.group(3))) if m else None


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def kill_recorded_process(record: dict[str, Any] | None, pid_key: str = "pid") -> bool:
    """SIGKILL the process group named by a pid record, if that very process (same pid
    and start time) still exists. Returns whether something was killed."""
    if not record or not isinstance(record.get(pid_key), int):
        return False
    pid = int(record[pid_key])
    ticks = record.get("start_ticks")
    alive_ticks = process_start_ticks(pid)
    if alive_ticks is None or (ticks is not None and alive_ticks != ticks):
        # The leader of the group is gone (or the pid was reused); the rest of the group
        # may still exist, and a pgid is not reused while any member of it lives.
        if group_alive(pid) and ticks is not None and alive_ticks is None:
            signal_group(pid, signal.SIGKILL)
            return True
        return False
    signal_group(pid, signal.SIGKILL)
    return True


def stop_recorded_container(member_dir: Path) -> bool:
    """End the container a member directory's launch record names, if any (a supervisor
    that died or was killed could not). Returns whether the member ran in a container."""
    launch = read_json(member_dir / "launch.json")
    argvs = launch.get("container_stop") if launch else None
    if not isinstance(argvs, list) or not argvs:
        return False
    stop_containers([[str(word) for word in argv] for argv in argvs if isinstance(argv, list)])
    return True


def running_groups() -> set[int]:
    """Process group ids with at least one process that is not a zombie (from /proc)."""
    groups: set[int] = set()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", encoding="utf-8") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) > 2 and fields[0] not in ("Z", "X"):
            groups.add(int(fields[2]))
    return groups


class MemberExecutor:
    """Starts, stops and observes the members of this node. Not thread-safe: the agent
    loop is its only caller (the log server only reads files)."""

    def __init__(
        self,
        data_dir: Path,
        lease_path: Path,
        settings: ExecutorSettings | None = None,
        *,
        image_runtime: ImageRuntime | None = None,
        cgroups: CgroupLimiter | None = None,
        wall_clock_ms: Callable[[], int] = lambda: int(time.time() * 1000),
        lookup_account: AccountLookup = local_account,
    ) -> None:
        self.root = data_dir / "members"
        self.root.mkdir(parents=True, exist_ok=True)
        self.lease_path = lease_path
        self.settings = settings or ExecutorSettings()
        self.image_runtime = image_runtime
        self.cgroups = cgroups
        self.wall_clock_ms = wall_clock_ms
        self.lookup_account = lookup_account
        self.members: dict[MemberKey, Member] = {}
        # Every key that ever started on this node (persisted as member directories).
        self.known: set[MemberKey] = set()
        self.highest_token: dict[str, int] = {}
        # Members that failed before a supervisor could start (bad command, no runtime).
        self._immediate_exits: list[tuple[MemberKey, MemberExit]] = []
        self._forks = (
            ForkServer(self.settings.python, 2 * shim.POLL_S + self.settings.fence_grace_s + 0.5)
            if self.settings.fork_server
            else None
        )
        if self._forks is not None:
            # Started now, so that the first member does not wait for an interpreter.
            try:
                self._forks.start()
            except OSError as exc:
                log.warning("no fork server (%s): supervisors start as interpreters", exc)

    # ------------------------------------------------------------- lifecycle

    def member_dir(self, key: MemberKey, attempt: int) -> Path:
        return self.root / key.job_id / member_dir_name(attempt, key.fencing_token, key.rank)

    def start(self, spec: LaunchSpec, preempted: PreemptNotice | None = None) -> Member:
        """Start one member under its supervisor. Never raises for a bad command or an
        owner this node will not run members as: those come back as an exit (code 127,
        resp. :data:`EXIT_REFUSED` with the refusal as detail) on the next :meth:`poll`.

        ``preempted``: the member's gang was preempted before it started here. Nothing is
        run; the member is recorded (so it never starts later) with an exit of 143, a
        disruption, which confirms to the leader that it is stopped.

        When the member runs as its owner, its output log belongs to the owner and its
        directory to the owner's group (readable, not writable: the pid and exit records
        in it are the agent's, and the agent acts on them as root); the supervisor drops
        to the owner's uid, gid and groups in the member's process before exec.

        Not idempotent by itself: the caller checks :attr:`known` first.
        """
        key = spec.key
        if not _SAFE_NAME.match(spec.job_id):
            raise ValueError(f"job id {spec.job_id!r} is not a safe file name")
        mdir = self.member_dir(key, spec.attempt)
        mdir.mkdir(parents=True, exist_ok=False)
        self.known.add(key)
        self.highest_token[key.job_id] = max(
            self.highest_token.get(key.job_id, 0), key.fencing_token
        )
        now_ms = self.wall_clock_ms()
        member = Member(spec=spec, dir=mdir, shim=None, started_at_ms=now_ms)
        self.members[key] = member
        log_path = mdir / "output.log"
        log_path.touch()
        if preempted is not None:
            detail = f"preempted ({preempted.kind}) for job {preempted.preemptor} before it started"
            if not preempted.preemptor:
                detail = f"not started: {preempted.kind}"
            self._record_exit(member, MemberExit(143, detail, now_ms, disrupted=True))
            return member
        account: Account | None = None
        if self.settings.run_as is not None:
            resolved = resolve_member_account(self.settings.run_as, spec.owner, self.lookup_account)
            if isinstance(resolved, RunAsRefusal):
                self._record_exit(member, MemberExit(EXIT_REFUSED, resolved.describe(), now_ms))
                return member
            account = resolved
        try:
            argv = member_argv(spec, self.image_runtime, account)
        except ValueError as exc:
            self._record_exit(member, MemberExit(127, f"could not exec: {exc}", now_ms))
            return member
        if account is not None:
            try:
                give_to_owner(mdir, log_path, account)
            except OSError as exc:
                detail = f"could not give the member's files to {account.name}: {exc}"
                self._record_exit(member, MemberExit(EXIT_REFUSED, detail, now_ms))
                return member
        env = member_environment(spec, self.settings.base_env, account)
        # Written only when the gang is preempted (:meth:`preempt`), before the SIGTERM.
        env[PREEMPT_FILE_ENV] = str(mdir / shim.PREEMPT_FILE)
        cgroup_dir = ""
        container_stop: list[list[str]] = []
        cwd = spec.workdir
        if spec.image and self.image_runtime is not None:
            # The runtime enforces the limits and sets the working directory inside
            # the container; the runtime's own client runs in the member directory.
            env = container_environment(spec, env, self.image_runtime)
            container_stop = self.image_runtime.stop_argvs(key)
            cwd = str(mdir)
        elif self.cgroups is not None:
            cgroup_dir = self.cgroups.create(
                f"{key.job_id}.t{key.fencing_token}.r{key.rank}", spec.cpu_milli, spec.memory_mib
            )
        launch: dict[str, Any] = {
            "key": list(key),
            "attempt": spec.attempt,
            "argv": argv,
            "env": env,
            "cwd": cwd,
            "container_stop": container_stop,
            "log_path": str(log_path),
            "lease_path": str(self.lease_path),
            "parent_pid": os.getpid(),  # or the fork server's: see _start_supervisor
            "stop_grace_s": self.settings.stop_grace_s,
            "fence_grace_s": self.settings.fence_grace_s,
            "time_limit_ms": spec.time_limit_ms,
            "cgroup_dir": cgroup_dir,
            "self_fencing": self.settings.self_fencing,
            # The container runtime's client stays the agent's; --user drops inside.
            "run_as": None
            if account is None or (spec.image and self.image_runtime is not None)
            else {"uid": account.uid, "gid": account.gid, "groups": list(account.groups)},
        }
        try:
            member.shim = self._start_supervisor(mdir, launch)
        except OSError as exc:
            self._record_exit(member, MemberExit(127, f"could not start supervisor: {exc}", now_ms))
            return member
        if isinstance(member.shim, subprocess.Popen):
            # A forked supervisor writes its own record (the agent learns its pid later).
            write_json_atomic(
                mdir / "shim.json",
                {"pid": member.shim.pid, "start_ticks": process_start_ticks(member.shim.pid)},
            )
        return member

    def _start_supervisor(self, mdir: Path, launch: dict[str, Any]) -> Supervisor:
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
        with open(mdir / "shim.log", "ab") as shim_log:
            return subprocess.Popen(
                [self.settings.python, *SHIM_COMMAND, str(mdir)],
                stdin=subprocess.DEVNULL,
                stdout=shim_log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                close_fds=True,
            )

    @property
    def fork_server_pid(self) -> int | None:
        """The running fork server's pid (started now if it is not running), or None
        without one."""
        return self._forks.start() if self._forks is not None else None

    def close(self) -> None:
        """Stop the fork server, if any. Supervisors it forked watch it: call this only
        once every member is stopped (:meth:`stop_all`)."""
        if self._forks is not None:
            self._forks.close()

    def stop(self, key: MemberKey) -> None:
        """Ask a member's supervisor to stop it (SIGTERM, grace, SIGKILL). Asynchronous and
        idempotent; the exit shows up in :meth:`poll`."""
        member = self.members.get(key)
        if member is None or member.exit is not None or member.stop_sent:
            return
        member.stop_sent = True
        if member.shim is not None and member.shim.poll() is None:
            member.shim.send_signal(signal.SIGTERM)

    def preempt(self, key: MemberKey, notice: PreemptNotice) -> None:
        """Stop a member whose gang is preempted: write the notice to the member's
        ``$SYNAPSE_PREEMPT_FILE`` (JSON: kind, preemptor, grace_ms), then ask its
        supervisor to stop it, which sends SIGTERM to the member's process group at once
        and SIGKILL when ``notice.grace_ms`` has passed (the lease still ends it sooner).
        Asynchronous and idempotent; the exit shows up in :meth:`poll`, a disruption."""
        member = self.members.get(key)
        if member is None or member.exit is not None or member.stop_sent:
            return
        notice_doc = {
            "kind": notice.kind,
            "preemptor": notice.preemptor,
            "grace_ms": max(0, notice.grace_ms),
        }
        # On a full disk the member is stopped all the same, without the notice (its
        # supervisor then gives it the plain stop grace).
        _tolerate_full_disk(
            lambda: write_json_atomic(member.dir / shim.PREEMPT_FILE, notice_doc), member.dir
        )
        log.info(
            "preempting %s (%s, for job %s; grace %d ms)",
            key,
            notice.kind,
            notice.preemptor,
            notice.grace_ms,
        )
        self.stop(key)

    def poll(self) -> list[tuple[MemberKey, MemberExit]]:
        """Members whose supervisor has finished since the last call, with their exit."""
        out, self._immediate_exits = self._immediate_exits, []
        for member in self.members.values():
            if member.exit is not None or member.shim is None:
                continue
            if member.shim.poll() is None:
                continue
            out.append((member.key, self._collect_exit(member)))
        return out

    def running(self) -> list[MemberKey]:
        return [k for k, m in self.members.items() if m.exit is None]

    def gpus_held(self) -> dict[MemberKey, tuple[int, ...]]:
        """The GPUs of each running member (one whose supervisor has not yet recorded
        that its whole process group is gone)."""
        return {k: m.spec.gpus for k, m in self.members.items() if m.exit is None and m.spec.gpus}

    def kill_all(self, detail: str, timeout_s: float = 10.0) -> list[tuple[MemberKey, MemberExit]]:
        """Fence: kill every running member now (SIGTERM, ``fence_grace_s``, SIGKILL) and
        wait until their supervisors are gone. Returns the exits, each naming ``detail``,
        except those of members that had already exited by themselves (left to poll())."""
        live = [m for m in self.members.values() if m.exit is None]
        # A member whose supervisor recorded its exit before the fence ended by itself:
        # what is left of it is killed all the same, but that exit stands (an exit 0 is a
        # success the leader may not have seen yet) and the next poll() returns it.
        ended = {m.key for m in live if (m.dir / "exit.json").exists()}
        for m in live:
            # The supervisor fences its member (also one it is starting right now); the
            # group is signalled directly too in case the supervisor is stuck.
            if m.shim is not None and m.shim.poll() is None:
                m.shim.send_signal(signal.SIGUSR1)
            self._signal_member_group(m, signal.SIGTERM)
        deadline = time.monotonic() + self.settings.fence_grace_s + 1.0
        while time.monotonic() < deadline and any(self._tree_alive(m) for m in live):
            time.sleep(0.01)
        for m in live:
            self._signal_member_group(m, signal.SIGKILL)
            if m.shim is not None and m.shim.poll() is None:
                m.shim.kill()
        out = []
        for m in live:
            if m.shim is not None:
                try:
                    m.shim.wait(timeout=timeout_s)
                except subprocess.TimeoutExpired:
                    log.error("supervisor of %s did not exit after SIGKILL", m.key)
            if m.key in ended:
                continue
            found = self._collect_exit(m)
            exit_code = found.exit_code if found.exit_code != 0 else EXIT_LOST
            m.exit = MemberExit(exit_code, detail, found.ended_at_ms, disrupted=True)
            self._write_exit_record(m)
            out.append((m.key, m.exit))
        return out

    def stop_all(self, timeout_s: float) -> list[tuple[MemberKey, MemberExit]]:
        """Graceful shutdown: stop every member and wait up to ``timeout_s``; whatever is
        left then is killed. Every exit it returns counts as a disruption: the members
        ended because the worker stopped, not by their own doing."""
        for key in self.running():
            self.stop(key)
        deadline = time.monotonic() + timeout_s
        out = []
        while self.running() and time.monotonic() < deadline:
            out += self.poll()
            time.sleep(0.02)
        out += self.poll()
        if self.running():
            out += self.kill_all("killed at worker shutdown")
            out += self.poll()  # members that ended by themselves meanwhile
        return [(key, replace(exit_, disrupted=True)) for key, exit_ in out]

    # ---------------------------------------------------------------- records

    def recover(self) -> list[tuple[MemberKey, MemberExit]]:
        """At agent start: learn every member this node ever ran, kill whatever a previous
        life of the agent left running, and return the exits not yet reported (members
        left running come back as lost, exit code 137). Nothing is re-adopted."""
        out = []
        killed_groups: list[int] = []
        for job_dir in sorted(p for p in self.root.iterdir() if p.is_dir()):
            for mdir in sorted(p for p in job_dir.iterdir() if p.is_dir()):
                parsed = parse_member_dir_name(mdir.name)
                if parsed is None:
                    continue
                attempt, token, rank = parsed
                key = MemberKey(job_dir.name, token, rank)
                self.known.add(key)
                self.highest_token[key.job_id] = max(self.highest_token.get(key.job_id, 0), token)
                killed_shim = kill_recorded_process(read_json(mdir / "shim.json"))
                member_record = read_json(mdir / "member.json")
                killed_member = kill_recorded_process(member_record)
                if killed_member and member_record is not None:
                    killed_groups.append(int(member_record["pid"]))
                if (mdir / "reported").exists():
                    continue
                record = read_json(mdir / "exit.json")
                if record is None or killed_shim or killed_member:
                    stop_recorded_container(mdir)
                    ended = self.wall_clock_ms()
                    exit_ = MemberExit(
                        EXIT_LOST,
                        "lost: left running by a previous worker agent; killed",
                        ended,
                        disrupted=True,
                    )
                else:
                    exit_ = MemberExit(
                        int(record.get("exit_code", EXIT_LOST)),
                        str(record.get("detail", "")),
                        int(record.get("ended_at_ms", 0)),
                        bool(record.get("disrupted", False)),
                    )
                spec = LaunchSpec(
                    job_id=key.job_id,
                    attempt=attempt,
                    fencing_token=token,
                    rank=rank,
                    world_size=0,
                    local_rank=0,
                    local_world_size=0,
                    gpus=(),
                    master_addr="",
                    master_port=0,
                    member_hosts=(),
                    command=(),
                )
                member = Member(spec=spec, dir=mdir, shim=None, started_at_ms=0, exit=exit_)
                self._write_exit_record(member)
                self.members[key] = member
                out.append((key, exit_))
        # Report them lost only once nothing of them runs any more.
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline and running_groups() & set(killed_groups):
            time.sleep(0.01)
        return out

    def mark_reported(self, key: MemberKey) -> None:
        """The control plane has acknowledged this member's exit; it is never reported
        again, also after an agent restart."""
        member = self.members.pop(key, None)
        if member is not None:
            # Without the mark (a full disk) an agent restarted later reports the exit
            # again: reports are at-least-once.
            _tolerate_full_disk(lambda: (member.dir / "reported").touch(), member.dir)
            if self.cgroups is not None:
                self.cgroups.remove(f"{key.job_id}.t{key.fencing_token}.r{key.rank}")

    # ---------------------------------------------------------------- helpers

    def _collect_exit(self, member: Member) -> MemberExit:
        record = read_json(member.dir / "exit.json")
        if record is not None:
            exit_ = MemberExit(
                int(record.get("exit_code", EXIT_LOST)),
                str(record.get("detail", "")),
                int(record.get("ended_at_ms", self.wall_clock_ms())),
                bool(record.get("disrupted", False)),
            )
        else:
            # The supervisor died without a record: make sure nothing of the member lives.
            kill_recorded_process(read_json(member.dir / "member.json"))
            stop_recorded_container(member.dir)
            exit_ = MemberExit(
                EXIT_LOST, "lost: its supervisor died", self.wall_clock_ms(), disrupted=True
            )
            record = {
                "exit_code": exit_.exit_code,
                "detail": exit_.detail,
                "ended_at_ms": 0,
                "disrupted": True,
            }
            _tolerate_full_disk(
                lambda: write_json_atomic(member.dir / "exit.json", record), member.dir
            )
        member.exit = exit_
        return exit_

    def _record_exit(self, member: Member, exit_: MemberExit) -> None:
        member.exit = exit_
        self._write_exit_record(member)

        def note() -> None:
            with open(member.dir / "output.log", "ab") as f:
                f.write(f"synapse-worker: {exit_.detail}\n".encode())

        _tolerate_full_disk(note, member.dir)
        self._immediate_exits.append((member.key, exit_))

    def _write_exit_record(self, member: Member) -> None:
        """The exit on disk, for an agent restarted later; the exit this agent reports is
        the one in memory, so a full disk only loses the copy."""
        assert member.exit is not None
        record = {
            "exit_code": member.exit.exit_code,
            "detail": member.exit.detail,
            "disrupted": member.exit.disrupted,
            "ended_at_ms": member.exit.ended_at_ms,
        }
        _tolerate_full_disk(lambda: write_json_atomic(member.dir / "exit.json", record), member.dir)

    def _signal_member_group(self, member: Member, sig: int) -> None:
        record = read_json(member.dir / "member.json")
        if record and isinstance(record.get("pgid"), int):
            signal_group(int(record["pgid"]), sig)

    def _tree_alive(self, member: Member) -> bool:
        record = read_json(member.dir / "member.json")
        if record and isinstance(record.get("pgid"), int) and group_alive(int(record["pgid"])):
            return True
        return member.shim is not None and member.shim.poll() is None


def _tolerate_full_disk(write: Callable[[], object], where: Path) -> None:
    """Run ``write`` (a record kept on disk for later); log instead of raising when the
    disk refuses it, so that a full disk never stops the agent."""
    try:
        write()
    except OSError as exc:
        log.error("could not write under %s: %s", where, exc)
