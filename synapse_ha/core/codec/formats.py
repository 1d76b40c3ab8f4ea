"""Which format a replica reads, and which a command needs: the format gate.

A release reads every format up to :data:`FORMAT` and says so (``format_version`` in
``synctl cluster -o json``). What each format added — fields written only when they differ
from their defaults (:data:`ADDED_FIELDS`, which the codec reads), command types, enum
values — is listed here with the format that reads it. A replica of an older release
refuses what it cannot read, and a replica that refuses a command the others applied no
longer has their state. So the replicated state carries a floor
(``ClusterState.format_floor``): the newest format every replica reads, raised by
:class:`~synapse_ha.core.commands.RaiseFormat` once the leader has heard every replica
report it, never lowered. ``apply`` refuses, with an error value, a command that needs a
format above the floor (:func:`format_needed`), and the leader holds back a configured
setting that would (:func:`held_back_config`).

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

from synapse_ha.core import model
from synapse_ha.core.cluster_config import (
    ClusterConfig,
    Cohort,
    Limits,
    PreemptionKind,
    PriorityClass,
    Queue,
)
from synapse_ha.core.commands import (
    CreateToken,
    DeleteCohort,
    ExitCause,
    ExpireDeadline,
    GrowMembers,
    MarkNodeDegraded,
    MemberEvent,
    MemberEventKind,
    ReplaceMembers,
    ReportNodeChecks,
    RequeueJob,
    SetCohort,
    ShrinkMembers,
)
from synapse_ha.core.model import ADDED_IN, Token
from synapse_ha.core.reasons import ReasonCode
from synapse_ha.core.workflows.dependencies import Dependencies

BASE_FORMAT = 2  # the format of a state that has no floor, and of a fresh replica's state
FORMAT = 18  # the newest format this release reads

# The format that added each field of a type declared outside core/model.py (a field of
# core/model.py says its own: ``since(format, default)``), by owning type. Such a field is
# written only when it differs from its default, so that a value keeping it at its default
# reads as the previous format wrote it; a command that sets it needs its format. Format 2
# (BASE_FORMAT): added before the format gate, never refused.
_DECLARED: dict[type, dict[str, int]] = {
    # Format 3: resources of an ended attempt held until its members are confirmed
    # stopped; GPU faults cleared by a reboot. Format 6: how long a reclaim waits before
    # it overrides a minimum run time (core/queues/victim_rules.py).
    ClusterConfig: {
        "priority_classes": 2,
        "fair_share_half_life_ms": 2,
        "preemption": 2,
        "compact_state": 2,
        "limits": 2,
        "gpu_drain_threshold": 2,
        "unfit_backoff_ms": 2,
        "cordon_after_start_failures": 2,
        "hold_until_stopped": 3,
        "clear_gpu_faults_on_reboot": 3,
        "reclaim_wait_max_ms": 6,
        # Format 8: followers relay workers' heartbeats (rpc/relay.py).
        "relay_heartbeats": 8,
        # Format 14: hot spares kept out of normal placement (core/spares.py).
        "spares": 14,
        "spare_level": 14,
        # Format 17: drains for gangs short only of contiguous room (core/scheduler/defrag.py).
        "defrag_share_pct": 17,
        # Format 18: more than one reservation per pass (core/scheduler/reservation.py).
        "reservations_per_pass": 18,
    },
    # Format 6: minimum run time of a priority class and a queue (core/queues/victim_rules.py).
    PriorityClass: {"min_runtime_ms": 6},
    # Format 10: floors and caps on members (core/spec/member_limits.py) and a queue's own caps;
    # per-identity limits and authorised priority (DESIGN §8).
    Limits: {
        "member_min_cpu_milli": 10,
        "member_min_memory_mib": 10,
        "member_overhead_memory_mib": 10,
        "running_members_per_user": 10,
        "members_per_node_per_user": 10,
    },
    Queue: {
        "max_priority": 2,
        "min_runtime_ms": 6,
        "running_members_per_user": 10,
        "members_per_node_per_user": 10,
        # Format 15: run-time estimates for backfill (core/queues/estimates.py).
        "default_time_limit_ms": 15,
        "learned_estimates": 15,
    },
    # Format 16: fair-sharing preemption in a cohort (core/queues/fair_preemption.py).
    Cohort: {"fair_sharing_preemption": 16},
    Token: {"priority_classes": 2, "max_priority": 2},
    CreateToken: {"priority_classes": 2, "max_priority": 2},
    # Format 13: Slurm's singleton dependency (core/workflows/dependencies.py).
    Dependencies: {"singleton": 13},
    # Format 5: checkpoint marks (core/workflows/checkpoints.py): a mark's step and number.
    # Format 14: a member's generation (a rank placed again while its gang ran on).
    MemberEvent: {"step": 5, "mark_seq": 5, "generation": 14},
}


def _declared_in_model() -> dict[type, dict[str, int]]:
    """The fields of core/model.py's types declared with ``since``, by type."""
    out: dict[type, dict[str, int]] = {}
    for kind in vars(model).values():
        if isinstance(kind, type) and dataclasses.is_dataclass(kind):
            fields = dataclasses.fields(kind)
            found = {f.name: f.metadata[ADDED_IN] for f in fields if ADDED_IN in f.metadata}
            if found and kind.__module__ == model.__name__:
                out[kind] = found
    return out


