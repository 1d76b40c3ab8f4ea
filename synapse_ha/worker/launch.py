"""How a member's supervisor is to start the member: the argv, and the process it runs
in (:class:`MemberProcess`: environment, account, working directory, container files).

The launch path is a privilege boundary: when the agent is root, nothing the job
controls reaches a root process. The member's environment (the job's variables, which
may name ``LD_PRELOAD`` or ``PATH``) is used only after the drop to its owner; a member
in a container gets its variables through the env file only, while the runtime's client
gets the fixed environment of :meth:`ImageRuntime.client_environment`, by absolute path,
with the image checked as an image reference.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from synapse_ha.core.desired import DesiredMember
from synapse_ha.core.health.progress import SOURCE_FILE, SOURCE_LOG
from synapse_ha.core.spec.validation import image_reference_problem
from synapse_ha.worker import shim
from synapse_ha.worker.accounts import Account
from synapse_ha.worker.checkpoint_files import CHECKPOINT_FILE
from synapse_ha.worker.environment import (
    CHECKPOINT_FILE_ENV,
    MEMBERSHIP_FILE_ENV,
    PREEMPT_FILE_ENV,
    PROGRESS_FILE_ENV,
    member_environment,
)
from synapse_ha.worker.images import (
    ContainerFiles,
    ImageRuntime,
    NoImageRuntime,
    container_environment,
)
from synapse_ha.worker.membership import MEMBERSHIP_FILE
from synapse_ha.worker.progress import PROGRESS_FILE


def command_argv(member: DesiredMember) -> list[str]:
    """The member's own argv: a string command under ``/bin/sh -c``, a list as is."""
    spec = member.spec
    if spec.shell:
        argv = ["/bin/sh", "-c", spec.command[0] if spec.command else ""]
    else:
        argv = list(spec.command)
    if not argv or not argv[0]:
        raise ValueError("empty command")
    return argv


def member_argv(
    member: DesiredMember,
    runtime: ImageRuntime | None = None,
    account: Account | None = None,
    member_dir: Path | None = None,
) -> list[str]:
    """The argv to exec, wrapped in the image runtime when the job names an image (run as
    ``account`` inside the container when given; its files under ``member_dir``).
    Raises :class:`NoImageRuntime` for an image on a node without a runtime, ValueError
    for an empty command or an image that is not an image reference (checked again here
    whatever admission did: it becomes a word of a root process's command line)."""
    argv = command_argv(member)
    image = member.spec.image
    if image:
        if runtime is None:
            raise NoImageRuntime(
                "the job names an image but this node has no image runtime "
                "(synapse-worker --image-runtime)"
            )
        if image_reference_problem(image):
            raise ValueError("the job's image is not an image reference")
        if member_dir is None:
            raise ValueError("a member in a container needs its member directory")
        argv = runtime.run_argv(member, argv, ContainerFiles.of_member(member_dir), account)
    return argv


def progress_file(member: DesiredMember, member_dir: Path) -> Path | None:
    """The member's ``$SYNAPSE_PROGRESS_FILE``: every member on the host has one, which
    hang detection watches when its job has ``progress:`` and where the member may report
    its pace (worker/pace.py) in any case."""
    return member_dir / PROGRESS_FILE


def create_progress_file(member: DesiredMember, member_dir: Path) -> Path | None:
    """Create the member's ``$SYNAPSE_PROGRESS_FILE`` empty (its modification time is
    the member's start until the member touches it); its path, or None."""
    path = progress_file(member, member_dir)
    if path is not None:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600))
    return path


def progress_fields(
    desired: DesiredMember, log_path: Path, progress_path: Path | None
) -> dict[str, Any]:
    """The launch record's hang detection (:mod:`synapse_ha.worker.progress`): the
    timeout (0: none), the source and the file it reads."""
    spec = desired.spec
    if spec.progress_timeout_ms <= 0:
        return {"progress_timeout_ms": 0}
    path = log_path if spec.progress_source == SOURCE_LOG else progress_path
    return {
        "progress_timeout_ms": spec.progress_timeout_ms,
        "progress_source": spec.progress_source or SOURCE_FILE,
        "progress_path": str(path),
    }


def give_to_owner(
    member_dir: Path,
    log_path: Path,
    account: Account,
    progress_path: Path | None = None,
    checkpoint_path: Path | None = None,
) -> None:
    """The output log (and the progress and checkpoint files, when there are) becomes the
    owner's alone (0600); the member directory stays the agent's, and the owner's group
    may enter it but not list or change it (0710): the member reaches its
    ``$SYNAPSE_PREEMPT_FILE``, ``$SYNAPSE_PROGRESS_FILE`` and ``$SYNAPSE_CHECKPOINT_FILE``
    there, while the launch record and the pid and exit records stay the agent's alone
    (0600), and nothing in the directory is the member's to replace."""
    for path in (log_path, progress_path, checkpoint_path):
        if path is None:
            continue
        os.chown(path, account.uid, account.gid, follow_symlinks=False)
        os.chmod(path, 0o600)
    os.chown(member_dir, -1, account.gid, follow_symlinks=False)
    os.chmod(member_dir, 0o710)


