"""What the member executor (:mod:`synapse_ha.worker.members`) keeps: its settings, each
member it started or found, and the preemption notice it passes on."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from synapse_ha.core.desired import DesiredMember, LaunchSpec, MemberKey
from synapse_ha.worker.accounts import RunAsPolicy
from synapse_ha.worker.member_dirs import MemberExit
from synapse_ha.worker.supervisors import Supervisor


@dataclass(frozen=True, slots=True)
class PreemptNotice:
    """The leader is preempting this member's gang: why (``reclaim`` | ``priority``), for
    which job, and the grace left before SIGKILL (ms, counted from when it arrived)."""

    kind: str
    preemptor: str
    grace_ms: int

    def not_started_detail(self) -> str:
        """The exit detail of a member preempted before it started here."""
        if not self.preemptor:
            return f"not started: {self.kind}"
        return f"preempted ({self.kind}) for job {self.preemptor} before it started"


@dataclass(frozen=True, slots=True)
class ExecutorSettings:
    stop_grace_s: float = 5.0  # SIGTERM → SIGKILL on a graceful stop and at the time limit
    fence_grace_s: float = 0.5  # SIGTERM → SIGKILL when the lease is lost
    python: str = sys.executable  # interpreter that runs the supervisor
    # The agent's environment: members get only its variables named in
    # member_env_passthrough (and, running as the agent's account, its PATH, HOME, ...).
    base_env: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    member_env_passthrough: tuple[str, ...] = ()
    # Each member on the host (and its pre-start check) in a PID namespace of its own.
    pid_namespace: bool = False
    # False only in the deliberately broken test build (synapse_ha.programs.worker): the
    # supervisors then ignore the lease file and the agent's disappearance.
    self_fencing: bool = True
    # Whose account members run under; None: the agent's own, whoever owns the job.
    run_as: RunAsPolicy | None = None
    # Fork supervisors from one pre-started fork server (synapse_ha.worker.forkserver)
    # instead of starting an interpreter per member; the executor must then be closed.
    fork_server: bool = False


@dataclass(slots=True)
class Member:
    desired: DesiredMember
    dir: Path
    shim: Supervisor | None
    started_at_ms: int
    exit: MemberExit | None = None
    stop_sent: bool = False
    # The gang's membership count the member was last told of (its membership file's
    # last line): the one it started with, then each change written since.
    membership: int = 0

    @property
    def key(self) -> MemberKey:
        return self.desired.key


def known_only(key: MemberKey, attempt: int) -> DesiredMember:
    """A member known only from its directory, at agent start: its identity, and nothing
    to launch (it is never started again)."""
    return DesiredMember(
        job_id=key.job_id,
        attempt=attempt,
        fencing_token=key.fencing_token,
        rank=key.rank,
        world_size=0,
        local_rank=0,
        local_world_size=0,
        gpus=(),
        master_addr="",
        master_port=0,
        member_hosts=(),
        spec=LaunchSpec(command=()),
        generation=key.generation,
    )


def cgroup_name(key: MemberKey) -> str:
    """The name of a member's cgroup: one per (job, token, rank, generation)."""
    name = f"{key.job_id}.t{key.fencing_token}.r{key.rank}"
    return f"{name}.g{key.generation}" if key.generation else name