# Every field added since the first format, with the format that added it, by owning type:
# the codec's fields written only away from their defaults (core/codec/to_plain.py).
ADDED_FIELDS: dict[type, dict[str, int]] = {**_DECLARED, **_declared_in_model()}
# Of those, the fields a command may only set at their format (above BASE_FORMAT).
NEW_FIELDS: dict[type, dict[str, int]] = {
    kind: gated
    for kind, fields in ADDED_FIELDS.items()
    if (gated := {name: version for name, version in fields.items() if version > BASE_FORMAT})
}
# Command types each format added.
# (``RaiseFormat`` itself is format 3 but never gated: the leader proposes it only once
# every replica reads it.)
NEW_COMMANDS: dict[type, int] = {
    # A worker's node checks (its health-check program): node conditions.
    ReportNodeChecks: 3,
    # A pending job cancelled at its deadline.
    ExpireDeadline: 4,
    # The cohort tree (core/queues/cohort_tree.py): cohort records.
    SetCohort: 7,
    DeleteCohort: 7,
    # A requeue its owner asks for (scontrol requeue).
    RequeueJob: 13,
    # Lost ranks of running gangs placed again (core/replacement.py).
    ReplaceMembers: 14,
    # A node the leader finds slow from its members' pace (core/health/slowness.py).
    MarkNodeDegraded: 15,
    # Elastic gangs (core/elastic.py): grown and shrunk while they run.
    GrowMembers: 15,
    ShrinkMembers: 15,
}
# Enum values each format added (an older release cannot decode them).
NEW_ENUM_VALUES: dict[enum.Enum, int] = {
    # A member stopped by its worker for making no progress (hang detection).
    ExitCause.HUNG: 3,
    # A task of an array waiting for a slot of its throttle (a BindPlan's reason).
    ReasonCode.ARRAY_THROTTLE: 5,
    # A member's checkpoint mark (core/workflows/checkpoints.py).
    MemberEventKind.CHECKPOINT: 5,
    # A gang whose possible victims are within their minimum run time (core/queues/victim_rules.py;
    # only a cluster whose minimum run times are set, which needs format 6, gives it).
    ReasonCode.WAITING_MIN_RUNTIME: 6,
    # A gang no set of the cluster's nodes could ever hold waits for nodes to join
    # (core/feasibility.py).
    ReasonCode.WAITING_FOR_NODES: 9,
    # A gang one owner's member caps hold back (core/spec/member_limits.py).
    ReasonCode.WAITING_MEMBER_CAP: 10,
    # A requeue its owner asked for (RequeueJob, itself format 13).
    ReasonCode.REQUEUE_REQUESTED: 13,
    ReasonCode.REQUEUED_BY_REQUEST: 13,
    # Member replacement (core/replacement.py, ReplaceMembers itself format 14).
    ReasonCode.REPLACE_TIMEOUT: 14,
    ReasonCode.REQUEUED_REPLACE_TIMEOUT: 14,
    ReasonCode.REPLACING: 14,
    ReasonCode.NODE_DRAINED: 14,
    # A member moved off a node found slow (MarkNodeDegraded, itself format 15).
    ReasonCode.NODE_DEGRADED: 15,
    # An elastic gang giving back its top ranks (ShrinkMembers, itself format 15).
    ReasonCode.SHRINKING: 15,
    # A gang that starts as soon without preempting as with it (scheduler/pass_preemptions.py).
    ReasonCode.STARTS_WITHOUT_PREEMPTING: 16,
    # A queue below its fair share preempting a borrower above it (core/queues/fair_preemption.py;
    # only a cohort with fair_sharing_preemption, itself format 16, gives it).
    PreemptionKind.FAIR_SHARE: 16,
    # A gang waiting for nodes drained for it (core/scheduler/defrag.py).
    ReasonCode.DEFRAGMENTING: 17,
    ReasonCode.DRAINING_FOR: 17,
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
