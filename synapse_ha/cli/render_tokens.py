"""synctl's token documents (``synctl token create``, ``token list``) and their table."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from synapse_ha.cli.render import Document, table, time_text
from synapse_ha.client.tokens import CreatedToken, TokenView


def created_token_document(answer: CreatedToken, user: str, role: str) -> Document:
    return {
        "id": answer.token_id,
        "token": answer.token,
        "user": user,
        "role": role,
        "expires_at_ms": answer.expires_at_ms or None,
    }


def token_document(token: TokenView) -> Document:
    return {
        "id": token.token_id,
        "user": token.user,
        "role": token.role,
        "queues": list(token.queues),
        "created_at_ms": token.created_at_ms or None,
        "created_by": token.created_by,
        "expires_at_ms": token.expires_at_ms or None,
        "revoked_at_ms": token.revoked_at_ms or None,
        "revoked_by": token.revoked_by,
        "priority_classes": list(token.priority_classes),
        "max_priority": token.max_priority,
    }


def tokens_table(docs: Sequence[Mapping[str, Any]]) -> str:
    rows = [
        (
            d["id"],
            d["user"],
            d["role"],
            ",".join(d["queues"]) or "-",
            _allowance(d),
            d["created_by"],
            time_text(d["expires_at_ms"]) if d["expires_at_ms"] else "never",
            f"revoked by {d['revoked_by'] or '?'}" if d["revoked_at_ms"] else "live",
        )
        for d in docs
    ]
    headers = ("ID", "USER", "ROLE", "QUEUES", "PRIORITY", "CREATED BY", "EXPIRES", "STATE")
    return table(rows, headers)


def _allowance(d: Mapping[str, Any]) -> str:
    """What a token allows beyond the queues' own priority rules: ``high; up to 50``."""
    parts = [",".join(d["priority_classes"])] if d["priority_classes"] else []
    if d["max_priority"] > 0:
        parts.append(f"up to {d['max_priority']}")
    return "; ".join(parts) or "-"
