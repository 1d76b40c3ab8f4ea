"""What a worker should run: the desired-member record.

The leader computes one :class:`DesiredMember` per gang member from the state
(:func:`synapse_ha.core.views.desired_by_node`); the heartbeat carries it to the member's
node, whose agent rebuilds the same record from the message and hands it to its launcher
(:class:`synapse_ha.worker.members.MemberExecutor`). Both sides read the one record, so
a field added for the launcher is added once.

This module needs nothing of the core but its plain data (:mod:`synapse_ha.core.model`):
the worker imports it without the state machine.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import NamedTuple

from synapse_ha.core.health.prestart import Prestart
from synapse_ha.core.model import JobSpec, Resources


class MemberKey(NamedTuple):
    """The identity of one gang member on a node: a (job, fencing token, rank,
    generation) starts at most once, ever. ``generation`` is 0 for the member bound with
    its attempt and grows by one each time the rank is placed again on another node
    while the rest of the gang runs on (``replace:`` in the job spec)."""

    job_id: str
    fencing_token: int
    rank: int
    generation: int = 0

    def __str__(self) -> str:
        base = f"{self.job_id}/token {self.fencing_token}/rank {self.rank}"
        return f"{base}/generation {self.generation}" if self.generation else base


class Preempting(NamedTuple):
    """A desired member being preempted: the kind, the preemptor's job id, and
    the grace left before SIGKILL (ms, counted from when the worker heard it)."""

    kind: str
    preemptor: str
    grace_ms: int


@dataclass(frozen=True, slots=True)
class LaunchSpec:
    """The part of a job's spec its members are launched with, the same for every member
    of the gang: the command (a string under ``/bin/sh -c`` when ``shell``, else an
    argv), the job's variables, its working directory, time limit and image, one
    member's ``resources`` (the CPU and memory limits its launcher enforces), and its
    hang detection (``progress_timeout_ms``, 0: none; ``progress_source``, see
    :mod:`synapse_ha.core.health.progress`)."""

    command: tuple[str, ...]
    shell: bool = True
    env: tuple[tuple[str, str], ...] = ()
    workdir: str = ""
    time_limit_ms: int = 0  # 0: no limit
    image: str = ""  # "": the member runs on the host
    resources: Resources = field(default_factory=Resources)
    progress_timeout_ms: int = 0  # 0: no hang detection
    progress_source: str = ""  # "" with no hang detection, else a progress source
    prestart: Prestart | None = None  # the job's pre-start check: None, none
    stop_grace_ms: int = 0  # SIGTERM to SIGKILL when it is stopped; 0: the node's

    @classmethod
    def of(cls, spec: JobSpec) -> LaunchSpec:
        """The launch part of ``spec``: every field of the same name in both, and its
        hang detection (``spec.progress``) as the two ``progress_*`` fields."""
        progress = spec.progress
        return cls(
            **{name: getattr(spec, name) for name in _FROM_JOB_SPEC},
            progress_timeout_ms=progress.timeout_ms if progress else 0,
            progress_source=progress.source if progress else "",
        )


# The fields a launch spec copies from the job spec as they are.
_FROM_JOB_SPEC = tuple(
    f.name for f in fields(LaunchSpec) if f.name in {g.name for g in fields(JobSpec)}
)


@dataclass(frozen=True, slots=True)
class DesiredMember:
    """One gang member a worker should be running, with its rank environment (DESIGN §5)
    and what it is launched with.

    ``preempt_deadline_ms`` and ``ended`` are the leader's view of the attempt's end: the
    heartbeat turns them into the member's preemption (kind, preemptor and the grace
    left, which the worker's clock can use), so a record rebuilt from the message leaves
    them at their defaults and the launcher never reads them."""

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
    spec: LaunchSpec
    owner: str = ""  # the user the job belongs to; the worker may run the member as it
    # 0: not preempted. Otherwise the leader-clock time its grace period ends: the worker
    # sends SIGTERM at once and SIGKILL then (the heartbeat handler turns it into the
    # remaining grace, since worker clocks differ from the leader's).
    preempt_deadline_ms: int = 0
    # True: the member's attempt has ended before the member was reported running. The
    # worker must never start it; one it has not started is recorded with an immediate
    # exit (as a member preempted before it started), which confirms to the leader that
    # it is stopped (DESIGN §4: the next attempt waits for that confirmation).
    ended: bool = False
    # The step the gang resumes from (its job's newest attempt mark with a step,
    # core/workflows/checkpoints.py): the members get it as $SYNAPSE_RESUME_STEP. None: none.
    resume_step: int | None = None
    # The rank's generation: 0 as bound with its attempt, one more each time the rank was
    # placed again while the gang ran on (DESIGN §4, member replacement).
    generation: int = 0
    # How many times the gang's membership changed since the attempt was bound (a rank
    # placed again): a running member whose record shows a higher number than it was
    # started with is told of the new hosts (``$SYNAPSE_MEMBERSHIP_FILE``).
    membership: int = 0
    # The signal a running member gets after a membership line is written ("SIGUSR1";
    # "": none, the member reads the file when it wants).
    membership_signal: str = ""

    @property
    def key(self) -> MemberKey:
        return MemberKey(self.job_id, self.fencing_token, self.rank, self.generation)
