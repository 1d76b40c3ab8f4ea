"""The failure of a call that no replica answered, and why each one could not.

gRPC reports a connection that never carried a call as ``UNAVAILABLE`` without a
reason of ours, with the transport's cause in its text: nothing listening (connection
refused), a name that does not resolve, a TLS handshake that failed (a server
certificate from another CA, a plaintext server), or a server that closed the connection
before the handshake ended (a TLS server asked in plaintext, or one that refused the
client's certificate). :func:`cause_of` reads which; these causes do not go away by
waiting, so a client that finds every replica in one of them gives up at once
(``fail_fast``, :class:`~synapse_ha.client.routing.Route`) instead of retrying until its
deadline. A replica that answers anything else (NO_LEADER, an election under way, a
slow answer) is waited for.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping

import grpc

from synapse_ha.client.credentials import CA_ENV, CERT_ENV, KEY_ENV
from synapse_ha.rpc.errors import Reason, RpcFailure


class Cause(enum.StrEnum):
    """Why a replica could not be reached, for people."""

    REFUSED = "connection refused (nothing listens there)"
    UNRESOLVED = "the host name does not resolve"
    UNTRUSTED = "TLS handshake failed: the server's certificate is not signed by the CA given"
    PLAINTEXT_SERVER = "TLS handshake failed: the server speaks plaintext"
    HANDSHAKE = "TLS handshake failed"
    CLOSED = "the server closed the connection before answering"


# Lower-case fragments of gRPC's error text (grpcio 1.85 and earlier), in order.
_SIGNS: tuple[tuple[Cause, tuple[str, ...]], ...] = (
    (Cause.REFUSED, ("connection refused",)),
    (Cause.UNRESOLVED, ("errors resolving", "dns resolution failed", "domain name not found")),
    (Cause.UNTRUSTED, ("certificate_verify_failed",)),
    (Cause.PLAINTEXT_SERVER, ("wrong_version_number",)),
    (Cause.HANDSHAKE, ("handshake failed", "ssl_error")),
    (Cause.CLOSED, ("socket closed", "connection reset")),
)

_TLS_VARIABLES = f"{CA_ENV}, {CERT_ENV}, {KEY_ENV}"


def cause_of(failure: RpcFailure) -> Cause | None:
    """Why the connection failed, when the failure says no call got through; None for
    anything else (an answer of a replica, a deadline, an unknown transport error)."""
    if failure.reason is not Reason.UNKNOWN or failure.code is not grpc.StatusCode.UNAVAILABLE:
        return None
    text = failure.message.lower()
    return next((cause for cause, signs in _SIGNS if any(s in text for s in signs)), None)


def hint(causes: Mapping[str, Cause], secure: bool | None) -> str:
    """What to do about ``causes``, one sentence (empty when there is nothing to say);
    ``secure``: whether the client presented TLS files (None: not known)."""
    found = set(causes.values())
    if Cause.UNTRUSTED in found:
        return (
            f"The cluster's certificates are not from the CA the client trusts: set "
            f"{CA_ENV} (synctl --ca) to this cluster's CA bundle."
        )
    if Cause.PLAINTEXT_SERVER in found:
        return (
            f"The cluster speaks plaintext (an --insecure cluster): give no TLS files "
            f"(unset {_TLS_VARIABLES})."
        )
    if Cause.CLOSED in found or Cause.HANDSHAKE in found:
        if secure is False:
            return (
                f"The cluster requires TLS and the client has no TLS files: set "
                f'{_TLS_VARIABLES} (for a dev cluster: eval "$(synctl dev env)").'
            )
        return (
            f"The cluster refused the client's certificate: are {_TLS_VARIABLES} this "
            "cluster's CA, and a certificate and key it issued?"
        )
    if Cause.REFUSED in found:
        return "Is the cluster running? (`synctl dev up` starts a local one.)"
    if Cause.UNRESOLVED in found:
        return "Check the host names in the addresses."
    return ""


class ClusterUnavailable(Exception):
    """No replica gave an answer: before the deadline, or (``fast``) because every
    replica failed for a reason waiting does not cure (``causes``: the latest of each
    address that failed so)."""

    def __init__(
        self,
        method: str,
        attempts: list[tuple[str, str]],
        *,
        causes: Mapping[str, Cause] | None = None,
        fast: bool = False,
        secure: bool | None = None,
    ) -> None:
        self.attempts = attempts
        self.causes = dict(causes or {})
        self.fast = fast
        self.hint = hint(self.causes, secure)
        if fast:
            why = "; ".join(f"{a}: {c}" for a, c in self.causes.items())
            message = f"{method}: no replica can be reached ({why})"
        else:
            tried = "; ".join(f"{address}: {why}" for address, why in attempts[-12:]) or "none"
            message = f"{method}: no replica answered before the deadline (tried {tried})"
        super().__init__(f"{message}. {self.hint}" if self.hint else message)
