"""Which format a replica reads, and which a command needs: the format gate.

A release reads every format up to :data:`FORMAT` and says so (``format_version`` in
``synctl cluster -o json``). What it added since the previous format — fields written only
when they differ from their defaults (``_ADDED_FIELDS`` in
:mod:`synapse_ha.core.codec_to_plain`), command types, enum values — is listed here with the
format that reads it. A replica of an older release refuses what it cannot read, and a
replica that refuses a command the others applied no longer has their state. So the
replicated state carries a floor (``ClusterState.format_floor``): the newest format every
replica reads, raised by :class:`~synapse_ha.core.commands.RaiseFormat` once the leader has
heard every replica report it, never lowered. ``apply`` refuses, with an error value, a
command that needs a format above the floor (:func:`format_needed`), and the leader holds
back a configured setting that would (:func:`held_back_config`).

The floor of a state written before the gate existed is :data:`BASE_FORMAT`, which is also
where every replica starts: every replica, whatever its release, must begin from the same
state and apply the same commands alike.
"""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from typing import Any

from synapse_ha.core.cluster_config import ClusterConfig, Limits, PriorityClass, Queue
from synapse_ha.core.commands import (
    DeleteCohort,
    ExitCause,
    ExpireDeadline,
    MemberEvent,
    MemberEventKind,
    ReportNodeChecks,
    SetCohort,
)
from synapse_ha.core.model import Attempt, Job, JobSpec, NodeInfo
from synapse_ha.core.reasons import ReasonCode

BASE_FORMAT = 2  # the format of a state that has no floor, and of a fresh replica's state
FORMAT = 10  # the newest format this release reads

# Fields (of commands and of what they carry) each format added, by owning type; a value
# that keeps such a field at its default reads as the previous format wrote it.
NEW_FIELDS: dict[type, dict[str, int]] = {
    # Resources of an ended attempt held until its members are confirmed stopped; GPU
    # faults cleared by a reboot.
    # Format 6: minimum run time of a priority class and a queue, and how long a reclaim
    # waits before it overrides it (core/victims.py).
    ClusterConfig: {
        "hold_until_stopped": 3,
        "clear_gpu_faults_on_reboot": 3,
        "reclaim_wait_max_ms": 6,
        # Format 8: followers relay workers' heartbeats (rpc/relay.py).
        "relay_heartbeats": 8,
    },
    PriorityClass: {"min_runtime_ms": 6},
    # format 10: floors and caps on members (core/member_limits.py), a queue's own caps and
    # what an attempt's members reserve on their nodes.
    Limits: {
        "member_min_cpu_milli": 10,
        "member_min_memory_mib": 10,
        "member_overhead_memory_mib": 10,
        "running_members_per_user": 10,
        "members_per_node_per_user": 10,
    },
    Queue: {"min_runtime_ms": 6, "running_members_per_user": 10, "members_per_node_per_user": 10},
    # The machine's boot, to tell a reboot.
    # Format 10: whether members get PID namespaces of their own (worker/isolation.py).
    NodeInfo: {"boot_id": 3, "member_isolation": 10},
    # Hang detection of a job's members (core/progress.py), and a job's pre-start check
    # (core/prestart.py); format 4: jobs that wait for other jobs (core/dependencies.py)
    # and a job's begin time and deadline (core/windows.py).
    JobSpec: {
        "progress": 3,
        "prestart": 3,
        "dependencies": 4,
        "begin_at_ms": 4,
        "begin_delay_ms": 4,
        "deadline_at_ms": 4,
        "deadline_delay_ms": 4,
        # format 5: job arrays (core/arrays.py).
        "array": 5,
        # format 9: a job no node could hold yet is refused at submission unless it
        # waits for nodes to join (core/feasibility.py).
        "wait_for_nodes": 9,
    },
    # format 5: checkpoint marks (core/checkpoints.py): a mark's step and number, each
    # member's newest mark on its attempt, and the step a job's next attempt resumes from.
    MemberEvent: {"step": 5, "mark_seq": 5},
    Attempt: {"marks": 5, "reserved": 10},
    Job: {"resume_step": 5},
}
# Command types each format added.
# (``RaiseFormat`` itself is format 3 but never gated: the leader proposes it only once
# every replica reads it.)
NEW_COMMANDS: dict[type, int] = {
    # A worker's node checks (its health-check program): node conditions.
    ReportNodeChecks: 3,
    # A pending job cancelled at its deadline.
    ExpireDeadline: 4,
    # The cohort tree (core/cohort_tree.py): cohort records.
    SetCohort: 7,
    DeleteCohort: 7,
}
# Enum values each format added (an older release cannot decode them).
NEW_ENUM_VALUES: dict[enum.Enum, int] = {
    # A member stopped by its worker for making no progress (hang detection).
    ExitCause.HUNG: 3,
    # A task of an array waiting for a slot of its throttle (a BindPlan's reason).
    ReasonCode.ARRAY_THROTTLE: 5,
    # A member's checkpoint mark (core/checkpoints.py).
    MemberEventKind.CHECKPOINT: 5,
    # A gang whose possible victims are within their minimum run time (core/victims.py;
    # only a cluster whose minimum run times are set, which needs format 6, gives it).
    ReasonCode.WAITING_MIN_RUNTIME: 6,
    # A gang no set of the cluster's nodes could ever hold waits for nodes to join
    # (core/feasibility.py).
    ReasonCode.WAITING_FOR_NODES: 9,
    # A gang one owner's member caps hold back (core/member_limits.py).
    ReasonCode.WAITING_MEMBER_CAP: 10,
}


