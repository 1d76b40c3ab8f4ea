"""Who is calling, checked before every RPC a replica serves (DESIGN §8).

:class:`AuthInterceptor` wraps every handler. Before the handler runs it names the caller:

1. a bearer token in the metadata (``authorization: Bearer syn_<token_id>_<secret>``) is
   looked up by id in the replica's snapshot of the replicated tokens, and the SHA-256 of
   its secret compared in constant time with the stored hash; a token that is unknown,
   wrong, revoked or expired (by this replica's clock) is refused, with no fallback to
   another credential;
2. otherwise the transport's peer identity (``identify_peer``: the client certificate's
   SPIFFE name, provided by the TLS layer);
3. otherwise nobody: ``UNAUTHENTICATED``.

Then :func:`synapse_ha.core.identity.access.authorize` judges the method. A refusal ends the call
with ``UNAUTHENTICATED`` / ``PERMISSION_DENIED`` (typed reasons, metadata ``identity`` and
``method``), is logged on ``synapse_ha.audit`` at WARNING with the identity tried, and is
counted by (reason, method). An accepted call reaches its handler, which reads the
identity with :func:`caller`; one whose bytes are not a message of its method is refused
first, as an invalid ``request`` (``INVALID_FIELD``), so a malformed call never meets a
handler and is never taken for a bug of the replica.

``insecure=True`` is the explicit, logged opt-out: every caller is the anonymous admin.

Token texts are made here (:func:`new_token`), never in the core: the replicated command
carries only the hash.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import grpc

from synapse_ha.core import commands as cmd
from synapse_ha.core.identity import access
from synapse_ha.core.identity.access import AccessRefusal, AccessRefusalCode, Identity, Kind, Role
from synapse_ha.core.model import Token
from synapse_ha.core.spec.document import SpecError
from synapse_ha.rpc.errors import Reason, abort_invalid, build_status

audit = logging.getLogger("synapse_ha.audit")

AUTHORIZATION_KEY = "authorization"
BEARER = "Bearer "
ANONYMOUS = Identity(Kind.USER, "anonymous", Role.ADMIN)

PeerIdentity = Callable[[grpc.ServicerContext], Identity | None]

_REASON_OF = {
    AccessRefusalCode.UNAUTHENTICATED: Reason.UNAUTHENTICATED,
    AccessRefusalCode.PERMISSION_DENIED: Reason.PERMISSION_DENIED,
}


# ------------------------------------------------------------------------- tokens


def token_hash(secret: str) -> str:
    """The hex SHA-256 of a token's secret: what the replicated state keeps."""
    return hashlib.sha256(secret.encode()).hexdigest()


def new_token(
    user: str,
    role: Role,
    queues: Iterable[str],
    ttl_ms: int,
    now_ms: int,
    created_by: str,
    priority_classes: Iterable[str] = (),
    max_priority: int = 0,
) -> tuple[str, cmd.CreateToken]:
    """A fresh token: its text (``syn_<12 hex id>_<secret of 32 random bytes>``), shown
    once, and the command that replicates its hash. ``ttl_ms`` 0 means it never expires.
    A replica bootstrapping the first admin token passes ``created_by="bootstrap"``.
    ``priority_classes`` and ``max_priority``: what it allows beyond a queue's own rules
    (:func:`synapse_ha.core.identity.admission.priority_refusal`)."""
    token_id = secrets.token_hex(6)
    secret = secrets.token_urlsafe(32)
    command = cmd.CreateToken(
        token_id=token_id,
        user=user,
        role=role,
        secret_sha256=token_hash(secret),
        queues=tuple(queues),
        expires_at_ms=now_ms + ttl_ms if ttl_ms > 0 else 0,
        now_ms=now_ms,
        actor=created_by,
        priority_classes=tuple(priority_classes),
        max_priority=max_priority,
    )
    return f"{access.TOKEN_PREFIX}{token_id}_{secret}", command


