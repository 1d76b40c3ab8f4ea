"""Users' bearer tokens as the client library hands them out (admins only): a token made
(:class:`CreatedToken`, its text shown this once) and a token listed (:class:`TokenView`:
the fields of :class:`~synapse_ha.core.identity.tokens.Token` but its secret's hash, which no
answer carries). A listed token's role is the text the server showed, so that a role
this library does not know is shown rather than refused.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from synapse_ha.client.cluster import ClusterClient
from synapse_ha.rpc import fields, states
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb


@dataclass(frozen=True, slots=True)
class CreatedToken:
    """``token`` is ``syn_<token_id>_<secret>``; ``expires_at_ms`` 0: never."""

    token: str
    token_id: str
    expires_at_ms: int


@dataclass(frozen=True, slots=True)
class TokenView:
    """A token as ``ListTokens`` shows it; times 0: never (expiry), live (revocation),
    unknown (creation)."""

    token_id: str
    user: str
    role: str
    queues: tuple[str, ...]
    created_at_ms: int
    created_by: str
    expires_at_ms: int
    revoked_at_ms: int
    revoked_by: str
    priority_classes: tuple[str, ...]
    max_priority: int


def token_from_proto(msg: pb.TokenInfo) -> TokenView:
    return fields.from_message(TokenView, msg, role=states.shown_user_role(msg))


def create_token(
    client: ClusterClient,
    user: str,
    role: str = "user",
    queues: Sequence[str] = (),
    ttl_ms: int = 0,
    *,
    priority_classes: Sequence[str] = (),
    max_priority: int = 0,
) -> CreatedToken:
    """A new token for ``user`` (see :meth:`ClusterClient.create_token`)."""
    answer = client.create_token(
        user,
        role,
        queues,
        ttl_ms,
        priority_classes=priority_classes,
        max_priority=max_priority,
    )
    return fields.from_message(CreatedToken, answer)


def list_tokens(client: ClusterClient) -> list[TokenView]:
    """Every token the cluster keeps, never a secret or its hash."""
    request = pb.ListTokensRequest()
    answer: pb.ListTokensResponse = client.ask("ListTokens", request)
    return [token_from_proto(t) for t in answer.tokens]


def revoke_token(client: ClusterClient, token_id: str) -> int:
    """Revoke a token; the time the revocation committed (ms since the epoch)."""
    request = pb.RevokeTokenRequest(token_id=token_id)
    answer: pb.RevokeTokenResponse = client.ask("RevokeToken", request)
    return int(answer.revoked_at_ms)
