"""Why a use case said no: one :class:`Refusal` (a :class:`ErrorReason`, the field at fault
and a sentence for people), whatever the transport that maps it to its wire error."""

from __future__ import annotations

import dataclasses
import enum
import types
from collections.abc import Mapping, Sequence

from synapse_ha.core.identity import access
from synapse_ha.core.spec.validation import Violation, ViolationCode


class ErrorReason(enum.StrEnum):
    """Why a call failed (``ErrorInfo.reason`` on the wire). Stable: values are only
    ever added."""

    NOT_LEADER = "NOT_LEADER"  # this replica follows; metadata leader_id, leader_address
    LEADER_NOT_READY = "LEADER_NOT_READY"  # just elected; its term barrier is not committed
    NO_LEADER = "NO_LEADER"  # no leader is known (election under way, or no quorum)
    INVALID_FIELD = "INVALID_FIELD"  # a request field breaks a rule; metadata field, rule
    JOB_NOT_FOUND = "JOB_NOT_FOUND"  # metadata job_id
    NODE_NOT_FOUND = "NODE_NOT_FOUND"  # metadata node_id (a heartbeat: register first)
    CONFLICT = "CONFLICT"  # valid, but not in the current state (finished job, dead node)
    OUTCOME_UNKNOWN = "OUTCOME_UNKNOWN"  # a write was not confirmed in time; retry is safe
    NOT_COMMITTED = "NOT_COMMITTED"  # a write was refused before commit; retry
    INTERNAL = "INTERNAL"  # a bug in the replica
    OVERLOADED = "OVERLOADED"  # heavy reads are rationed on this replica; retry after a pause
    UNAUTHENTICATED = "UNAUTHENTICATED"  # no credential, or one refused; metadata method
    PERMISSION_DENIED = "PERMISSION_DENIED"  # the caller may not; metadata identity, method
    TOKEN_NOT_FOUND = "TOKEN_NOT_FOUND"  # metadata token_id
    NEEDS_TLS = "NEEDS_TLS"  # log grants are signed only when the cluster has TLS set up
    # Membership changes; metadata replica_id
    CHANGE_IN_FLIGHT = "CHANGE_IN_FLIGHT"  # another membership change is not committed yet
    WOULD_LOSE_QUORUM = "WOULD_LOSE_QUORUM"  # the change would leave too few live replicas
    REPLICA_EXISTS = "REPLICA_EXISTS"  # the id or an address is already a member's
    REPLICA_NOT_FOUND = "REPLICA_NOT_FOUND"  # no member with that id
    LAST_REPLICA = "LAST_REPLICA"  # the only replica cannot be removed
    LEADER_STEPPING_DOWN = "LEADER_STEPPING_DOWN"  # removing the leader: it hands over; retry
    EVENTS_EXPIRED = "EVENTS_EXPIRED"  # a since-index older than held; metadata oldest_index
    QUEUE_NOT_FOUND = "QUEUE_NOT_FOUND"  # metadata queue
    COHORT_NOT_FOUND = "COHORT_NOT_FOUND"  # metadata cohort
    # A per-identity limit (DESIGN §8); metadata limit, allowed, actual (retry_after_ms)
    LIMIT_EXCEEDED = "LIMIT_EXCEEDED"
    UNKNOWN = "UNKNOWN"  # client side only: no ErrorInfo of this domain, or a newer reason


_NO_METADATA: Mapping[str, str] = types.MappingProxyType({})


@dataclasses.dataclass(frozen=True, slots=True)
class Refusal:
    """A use case's no: ``code``, the request ``field`` at fault ("" for none) and
    ``words`` for people. ``metadata`` is what programs read besides the field (the
    leader's address, the limit's figures); ``violations`` every rule an invalid field
    breaks; ``denied`` the access policy's refusal this is, which the transport logs and
    counts with the refusals it makes itself."""

    code: ErrorReason
    words: str
    field: str = ""
    metadata: Mapping[str, str] = dataclasses.field(default_factory=lambda: _NO_METADATA)
    violations: tuple[Violation, ...] = ()
    denied: access.AccessRefusal | None = None


def invalid(violations: Sequence[Violation]) -> Refusal:
    """INVALID_FIELD for a non-empty list of broken rules; the first names the field."""
    first = violations[0]
    return Refusal(
        ErrorReason.INVALID_FIELD,
        "; ".join(str(v) for v in violations),
        first.field,
        violations=tuple(violations),
    )


def required(field_name: str) -> Refusal:
    return invalid([Violation(ViolationCode.REQUIRED, field_name, "is required")])


def node_not_found(node_id: str) -> Refusal:
    return Refusal(
        ErrorReason.NODE_NOT_FOUND,
        f"node {node_id!r} is not registered; call RegisterNode",
        metadata={"node_id": node_id},
    )


_DENIED_REASON = {
    access.AccessRefusalCode.UNAUTHENTICATED: ErrorReason.UNAUTHENTICATED,
    access.AccessRefusalCode.PERMISSION_DENIED: ErrorReason.PERMISSION_DENIED,
}


def denied(refusal: access.AccessRefusal, identity: access.Identity | None) -> Refusal:
    """The access policy's ``refusal`` of ``identity`` (metadata ``identity``)."""
    metadata = {"identity": str(identity)} if identity is not None else {}
    return Refusal(_DENIED_REASON[refusal.code], refusal.message, metadata=metadata, denied=refusal)
