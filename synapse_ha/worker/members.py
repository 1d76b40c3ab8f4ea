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
* the launch path is a privilege boundary: when the agent is root, nothing the job
  controls reaches a root process. The member's environment (the job's variables, which
  may name ``LD_PRELOAD`` or ``PATH``) is used only after the drop to its owner; the
  supervisors get :func:`supervisor_environment`, the container runtime a fixed one, by
  absolute path, with the image checked as an image reference and containers confined
  (:class:`ImageRuntime`). Everything the agent reads back as root (records, lease) is in
  directories only it may write, and read and written without following links;
* :meth:`MemberExecutor.recover` runs at agent start: anything left from a previous life
  of the agent is killed (never re-adopted) and reported as lost.

Identity is (job_id, fencing_token, rank): :class:`MemberKey`.
"""

from __future__ import annotations

import json
import logging
import os
import pwd
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, NamedTuple, Protocol

from synapse_ha.core.validation import image_reference_problem
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
    remove_container_dir,
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
# The members root and each job's directory: entered by every member on the way to its
# own directory, listed and changed by the agent alone.
PASSAGE_MODE = 0o711


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
# The directory of a member in a container that holds its environment file and the id
# file the runtime writes (see synapse_ha.worker.shim); only the runtime's account may
# enter it.
CONTAINER_DIR = "container"
# The whole environment of every root process the worker starts besides the member: the
# container runtime's client, its stop commands and the supervisors. Nothing of the job's
# and nothing that changes how the loader or an interpreter behaves.
FIXED_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
FIXED_LANG = "C.UTF-8"

# Variables that change what the dynamic loader, the C library, a shell or an
# interpreter does: the names glibc drops for set-user-ID programs (unsecvars.h), the
# interpreters' own, and the container tools' configuration. A supervisor never gets
# them, whoever set them (see supervisor_environment); a member may carry them, since it
# runs as its own account.
_PROCESS_CHANGING_PREFIXES = ("LD_", "DYLD_", "MALLOC_", "GLIBC_", "PYTHON", "BASH_FUNC_")
_PROCESS_CHANGING_NAMES = frozenset(
    {
        "BASH_ENV",
        "CDPATH",
        "CONTAINERS_CONF",
        "CONTAINERS_REGISTRIES_CONF",
        "CONTAINERS_STORAGE_CONF",
        "CONTAINER_HOST",
        "DOCKER_CONFIG",
        "DOCKER_HOST",
        "ENV",
        "GCONV_PATH",
        "GETCONF_DIR",
        "HOSTALIASES",
        "IFS",
        "LOCALDOMAIN",
        "LOCPATH",
        "NIS_PATH",
        "NLSPATH",
        "NODE_OPTIONS",
        "OPENSSL_CONF",
        "PERL5LIB",
        "PERL5OPT",
        "PERLLIB",
        "REGISTRY_AUTH_FILE",
        "RESOLV_HOST_CONF",
        "RES_OPTIONS",
        "RUBYLIB",
        "RUBYOPT",
        "SHELLOPTS",
        "TMPDIR",
        "TZDIR",
    }
)


def changes_process_behaviour(name: str) -> bool:
    """Whether the variable ``name`` changes how the loader, the C library, a shell, an
    interpreter or a container tool behaves (``LD_PRELOAD``, ``PYTHONSTARTUP``,
    ``GCONV_PATH``, ``CONTAINERS_CONF``, ...)."""
    return name in _PROCESS_CHANGING_NAMES or name.startswith(_PROCESS_CHANGING_PREFIXES)


def supervisor_environment(agent_env: Mapping[str, str]) -> dict[str, str]:
    """The environment of the supervisors and their fork server (root processes when the
    agent is root): the agent's own, without any variable that changes how a process
    behaves, and with the fixed ``PATH``. The job's variables never reach it: they are
    data in the launch record."""
    env = {k: v for k, v in agent_env.items() if not changes_process_behaviour(k)}
    env["PATH"] = FIXED_PATH
    return env


# Linux capabilities (capability.h) an operator may let containers keep.
CAPABILITIES = frozenset(
    {
        "AUDIT_CONTROL",
        "AUDIT_READ",
        "AUDIT_WRITE",
        "BLOCK_SUSPEND",
        "BPF",
        "CHECKPOINT_RESTORE",
        "CHOWN",
        "DAC_OVERRIDE",
        "DAC_READ_SEARCH",
        "FOWNER",
        "FSETID",
        "IPC_LOCK",
        "IPC_OWNER",
        "KILL",
        "LEASE",
        "LINUX_IMMUTABLE",
        "MAC_ADMIN",
        "MAC_OVERRIDE",
        "MKNOD",
        "NET_ADMIN",
        "NET_BIND_SERVICE",
        "NET_BROADCAST",
        "NET_RAW",
        "PERFMON",
        "SETFCAP",
        "SETGID",
        "SETPCAP",
        "SETUID",
        "SYSLOG",
        "SYS_ADMIN",
        "SYS_BOOT",
        "SYS_CHROOT",
        "SYS_MODULE",
        "SYS_NICE",
        "SYS_PACCT",
        "SYS_PTRACE",
        "SYS_RAWIO",
        "SYS_RESOURCE",
        "SYS_TIME",
        "SYS_TTY_CONFIG",
        "WAKE_ALARM",
    }
)

# Run options the node's configuration may not give the runtime: each would undo the
# confinement synapse gives every container (identity, capabilities, security options,
# privileged mode, namespaces of the host's users), or replace what synapse sets itself.
_REFUSED_RUN_OPTIONS = {
    "privileged": "runs the container with every capability and device",
    "cap-add": "adds capabilities; list them with --image-cap-add instead",
    "cap-drop": "synapse drops every capability itself",
    "security-opt": "synapse sets the security options (no-new-privileges) itself",
    "user": "members run as their owner's uid:gid",
    "group-add": "members run with their owner's groups",
    "userns": "changes whose uids the container's uids are",
    "env": "the job's variables reach the container through synapse's env file",
    "env-file": "the job's variables reach the container through synapse's env file",
    "env-host": "would copy the runtime's environment into the container",
    "env-merge": "the job's variables reach the container through synapse's env file",
    "unsetenv": "the job's variables reach the container through synapse's env file",
    "unsetenv-all": "the job's variables reach the container through synapse's env file",
    "name": "synapse names each container after its member",
    "rm": "synapse removes each container itself",
    "cidfile": "synapse sets the container id file itself",
    "network": "members use the host's network",
    "net": "members use the host's network",
    "workdir": "the job's workdir is the container's working directory",
    "volumes-from": "would mount another container's volumes",
}
# Bind sources that give a container the host's root file system, its devices or kernel
# interfaces, or a container runtime's API socket (which is root).
_REFUSED_BIND_SOURCES = frozenset(
    {"/", "/boot", "/dev", "/etc", "/proc", "/root", "/run", "/sys", "/usr", "/var"}
    | {"/var/lib", "/var/run"}
)


def run_args_problem(run_args: Sequence[str]) -> str:
    """Empty when the node's extra run options may be given to the runtime, else what is
    wrong. Options must be written in long form (``--ipc host`` or ``--ipc=host``) so
    that they can be checked: none of :data:`_REFUSED_RUN_OPTIONS`, and no ``--volume`` or
    ``--mount`` whose source is ``/``, a system directory or a socket."""
    words = list(run_args)
    for i, word in enumerate(words):
        if word.startswith("-") and not word.startswith("--"):
            return f"{word!r}: write run options in long form (e.g. --volume, not -v)"
        if not word.startswith("--"):
            continue
        name, _, inline = word[2:].partition("=")
        if name in _REFUSED_RUN_OPTIONS:
            return f"--{name} is not allowed: {_REFUSED_RUN_OPTIONS[name]}"
        if name in ("volume", "mount"):
            value = inline if "=" in word else (words[i + 1] if i + 1 < len(words) else "")
            source = _bind_source(name, value)
            if source is not None and (
                os.path.normpath(source) in _REFUSED_BIND_SOURCES or source.endswith(".sock")
            ):
                return f"--{name} {value}: a container may not mount {source}"
    return ""


def _bind_source(option: str, value: str) -> str | None:
    """The host path a ``--volume SRC:DST`` or ``--mount type=bind,source=SRC,...``
    mounts, or None when it mounts none (a named volume, a tmpfs)."""
    if option == "volume":
        source = value.split(":", 1)[0]
        return source if source.startswith("/") else None
    fields = dict(part.partition("=")[::2] for part in value.split(","))
    source = fields.get("source") or fields.get("src") or ""
    return source if source.startswith("/") else None


def capability_names(names: Iterable[str]) -> tuple[str, ...]:
    """Capability names as the runtime takes them (``NET_RAW``; ``CAP_NET_RAW`` and
    lowercase accepted), sorted; raises ValueError naming one that is not a Linux
    capability (``ALL`` included: a container never gets every capability)."""
    out = set()
    for name in names:
        cap = name.strip().upper().removeprefix("CAP_")
        if cap not in CAPABILITIES:
            raise ValueError(
                f"image capabilities: {name!r} is not a Linux capability (e.g. NET_RAW)"
            )
        out.add(cap)
    return tuple(sorted(out))


@dataclass(frozen=True, slots=True)
class ContainerFiles:
    """Where a member in a container gets its variables (``env_file``, read by the
    runtime) and where the runtime says it created the container (``cidfile``): both in
    ``directory``, which only the runtime's account may enter."""

    directory: Path

    @property
    def env_file(self) -> Path:
        return self.directory / "env"

    @property
    def cidfile(self) -> Path:
        return self.directory / "cid"

    @classmethod
    def of_member(cls, member_dir: Path) -> ContainerFiles:
        return cls(member_dir / CONTAINER_DIR)


