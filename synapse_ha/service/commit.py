"""Waiting for proposed commands, and what their outcome means for the caller: the one
mapping of a proposal that timed out or failed, or of an error result, to a
:class:`Refusal`, for the threads of the unary servicers and for the event loop of the
heartbeat streams."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence
from concurrent import futures

from synapse_ha.core import commands as cmd
from synapse_ha.leader.ports import ProposalError
from synapse_ha.service.refusal import ErrorReason, Refusal

# The reason for each error result of ``apply``; NOT_FOUND depends on what was looked up.
_RESULT_REASON = {
    cmd.ResultCode.INVALID: ErrorReason.INVALID_FIELD,
    cmd.ResultCode.CONFLICT: ErrorReason.CONFLICT,
    cmd.ResultCode.INTERNAL: ErrorReason.INTERNAL,
}


def failed(exc: TimeoutError | ProposalError) -> Refusal:
    """A proposal that did not commit in time, or produced no result."""
    if isinstance(exc, ProposalError):
        if exc.committed_unknown:
            return Refusal(
                ErrorReason.OUTCOME_UNKNOWN,
                f"the outcome is unknown ({exc}); retrying with the same request is safe",
            )
        return Refusal(ErrorReason.NOT_COMMITTED, f"not committed: {exc}; retry")
    return Refusal(
        ErrorReason.OUTCOME_UNKNOWN,
        "the outcome is unknown (not committed within the deadline); "
        "retrying with the same request is safe",
    )


def refused(result: cmd.Result, not_found: Refusal) -> Refusal | None:
    """None for an OK result; else its refusal (``not_found`` for a NOT_FOUND one,
    which depends on what was looked up)."""
    if result.ok:
        return None
    if result.code is cmd.ResultCode.NOT_FOUND:
        return Refusal(not_found.code, result.message, not_found.field, not_found.metadata)
    return Refusal(_RESULT_REASON.get(result.code, ErrorReason.INTERNAL), result.message)


def committed(
    proposed: Sequence[futures.Future[cmd.Result]], timeout_s: float
) -> list[cmd.Result] | Refusal:
    """The results of ``proposed``, in order, each committed within ``timeout_s`` of
    now; the refusal of the first that is not."""
    deadline = time.monotonic() + timeout_s
    results = []
    for future in proposed:
        try:
            results.append(future.result(timeout=max(0.0, deadline - time.monotonic())))
        except (TimeoutError, ProposalError) as exc:
            return failed(exc)
    return results


def _verdict(
    future: futures.Future[cmd.Result], timeout_s: float, not_found: Refusal
) -> Refusal | None:
    """The refusal of ``future``'s outcome (None: committed OK), waiting ``timeout_s`` at
    most for it."""
    try:
        result = future.result(timeout=timeout_s)
    except (TimeoutError, ProposalError) as exc:
        return failed(exc)
    return refused(result, not_found)


def settle(
    proposed: Sequence[futures.Future[cmd.Result]], deadline: float, not_found: Refusal
) -> Refusal | None:
    """Wait (until the monotonic ``deadline``) for ``proposed`` to commit OK; the first
    refusal, if any."""
    for future in proposed:
        refusal = _verdict(future, max(0.0, deadline - time.monotonic()), not_found)
        if refusal is not None:
            return refusal
    return None


async def settled(
    proposed: Sequence[futures.Future[cmd.Result]], timeout_s: float, not_found: Refusal
) -> Refusal | None:
    """:func:`settle`, awaited on an event loop (which it never blocks): each proposal
    is awaited until the deadline (never cancelled), then its outcome read without
    waiting."""
    deadline = time.monotonic() + timeout_s
    for future in proposed:
        waiting = asyncio.wrap_future(future)
        with contextlib.suppress(TimeoutError, ProposalError):  # read just below
            await asyncio.wait_for(asyncio.shield(waiting), max(0.0, deadline - time.monotonic()))
        if not waiting.done():
            # Its outcome comes after the deadline: read it then, or the event loop logs
            # a proposal that fails late as an exception never retrieved.
            waiting.add_done_callback(_read_late)
        refusal = _verdict(future, 0.0, not_found)
        if refusal is not None:
            return refusal
    return None


def _read_late(waiting: asyncio.Future[cmd.Result]) -> None:
    if not waiting.cancelled():
        waiting.exception()