def format_needed(value: Any) -> int:
    """The oldest format that reads ``value`` (a command, or anything a command carries).

    Only what may hold something a format added is looked at: which fields those are is
    worked out once per type from the type hints (:func:`_fields_of`), so a command without
    any (a bind plan, most reports) costs a lookup, not a walk of its values."""
    need = NEW_COMMANDS.get(type(value), BASE_FORMAT)
    stack = [value]
    while stack:
        item = stack.pop()
        kind = type(item)
        if kind is tuple or kind is list or kind is frozenset or kind is set:
            stack.extend(item)
            continue
        if kind is dict:
            stack.extend(item.keys())
            stack.extend(item.values())
            continue
        plan = _PLANS.get(kind)
        if plan is None:
            if isinstance(item, enum.Enum):
                need = max(need, NEW_ENUM_VALUES.get(item, BASE_FORMAT))
                continue
            plan = _PLANS[kind] = _fields_of(kind) if dataclasses.is_dataclass(item) else ()
        for name, added, descend in plan:
            inner = getattr(item, name)
            if added is not None and inner != added[1]:
                need = max(need, added[0])
            if not descend:
                continue
            if isinstance(inner, enum.Enum):  # the common leaf, without a round trip
                need = max(need, NEW_ENUM_VALUES.get(inner, BASE_FORMAT))
            else:
                stack.append(inner)
    return need


# Per type, the fields format_needed looks at (none for a type that is not a dataclass).
_PLANS: dict[type, tuple[tuple[str, tuple[int, Any] | None, bool], ...]] = {}


def _fields_of(kind: type) -> tuple[tuple[str, tuple[int, Any] | None, bool], ...]:
    """The fields of a dataclass worth looking at: each with (format, default) when a
    format added it, and whether its value may hold anything a format added (from its
    type hint). Fields that are neither are left out."""
    added = NEW_FIELDS.get(kind, {})
    hints = typing.get_type_hints(kind)
    fields = (
        (
            f.name,
            (added[f.name], _default(f)) if f.name in added else None,
            _may_hold_new(hints[f.name], frozenset()),
        )
        for f in dataclasses.fields(kind)
    )
    return tuple(f for f in fields if f[1] is not None or f[2])


def _may_hold_new(tp: Any, seen: frozenset[Any]) -> bool:
    """Whether a value of type ``tp`` may hold a field, a command or an enum value a
    format added (what cannot be told from the hint counts as may)."""
    if tp in seen:
        return False  # a recursive type: its other paths decide
    if typing.get_origin(tp) is not None or isinstance(tp, types.UnionType):
        return any(_may_hold_new(arg, seen | {tp}) for arg in typing.get_args(tp) if arg is not ...)
    if tp in (str, int, bool, float, bytes, type(None)):
        return False
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return any(type(member) is tp for member in NEW_ENUM_VALUES)
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        if tp in NEW_FIELDS or tp in NEW_COMMANDS:
            return True
        hints = typing.get_type_hints(tp)
        return any(_may_hold_new(hint, seen | {tp}) for hint in hints.values())
    return True


def _default(f: dataclasses.Field[Any]) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    assert f.default_factory is not dataclasses.MISSING, f"{f.name} added without a default"
    return f.default_factory()


def held_back_config(wanted: ClusterConfig, current: ClusterConfig, floor: int) -> ClusterConfig:
    """``wanted`` with every setting that needs a format above ``floor`` kept as it is in
    ``current`` (a limit's too; a priority class's: at its default, all a state at
    ``floor`` can hold): what the leader may replicate now of what its configuration asks for."""
    keep: dict[str, Any] = {
        name: getattr(current, name)
        for name, version in NEW_FIELDS.get(ClusterConfig, {}).items()
        if version > floor
    }
    limits = {
        name: getattr(current.limits, name)
        for name, version in NEW_FIELDS[Limits].items()
        if version > floor
    }
    if limits:
        keep["limits"] = dataclasses.replace(wanted.limits, **limits)
    reset = {
        f.name: _default(f)
        for f in dataclasses.fields(PriorityClass)
        if NEW_FIELDS[PriorityClass].get(f.name, BASE_FORMAT) > floor
    }
    if reset:
        keep["priority_classes"] = tuple(
            dataclasses.replace(c, **reset) for c in wanted.priority_classes
        )
    return dataclasses.replace(wanted, **keep) if keep else wanted


def format_refusal(need: int, floor: int) -> str:
    """Why a command that needs format ``need`` is refused at floor ``floor``."""
    return (
        f"this change needs format {need}, and not every replica is known to read it "
        f"(the cluster's replicas all read format {floor}); upgrade every replica — "
        f"`synctl cluster -o json` shows each one's format_version — and the leader "
        f"raises the cluster's format by itself"
    )