@dataclass(frozen=True, slots=True)
class ImageRuntime:
    """A container runtime's command line (podman, or docker with the same flags) that
    runs members whose job names an image.

    ``command`` is the runtime's own argv prefix, its program by absolute path (resolved
    once, when the agent starts: :meth:`parse`), such as ``("/usr/bin/podman",)`` or
    ``("/usr/bin/podman", "--runtime", "runc")``; ``run_args`` are extra ``run`` options
    from the node's configuration (``--ipc host``, ``--shm-size 16g``, ``--ulimit ...``),
    checked by :func:`run_args_problem`; ``cap_add`` the capabilities the operator lets
    containers keep. A member becomes::

        COMMAND run RUN_ARGS --rm --name=synapse-JOB-TOKEN-RANK --network=host
            --cidfile=DIR/cid --env-file=DIR/env
            --security-opt=no-new-privileges --cap-drop=all [--cap-add=CAP ...]
            [--device=nvidia.com/gpu=I ...] [--cpus=C] [--memory=Mm]
            [--user=UID:GID --group-add=GID ... | --userns=keep-id]
            [--workdir=DIR] IMAGE ARGV...

    * The runtime runs with a fixed environment (:meth:`client_environment`), never the
      job's: every job variable and every DESIGN §5 variable reaches the container
      through the env file, which only the runtime's account can read (and no value shows
      in a process listing).
    * Synapse's own options come after ``RUN_ARGS``, so that theirs cannot replace them,
      and the node's configuration may not hold any that would undo them.
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
      supplementary groups (``--user``, ``--group-add``) while the runtime's client runs
      as root. With ``rootless`` (podman), the client itself runs as the owner, with the
      owner's ``HOME`` and ``XDG_RUNTIME_DIR``, and ``--userns=keep-id`` keeps the owner's
      uid and gid inside the container: the preferred mode, since no root process then
      touches the image or the container at all.
    """

    command: tuple[str, ...]
    run_args: tuple[str, ...] = ()
    gpu_devices: bool = False
    cap_add: tuple[str, ...] = ()
    rootless: bool = False

    def __post_init__(self) -> None:
        if not self.command or not os.path.isabs(self.command[0]):
            raise ValueError("image runtime: the runtime must be given by its absolute path")
        problem = run_args_problem(self.run_args)
        if problem:
            raise ValueError(f"image run arguments: {problem}")
        if capability_names(self.cap_add) != tuple(self.cap_add):
            raise ValueError("image capabilities: give them as capability_names() returns them")

    @classmethod
    def parse(
        cls,
        command: str,
        run_args: str = "",
        *,
        gpu_devices: bool = False,
        cap_add: Iterable[str] = (),
        rootless: bool = False,
        which: Callable[[str], str | None] = shutil.which,
    ) -> ImageRuntime:
        """From configuration text split like a shell line, the program found now on the
        agent's ``PATH`` (``which``) unless given by absolute path; raises ValueError
        naming what is wrong."""
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
        program = words[0]
        if os.path.isabs(program):
            found = program if os.path.isfile(program) and os.access(program, os.X_OK) else None
        else:
            found = which(program)
        if found is None or not os.path.isabs(found):
            raise ValueError(f"image runtime: {program!r} is not an executable")
        return cls(
            (found, *words[1:]),
            extra,
            gpu_devices,
            capability_names(cap_add),
            rootless,
        )

    @staticmethod
    def container_name(key: MemberKey) -> str:
        return f"synapse-{key.job_id}-{key.fencing_token}-{key.rank}"

    def client_environment(self, account: Account | None, home: str) -> dict[str, str]:
        """The runtime client's whole environment: fixed, whatever the job says. ``home``
        is the agent's own home (the runtime's when it runs as root); with a rootless
        runtime and an ``account``, the owner's variables (its home and runtime
        directory, where podman keeps its state)."""
        env = {"PATH": FIXED_PATH, "LANG": FIXED_LANG, "HOME": home}
        if self.rootless and account is not None:
            env.update(owner_environment(account))
            env["XDG_RUNTIME_DIR"] = f"/run/user/{account.uid}"
        return env

    def run_argv(
        self,
        spec: LaunchSpec,
        argv: Sequence[str],
        files: ContainerFiles,
        account: Account | None = None,
    ) -> list[str]:
        out = [
            *self.command,
            "run",
            *self.run_args,
            "--rm",
            f"--name={self.container_name(spec.key)}",
            "--network=host",
            f"--cidfile={files.cidfile}",
            f"--env-file={files.env_file}",
            "--security-opt=no-new-privileges",
            "--cap-drop=all",
            *(f"--cap-add={cap}" for cap in self.cap_add),
        ]
        if self.gpu_devices:
            out += [f"--device={CDI_GPU_DEVICE.format(index=gpu)}" for gpu in spec.gpus]
        if spec.cpu_milli > 0:
            out.append(f"--cpus={spec.cpu_milli // 1000}.{spec.cpu_milli % 1000:03d}")
        if spec.memory_mib > 0:
            out.append(f"--memory={spec.memory_mib}m")
        if account is not None and self.rootless:
            out.append("--userns=keep-id")
        elif account is not None:
            out.append(f"--user={account.uid}:{account.gid}")
            out += [f"--group-add={gid}" for gid in account.groups if gid != account.gid]
        if spec.workdir:
            out.append(f"--workdir={spec.workdir}")
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


