"""The leader's proposals in flight: one proposal this term (:class:`InFlight`), and the
commands proposed at most once at a time per job (:func:`propose_per_job`)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from concurrent.futures import Future
from typing import TypeVar

from synapse_ha.core import commands as cmd


class InFlight:
    """One proposal this term. A proposal with no outcome after ``timeout_ms`` counts
    as settled with an unknown outcome (its callback may never come once leadership
    moved); the state machine re-verifies whatever is proposed next."""

    __slots__ = ("future", "since_ms", "timeout_ms")

    def __init__(self, future: Future[cmd.Result], since_ms: int, timeout_ms: int) -> None:
        self.future = future
        self.since_ms = since_ms
        self.timeout_ms = timeout_ms

    def settled(self, now_ms: int) -> bool:
        return self.future.done() or now_ms - self.since_ms >= self.timeout_ms

    def error(self) -> BaseException | None:
        if not self.future.done():
            return TimeoutError(f"no outcome within {self.timeout_ms} ms")
        return self.future.exception()

    def result(self) -> cmd.Result | None:
        return self.future.result() if self.future.done() and self.error() is None else None


# The commands proposed at most once at a time per job.
JobCommand = TypeVar("JobCommand", cmd.ExpireTimeLimit, cmd.ExpireDeadline, cmd.FailAttempt)


def propose_per_job(
    in_flight: dict[str, InFlight],
    due: Iterable[JobCommand],
    now_ms: int,
    start: Callable[[cmd.Command, int], InFlight],
    saying: Callable[[JobCommand], str],
) -> list[str]:
    """Propose (``start``) each of ``due`` whose job has no proposal of its kind
    ``in_flight`` (forgetting those settled first), and say so (``saying``)."""
    for job_id in list(in_flight):
        if in_flight[job_id].settled(now_ms):
            del in_flight[job_id]
    said: list[str] = []
    for command in due:
        if command.job_id in in_flight:
            continue
        in_flight[command.job_id] = start(command, now_ms)
        said.append(saying(command))
    return said
