"""The dashboard's sessions: the browsers signed in to this replica.

A browser signs in once with an API token; the dashboard keeps the token in a
:class:`Session` in this replica's memory and gives the browser only the session's random
id (in a cookie). A session ends at sign-out, after :data:`SESSION_IDLE_MS` without a
request, at the latest :data:`SESSION_TTL_MS` after sign-in, when the API refuses its
token (revoked, expired), or when the replica restarts; sessions are this replica's own.
"""

from __future__ import annotations

import secrets
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from synapse_ha.core.identity.access import split_token

SESSION_TTL_MS = 8 * 3_600_000  # from sign-in, however active
SESSION_IDLE_MS = 30 * 60_000  # without a request
MAX_SESSIONS = 4096  # on this replica; the least recently used goes first
MAX_SESSIONS_PER_TOKEN = 16  # one credential cannot push out everyone else's sessions


def token_label(token: str) -> str:
    """How the pages name the viewer of ``token``: its id, never its secret."""
    parsed = split_token(token)
    return f"token {parsed[0]}" if parsed else "anonymous"


@dataclass(slots=True)
class Session:
    session_id: str  # the cookie's value: random, never derived from the token
    token: str
    csrf: str  # the sign-out form's value
    created_ms: int
    seen_ms: int

    @property
    def label(self) -> str:
        return token_label(self.token)


@dataclass(frozen=True, slots=True)
class SessionLimits:
    """How long a session lives (``ttl_ms`` from sign-in, ``idle_ms`` without a
    request) and how many live at once (``max_sessions`` on the replica, ``per_token``
    of one token)."""

    ttl_ms: int = SESSION_TTL_MS
    idle_ms: int = SESSION_IDLE_MS
    max_sessions: int = MAX_SESSIONS
    per_token: int = MAX_SESSIONS_PER_TOKEN


DEFAULT_LIMITS = SessionLimits()


class Sessions:
    """Signed-in browsers on this replica: a random id (the cookie) → the viewer's token.

    A session ends at :meth:`close` (sign-out), :meth:`close_token` (the API refused the
    token), ``limits.idle_ms`` after its last request, or ``limits.ttl_ms`` after it was
    opened, by ``clock_ms``. At most ``limits.max_sessions`` live (opening one more
    closes the least recently used) and at most ``limits.per_token`` per token (opening
    one more closes that token's oldest), so one credential signing in again and again
    cannot push out the sessions of others. Thread-safe."""

    def __init__(self, clock_ms: Callable[[], int], limits: SessionLimits = DEFAULT_LIMITS) -> None:
        self._clock_ms = clock_ms
        self.limits = limits
        self._lock = threading.Lock()
        self._sessions: OrderedDict[str, Session] = OrderedDict()  # least recently used first

    def __len__(self) -> int:
        with self._lock:
            return len(self._sessions)

    def open(self, token: str) -> Session:
        now = self._clock_ms()
        session = Session(secrets.token_urlsafe(32), token, secrets.token_urlsafe(32), now, now)
        with self._lock:
            same = [s for s in self._sessions.values() if s.token == token]
            for old in sorted(same, key=lambda s: s.created_ms)[
                : max(0, len(same) - self.limits.per_token + 1)
            ]:
                del self._sessions[old.session_id]
            while len(self._sessions) >= self.limits.max_sessions:
                self._sessions.popitem(last=False)
            self._sessions[session.session_id] = session
        return session

    def get(self, session_id: str) -> Session | None:
        """The live session with this id (its idle clock restarts), else None; an
        expired one is closed."""
        now = self._clock_ms()
        with self._lock:
            session = self._sessions.get(session_id)
            if session is None:
                return None
            limits = self.limits
            if now - session.seen_ms >= limits.idle_ms or now - session.created_ms >= limits.ttl_ms:
                del self._sessions[session_id]
                return None
            session.seen_ms = now
            self._sessions.move_to_end(session_id)
            return session

    def close(self, session_id: str) -> Session | None:
        with self._lock:
            return self._sessions.pop(session_id, None)

    def close_token(self, token: str) -> int:
        """Close every session of ``token``; how many there were."""
        with self._lock:
            gone = [sid for sid, s in self._sessions.items() if s.token == token]
            for sid in gone:
                del self._sessions[sid]
        return len(gone)

    def holds(self, token: str) -> bool:
        with self._lock:
            return any(s.token == token for s in self._sessions.values())