def container_environment(spec: LaunchSpec, runtime: ImageRuntime) -> dict[str, str]:
    """The variables a containerised member gets (through the env file): the job's, then
    the DESIGN §5 variables, except that with GPU devices the container numbers its GPUs
    from 0."""
    out = member_environment(spec, {})
    if runtime.gpu_devices:
        out["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in range(len(spec.gpus)))
    return out


def member_argv(
    spec: LaunchSpec,
    runtime: ImageRuntime | None = None,
    account: Account | None = None,
    member_dir: Path | None = None,
) -> list[str]:
    """The argv to exec, wrapped in the image runtime when the job names an image (run as
    ``account`` inside the container when given; its files under ``member_dir``).
    Raises :class:`NoImageRuntime` for an image on a node without a runtime, ValueError
    for an empty command or an image that is not an image reference (checked again here
    whatever admission did: it becomes a word of a root process's command line)."""
    argv = command_argv(spec)
    if spec.image:
        if runtime is None:
            raise NoImageRuntime(
                "the job names an image but this node has no image runtime "
                "(synapse-worker --image-runtime)"
            )
        if image_reference_problem(spec.image):
            raise ValueError("the job's image is not an image reference")
        if member_dir is None:
            raise ValueError("a member in a container needs its member directory")
        argv = runtime.run_argv(spec, argv, ContainerFiles.of_member(member_dir), account)
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
    """The output log becomes the owner's alone (0600); the member directory stays the
    agent's, and the owner's group may enter it but not list or change it (0710): the
    member reaches its ``$SYNAPSE_PREEMPT_FILE`` there, while the launch record and the
    pid and exit records stay the agent's alone (0600), and nothing in the directory is
    the member's to replace."""
    os.chown(log_path, account.uid, account.gid, follow_symlinks=False)
    os.chmod(log_path, 0o600)
    os.chown(member_dir, -1, account.gid, follow_symlinks=False)
    os.chmod(member_dir, 0o710)


def member_dir_name(attempt: int, fencing_token: int, rank: int) -> str:
    return f"a{attempt}.t{fencing_token}.r{rank}"


_DIR_PATTERN = re.compile(r"^a(\d+)\.t(\d+)\.r(\d+)$")


def parse_member_dir_name(name: str) -> tuple[int, int, int] | None:
    """(attempt, fencing token, rank) from a member directory name."""
    m = _DIR_PATTERN.match(name)
    return (int(m.group(1)), int(m.group(2)), int(m.group(3))) if m else None


def read_json(path: Path) -> dict[str, Any] | None:
    """The JSON object in ``path`` (never through a link), or None."""
    try:
        with open(os.open(path, os.O_RDONLY | os.O_NOFOLLOW), encoding="utf-8") as f:
            doc = json.load(f)
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
    that died or was killed could not), with the runtime's environment and account from
    the record, and remove the container's files. Returns whether the member ran in a
    container."""
    launch = read_json(member_dir / "launch.json")
    argvs = launch.get("container_stop") if launch else None
    if launch is None or not isinstance(argvs, list) or not argvs:
        return False
    env = launch.get("env")
    run_as = launch.get("run_as")
    stop_containers(
        [[str(word) for word in argv] for argv in argvs if isinstance(argv, list)],
        env={str(k): str(v) for k, v in env.items()} if isinstance(env, dict) else {},
        run_as=run_as if isinstance(run_as, dict) else None,
    )
    remove_container_dir(str(ContainerFiles.of_member(member_dir).directory))
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
        # Members reach their own directory (and their preemption notice) through it;
        # no one but the agent may list or change it.
        self.root.chmod(PASSAGE_MODE)
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
        self._supervisor_env = supervisor_environment(os.environ)
        # The runtime's client, run as root, gets the agent's own home.
        self._agent_home = _home_of(os.geteuid())
        self._forks = (
            ForkServer(
                self.settings.python,
                2 * shim.POLL_S + self.settings.fence_grace_s + 0.5,
                env=self._supervisor_env,
            )
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

        When the member runs as its owner, its output log belongs to the owner (0600)
        and its directory may be entered by the owner's group, not listed or changed
        (0710: the launch, pid and exit records in it are the agent's, 0600, and the agent
        acts on them as root); the supervisor drops to the owner's uid, gid and groups in
        the member's process before it enters ``workdir`` and execs. A member in a
        container gets its variables through the env file only; the runtime's client
        gets the fixed environment of :meth:`ImageRuntime.client_environment`.

        Not idempotent by itself: the caller checks :attr:`known` first.
        """
        key = spec.key
        if not _SAFE_NAME.match(spec.job_id):
            raise ValueError(f"job id {spec.job_id!r} is not a safe file name")
        mdir = self.member_dir(key, spec.attempt)
        mdir.parent.mkdir(exist_ok=True)
        mdir.parent.chmod(PASSAGE_MODE)
        mdir.mkdir(mode=0o700, exist_ok=False)
        self.known.add(key)
        self.highest_token[key.job_id] = max(
            self.highest_token.get(key.job_id, 0), key.fencing_token
        )
        now_ms = self.wall_clock_ms()
        member = Member(spec=spec, dir=mdir, shim=None, started_at_ms=now_ms)
        self.members[key] = member
        log_path = mdir / "output.log"
        os.close(os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600))
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
        runtime = self.image_runtime if spec.image else None
        try:
            argv = member_argv(spec, self.image_runtime, account, mdir)
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
        cgroup_dir = ""
        container: dict[str, Any] | None = None
        container_stop: list[list[str]] = []
        if runtime is not None:
            # The runtime's client gets a fixed environment and runs in the member
            # directory, as root or (rootless) as the owner; the job's variables reach
            # the container through the env file, and the runtime enforces the limits and
            # sets the working directory inside the container.
            files = ContainerFiles.of_member(mdir)
            rootless_owner = account if runtime.rootless else None
            env = runtime.client_environment(rootless_owner, self._agent_home)
            run_as = rootless_owner
            cwd = str(mdir)
            container = {
                "dir": str(files.directory),
                "env_file": str(files.env_file),
                "cidfile": str(files.cidfile),
                "env": container_environment(spec, runtime),
                "owner": None
                if rootless_owner is None
                else [rootless_owner.uid, rootless_owner.gid],
            }
            container_stop = runtime.stop_argvs(key)
        else:
            env = member_environment(spec, self.settings.base_env, account)
            # Written only when the gang is preempted (:meth:`preempt`), before the SIGTERM.
            env[PREEMPT_FILE_ENV] = str(mdir / shim.PREEMPT_FILE)
            run_as = account
            cwd = spec.workdir
            if self.cgroups is not None:
                cgroup_dir = self.cgroups.create(
                    f"{key.job_id}.t{key.fencing_token}.r{key.rank}",
                    spec.cpu_milli,
                    spec.memory_mib,
                )
        launch: dict[str, Any] = {
            "key": list(key),
            "attempt": spec.attempt,
            "argv": argv,
            "env": env,
            # Entered by the member's process after it has become ``run_as``.
            "cwd": cwd,
            "container": container,
            "container_stop": container_stop,
            "log_path": str(log_path),
            "lease_path": str(self.lease_path),
            "parent_pid": os.getpid(),  # or the fork server's: see _start_supervisor
            "stop_grace_s": self.settings.stop_grace_s,
            "fence_grace_s": self.settings.fence_grace_s,
            "time_limit_ms": spec.time_limit_ms,
            "cgroup_dir": cgroup_dir,
            "self_fencing": self.settings.self_fencing,
            "run_as": None
            if run_as is None
            else {"uid": run_as.uid, "gid": run_as.gid, "groups": list(run_as.groups)},
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
        shim_log = os.open(
            mdir / "shim.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600
        )
        try:
            return subprocess.Popen(
                [self.settings.python, *SHIM_COMMAND, str(mdir)],
                stdin=subprocess.DEVNULL,
                stdout=shim_log,
                stderr=subprocess.STDOUT,
                env=self._supervisor_env,
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
            # The member reads it, as its owner: readable by all who may enter the
            # member directory (the agent and the owner's group).
            lambda: write_json_atomic(member.dir / shim.PREEMPT_FILE, notice_doc, 0o644),
            member.dir,
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
                if (mdir / CONTAINER_DIR).exists():
                    # A supervisor killed before it could clean up: the container's files.
                    remove_container_dir(str(mdir / CONTAINER_DIR))
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
            _tolerate_full_disk(lambda: (member.dir / "reported").touch(0o600), member.dir)
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
            # The supervisor died without a record: make sure nothing of the member lives
            # (and no environment file of its container stays behind).
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


def _home_of(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_dir
    except KeyError:
        return "/"


def _tolerate_full_disk(write: Callable[[], object], where: Path) -> None:
    """Run ``write`` (a record kept on disk for later); log instead of raising when the
    disk refuses it, so that a full disk never stops the agent."""
    try:
        write()
    except OSError as exc:
        log.error("could not write under %s: %s", where, exc)
