"""What a command may touch, declared beside its handler: every aggregate module maps
each of its command types to a :class:`Handling` (the handler, and the records the
command may touch, as a superset judged before and after it is applied), and
:mod:`synapse_ha.core.snapshot` copies only those records for the next snapshot."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple

from synapse_ha.core.commands import Result
from synapse_ha.core.model import ClusterState


@dataclasses.dataclass(slots=True)
class Changes:
    """Records touched since the last snapshot.

    The rest is the snapshot's copy-on-write bookkeeping (:mod:`synapse_ha.core.snapshot`):
    ``shared``: the live records may be shared with the newest snapshot; ``own_nodes`` /
    ``own_jobs``: records the live state has copied for itself since (``own_all``: all).
    """

    nodes: set[str] = dataclasses.field(default_factory=set)
    jobs: set[str] = dataclasses.field(default_factory=set)
    request_ids: bool = False
    tokens: bool = False
    everything: bool = False
    shared: bool = False
    own_nodes: set[str] = dataclasses.field(default_factory=set)
    own_jobs: set[str] = dataclasses.field(default_factory=set)
    own_all: bool = False

    def clear(self) -> None:
        self.nodes.clear()
        self.jobs.clear()
        self.request_ids = False
        self.tokens = False
        self.everything = False
        self.own_nodes.clear()
        self.own_jobs.clear()
        self.own_all = False

    def add(self, other: Changes) -> None:
        """Note ``other``'s records too."""
        self.nodes |= other.nodes
        self.jobs |= other.jobs
        self.request_ids |= other.request_ids
        self.tokens |= other.tokens
        self.everything |= other.everything

    def __bool__(self) -> bool:
        return bool(self.nodes or self.jobs or self.request_ids or self.tokens or self.everything)


Touches = Callable[[ClusterState, Any, Changes], None]


class Handling(NamedTuple):
    """A command type's handler and what it may touch."""

    apply: Callable[[ClusterState, Any, int], Result]
    touches: Touches


def job_and_its_nodes(state: ClusterState, job_id: str, changes: Changes) -> None:
    changes.jobs.add(job_id)
    job = state.jobs.get(job_id)
    if job is not None and job.attempt is not None:
        changes.nodes.update(m.node_id for m in job.attempt.members)


def nothing(state: ClusterState, command: Any, changes: Changes) -> None:
    """No record: the configuration and the queues are immutable values (a small
    dictionary of them) that every snapshot copies or shares whole."""


def one_job(state: ClusterState, command: Any, changes: Changes) -> None:
    """The command's ``job_id`` and the nodes of its attempt."""
    job_and_its_nodes(state, command.job_id, changes)


def tokens(state: ClusterState, command: Any, changes: Changes) -> None:
    changes.tokens = True
