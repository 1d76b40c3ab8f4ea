"""States, statuses and roles between the wire and the core's enums, in one place.

Every message that carries a state has a typed field (a proto enum) and its text twin,
the string field that earlier releases read and write. Writers fill both; readers take
the typed field and fall back to the text only when the typed one is unset, which is an
answer from an earlier release (a rolling upgrade). No other module reads the text, and
none compares a state with a string: it compares the core's enums.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from typing import Generic, TypedDict, TypeVar, cast

from synapse_ha.core.identity.access import Role
from synapse_ha.core.membership import ReplicaRole
from synapse_ha.core.model import AttemptState, JobState, MemberState, NodeStatus
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb

E = TypeVar("E", bound=enum.Enum)
W = TypeVar("W", bound=int)


class _Table(Generic[E, W]):
    """One core enum and its proto enum, matched by member name (``RUNNING`` and
    ``JOB_STATE_RUNNING``). A core member the proto enum lacks fails at import."""

    def __init__(self, core: type[E], wire: type[W], prefix: str) -> None:
        numbers = dict(wire.items())  # type: ignore[attr-defined]
        self.core = core
        self.to_wire: dict[E, W] = {m: cast(W, numbers[prefix + m.name]) for m in core}
        self.from_wire: dict[int, E] = {int(v): k for k, v in self.to_wire.items()}

    def read(self, typed: int, text: str) -> E:
        """The typed value, or the text of an earlier release when it is unset. A value
        neither this release nor an earlier one writes raises ``ValueError``."""
        if typed:
            try:
                return self.from_wire[typed]
            except KeyError:
                raise ValueError(f"unknown {self.core.__name__} number {typed}") from None
        return self.core(text)

    def shown(self, typed: int, text: str) -> str:
        """The value for people: the typed value's name, else whatever text was sent
        (which the renderer escapes), never an error."""
        known = self.from_wire.get(typed)
        if known is not None:
            return str(known)
        return f"unknown ({typed})" if typed else text


_JOB = _Table(JobState, pb.JobState, "JOB_STATE_")
_ATTEMPT = _Table(AttemptState, pb.AttemptState, "ATTEMPT_STATE_")
_MEMBER = _Table(MemberState, pb.MemberState, "MEMBER_STATE_")
_NODE = _Table(NodeStatus, pb.NodeStatus, "NODE_STATUS_")
_REPLICA = _Table(ReplicaRole, pb.ReplicaRole, "REPLICA_ROLE_")
_USER = _Table(Role, pb.UserRole, "USER_ROLE_")

# ------------------------------------------------------------------------- writing
# Each returns the two fields as keyword arguments for the message's constructor.


class JobStateFields(TypedDict):
    state: str
    job_state: pb.JobState


class AttemptStateFields(TypedDict):
    state: str
    attempt_state: pb.AttemptState


class MemberStateFields(TypedDict):
    state: str
    member_state: pb.MemberState


class NodeStatusFields(TypedDict):
    status: str
    node_status: pb.NodeStatus


class LeaseStatusFields(TypedDict):
    node_status_name: str
    node_status: pb.NodeStatus


class ReplicaRoleFields(TypedDict):
    role: str
    replica_role: pb.ReplicaRole


class UserRoleFields(TypedDict):
    role: str
    user_role: pb.UserRole


class JobStateFilter(TypedDict):
    states: list[str]
    job_states: list[pb.JobState]


def job_state_fields(state: JobState) -> JobStateFields:
    """``state`` and ``job_state`` of a Job, CancelJobResponse, RequeueJobResponse,
    ExplainJobResponse or HistoryJob."""
    return {"state": str(state), "job_state": _JOB.to_wire[state]}


def attempt_state_fields(state: AttemptState) -> AttemptStateFields:
    """``state`` and ``attempt_state`` of a HistoryAttempt."""
    return {"state": str(state), "attempt_state": _ATTEMPT.to_wire[state]}


def member_state_fields(state: MemberState) -> MemberStateFields:
    """``state`` and ``member_state`` of a Member."""
    return {"state": str(state), "member_state": _MEMBER.to_wire[state]}


def node_status_fields(status: NodeStatus) -> NodeStatusFields:
    """``status`` and ``node_status`` of a Node, a NodeStatusResponse or a
    RegisterNodeResponse."""
    return {"status": str(status), "node_status": _NODE.to_wire[status]}


def lease_status_fields(status: NodeStatus) -> LeaseStatusFields:
    """``node_status_name`` and ``node_status`` of a HeartbeatResponse or LeaderMessage."""
    return {"node_status_name": str(status), "node_status": _NODE.to_wire[status]}


def replica_role_fields(role: ReplicaRole | None) -> ReplicaRoleFields:
    """``role`` and ``replica_role`` of a ReplicaStatus (``None``: a role the Raft
    library did not name, sent as unset)."""
    if role is None:
        return {"role": "unknown", "replica_role": pb.REPLICA_ROLE_UNSPECIFIED}
    return {"role": str(role), "replica_role": _REPLICA.to_wire[role]}


def replica_role_of(raft_role: str) -> ReplicaRole | None:
    """The role a Raft status names (``leader``, ``follower``, ``candidate``), or None."""
    try:
        return ReplicaRole(raft_role)
    except ValueError:
        return None


def user_role_fields(role: Role) -> UserRoleFields:
    """``role`` and ``user_role`` of a TokenInfo or a CreateTokenRequest."""
    return {"role": str(role), "user_role": _USER.to_wire[role]}


def job_state_filter(wanted: Iterable[JobState]) -> JobStateFilter:
    """``states`` and ``job_states`` of a ListJobsRequest."""
    chosen = list(wanted)
    return {"states": [str(s) for s in chosen], "job_states": [_JOB.to_wire[s] for s in chosen]}


# ------------------------------------------------------------------------- reading


def job_state(
    msg: pb.Job
    | pb.CancelJobResponse
    | pb.RequeueJobResponse
    | pb.ExplainJobResponse
    | pb.HistoryJob,
) -> JobState:
    return _JOB.read(msg.job_state, msg.state)


def attempt_state(msg: pb.HistoryAttempt) -> AttemptState:
    return _ATTEMPT.read(msg.attempt_state, msg.state)


def member_state(msg: pb.Member) -> MemberState:
    return _MEMBER.read(msg.member_state, msg.state)


def node_status(msg: pb.Node | pb.NodeStatusResponse | pb.RegisterNodeResponse) -> NodeStatus:
    return _NODE.read(msg.node_status, msg.status)


def lease_status(msg: pb.HeartbeatResponse | pb.LeaderMessage) -> NodeStatus:
    """The node's status as a heartbeat's answer gives it (``DEAD``: register again)."""
    return _NODE.read(msg.node_status, msg.node_status_name)


def replica_role(msg: pb.ReplicaStatus) -> ReplicaRole | None:
    """The replica's role, or None when it named none this release knows."""
    if msg.replica_role:
        return _REPLICA.read(msg.replica_role, "")
    return replica_role_of(msg.role)