def identify_token(
    text: str, tokens: Mapping[str, Token], now_ms: int
) -> tuple[Identity | None, AccessRefusal | None]:
    """The user a token text proves, or why it proves nobody (UNAUTHENTICATED). The
    identity is returned alongside a refusal when the token was real but is no longer
    good (revoked, expired), so the refusal can be logged with who tried."""
    parts = access.split_token(text)
    if parts is None:
        return None, access.unauthenticated("the token is not of the form syn_<id>_<secret>")
    token_id, secret = parts
    token = tokens.get(token_id)
    if token is None or not hmac.compare_digest(token_hash(secret), token.secret_sha256):
        return None, access.unauthenticated(
            f"token {token_id} is not known to the cluster (or its secret is wrong)"
        )
    identity = access.user(token.user, token.role)
    if token.revoked_at_ms:
        return identity, access.unauthenticated(
            f"token {token_id} was revoked by {token.revoked_by or 'an admin'}; ask an "
            f"admin for a new one"
        )
    if not token.live_at(now_ms):
        return identity, access.unauthenticated(
            f"token {token_id} expired at {token.expires_at_ms} ms; ask an admin for a new one"
        )
    return identity, None


# ----------------------------------------------------------------------- the caller


class _CallerContext:
    """The servicer context of one call, carrying the identity the interceptor proved
    and the method's full path. Everything else is the wrapped context's."""

    __slots__ = ("_context", "synapse_identity", "synapse_method")

    def __init__(self, context: grpc.ServicerContext, identity: Identity, method: str) -> None:
        self._context = context
        self.synapse_identity = identity
        self.synapse_method = method

    def __getattr__(self, name: str) -> Any:
        return getattr(self._context, name)


def caller(context: grpc.ServicerContext) -> Identity:
    """The identity :class:`AuthInterceptor` proved for this call. A handler reached
    without it (a server built without the interceptor) refuses: it fails closed."""
    identity = getattr(context, "synapse_identity", None)
    if isinstance(identity, Identity):
        return identity
    context.abort_with_status(
        build_status(Reason.UNAUTHENTICATED, "this server checks no credentials; refused")
    )
    raise AssertionError("unreachable")


def method_of(context: grpc.ServicerContext) -> str:
    """The full method path of the call (as the interceptor saw it), or empty."""
    method = getattr(context, "synapse_method", "")
    return method if isinstance(method, str) else ""


def abort_refused(
    context: grpc.ServicerContext, refusal: AccessRefusal, identity: Identity | None, method: str
) -> Any:
    """End the call with ``refusal`` (metadata ``identity``, ``method``)."""
    metadata = {"method": access.short_method(method)}
    if identity is not None:
        metadata["identity"] = str(identity)
    context.abort_with_status(build_status(_REASON_OF[refusal.code], refusal.message, metadata))
    raise AssertionError("unreachable")


# ---------------------------------------------------------------------- interceptor


