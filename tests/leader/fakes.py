"""Fakes for the leader loop: a replicated log that applies commands in process."""

from __future__ import annotations

from concurrent.futures import Future

from synapse_ha.core import commands as cmd
from synapse_ha.core.machine import apply
from synapse_ha.core.model import ClusterState
from synapse_ha.core.snapshot import full_copy
from synapse_ha.leader.ports import ProposalError


class FakeLog:
    """Applies proposals to a real state. With ``hold`` set, proposals wait in
    ``pending`` until the test commits or fails them."""

    def __init__(self, state: ClusterState | None = None) -> None:
        self.state = state or ClusterState()
        self.proposed: list[cmd.Command] = []
        self.pending: list[tuple[cmd.Command, Future[cmd.Result]]] = []
        self.hold = False

    def snapshot(self) -> ClusterState:
        """A copy, as the replica's snapshots are: the loop must never see later applies
        through it, nor change the state it plans on."""
        return full_copy(self.state)

    def propose(self, command: cmd.Command) -> Future[cmd.Result]:
        self.proposed.append(command)
        future: Future[cmd.Result] = Future()
        if self.hold:
            self.pending.append((command, future))
        else:
            future.set_result(apply(self.state, command))
        return future

    def commit_pending(self) -> None:
        pending, self.pending = self.pending, []
        for command, future in pending:
            future.set_result(apply(self.state, command))

    def fail_pending(self) -> None:
        pending, self.pending = self.pending, []
        for _, future in pending:
            future.set_exception(ProposalError("leader changed", committed_unknown=True))

    def of_type(self, kind: type) -> list[cmd.Command]:
        return [c for c in self.proposed if isinstance(c, kind)]
