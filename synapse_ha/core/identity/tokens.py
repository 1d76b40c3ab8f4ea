"""Bearer tokens of users, as the replicated state holds them (re-exported by
:mod:`synapse_ha.core.model`)."""

from __future__ import annotations

from dataclasses import dataclass

from synapse_ha.core.identity.access import Role


@dataclass(frozen=True, slots=True)
class Token:
    """A bearer token of one user. Only the SHA-256 of its secret is replicated; the
    text (``syn_<token_id>_<secret>``) is shown once, to whoever created it.

    ``queues`` are recorded for the queue admission rules of DESIGN §8; nothing enforces
    them until queues exist. ``expires_at_ms`` 0 means never; ``revoked_at_ms`` 0 means
    live. ``created_by`` / ``revoked_by`` name the identity that did it (``bootstrap``
    for the first admin token, made by a replica itself). ``priority_classes``: the
    classes that preempt its user may use (in queues that list them);
    ``max_priority``: the highest priority it allows above a queue's own ceiling
    (:func:`synapse_ha.core.identity.access.priority_refusal`)."""

    token_id: str
    user: str
    role: Role
    secret_sha256: str
    created_at_ms: int
    created_by: str
    queues: tuple[str, ...] = ()
    expires_at_ms: int = 0
    revoked_at_ms: int = 0
    revoked_by: str = ""
    priority_classes: tuple[str, ...] = ()
    max_priority: int = 0

    def live_at(self, now_ms: int) -> bool:
        """Neither revoked nor expired at ``now_ms``."""
        if self.revoked_at_ms:
            return False
        return self.expires_at_ms == 0 or now_ms < self.expires_at_ms
