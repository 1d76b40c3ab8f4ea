"""The leader's half of the format gate (core/codec/formats.py): while the cluster's format
floor is below what this release reads, ask every member replica which format it reads,
and once each one answers with this release's format, replicate ``RaiseFormat``.

A replica that does not answer, or answers with an older format, keeps the floor where it
is: commands that need the newer format are refused until it is upgraded (or removed from
the cluster), and the leader says which replicas it waits for in its log.
"""

from __future__ import annotations

import logging
import threading

from synapse_ha.core import commands as cmd
from synapse_ha.core.codec.formats import FORMAT
from synapse_ha.rpc.server.cluster import ask_replica
from synapse_ha.rpc.server.context import ReplicaContext

log = logging.getLogger(__name__)

CHECK_INTERVAL_S = 1.0  # how often a leader below the newest format asks again
PROPOSAL_TIMEOUT_S = 5.0


class FormatGate:
    """Raises the cluster's format floor once every replica reads :data:`FORMAT`."""

    def __init__(self, ctx: ReplicaContext) -> None:
        self.ctx = ctx
        self._waiting_for = ""  # what was last logged, so a wait is logged once

    def check(self) -> str:
        """One round; what it did, or "" when there was nothing to do."""
        ctx = self.ctx
        if not ctx.serving() or ctx.backend.snapshot().format_floor >= FORMAT:
            return ""
        ids: list[str] = []
        behind: list[str] = []
        for replica in ctx.replicas:
            ids.append(replica.replica_id)
            if replica.replica_id == ctx.self_id:
                continue
            status = ask_replica(replica, ctx.peer_channel)
            if status.format_version < FORMAT:
                said = status.error or f"reads format {status.format_version}"
                behind.append(f"{replica.replica_id} ({said})")
        if behind:
            waiting = f"format {FORMAT} waits for {', '.join(behind)}"
            if waiting != self._waiting_for:
                log.warning("%s: commands that need it are refused until then", waiting)
                self._waiting_for = waiting
            return waiting
        command = cmd.RaiseFormat(FORMAT, tuple(sorted(ids)), now_ms=ctx.clock_ms())
        result = ctx.backend.propose(command).result(timeout=PROPOSAL_TIMEOUT_S)
        self._waiting_for = ""
        log.info("cluster format: %s", result.message)
        return result.message

    def run(self, stopping: threading.Event) -> None:
        """Check every :data:`CHECK_INTERVAL_S` until ``stopping`` is set."""
        while not stopping.wait(CHECK_INTERVAL_S):
            try:
                self.check()
            except Exception:  # a lost proposal or a dropped peer: the next round retries
                log.exception("format gate check failed")
