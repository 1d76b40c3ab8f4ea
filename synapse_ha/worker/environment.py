"""The environments of the processes the worker starts.

* A member gets :func:`member_environment`: the DESIGN §5 contract (the torchrun
  variables and ours), over the job's own variables, over a minimal base
  (:func:`member_base_environment`: ``PATH``, ``HOME``, ``USER``, ``LOGNAME``, ``SHELL``,
  ``LANG`` and ``TMPDIR`` of the account it runs as, and the variables the operator
  names with ``member_env_passthrough``). Nothing else of the agent's environment
  reaches a member: a credential in it (a cloud key, a token) is the agent's alone.
* Every root process besides the member (the supervisors, their fork server, the
  container runtime's client) gets a fixed environment, or the agent's own without any
  variable that changes how a process behaves (:func:`supervisor_environment`): the job's
  variables, which may name ``LD_PRELOAD`` or ``PATH``, never reach a root process.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping, Sequence

from synapse_ha.core.desired import DesiredMember
from synapse_ha.core.workflows.arrays import task_of
from synapse_ha.core.workflows.checkpoints import (
    CHECKPOINT_FILE_ENV,
    PREEMPT_FILE_ENV,
    RESUME_STEP_ENV,
)
from synapse_ha.worker.accounts import Account, owner_environment

__all__ = [
    "CHECKPOINT_FILE_ENV",
    "MEMBERSHIP_FILE_ENV",
    "MEMBER_BASE_NAMES",
    "MEMBER_GENERATION_ENV",
    "PREEMPT_FILE_ENV",
    "PROGRESS_FILE_ENV",
    "RESUME_STEP_ENV",
    "changes_process_behaviour",
    "env_name_problem",
    "member_base_environment",
    "member_environment",
    "supervisor_environment",
]

# The file a member of a job with hang detection touches to show progress (docs/cli.md).
PROGRESS_FILE_ENV = "SYNAPSE_PROGRESS_FILE"
# The member's generation (0 as bound with its attempt, one more each time its rank was
# placed again), and the file its gang's membership changes are written to
# (synapse_ha.worker.membership).
MEMBER_GENERATION_ENV = "SYNAPSE_MEMBER_GENERATION"
MEMBERSHIP_FILE_ENV = "SYNAPSE_MEMBERSHIP_FILE"
PYTHON_ENV = "SYNAPSE_PYTHON"


def member_environment(
    member: DesiredMember, base: Mapping[str, str], account: Account | None = None
) -> dict[str, str]:
    """The member's environment: ``base`` (on the host, :func:`member_base_environment`),
    then ``HOME``, ``USER`` and ``LOGNAME`` of the ``account`` it runs as (when it runs as
    its owner), then the job's ``env``, then the DESIGN §5 variables (which the job cannot
    override: they define the gang), with the array's for a task of an array and the step
    to resume from when there is one."""
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
            MEMBER_GENERATION_ENV: str(member.generation),
        }
    )
    if not member.spec.image:  # the worker's interpreter, for an sbatch job's step daemon
        env[PYTHON_ENV] = sys.executable
    if member.resume_step is not None:
        env[RESUME_STEP_ENV] = str(member.resume_step)
    task = task_of(member.job_id)
    if task is not None:  # a task of an array (core/workflows/arrays.py)
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
FIXED_TMPDIR = "/tmp"
FALLBACK_SHELL = "/bin/sh"  # an account whose passwd entry names no shell

# The variables every member on the host starts with, whoever runs it (docs/security.md).
MEMBER_BASE_NAMES = ("PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "TMPDIR")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def env_name_problem(name: str) -> str:
    """Why ``name`` cannot be an environment variable's name ("" when it can): letters,
    digits and underscores, not starting with a digit."""
    if _ENV_NAME.fullmatch(name):
        return ""
    return f"{name!r} is not a variable name (letters, digits and _, not starting with a digit)"


def member_base_environment(
    account: Account | None,
    agent_env: Mapping[str, str],
    passthrough: Sequence[str] = (),
    agent_home: str = "/",
    agent_user: str = "",
) -> dict[str, str]:
    """What a member on the host starts with besides the job's variables and the gang's
    (:data:`MEMBER_BASE_NAMES`), then the variables of ``agent_env`` named in
    ``passthrough`` (the operator's ``member_env_passthrough``) that it has.

    A member running as its owner's ``account`` gets that account's ``HOME``, ``USER``,
    ``LOGNAME`` and ``SHELL`` (from the account database), the fixed ``PATH`` and ``LANG``
    and ``TMPDIR=/tmp``. A member running as the agent's own account (``account`` None)
    gets the agent's values of the same names, each one the agent lacks from the agent's
    account (``agent_home``, ``agent_user``) or fixed as above."""
    if account is not None:
        env = {
            "PATH": FIXED_PATH,
            "HOME": account.home,
            "USER": account.name,
            "LOGNAME": account.name,
            "SHELL": account.shell or FALLBACK_SHELL,
            "LANG": FIXED_LANG,
            "TMPDIR": FIXED_TMPDIR,
        }
    else:
        fallback = {
            "PATH": FIXED_PATH,
            "HOME": agent_home,
            "USER": agent_user,
            "LOGNAME": agent_user,
            "SHELL": FALLBACK_SHELL,
            "LANG": FIXED_LANG,
            "TMPDIR": FIXED_TMPDIR,
        }
        env = {name: agent_env.get(name) or fallback[name] for name in MEMBER_BASE_NAMES}
    env.update({name: agent_env[name] for name in passthrough if name in agent_env})
    return env


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
