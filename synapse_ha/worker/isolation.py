"""Whether this node's members each get a PID namespace of their own
(:mod:`synapse_ha.worker.pidns`), decided once when the worker starts and advertised at
registration (``member_isolation``, which ``synctl nodes`` shows).

* An agent running as root tries (:func:`probe_pid_namespace`): where it can, every member
  on the host, and its pre-start check, gets a PID namespace and a ``/proc`` of its own.
* Where it cannot (a kernel or a container that refuses new PID namespaces or a new
  ``proc`` mount), a worker that runs members as their owners (``--run-as owner``) refuses
  to start: members of different users would see each other's processes and command
  lines. ``--allow-shared-pid-namespace`` starts it anyway, and the node says so.
* An agent that is not root cannot make the namespaces without a user namespace, which
  would change what a member sees of the node's files (owners shown as ``nobody``) and
  hides nothing a member could not reach anyway: every member runs as the agent's one
  account, whose processes can already see, signal and trace each other. Its members
  share the node's PID namespace, and the node says so.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from synapse_ha.worker import pidns
from synapse_ha.worker.accounts import RunAsMode

ISOLATED = "pid-namespace"  # each member in a PID namespace of its own
SHARED = "shared"  # members share the node's PID namespace
PROBE_TIMEOUT_S = 10.0
NOT_ROOT = "the agent is not root: its members share its one account, and the node's PID namespace"


class IsolationRefused(Exception):
    """Members would run as their owners where they cannot get PID namespaces of their
    own, and the operator did not allow that."""


@dataclass(frozen=True, slots=True)
class MemberIsolation:
    """Whether members get a PID namespace of their own, and why not when they do not."""

    pid_namespace: bool
    why_shared: str = ""

    @property
    def advertised(self) -> str:
        """What the node registers as ``member_isolation``."""
        return ISOLATED if self.pid_namespace else SHARED


def probe_pid_namespace(python: str = sys.executable) -> str:
    """ "" when a process started here gets a PID namespace and a ``/proc`` of its own,
    else why not. Runs the supervisor's own code (``pidns.py --probe``) in a new
    interpreter, so that the agent never forks itself."""
    argv = [python, "-I", "-S", str(Path(pidns.__file__).resolve()), "--probe"]
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"the probe could not run: {exc}"
    if done.returncode == 0:
        return ""
    said = (done.stdout or done.stderr).strip().splitlines()
    return said[-1] if said else f"the probe exited with {done.returncode}"


def decide_isolation(
    run_as: RunAsMode, euid: int, allow_shared: bool, probe: Callable[[], str]
) -> MemberIsolation:
    """This node's member isolation (see the module's description). Raises
    :class:`IsolationRefused` for members run as their owners without PID namespaces,
    unless ``allow_shared``."""
    if euid != 0:
        return MemberIsolation(False, NOT_ROOT)
    why = probe()
    if not why:
        return MemberIsolation(True)
    if run_as is RunAsMode.OWNER and not allow_shared:
        raise IsolationRefused(
            f"members cannot get a PID namespace of their own on this node ({why}): "
            "members of different users would see each other's processes and command "
            "lines; start with --allow-shared-pid-namespace to run them anyway"
        )
    return MemberIsolation(False, why)