@dataclass(frozen=True, slots=True)
class MemberProcess:
    """The process the supervisor starts for a member, as the launch record describes
    it: its whole environment, the account it runs as (None: the supervisor's), the
    directory it enters after the drop to that account, and for a member in a container
    the ``container`` files the supervisor writes and the commands that end it."""

    env: dict[str, str]
    run_as: Account | None
    cwd: str
    container: dict[str, Any] | None = None
    container_stop: list[list[str]] = field(default_factory=list)

    def launch_fields(self) -> dict[str, Any]:
        """Its part of ``launch.json``."""
        run_as = self.run_as
        return {
            "env": self.env,
            # Entered by the member's process after it has become ``run_as``.
            "cwd": self.cwd,
            "container": self.container,
            "container_stop": self.container_stop,
            "run_as": None
            if run_as is None
            else {"uid": run_as.uid, "gid": run_as.gid, "groups": list(run_as.groups)},
        }


def host_process(
    member: DesiredMember, base_env: Mapping[str, str], account: Account | None, member_dir: Path
) -> MemberProcess:
    """A member on the host: its environment over ``base_env`` (the minimal base of
    :func:`~synapse_ha.worker.environment.member_base_environment`), with the file a
    preemption notice is written to (before the SIGTERM, only when the gang is
    preempted), the file it writes a line to to mark a checkpoint, the file its gang's
    membership changes are written to and the file it touches to show progress (and
    writes its pace to), run as ``account`` in the job's working directory."""
    env = member_environment(member, base_env, account)
    env[PREEMPT_FILE_ENV] = str(member_dir / shim.PREEMPT_FILE)
    env[CHECKPOINT_FILE_ENV] = str(member_dir / CHECKPOINT_FILE)
    env[MEMBERSHIP_FILE_ENV] = str(member_dir / MEMBERSHIP_FILE)
    progress = progress_file(member, member_dir)
    if progress is not None:
        env[PROGRESS_FILE_ENV] = str(progress)
    return MemberProcess(env=env, run_as=account, cwd=member.spec.workdir)


def container_process(
    member: DesiredMember,
    runtime: ImageRuntime,
    account: Account | None,
    member_dir: Path,
    agent_home: str,
    passthrough: Mapping[str, str] | None = None,
) -> MemberProcess:
    """A member in a container: the runtime's client gets a fixed environment and runs
    in the member directory, as root or (rootless) as the owner; the job's variables
    (over the operator's ``passthrough`` ones; the image gives the rest) reach the
    container through the env file, and the runtime enforces the limits and sets the
    working directory inside the container."""
    files = ContainerFiles.of_member(member_dir)
    rootless_owner = account if runtime.rootless else None
    container = {
        "dir": str(files.directory),
        "env_file": str(files.env_file),
        "cidfile": str(files.cidfile),
        "env": container_environment(member, runtime, passthrough or {}),
        "owner": None if rootless_owner is None else [rootless_owner.uid, rootless_owner.gid],
    }
    return MemberProcess(
        env=runtime.client_environment(rootless_owner, agent_home),
        run_as=rootless_owner,
        cwd=str(member_dir),
        container=container,
        container_stop=runtime.stop_argvs(member.key),
    )


def prestart_record(
    member: DesiredMember,
    base_env: Mapping[str, str],
    account: Account | None,
    member_dir: Path,
    pid_namespace: bool = False,
) -> dict[str, Any] | None:
    """The job's pre-start check as the supervisor runs it (``prestart`` in the launch
    record; None without one): on the host, as the member would run there (its
    environment, ``account``, the job's working directory and, with ``pid_namespace``, a
    PID namespace of its own). A member whose job names an image gets its check on the
    host too, in ``/`` (the working directory is the container's)."""
    prestart = member.spec.prestart
    if prestart is None:
        return None
    argv = ["/bin/sh", "-c", prestart.command[0]] if prestart.shell else list(prestart.command)
    fields = host_process(member, base_env, account, member_dir).launch_fields()
    return {
        "argv": argv,
        "env": fields["env"],
        "cwd": "/" if member.spec.image else fields["cwd"],
        "run_as": fields["run_as"],
        "timeout_s": prestart.timeout_ms / 1000,
        "pid_namespace": pid_namespace,
    }
