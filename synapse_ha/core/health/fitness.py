"""GPU health and node fitness: what makes a GPU or a node unfit, as the replicated
state records it.

A worker watches its GPUs (NVML's critical Xid events, uncorrectable ECC errors, page
retirement and row remapping failures, a GPU that fell off the bus) and names the ones
it finds unhealthy in every heartbeat; the leader records each new one with
:class:`~synapse_ha.core.commands.ReportGpuHealth`. From then on the scheduler never
places on it, a live attempt holding it is requeued as a disruption (the node's fault,
not the job's: DESIGN §4), and only an operator's repair
(:class:`~synapse_ha.core.commands.RepairGpus`) clears it.

A node that cannot start a member for a reason of its own (no account for the job's
owner, a container runtime or image missing, a cgroup it cannot set up, a GPU it cannot
see) reports the exit as ``node_cannot_run``: the gang is requeued as a disruption, the
node is :class:`Unfit` for that owner for a back-off (``ClusterConfig.unfit_backoff_ms``),
and after ``ClusterConfig.cordon_after_start_failures`` such failures in a row (the run
ends when a member's program runs there to its exit) it is
cordoned with the reason.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# A fault's code: ``xid-79``, ``ecc-dbe``, ``lost``, ``retired-pages``, ``remap-failed``,
# ``nvlink``, ``check``: lowercase words joined by dashes.
FAULT_CODE_PATTERN = re.compile(r"[a-z0-9]+(-[a-z0-9]+)*")
MAX_FAULT_CODE = 32
MAX_FAULT_DETAIL = 256


@dataclass(frozen=True, slots=True, order=True)
class GpuFault:
    """One unhealthy GPU of a node: its index, what its worker saw (``code``), a
    sentence for people (``detail``) and since when (leader clock; set at apply)."""

    gpu: int
    code: str
    detail: str = ""
    since_ms: int = 0


@dataclass(frozen=True, slots=True, order=True)
class Unfit:
    """The node cannot run members of ``owner`` (why: ``detail``) until ``until_ms``
    (leader clock): the scheduler leaves it out for that owner's gangs until then."""

    owner: str
    detail: str = ""
    until_ms: int = 0


def unfit_owners(unfit: tuple[Unfit, ...], now_ms: int) -> frozenset[str]:
    """The owners a node may not run members of at ``now_ms``."""
    return frozenset(u.owner for u in unfit if u.until_ms > now_ms)


def unhealthy_gpus(faults: tuple[GpuFault, ...]) -> frozenset[int]:
    return frozenset(f.gpu for f in faults)


def fault_of(faults: tuple[GpuFault, ...], gpu: int) -> GpuFault | None:
    return next((f for f in faults if f.gpu == gpu), None)


def describe_faults(faults: tuple[GpuFault, ...]) -> str:
    """``GPU 3 xid-79, GPU 5 ecc-dbe``."""
    return ", ".join(f"GPU {f.gpu} {f.code}" for f in faults)


# A node check's name: ``health-check`` (the worker's health-check program).
CHECK_NAME_PATTERN = re.compile(r"[a-z0-9]+(-[a-z0-9]+)*")
MAX_CHECK_NAME = 32
MAX_CHECK_MESSAGE = 256
# The identity a node cordoned by a failing check records as its ``status_by``: only
# such a cordon is lifted when the check passes again.
CHECK_ACTOR = "health-check"


@dataclass(frozen=True, slots=True, order=True)
class NodeCheck:
    """What a node's worker reports of one of its checks: its ``name``, whether it is
    ``failing`` and why (``message``)."""

    name: str
    failing: bool = False
    message: str = ""


@dataclass(frozen=True, slots=True, order=True)
class NodeCondition:
    """A check failing on a node: its name, what it said, and since when (leader clock;
    set at apply). A node with a condition is cordoned by the check while it was ready."""

    name: str
    message: str = ""
    since_ms: int = 0


def conditions_differ(conditions: tuple[NodeCondition, ...], checks: tuple[NodeCheck, ...]) -> bool:
    """Whether ``checks`` (a worker's report) would change ``conditions``: a failing
    check not recorded, or recorded with another message, or a recorded one passing."""
    recorded = {c.name: c.message for c in conditions}
    failing = {c.name: c.message for c in checks if c.failing}
    passing = {c.name for c in checks if not c.failing}
    if any(recorded.get(name) != message for name, message in failing.items()):
        return True
    return any(name in recorded for name in passing)
