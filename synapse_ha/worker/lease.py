"""The node's lease: the self-fencing rule of DESIGN §4, against an injectable clock.

A heartbeat reply from a leader renews the lease until ``sent_at + lease_ttl`` where
``sent_at`` is when the *request* left (the leader heard us no earlier than that, so the
worker's deadline never ends later than the leader believes). Once the deadline passes the
worker is fenced: it kills every member and starts nothing until a reply to a request
sent after the fencing arrives.

The deadline is also written to a lease file as a ``CLOCK_MONOTONIC`` time for the
per-member supervisors (:mod:`synapse_ha.worker.shim`), which kill their member on their
own when it passes, so a dead or frozen agent cannot keep members alive.
"""

from __future__ import annotations

import contextlib
import enum
import os
from collections.abc import Callable
from pathlib import Path


class LeaseState(enum.StrEnum):
    NEVER_HELD = "never-held"  # not acknowledged since the agent started
    HELD = "held"
    FENCED = "fenced"  # expired; members were killed; waiting for a reply


class Lease:
    """Not thread-safe; the agent loop owns it. ``clock`` returns monotonic seconds."""

    def __init__(self, ttl_s: float, clock: Callable[[], float]) -> None:
        if ttl_s <= 0:
            raise ValueError("lease ttl must be positive")
        self.ttl_s = ttl_s
        self.clock = clock
        self.valid_until = 0.0
        self.state = LeaseState.NEVER_HELD
        self.fenced_at = 0.0

    def renew(self, sent_at: float, ttl_s: float | None = None) -> bool:
        """A leader answered a request sent at ``sent_at``. Returns whether the lease is
        now held (a reply to a request older than the fencing does not lift it)."""
        if ttl_s is not None and ttl_s > 0:
            self.ttl_s = ttl_s
        if self.state is LeaseState.FENCED and sent_at < self.fenced_at:
            return False
        until = sent_at + self.ttl_s
        if until <= self.clock():
            return self.state is LeaseState.HELD
        self.valid_until = max(self.valid_until, until)
        self.state = LeaseState.HELD
        return True

    def held(self) -> bool:
        return self.state is LeaseState.HELD and self.clock() < self.valid_until

    def must_fence(self) -> bool:
        """True once when a held lease has run out: the caller then kills every member
        and calls :meth:`fence`."""
        return self.state is LeaseState.HELD and self.clock() >= self.valid_until

    def fence(self) -> None:
        self.state = LeaseState.FENCED
        self.fenced_at = self.clock()
        self.valid_until = 0.0

    def remaining_s(self) -> float:
        return max(0.0, self.valid_until - self.clock()) if self.held() else 0.0


class LeaseFile:
    """The lease deadline in ``CLOCK_MONOTONIC`` seconds, replaced atomically."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._written: float | None = None

    def write(self, deadline_monotonic: float) -> None:
        if deadline_monotonic == self._written:
            return
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        # Readable by every supervisor, written by the agent alone, never through a link.
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        with open(fd, "w", encoding="ascii") as f:
            f.write(f"{deadline_monotonic:.6f}\n")
        os.replace(tmp, self.path)
        self._written = deadline_monotonic

    def revoke(self) -> None:
        self.write(0.0)
