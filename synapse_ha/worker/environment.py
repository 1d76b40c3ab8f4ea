"""The environments of the processes the worker starts.

* A member gets :func:`member_environment`: the DESIGN §5 contract (the torchrun
  variables and ours), over the job's own variables.
* Every root process besides the member (the supervisors, their fork server, the
  container runtime's client) gets a fixed environment, or the agent's own without any
  variable that changes how a process behaves (:func:`supervisor_environment`): the job's
  variables, which may name ``LD_PRELOAD`` or ``PATH``, never reach a root process.
"""

from __future__ import annotations

from collections.abc import Mapping

from synapse_ha.core.arrays import task_of
from synapse_ha.core.checkpoints import CHECKPOINT_FILE_ENV, PREEMPT_FILE_ENV, RESUME_STEP_ENV
from synapse_ha.core.desired import DesiredMember
from synapse_ha.worker.accounts import Account, owner_environment

__all__ = [
    "CHECKPOINT_FILE_ENV",
    "PREEMPT_FILE_ENV",
    "PROGRESS_FILE_ENV",
    "RESUME_STEP_ENV",
    "changes_process_behaviour",
    "member_environment",
    "supervisor_environment",
]

# The file a member of a job with hang detection touches to show progress (docs/cli.md).
PROGRESS_FILE_ENV = "SYNAPSE_PROGRESS_FILE"


def member_environment(
    member: DesiredMember, base: Mapping[str, str], account: Account | None = None
) -> dict[str, str]:
    """The member's environment: ``base``, then ``HOME``, ``USER`` and ``LOGNAME`` of the
    ``account`` it runs as (when it runs as its owner), then the job's ``env``, then the
    DESIGN §5 variables (which the job cannot override: they define the gang), with the
    array's for a task of an array and the step to resume from when there is one."""
    env = dict(base)
    if account is not None:
        env.update(owner_environment(account))
    env.update(member.spec.env)
    env.update(
        {
            "MASTER_ADDR": member.master_addr,
            "MASTER_PORT": str(member.master_port),
            "WORLD_SIZE": str(member.world_size),
            "RANK": str(member.rank),
            "NNODES": str(member.world_size),
            "NODE_RANK": str(member.rank),
            "LOCAL_RANK": str(member.local_rank),
            "LOCAL_WORLD_SIZE": str(member.local_world_size),
            "CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in member.gpus),
            "SYNAPSE_JOB_ID": member.job_id,
            "SYNAPSE_ATTEMPT": str(member.attempt),
            "SYNAPSE_FENCING_TOKEN": str(member.fencing_token),
            "SYNAPSE_MEMBER_HOSTS": ",".join(member.member_hosts),
        }
    )
    if member.resume_step is not None:
        env[RESUME_STEP_ENV] = str(member.resume_step)
    task = task_of(member.job_id)
    if task is not None:  # a task of an array (core/arrays.py)
        array_id, index = task
        env.update(
            {
                "SYNAPSE_ARRAY_JOB_ID": array_id,
                "SYNAPSE_ARRAY_TASK_ID": str(index),
                "SLURM_ARRAY_JOB_ID": array_id,
                "SLURM_ARRAY_TASK_ID": str(index),
            }
        )
    return env


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
