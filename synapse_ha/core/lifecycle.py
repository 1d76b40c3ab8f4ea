"""The lifecycles of jobs, attempts, members and nodes as transition tables.

Each ``(state, event) -> state`` is declared once, here. :func:`transition` answers with
the new state, or with an :class:`UndeclaredTransition` for a pair the table does not
declare; the state machine changes a record's state only through it, so the tables are
the whole truth (``tests/core/test_lifecycle.py`` walks every row and every undeclared
pair).

Rules the tables state:

* **Job.** ``PENDING -bind-> SCHEDULED -start-> RUNNING``; a live job (scheduled or
  running) ends as ``SUCCEEDED`` (all members exited 0), ``FAILED`` (its own failure with
  no retry left, a time limit, or a disruption past ``max_requeues``), or goes back to
  ``PENDING`` by ``retry`` (its own failure, counted against ``retries.max``) or
  ``requeue`` (a disruption it did not cause, counted against ``max_requeues``). Any
  unfinished job may be cancelled. Any unfinished job ends ``SUCCEEDED`` by
  ``late_success`` when every member of its attempt that was ended by its node's death
  turns out to have exited 0 (the exits were reported after the death was committed); a
  newer attempt, if any, is stopped. Finished states are final.
* **Attempt.** ``BOUND -start-> RUNNING``; a live attempt ends ``SUCCEEDED``, ``FAILED``,
  ``REQUEUED`` (a disruption) or ``STOPPED`` (cancelled, time limit). Ended is final.
* **Member.** ``BOUND -start-> RUNNING``; ``BOUND|RUNNING -exit-> EXITED``. A repeated
  start of a running member is harmless (reports are at-least-once).
* **Node.** Operators move a live node between ``READY``, ``CORDONED`` and ``DRAINING``;
  a ``DRAINING`` node becomes ``CORDONED`` once it holds no members (``emptied``); only
  the leader declares a node ``DEAD``, and a dead node comes back only by registering
  again (``READY``, empty). Registering a live node keeps its status.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

from synapse_ha.core.model import AttemptState, ClusterState, Job, JobState, MemberState, NodeStatus

S = TypeVar("S", bound=enum.Enum)
E = TypeVar("E", bound=enum.Enum)


class JobEvent(enum.StrEnum):
    BIND = "bind"
    START = "start"
    SUCCEED = "succeed"
    RETRY = "retry"
    REQUEUE = "requeue"
    FAIL = "fail"
    CANCEL = "cancel"
    LATE_SUCCESS = "late_success"


class AttemptEvent(enum.StrEnum):
    START = "start"
    SUCCEED = "succeed"
    FAIL = "fail"
    REQUEUE = "requeue"
    STOP = "stop"


class MemberEvent(enum.StrEnum):
    START = "start"
    EXIT = "exit"


class NodeEvent(enum.StrEnum):
    UNCORDON = "uncordon"
    CORDON = "cordon"
    DRAIN = "drain"
    EMPTIED = "emptied"
    DIE = "die"
    REGISTER = "register"


@dataclass(frozen=True, slots=True)
class UndeclaredTransition:
    """A ``(state, event)`` pair the lifecycle does not declare."""

    lifecycle: str
    state: str
    event: str

    @property
    def message(self) -> str:
        return f"a {self.lifecycle} that is {self.state} cannot {self.event}"


# The earlier name, still imported by the state machine's handlers.
Refusal = UndeclaredTransition


@dataclass(frozen=True, slots=True)
class Lifecycle(Generic[S, E]):
    name: str
    states: type[S]
    events: type[E]
    rows: Mapping[tuple[S, E], S]


def transition(lifecycle: Lifecycle[S, E], state: S, event: E) -> S | UndeclaredTransition:
    """The state after ``event``, or an :class:`UndeclaredTransition` when the table has no
    such row."""
    after = lifecycle.rows.get((state, event))
    if after is None:
        return UndeclaredTransition(lifecycle.name, str(state.value), str(event.value))
    return after


class TransitionRefused(Exception):
    """A transition the state machine believed allowed was refused: a bug. ``apply``
    turns it into an ``INTERNAL`` result."""


def move(lifecycle: Lifecycle[S, E], state: S, event: E) -> S:
    """Like :func:`transition`, for callers that checked the precondition already."""
    after = transition(lifecycle, state, event)
    if isinstance(after, UndeclaredTransition):
        raise TransitionRefused(after.message)
    return after


_J = JobState
_JE = JobEvent
_LIVE_JOB = (_J.SCHEDULED, _J.RUNNING)

JOB: Lifecycle[JobState, JobEvent] = Lifecycle(
    "job",
    JobState,
    JobEvent,
    {
        (_J.PENDING, _JE.BIND): _J.SCHEDULED,
        (_J.PENDING, _JE.CANCEL): _J.CANCELLED,
        (_J.SCHEDULED, _JE.START): _J.RUNNING,
        (_J.RUNNING, _JE.SUCCEED): _J.SUCCEEDED,
        **{(s, _JE.RETRY): _J.PENDING for s in _LIVE_JOB},
        **{(s, _JE.REQUEUE): _J.PENDING for s in _LIVE_JOB},
        **{(s, _JE.FAIL): _J.FAILED for s in _LIVE_JOB},
        **{(s, _JE.CANCEL): _J.CANCELLED for s in _LIVE_JOB},
        **{(s, _JE.LATE_SUCCESS): _J.SUCCEEDED for s in (_J.PENDING, *_LIVE_JOB)},
    },
)

_A = AttemptState
_AE = AttemptEvent
_LIVE_ATTEMPT = (_A.BOUND, _A.RUNNING)

ATTEMPT: Lifecycle[AttemptState, AttemptEvent] = Lifecycle(
    "attempt",
    AttemptState,
    AttemptEvent,
    {
        (_A.BOUND, _AE.START): _A.RUNNING,
        (_A.RUNNING, _AE.SUCCEED): _A.SUCCEEDED,
        **{(s, _AE.FAIL): _A.FAILED for s in _LIVE_ATTEMPT},
        **{(s, _AE.REQUEUE): _A.REQUEUED for s in _LIVE_ATTEMPT},
        **{(s, _AE.STOP): _A.STOPPED for s in _LIVE_ATTEMPT},
    },
)

_M = MemberState
_ME = MemberEvent

MEMBER: Lifecycle[MemberState, MemberEvent] = Lifecycle(
    "member",
    MemberState,
    MemberEvent,
    {
        (_M.BOUND, _ME.START): _M.RUNNING,
        (_M.RUNNING, _ME.START): _M.RUNNING,
        (_M.BOUND, _ME.EXIT): _M.EXITED,
        (_M.RUNNING, _ME.EXIT): _M.EXITED,
    },
)

_N = NodeStatus
_NE = NodeEvent
_LIVE_NODE = (_N.READY, _N.CORDONED, _N.DRAINING)

NODE: Lifecycle[NodeStatus, NodeEvent] = Lifecycle(
    "node",
    NodeStatus,
    NodeEvent,
    {
        **{(s, _NE.UNCORDON): _N.READY for s in _LIVE_NODE},
        **{(s, _NE.CORDON): _N.CORDONED for s in _LIVE_NODE},
        **{(s, _NE.DRAIN): _N.DRAINING for s in _LIVE_NODE},
        **{(s, _NE.DIE): _N.DEAD for s in _LIVE_NODE},
        **{(s, _NE.REGISTER): s for s in _LIVE_NODE},
        (_N.DRAINING, _NE.EMPTIED): _N.CORDONED,
        (_N.DEAD, _NE.REGISTER): _N.READY,
    },
)

LIFECYCLES = (JOB, ATTEMPT, MEMBER, NODE)


def move_job(state: ClusterState, job: Job, event: JobEvent) -> None:
    """Move ``job`` of ``state`` along :data:`JOB` (the precondition checked already),
    keeping the state's index of the jobs that hold resources."""
    job.state = move(JOB, job.state, event)
    state.job_state_changed(job)


# The operator's SetNodeStatus target status -> the event it is.
NODE_EVENT_FOR_STATUS: dict[NodeStatus, NodeEvent] = {
    NodeStatus.READY: NodeEvent.UNCORDON,
    NodeStatus.CORDONED: NodeEvent.CORDON,
    NodeStatus.DRAINING: NodeEvent.DRAIN,
}
