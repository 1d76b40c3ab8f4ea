"""The failure of a call that no replica answered in time."""

from __future__ import annotations


class ClusterUnavailable(Exception):
    """No replica gave an answer before the deadline."""

    def __init__(self, method: str, attempts: list[tuple[str, str]]) -> None:
        tried = "; ".join(f"{address}: {why}" for address, why in attempts[-12:]) or "none"
        super().__init__(f"{method}: no replica answered before the deadline (tried {tried})")
        self.attempts = attempts
