"""Machine-readable gRPC errors: one builder for the servers, one parser for the clients.

Every error a replica returns carries, besides its status code and sentence, a
``google.rpc.Status`` in the ``grpc-status-details-bin`` trailer (the ``grpcio-status``
convention) holding an ``ErrorInfo`` with ``domain="synapse.v1"``, a :class:`ErrorReason` and
string metadata; an ``INVALID_ARGUMENT`` also carries a ``BadRequest`` with one field
violation per broken rule. Clients branch on the reason and read the metadata (the
leader's address, the field), never on the sentence, which is for people.

The reasons are documented in ``docs/errors.md`` and in the header of
``protos/synapse/v1/control.proto``; the status code that goes with each is fixed by
:data:`STATUS_OF`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn

import grpc
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

from synapse_ha.core.spec.validation import Violation, ViolationCode
from synapse_ha.service.refusal import ErrorReason, Refusal

__all__ = ["ErrorReason", "Reason"]  # the use cases' reasons; clients read them from here

# The same enum under the name the client library, the CLI and the dashboard import.
Reason = ErrorReason

DOMAIN = "synapse.v1"
# Kept for clients that predate ErrorInfo; the reason's metadata is what clients read.
LEADER_METADATA_KEY = "synapse-leader"


STATUS_OF: Mapping[ErrorReason, grpc.StatusCode] = {
    ErrorReason.NOT_LEADER: grpc.StatusCode.FAILED_PRECONDITION,
    ErrorReason.LEADER_NOT_READY: grpc.StatusCode.UNAVAILABLE,
    ErrorReason.NO_LEADER: grpc.StatusCode.UNAVAILABLE,
    ErrorReason.INVALID_FIELD: grpc.StatusCode.INVALID_ARGUMENT,
    ErrorReason.JOB_NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    ErrorReason.NODE_NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    ErrorReason.CONFLICT: grpc.StatusCode.FAILED_PRECONDITION,
    ErrorReason.OUTCOME_UNKNOWN: grpc.StatusCode.DEADLINE_EXCEEDED,
    ErrorReason.NOT_COMMITTED: grpc.StatusCode.UNAVAILABLE,
    ErrorReason.INTERNAL: grpc.StatusCode.INTERNAL,
    ErrorReason.OVERLOADED: grpc.StatusCode.RESOURCE_EXHAUSTED,
    ErrorReason.UNAUTHENTICATED: grpc.StatusCode.UNAUTHENTICATED,
    ErrorReason.PERMISSION_DENIED: grpc.StatusCode.PERMISSION_DENIED,
    ErrorReason.TOKEN_NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    ErrorReason.NEEDS_TLS: grpc.StatusCode.FAILED_PRECONDITION,
    ErrorReason.CHANGE_IN_FLIGHT: grpc.StatusCode.FAILED_PRECONDITION,
    ErrorReason.WOULD_LOSE_QUORUM: grpc.StatusCode.FAILED_PRECONDITION,
    ErrorReason.REPLICA_EXISTS: grpc.StatusCode.ALREADY_EXISTS,
    ErrorReason.REPLICA_NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    ErrorReason.LAST_REPLICA: grpc.StatusCode.FAILED_PRECONDITION,
    ErrorReason.LEADER_STEPPING_DOWN: grpc.StatusCode.UNAVAILABLE,
    ErrorReason.EVENTS_EXPIRED: grpc.StatusCode.OUT_OF_RANGE,
    ErrorReason.QUEUE_NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    ErrorReason.COHORT_NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    ErrorReason.LIMIT_EXCEEDED: grpc.StatusCode.RESOURCE_EXHAUSTED,
    ErrorReason.UNKNOWN: grpc.StatusCode.UNKNOWN,
}


# ----------------------------------------------------------------------- server side


@dataclass(frozen=True, slots=True)
class _Status(grpc.Status):
    code: grpc.StatusCode
    details: str
    trailing_metadata: tuple[tuple[str, str | bytes], ...]


def build_status(
    reason: ErrorReason,
    message: str,
    metadata: Mapping[str, str] | None = None,
    violations: Sequence[Violation] = (),
    trailing: Sequence[tuple[str, str]] = (),
) -> grpc.Status:
    """The status for ``reason``: its fixed code, ``message`` for people, and the
    ``ErrorInfo`` (plus a ``BadRequest`` when there are ``violations``) for programs.
    ``trailing`` adds plain trailing metadata (the legacy ``synapse-leader`` key)."""
    code = STATUS_OF[reason]
    status = status_pb2.Status(code=code.value[0], message=message)
    info = error_details_pb2.ErrorInfo(reason=str(reason), domain=DOMAIN)
    for key, value in sorted((metadata or {}).items()):
        info.metadata[key] = value
    status.details.add().Pack(info)
    if violations:
        bad = error_details_pb2.BadRequest()
        for v in violations:
            bad.field_violations.add(field=v.field, description=v.rule, reason=v.code.upper())
        status.details.add().Pack(bad)
    base: Any = rpc_status.to_status(status)
    return _Status(
        code=base.code, details=base.details, trailing_metadata=(*base.trailing_metadata, *trailing)
    )


_DETAILS_KEY = "grpc-status-details-bin"  # the rich status (google.rpc.Status) it carries


def for_item(status: grpc.Status, index: int) -> grpc.Status:
    """``status`` as the refusal of the ``index``-th item of a call that carries many
    (``SubmitJobs``): its message begins ``jobs[index]:`` and the fields it names begin
    ``jobs[index].`` (in the BadRequest and the ErrorInfo's ``field``)."""
    prefix = f"jobs[{index}]"
    trailing = []
    for key, value in status.trailing_metadata:
        if key == _DETAILS_KEY and isinstance(value, bytes):
            full = status_pb2.Status.FromString(value)
            full.message = f"{prefix}: {full.message}"
            for detail in full.details:
                if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
                    info = error_details_pb2.ErrorInfo()
                    detail.Unpack(info)
                    if "field" in info.metadata:
                        info.metadata["field"] = f"{prefix}.{info.metadata['field']}"
                    detail.Pack(info)
                elif detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
                    bad = error_details_pb2.BadRequest()
                    detail.Unpack(bad)
                    for v in bad.field_violations:
                        v.field = f"{prefix}.{v.field}"
                    detail.Pack(bad)
            value = full.SerializeToString()
        trailing.append((key, value))
    return _Status(
        code=status.code,
        details=f"{prefix}: {status.details}",
        trailing_metadata=tuple(trailing),
    )


def abort(
    context: grpc.ServicerContext,
    reason: ErrorReason,
    message: str,
    metadata: Mapping[str, str] | None = None,
    violations: Sequence[Violation] = (),
    trailing: Sequence[tuple[str, str]] = (),
) -> NoReturn:
    """End the call with :func:`build_status` (``context.abort_with_status`` raises)."""
    context.abort_with_status(build_status(reason, message, metadata, violations, trailing))
    raise AssertionError("unreachable")  # abort_with_status raises


def abort_invalid(context: grpc.ServicerContext, violations: Sequence[Violation]) -> NoReturn:
    """INVALID_FIELD for a non-empty list of violations; the first names the field in the
    metadata and the message, the BadRequest lists them all."""
    first = violations[0]
    message = "; ".join(str(v) for v in violations)
    metadata = {"field": first.field, "rule": first.rule, "violation": str(first.code)}
    abort(context, ErrorReason.INVALID_FIELD, message, metadata, violations)


def refusal_metadata(refusal: Refusal) -> dict[str, str]:
    """The ErrorInfo metadata of a use case's refusal: its own, and the field at fault
    (with the first broken rule, when it names its violations)."""
    metadata = dict(refusal.metadata)
    if refusal.violations:
        first = refusal.violations[0]
        metadata.update(field=first.field, rule=first.rule, violation=str(first.code))
    elif refusal.field:
        metadata["field"] = refusal.field
    return metadata


def refusal_status(refusal: Refusal, extra: Mapping[str, str] | None = None) -> grpc.Status:
    """The one wire error of a use case's :class:`Refusal` (plus ``extra`` metadata,
    such as the method a transport served); a NOT_LEADER naming the leader's address
    also carries it in the legacy trailing key."""
    metadata = refusal_metadata(refusal)
    if extra:
        metadata.update(extra)
    trailing: tuple[tuple[str, str], ...] = ()
    if refusal.code is ErrorReason.NOT_LEADER and metadata.get("leader_address"):
        trailing = ((LEADER_METADATA_KEY, metadata["leader_address"]),)
    return build_status(refusal.code, refusal.words, metadata, refusal.violations, trailing)


# ----------------------------------------------------------------------- client side


@dataclass(frozen=True, slots=True)
class RpcFailure:
    """A failed call, as a value: ``reason`` from the ErrorInfo (``UNKNOWN`` when the
    answer had none, for example a transport error), its metadata, and the field
    violations of a BadRequest."""

    code: grpc.StatusCode
    reason: ErrorReason
    message: str
    metadata: Mapping[str, str] = field(default_factory=dict)
    violations: tuple[Violation, ...] = ()

    @property
    def field(self) -> str:
        """The (first) offending field of an INVALID_FIELD, else empty."""
        if self.violations:
            return self.violations[0].field
        return self.metadata.get("field", "")

    @property
    def rule(self) -> str:
        if self.violations:
            return self.violations[0].rule
        return self.metadata.get("rule", "")

    def describe(self) -> str:
        """``CODE: message`` for people (logs, a list of attempts)."""
        return f"{self.reason if self.reason is not ErrorReason.UNKNOWN else self.code.name}: " + (
            self.message
        )


def failure_of(exc: grpc.RpcError) -> RpcFailure:
    """Read the code, reason, metadata and violations of a failed call. Never raises:
    an error without (or with unreadable) details gives ``ErrorReason.UNKNOWN``."""
    code_of: Any = getattr(exc, "code", None)
    details_of: Any = getattr(exc, "details", None)
    code = code_of() if callable(code_of) else None
    message = details_of() if callable(details_of) else None
    failure = RpcFailure(
        code=code if isinstance(code, grpc.StatusCode) else grpc.StatusCode.UNKNOWN,
        reason=ErrorReason.UNKNOWN,
        message=message if isinstance(message, str) else str(exc),
    )
    call: Any = exc  # a grpc.Call at run time (a test's stand-in need only have its methods)
    if not callable(getattr(call, "trailing_metadata", None)):
        return failure
    try:
        status: Any = rpc_status.from_call(call)
    except (AttributeError, TypeError, ValueError):
        return failure
    if status is None:
        return failure
    reason = ErrorReason.UNKNOWN
    metadata: dict[str, str] = {}
    violations: list[Violation] = []
    for detail in status.details:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            if info.domain != DOMAIN:
                continue
            try:
                reason = ErrorReason(info.reason)
            except ValueError:
                reason = ErrorReason.UNKNOWN
            metadata = dict(info.metadata)
        elif detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            bad = error_details_pb2.BadRequest()
            detail.Unpack(bad)
            for fv in bad.field_violations:
                try:
                    violation_code = ViolationCode(fv.reason.lower())
                except ValueError:
                    violation_code = ViolationCode.INVALID_FIELD
                violations.append(Violation(violation_code, fv.field, fv.description))
    return RpcFailure(
        code=failure.code,
        reason=reason,
        message=failure.message,
        metadata=metadata,
        violations=tuple(violations),
    )
