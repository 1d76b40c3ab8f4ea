"""Questions asked of one job's attempts that several parts of the core share: when a
live attempt's time limit ends."""

from __future__ import annotations

from synapse_ha.core.model import Job


def time_limit_deadline(job: Job) -> int | None:
    """When the live attempt of ``job`` must be stopped, or None without a limit."""
    attempt = job.live_attempt()
    if attempt is None or job.spec.time_limit_ms <= 0:
        return None
    start = attempt.bound_at_ms if attempt.started_at_ms is None else attempt.started_at_ms
    return start + job.spec.time_limit_ms