class AuthInterceptor(grpc.ServerInterceptor):  # type: ignore[type-arg]
    """Identifies and authorizes the caller of every RPC before its handler runs.

    ``tokens`` returns the replica's current tokens (a snapshot's ``tokens``; read per
    call, so a revocation counts from the moment it is applied here). ``clock_ms`` is the
    replica's wall clock, for expiry. ``identify_peer`` names the caller from the
    transport (a client certificate); None when there is no such transport.

    ``unverified_token``, when set, is called with the call's context before a well-formed
    token this replica does not know (or whose secret does not match) is refused: a
    replica behind the leader cannot tell a token it has not applied yet from a wrong
    one, so the hook ends the call with where to go (the server's leader routing) and
    returns only where the answer is final. Thread-safe."""

    def __init__(
        self,
        tokens: Callable[[], Mapping[str, Token]],
        clock_ms: Callable[[], int],
        identify_peer: PeerIdentity | None = None,
        *,
        insecure: bool = False,
    ) -> None:
        self._tokens = tokens
        self._clock_ms = clock_ms
        self._identify_peer = identify_peer
        self.insecure = insecure
        self.unverified_token: Callable[[grpc.ServicerContext], None] | None = None
        self._lock = threading.Lock()
        self._refusals: Counter[tuple[str, str]] = Counter()

    @classmethod
    def without_credentials(cls) -> AuthInterceptor:
        """Insecure mode: every caller is the anonymous admin (``--insecure`` only)."""
        return cls(dict, lambda: 0, insecure=True)

    def refusals(self) -> dict[tuple[str, str], int]:
        """Refusals so far, by (reason, method name)."""
        with self._lock:
            return dict(self._refusals)

    def identify(
        self, context: grpc.ServicerContext
    ) -> tuple[Identity | None, AccessRefusal | None]:
        """Who the caller is, or why nobody (see the module docstring for the order)."""
        if self.insecure:
            return ANONYMOUS, None
        presented = [
            value
            for key, value in context.invocation_metadata()
            if key == AUTHORIZATION_KEY and isinstance(value, str)
        ]
        if presented:
            value = presented[0]
            if not value.startswith(BEARER):
                return None, access.unauthenticated(
                    "the authorization metadata must be 'Bearer <token>'"
                )
            text = value[len(BEARER) :].strip()
            identity, refusal = identify_token(text, self._tokens(), self._clock_ms())
            if (
                identity is None
                and refusal is not None
                and self.unverified_token is not None
                and access.split_token(text) is not None
            ):
                self.unverified_token(context)
            return identity, refusal
        if self._identify_peer is not None:
            identity = self._identify_peer(context)
            if identity is not None:
                return identity, None
        return None, access.unauthenticated(access.NO_CREDENTIAL)

    def admit(self, context: grpc.ServicerContext, method: str) -> Identity:
        """The caller's identity when it may call ``method``; otherwise the call ends."""
        identity, refusal = self.identify(context)
        if refusal is None:
            refusal = access.authorize(identity, method)
        if refusal is None and identity is not None:
            return identity
        assert refusal is not None
        self.refused(refusal, identity, method)
        return abort_refused(context, refusal, identity, method)  # type: ignore[no-any-return]

    def refused(self, refusal: AccessRefusal, identity: Identity | None, method: str) -> None:
        """Log and count a refusal (also those a handler makes: another user's job)."""
        name = access.short_method(method)
        reason = _REASON_OF[refusal.code]
        with self._lock:
            self._refusals[(str(reason), name)] += 1
        audit.warning(
            "refused %s: %s calling %s: %s",
            reason,
            identity if identity is not None else "anonymous caller",
            name,
            refusal.message,
        )

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler[Any, Any] | None],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        handler = continuation(handler_call_details)
        if handler is None:
            return None
        method: str = handler_call_details.method
        return _guarded(handler, method, lambda context: self.admit(context, method))


def _guarded(
    handler: grpc.RpcMethodHandler[Any, Any],
    method: str,
    admit: Callable[[grpc.ServicerContext], Identity],
) -> grpc.RpcMethodHandler[Any, Any]:
    """``handler`` with ``admit`` run first; the behaviour gets the caller's context."""
    h: Any = handler

    def wrap(behaviour: Callable[[Any, Any], Any]) -> Callable[[Any, grpc.ServicerContext], Any]:
        def guarded(request: Any, context: grpc.ServicerContext) -> Any:
            identity = admit(context)
            if isinstance(request, _Undecodable):
                error = SpecError("request", f"is not a message of this method ({request.detail})")
                abort_invalid(context, error.violations)
            return behaviour(request, _CallerContext(context, identity, method))

        return guarded

    serializers = {
        "request_deserializer": _decoding(h.request_deserializer),
        "response_serializer": h.response_serializer,
    }
    if h.unary_unary is not None:
        return grpc.unary_unary_rpc_method_handler(wrap(h.unary_unary), **serializers)
    if h.unary_stream is not None:
        return grpc.unary_stream_rpc_method_handler(wrap(h.unary_stream), **serializers)
    if h.stream_unary is not None:
        return grpc.stream_unary_rpc_method_handler(wrap(h.stream_unary), **serializers)
    return grpc.stream_stream_rpc_method_handler(wrap(h.stream_stream), **serializers)


class _Undecodable:
    """A request whose bytes are not a message of the method's type."""

    __slots__ = ("detail",)

    def __init__(self, detail: str) -> None:
        self.detail = detail


def _decoding(deserializer: Callable[[bytes], Any] | None) -> Callable[[bytes], Any] | None:
    """``deserializer``, answering :class:`_Undecodable` instead of raising: the call is
    then refused as an invalid ``request`` once its caller is checked, rather than with
    the INTERNAL status gRPC gives a request it cannot decode."""
    if deserializer is None:
        return None
    decode = deserializer

    def decoding(data: bytes) -> Any:
        try:
            return decode(data)
        except Exception as exc:  # DecodeError, or a value the message type refuses
            return _Undecodable(f"{type(exc).__name__}: {exc}")

    return decoding
