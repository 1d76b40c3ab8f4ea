"""Copy-on-write snapshots of the replicated state, for the planner and for readers.

``apply`` changes the live :class:`ClusterState` in place, under the replica's apply lock.
Anything that only reads — a scheduling pass, ``explain``, ``ListJobs``, the heartbeat's
desired state — works on a snapshot instead, so it never holds that lock while it thinks.

A snapshot is a ``ClusterState`` whose records are never changed after it is made. Taking
one copies the record dictionaries (a C-speed copy of references) and no record at all: a
snapshot shares the live records. The copying is done on the write side, record by
record: :func:`apply_tracked` knows which node and job records each command may touch (a
superset, judged by the command's type, before it is applied), and a record still shared
with the newest snapshot is replaced in the live state by a private copy before the
command changes it — once per record between two snapshots. So a snapshot costs the same
whether 10 or 10,000 records changed since the previous one, and a command pays for the
records it changes. A command type it does not know makes every record private first,
so an unknown change can cost time but never correctness.

Nothing here reads a clock or does I/O. The caller holds the apply lock while it calls
:func:`apply_tracked` and :meth:`SnapshotBuilder.take`; it may read the snapshot anywhere.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Collection
from typing import Any

from synapse_ha.core import commands as cmd
from synapse_ha.core.feasibility import NodeSummary
from synapse_ha.core.machine import HANDLERS, apply
from synapse_ha.core.machine.changes import Changes, Touches
from synapse_ha.core.member_counts import MemberCounts
from synapse_ha.core.model import ClusterState
from synapse_ha.core.node_index import NodeIndex

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
    it may change or remove (an attempt's old nodes, purged jobs, the nodes a bind names);
    after, to catch the ones it creates (a new job). A record the command changes must be
    in the first set: only those are copied before the change (:func:`apply_tracked`).
    """
    touches = _TOUCHES.get(type(command))
    if touches is None:
        changes.everything = True
        return
    fresh = Changes()
    touches(state, command, fresh)
    _with_dependants(state, fresh.jobs)
    changes.add(fresh)


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


def apply_tracked(
    state: ClusterState, command: cmd.Command, changes: Changes, also: Changes | None = None
) -> cmd.Result:
    """:func:`apply`, noting in ``changes`` (and in ``also``, when given: this command's
    records alone) what the command may have touched. A record it may change that is
    still shared with the newest snapshot is first replaced by a copy of its own."""
    touched = Changes()
    note_touched(state, command, touched)
    if changes.shared:
        _own(state, touched, changes)
    result = apply(state, command)
    note_touched(state, command, touched)
    changes.add(touched)
    if also is not None:
        also.add(touched)
    return result


def _own(state: ClusterState, touched: Changes, changes: Changes) -> None:
    """Replace every record in ``touched`` that the live state does not own yet (it is
    shared with the newest snapshot) by a copy, and note that it owns it now."""
    if changes.own_all:
        return
    if touched.everything:  # a command of unknown reach: own every record
        for node_id, record in state.nodes.items():
            if node_id not in changes.own_nodes:
                state.nodes[node_id] = clone(record)
        for job_id, whole in state.jobs.items():
            if job_id not in changes.own_jobs:
                state.jobs[job_id] = clone(whole)
        changes.own_all = True
        return
    for node_id in touched.nodes - changes.own_nodes:
        node = state.nodes.get(node_id)
        if node is not None:
            state.nodes[node_id] = clone(node)
    for job_id in touched.jobs - changes.own_jobs:
        job = state.jobs.get(job_id)
        if job is not None:
            state.jobs[job_id] = clone(job)
    changes.own_nodes |= touched.nodes
    changes.own_jobs |= touched.jobs


# ----------------------------------------------------------------------- copying


# Types whose values are never changed in place: shared by every copy. Enum types and
# frozen dataclasses join on first sight. Tuples in the state hold only such values. A
# node summary (core/feasibility) is replaced, never changed, but for the answers it keeps.
_IMMUTABLE: set[type] = {str, int, float, bool, type(None), tuple, frozenset, bytes, NodeSummary}
# mutable type -> copier
_COPIERS: dict[type, Callable[[Any], Any]] = {
    NodeIndex: NodeIndex.copy,
    MemberCounts: MemberCounts.copy,
}


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
    if f.name
    not in (
        "config",
        "nodes",
        "jobs",
        "request_ids",
        "tokens",
        "_live",
        "_nodes",
        "_fits",
        "_members",
    )
)


class SnapshotBuilder:
    """Makes snapshots of one live state (copy-on-write: see the module's docstring).

    Not thread-safe: the owner calls :func:`apply_tracked` and :meth:`take` under the
    same lock. ``changes`` is the set :func:`apply_tracked` must be given.
    """

    def __init__(self) -> None:
        self.changes = Changes(everything=True)
        self._last: ClusterState | None = None

    def reset(self) -> None:
        """The live state was replaced (a restored dump): it shares nothing with the
        newest snapshot, and the next one copies the small dictionaries afresh."""
        self.changes.everything = True
        self.changes.shared = False

    def take(self, state: ClusterState) -> ClusterState:
        """A snapshot equal to ``state`` now. Copies the record dictionaries' references
        and no record: the records are shared until a command changes one."""
        last, changes = self._last, self.changes
        if last is not None and not changes and last.applied_commands == state.applied_commands:
            return last
        request_ids, tokens = state.request_ids, state.tokens
        if last is None or changes.everything or changes.request_ids:
            request_ids = dict(request_ids)
        else:
            request_ids = last.request_ids
        if last is None or changes.everything or changes.tokens:
            tokens = dict(tokens)  # tokens are frozen values: this is a full copy
        else:
            tokens = last.tokens
        snap = ClusterState(
            config=state.config,
            nodes=dict(state.nodes),
            jobs=dict(state.jobs),
            request_ids=request_ids,
            tokens=tokens,
        )
        for name in _COUNTERS:
            setattr(snap, name, clone(getattr(state, name)))
        snap._live = set(state.live_ids())  # built once on the live state, then kept
        snap._nodes = state._node_index().snapshot()  # its tuples are never changed
        snap._fits = state._fits  # replaced when a node registers, never changed
        members = state._members  # built once on the live state (its first bind), then kept
        snap._members = members.snapshot() if members is not None else None
        changes.clear()
        changes.shared = True
        self._last = snap
        return snap


@dataclasses.dataclass(frozen=True, slots=True)
class AppliedCommand:
    """``command``, applied to ``state`` with ``result``. ``job_ids``/``node_ids``: the
    records it may have touched (None: any, and every record is compared); ``encoded``:
    the bytes the replica decoded it from, when known (a submission's is kept until its
    job's record is made)."""

    command: cmd.Command
    result: cmd.Result
    state: ClusterState
    job_ids: Collection[str] | None = None
    node_ids: Collection[str] | None = None
    encoded: bytes = b""
