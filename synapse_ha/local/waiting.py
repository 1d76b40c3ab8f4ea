"""Bounded readiness waits on started programs.

:func:`wait_until` polls a probe until it answers, fails at once with
:class:`~synapse_ha.local.process.ProcessExited` when a watched process dies, and raises
:class:`WaitTimeout` (with the watched processes' log tails) at the deadline.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

import grpc

from synapse_ha.client.cluster import ClusterUnavailable
from synapse_ha.local.process import LaunchError, Process, ProcessExited

T = TypeVar("T")

# What a readiness probe over gRPC may raise while a program is still starting.
RPC_ERRORS: tuple[type[BaseException], ...] = (grpc.RpcError, ClusterUnavailable, OSError)


class WaitTimeout(LaunchError):
    """A bounded wait for readiness ran out."""


def wait_until(
    what: str,
    probe: Callable[[], T | None],
    timeout_s: float,
    *,
    every_s: float = 0.1,
    watch: Sequence[Process] = (),
    retry_on: tuple[type[BaseException], ...] = (OSError,),
    abort: threading.Event | None = None,
) -> T:
    """Call ``probe`` until it returns something other than None or False; return that.

    Exceptions of the types in ``retry_on`` count as "not yet". Raises
    :class:`ProcessExited` as soon as a process in ``watch`` that is expected to run has
    exited, :class:`WaitTimeout` after ``timeout_s`` (naming ``what``, the last error and
    the end of the watched processes' logs), and :class:`LaunchError` when ``abort`` is set.
    """
    deadline = time.monotonic() + timeout_s
    last = ""
    while True:
        if abort is not None and abort.is_set():
            raise LaunchError(f"interrupted while waiting for {what}")
        for p in watch:
            if p.expect_running and p.process is not None and p.process.poll() is not None:
                raise ProcessExited(p)
        try:
            value = probe()
            if value is not None and value is not False:
                return value
        except retry_on as exc:
            last = (str(exc).splitlines() or [type(exc).__name__])[0][:300]
        if time.monotonic() >= deadline:
            break
        if abort is not None:
            abort.wait(every_s)
        else:
            time.sleep(every_s)
    tails = "".join(f"\n--- {p.log_path} ---\n{p.log_tail(1200)}" for p in watch)
    raise WaitTimeout(
        f"timed out after {timeout_s:g}s waiting for {what} (last error: {last or 'none'})" + tails
    )