def shown_job_state(
    msg: pb.Job
    | pb.CancelJobResponse
    | pb.RequeueJobResponse
    | pb.ExplainJobResponse
    | pb.HistoryJob,
) -> str:
    """The job's state for display: never raises on an answer this release cannot read."""
    return _JOB.shown(msg.job_state, msg.state)


def shown_member_state(msg: pb.Member) -> str:
    return _MEMBER.shown(msg.member_state, msg.state)


def shown_attempt_state(msg: pb.HistoryAttempt) -> str:
    return _ATTEMPT.shown(msg.attempt_state, msg.state)


def shown_node_status(msg: pb.Node | pb.NodeStatusResponse | pb.RegisterNodeResponse) -> str:
    return _NODE.shown(msg.node_status, msg.status)


def shown_replica_role(msg: pb.ReplicaStatus) -> str:
    return _REPLICA.shown(msg.replica_role, msg.role)


def shown_user_role(msg: pb.TokenInfo) -> str:
    return _USER.shown(msg.user_role, msg.role)


def user_role(msg: pb.TokenInfo) -> Role:
    return _USER.read(msg.user_role, msg.role)


def requested_user_role(msg: pb.CreateTokenRequest) -> str:
    """The role a CreateTokenRequest asks for, as text for the rule set to check: the
    typed field when set, else the text (an earlier client, or an unknown role)."""
    if msg.user_role:
        return str(_USER.read(msg.user_role, ""))
    return msg.role


def job_state_filter_of(msg: pb.ListJobsRequest) -> list[str]:
    """The states a ListJobsRequest filters on, as text for the rule set to check (the
    typed ones and any text an earlier client sent), without repeats, in order."""
    wanted = []
    for number in msg.job_states:
        known = _JOB.from_wire.get(number)
        wanted.append(str(known) if known is not None else f"job state number {number}")
    for text in msg.states:
        if text not in wanted:
            wanted.append(text)
    return wanted
