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
from functools import cache
from typing import Any

from synapse_ha.core.cluster_config import ClusterConfig
from synapse_ha.core.commands import ExitCause, ReportNodeChecks
from synapse_ha.core.model import JobSpec, NodeInfo

BASE_FORMAT = 2  # the format of a state that has no floor, and of a fresh replica's state
FORMAT = 3  # the newest format this release reads

# Fields (of commands and of what they carry) each format added, by owning type; a value
# that keeps such a field at its default reads as the previous format wrote it.
NEW_FIELDS: dict[type, dict[str, int]] = {
    # Resources of an ended attempt held until its members are confirmed stopped; GPU
    # faults cleared by a reboot.
    ClusterConfig: {"hold_until_stopped": 3, "clear_gpu_faults_on_reboot": 3},
    # The machine's boot, to tell a reboot.
    NodeInfo: {"boot_id": 3},
    # Hang detection of a job's members (core/progress.py), and a job's pre-start check
    # (core/prestart.py).
    JobSpec: {"progress": 3, "prestart": 3},
}
# Command types each format added.
# (``RaiseFormat`` itself is format 3 but never gated: the leader proposes it only once
# every replica reads it.)
NEW_COMMANDS: dict[type, int] = {
    # A worker's node checks (its health-check program): node conditions.
    ReportNodeChecks: 3,
}
# Enum values each format added (an older release cannot decode them).
NEW_ENUM_VALUES: dict[enum.Enum, int] = {
    # A member stopped by its worker for making no progress (hang detection).
    ExitCause.HUNG: 3,
}

_LEAVES = (str, int, bool, float, type(None), bytes)


def format_needed(value: Any) -> int:
    """The oldest format that reads ``value`` (a command, or anything a command carries)."""
    need = NEW_COMMANDS.get(type(value), BASE_FORMAT)
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, enum.Enum):
            need = max(need, NEW_ENUM_VALUES.get(item, BASE_FORMAT))
        elif isinstance(item, _LEAVES):
            continue
        elif isinstance(item, tuple | list | frozenset | set):
            stack.extend(item)
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif dataclasses.is_dataclass(item):
            kind: type = type(item)
            for name, added in _fields_of(kind):
                inner = getattr(item, name)
                if added is not None and inner != added[1]:
                    need = max(need, added[0])
                stack.append(inner)
    return need


@cache
def _fields_of(kind: type) -> tuple[tuple[str, tuple[int, Any] | None], ...]:
    """A dataclass's field names, each with (format, default) when a format added it."""
    added = NEW_FIELDS.get(kind, {})
    return tuple(
        (f.name, (added[f.name], _default(f)) if f.name in added else None)
        for f in dataclasses.fields(kind)
    )


def _default(f: dataclasses.Field[Any]) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    assert f.default_factory is not dataclasses.MISSING, f"{f.name} added without a default"
    return f.default_factory()


def held_back_config(wanted: ClusterConfig, current: ClusterConfig, floor: int) -> ClusterConfig:
    """``wanted`` with every setting that needs a format above ``floor`` kept as it is in
    ``current``: what the leader may replicate now of what its configuration asks for."""
    keep = {
        name: getattr(current, name)
        for name, version in NEW_FIELDS.get(ClusterConfig, {}).items()
        if version > floor
    }
    return dataclasses.replace(wanted, **keep) if keep else wanted


def format_refusal(need: int, floor: int) -> str:
    """Why a command that needs format ``need`` is refused at floor ``floor``."""
    return (
        f"this change needs format {need}, and not every replica is known to read it "
        f"(the cluster's replicas all read format {floor}); upgrade every replica — "
        f"`synctl cluster -o json` shows each one's format_version — and the leader "
        f"raises the cluster's format by itself"
    )
