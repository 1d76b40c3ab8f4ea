"""Members whose job names an image: the container runtime's command line and the
checks that keep a container confined.

:class:`ImageRuntime` turns a member into ``RUNTIME run ... IMAGE ARGV`` with synapse's
own options (its name, host network, no new privileges, no capabilities but those the
operator lists, its GPUs as CDI devices, its CPU and memory limits, its owner's
identity); the node's configuration may add run options, checked by
:func:`run_args_problem` so that none undoes that confinement. The runtime client runs as
a root process (or, rootless, as the owner) with a fixed environment: the job's variables
reach the container only through the env file (:class:`ContainerFiles`). The image
itself is checked as an image reference where the argv is built
(:func:`synapse_ha.worker.launch.member_argv`).
"""

from __future__ import annotations

import os
import shlex
import shutil
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from synapse_ha.core.desired import DesiredMember, MemberKey
from synapse_ha.worker.accounts import Account, owner_environment
from synapse_ha.worker.environment import FIXED_LANG, FIXED_PATH, member_environment
from synapse_ha.worker.records import read_json
from synapse_ha.worker.shim_containers import remove_container_dir, stop_containers

CDI_GPU_DEVICE = "nvidia.com/gpu={index}"
# The directory of a member in a container that holds its environment file and the id
# file the runtime writes (see synapse_ha.worker.shim_containers); only the runtime's
# account may enter it.
CONTAINER_DIR = "container"

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
    "pid": "each member sees only its own processes (a PID namespace of its own)",
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
        name = f"synapse-{key.job_id}-{key.fencing_token}-{key.rank}"
        return f"{name}-g{key.generation}" if key.generation else name

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
        member: DesiredMember,
        argv: Sequence[str],
        files: ContainerFiles,
        account: Account | None = None,
    ) -> list[str]:
        out = [
            *self.command,
            "run",
            *self.run_args,
            "--rm",
            f"--name={self.container_name(member.key)}",
            "--network=host",
            f"--cidfile={files.cidfile}",
            f"--env-file={files.env_file}",
            "--security-opt=no-new-privileges",
            "--cap-drop=all",
            *(f"--cap-add={cap}" for cap in self.cap_add),
        ]
        if self.gpu_devices:
            out += [f"--device={CDI_GPU_DEVICE.format(index=gpu)}" for gpu in member.gpus]
        resources = member.spec.resources
        if resources.cpu_milli > 0:
            out.append(f"--cpus={resources.cpu_milli // 1000}.{resources.cpu_milli % 1000:03d}")
        if resources.memory_mib > 0:
            out.append(f"--memory={resources.memory_mib}m")
        if account is not None and self.rootless:
            out.append("--userns=keep-id")
        elif account is not None:
            out.append(f"--user={account.uid}:{account.gid}")
            out += [f"--group-add={gid}" for gid in account.groups if gid != account.gid]
        if member.spec.workdir:
            out.append(f"--workdir={member.spec.workdir}")
        out.append(member.spec.image)
        out += argv
        return out

    def stop_argvs(self, key: MemberKey) -> list[list[str]]:
        """Commands that end the member's container whatever state it is in (each may
        fail harmlessly when the container is already gone)."""
        name = self.container_name(key)
        return [[*self.command, "kill", name], [*self.command, "rm", "-f", name]]


class NoImageRuntime(ValueError):
    """The member names an image and this node has no image runtime."""


def container_environment(
    member: DesiredMember, runtime: ImageRuntime, passthrough: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The variables a containerised member gets (through the env file): the operator's
    ``passthrough`` ones (``member_env_passthrough``), the job's, then the DESIGN §5
    variables, except that with GPU devices the container numbers its GPUs from 0. The
    image gives the rest (``PATH``, ``HOME``, ...); nothing else of the agent's."""
    out = member_environment(member, passthrough or {})
    if runtime.gpu_devices:
        out["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in range(len(member.gpus)))
    return out


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
