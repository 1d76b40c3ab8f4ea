"""What the client adds to every call of a channel: its bearer token, and its read
token (the newest applied index it saw, for follower reads: docs/consistency.md)."""

from __future__ import annotations

import threading
from typing import Any

import grpc


class _Details(grpc.ClientCallDetails):
    def __init__(self, base: Any, metadata: tuple[tuple[str, str | bytes], ...]) -> None:
        self.method = base.method
        self.timeout = base.timeout
        self.metadata = metadata
        self.credentials = base.credentials
        self.wait_for_ready = getattr(base, "wait_for_ready", None)
        self.compression = getattr(base, "compression", None)


class BearerToken(
    grpc.UnaryUnaryClientInterceptor,  # type: ignore[type-arg]
    grpc.UnaryStreamClientInterceptor,  # type: ignore[type-arg]
):
    """Adds ``authorization: Bearer <token>`` to every call of a channel."""

    def __init__(self, token: str) -> None:
        self._header = ("authorization", f"Bearer {token}")

    def _with_token(self, details: Any) -> _Details:
        metadata = tuple(m for m in (details.metadata or ()) if m[0] != "authorization")
        return _Details(details, (*metadata, self._header))

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._with_token(details), request)

    def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._with_token(details), request)


# The metadata of read tokens (synapse_ha.rpc.server.context, docs/consistency.md).
INDEX_KEY = "x-synapse-index"
MIN_INDEX_KEY = "x-synapse-min-index"


class ReadToken(grpc.UnaryUnaryClientInterceptor):  # type: ignore[type-arg]
    """Keeps the newest applied index the cluster's answers carried (``x-synapse-index``:
    a write's, or the state a read was served from) and, once ``send`` is set, sends it
    with every call (``x-synapse-min-index``): a follower then serves the call only from a
    state at least that new. Thread-safe; one per client."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.index = 0
        self.send = False

    def seen(self, index: int) -> None:
        with self._lock:
            self.index = max(self.index, index)

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        if self.send:
            metadata = tuple(m for m in (details.metadata or ()) if m[0] != MIN_INDEX_KEY)
            details = _Details(details, (*metadata, (MIN_INDEX_KEY, str(self.index))))
        outcome = continuation(details, request)
        # A call made with ``future`` returns before it completes: its index is read when
        # it does. Reading the trailing metadata now would wait for the answer, and so
        # make every call of a pipelining client wait for the one before.
        if outcome.done():
            self._read(outcome)
        else:
            outcome.add_done_callback(self._read)
        return outcome

    def _read(self, outcome: Any) -> None:
        """Keep the index a completed call's trailing metadata carries."""
        try:
            trailing = outcome.trailing_metadata() or ()
        except Exception:
            trailing = ()
        for key, value in trailing:
            if key == INDEX_KEY and isinstance(value, str) and value.isdigit():
                self.seen(int(value))
