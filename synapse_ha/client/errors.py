"""The failures the Python client raises (:mod:`synapse_ha.client.api`): each a
:class:`SynapseError` carrying the cluster's reason code, its subclasses naming the cases a
caller branches on."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, cast

import grpc

from synapse_ha.client.cluster import ClusterUnavailable
from synapse_ha.rpc.errors import Reason, failure_of

if TYPE_CHECKING:
    from synapse_ha.client.api import ArrayInfo, JobInfo


class SynapseError(Exception):
    """A call the cluster refused or could not answer. ``reason`` is the cluster's reason
    code (a :class:`~synapse_ha.rpc.errors.Reason` value such as ``"JOB_NOT_FOUND"``;
    ``"UNKNOWN"`` for an error without one), ``message`` the sentence for people."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason = reason
        self.message = message


class InvalidSpec(SynapseError):
    """A job spec breaks rules, found here or by the cluster. ``problems`` are every one,
    as ``(line, field, rule)`` in line order (the line None when unknown or the spec came
    from no file); the message has a line for each. ``field`` (the dotted path, such as
    ``resources.memory``), ``rule`` (what is allowed) and ``line`` are the first one's."""

    def __init__(
        self,
        field: str,
        rule: str,
        line: int | None = None,
        source: str = "",
        *,
        problems: Sequence[tuple[int | None, str, str]] = (),
    ) -> None:
        self.problems = list(problems) or [(line, field, rule)]

        def where(at: int | None) -> str:
            return f"{source}:{at}: " if source and at else (f"{source}: " if source else "")

        message = "\n".join(f"{where(at)}{name}: {text}" for at, name, text in self.problems)
        super().__init__(str(Reason.INVALID_FIELD), message)
        self.field, self.rule, self.line = self.problems[0][1], self.problems[0][2], line


class JobNotFound(SynapseError):
    """No job has this id (or the caller may not see it)."""

    def __init__(self, job_id: str, message: str) -> None:
        super().__init__(str(Reason.JOB_NOT_FOUND), message)
        self.job_id = job_id


class AccessDenied(SynapseError):
    """No credential, a refused one, or a caller who may not do this (``UNAUTHENTICATED``,
    ``PERMISSION_DENIED``)."""


class ClusterUnreachable(SynapseError):
    """No replica answered in time; ``attempts`` lists each address tried and what it
    answered."""

    def __init__(self, message: str, attempts: Sequence[tuple[str, str]]) -> None:
        super().__init__("UNAVAILABLE", message)
        self.attempts = list(attempts)


class WaitTimedOut(SynapseError, TimeoutError):
    """:meth:`Job.wait` (or :meth:`Array.wait`) gave up before the job (every task of the
    array) finished; ``info`` is its last state."""

    def __init__(self, info: JobInfo | ArrayInfo, timeout_s: float, what: str = "") -> None:
        said = what or f"job {info.id} still {cast('JobInfo', info).state}"
        super().__init__("TIMEOUT", f"{said} after {timeout_s:g}s")
        self.info = info


_DENIED = frozenset({Reason.UNAUTHENTICATED, Reason.PERMISSION_DENIED})


@contextlib.contextmanager
def translated(job_id: str = "") -> Iterator[None]:
    """Raise the cluster's failures as :class:`SynapseError` values."""
    try:
        yield
    except ClusterUnavailable as exc:
        raise ClusterUnreachable(str(exc), exc.attempts) from exc
    except grpc.RpcError as exc:
        failure = failure_of(exc)
        if failure.reason is Reason.INVALID_FIELD:
            raise InvalidSpec(
                failure.field,
                failure.rule or failure.message,
                problems=[(None, v.field, v.rule) for v in failure.violations],
            ) from exc
        if failure.reason is Reason.JOB_NOT_FOUND:
            raise JobNotFound(failure.metadata.get("job_id", job_id), failure.message) from exc
        if failure.reason in _DENIED or failure.code in (
            grpc.StatusCode.UNAUTHENTICATED,
            grpc.StatusCode.PERMISSION_DENIED,
        ):
            raise AccessDenied(str(failure.reason), failure.message) from exc
        reason = str(failure.reason) if failure.reason is not Reason.UNKNOWN else failure.code.name
        raise SynapseError(reason, failure.message) from exc
