"""The seams between the leader loops, the replicated log and the network adapters."""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future
from typing import Protocol

from synapse_ha.core import commands as cmd
from synapse_ha.core.model import ClusterState


class ProposalError(Exception):
    """A proposal that produced no result.

    ``committed_unknown`` is True when the command may or may not have been committed
    (retry only what is idempotent); False when it certainly was not.
    """

    def __init__(self, message: str, *, committed_unknown: bool) -> None:
        super().__init__(message)
        self.committed_unknown = committed_unknown


class StateReader(Protocol):
    def snapshot(self) -> ClusterState:
        """An immutable snapshot of the replica's local state as of the newest applied
        command, bought in O(changes) under the apply lock and read without it. The
        caller must never change it."""
        ...


class Proposer(Protocol):
    def propose(self, command: cmd.Command) -> Future[cmd.Result]:
        """Append a command to the replicated log.

        The future resolves with the result of applying it, or with
        :class:`ProposalError`; it may never resolve when leadership moves, so callers
        wait with a deadline and treat a timeout as an unknown outcome.
        """
        ...


class Nudger(Protocol):
    def nudge(self, targets: Sequence[tuple[str, str]]) -> None:
        """Ask each ``(node_id, address)`` worker to heartbeat now. A hint that must not
        block and never raises: a lost nudge costs one heartbeat interval, nothing more."""
        ...
