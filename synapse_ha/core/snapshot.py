"""Copy-on-write snapshots of the replicated state, for the planner and for readers.

``apply`` changes the live :class:`ClusterState` in place, under the replica's apply lock.
Anything that only reads — a scheduling pass, ``explain``, ``ListJobs``, the heartbeat's
desired state — works on a snapshot instead, so it never holds that lock while it thinks.

A snapshot is a ``ClusterState`` whose records are never changed after it is made. It is
bought in O(what changed): :func:`apply_tracked` notes which node and job records each
command may touch (a superset, judged by the command's type, before and after it is
applied), and :meth:`SnapshotBuilder.take` copies only those records, sharing every other
one with the previous snapshot. The dictionaries themselves are copied (a C-speed copy of
references). A command type it does not know and a restored state make the
next snapshot a full copy, so an unknown change can cost time but never correctness.

Nothing here reads a clock or does I/O. The caller holds the apply lock while it calls
:func:`apply_tracked` and :meth:`SnapshotBuilder.take`; it may read the snapshot anywhere.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable
from typing import Any

from synapse_ha.core import commands as cmd
from synapse_ha.core.machine import HANDLERS, apply
from synapse_ha.core.machine.changes import Changes, Touches
from synapse_ha.core.model import ClusterState, Job

__all__ = [
    "Changes",
    "SnapshotBuilder",
    "apply_tracked",
    "clone",
    "full_copy",
    "note_touched",
]

# What each command type may touch, as its aggregate declares it beside its handler
# (synapse_ha.core.machine). A type missing here makes the next snapshot a full copy.
_TOUCHES: dict[type, Touches] = {t: h.touches for t, h in HANDLERS.items()}


def note_touched(state: ClusterState, command: cmd.Command, changes: Changes) -> None:
    """Add to ``changes`` every record ``command`` may change in ``state``.

    Called once before and once after the command is applied: before, to catch records
    it may release or remove (an attempt's old nodes, purged jobs); after, to catch the
    ones it creates or binds (a new job, a new attempt's nodes).
    """
    touches = _TOUCHES.get(type(command))
    if touches is None:
        changes.everything = True
        return
    fresh = Changes()
    touches(state, command, fresh)
    _with_dependants(state, fresh.jobs)
    changes.nodes |= fresh.nodes
    changes.jobs |= fresh.jobs
    changes.request_ids |= fresh.request_ids
    changes.tokens |= fresh.tokens
    changes.everything |= fresh.everything


def _with_dependants(state: ClusterState, jobs: set[str]) -> None:
    """Add to ``jobs`` the jobs waiting on them or on their arrays, and on those (a job
    that starts or finishes resolves its dependants' dependencies, cancelling some down a
    chain)."""
    work = [
        job_id
        for job_id in jobs
        if (job := state.jobs.get(job_id)) and (job.dependants or job.array_id)
    ]
    arrays: set[str] = set()  # arrays whose dependants were added (once each)
    while work:
        job = state.jobs.get(work.pop())
        if job is None:
            continue
        more = job.dependants
        if job.array_id and job.array_id not in arrays:
            arrays.add(job.array_id)
            array = state.arrays.get(job.array_id)
            more = (*more, *(array.dependants if array else ()))
        for dependant in more:
            if dependant not in jobs:
                jobs.add(dependant)
                work.append(dependant)


def apply_tracked(state: ClusterState, command: cmd.Command, changes: Changes) -> cmd.Result:
    """:func:`apply`, noting in ``changes`` what the command may have touched."""
    note_touched(state, command, changes)
    result = apply(state, command)
    note_touched(state, command, changes)
    return result


# ----------------------------------------------------------------------- copying


# Types whose values are never changed in place: shared by every copy. Enum types and
# frozen dataclasses join on first sight. Tuples in the state hold only such values.
_IMMUTABLE: set[type] = {str, int, float, bool, type(None), tuple, frozenset, bytes}
_COPIERS: dict[type, Callable[[Any], Any]] = {}  # mutable dataclass -> its copier


def clone(value: Any) -> Any:
    """A copy of a state record that shares every immutable part (frozen dataclasses,
    strings, numbers, enums, tuples of those) and copies every mutable one."""
    kind = type(value)
    if kind in _IMMUTABLE:
        return value
    copier = _COPIERS.get(kind)
    if copier is not None:
        return copier(value)
    if kind is list:
        return [clone(item) for item in value]
    if kind is set:
        return set(value)  # sets hold immutable members (GPU indices)
    if kind is dict:
        return {key: clone(item) for key, item in value.items()}
    frozen = dataclasses.is_dataclass(value) and kind.__dataclass_params__.frozen
    if frozen or isinstance(value, enum.Enum):
        _IMMUTABLE.add(kind)
        return value
    if not dataclasses.is_dataclass(value):
        raise TypeError(f"cannot snapshot a {kind.__name__}")
    copier = _COPIERS[kind] = _copier(kind)
    return copier(value)


def _copier(kind: type) -> Callable[[Any], Any]:
    """:func:`clone` for one mutable dataclass, as one generated function that reads and
    sets each field by name (a full copy of a large state clones every job: a loop over
    the field names with ``getattr`` and ``setattr`` took twice as long)."""
    lines = ["def copy(value):", "    copied = _new(_kind)"]
    for f in dataclasses.fields(kind):
        lines.append(f"    item = value.{f.name}")
        lines.append(f"    copied.{f.name} = item if type(item) in _IMMUTABLE else _clone(item)")
    lines.append("    return copied")
    namespace: dict[str, Any] = {
        "_new": object.__new__,
        "_kind": kind,
        "_IMMUTABLE": _IMMUTABLE,
        "_clone": clone,
    }
    exec("\n".join(lines), namespace)  # source made from the field names alone
    copy: Callable[[Any], Any] = namespace["copy"]
    return copy


def full_copy(state: ClusterState) -> ClusterState:
    """A snapshot that shares no mutable record with ``state``."""
    copied: ClusterState = clone(state)
    return copied


# The state's other fields: counters and clocks, immutable values.
_COUNTERS = tuple(
    f.name
    for f in dataclasses.fields(ClusterState)
    if f.name not in ("config", "nodes", "jobs", "request_ids", "tokens")
)


class SnapshotBuilder:
    """Makes snapshots of one live state, each from the previous one and the changes.

    Not thread-safe: the owner calls :func:`apply_tracked` and :meth:`take` under the
    same lock. ``changes`` is the set :func:`apply_tracked` must be given.
    """

    def __init__(self) -> None:
        self.changes = Changes(everything=True)
        self._last: ClusterState | None = None

    def reset(self) -> None:
        """The live state was replaced (a restored dump): the next snapshot copies all."""
        self.changes.everything = True

    def take(self, state: ClusterState) -> ClusterState:
        """A snapshot equal to ``state`` now. Costs O(records changed since the last one)
        plus a copy of the two record dictionaries' references."""
        last, changes = self._last, self.changes
        if last is not None and not changes and last.applied_commands == state.applied_commands:
            return last
        if last is None or changes.everything:
            snap = full_copy(state)
        else:
            nodes = last.nodes
            if changes.nodes:
                nodes = dict(nodes)
                added = False
                for node_id in changes.nodes:
                    node = state.nodes.get(node_id)
                    if node is None:
                        nodes.pop(node_id, None)
                    else:
                        added = added or node_id not in nodes
                        nodes[node_id] = clone(node)
                if added:  # rare: keep registration order, as the live dictionary has it
                    nodes = {node_id: nodes[node_id] for node_id in state.nodes}
            jobs = last.jobs
            if changes.jobs:
                jobs = dict(jobs)
                new: list[Job] = []
                for job_id in changes.jobs:
                    job = state.jobs.get(job_id)
                    if job is None:
                        jobs.pop(job_id, None)
                    elif job_id in jobs:
                        jobs[job_id] = clone(job)
                    else:
                        new.append(job)
                # New jobs go last in submission order, as in the live dictionary.
                for job in sorted(new, key=lambda j: (j.seq, j.array_index)):
                    jobs[job.job_id] = clone(job)
            snap = ClusterState(
                config=state.config,
                nodes=nodes,
                jobs=jobs,
                request_ids=dict(state.request_ids) if changes.request_ids else last.request_ids,
                # Tokens are frozen values: a copy of the dictionary is a full copy.
                tokens=dict(state.tokens) if changes.tokens else last.tokens,
            )
            for name in _COUNTERS:
                setattr(snap, name, clone(getattr(state, name)))
        changes.clear()
        self._last = snap
        return snap
